//! The caller's trace from a direct gRPC call to the real binary: with `traceparent` (and
//! `tracestate`) or B3 headers, sluice's `should_rate_limit` span (and a `sluice.v1.Throttle`
//! call's `throttle` span) is exported in the caller's trace with the caller's span as its
//! parent; an unsampled caller gets no span; malformed headers are ignored (a new root span,
//! and the request answered as usual).

use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::Span;
use sluice::testing::grpc::{Client, Code, desc, overall, req};
use sluice::testing::process::SluiceProcess;

use sluice_client::pb::sluice::v1::throttle_client::ThrottleClient;
use sluice_client::pb::sluice::v1::{ThrottleKey, ThrottleRequest, throttle_key};

use crate::support::{Collector, Received, attribute, hex, traced_sluice};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN: &str = "00f067aa0ba902b7";
const RULES: &str =
    "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// A collector and the binary exporting to it, with its rules' directory.
struct Traced {
    collector: Collector,
    sluice: SluiceProcess,
    _dir: tempfile::TempDir,
}

async fn traced() -> Traced {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let collector = Collector::start().await;
    let sluice = traced_sluice(&rules, &collector.url, "sluice-direct");
    Traced {
        collector,
        sluice,
        _dir: dir,
    }
}

impl Traced {
    /// One `ShouldRateLimit` with `headers` in its metadata (answered OK).
    async fn call(&self, headers: &[(&'static str, &str)]) {
        let mut client = Client::connect(self.sluice.url()).await.expect("connect");
        let mut request = tonic::Request::new(req("t", vec![desc(&[("k", "v")])]));
        for (key, value) in headers {
            let value = value.parse().expect("an ASCII value");
            request.metadata_mut().insert(*key, value);
        }
        let answer = client.should_rate_limit(request).await.expect("an answer");
        assert_eq!(overall(&answer.into_inner()), Code::Ok);
    }

    /// The request span of the call with `headers`: the next `should_rate_limit` span.
    async fn span_of(&mut self, headers: &[(&'static str, &str)]) -> Span {
        self.call(headers).await;
        let is_request = |r: &Received| r.1.name == "should_rate_limit";
        let (resource, span) = self
            .collector
            .until(Duration::from_secs(10), is_request)
            .await
            .pop()
            .expect("the request's span");
        let name = resource.get("service.name").map(String::as_str);
        assert_eq!(name, Some("sluice-direct"));
        span
    }
}

fn ids(span: &Span) -> (String, String) {
    (hex(&span.trace_id), hex(&span.parent_span_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_makes_sluices_span_a_child_of_the_callers() {
    let mut t = traced().await;
    let traceparent = format!("00-{TRACE}-{SPAN}-01");
    let headers = [("traceparent", &*traceparent), ("tracestate", "edge=1")];
    let span = t.span_of(&headers).await;
    assert_eq!(ids(&span), (TRACE.to_owned(), SPAN.to_owned()));
    assert_eq!(span.trace_state, "edge=1");
    assert_ne!(hex(&span.span_id), SPAN);

    // An unsampled caller: no span of its trace, while the next sampled one arrives.
    let other = "0af7651916cd43dd8448eb211c80319c";
    let unsampled = format!("00-{other}-{SPAN}-00");
    t.call(&[("traceparent", &unsampled)]).await;
    let span = t.span_of(&[("traceparent", &traceparent)]).await;
    assert_eq!(ids(&span), (TRACE.to_owned(), SPAN.to_owned()));
    let rest = t.collector.stop().await;
    assert!(
        rest.iter().all(|(_, s)| hex(&s.trace_id) != other),
        "the unsampled trace was exported: {rest:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_headers_make_sluices_span_a_child_of_the_callers() {
    let mut t = traced().await;
    let multi = [
        ("x-b3-traceid", TRACE),
        ("x-b3-spanid", SPAN),
        ("x-b3-sampled", "1"),
    ];
    let span = t.span_of(&multi).await;
    assert_eq!(ids(&span), (TRACE.to_owned(), SPAN.to_owned()));

    let short = "a3ce929d0e0e4736";
    let single = format!("{short}-{SPAN}-1");
    let span = t.span_of(&[("b3", &single)]).await;
    let padded = format!("{short:0>32}");
    assert_eq!(ids(&span), (padded, SPAN.to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_trace_headers_give_a_new_root_span() {
    let mut t = traced().await;
    let cases: [&[(&'static str, &str)]; 4] = [
        &[],
        &[("traceparent", "00-abc-def-01")],
        &[("traceparent", "not a trace context")],
        &[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-zz-1")],
    ];
    let mut traces = Vec::new();
    for headers in cases {
        let span = t.span_of(headers).await;
        assert!(span.parent_span_id.is_empty(), "{headers:?}: {span:?}");
        let trace = hex(&span.trace_id);
        assert!(
            !traces.contains(&trace) && trace != TRACE,
            "{headers:?}: {trace}"
        );
        traces.push(trace);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_calls_span_joins_the_callers_trace() {
    let mut t = traced().await;
    let mut client = ThrottleClient::connect(t.sluice.url())
        .await
        .expect("connect");
    let key = ThrottleKey {
        id: Some(throttle_key::Id::Key("k".to_owned())),
        max_burst: 15,
        count: 30,
        period_ms: 60_000,
        quantity: Some(1),
        refund: false,
        algorithm: 0,
    };
    let mut request = tonic::Request::new(ThrottleRequest {
        keys: vec![key],
        name: "checkout".to_owned(),
    });
    let traceparent = format!("00-{TRACE}-{SPAN}-01");
    let value = traceparent.parse().expect("an ASCII value");
    request.metadata_mut().insert("traceparent", value);
    let answer = client.throttle(request).await.expect("an answer");
    assert!(!answer.into_inner().results[0].limited);

    let is_throttle = |r: &Received| r.1.name == "throttle";
    let within = Duration::from_secs(10);
    let (_, span) = t.collector.until(within, is_throttle).await.pop().unwrap();
    assert_eq!(ids(&span), (TRACE.to_owned(), SPAN.to_owned()));
    assert_eq!(attribute(&span, "name").as_deref(), Some("checkout"));
    assert_eq!(attribute(&span, "keys").as_deref(), Some("1"));
    assert_eq!(attribute(&span, "result").as_deref(), Some("allowed"));
}
