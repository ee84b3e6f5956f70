//! Garbage in never panics: every hostile request gets statuses or INVALID_ARGUMENT, and the
//! server keeps answering afterwards, with the default `[input]` bounds and with bounds
//! raised far above them (tests/api/input_limits.rs proves each bound).

use sluice::config::settings::{InputSettings, Settings};
use sluice::testing::grpc::*;
use tonic::Code as GrpcCode;

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: w\n    value: \"a*b*c\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

async fn assert_still_serving(c: &mut Client) {
    let r = call(c, req("test", vec![desc(&[("k", "alive")])])).await;
    assert_eq!(overall(&r), Code::Ok);
}

/// Bounds on input far above the defaults: what a request may hold is then limited only by
/// the operator's choice, and the server must still cope.
fn unbounded() -> Settings {
    Settings {
        input: InputSettings {
            max_descriptors: 100_000,
            max_entries: 100_000,
            max_domain_bytes: 1 << 20,
            max_key_bytes: 1 << 20,
            max_value_bytes: 4 << 20,
            max_request_bytes: 8 << 20,
            ..InputSettings::default()
        },
        ..Settings::default()
    }
}

/// One descriptor of 5,000 entries `k<i>=v<i>`.
fn thousands_of_entries() -> RateLimitDescriptor {
    let entries: Vec<(String, String)> = (0..5_000)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect();
    let refs: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    desc(&refs)
}

#[tokio::test]
async fn thousands_of_entries_are_refused_by_default() {
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    let err = c
        .should_rate_limit(req("test", vec![thousands_of_entries()]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    let many: Vec<_> = (0..2_000).map(|i| desc(&[("k", &i.to_string())])).collect();
    let err = c.should_rate_limit(req("test", many)).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    let huge = "x".repeat(64 << 10);
    let err = c
        .should_rate_limit(req("test", vec![desc(&[("k", &huge)])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    let huge = "x".repeat(1 << 20);
    let err = c
        .should_rate_limit(req("test", vec![desc(&[("k", &huge)])]))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        GrpcCode::ResourceExhausted,
        "over input.max_request_bytes"
    );
    assert_still_serving(&mut c).await;
}

#[tokio::test]
async fn thousands_of_entries_get_a_status() {
    let server = TestServer::start_with(unbounded(), RULES).await;
    let mut c = client(&server).await;
    let r = call(&mut c, req("test", vec![thousands_of_entries()])).await;
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.statuses[0].current_limit, None);
    let many: Vec<_> = (0..2_000).map(|i| desc(&[("k", &i.to_string())])).collect();
    let r = call(&mut c, req("test", many)).await;
    assert_eq!(r.statuses.len(), 2_000);
    assert_still_serving(&mut c).await;
}

#[tokio::test]
async fn empty_keys_are_invalid_argument() {
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    let err = c
        .should_rate_limit(req("test", vec![desc(&[("k", "v")]), desc(&[("", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument);
    assert!(
        err.message().contains("descriptors[1].entries[0].key"),
        "{}",
        err.message()
    );
    assert_still_serving(&mut c).await;
}

#[tokio::test]
async fn huge_values_and_wildcard_work_get_statuses() {
    let server = TestServer::start_with(unbounded(), RULES).await;
    let mut c = client(&server).await;
    let huge = "x".repeat(1 << 20);
    let r = call(&mut c, req("test", vec![desc(&[("k", &huge)])])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert!(r.statuses[0].current_limit.is_some());
    let nearly = format!("a{}", "b".repeat(1 << 20));
    let r = call(&mut c, req("test", vec![desc(&[("w", &nearly)])])).await;
    assert_eq!(r.statuses[0].current_limit, None, "no trailing c: no match");
    let odd = "\u{0}%{}|=~:\u{10FFFF}";
    let r = call(&mut c, req(odd, vec![desc(&[(odd, odd)])])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_still_serving(&mut c).await;
}

#[tokio::test]
async fn unknown_or_out_of_range_override_units_are_invalid_argument() {
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    for unit in [0, 7, 99, -1, i32::MAX] {
        let mut d = desc(&[("k", "v")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit,
        });
        let err = c.should_rate_limit(req("test", vec![d])).await.unwrap_err();
        assert_eq!(err.code(), GrpcCode::InvalidArgument, "unit {unit}");
    }
    let mut zero = desc(&[("k", "v")]);
    zero.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: 1,
    });
    let r = call(&mut c, req("test", vec![zero])).await;
    assert_eq!(overall(&r), Code::OverLimit, "a zero override blocks");
    assert_still_serving(&mut c).await;
}

#[tokio::test]
async fn extreme_costs_saturate_instead_of_overflowing() {
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    let r = call(
        &mut c,
        req("test", vec![with_hits(desc(&[("k", "big")]), u64::MAX)]),
    )
    .await;
    assert_eq!(overall(&r), Code::OverLimit);
    let mut back = with_hits(desc(&[("k", "big")]), u64::MAX);
    back.is_negative_hits = true;
    let r = call(&mut c, req("test", vec![back])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 5);
    let mut r = req("test", vec![desc(&[("k", "req")])]);
    r.hits_addend = u32::MAX;
    assert_eq!(overall(&call(&mut c, r).await), Code::OverLimit);
    let mut max = desc(&[("k", "ov")]);
    max.limit = Some(RateLimitOverride {
        requests_per_unit: u32::MAX,
        unit: 6,
    });
    let r = call(&mut c, req("test", vec![max])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_still_serving(&mut c).await;
}
