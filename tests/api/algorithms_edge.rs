//! Every algorithm at a window's edge, through gRPC on loopback (memory backend, manual
//! clock): the worked example of docs/algorithms.md. And a client's limit override taking
//! `limits.default_algorithm`, capped as the rules are under `sliding_log` and `concurrency`,
//! and holding slots under `concurrency`.

use std::path::PathBuf;

use sluice::config::model::Algorithm;
use sluice::config::rules_file::{LoadOptions, from_sources_with};
use sluice::config::settings::Settings;
use sluice::testing::grpc::*;

/// 4 per minute, of `algorithm`.
fn rules(algorithm: &str) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 4, algorithm: {algorithm}}}\n"
    )
}

async fn admitted(c: &mut Client, attempts: usize) -> usize {
    let mut n = 0;
    for _ in 0..attempts {
        let r = call(c, req("edge", vec![desc(&[("k", "x")])])).await;
        if overall(&r) == Code::Ok {
            n += 1;
        }
    }
    n
}

/// A minute boundary of the test clock (which starts at 1000 s): 17:00.
const EDGE: u64 = 1_020 * SECOND;

/// Admitted: 10 attempts at 0:59 (one second before the edge), 10 at 1:00, then one attempt
/// per second from 1:01 to 1:58, and 10 at 1:59.
async fn around_the_edge(algorithm: &str) -> [usize; 4] {
    let server = TestServer::start(&rules(algorithm)).await;
    let mut c = client(&server).await;
    server.clock.set(EDGE - SECOND);
    let before = admitted(&mut c, 10).await;
    server.clock.set(EDGE);
    let at = admitted(&mut c, 10).await;
    let mut during = 0;
    for s in 1..=58 {
        server.clock.set(EDGE + s * SECOND);
        during += admitted(&mut c, 1).await;
    }
    server.clock.set(EDGE + 59 * SECOND);
    let end = admitted(&mut c, 10).await;
    [before, at, during, end]
}

#[tokio::test]
async fn the_worked_example_of_the_docs() {
    // 4 per minute; a client sends 4 at 0:59, then keeps trying.
    // One leaks out every 15 s: 1:14, 1:29, 1:44, 1:59.
    assert_eq!(around_the_edge("funnel").await, [4, 0, 3, 1]);
    // All 4 come back one period after the first was taken.
    assert_eq!(around_the_edge("token_bucket").await, [4, 0, 0, 4]);
    // A new window at 1:00: 8 within one second.
    assert_eq!(around_the_edge("fixed_window").await, [4, 4, 0, 0]);
    // The 4 of 0:59 weigh 3 at 1:01, 2 at 1:16, 1 at 1:31, 0 at 1:46: one each time.
    assert_eq!(around_the_edge("sliding_window").await, [4, 0, 4, 0]);
    // Exact: nothing until the 4 of 0:59 are a minute old.
    assert_eq!(around_the_edge("sliding_log").await, [4, 0, 0, 4]);
    // 4 slots leased for a minute, never released: the holds of 0:59 expire at 1:59.
    assert_eq!(around_the_edge("concurrency").await, [4, 0, 0, 4]);
}

/// A server of a domain `edge` without limits, whose default algorithm is `algorithm`.
async fn serve_defaulting_to(algorithm: Algorithm) -> TestServer {
    let options = LoadOptions {
        default_algorithm: algorithm,
        ..LoadOptions::default()
    };
    let text = "domain: edge\ndescriptors:\n  - key: k\n".to_owned();
    let model = from_sources_with(&[(PathBuf::from("t.yaml"), text)], options)
        .unwrap_or_else(|e| panic!("{e}"));
    TestServer::start_model(Settings::default(), model).await
}

/// A descriptor `k=x` with a client's override of `requests_per_unit` per `unit`.
fn overridden(requests_per_unit: u32, unit: i32) -> RateLimitDescriptor {
    let mut d = desc(&[("k", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit,
    });
    d
}

#[tokio::test]
async fn a_limit_override_takes_the_default_algorithm() {
    let server = serve_defaulting_to(Algorithm::FixedWindow).await;
    let mut c = client(&server).await;
    let d = overridden(2, 2); // MINUTE
    server.clock.set(EDGE - SECOND);
    for _ in 0..2 {
        assert_eq!(
            overall(&call(&mut c, req("edge", vec![d.clone()])).await),
            Code::Ok
        );
    }
    let r = call(&mut c, req("edge", vec![d.clone()])).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(reset_secs(&r.statuses[0]), Some(1), "the end of the minute");
    server.clock.set(EDGE);
    let r = call(&mut c, req("edge", vec![d])).await;
    assert_eq!(
        overall(&r),
        Code::Ok,
        "a fixed window starts again at the minute"
    );
}

#[tokio::test]
async fn a_sliding_log_override_above_the_cap_is_invalid() {
    let server = serve_defaulting_to(Algorithm::SlidingLog).await;
    let mut c = client(&server).await;
    let hour = 3; // HOUR
    let err = c
        .should_rate_limit(req(
            "edge",
            vec![desc(&[("k", "y")]), overridden(10_001, hour)],
        ))
        .await
        .expect_err("over the cap");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "descriptors[1].limit.requests_per_unit: sliding_log keeps one entry per admitted \
         request: an override must be at most 10000 with it, got 10001 \
         (the domain's default algorithm is sliding_log)"
    );
    let r = call(&mut c, req("edge", vec![overridden(10_000, hour)])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 9_999);
    // An unknown domain ignores overrides, so it does not check them either.
    let r = call(&mut c, req("other", vec![overridden(50_000, hour)])).await;
    assert_eq!(r.statuses[0].current_limit, None);
    // Other algorithms take any quota.
    let server = serve_defaulting_to(Algorithm::SlidingWindow).await;
    let mut c = client(&server).await;
    let r = call(&mut c, req("edge", vec![overridden(50_000, hour)])).await;
    assert_eq!(r.statuses[0].limit_remaining, 49_999);
}

/// Under a `concurrency` default, an override is slots leased for its unit: a release (a
/// refund, as Envoy sends at stream done) frees a slot, a denied request's release frees
/// nothing, and the cap of the rules applies.
#[tokio::test]
async fn a_concurrency_override_holds_slots_until_released() {
    let server = serve_defaulting_to(Algorithm::Concurrency).await;
    let mut c = client(&server).await;
    let minute = 2; // MINUTE
    let d = overridden(2, minute);
    let mut release = d.clone();
    release.is_negative_hits = true;
    let code = |r: RateLimitResponse| overall(&r);
    for _ in 0..2 {
        assert_eq!(
            code(call(&mut c, req("edge", vec![d.clone()])).await),
            Code::Ok
        );
    }
    let r = call(&mut c, req("edge", vec![d.clone()])).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        reset_secs(&r.statuses[0]),
        Some(60),
        "until the first hold's lease ends"
    );
    // The denied request's release, then one from an admitted request.
    assert_eq!(
        code(call(&mut c, req("edge", vec![release.clone()])).await),
        Code::Ok
    );
    assert_eq!(
        code(call(&mut c, req("edge", vec![d.clone()])).await),
        Code::OverLimit
    );
    assert_eq!(
        code(call(&mut c, req("edge", vec![release.clone()])).await),
        Code::Ok
    );
    assert_eq!(
        code(call(&mut c, req("edge", vec![release])).await),
        Code::Ok
    );
    let r = call(&mut c, req("edge", vec![d])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        r.statuses[0].limit_remaining, 0,
        "one slot freed, then taken"
    );
    let err = c
        .should_rate_limit(req("edge", vec![overridden(10_001, minute)]))
        .await
        .expect_err("over the cap");
    assert_eq!(
        err.message(),
        "descriptors[0].limit.requests_per_unit: concurrency keeps one hold per admitted \
         request: an override must be at most 10000 with it, got 10001 \
         (the domain's default algorithm is concurrency)"
    );
}
