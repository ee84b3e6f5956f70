//! Sentinel: a master, a replica and three sentinels (quorum 2), all real `redis-server`
//! processes. sluice finds the master through the sentinels; when the master is killed and
//! the sentinels promote the replica, sluice follows and keeps deciding.

use std::sync::Arc;
use std::time::Duration;

use sluice::config::settings::{RedisSettings, Settings};
use sluice::limiter::RedisLimiter;
use sluice::testing::grpc::*;
use sluice::testing::redis::{RedisServer, SentinelGroup};
use tokio::time::Instant;

const RULES: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_follows_a_sentinel_failover() {
    let group = SentinelGroup::start();
    let settings = RedisSettings {
        url: group.url(),
        ..sluice::testing::redis::default_settings()
    };
    let SentinelGroup {
        mut master,
        replica,
        sentinels: _sentinels,
    } = group;
    let limiter = RedisLimiter::new(&settings, 100).expect("valid settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let mut c = client(&server).await;
    let ask = || req("s", vec![desc(&[("k", "v")])]);

    let r = call(&mut c, ask()).await;
    assert_eq!(r.statuses[0].limit_remaining, 999);
    assert!(master.script_calls() > 0, "decided on the master");

    master.kill();
    let killed = Instant::now();
    let mut failed = 0;
    let answer = loop {
        match c.should_rate_limit(ask()).await {
            Ok(r) => break r.into_inner(),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable);
                failed += 1;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no answer after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "answers again {:?} after the kill ({failed} UNAVAILABLE)",
        killed.elapsed()
    );
    assert_eq!(overall(&answer), Code::Ok);
    let promoted: String = replica.cmd(&["INFO", "replication"]);
    assert!(promoted.contains("role:master"), "{promoted}");
    assert!(replica.script_calls() > 0, "decided on the new master");
    for _ in 0..5 {
        assert_eq!(overall(&call(&mut c, ask()).await), Code::Ok);
    }
}

/// A Sentinel with `requirepass` of its own (`redis.sentinel_password`, envoyproxy/ratelimit's
/// `REDIS_SENTINEL_AUTH`), in front of a master with another password (in the URL): sluice
/// asks the sentinel with the first and the master with the second; without the sentinel's
/// password no master is found and requests are UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_a_password_of_their_own_are_asked_with_it() {
    let (master, sentinel) = RedisServer::guarded_sentinel("master-pw", "sentinel-pw");
    // The sentinel refuses a client without its password.
    let plain = redis::Client::open(format!("redis://{}", sentinel.addr())).unwrap();
    let refused = redis::cmd("PING").query::<String>(&mut plain.get_connection().unwrap());
    assert!(
        refused.is_err_and(|e| e.code() == Some("NOAUTH")),
        "requirepass is on"
    );

    let url = format!("redis+sentinel://:master-pw@{}/mymaster", sentinel.addr());
    let ask = || req("s", vec![desc(&[("k", "v")])]);
    let without = RedisSettings {
        url: url.clone(),
        ..sluice::testing::redis::default_settings()
    };
    let limiter = RedisLimiter::new(&without, 100).expect("valid settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let status = client(&server)
        .await
        .should_rate_limit(ask())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    let with = RedisSettings {
        url,
        sentinel_password: Some("sentinel-pw".to_owned()),
        ..sluice::testing::redis::default_settings()
    };
    let limiter = RedisLimiter::new(&with, 100).expect("valid settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let mut c = client(&server).await;
    let r = call(&mut c, ask()).await;
    assert_eq!(r.statuses[0].limit_remaining, 999);
    let r = call(&mut c, ask()).await;
    assert_eq!(r.statuses[0].limit_remaining, 998);
    // Counted on the master, which takes its own password.
    let on_master =
        redis::Client::open(format!("redis://:master-pw@127.0.0.1:{}", master.port)).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut on_master.get_connection().unwrap())
        .unwrap();
    assert!(!keys.is_empty(), "decided on the master");
}
