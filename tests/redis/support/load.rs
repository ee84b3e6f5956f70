//! Load for exactness tests: `sluice` replicas sharing one Redis deployment, and many
//! concurrent gRPC clients calling them for a while, counting admitted, denied and failed
//! answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use sluice::testing::grpc::*;
use sluice::testing::process::SluiceProcess;

/// `count` `sluice serve` processes over the Redis at `redis_url`, serving `rules` (kept in
/// the returned file while they run).
pub(crate) fn replicas(
    count: usize,
    rules: &str,
    redis_url: &str,
) -> (tempfile::NamedTempFile, Vec<SluiceProcess>) {
    let file = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(file.path(), rules).expect("write rules");
    let replicas = (0..count)
        .map(|_| {
            SluiceProcess::over_redis(
                env!("CARGO_BIN_EXE_sluice"),
                file.path(),
                redis_url,
                // Exactness is under test, not latency: no time-outs on a loaded machine.
                &[("SLUICE_REDIS__TIMEOUT_MS", "5000")],
            )
        })
        .collect();
    (file, replicas)
}

/// What the clients got.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tally {
    pub admitted: u64,
    pub denied: u64,
    pub errors: u64,
    /// From the first request sent to the last answer received.
    pub elapsed: Duration,
}

/// `clients` clients per URL call for `run`; client `i` sends `request(i)` each time.
pub(crate) async fn hammer(
    urls: &[String],
    clients: usize,
    run: Duration,
    request: impl Fn(usize) -> RateLimitRequest + Send + Sync + 'static,
) -> Tally {
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let request = Arc::new(request);
    let mut connected = Vec::new();
    for url in urls {
        for _ in 0..clients {
            connected.push(
                RateLimitServiceClient::connect(url.clone())
                    .await
                    .expect("connect"),
            );
        }
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut c) in connected.into_iter().enumerate() {
        let (counts, request) = (counts.clone(), request.clone());
        tasks.spawn(async move {
            while start.elapsed() < run {
                let slot = match c.should_rate_limit(request(i)).await {
                    Ok(r) if overall(r.get_ref()) == Code::Ok => 0,
                    Ok(_) => 1,
                    Err(_) => 2,
                };
                counts[slot].fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let [a, d, e] = &*counts;
    Tally {
        admitted: a.load(Ordering::SeqCst),
        denied: d.load(Ordering::SeqCst),
        errors: e.load(Ordering::SeqCst),
        elapsed,
    }
}

/// The funnel's bound: admitted <= burst + quota x elapsed / period (period 1 s here); and
/// the limit, not the load, decided (many denials, and close to the bound).
pub(crate) fn assert_exact(t: Tally, quota_per_second: f64, burst: f64) {
    let bound = burst + quota_per_second * t.elapsed.as_secs_f64();
    eprintln!(
        "admitted {}, denied {}, errors {}, bound {bound:.1} over {:?}",
        t.admitted, t.denied, t.errors, t.elapsed
    );
    assert_eq!(t.errors, 0);
    assert!(
        t.admitted as f64 <= bound,
        "admitted {} > {bound:.1}",
        t.admitted
    );
    assert!(t.denied > t.admitted, "the load exceeded the limit");
    let floor = 0.8 * quota_per_second * t.elapsed.as_secs_f64();
    assert!(t.admitted as f64 >= floor, "admitted only {}", t.admitted);
}
