//! Tests that measure the process or the machine, so that no other test may run beside them:
//! each holds [`serial`] (or [`serial_async`]) from its first line, and they run one at a
//! time, in a binary of their own.
//!
//! - Memory: a counting global allocator gives the heap bytes held (the memory backend's bytes
//!   per key, and its bound under a flood of unique keys) and the allocations one thread makes
//!   (per request on the hot path); `/proc` gives resident sizes, also of a real
//!   `sluice serve`. Run with `--nocapture` for the figures of docs/algorithms.md and
//!   docs/robustness.md.
//! - Request tracing: a subscriber set for the test's thread must see every span of the
//!   engine, which other threads' callsites (with no subscriber) would otherwise disturb.
//! - Redis faults: answers within the Redis time-out (100 ms, with 400 ms of slack) while
//!   Redis is down or hung; on two shared cores, another test's load beside them is what
//!   would be measured.
//! - A Redis Cluster changing under load (`redis_cluster`): a slot moving to another master
//!   and back, a live `redis-cli --cluster reshard`, a master killed and its replica promoted,
//!   and a Sentinel failover under load (`redis_sentinel`); no request may fail but those of the
//!   lost master during its failover, with every answer within the Redis time-out.
//! - The chaos run (`redis_chaos`): `benches/chaos.py` for 60 s on redis-server and on
//!   valkey-server, three real `sluice serve` through random Cluster and Sentinel faults; its
//!   1 s bound on errors after a fault is a latency bound.
//! - The ordered drain (in process and of the real binary on SIGTERM): the drain delay kept,
//!   the ports closed, within bounds that a load test beside them breaks.
//! - The RLQS bounds under stress (`rlqs_bounds`): thousands of buckets on dozens of streams,
//!   within a bound on this process's resident growth.
//! - The Rust client against the real binary (`throttle_client`): the shipped axum example
//!   behind the tower layer, the fail policy within its time-out, `acquire` pacing 50 callers
//!   at 10/s, mTLS, the layer on a tonic server; its time bounds need the machine to itself.
//! - Throttle holds with the Rust client's permit (`throttle_holds`), on the memory backend and
//!   on a real `redis-server`: 100 tasks on 10 slots (the peak measured), a killed holder's
//!   slots back after its 1 s lease, a permit kept through its extensions.
//! - The admin page in a real headless Chromium (`ui_browser`): its charts must be drawn, and
//!   move, between screenshots a few seconds apart while a load runs; what they draw depends
//!   on how many 2 s samples exist by then, which a load beside it delays. Its "why" box,
//!   driven over the DevTools protocol (`support::cdp`), shows `/why`'s answer and resets.

mod allocations;
mod drain;
mod memory_bounds;
mod memory_footprint;
mod redis_chaos;
mod redis_cluster;
mod redis_cluster_faults;
mod redis_cluster_holds;
mod redis_faults;
mod redis_leases;
mod redis_load;
mod redis_partitions;
/// One quota across regions (`scope: global`): three redis-servers, two `sluice` per region,
/// 40 ms each way to home, a 20 s partition; its latency bound needs the machine to itself.
mod redis_regions;
mod redis_sentinel;
mod request_tracing;
mod rlqs_bounds;
mod support;
mod throttle_client;
mod throttle_holds;
mod ui_browser;

/// The service of the shipped client example, under test as it ships (the example is a
/// program of the client crate, so its file is reached by path).
#[path = "../../client/examples/axum_service/service.rs"]
mod example;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

use tokio::sync::{Mutex, MutexGuard};

/// The system allocator, counting the bytes currently allocated (process-wide) and, between
/// two marks, the allocations of the calling thread.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are an
// atomic and const-initialised thread-locals, so updating them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn count(bytes: isize) {
    HELD.fetch_add(bytes, Ordering::SeqCst);
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

/// Heap bytes the process holds now.
fn held() -> isize {
    HELD.load(Ordering::SeqCst)
}

/// Allocations made by `f` on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (out, COUNT.with(Cell::get))
}

/// Held by each test of this binary while it runs: one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// [`SERIAL`], for a test that is not async.
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.blocking_lock()
}

/// [`SERIAL`], for an async test.
async fn serial_async() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}
