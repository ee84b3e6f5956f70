//! An `https://` collector, from the real binary: spans reach an OTLP/gRPC collector whose
//! certificate chains to `log.otlp_ca_file`, and an OTLP/HTTP collector that also asks for
//! a client certificate, given through the standard `OTEL_EXPORTER_OTLP_*` variables; a
//! collector whose certificate another CA signed gets no span (the export fails, is logged,
//! and sluice answers on); a TLS file that cannot be used stops the start (exit 64) naming
//! its setting or variable. The drop-ins take the same: `limitador-server --tracing-endpoint
//! https://...`, and `ratelimit` with `OTEL_EXPORTER_OTLP_ENDPOINT=https://...`, both trusting
//! the collector's CA through `OTEL_EXPORTER_OTLP_CERTIFICATE`. Certificates are made here
//! with rcgen.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
};
use sluice::testing::grpc::{Code, RateLimitServiceClient, call, desc, overall, req};
use sluice::testing::process::{
    LISTENERS_LOG, Log, Served, exit_within, limitador_server, serving_log, sluice_command,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::Collector;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// A CA made for one test.
struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        Ca(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    /// A leaf for 127.0.0.1 (an IP address name), as (certificate, key) PEM.
    fn leaf(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let cert = params.signed_by(&key, &self.0).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn pem(&self) -> String {
        self.0.pem()
    }
}

/// Writes `text` to `dir/name`; its path.
fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A span as the OTLP/HTTP collector received it: the request path and the span's name.
type Got = (String, String);

/// A TLS identity (certificate, key) for a gRPC server.
fn tls(identity: &(String, String)) -> Option<tonic::transport::ServerTlsConfig> {
    let identity = tonic::transport::Identity::from_pem(&identity.0, &identity.1);
    Some(tonic::transport::ServerTlsConfig::new().identity(identity))
}

/// Waits up to 10 s for the `should_rate_limit` span at an OTLP/gRPC collector.
async fn grpc_request_span(collector: &mut Collector) {
    let within = Duration::from_secs(10);
    collector
        .until(within, |(_, span)| span.name == "should_rate_limit")
        .await;
}

/// An OTLP/HTTP collector serving TLS with `identity` on a loopback port, asking for a client
/// certificate that `client_ca` signed when given, until `stop`: its `https://` base URL and
/// the spans POSTed to it.
async fn http_collector(
    identity: &(String, String),
    client_ca: Option<&Ca>,
    stop: CancellationToken,
) -> (String, mpsc::UnboundedReceiver<Got>) {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = vec![CertificateDer::from_pem_slice(identity.0.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
                .unwrap();
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let (tx, rx) = mpsc::unbounded_channel();
    let export = move |uri: axum::http::Uri, body: Bytes| {
        let tx = tx.clone();
        async move {
            let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                return (StatusCode::BAD_REQUEST, Vec::new());
            };
            let spans = request.resource_spans.into_iter();
            for span in spans.flat_map(|r| r.scope_spans).flat_map(|s| s.spans) {
                let _ = tx.send((uri.path().to_owned(), span.name));
            }
            let ok = ExportTraceServiceResponse::default().encode_to_vec();
            (StatusCode::OK, ok)
        }
    };
    let app = axum::Router::new().fallback(axum::routing::post(export));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                accepted = listener.accept() => accepted.unwrap(),
                () = stop.cancelled() => return,
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate (or has none) ends here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (url, rx)
}

/// `sluice serve` on the memory backend with `env`, exporting each batch within 100 ms: the
/// process, its gRPC URL, and its log (warnings and up).
fn traced(rules: &Path, env: &[(&str, &str)]) -> (Served, String, Log) {
    let mut child = sluice_command(BIN)
        .args(["serve", "--rules"])
        .arg(rules)
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sluice binary");
    let ([grpc], log) = serving_log(&mut child, ["gRPC"]);
    (Served(child), format!("http://{grpc}"), log)
}

/// One request for `k=value` in domain `t`: OK.
async fn decide(url: &str, value: &str) {
    decide_in(url, "t", value).await;
}

/// One request for `k=value` in `domain`: OK.
async fn decide_in(url: &str, domain: &str, value: &str) {
    let mut c = RateLimitServiceClient::connect(url.to_owned())
        .await
        .expect("connect");
    let answer = call(&mut c, req(domain, vec![desc(&[("k", value)])])).await;
    assert_eq!(overall(&answer), Code::Ok);
}

/// Waits up to 10 s for the `should_rate_limit` span: the path it was POSTed to.
async fn request_span(spans: &mut mpsc::UnboundedReceiver<Got>) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let (path, name) = tokio::time::timeout(left, spans.recv())
            .await
            .expect("the request's span within 10 s")
            .expect("the collector is running");
        if name == "should_rate_limit" {
            return path;
        }
    }
}

fn rules(dir: &Path) -> String {
    write(dir, "rules.yaml", RULES)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_spans_reach_an_https_collector_that_the_ca_file_vouches_for() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let mut collector = Collector::start_tls(tls(&ca.leaf())).await;
    let env = [
        ("SLUICE_LOG__OTLP_ENDPOINT", collector.url.as_str()),
        ("SLUICE_LOG__OTLP_PROTOCOL", "grpc"),
        ("SLUICE_LOG__OTLP_CA_FILE", ca_file.as_str()),
    ];
    let (_sluice, grpc, _log) = traced(Path::new(&rules(dir.path())), &env);
    decide(&grpc, "v").await;
    grpc_request_span(&mut collector).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_spans_reach_an_https_collector_with_the_standard_variables_and_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let (cert, key) = ca.leaf();
    let cert_file = write(dir.path(), "client.pem", &cert);
    let key_file = write(dir.path(), "client.key", &key);
    let stop = CancellationToken::new();
    let (url, mut spans) = http_collector(&ca.leaf(), Some(&ca), stop.clone()).await;
    let env = [
        ("SLUICE_LOG__OTLP_ENDPOINT", url.as_str()),
        ("SLUICE_LOG__OTLP_PROTOCOL", "http"),
        ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", ca_file.as_str()),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert_file.as_str()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key_file.as_str()),
    ];
    let (_sluice, grpc, _log) = traced(Path::new(&rules(dir.path())), &env);
    decide(&grpc, "v").await;
    assert_eq!(request_span(&mut spans).await, "/v1/traces");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_certificate_from_another_ca_gets_no_span() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let stranger = Ca::new("another CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let rules = rules(dir.path());
    let stop = CancellationToken::new();
    let mut grpc_collector = Collector::start_tls(tls(&stranger.leaf())).await;
    let (http_url, mut http_spans) = http_collector(&stranger.leaf(), None, stop.clone()).await;
    for (protocol, url) in [("grpc", grpc_collector.url.clone()), ("http", http_url)] {
        let env = [
            ("SLUICE_LOG__OTLP_ENDPOINT", url.as_str()),
            ("SLUICE_LOG__OTLP_PROTOCOL", protocol),
            ("SLUICE_LOG__OTLP_CA_FILE", ca_file.as_str()),
        ];
        let (mut sluice, grpc, log) = traced(Path::new(&rules), &env);
        decide(&grpc, "v").await;
        // Batches leave every 100 ms: a second is many attempts.
        tokio::time::sleep(Duration::from_secs(1)).await;
        decide(&grpc, "w").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let got_through = match protocol {
            "grpc" => grpc_collector.try_next().is_some(),
            _ => http_spans.try_recv().is_ok(),
        };
        assert!(!got_through, "{protocol}: a span got through");
        let _ = sluice.0.kill();
        let _ = sluice.0.wait();
        let log = log.until_closed();
        assert!(
            log.contains("ERROR") && log.contains("ExportError"),
            "{protocol}: the failed export is logged:\n{log}"
        );
        if protocol == "grpc" {
            // (The OTLP/HTTP client reports a "network error" without its cause.)
            assert!(
                log.contains("UnknownIssuer"),
                "the reason is logged:\n{log}"
            );
        }
    }
    stop.cancel();
}

/// `sluice serve` with `env`: it must exit 64 within 20 s; its standard error.
fn refused_start(rules: &Path, env: &[(&str, &str)]) -> String {
    let mut command = sluice_command(BIN);
    command
        .args(["serve", "--rules"])
        .arg(rules)
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .envs(env.iter().copied());
    let out = exit_within(&mut command, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{env:?}: {err}");
    err
}

#[test]
fn tls_files_that_cannot_be_used_stop_the_start_naming_their_setting() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(dir.path());
    let rules = Path::new(&rules);
    let missing = dir.path().join("missing.pem").display().to_string();
    let junk = write(dir.path(), "junk.pem", "not a certificate");
    let https = ("SLUICE_LOG__OTLP_ENDPOINT", "https://127.0.0.1:1");
    for protocol in ["grpc", "http"] {
        let protocol = ("SLUICE_LOG__OTLP_PROTOCOL", protocol);
        let err = refused_start(
            rules,
            &[https, protocol, ("SLUICE_LOG__OTLP_CA_FILE", &missing)],
        );
        assert!(
            err.contains("log.otlp_ca_file") && err.contains(&missing),
            "{err}"
        );
        let env = [https, protocol, ("OTEL_EXPORTER_OTLP_CERTIFICATE", &junk)];
        let err = refused_start(rules, &env);
        assert!(
            err.contains("OTEL_EXPORTER_OTLP_CERTIFICATE") && err.contains("no certificate found"),
            "{err}"
        );
        let env = [
            https,
            protocol,
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &junk),
        ];
        let err = refused_start(rules, &env);
        assert!(err.contains("go together"), "{err}");
    }
}

/// limitador's `--tracing-endpoint https://...`: spans over OTLP/gRPC with TLS from the real
/// binary started as `limitador-server`, the CA given by `OTEL_EXPORTER_OTLP_CERTIFICATE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitador_servers_https_tracing_endpoint_gets_spans() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let mut collector = Collector::start_tls(tls(&ca.leaf())).await;
    let url = collector.url.clone();
    let text =
        "- namespace: ns\n  max_value: 5\n  seconds: 3600\n  variables: [\"descriptors[0].k\"]\n";
    let limits = write(dir.path(), "limits.yaml", text);
    let mut child = limitador_server(BIN, dir.path())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca_file)
        .args(["--tracing-endpoint", &url])
        .arg(&limits)
        .spawn()
        .expect("start limitador-server");
    let ([grpc], _log) = serving_log(&mut child, ["gRPC"]);
    let _limitador = Served(child);
    decide_in(&format!("http://{grpc}"), "ns", "v").await;
    grpc_request_span(&mut collector).await;
}

/// envoyproxy/ratelimit's `OTEL_EXPORTER_OTLP_ENDPOINT=https://...` (its default protocol,
/// OTLP/HTTP): spans from the real binary started as `ratelimit`, the CA given by
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`. Needs `redis-server`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimits_https_otlp_endpoint_gets_spans() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let stop = CancellationToken::new();
    let (url, mut spans) = http_collector(&ca.leaf(), None, stop.clone()).await;
    let redis = sluice::testing::redis::RedisServer::start();
    let config = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    write(&config, "config.yaml", RULES);
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let data = dir.path().join("data").display().to_string();
    let env = [
        ("RUNTIME_ROOT", data.as_str()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis.addr()),
        ("USE_STATSD", "false"),
        ("LOG_LEVEL", "info"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &url),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca_file),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("SLUICE_REDIS__TIMEOUT_MS", "3000"),
    ];
    let mut child = std::process::Command::new(&link)
        .env_clear()
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratelimit");
    let ([grpc], _log) = serving_log(&mut child, ["gRPC"]);
    let _ratelimit = Served(child);
    decide(&format!("http://{grpc}"), "v").await;
    assert_eq!(request_span(&mut spans).await, "/v1/traces");
    stop.cancel();
}
