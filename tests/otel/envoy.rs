//! One trace across a real Envoy 1.40 and the real binary: Envoy's OpenTelemetry tracer and
//! sluice both export to one fake OTLP/gRPC collector; a request through Envoy runs the
//! ratelimit filter, whose gRPC client opens a child span of the request's span (`async
//! envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit egress`, tagged with the
//! cluster) and sends that span's context as `traceparent`. sluice's `should_rate_limit` span
//! must be that span's child, in the same trace as Envoy's request span (the root).

use std::time::Duration;

use sluice::testing::envoy::EnvoyProcess;
use sluice::testing::http::get;
use sluice::testing::process::loopback;

use crate::support::{Collector, Received, attribute, hex, service, traced_sluice};

/// Envoy's config: a listener whose connection manager traces every request with the
/// OpenTelemetry tracer (exporting each span at once) and asks sluice (domain `edge`, one
/// `generic_key` descriptor) before routing to the upstream on port `app`.
fn envoy_config(admin: u16, port: u16, sluice: u16, collector: u16, app: u16) -> String {
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
layered_runtime:
  layers:
    - name: export_each_span
      static_layer:
        tracing.opentelemetry.min_flush_spans: 1
        tracing.opentelemetry.flush_interval_ms: 100
static_resources:
  listeners:
    - name: ingress
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                tracing:
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      grpc_service:
                        envoy_grpc: {{ cluster_name: otlp }}
                        timeout: 1s
                      service_name: edge-proxy
                route_config:
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - generic_key: {{ descriptor_value: traced }}
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: true
                      timeout: 5s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {{ cluster_name: sluice }}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: app
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: app
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {app} }} }} }}
{sluice_cluster}
{otlp_cluster}
"#,
        sluice_cluster = h2_cluster("sluice", sluice),
        otlp_cluster = h2_cluster("otlp", collector),
    )
}

/// A static HTTP/2 (gRPC) cluster on a loopback port.
fn h2_cluster(name: &str, port: u16) -> String {
    format!(
        r#"    - name: {name}
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: {name}
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}"#
    )
}

const RULES: &str = "domain: edge\ndescriptors:\n  - key: generic_key\n    value: traced\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

/// An upstream on a port from the kernel that answers every request 200 (one request per
/// connection), until dropped.
struct Upstream {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    async fn start() -> Upstream {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer =
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
                    let _ = conn.write_all(answer.as_bytes()).await;
                });
            }
        });
        Upstream { port, task }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The span of `spans` whose id is `id`.
fn by_id<'a>(spans: &'a [Received], id: &[u8]) -> Option<&'a Received> {
    spans.iter().find(|(_, s)| s.span_id == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_ratelimit_call_is_the_parent_of_sluices_span_in_one_trace() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let mut collector = Collector::start().await;
    let collector_port: u16 = collector.url.rsplit(':').next().unwrap().parse().unwrap();
    let sluice = traced_sluice(&rules, &collector.url, "sluice-behind-envoy");
    // Envoy's admin and listener on ports from the kernel, read back once it runs.
    let app = Upstream::start().await;
    let config = envoy_config(0, 0, sluice.port, collector_port, app.port);
    let envoy = EnvoyProcess::start(&config).await;
    let port = envoy.listener();

    let answer = get(loopback(port), "/ready").await;
    assert_eq!(answer.status, 200, "{answer:?}\n{}", envoy.log());

    // Every span until sluice's, then Envoy's until the chain up to its root is complete.
    let within = Duration::from_secs(20);
    let is_sluices = |r: &Received| r.1.name == "should_rate_limit";
    let mut spans = collector.until(within, is_sluices).await;
    let ours = spans.last().unwrap().1.clone();
    assert_eq!(service(spans.last().unwrap()), "sluice-behind-envoy");
    assert_eq!(spans.last().unwrap().1.parent_span_id.len(), 8, "{ours:?}");
    let chain_done = |spans: &[Received]| {
        let call = by_id(spans, &ours.parent_span_id);
        call.is_some_and(|(_, c)| by_id(spans, &c.parent_span_id).is_some())
    };
    while !chain_done(&spans) {
        let next = collector.next(within, "Envoy's spans of the request").await;
        spans.push(next);
    }

    let (resource, call) = by_id(&spans, &ours.parent_span_id).unwrap();
    let call_service = resource.get("service.name").map(String::as_str);
    assert_eq!(call_service, Some("edge-proxy"), "{call:?}");
    let rls = "async envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit egress";
    assert_eq!(call.name, rls, "{call:?}");
    let cluster = attribute(call, "upstream_cluster");
    assert_eq!(cluster.as_deref(), Some("sluice"), "{call:?}");
    assert_eq!(hex(&call.trace_id), hex(&ours.trace_id));
    let request = by_id(&spans, &call.parent_span_id).unwrap();
    assert_eq!(service(request), "edge-proxy", "{request:?}");
    assert_eq!(hex(&request.1.trace_id), hex(&ours.trace_id));
    assert!(request.1.parent_span_id.is_empty(), "{request:?}");
}
