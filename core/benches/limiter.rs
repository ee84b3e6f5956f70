//! The funnel decision, every algorithm's decision, and the memory backend: one thread, new
//! keys into a full limiter, and both cores on one hot key and on 1,000,000 keys.

mod common;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt as _;
use sluice_core::config::model::{Algorithm, Charge};
use sluice_core::limiter::algorithm::{Algo, State};
use sluice_core::limiter::funnel::{FRESH, Funnel};
use sluice_core::limiter::{Batch, LimitParams, Limiter, MemoryLimiter};
use tokio::time::Instant;

use common::batch;

const SECOND: u64 = 1_000_000_000;
const MANY_KEYS: u64 = 1_000_000;

fn funnel(c: &mut Criterion) {
    let f = Funnel::new(100, SECOND, 100, false);
    let mut g = c.benchmark_group("funnel");
    // A steady stream one interval apart: always admitted.
    g.bench_function("decision_admitted", |b| {
        let (mut tat, mut now) = (FRESH, SECOND);
        b.iter(|| {
            let step = f.evaluate(black_box(tat), black_box(now), black_box(1));
            tat = step.tat;
            now += SECOND / 100;
            step.admitted
        })
    });
    // A full funnel at a fixed time: always denied.
    g.bench_function("decision_denied", |b| {
        let full = f.consume(FRESH, SECOND, 100);
        b.iter(|| f.evaluate(black_box(full), black_box(SECOND), black_box(1)))
    });
    // What a status needs besides the decision.
    g.bench_function("decision_and_status", |b| {
        let tat = f.consume(FRESH, SECOND, 40);
        b.iter(|| {
            let step = f.evaluate(black_box(tat), black_box(SECOND), 1);
            (
                step.admitted,
                f.remaining(step.tat, SECOND),
                f.until_empty(step.tat, SECOND),
            )
        })
    });
    g.finish();
}

/// Each algorithm behind the backends' interface, 100 per second: a decision on a state half
/// used, and a decision then taking the cost, one interval apart (always admitted).
fn algorithms(c: &mut Criterion) {
    let mut g = c.benchmark_group("algorithm");
    for algorithm in [
        Algorithm::Funnel,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let algo = Algo::of(&LimitParams {
            algorithm,
            quota: 100,
            period_nanos: SECOND,
            burst: 100,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        });
        let name = algorithm.as_str();
        let mut half = State::Fresh;
        for i in 0..50 {
            algo.take(&mut half, SECOND + i * (SECOND / 1000), 1);
        }
        let now = SECOND + SECOND / 10;
        g.bench_function(format!("{name}_decision"), |b| {
            b.iter(|| algo.admits(black_box(&half), black_box(now), black_box(1)))
        });
        g.bench_function(format!("{name}_decide_and_take"), |b| {
            let (mut state, mut now) = (State::Fresh, SECOND);
            b.iter(|| {
                let admitted = algo.admits(&state, black_box(now), 1);
                if admitted {
                    algo.take(&mut state, now, 1);
                }
                now += SECOND / 100;
                admitted
            })
        });
    }
    g.finish();
}

fn check(limiter: &MemoryLimiter, batch: &Batch) -> bool {
    match limiter.check(batch).now_or_never() {
        Some(Ok(outcome)) => outcome.admitted,
        _ => false,
    }
}

/// Pre-built batches over `n` keys, in a seeded random order.
fn batches(n: u64, count: usize) -> Vec<Batch> {
    let mut rng = common::rng();
    (0..count).map(|_| batch(rng.next_u64() % n)).collect()
}

/// Stores a state for every one of the 1,000,000 keys.
fn fill(limiter: &MemoryLimiter) {
    for n in 0..MANY_KEYS {
        check(limiter, &batch(n));
    }
    assert_eq!(limiter.len(), MANY_KEYS as usize);
}

fn memory_single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_1_thread");
    let hot = MemoryLimiter::new(2 * MANY_KEYS as usize);
    let one = batch(0);
    g.bench_function("hot_key", |b| b.iter(|| check(&hot, &one)));
    let wide = MemoryLimiter::new(2 * MANY_KEYS as usize);
    fill(&wide);
    let all = batches(MANY_KEYS, 1 << 20);
    g.bench_function("1M_keys", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & (all.len() - 1);
            check(&wide, &all[i])
        })
    });
    g.finish();
}

/// A flood of new keys into a full limiter (`max_keys` = 1,000,000, every key held and not
/// fresh): each check stores a key never seen, so every shard is full and must evict.
fn memory_full(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_full");
    // 10 per hour: a key stays held (not fresh) for six minutes after its hit.
    let held = |n| {
        let mut b = batch(n);
        for hit in &mut b.hits {
            hit.limit.quota = 10;
            hit.limit.burst = 10;
        }
        b
    };
    let full = MemoryLimiter::new(MANY_KEYS as usize);
    for n in 0..MANY_KEYS {
        check(&full, &held(n));
    }
    let mut next = MANY_KEYS;
    g.bench_function("new_key", |b| {
        b.iter(|| {
            next += 1;
            check(&full, &held(next))
        })
    });
    assert!(full.len() <= MANY_KEYS as usize);
    g.finish();
}

/// Both cores: two threads each run `iters / 2` checks; the time per check of the pair.
fn two_threads(limiter: &MemoryLimiter, work: &[Vec<Batch>; 2], iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for batches in work {
            s.spawn(move || {
                for i in 0..iters.div_ceil(2) as usize {
                    black_box(check(limiter, &batches[i % batches.len()]));
                }
            });
        }
    });
    start.elapsed()
}

fn memory_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory_2_threads");
    let hot = MemoryLimiter::new(2 * MANY_KEYS as usize);
    let one = [vec![batch(0)], vec![batch(0)]];
    g.bench_function("hot_key", |b| {
        b.iter_custom(|iters| two_threads(&hot, &one, iters))
    });
    let wide = MemoryLimiter::new(2 * MANY_KEYS as usize);
    let mut rng = common::rng();
    let halves = [0, 1].map(|_| {
        (0..1 << 19)
            .map(|_| batch(rng.next_u64() % MANY_KEYS))
            .collect::<Vec<_>>()
    });
    fill(&wide);
    g.bench_function("1M_keys", |b| {
        b.iter_custom(|iters| two_threads(&wide, &halves, iters))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = funnel, algorithms, memory_single_thread, memory_full, memory_two_threads
}
criterion_main!(benches);
