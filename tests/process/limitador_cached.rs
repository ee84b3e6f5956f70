//! limitador's `redis_cached` storage on the real binary started as `limitador-server`: two
//! replicas on one real redis-server, `redis_cached URL --flush-period 100`, hammered on one
//! limit. limitador's local counters can go over a limit between flushes; sluice's leases
//! (what `redis_cached` maps to, docs/limitador-compat.md) never do: the two replicas
//! together admit at most the limit, and at least the limit less what two leases can hold
//! back (10% of the limit each), and the leases are seen in Redis.

use std::path::Path;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice::testing::grpc::{Client, Code, call, connect_within, desc, overall, req};
use sluice::testing::http;
use sluice::testing::process::{Served, limitador_server, loopback, serving};
use sluice::testing::redis::RedisServer;

/// One limit of 2,000 an hour on every request of namespace `ns`.
const LIMIT: u64 = 2_000;
const LIMITS: &str = r#"
- namespace: ns
  max_value: 2000
  seconds: 3600
  conditions: []
  variables: []
"#;

/// `limitador-server LIMITS redis_cached URL --flush-period 100` on loopback ports from the
/// kernel: the process and its gRPC (RLS) port.
async fn replica(dir: &Path, redis: &RedisServer) -> (Served, u16) {
    let file = dir.join("limits.yaml");
    std::fs::write(&file, LIMITS).expect("write the limits");
    let mut child = limitador_server(env!("CARGO_BIN_EXE_sluice"), dir)
        .arg(&file)
        .args(["redis_cached", &redis.url(), "--flush-period", "100"])
        .spawn()
        .expect("start limitador-server");
    let [rls, http_addr] = serving(&mut child, ["gRPC", "admin HTTP"]);
    let (rls, http_port) = (rls.port(), http_addr.port());
    let served = Served(child);
    http::until_ok(loopback(http_port), "/healthcheck", "limitador-server").await;
    (served, rls)
}

/// Sends `count` requests one after the other; returns how many were admitted.
async fn hammer(mut client: Client, count: usize) -> u64 {
    let mut admitted = 0;
    for _ in 0..count {
        let answer = call(&mut client, req("ns", vec![desc(&[("k", "v")])])).await;
        if overall(&answer) == Code::Ok {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cached_is_leases_and_never_admits_beyond_the_limit() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let redis = RedisServer::start();
    let (_a, a) = replica(dir.path(), &redis).await;
    let (_b, b) = replica(dir.path(), &redis).await;
    // Keep clear of the hour's end (windows are aligned on the epoch).
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    if 3600 - secs % 3600 < 30 {
        tokio::time::sleep(Duration::from_secs(3600 - secs % 3600 + 1)).await;
    }
    // Lease records live beside a busy key's state while a lease is held (the last return,
    // once the window is spent, deletes them): watched from another thread during the run.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        let url = format!("redis://{}", redis.addr());
        std::thread::spawn(move || {
            let client = ::redis::Client::open(url).expect("a redis client");
            let mut conn = client.get_connection().expect("a redis connection");
            let mut seen = false;
            while !seen && !done.load(std::sync::atomic::Ordering::Relaxed) {
                let keys: Vec<String> = ::redis::cmd("KEYS")
                    .arg("*:lease")
                    .query(&mut conn)
                    .unwrap_or_default();
                seen = !keys.is_empty();
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };
    // 3,000 requests for 2,000: 8 clients on each replica, 188 requests each (3,008).
    let mut tasks = tokio::task::JoinSet::new();
    for port in [a, b] {
        for _ in 0..8 {
            let url = format!("http://{}", loopback(port));
            let client = connect_within(&url, Duration::from_secs(10)).await;
            tasks.spawn(hammer(client, 188));
        }
    }
    let admitted: u64 = tasks.join_all().await.into_iter().sum();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    // Leases were taken: a busy key's lease records lived beside its state in Redis.
    let leases_seen = watcher.join().expect("the watcher");
    assert!(leases_seen, "no lease records in Redis during the run");
    assert!(
        admitted <= LIMIT,
        "{admitted} admitted for a limit of {LIMIT}"
    );
    // Each replica's lease holds at most 10% of the limit (redis.lease_burst_percent).
    let held_back = 2 * LIMIT / 10;
    assert!(
        admitted >= LIMIT - held_back,
        "{admitted} admitted: more than two leases' worth under the limit"
    );
}
