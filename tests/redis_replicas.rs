//! Exactness across replicas: three `sluice` processes share one Redis; many concurrent
//! clients hammer one descriptor through all of them for a few seconds; the admitted count
//! never exceeds burst + rate x elapsed (and comes close to it: the limit is what stops them).

mod common;
#[path = "support/load.rs"]
mod load;
#[path = "support/redis.rs"]
mod redis_support;
#[path = "support/sluice_process.rs"]
mod sluice_process;

use std::time::Duration;

use common::*;
use redis_support::RedisServer;
use sluice_process::SluiceProcess;

/// 20 per second, burst 10.
const RULES: &str = "
domain: x
descriptors:
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 20, burst: 10}
";

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
                // Exactness is under test, not latency: no time-outs on a loaded machine.
                &[("SLUICE_REDIS__TIMEOUT_MS", "5000")],
            )
        })
        .collect();
    let urls: Vec<String> = replicas.iter().map(SluiceProcess::url).collect();
    let tally = load::hammer(&urls, 8, Duration::from_secs(4), |_| {
        req("x", vec![desc(&[("hot", "one")])])
    })
    .await;
    load::assert_exact(tally, 20.0, 10.0);
}
