//! envoyproxy/ratelimit's deployments, run here: the real binary started through a symlink
//! named `ratelimit` with exactly a deployment's environment (its listeners on loopback port
//! 0, the ports it got read from its log, which says them at `info`), the management server
//! that pushes it rules over ADS (Envoy Gateway's role, or AI Gateway's), and a real Envoy in
//! front whose rate-limit filter asks it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use sluice::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sluice::testing::http::try_get;
use sluice::testing::process::{LISTENERS_LOG, Served, loopback, serving};
use sluice::testing::ratelimit_env::ENVOY_GATEWAY;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, Identity, Server, ServerTlsConfig};

use super::ads::Ads;
use super::certs::Ca;
use super::envoy::{ADMIN, EnvoyProcess};

/// How long a started instance has to come up.
pub(crate) const WITHIN: Duration = Duration::from_secs(20);

/// Envoy Gateway's domain for the listener `http` of Gateway `default/eg` (the IR listener
/// name).
pub(crate) const EG_DOMAIN: &str = "default/eg/http";

// ---------------------------------------------------------------------------------------
// The binary as `ratelimit`.

/// A symlink named `ratelimit` to the sluice binary, in `dir`.
pub(crate) fn ratelimit_link(dir: &Path) -> PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).expect("symlink");
    link
}

/// `ratelimit` with exactly `env` (nothing inherited), killed when dropped, and the ports it
/// got.
pub(crate) struct Ratelimit {
    pub ports: Ports,
    pub process: Served,
}

impl Ratelimit {
    /// Starts it; returns once its log says where each of its listeners serves (see
    /// [`ports_of`]).
    pub(crate) fn start(link: &Path, env: &HashMap<String, String>) -> Ratelimit {
        let mut env = env.clone();
        // Its log says where it serves (at `info`); a deployment's own `LOG_LEVEL` wins.
        env.entry("SLUICE_LOG__LEVEL".to_owned())
            .or_insert_with(|| LISTENERS_LOG.to_owned());
        let mut child = Command::new(link)
            .env_clear()
            .envs(&env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ratelimit");
        let ports = ports_of(&mut child, &env);
        Ratelimit {
            ports,
            process: Served(child),
        }
    }
}

/// The ports of one instance (envoyproxy/ratelimit's 8081, 8080, 6070, and the Prometheus
/// one), which it asked the kernel for: 0 for a listener it does not have (gRPC on a Unix
/// socket, no Prometheus).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    pub grpc: u16,
    pub http: u16,
    pub debug: u16,
    pub prometheus: u16,
}

/// Follows the log of a starting `ratelimit` with `env`, told to listen on port 0, until it
/// says where each listener serves: gRPC (unless `GRPC_UDS`), HTTP, debug, and Prometheus
/// (with `USE_PROMETHEUS`). Its `LOG_LEVEL`, when set, must be `info` or finer.
pub(crate) fn ports_of(child: &mut Child, env: &HashMap<String, String>) -> Ports {
    let on = |name: &str| {
        env.get(name)
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
    };
    let uds = env.get("GRPC_UDS").is_some_and(|v| !v.trim().is_empty());
    let [grpc, http, debug, prometheus] = serving(
        child,
        [
            if uds { "admin HTTP" } else { "gRPC" },
            "admin HTTP",
            "the debug endpoints",
            if on("USE_PROMETHEUS") {
                "envoyproxy/ratelimit's metric names"
            } else {
                "admin HTTP"
            },
        ],
    );
    Ports {
        grpc: if uds { 0 } else { grpc.port() },
        http: http.port(),
        debug: debug.port(),
        prometheus: if on("USE_PROMETHEUS") {
            prometheus.port()
        } else {
            0
        },
    }
}

/// `base` with the test's addresses: values swapped by `swaps`, plus the listeners on
/// loopback port 0 (the same variables, so still envoyproxy/ratelimit's; a swap of one of
/// them wins).
pub(crate) fn swap(base: &[(&str, &str)], swaps: &[(&str, String)]) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = base
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for (k, v) in [
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    if env.contains_key("PROMETHEUS_ADDR") || env.get("USE_PROMETHEUS").is_some_and(|v| v == "true")
    {
        env.insert("PROMETHEUS_ADDR".into(), "127.0.0.1:0".into());
    }
    for (k, v) in swaps {
        assert!(
            env.contains_key(*k) || k.ends_with("HOST") || k.ends_with("PORT"),
            "{k}"
        );
        env.insert((*k).to_owned(), v.clone());
    }
    env
}

/// Waits until `GET /healthcheck` on the HTTP port answers 200.
pub(crate) async fn healthy(ports: &Ports) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let answer = try_get(loopback(ports.http), "/healthcheck").await;
        if answer.as_ref().is_some_and(|a| a.status == 200) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/healthcheck never answered 200: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client of the plain-text gRPC port of a started `ratelimit`.
pub(crate) async fn plain_client(ports: &Ports) -> RateLimitServiceClient<Channel> {
    let url = format!("http://127.0.0.1:{}", ports.grpc);
    let channel = Channel::from_shared(url).unwrap().connect().await.unwrap();
    RateLimitServiceClient::new(channel)
}

/// Writes `text` to `dir/name`; its path.
pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A RUNTIME_ROOT in `dir` whose rules directory `<root>/<rules>` holds `files` (name, text),
/// as a string for the env.
pub(crate) fn runtime_root(dir: &Path, rules: &str, files: &[(&str, &str)]) -> String {
    let root = dir.join("data");
    let config = root.join(rules);
    std::fs::create_dir_all(&config).unwrap();
    for (name, text) in files {
        write(&config, name, text);
    }
    root.display().to_string()
}

// ---------------------------------------------------------------------------------------
// The management server (Envoy Gateway's role, or AI Gateway's).

/// A management server on a port from the kernel: with `tls` (its certificate and key, and the CA of
/// the client certificates it requires) mTLS as Envoy Gateway's, else plain text as AI
/// Gateway's. Every request it receives is passed on.
pub(crate) async fn ads_server(
    tls: Option<(&(String, String), &str)>,
    snapshot: watch::Receiver<Option<DiscoveryResponse>>,
) -> (SocketAddr, mpsc::UnboundedReceiver<DiscoveryRequest>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (requests_tx, requests) = mpsc::unbounded_channel();
    let mut server = Server::builder();
    if let Some((cert, ca)) = tls {
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&cert.0, &cert.1))
            .client_ca_root(Certificate::from_pem(ca));
        server = server.tls_config(config).unwrap();
    }
    let ads = Ads {
        snapshot,
        requests: requests_tx,
        kill: CancellationToken::new(),
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        server
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    (addr, requests)
}

/// The node id of the first request the management server receives.
pub(crate) async fn node_id(requests: &mut mpsc::UnboundedReceiver<DiscoveryRequest>) -> String {
    tokio::time::timeout(WITHIN, requests.recv())
        .await
        .expect("a request of the management server")
        .expect("the management server runs")
        .node
        .map(|n| n.id)
        .unwrap_or_default()
}

/// Envoy Gateway's deployment of the rate-limit service, set up here: its certificates (one
/// CA, the xDS server's, and the rate-limit's own, used both for its gRPC port and as its
/// xDS client certificate), its management server (mTLS) serving `rules`, and `ratelimit`
/// started with its exact env (ENVOY_GATEWAY) holding the test's addresses.
pub(crate) struct EnvoyGateway {
    pub ca_pem: String,
    pub ca_file: String,
    pub ports: Ports,
    /// What the management server receives.
    pub requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    pub process: Ratelimit,
}

impl EnvoyGateway {
    /// Files go in `dir`; Redis listens on `redis`.
    pub(crate) async fn start(
        dir: &Path,
        redis: u16,
        rules: watch::Receiver<Option<DiscoveryResponse>>,
    ) -> EnvoyGateway {
        let ca = Ca::new();
        let ca_pem = ca.0.pem();
        let control_plane = ca.leaf(&["localhost", "envoy-gateway"]);
        let (cert, key) = ca.leaf(&["localhost", "envoy-ratelimit"]);
        let ca_file = write(dir, "ca.crt", &ca_pem);
        let cert_file = write(dir, "tls.crt", &cert);
        let key_file = write(dir, "tls.key", &key);
        let (xds, requests) = ads_server(Some((&control_plane, &ca_pem)), rules).await;
        let env = swap(
            ENVOY_GATEWAY,
            &[
                (
                    "CONFIG_GRPC_XDS_SERVER_URL",
                    format!("localhost:{}", xds.port()),
                ),
                ("GRPC_SERVER_TLS_CERT", cert_file.clone()),
                ("GRPC_SERVER_TLS_KEY", key_file.clone()),
                ("GRPC_SERVER_TLS_CA_CERT", ca_file.clone()),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert_file),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key_file),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca_file.clone()),
                ("REDIS_URL", format!("127.0.0.1:{redis}")),
                // Envoy Gateway mounts its statsd-exporter mapping there; sluice's built-in
                // mapping is that naming.
                (
                    "PROMETHEUS_MAPPER_YAML",
                    write(dir, "conf.yaml", sluice::compat::mapper::DEFAULT_YAML),
                ),
            ],
        );
        let process = Ratelimit::start(&ratelimit_link(dir), &env);
        EnvoyGateway {
            ca_pem,
            ca_file,
            ports: process.ports,
            process,
            requests,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Envoy.

/// The rate-limit filter of an Envoy started by [`envoy`].
pub(crate) struct RlsFilter<'a> {
    /// `envoy.filters.http.ratelimit`, or `envoy.filters.http.ratelimit/<name>` as gateways
    /// name a filter of their own.
    pub name: &'a str,
    pub domain: &'a str,
    /// Its other settings, as flow-style YAML each followed by a comma
    /// (`failure_mode_deny: true, timeout: 5s,`).
    pub settings: &'a str,
}

/// Envoy on a port from the kernel with `filter` asking the RLS on `rls` (over TLS trusting `ca` when
/// given), and `routes` (flow-style YAML or JSON route objects) to cluster `upstream`, the
/// stub on port `upstream`. Envoy, and the port it listens on.
pub(crate) async fn envoy(
    filter: &RlsFilter<'_>,
    routes: &[String],
    rls: u16,
    ca: Option<&str>,
    upstream: u16,
) -> (EnvoyProcess, u16) {
    let address = format!("{{ socket_address: {{ address: 127.0.0.1, port_value: {rls} }} }}");
    envoy_to(filter, routes, &address, ca, upstream).await
}

/// As [`envoy`], the rate-limit cluster's endpoint at `rls_address` (an Envoy `Address` in
/// flow-style YAML: a `socket_address`, or a `pipe` for a Unix socket).
pub(crate) async fn envoy_to(
    filter: &RlsFilter<'_>,
    routes: &[String],
    rls_address: &str,
    ca: Option<&str>,
    upstream: u16,
) -> (EnvoyProcess, u16) {
    let RlsFilter {
        name,
        domain,
        settings,
    } = filter;
    let routes: String = routes
        .iter()
        .map(|r| format!("\n                        - {r}"))
        .collect();
    let tls = ca.map_or(String::new(), |ca| {
        format!(
            "
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            validation_context:
              trusted_ca: {{ filename: \"{ca}\" }}"
        )
    });
    let config = format!(
        "
{ADMIN}
static_resources:
  listeners:
    - name: main
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: [\"*\"]
                      routes:{routes}
                http_filters:
                  - name: \"{name}\"
                    typed_config:
                      {{ \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit,
                        domain: \"{domain}\", {settings}
                        rate_limit_service: {{ transport_api_version: V3,
                          grpc_service: {{ envoy_grpc: {{ cluster_name: ratelimit }} }} }} }}
                  - name: envoy.filters.http.router
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      load_assignment:
        cluster_name: upstream
        endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }} }}] }}]
    - name: ratelimit
      type: STATIC
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: ratelimit
        endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {rls_address} }} }}] }}]{tls}
"
    );
    let envoy = EnvoyProcess::start(&config).await;
    let port = envoy.port("main");
    (envoy, port)
}

/// Waits, when fewer than `margin` are left of the current window of `period` (windows are
/// aligned to the epoch, as envoyproxy/ratelimit's), until the next one has begun; at most
/// `margin`.
pub(crate) async fn clear_of_window_end(period: Duration, margin: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = u64::try_from(now.as_millis() % period.as_millis()).unwrap();
    let left = period - Duration::from_millis(into);
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(200)).await;
    }
}
