//! Round trips to Redis, watched by Redis itself (`MONITOR`): one script call per request
//! whatever its number of descriptors, no other command from sluice, and none at all for a
//! key in the deny cache; a concurrency limit (a hold and its release) costs no call of its own.

use std::sync::Arc;

use sluice::config::settings::{RedisSettings, Settings};
use sluice::limiter::RedisLimiter;
use sluice::testing::grpc::*;
use sluice::testing::redis::RedisServer;

const RULES: &str = include_str!("../fixtures/rules/suites/redis.yaml");

async fn serve(settings: RedisSettings) -> (TestServer, Client) {
    let limiter = RedisLimiter::new(&settings, 1_000).expect("valid redis settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let c = client(&server).await;
    (server, c)
}

fn descriptors(n: usize, round: usize) -> Vec<RateLimitDescriptor> {
    (0..n)
        .map(|i| desc(&[("wide", &format!("r{round}-d{i}"))]))
        .collect()
}

#[tokio::test]
async fn one_script_call_per_request_for_1_and_for_10_descriptors() {
    // The script (the default) and the function library (`redis.functions`).
    for (functions, command) in [(false, "evalsha"), (true, "fcall")] {
        let redis = RedisServer::start();
        let settings = RedisSettings {
            functions,
            ..redis.settings()
        };
        let (_server, mut c) = serve(settings).await;
        // Warm up: the first call loads the code (NOSCRIPT then EVAL, or no function then
        // FUNCTION LOAD and FCALL again).
        call(&mut c, req("redis", descriptors(1, 0))).await;
        for n in [1, 10] {
            let monitor = redis.monitor();
            for round in 1..=20 {
                let r = call(&mut c, req("redis", descriptors(n, round))).await;
                assert_eq!(overall(&r), Code::Ok);
                assert_eq!(r.statuses.len(), n);
            }
            assert_eq!(monitor.client_commands(), [command; 20], "{n} descriptors");
        }
    }
}

#[tokio::test]
async fn a_denied_key_is_answered_from_the_deny_cache_without_redis() {
    let redis = RedisServer::start();
    let (_server, mut c) = serve(redis.settings()).await;
    assert_eq!(overall(&hit_rt(&mut c, "one", "hot").await), Code::Ok);
    assert_eq!(
        overall(&hit_rt(&mut c, "one", "hot").await),
        Code::OverLimit
    );
    let monitor = redis.monitor();
    for _ in 0..50 {
        let r = hit_rt(&mut c, "one", "hot").await;
        assert_eq!(overall(&r), Code::OverLimit);
        let reset = reset_secs(&r.statuses[0]).expect("a reset");
        assert!((59..=60).contains(&reset), "reset {reset}");
        assert_eq!(
            limit_of(&r.statuses[0]),
            Some((1, Unit::Minute, String::new()))
        );
    }
    assert_eq!(
        monitor.client_commands(),
        Vec::<String>::new(),
        "no Redis call for a cached denial"
    );
    // Another key, or the same key with another descriptor beside it, still goes to Redis.
    let monitor = redis.monitor();
    assert_eq!(overall(&hit_rt(&mut c, "one", "cold").await), Code::Ok);
    let both = req(
        "redis",
        vec![desc(&[("one", "hot")]), desc(&[("wide", "x")])],
    );
    assert_eq!(overall(&call(&mut c, both).await), Code::OverLimit);
    assert_eq!(monitor.client_commands(), ["evalsha"; 2]);
}

#[tokio::test]
async fn without_the_deny_cache_every_denial_is_a_round_trip() {
    let redis = RedisServer::start();
    let settings = RedisSettings {
        deny_cache_size: 0,
        ..redis.settings()
    };
    let (_server, mut c) = serve(settings).await;
    hit_rt(&mut c, "one", "hot").await;
    let monitor = redis.monitor();
    for _ in 0..5 {
        assert_eq!(
            overall(&hit_rt(&mut c, "one", "hot").await),
            Code::OverLimit
        );
    }
    assert_eq!(monitor.client_commands(), ["evalsha"; 5]);
}

async fn hit_rt(c: &mut Client, key: &str, value: &str) -> RateLimitResponse {
    call(c, req("redis", vec![desc(&[(key, value)])])).await
}

/// Holds cost what other limits cost: a request whose descriptors include a concurrency limit
/// (its hold named by the request's id) beside a funnel is one script call, and so is its
/// stream-done release.
#[tokio::test]
async fn a_hold_and_its_release_are_one_script_call_each_beside_other_limits() {
    const HOLDS: &str = "domain: redis
descriptors:
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: inflight
    rate_limit: {algorithm: concurrency, unit: minute, requests_per_unit: 100, hold_id: request_id}
";
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1_000).expect("valid redis settings");
    let server = TestServer::start_over(Settings::default(), HOLDS, Arc::new(limiter)).await;
    let mut c = client(&server).await;
    let held = |id: &str| desc(&[("inflight", "tenant"), ("request_id", id)]);
    call(&mut c, req("redis", vec![held("warm")])).await;
    let monitor = redis.monitor();
    for round in 0..10 {
        let id = format!("r{round}");
        let r = call(
            &mut c,
            req("redis", vec![desc(&[("wide", &id)]), held(&id)]),
        )
        .await;
        assert_eq!(overall(&r), Code::Ok, "{r:?}");
        let mut release = with_hits(held(&id), 1);
        release.is_negative_hits = true;
        let r = call(&mut c, req("redis", vec![release])).await;
        assert_eq!(overall(&r), Code::Ok, "{r:?}");
    }
    assert_eq!(monitor.client_commands(), ["evalsha"; 20]);
    // Every release found its hold: only the warm-up's is held.
    let r = call(&mut c, req("redis", vec![held("last")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 98, "{r:?}");
}
