//! Memory per key of the memory backend: the process's resident memory before and after
//! storing 1,000,000 funnel states, each under its own key (not a criterion benchmark: it
//! prints one line; `cargo bench --bench memory_per_key`). Another algorithm's states with
//! its name as an argument: `cargo bench --bench memory_per_key -- token_bucket`. Run by
//! `cargo test` (without `--bench`), it stores 10,000 keys only, as a smoke test.

mod common;

use futures_util::FutureExt as _;
use sluice_core::config::model::Algorithm;
use sluice_core::limiter::{Limiter, MemoryLimiter};

/// Resident set size in bytes, from /proc/self/statm (pages).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    let keys: u64 = if measuring { 1_000_000 } else { 10_000 };
    let algorithm = std::env::args()
        .find_map(|a| Algorithm::parse(&a))
        .unwrap_or(Algorithm::Funnel);
    // Room for every key, as `memory.max_keys` would be sized for such a flood.
    let limiter = MemoryLimiter::new(2 * keys as usize);
    let before = rss();
    let mut key_bytes = 0;
    for n in 0..keys {
        let mut batch = common::batch(n);
        for hit in batch
            .hits
            .iter_mut()
            .filter(|_| algorithm != Algorithm::Funnel)
        {
            hit.limit.algorithm = algorithm;
            let key = String::from_utf8_lossy(&hit.key).replace("funnel", algorithm.as_str());
            hit.key = key.into_bytes().into();
        }
        key_bytes += batch.hits[0].key.len() as u64;
        let admitted = matches!(limiter.check(&batch).now_or_never(), Some(Ok(o)) if o.admitted);
        assert!(admitted, "key {n} was not admitted");
    }
    let after = rss();
    assert_eq!(limiter.len(), keys as usize);
    let per_key = after.saturating_sub(before) as f64 / keys as f64;
    let key_len = key_bytes as f64 / keys as f64;
    println!(
        "memory_per_key: {keys} {} keys, RSS {:.1} MiB -> {:.1} MiB: {per_key:.1} bytes per key \
         (key {key_len:.1} bytes, state and overhead {:.1} bytes)",
        algorithm.as_str(),
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        per_key - key_len
    );
}
