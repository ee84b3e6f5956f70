//! Bytes held per key by the memory backend, for each algorithm, measured with a counting
//! allocator (the figures of docs/algorithms.md; run with `--nocapture` to print them). Keys
//! are state keys of 29 to 36 bytes, as a per-client rule produces. The backend keeps its own
//! copy of each key's bytes: they are counted, and printed apart.

use sluice::config::model::Algorithm;
use sluice::limiter::{ManualClock, MemoryLimiter};
use sluice::testing::limits::{check_now, hit, limit};

use crate::{held, serial};

const SEC: u64 = 1_000_000_000;
/// Bytes per key once `keys` keys each took a cost of 1 `requests` times (a second apart),
/// and the mean length of the keys.
fn bytes_per_key(algorithm: Algorithm, quota: u32, keys: usize, requests: u64) -> (f64, f64) {
    let clock = ManualClock::at(1_000_000 * SEC);
    let limiter = MemoryLimiter::with_clock(2 * keys, clock.clone());
    let limit = limit(algorithm, quota, 3_600 * SEC);
    let count = keys;
    let keys: Vec<std::sync::Arc<[u8]>> = (0..count)
        .map(|i| {
            format!("{{api|user={i}}}:{}:3600", algorithm.as_str())
                .into_bytes()
                .into()
        })
        .collect();
    let before = held();
    for _ in 0..requests {
        clock.advance(SEC);
        for key in &keys {
            let outcome = check_now(&limiter, vec![hit(key, limit, 1)]);
            assert!(outcome.admitted);
        }
    }
    assert_eq!(limiter.len(), count);
    let held = held() - before;
    let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
    drop(keys);
    (held as f64 / count as f64, key_bytes as f64 / count as f64)
}

#[test]
fn bytes_held_per_key() {
    let _serial = serial();
    let mut figures = Vec::new();
    for algorithm in Algorithm::ALL {
        let (bytes, key) = bytes_per_key(algorithm, 100, 100_000, 1);
        let overhead = bytes - key;
        figures.push(format!(
            "{}: {bytes:.0} B/key ({key:.0} of key bytes, {overhead:.0} of table and state)",
            algorithm.as_str()
        ));
        // Every state but a log and a key's holds fits in its table's entry; a funnel's
        // entry is the smallest. A log and holds are boxed, with their entries beside: here
        // one entry (a request), one hold (measured: 208 B of table and state).
        let bound = match algorithm {
            Algorithm::Funnel => 48.0,
            Algorithm::SlidingLog => 200.0,
            Algorithm::Concurrency => 250.0,
            _ => 100.0,
        };
        assert!(
            overhead < bound,
            "{}: {bytes} bytes per key, {key} of them the key",
            algorithm.as_str()
        );
    }
    let (log, key) = bytes_per_key(Algorithm::SlidingLog, 100, 2_000, 100);
    figures.push(format!(
        "sliding_log with 100 entries: {log:.0} B/key ({key:.0} of key bytes)"
    ));
    assert!(log < 100.0 * 16.0 * 2.0 + 200.0, "{log} bytes per key");
    eprintln!("{}", figures.join("\n"));
}
