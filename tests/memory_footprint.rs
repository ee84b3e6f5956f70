//! Bytes held per key by the memory backend, for each algorithm, measured with a counting
//! allocator (the figures of docs/algorithms.md; run with `--nocapture` to print them). Keys
//! are state keys of 29 to 36 bytes, as a per-client rule produces. The backend keeps its own
//! copy of each key's bytes: they are counted, and printed apart.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use futures_util::FutureExt;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::{Batch, Hit, LimitParams, Limiter, ManualClock, MemoryLimiter, Role};

/// The system allocator, counting the bytes currently allocated.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SEC: u64 = 1_000_000_000;
/// Bytes per key once `keys` keys each took a cost of 1 `requests` times (a second apart),
/// and the mean length of the keys.
fn bytes_per_key(algorithm: Algorithm, quota: u32, keys: usize, requests: u64) -> (f64, f64) {
    let clock = ManualClock::at(1_000_000 * SEC);
    let limiter = MemoryLimiter::with_clock(2 * keys, clock.clone());
    let limit = LimitParams {
        algorithm,
        quota,
        period_nanos: 3_600 * SEC,
        burst: quota,
        charge: Charge::Admitted,
        borrow: false,
    };
    let count = keys;
    let keys: Vec<std::sync::Arc<[u8]>> = (0..count)
        .map(|i| {
            format!("{{api|user={i}}}:{}:3600", algorithm.as_str())
                .into_bytes()
                .into()
        })
        .collect();
    let before = HELD.load(Ordering::SeqCst);
    for _ in 0..requests {
        clock.advance(SEC);
        for key in &keys {
            let hit = Hit {
                key: key.clone(),
                limit,
                cost: 1,
                refund: false,
                group: 0,
                role: Role::Enforced,
            };
            let batch = Batch { hits: vec![hit] };
            let outcome = limiter.check(&batch).now_or_never();
            assert!(matches!(outcome, Some(Ok(o)) if o.admitted));
        }
    }
    assert_eq!(limiter.len(), count);
    let held = HELD.load(Ordering::SeqCst) - before;
    let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
    drop(keys);
    (held as f64 / count as f64, key_bytes as f64 / count as f64)
}

#[test]
fn bytes_held_per_key() {
    let mut figures = Vec::new();
    for algorithm in Algorithm::ALL {
        let (bytes, key) = bytes_per_key(algorithm, 100, 100_000, 1);
        let overhead = bytes - key;
        figures.push(format!(
            "{}: {bytes:.0} B/key ({key:.0} of key bytes, {overhead:.0} of table and state)",
            algorithm.as_str()
        ));
        // Every state but a log fits in its table's entry; a funnel's entry is the smallest.
        let bound = match algorithm {
            Algorithm::Funnel => 48.0,
            Algorithm::SlidingLog => 200.0,
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
