//! The engine (validate, match, one memory-backend call, statuses) for a request of 1 and of
//! 10 descriptors, values spread over 10,000 keys as in the end-to-end benchmark.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt as _;
use sluice_core::config::rules_file;
use sluice_core::engine::{Descriptor, Engine, Options, Request};
use sluice_core::limiter::MemoryLimiter;
use sluice_core::rules::{Entry, RuleSet};

const RULES: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
";

/// Requests of `n` descriptors `user=user-<k>`, k drawn from 0..10,000 with a fixed seed.
fn requests(n: usize) -> Vec<Request> {
    let mut rng = common::rng();
    (0..4096)
        .map(|_| Request {
            domain: "bench".to_owned(),
            descriptors: (0..n)
                .map(|_| Descriptor {
                    entries: vec![Entry::new(
                        "user",
                        format!("user-{}", rng.next_u64() % 10_000),
                    )],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        })
        .collect()
}

fn engine() -> Engine {
    let model = rules_file::from_sources(&[(PathBuf::from("bench.yaml"), RULES.to_owned())])
        .unwrap_or_else(|e| panic!("bench rules are invalid:\n{e}"));
    let rules = Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)));
    Engine::new(
        rules,
        Arc::new(MemoryLimiter::new(1_000_000)),
        Options::default(),
    )
}

fn engine_requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    for n in [1, 10] {
        let engine = engine();
        let all = requests(n);
        g.bench_function(format!("{n}_descriptors"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % all.len();
                match engine.should_rate_limit(&all[i]).now_or_never() {
                    Some(Ok(r)) => r.statuses.len(),
                    _ => 0,
                }
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = engine_requests
}
criterion_main!(benches);
