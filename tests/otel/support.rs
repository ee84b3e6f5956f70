//! What the otel tests share: a fake OTLP/gRPC collector, span and resource attributes, and
//! the real binary exporting to a collector.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use sluice::testing::process::SluiceProcess;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

/// The string attributes of a resource (`service.name`, ...).
pub(crate) type ResourceAttributes = BTreeMap<String, String>;

/// A span as received, with its resource's attributes.
pub(crate) type Received = (ResourceAttributes, Span);

pub(crate) fn resource_attributes(resource: Option<&Resource>) -> ResourceAttributes {
    let attributes = resource
        .map(|r| r.attributes.as_slice())
        .unwrap_or_default();
    attributes
        .iter()
        .filter_map(|a| match a.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some((a.key.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

/// A span attribute's value as text.
pub(crate) fn attribute(span: &Span, key: &str) -> Option<String> {
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

/// An id (trace or span) as lower-case hex, as headers carry it.
pub(crate) fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `service.name` a span was exported under.
pub(crate) fn service(received: &Received) -> &str {
    received.0.get("service.name").map_or("", String::as_str)
}

/// A fake OTLP/gRPC collector's service: sends each received span, with its resource's
/// attributes.
struct Export(mpsc::UnboundedSender<Received>);

#[tonic::async_trait]
impl TraceService for Export {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource in request.into_inner().resource_spans {
            let attributes = resource_attributes(resource.resource.as_ref());
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                let _ = self.0.send((attributes.clone(), span));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A fake OTLP/gRPC collector on a loopback port, stopped by [`Collector::stop`] or when
/// dropped.
pub(crate) struct Collector {
    /// `http://127.0.0.1:<port>` (`https://` with TLS).
    pub url: String,
    spans: mpsc::UnboundedReceiver<Received>,
    stop: CancellationToken,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Collector {
    pub(crate) async fn start() -> Collector {
        Collector::start_tls(None).await
    }

    /// The same, serving TLS with `tls` when given.
    pub(crate) async fn start_tls(tls: Option<tonic::transport::ServerTlsConfig>) -> Collector {
        let (tx, spans) = mpsc::unbounded_channel();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("a valid TLS identity");
        }
        let server = tokio::spawn(
            builder
                .add_service(TraceServiceServer::new(Export(tx)))
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(listener),
                    stop.clone().cancelled_owned(),
                ),
        );
        Collector {
            url,
            spans,
            stop,
            server: Some(server),
        }
    }

    /// The next span received, waiting up to `within`; fails, naming `what`, after that.
    pub(crate) async fn next(&mut self, within: Duration, what: &str) -> Received {
        tokio::time::timeout(within, self.spans.recv())
            .await
            .unwrap_or_else(|_| panic!("no span within {within:?} ({what})"))
            .expect("the collector is running")
    }

    /// A span received and not yet taken, if any (without waiting).
    pub(crate) fn try_next(&mut self) -> Option<Received> {
        self.spans.try_recv().ok()
    }

    /// Spans received until one satisfies `found`, within `within`: all of them, that one
    /// last.
    pub(crate) async fn until(
        &mut self,
        within: Duration,
        found: impl Fn(&Received) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + within;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let span = tokio::time::timeout(left, self.spans.recv())
                .await
                .unwrap_or_else(|_| panic!("the awaited span within {within:?}; got {got:#?}"))
                .expect("the collector is running");
            let done = found(&span);
            got.push(span);
            if done {
                return got;
            }
        }
    }

    /// Stops the server and returns every span received and not yet taken.
    pub(crate) async fn stop(mut self) -> Vec<Received> {
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
        let mut got = Vec::new();
        while let Ok(span) = self.spans.try_recv() {
            got.push(span);
        }
        got
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The real binary (`sluice serve` on the memory backend with `rules`), exporting its spans
/// over OTLP/gRPC to `collector` as `service_name`, each batch within 100 ms.
pub(crate) fn traced_sluice(rules: &Path, collector: &str, service_name: &str) -> SluiceProcess {
    let env = [
        ("SLUICE_LOG__OTLP_ENDPOINT", collector),
        ("SLUICE_LOG__OTLP_PROTOCOL", "grpc"),
        ("SLUICE_LOG__OTLP_SERVICE_NAME", service_name),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), rules, &[], &env)
}
