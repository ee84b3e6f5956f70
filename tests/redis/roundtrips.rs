//! Round trips to Redis, watched by Redis itself (`MONITOR`): one script call per request
//! whatever its number of descriptors, no other command from sluice, and none at all for a
//! key in the deny cache.

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
