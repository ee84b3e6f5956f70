//! The request semantics of docs/semantics.md, through gRPC on loopback with the `envoy-types`
//! client, against the memory backend on a manual clock. The scenarios that hold on both
//! backends are written once in tests/redis/semantics.rs, which runs each over memory and over
//! a real Redis; those here use what only this file's servers have (settings, a limiter of
//! the test's own, other rules).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use sluice::config::settings::Settings;
use sluice::limiter::{Batch, BatchOutcome, BoxFuture, Limiter, LimiterError, MemoryLimiter};
use sluice::testing::grpc::*;
use tonic::Code as GrpcCode;

const RULES: &str = include_str!("../fixtures/semantics.yaml");

/// Rules for the edge cases of metadata merging, `replaces` and wildcard precedence.
const EDGES: &str = r#"
domain: test
descriptors:
  - key: meta_a
    metadata: {tier: gold, nested: {a: 1}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: meta_b
    metadata: {tier: silver, nested: {a: 9, b: 2}, extra: true}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: g2
    rate_limit: {unit: minute, requests_per_unit: 1, name: g2}
  - key: u
    rate_limit: {unlimited: true, replaces: [{name: g2}]}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, name: a, replaces: [{name: b}]}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1, name: b, replaces: [{name: a}]}
  - key: route
    value: /reports/*
    rate_limit: {unit: minute, requests_per_unit: 1, name: wildcard}
  - key: route
    value: /reports/x
    rate_limit: {unit: minute, requests_per_unit: 2, name: exact}
"#;

async fn setup() -> (TestServer, Client) {
    serve(RULES).await
}

/// A server over the memory backend serving `rules`, and a client of it.
async fn serve(rules: &str) -> (TestServer, Client) {
    let server = TestServer::start(rules).await;
    let c = client(&server).await;
    (server, c)
}

/// A server with `settings` serving the semantics rules, and a client of it.
async fn serve_with(settings: Settings) -> (TestServer, Client) {
    let server = TestServer::start_with(settings, RULES).await;
    let c = client(&server).await;
    (server, c)
}

/// Sends `r` and expects it refused with `InvalidArgument`; returns the refusal.
async fn refused(c: &mut Client, r: RateLimitRequest) -> tonic::Status {
    let err = c.should_rate_limit(r).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument, "{}", err.message());
    err
}

/// The `(name, value)` headers a response asks Envoy to add.
fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn owned_pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// `r` is answered `OK`, its first descriptor with `remaining` left; the answer.
async fn assert_ok_remaining(
    c: &mut Client,
    r: RateLimitRequest,
    remaining: u32,
) -> RateLimitResponse {
    let answer = call(c, r).await;
    assert_eq!(overall(&answer), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, remaining);
    answer
}

#[tokio::test]
async fn time_drains_the_funnel_and_reset_rounds_up() {
    let (s, mut c) = setup().await;
    let r = hit(&mut c, "two_per_second", "x").await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(reset_secs(&r.statuses[0]), Some(1), "0.5 s rounds up to 1");
    assert_eq!(hit_code(&mut c, "two_per_second", "x").await, Code::Ok);
    let over = hit(&mut c, "two_per_second", "x").await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(reset_secs(&over.statuses[0]), Some(1));
    s.clock.advance(SECOND / 2);
    assert_ok_remaining(&mut c, each(&[("two_per_second", "x")]), 0).await;
}

#[tokio::test]
async fn unknown_domain_no_match_and_empty_entries_are_ok_without_limit() {
    let (_s, mut c) = setup().await;
    let cases = [
        req("nope", vec![desc(&[("one_per_minute", "a")])]),
        req("test", vec![desc(&[("no_such_key", "a")])]),
        req("test", vec![desc(&[])]),
        req("test", vec![desc(&[("passthrough", "a")])]),
        req(
            "test",
            vec![desc(&[("one_per_minute", "a"), ("too", "deep")])],
        ),
        req("test", vec![desc(&[("user", "alice")])]),
    ];
    for r in cases {
        assert_ok_without_limit(&mut c, r).await;
    }
}

#[tokio::test]
async fn unlimited_is_ok_with_max_remaining() {
    let (_s, mut c) = setup().await;
    for _ in 0..3 {
        let r = assert_ok_remaining(&mut c, each(&[("path", "/healthz")]), u32::MAX).await;
        assert_eq!(r.statuses[0].current_limit, None);
    }
}

#[tokio::test]
async fn empty_domain_or_descriptor_list_is_invalid_argument() {
    let (_s, mut c) = setup().await;
    let err = refused(&mut c, req("", vec![desc(&[("a", "b")])])).await;
    assert!(err.message().contains("domain"), "{}", err.message());
    let err = refused(&mut c, req("test", vec![])).await;
    assert!(err.message().contains("descriptor"), "{}", err.message());
}

#[tokio::test]
async fn nested_and_wildcard_matching() {
    let (_s, mut c) = setup().await;
    let name_of = |r: &RateLimitResponse| limit_name(&r.statuses[0]);
    let one = |entries: &[(&str, &str)]| req("test", vec![desc(entries)]);
    let cases = [
        ("/reports/2024/q1", "reports"),
        ("/reports/", "reports"),
        ("/admin", "admin"),
        ("/export/all.csv", "csv"),
        ("/reports/all.csv", "reports"),
        ("/other", "any_route"),
    ];
    for (route, expected) in cases {
        let r = call(&mut c, one(&[("user", "bob"), ("route", route)])).await;
        assert_eq!(name_of(&r).as_deref(), Some(expected), "route {route}");
    }
    let r = call(&mut c, one(&[("user", "root"), ("action", "delete")])).await;
    assert_eq!(name_of(&r).as_deref(), Some("root_delete"));
    // No backtracking: `user=root` matched exactly, and its subtree has no `route`.
    let r = call(&mut c, one(&[("user", "root"), ("route", "/admin")])).await;
    assert_eq!(r.statuses[0].current_limit, None);
    // A limit on an intermediate level applies only to requests that end there.
    let r = call(&mut c, one(&[("intermediate", "x")])).await;
    assert_eq!(name_of(&r).as_deref(), Some("top"));
    let r = call(&mut c, one(&[("intermediate", "x"), ("leaf", "y")])).await;
    assert_eq!(name_of(&r).as_deref(), Some("leaf"));
}

#[tokio::test]
async fn a_denied_request_consumes_nothing_anywhere() {
    let (_s, mut c) = setup().await;
    let both = || each(&[("two_per_second", "x"), ("one_per_minute", "y")]);
    assert_eq!(overall(&call(&mut c, both()).await), Code::Ok);
    let r = call(&mut c, both()).await;
    assert_codes(&r, Code::OverLimit, &[Code::Ok, Code::OverLimit]);
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "nothing consumed: still 1 left"
    );
    // Only one of two_per_second's two units was used.
    assert_ok_remaining(&mut c, each(&[("two_per_second", "x")]), 0).await;
}

#[tokio::test]
async fn cost_precedence_and_check_only() {
    let (_s, mut c) = setup().await;
    // The request's hits_addend is the cost...
    let mut r = req("test", vec![desc(&[("two_per_second", "a")])]);
    r.hits_addend = 2;
    assert_ok_remaining(&mut c, r, 0).await;
    // ...but the descriptor's own wins.
    let mut r = costing("two_per_second", "b", 1);
    r.hits_addend = 5;
    assert_ok_remaining(&mut c, r, 1).await;
    // Cost 0 only checks.
    for _ in 0..3 {
        assert_ok_remaining(&mut c, costing("two_per_second", "b", 0), 1).await;
    }
    // A full (not indebted) limit still checks OK with nothing left.
    hit(&mut c, "two_per_second", "b").await;
    assert_ok_remaining(&mut c, costing("two_per_second", "b", 0), 0).await;
}

#[tokio::test]
async fn refunds_give_back() {
    let (_s, mut c) = setup().await;
    hit(&mut c, "two_per_second", "r").await;
    hit(&mut c, "two_per_second", "r").await;
    assert_eq!(
        hit_code(&mut c, "two_per_second", "r").await,
        Code::OverLimit
    );
    assert_ok_remaining(&mut c, refund("two_per_second", "r", 1), 1).await;
    assert_eq!(hit_code(&mut c, "two_per_second", "r").await, Code::Ok);
    assert_eq!(
        hit_code(&mut c, "two_per_second", "r").await,
        Code::OverLimit
    );
    // Refunding more than was taken never goes below empty.
    let answer = call(&mut c, refund("two_per_second", "r", 1_000)).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn limit_override_is_used_when_the_domain_exists() {
    let (_s, mut c) = setup().await;
    let with_override = |domain: &str| {
        let d = overridden(desc(&[("one_per_minute", "ov")]), 3, RateLimitUnit::Second);
        req(domain, vec![d])
    };
    for remaining in [2, 1, 0] {
        let r = call(&mut c, with_override("test")).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(
            limit_of(&r.statuses[0]),
            Some((3, Unit::Second, String::new()))
        );
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    assert_eq!(
        overall(&call(&mut c, with_override("test")).await),
        Code::OverLimit
    );
    let r = call(&mut c, with_override("unknown")).await;
    assert_eq!(r.statuses[0].current_limit, None);

    let bad = overridden(desc(&[("a", "b")]), 1, RateLimitUnit::Unknown);
    refused(&mut c, req("test", vec![bad])).await;
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_but_reports_statuses() {
    let mut settings = Settings::default();
    settings.rules.shadow_mode = true;
    let (_s, mut c) = serve_with(settings).await;
    hit(&mut c, "one_per_minute", "a").await;
    let r = hit(&mut c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
}

#[tokio::test]
async fn rule_metadata_reaches_dynamic_metadata() {
    let (_s, mut c) = setup().await;
    let r = hit(&mut c, "meta", "m").await;
    assert_eq!(
        metadata_json(&r),
        Some(json!({"metadata": {"tier": "gold", "nested": {"a": 1.0}}}))
    );
    let over = hit(&mut c, "meta", "m").await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert!(
        over.dynamic_metadata.is_none(),
        "no metadata from an over-limit descriptor"
    );
}

#[tokio::test]
async fn request_echo_and_rate_limit_headers_when_enabled() {
    let mut settings = Settings::default();
    settings.response.headers = true;
    settings.response.dynamic_metadata = true;
    let (_s, mut c) = serve_with(settings).await;
    let used_up = [
        ("RateLimit-Limit", "1"),
        ("RateLimit-Remaining", "0"),
        ("RateLimit-Reset", "60"),
    ];
    let r = hit(&mut c, "one_per_minute", "h").await;
    assert_eq!(headers(&r), owned_pairs(&used_up));
    let md = format!("{:?}", r.dynamic_metadata.expect("echo"));
    assert!(
        md.contains("one_per_minute=h") && md.contains("\"test\""),
        "{md}"
    );
    // Over the limit: the same, and Retry-After.
    let r = hit(&mut c, "one_per_minute", "h").await;
    let over = [&used_up[..], &[("Retry-After", "60")]].concat();
    assert_eq!(headers(&r), owned_pairs(&over));
}

/// The echo names each descriptor's own verdict and its reported limit, so that a gateway can
/// tell which quota is spent (docs/token-budgets.md).
#[tokio::test]
async fn the_echo_gives_each_descriptors_code_and_limit_name() {
    let mut settings = Settings::default();
    settings.response.dynamic_metadata = true;
    settings.limits.quota_mode = true;
    let (_s, mut c) = serve_with(settings).await;
    let both = || each(&[("multi", "x"), ("one_per_minute", "x")]);
    call(&mut c, both()).await;
    let r = call(&mut c, both()).await;
    assert_eq!(overall(&r), Code::Ok, "one quota descriptor still passes");
    let md = metadata_json(&r).expect("echo");
    let descriptors = md["descriptors"].as_array().expect("descriptors");
    assert_eq!(descriptors[0]["entries"], json!(["multi=x"]));
    assert_eq!(descriptors[0]["code"], json!("OK"));
    assert_eq!(descriptors[0]["limitName"], json!("per_second"));
    assert_eq!(descriptors[1]["entries"], json!(["one_per_minute=x"]));
    assert_eq!(descriptors[1]["code"], json!("OVER_LIMIT"));
    assert!(
        descriptors[1].get("limitName").is_none(),
        "an unnamed limit: {md}"
    );
}

#[tokio::test]
async fn metadata_of_several_descriptors_merges_first_value_wins() {
    let (_s, mut c) = serve(EDGES).await;
    let both = || each(&[("meta_a", "m"), ("meta_b", "m")]);
    let r = call(&mut c, both()).await;
    assert_eq!(
        metadata_json(&r),
        Some(json!({"metadata": {
            "tier": "gold",
            "nested": {"a": 1.0, "b": 2.0},
            "extra": true,
        }}))
    );
    // meta_a is over now: only meta_b's map is returned.
    let r = call(&mut c, both()).await;
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(
        metadata_json(&r),
        Some(json!({"metadata": {
            "tier": "silver",
            "nested": {"a": 9.0, "b": 2.0},
            "extra": true,
        }}))
    );
}

#[tokio::test]
async fn charge_always_is_charged_when_another_descriptor_denies() {
    let (_s, mut c) = setup().await;
    let both = || {
        req(
            "test",
            vec![
                with_hits(desc(&[("tokens", "t")]), 30),
                desc(&[("one_per_minute", "y")]),
            ],
        )
    };
    let r = call(&mut c, both()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 70);
    let r = call(&mut c, both()).await;
    assert_codes(&r, Code::OverLimit, &[Code::Ok, Code::OverLimit]);
    assert_eq!(
        r.statuses[0].limit_remaining, 40,
        "charged although the request was denied"
    );
    let r = call(&mut c, costing("tokens", "t", 0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 40);
}

#[tokio::test]
async fn an_unlimited_rule_that_replaces_drops_the_named_limit() {
    let (_s, mut c) = serve(EDGES).await;
    for _ in 0..2 {
        let r = call(&mut c, each(&[("u", "x"), ("g2", "x")])).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[1].current_limit, None, "g2 is replaced");
        assert_eq!(r.statuses[1].limit_remaining, 0);
    }
    // Without the replacing descriptor, g2 applies, and it consumed nothing meanwhile.
    let r = hit(&mut c, "g2", "x").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(limit_name(&r.statuses[0]).as_deref(), Some("g2"));
    assert_eq!(hit_code(&mut c, "g2", "x").await, Code::OverLimit);
}

#[tokio::test]
async fn limits_replacing_each_other_are_both_dropped() {
    let (_s, mut c) = serve(EDGES).await;
    for _ in 0..2 {
        let r = call(&mut c, each(&[("a", "x"), ("b", "x")])).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[1].current_limit, None);
    }
    // Alone, each applies (nothing replaces it), and neither consumed anything before.
    for key in ["a", "b"] {
        let r = hit(&mut c, key, "x").await;
        assert_eq!(overall(&r), Code::Ok, "{key}");
        assert_eq!(limit_name(&r.statuses[0]).as_deref(), Some(key));
        assert_eq!(hit_code(&mut c, key, "x").await, Code::OverLimit);
    }
}

#[tokio::test]
async fn an_exact_value_beats_an_earlier_declared_wildcard() {
    let (_s, mut c) = serve(EDGES).await;
    let r = hit(&mut c, "route", "/reports/x").await;
    assert_eq!(limit_name(&r.statuses[0]).as_deref(), Some("exact"));
    let r = hit(&mut c, "route", "/reports/y").await;
    assert_eq!(limit_name(&r.statuses[0]).as_deref(), Some("wildcard"));
}

/// A memory limiter that counts the calls it gets.
struct Counting {
    inner: MemoryLimiter,
    calls: AtomicUsize,
}

impl Limiter for Counting {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.check(batch)
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}

#[tokio::test]
async fn unlimited_and_unmatched_descriptors_make_no_limiter_call() {
    let limiter = Arc::new(Counting {
        inner: MemoryLimiter::new(100),
        calls: AtomicUsize::new(0),
    });
    let server = TestServer::start_over(Settings::default(), RULES, limiter.clone()).await;
    let mut c = client(&server).await;
    let free = each(&[
        ("path", "/healthz"),
        ("nothing", "here"),
        ("passthrough", "p"),
    ]);
    for _ in 0..3 {
        let r = call(&mut c, free.clone()).await;
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    }
    assert_eq!(limiter.calls.load(Ordering::SeqCst), 0);
    // One call per request once a limit applies, however many descriptors it has.
    let mut limited = free.clone();
    limited.descriptors.push(desc(&[("one_per_minute", "c")]));
    limited.descriptors.push(desc(&[("two_per_second", "c")]));
    call(&mut c, limited).await;
    assert_eq!(limiter.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn global_quota_mode_makes_every_descriptor_a_quota_one() {
    let mut settings = Settings::default();
    settings.limits.quota_mode = true;
    let (_s, mut c) = serve_with(settings).await;
    assert_eq!(hit_code(&mut c, "one_per_minute", "q").await, Code::Ok);
    // Alone, the one quota descriptor that is over denies the request.
    assert_eq!(
        hit_code(&mut c, "one_per_minute", "q").await,
        Code::OverLimit
    );
    // With another one that is not over, the request passes, and that one consumes.
    let r = call(
        &mut c,
        each(&[("one_per_minute", "q"), ("two_per_second", "q")]),
    )
    .await;
    assert_codes(&r, Code::Ok, &[Code::OverLimit, Code::Ok]);
    assert_eq!(r.statuses[1].limit_remaining, 1);
    // A client's override is a quota descriptor too.
    let own_limit = overridden(desc(&[("anything", "o")]), 1, RateLimitUnit::Second);
    let both = || {
        req(
            "test",
            vec![desc(&[("one_per_minute", "q")]), own_limit.clone()],
        )
    };
    assert_eq!(overall(&call(&mut c, both()).await), Code::Ok);
    let r = call(&mut c, both()).await;
    assert_eq!(code(&r.statuses[1]), Code::OverLimit);
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "every quota descriptor is over"
    );
    // Shadow mode still wins: a shadow rule never denies.
    hit(&mut c, "shadow", "q").await;
    assert_eq!(hit_code(&mut c, "shadow", "q").await, Code::Ok);
}

/// A limit's `on_deny`: the denied request's answer carries its body as `raw_body` and its
/// headers in `response_headers_to_add` (Envoy's 429); an admitted request carries neither,
/// and a shadow-mode rule's never applies.
#[tokio::test]
async fn a_denied_request_carries_the_limits_custom_denial() {
    const RULES: &str = "domain: d\ndescriptors:\n  - key: plan\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      on_deny:\n        body: '{\"error\":\"upgrade\"}'\n        content_type: application/json\n        headers: {x-upgrade: /plans}\n  - key: quiet\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1, on_deny: {body: never}}\n";
    let (_s, mut c) = serve(RULES).await;
    let ask = |key: &'static str| req("d", vec![desc(&[(key, "free")])]);
    let ok = call(&mut c, ask("plan")).await;
    assert_eq!(overall(&ok), Code::Ok);
    assert!(ok.raw_body.is_empty() && ok.response_headers_to_add.is_empty());
    let over = call(&mut c, ask("plan")).await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(over.raw_body, b"{\"error\":\"upgrade\"}");
    assert_eq!(
        headers(&over),
        owned_pairs(&[
            ("content-type", "application/json"),
            ("x-upgrade", "/plans")
        ])
    );
    call(&mut c, ask("quiet")).await;
    let shadow = call(&mut c, ask("quiet")).await;
    assert_eq!(overall(&shadow), Code::Ok);
    assert!(
        shadow.raw_body.is_empty(),
        "a shadow rule never answers with its denial"
    );
}
