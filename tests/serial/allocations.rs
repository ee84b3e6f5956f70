//! Heap allocations per request on the memory backend's hot path: a wire request through
//! `wire::decide` (the gRPC handler's own path: conversion, validation, matching, the limiter,
//! the metrics observer, the wire response), counted by the binary's global allocator, which
//! counts only the calling thread's allocations between two marks.
//!
//! The budgets are today's counts: a change that adds an allocation per request fails here and
//! has to say why in this file.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::FutureExt as _;
use sluice::config::rules_file;
use sluice::engine::{Engine, Options};
use sluice::limiter::MemoryLimiter;
use sluice::metrics::{Metrics, MetricsOptions};
use sluice::proto::{RateLimitDescriptor, RateLimitRequest, rate_limit_descriptor::Entry};
use sluice::rules::RuleSet;

use crate::{allocations, serial};

/// The rules `sluice bench` runs against in the process tests.
const RULES: &str = include_str!("../fixtures/rules/suites/bench.yaml");

fn engine() -> (Engine, Arc<Metrics>) {
    let model = rules_file::from_sources(&[(PathBuf::from("bench.yaml"), RULES.to_owned())])
        .unwrap_or_else(|e| panic!("rules are invalid:\n{e}"));
    let rules = Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)));
    let metrics = Metrics::new(MetricsOptions::default());
    let engine = Engine::new(
        rules,
        Arc::new(MemoryLimiter::new(1_000_000)),
        Options::default(),
    )
    .with_observer(metrics.clone());
    (engine, metrics)
}

fn request(descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Allocations of one decided request whose keys already hold state (the steady state), the
/// wire request built before counting starts.
fn per_request(engine: &Engine, descriptors: &[&[(&str, &str)]]) -> u64 {
    let warm = sluice::wire::decide(engine, request(descriptors)).now_or_never();
    assert!(matches!(warm, Some(Ok(_))), "{warm:?}");
    let wire = request(descriptors);
    let (answer, n) = allocations(|| sluice::wire::decide(engine, wire).now_or_never());
    let answer = answer.expect("the memory backend answers at once");
    let answer = answer.expect("the request is valid");
    assert_eq!(answer.statuses.len(), descriptors.len());
    n
}

#[test]
fn allocations_per_request_stay_within_budget() {
    let _serial = serial();
    let (engine, metrics) = engine();
    let one = per_request(&engine, &[&[("user", "alice")]]);
    let nested = per_request(&engine, &[&[("client", "c1"), ("route", "/api/users")]]);
    let ten: Vec<(String, String)> = (0..10)
        .map(|i| ("user".to_owned(), format!("user-{i}")))
        .collect();
    let ten: Vec<[(&str, &str); 1]> = ten
        .iter()
        .map(|(k, v)| [(k.as_str(), v.as_str())])
        .collect();
    let ten: Vec<&[(&str, &str)]> = ten.iter().map(|d| &d[..]).collect();
    let ten = per_request(&engine, &ten);
    eprintln!("allocations per request: 1 descriptor {one}, nested {nested}, 10 descriptors {ten}");
    // The observer really ran: each request (and its warm-up twin) counted.
    let text = metrics.encode().expect("metrics encode");
    for line in [
        "sluice_rule_hits_total{domain=\"bench\",rule=\"user\"} 22",
        "sluice_rule_hits_total{domain=\"bench\",rule=\"client.route_/api/*\"} 2",
        "sluice_requests_total{result=\"ok\"} 6",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    // Today's counts. For one descriptor: none to convert the wire request, 13 in the engine
    // (the plan's vectors and batch, the state key, the limiter's boxed future and outcome,
    // the response's statuses) and 1 for the wire response. The metric labels and the match
    // path no longer allocate (19 before).
    assert!(one <= 14, "1 descriptor: {one} allocations");
    assert!(nested <= 14, "nested: {nested} allocations");
    assert!(ten <= 61, "10 descriptors: {ten} allocations");
}
