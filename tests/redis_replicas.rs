//! Exactness across replicas: three `sluice` processes share one Redis; many concurrent
//! clients hammer one descriptor through all of them for a few seconds; the admitted count
//! never exceeds burst + rate x elapsed (and comes close to it: the limit is what stops them).

mod common;
#[path = "support/redis.rs"]
mod redis_support;
#[path = "support/sluice_process.rs"]
mod sluice_process;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use redis_support::RedisServer;
use sluice_process::SluiceProcess;
use tokio::time::Instant;

/// 20 per second, burst 10.
const RULES: &str = "
domain: x
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 20, burst: 10}
";
const QUOTA: f64 = 20.0;
const BURST: f64 = 10.0;
const CLIENTS_PER_REPLICA: usize = 8;
const RUN: Duration = Duration::from_secs(4);

/// Hammers `urls` for `RUN`; returns (admitted, denied, errors, elapsed from the first send to
/// the last answer).
pub async fn hammer(urls: &[String]) -> (u64, u64, u64, Duration) {
    let admitted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for url in urls {
        for _ in 0..CLIENTS_PER_REPLICA {
            clients.push(
                RateLimitServiceClient::connect(url.clone())
                    .await
                    .expect("connect"),
            );
        }
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut c in clients {
        let (a, d, e) = (admitted.clone(), denied.clone(), errors.clone());
        tasks.spawn(async move {
            while start.elapsed() < RUN {
                match c
                    .should_rate_limit(req("x", vec![desc(&[("hot", "one")])]))
                    .await
                {
                    Ok(r) if overall(r.get_ref()) == Code::Ok => a.fetch_add(1, Ordering::SeqCst),
                    Ok(_) => d.fetch_add(1, Ordering::SeqCst),
                    Err(_) => e.fetch_add(1, Ordering::SeqCst),
                };
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let load = |n: &AtomicU64| n.load(Ordering::SeqCst);
    (load(&admitted), load(&denied), load(&errors), elapsed)
}

/// Checks the bound and that the limit, not the load, decided.
pub fn assert_exact(admitted: u64, denied: u64, elapsed: Duration) {
    let bound = BURST + QUOTA * elapsed.as_secs_f64();
    eprintln!("admitted {admitted}, denied {denied}, bound {bound:.1} over {elapsed:?}");
    assert!(admitted as f64 <= bound, "admitted {admitted} > {bound:.1}");
    assert!(denied > admitted, "the load exceeded the limit");
    assert!(
        admitted as f64 >= 0.8 * QUOTA * elapsed.as_secs_f64(),
        "admitted only {admitted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sluice_processes_on_one_redis_admit_no_more_than_the_limit() {
    let redis = RedisServer::start();
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(rules.path(), RULES).expect("write rules");
    let replicas: Vec<SluiceProcess> = (0..3)
        .map(|_| {
            SluiceProcess::start(
                env!("CARGO_BIN_EXE_sluice"),
                rules.path(),
                &redis.url(),
                &[],
            )
        })
        .collect();
    let urls: Vec<String> = replicas.iter().map(SluiceProcess::url).collect();
    let (admitted, denied, errors, elapsed) = hammer(&urls).await;
    assert_eq!(errors, 0);
    assert_exact(admitted, denied, elapsed);
}
