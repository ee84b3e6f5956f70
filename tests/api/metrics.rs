//! `/metrics` over a real socket after a known sequence of gRPC requests: exact per-rule and
//! service values, a configured near-limit ratio, `detailed_metric` labels and their cap;
//! and every metric family in docs/operating.md.

use std::time::{Duration, SystemTime};

use sluice::config::settings::Settings;
use sluice::engine::{DescriptorReport, Observer as _, RequestResult};
use sluice::limiter::LimiterError;
use sluice::metrics::{BackendReport, Metrics, MetricsOptions};
use sluice::reload::ConfigStatus;
use sluice::rules::Entry;
use sluice::testing::grpc::*;
use sluice::testing::http::{get, sample};

const RULES: &str = include_str!("../fixtures/rules/suites/metrics.yaml");

async fn metrics(server: &TestServer) -> String {
    let answer = get(server.admin_addr, "/metrics").await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    answer.body
}

fn rule(text: &str, counter: &str, rule: &str) -> f64 {
    let name = format!("sluice_rule_{counter}_total");
    sample(text, &name, &[("domain", "test"), ("rule", rule)]).unwrap_or(0.0)
}

#[tokio::test]
async fn counts_a_known_sequence_exactly() {
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    // k: capacity 3, near threshold floor(3 x 0.8) = 2. Four requests: the third uses the
    // last unit (near: 1), the fourth is denied.
    for _ in 0..4 {
        hit(&mut c, "k", "a").await;
    }
    // s (shadow): one admitted, one over but let through.
    for _ in 0..2 {
        assert_eq!(overall(&hit(&mut c, "s", "x").await), Code::Ok);
    }
    // A cost of 5 on path /api/*: within, no near (5 of 10 used).
    call(
        &mut c,
        req("test", vec![with_hits(desc(&[("path", "/api/v1")]), 5)]),
    )
    .await;
    // Unmatched and unknown domains count no rule.
    hit(&mut c, "nothing", "x").await;
    call(&mut c, req("other", vec![desc(&[("k", "a")])])).await;
    // An invalid request.
    c.should_rate_limit(req("", vec![])).await.unwrap_err();

    let text = metrics(&server).await;
    let expect = [
        ("hits", "k", 4.0),
        ("within_limit", "k", 3.0),
        ("near_limit", "k", 1.0),
        ("over_limit", "k", 1.0),
        ("shadow_mode", "k", 0.0),
        ("hits", "s", 2.0),
        ("within_limit", "s", 1.0),
        ("near_limit", "s", 1.0),
        ("over_limit", "s", 1.0),
        ("shadow_mode", "s", 1.0),
        ("hits", "path_/api/*", 5.0),
        ("within_limit", "path_/api/*", 5.0),
        ("near_limit", "path_/api/*", 0.0),
    ];
    for (counter, label, value) in expect {
        assert_eq!(
            rule(&text, counter, label),
            value,
            "{counter} {label}\n{text}"
        );
    }
    let requests = |result| sample(&text, "sluice_requests_total", &[("result", result)]);
    assert_eq!(requests("ok"), Some(8.0), "{text}");
    assert_eq!(requests("over_limit"), Some(1.0), "{text}");
    assert_eq!(requests("invalid"), Some(1.0), "{text}");
    assert_eq!(requests("unavailable"), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, "sluice_request_duration_seconds_count", &[]),
        Some(10.0)
    );
    assert_eq!(sample(&text, "sluice_config_version", &[]), Some(1.0));
    let reloads = |outcome| {
        sample(
            &text,
            "sluice_config_reloads_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(reloads("success"), Some(0.0));
    assert_eq!(reloads("failure"), Some(0.0));
    assert!(text.ends_with("# EOF\n"));
}

#[tokio::test]
async fn detailed_metric_labels_are_capped() {
    let mut settings = Settings::default();
    settings.metrics.max_value_label_sets = 2;
    let server = TestServer::start_with(settings, RULES).await;
    let mut c = client(&server).await;
    for user in ["alice", "bob", "carol", "dave", "alice"] {
        hit(&mut c, "user", user).await;
    }
    let text = metrics(&server).await;
    assert_eq!(rule(&text, "hits", "user_alice"), 2.0, "{text}");
    assert_eq!(rule(&text, "hits", "user_bob"), 1.0, "{text}");
    assert_eq!(rule(&text, "hits", "__other__"), 2.0, "{text}");
    assert!(!text.contains("carol") && !text.contains("dave"), "{text}");
    // Rules without request values are never capped.
    hit(&mut c, "k", "a").await;
    assert_eq!(rule(&metrics(&server).await, "hits", "k"), 1.0);
}

#[tokio::test]
async fn the_near_limit_ratio_is_configurable() {
    let mut settings = Settings::default();
    settings.metrics.near_limit_ratio = 0.5;
    let server = TestServer::start_with(settings, RULES).await;
    let mut c = client(&server).await;
    // k: capacity 3, near threshold floor(3 x 0.5) = 1: the second and the third unit are
    // near (at the default 0.8, only the third); the fourth request is denied.
    for _ in 0..4 {
        hit(&mut c, "k", "a").await;
    }
    let text = metrics(&server).await;
    assert_eq!(rule(&text, "near_limit", "k"), 2.0, "{text}");
    assert_eq!(rule(&text, "within_limit", "k"), 3.0, "{text}");
    assert_eq!(rule(&text, "over_limit", "k"), 1.0, "{text}");
}

/// The name of every registered family. The encoder leaves out a family without any sample,
/// so each is given one: a descriptor within its limit and near it, one over it in shadow
/// mode, a request the backend failed, the backend's size and one of its events, and the
/// rules' version and load time.
fn every_family() -> Vec<String> {
    let metrics = Metrics::new(MetricsOptions::default());
    let entries = [Entry::new("client", "c1")];
    for over in [false, true] {
        metrics.descriptor(&DescriptorReport {
            domain: "test",
            entries: &entries,
            matched: None,
            cost: 1,
            refund: false,
            over,
            shadow: over,
            rule_shadow: over,
            capacity: 1,
            remaining: 0,
            local_cache: false,
        });
    }
    let down = LimiterError {
        backend: "redis",
        message: "connection refused".to_owned(),
        transient: true,
        source: None,
    };
    metrics.request(RequestResult::Unavailable(&down), Duration::ZERO);
    let config = ConfigStatus {
        version: 1,
        loaded_at: SystemTime::now(),
        last_failure: None,
    };
    let backend = BackendReport {
        keys_held: 1,
        events: vec![("deny_cache_hit", 1)],
        nodes: vec![("127.0.0.1:6379".to_owned(), false)],
    };
    metrics.refresh(&config, Some(("redis", &backend)));
    let text = metrics.encode().expect("the metrics encode");
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_metric_is_in_the_operating_guide() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md")).unwrap();
    let families = every_family();
    // Five per-rule counters, and eleven service metrics: requests, latency, backend errors,
    // backend events, backend breakers, keys in memory, reloads, admin resets and the keys
    // they forgot, config version and load time; and the RLQS streams and buckets gauges
    // (its counters appear once used).
    assert_eq!(families.len(), 18, "{families:?}");
    for family in families {
        let counter = format!("{family}_total");
        assert!(
            readme.contains(&format!("`{family}`")) || readme.contains(&format!("`{counter}`")),
            "{family} is not documented in docs/operating.md"
        );
    }
}

#[tokio::test]
async fn a_flood_of_request_values_keeps_the_label_sets_capped() {
    let mut settings = Settings::default();
    settings.metrics.max_value_label_sets = 100;
    let server = TestServer::start_with(settings, RULES).await;
    let mut c = client(&server).await;
    for n in 0..1_000 {
        hit(&mut c, "user", &format!("u{n}")).await;
        // A limit sent by the client is labelled with the request's values too.
        let mut d = desc(&[("client", &format!("c{n}"))]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 10,
            unit: Unit::Second as i32,
        });
        call(&mut c, req("test", vec![d])).await;
    }
    let text = metrics(&server).await;
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_rule_hits_total{"))
        .collect();
    assert_eq!(
        series.len(),
        101,
        "100 label sets and __other__: {series:?}"
    );
    assert_eq!(rule(&text, "hits", "__other__"), 1_900.0);
    let total: f64 = series
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total, 2_000.0);
}
