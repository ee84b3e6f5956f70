//! Request spans reach an OTLP collector under the configured service names, sampled by the
//! configured ratio: over gRPC from the in-process engine, and over HTTP (protobuf bodies
//! POSTed to `/v1/traces`) from the real binary started as `ratelimit` with Envoy Gateway's
//! tracing variables. The last test needs `redis-server` and fails with the command that
//! installs it when it is missing.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use sluice::config::settings::{LogSettings, OtlpProtocol};
use sluice::engine::{Descriptor, Engine, Options, Request};
use sluice::limiter::MemoryLimiter;
use sluice::rules::{Entry, RuleSet};
use sluice::testing::grpc::{Code, RateLimitServiceClient, call, desc, overall, req};
use sluice::testing::process::{Served, limitador_server, serving_grpc};
use sluice::testing::ratelimit_env::ISTIO;
use sluice::testing::redis::RedisServer;
use tokio::sync::mpsc;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::support::resource_attributes;
use crate::support::{Collector, Received as Exported, ResourceAttributes, attribute};

/// Exports through sluice's OTLP/gRPC layer with `log` (its endpoint set here to a fake
/// collector) while the engine answers `requests` requests, then flushes by shutting the
/// provider down, and returns every span the collector received.
async fn grpc_export(mut log: LogSettings, requests: usize) -> Vec<Exported> {
    let collector = Collector::start().await;
    let endpoint = collector.url.clone();
    log.otlp_endpoint = Some(endpoint.clone());
    log.otlp_protocol = OtlpProtocol::Grpc;
    let (layer, provider) = sluice::telemetry::otel::layer(&endpoint, &log).unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    {
        let _default = tracing::subscriber::set_default(subscriber);
        let yaml = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        let model =
            sluice::config::rules_file::from_sources(&[("t.yaml".into(), yaml.into())]).unwrap();
        let rules = Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)));
        let engine = Engine::new(rules, Arc::new(MemoryLimiter::new(10)), Options::default());
        let request = Request {
            domain: "test".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry::new("k", "v")],
                ..Descriptor::default()
            }],
            hits_addend: 0,
        };
        for _ in 0..requests {
            engine.should_rate_limit(&request).await.unwrap();
        }
    }
    // The shutdown returns once the last batch is exported (and so received).
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();
    collector.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_reach_the_collector_under_the_configured_service_names() {
    let log = LogSettings {
        otlp_service_name: "edge-limits".to_owned(),
        otlp_service_namespace: Some("gateway".to_owned()),
        otlp_service_instance_id: Some("pod-7".to_owned()),
        ..LogSettings::default()
    };
    let got = grpc_export(log, 1).await;
    let (resource, span) = got
        .into_iter()
        .find(|(_, s)| s.name == "should_rate_limit")
        .expect("the request's span was exported");
    let want = |k: &str| resource.get(k).map(String::as_str);
    assert_eq!(want("service.name"), Some("edge-limits"));
    assert_eq!(want("service.namespace"), Some("gateway"));
    assert_eq!(want("service.instance.id"), Some("pod-7"));
    assert_eq!(attribute(&span, "domain").as_deref(), Some("test"));
    assert_eq!(attribute(&span, "descriptors").as_deref(), Some("1"));
    assert_eq!(attribute(&span, "result").as_deref(), Some("ok"));
    assert!(attribute(&span, "latency_us").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_ratio_zero_exports_no_request_span_where_one_exports_each() {
    let requests = |got: &[Exported]| {
        got.iter()
            .filter(|(_, s)| s.name == "should_rate_limit")
            .count()
    };
    let all = LogSettings::default();
    assert_eq!(all.otlp_sampling_ratio, 1.0);
    let got = grpc_export(all, 5).await;
    assert_eq!(requests(&got), 5, "ratio 1: {got:?}");
    let (resource, _) = &got[0];
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("sluice")
    );
    assert!(!resource.contains_key("service.namespace"), "{resource:?}");

    let none = LogSettings {
        otlp_sampling_ratio: 0.0,
        ..LogSettings::default()
    };
    let got = grpc_export(none, 5).await;
    assert_eq!(requests(&got), 0, "ratio 0: {got:?}");
}

/// What the fake OTLP/HTTP collector received: each request's path and content type, and
/// the spans of its body with their resource's `service.name`.
#[derive(Debug)]
struct Received {
    path: String,
    content_type: String,
    resource: ResourceAttributes,
    span: Span,
}

/// A running fake collector: its base URL, what it received, and its task (ended by the
/// token it was given).
type Collecting = (
    String,
    mpsc::UnboundedReceiver<Received>,
    tokio::task::JoinHandle<std::io::Result<()>>,
);

/// An OTLP/HTTP collector on a loopback port, until `stop`: decodes each POSTed
/// `ExportTraceServiceRequest` and sends its spans to the returned channel.
async fn http_collector(stop: tokio_util::sync::CancellationToken) -> Collecting {
    let (tx, rx) = mpsc::unbounded_channel();
    let export = move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
        let tx = tx.clone();
        async move {
            let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                return (StatusCode::BAD_REQUEST, Vec::new());
            };
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            for resource in request.resource_spans {
                let attributes = resource_attributes(resource.resource.as_ref());
                for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                    let _ = tx.send(Received {
                        path: uri.path().to_owned(),
                        content_type: content_type.clone(),
                        resource: attributes.clone(),
                        span,
                    });
                }
            }
            let ok = ExportTraceServiceResponse::default().encode_to_vec();
            (StatusCode::OK, ok)
        }
    };
    let app = axum::Router::new().fallback(axum::routing::post(export));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    (url, rx, server)
}

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_http_collector_from_the_binary_as_ratelimit() {
    let stop = tokio_util::sync::CancellationToken::new();
    let (collector, mut received, server) = http_collector(stop.clone()).await;
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), RULES).unwrap();
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).unwrap();

    let mut env: std::collections::HashMap<String, String> = ISTIO
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let data = dir.path().join("data").display().to_string();
    env.extend(
        [
            ("RUNTIME_ROOT", data),
            ("REDIS_URL", redis.addr()),
            ("GRPC_HOST", "127.0.0.1".to_owned()),
            // Its listeners on ports from the kernel; its log (Istio's `LOG_LEVEL=debug`)
            // says where it serves.
            ("GRPC_PORT", "0".to_owned()),
            ("HOST", "127.0.0.1".to_owned()),
            ("PORT", "0".to_owned()),
            ("DEBUG_HOST", "127.0.0.1".to_owned()),
            ("DEBUG_PORT", "0".to_owned()),
            // As Envoy Gateway sets them: TRACING_EXPORTER_PROTOCOL left to its default
            // (http), the collector's base URL.
            ("TRACING_ENABLED", "true".to_owned()),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit".to_owned()),
            (
                "TRACING_SERVICE_NAMESPACE",
                "envoy-gateway-system".to_owned(),
            ),
            ("TRACING_SAMPLING_RATE", "1.0".to_owned()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector),
            // Export within 100 ms rather than the SDK's 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
            ("SLUICE_REDIS__TIMEOUT_MS", "3000".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let mut child = std::process::Command::new(&link)
        .env_clear()
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ratelimit");
    let grpc = serving_grpc(&mut child);
    let _ratelimit = Served(child);
    let mut c = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let answer = call(&mut c, req("t", vec![desc(&[("k", "v")])])).await;
    assert_eq!(overall(&answer), Code::Ok);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let got = tokio::time::timeout(left, received.recv())
            .await
            .expect("the request's span within 10 s")
            .expect("the collector is running");
        if got.span.name == "should_rate_limit" {
            break got;
        }
    };
    assert_eq!(got.path, "/v1/traces");
    assert_eq!(got.content_type, "application/x-protobuf");
    let resource = |k: &str| got.resource.get(k).map(String::as_str);
    assert_eq!(resource("service.name"), Some("envoy-ratelimit"));
    assert_eq!(resource("service.namespace"), Some("envoy-gateway-system"));
    assert_eq!(attribute(&got.span, "domain").as_deref(), Some("t"));
    assert_eq!(attribute(&got.span, "result").as_deref(), Some("ok"));
    stop.cancel();
    server.await.unwrap().unwrap();
}

/// limitador's `--tracing-endpoint` (its `rpc://host:port` form): spans over OTLP/gRPC under
/// limitador's service name, from the real binary started as `limitador-server`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_tracing_endpoint_of_limitador_server() {
    let mut collector = crate::support::Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    let text =
        "- namespace: ns\n  max_value: 5\n  seconds: 3600\n  variables: [\"descriptors[0].k\"]\n";
    std::fs::write(&limits, text).unwrap();
    let endpoint = collector.url.replace("http://", "rpc://");
    let mut child = limitador_server(env!("CARGO_BIN_EXE_sluice"), dir.path())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .args(["--tracing-endpoint", &endpoint])
        .arg(&limits)
        .spawn()
        .expect("start limitador-server");
    let grpc = serving_grpc(&mut child);
    let _limitador = Served(child);
    let mut c = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let answer = call(&mut c, req("ns", vec![desc(&[("k", "v")])])).await;
    assert_eq!(overall(&answer), Code::Ok);
    let got = collector
        .until(Duration::from_secs(10), |r| r.1.name == "should_rate_limit")
        .await;
    let (resource, span) = got.last().expect("the request's span");
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("limitador")
    );
    assert_eq!(attribute(span, "domain").as_deref(), Some("ns"));
}
