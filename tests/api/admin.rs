//! The admin HTTP server over a real socket: liveness, readiness, the rules dump, and `/json`
//! with valid, invalid, over-limit and backend-failure requests.

use std::sync::Arc;

use serde_json::{Value, json};
use sluice::config::settings::Settings;
use sluice::limiter::{Batch, BatchOutcome, BoxFuture, Limiter, LimiterError};
use sluice::testing::grpc::*;
use sluice::testing::http::{get, post};

const RULES: &str = "\
domain: test
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2, name: two}
  - key: free
    rate_limit: {unlimited: true}
  - key: user
    descriptors:
      - key: route
        value: /reports/*
        shadow_mode: true
        rate_limits:
          - {unit: second, requests_per_unit: 5}
          - {unit: hour, requests_per_unit: 100}
";

#[tokio::test]
async fn healthz_readyz_and_the_index() {
    let server = TestServer::start(RULES).await;
    let live = get(server.admin_addr, "/healthz").await;
    assert_eq!((live.status, live.body.as_str()), (200, "OK\n"));
    for path in ["/readyz", "/healthcheck"] {
        let ready = get(server.admin_addr, path).await;
        assert_eq!(
            (ready.status, ready.body.as_str()),
            (200, "ready\n"),
            "{path}"
        );
    }
    let index = get(server.admin_addr, "/").await;
    for path in ["/healthz", "/readyz", "/metrics", "/rlconfig", "/json"] {
        assert!(index.body.contains(path), "{}", index.body);
    }
    assert_eq!(get(server.admin_addr, "/nope").await.status, 404);
}

#[tokio::test]
async fn readyz_fails_without_any_domain() {
    let server = TestServer::start("").await;
    let ready = get(server.admin_addr, "/readyz").await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.body, "not ready: no rules loaded (0 domains)\n");
    assert_eq!(get(server.admin_addr, "/healthz").await.status, 200);
}

#[tokio::test]
async fn rlconfig_lists_every_limit_with_the_version() {
    let server = TestServer::start(RULES).await;
    let dump = get(server.admin_addr, "/rlconfig").await;
    assert_eq!(dump.status, 200);
    let lines: Vec<&str> = dump.body.lines().collect();
    assert!(
        lines[0].starts_with("# version 1, loaded at "),
        "{}",
        dump.body
    );
    assert!(
        lines[0].ends_with("(Unix time), 1 domain(s)"),
        "{}",
        dump.body
    );
    let common =
        "burst=5 algorithm=funnel charge=admitted borrow=false shadow_mode=true quota_mode=false";
    assert_eq!(
        lines[1..],
        [
            "test.k: unit=MINUTE unit_multiplier=1 requests_per_unit=2 burst=2 algorithm=funnel \
             charge=admitted borrow=false shadow_mode=false quota_mode=false name=two"
                .to_owned(),
            "test.free: unlimited shadow_mode=false quota_mode=false".to_owned(),
            format!(
                "test.user.route_/reports/*: unit=SECOND unit_multiplier=1 requests_per_unit=5 \
                 {common}"
            ),
            format!(
                "test.user.route_/reports/*: unit=HOUR unit_multiplier=1 requests_per_unit=100 \
                 {}",
                common.replace("burst=5", "burst=100")
            ),
        ]
    );
}

fn body_of(answer: &sluice::testing::http::Answer) -> Value {
    assert_eq!(answer.header("content-type"), Some("application/json"));
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
}

#[tokio::test]
async fn json_answers_ok_then_over_limit() {
    let server = TestServer::start(RULES).await;
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let first = post(server.admin_addr, "/json", body).await;
    assert_eq!(first.status, 200);
    let limit = json!({"name": "two", "requestsPerUnit": 2, "unit": "MINUTE"});
    assert_eq!(
        body_of(&first),
        json!({"overallCode": "OK", "statuses": [
            {"code": "OK", "currentLimit": limit, "limitRemaining": 1, "durationUntilReset": "30s"}
        ]})
    );
    assert_eq!(post(server.admin_addr, "/json", body).await.status, 200);
    let over = post(server.admin_addr, "/json", body).await;
    assert_eq!(over.status, 429);
    assert_eq!(
        body_of(&over),
        json!({"overallCode": "OVER_LIMIT", "statuses": [
            {"code": "OVER_LIMIT", "currentLimit": limit, "durationUntilReset": "30s"}
        ]})
    );
}

#[tokio::test]
async fn json_takes_snake_case_strings_and_overrides() {
    let server = TestServer::start(RULES).await;
    let body = r#"{"domain":"test","hits_addend":"2","descriptors":[
        {"entries":[{"key":"free","value":"x"}]},
        {"entries":[{"key":"k","value":"o"}],"limit":{"requestsPerUnit":10,"unit":"HOUR"}}]}"#;
    let answer = post(server.admin_addr, "/json", body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let v = body_of(&answer);
    assert_eq!(
        v["statuses"][0],
        json!({"code": "OK", "limitRemaining": 4294967295u32})
    );
    assert_eq!(v["statuses"][1]["currentLimit"]["unit"], "HOUR");
    assert_eq!(v["statuses"][1]["limitRemaining"], 8);
}

#[tokio::test]
async fn json_rejects_bad_bodies_with_a_readable_message() {
    let server = TestServer::start(RULES).await;
    let cases = [
        (
            "",
            "invalid JSON: EOF while parsing a value at line 1 column 0\n",
        ),
        (
            r#"{"domain":"test","descriptor":[]}"#,
            "unknown field `descriptor`",
        ),
        (
            r#"{"domain":"test","descriptors":[]}"#,
            "invalid request: rate limit descriptor list must not be empty\n",
        ),
        (
            r#"{"descriptors":[{"entries":[]}]}"#,
            "invalid request: rate limit domain must not be empty\n",
        ),
        (
            r#"{"domain":"test","descriptors":[{"entries":[{"key":"k"}],"limit":{"unit":"WEEKS"}}]}"#,
            "unknown unit \"WEEKS\"",
        ),
    ];
    for (body, message) in cases {
        let answer = post(server.admin_addr, "/json", body).await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert!(answer.body.contains(message), "{body}: {}", answer.body);
        assert!(
            answer
                .header("content-type")
                .unwrap()
                .starts_with("text/plain")
        );
    }
}

/// A backend that is always down.
struct Down;

impl Limiter for Down {
    fn check<'a>(&'a self, _: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(std::future::ready(Err(LimiterError {
            backend: "down",
            message: "connection refused".to_owned(),
            transient: true,
            source: None,
        })))
    }

    fn name(&self) -> &'static str {
        "down"
    }
}

#[tokio::test]
async fn json_is_503_when_the_backend_is_unavailable() {
    let limiter: Arc<dyn Limiter> = Arc::new(Down);
    let server = TestServer::start_over(Settings::default(), RULES, limiter).await;
    let admin_addr = server.admin_addr;
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let answer = post(admin_addr, "/json", body).await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.body, "down backend error: connection refused\n");
    let metrics = get(admin_addr, "/metrics").await.body;
    let errors = sluice::testing::http::sample(
        &metrics,
        "sluice_backend_errors_total",
        &[("backend", "down"), ("kind", "transient")],
    );
    assert_eq!(errors, Some(1.0), "{metrics}");
    server.stop().await.unwrap();
}
