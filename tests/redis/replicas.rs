//! Exactness across replicas: three `sluice` processes share one Redis; many concurrent
//! clients hammer one descriptor through all of them for a few seconds; the admitted count
//! never exceeds burst + rate x elapsed (and comes close to it: the limit is what stops them).

use std::time::Duration;

use sluice::testing::grpc::*;
use sluice::testing::process::SluiceProcess;
use sluice::testing::redis::RedisServer;

use crate::support::load;

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
    let (_rules, replicas) = load::replicas(3, RULES, &redis.url());
    let urls: Vec<String> = replicas.iter().map(SluiceProcess::url).collect();
    let tally = load::hammer(&urls, 8, Duration::from_secs(4), |_| {
        req("x", vec![desc(&[("hot", "one")])])
    })
    .await;
    load::assert_exact(tally, 20.0, 10.0);
}
