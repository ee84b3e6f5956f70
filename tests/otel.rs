//! With the `otel` feature: request spans reach an OTLP/gRPC collector (a fake one, served
//! here on a loopback port). Run with `cargo test --features otel --test otel`.

#![cfg(feature = "otel")]

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use sluice::engine::{Descriptor, Engine, Options, Request};
use sluice::limiter::MemoryLimiter;
use sluice::rules::{Entry, RuleSet};
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;
use tracing_subscriber::layer::SubscriberExt as _;

struct Collector(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_reach_the_collector() {
    let (tx, mut spans) = mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
    );

    let (layer, provider) = sluice::telemetry::otel::layer(&endpoint).unwrap();
    let subscriber = tracing_subscriber::registry().with(layer);
    {
        let _default = tracing::subscriber::set_default(subscriber);
        let yaml = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        let model = sluice::config::rules::from_sources(&[("t.yaml".into(), yaml.into())]).unwrap();
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
        engine.should_rate_limit(&request).await.unwrap();
    }
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .unwrap()
        .unwrap();

    let span = tokio::time::timeout(Duration::from_secs(10), spans.recv())
        .await
        .expect("a span within 10 s")
        .expect("the collector is running");
    assert_eq!(span.name, "should_rate_limit");
    assert_eq!(attribute(&span, "domain").as_deref(), Some("test"));
    assert_eq!(attribute(&span, "descriptors").as_deref(), Some("1"));
    assert_eq!(attribute(&span, "result").as_deref(), Some("ok"));
    assert!(attribute(&span, "latency_us").is_some());
    stop.cancel();
    server.await.unwrap().unwrap();
}
