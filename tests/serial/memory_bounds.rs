//! A flood of unique keys keeps the memory backend within `max_keys`, in the documented order
//! (fresh entries first, then the one closest to fresh), with bounded memory: 1,000,000 keys
//! driven in process (heap bytes counted by the allocator, RSS from `/proc/self/statm`), and
//! a smaller flood through a real `sluice serve` over gRPC (`sluice bench --spread`, the
//! process's VmRSS and its `sluice_memory_keys` metric). Run with `--nocapture` for the figures
//! of docs/robustness.md.

use std::process::Stdio;
use std::sync::Arc;

use sluice::config::model::Algorithm;
use sluice::limiter::{LimitParams, ManualClock, MemoryLimiter};
use sluice::testing::http::{get, sample};
use sluice::testing::limits;
use sluice::testing::process::*;
use tokio::time::Instant;

use crate::{held, serial};

const SEC: u64 = 1_000_000_000;
const MIB: f64 = 1024.0 * 1024.0;
const FLOOD: usize = 1_000_000;
/// The cap of the million-key flood: small, so that the flood churns through it 100 times.
const FLOOD_MAX_KEYS: usize = 10_000;
/// Keys after which the flood's memory is measured as its plateau.
const PLATEAU: usize = 10 * FLOOD_MAX_KEYS;
/// The cap at which bytes per key are measured and the fresh-first order is shown.
const MAX_KEYS: usize = 100_000;
/// Keys that took their whole burst before the flood: the farthest from fresh.
const HOT: usize = 64;
/// The documented bound on heap bytes per held key (docs/robustness.md), state key included,
/// once evictions have churned the shards' tables.
const BYTES_PER_KEY_BOUND: f64 = 320.0;
/// What RSS may still grow once the limiter is full, however many more keys come (allocator
/// fragmentation and the test's own transient allocations).
const RSS_AFTER_PLATEAU: f64 = 16.0 * MIB;

/// 100 per hour per client, as a `remote_address` rule: a flood key (cost 1) is fresh again
/// 36 s after its request, a hot key (cost 100) an hour after.
fn limit() -> LimitParams {
    limits::limit(Algorithm::Funnel, 100, 3_600 * SEC)
}

/// The state key a `remote_address` rule gives client number `n`.
fn key(n: usize) -> Arc<[u8]> {
    let [a, b, c, d] = (n as u32).to_be_bytes();
    format!("{{edge|remote_address={a}.{b}.{c}.{d}}}:funnel:3600")
        .into_bytes()
        .into()
}

fn hot_key(n: usize) -> Arc<[u8]> {
    format!("{{edge|remote_address=hot-{n}}}:funnel:3600")
        .into_bytes()
        .into()
}

/// Checks `cost` on `key`: (admitted, remaining).
fn check(limiter: &MemoryLimiter<ManualClock>, key: Arc<[u8]>, cost: u64) -> (bool, u64) {
    let outcome = limits::check_now(limiter, vec![limits::hit(key, limit(), cost)]);
    (outcome.admitted, outcome.hits[0].remaining)
}

/// What a check-only hit (cost 0, which never stores anything) says is left on `key`: 100 for
/// a key that is not held.
fn left(limiter: &MemoryLimiter<ManualClock>, key: Arc<[u8]>) -> u64 {
    check(limiter, key, 0).1
}

fn heap() -> isize {
    held()
}

/// A limiter of at most `max_keys` keys, `HOT` of which took their whole burst.
fn with_hot_keys(max_keys: usize) -> (MemoryLimiter<ManualClock>, ManualClock) {
    let clock = ManualClock::at(1_000_000 * SEC);
    let limiter = MemoryLimiter::with_clock(max_keys, clock.clone());
    for n in 0..HOT {
        assert!(check(&limiter, hot_key(n), 100).0);
    }
    (limiter, clock)
}

/// Floods unique `keys` (cost 1 each, 1 µs apart), asserting every 1000 keys that at most
/// `max_keys` are held.
fn flood(
    limiter: &MemoryLimiter<ManualClock>,
    clock: &ManualClock,
    max_keys: usize,
    keys: std::ops::Range<usize>,
) {
    for n in keys {
        clock.advance(1_000);
        assert!(check(limiter, key(n), 1).0, "a new key is admitted");
        if n % 1_000 == 0 {
            let held = limiter.len();
            assert!(held <= max_keys, "{held} keys held after key {n}");
        }
    }
    assert!(limiter.len() <= max_keys);
}

/// Whether a hot key still holds its debt (a fresh key would have 100 left; 37 s of draining
/// gives a hot key back 1).
fn hot_held(limiter: &MemoryLimiter<ManualClock>) -> bool {
    (0..HOT).all(|n| left(limiter, hot_key(n)) <= 1)
}

#[test]
fn a_million_unique_keys_stay_within_max_keys_and_bounded_memory() {
    let _serial = serial();
    let started = Instant::now();
    let rss_start = own_rss();
    let heap_start = heap();
    let (limiter, clock) = with_hot_keys(FLOOD_MAX_KEYS);

    // Fill to the cap and past it, ten times over: the plateau (the shards' tables grow once,
    // when the first evictions' tombstones fill them, within about 6 x max_keys keys).
    flood(&limiter, &clock, FLOOD_MAX_KEYS, 0..PLATEAU);
    let plateau_keys = limiter.len();
    let heap_plateau = heap() - heap_start;
    let rss_plateau = own_rss();

    // The rest of the million.
    flood(&limiter, &clock, FLOOD_MAX_KEYS, PLATEAU..FLOOD);
    let heap_end = heap() - heap_start;
    let rss_end = own_rss();
    let held = limiter.len();
    eprintln!(
        "{FLOOD} unique keys, max_keys {FLOOD_MAX_KEYS}: {held} held ({plateau_keys} at the \
         plateau); heap {:.2} MiB at the plateau = {:.0} B/key, {:.2} MiB at the end; \
         RSS {:.1} MiB at start, {:.1} MiB at the plateau, {:.1} MiB at the end; took {:?}",
        heap_plateau as f64 / MIB,
        heap_plateau as f64 / plateau_keys as f64,
        heap_end as f64 / MIB,
        rss_start as f64 / MIB,
        rss_plateau as f64 / MIB,
        rss_end as f64 / MIB,
        started.elapsed(),
    );
    assert!(
        held > FLOOD_MAX_KEYS * 9 / 10,
        "the limiter keeps what it may: {held}"
    );
    let bytes_per_key = heap_plateau as f64 / plateau_keys as f64;
    assert!(
        bytes_per_key < BYTES_PER_KEY_BOUND,
        "{bytes_per_key} B per key"
    );
    assert!(
        heap_end <= heap_plateau + heap_plateau / 10,
        "the heap grew from {heap_plateau} to {heap_end} bytes after the plateau"
    );
    assert!(
        rss_end as f64 <= rss_plateau as f64 + RSS_AFTER_PLATEAU,
        "RSS grew from {rss_plateau} to {rss_end} bytes after the plateau"
    );

    // Evicted closest to fresh first: the hot keys (in debt for an hour) outlived a million
    // flood keys (fresh 36 s after their request), and the oldest flood keys went first.
    assert!(hot_held(&limiter), "the hot keys are held");
    let oldest = (0..1_000).filter(|&n| left(&limiter, key(n)) == 99).count();
    let newest = (FLOOD - 1_000..FLOOD)
        .filter(|&n| left(&limiter, key(n)) == 99)
        .count();
    assert_eq!(oldest, 0, "the oldest flood keys were evicted");
    assert_eq!(newest, 1_000, "the newest flood keys are held");
}

#[test]
fn bytes_per_key_at_max_keys_and_fresh_entries_dropped_first() {
    let _serial = serial();
    let rss_start = own_rss();
    let heap_start = heap();
    let (limiter, clock) = with_hot_keys(MAX_KEYS);
    flood(&limiter, &clock, MAX_KEYS, 0..MAX_KEYS);
    let held = limiter.len();
    let heap_full = heap() - heap_start;
    let rss_full = own_rss();
    let bytes_per_key = heap_full as f64 / held as f64;
    let rss_per_key = rss_full.saturating_sub(rss_start) as f64 / held as f64;
    eprintln!(
        "max_keys {MAX_KEYS}: {held} held, heap {:.1} MiB = {bytes_per_key:.0} B/key; RSS {:.1} \
         MiB at start, {:.1} MiB full = {rss_per_key:.0} B/key",
        heap_full as f64 / MIB,
        rss_start as f64 / MIB,
        rss_full as f64 / MIB,
    );
    assert!(held > MAX_KEYS * 9 / 10, "{held} keys held");
    assert!(
        bytes_per_key < BYTES_PER_KEY_BOUND,
        "{bytes_per_key} B per key"
    );

    // Every flood key is fresh now (36 s later), and still held until swept or evicted.
    clock.advance(37 * SEC);
    assert_eq!(limiter.len(), held, "fresh entries wait for a sweep");
    let new = MAX_KEYS / 2;
    flood(&limiter, &clock, MAX_KEYS, MAX_KEYS..MAX_KEYS + new);
    // Room was made from fresh entries only: every hot and every new key is still held.
    assert!(hot_held(&limiter), "the hot keys are held");
    let held_new = (MAX_KEYS..MAX_KEYS + new)
        .filter(|&n| left(&limiter, key(n)) == 99)
        .count();
    assert_eq!(held_new, new);
    // What is left beyond them is fresh, and a sweep drops it all.
    limiter.sweep();
    assert_eq!(limiter.len(), HOT + new);
}

/// A key-only rule on the client's address, 100 per hour per client.
const RULES: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 100}
";

/// `sluice serve` on the memory backend; its admin address.
fn serve(dir: &std::path::Path, max_keys: usize) -> (Served, String, std::net::SocketAddr) {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("write the rules");
    let mut child = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("--rules")
        .arg(&rules)
        .args(["--grpc-listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .env("SLUICE_MEMORY__MAX_KEYS", max_keys.to_string())
        .env("SLUICE_MEMORY__SWEEP_INTERVAL_SECS", "1")
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sluice binary");
    let [grpc, admin] = serving(&mut child, ["gRPC", "admin HTTP"]);
    (Served(child), format!("http://{grpc}"), admin)
}

/// `sluice bench` for `secs` on unique addresses starting at `first`; requests answered.
fn bench_unique(target: &str, first: u64, secs: u32) -> u64 {
    let out = run_ok(
        sluice_command(env!("CARGO_BIN_EXE_sluice"))
            .args(["bench", "--target", target, "--json", "--quiet"])
            .args(["--warmup", "0s", "--duration", &format!("{secs}s")])
            .args(["--domain", "edge", "--descriptor", "remote_address=x"])
            .args(["--spread", "remote_address=1000000000", "--spread-order"])
            .args(["sequential", "--seed", &first.to_string()])
            .args(["--connections", "2", "--concurrency", "8", "--threads", "1"]),
        "sluice bench",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["over_limit"].as_u64(), Some(0), "every key is new: {v}");
    v["requests"].as_u64().expect("requests")
}

/// The `sluice_memory_keys` metric of the process whose admin server is at `admin`.
fn keys_held(admin: std::net::SocketAddr) -> f64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let text = runtime.block_on(get(admin, "/metrics")).body;
    sample(&text, "sluice_memory_keys", &[]).expect("sluice_memory_keys")
}

#[test]
fn a_flood_over_grpc_keeps_the_process_within_max_keys() {
    let _serial = serial();
    const PROCESS_MAX_KEYS: usize = 10_000;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (served, url, admin) = serve(dir.path(), PROCESS_MAX_KEYS);
    let pid = served.0.id();
    let rss_start = rss(pid);
    let mut sent = 0u64;
    let mut rounds = Vec::new();
    // Until the cap is reached (bounded: 20 rounds): a full shard evicts 1/32 of its share at
    // once, so a full limiter holds between max_keys - max_keys / 32 and max_keys.
    let full = (PROCESS_MAX_KEYS - PROCESS_MAX_KEYS / 32) as f64;
    while keys_held(admin) < full {
        assert!(rounds.len() < 20, "the cap was never reached: {rounds:?}");
        sent += bench_unique(&url, sent, 3);
        rounds.push((sent, keys_held(admin), rss(pid)));
    }
    // The plateau: the most RSS seen until the cap was reached.
    let rss_plateau = rounds.iter().map(|r| r.2).fold(rss(pid), u64::max);
    let at_plateau = sent;
    // At least as many new keys again as the cap, twice.
    while sent < at_plateau + 2 * PROCESS_MAX_KEYS as u64 {
        assert!(rounds.len() < 60, "too slow: {rounds:?}");
        sent += bench_unique(&url, sent, 3);
        let held = keys_held(admin);
        assert!(held <= PROCESS_MAX_KEYS as f64, "{held} keys held");
        rounds.push((sent, held, rss(pid)));
    }
    let rss_end = rss(pid);
    eprintln!(
        "sluice serve, max_keys {PROCESS_MAX_KEYS}: {sent} unique keys over gRPC; RSS {:.1} MiB at \
         start, {:.1} MiB at the plateau (after {at_plateau} keys), {:.1} MiB at the end; \
         rounds (keys sent, held, RSS): {rounds:?}",
        rss_start as f64 / MIB,
        rss_plateau as f64 / MIB,
        rss_end as f64 / MIB,
    );
    assert!(
        rss_end as f64 <= rss_plateau as f64 + 8.0 * MIB,
        "RSS grew from {rss_plateau} to {rss_end} bytes after the plateau"
    );
    assert!(alive(pid), "sluice is still running");
}
