//! sluice as a drop-in for envoyproxy/ratelimit, on the real binary started through a symlink
//! named `ratelimit` (as Envoy Gateway's and Istio's Deployments run `/bin/ratelimit`), with
//! no other environment than each deployment's:
//!
//! - Envoy Gateway's exact env set (rules over xDS with mTLS from an ADS server started here,
//!   TLS on the gRPC port, Redis, Prometheus on its metrics port), and Istio's sample env set
//!   (rules files under RUNTIME_ROOT, Redis): each starts with the intended settings (ports,
//!   TLS, rules source, metrics) and a real Envoy gets correct answers through it;
//! - every metric name Envoy Gateway's Grafana dashboard queries is in its `/metrics`;
//! - the statsd sink sends envoyproxy/ratelimit's stat names to a TCP server here (which
//!   restarts: sluice reconnects), and with DogStatsD to a UDP one;
//! - a mapping file (PROMETHEUS_MAPPER_YAML) names the Prometheus series, and one sluice
//!   cannot honour stops the start;
//! - a variable sluice cannot honour stops the start with exit 64, naming it.
//!
//! Needs `redis-server` and `.venv/bin/envoy`; a missing one FAILS with the set-up command.

use sluice::testing::ratelimit_env::{ENVOY_GATEWAY, ISTIO};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as WireDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::envoy::service::discovery::v3::DiscoveryResponse;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use sluice::testing::http::{Answer, get};
use sluice::testing::process::{HeldPort, loopback, sluice_command};
use sluice::testing::redis::RedisServer;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::support::ads::snapshot;
use crate::support::envoy::EnvoyProcess;
use crate::support::ratelimit::{
    self, EG_DOMAIN, EnvoyGateway, Ports, Ratelimit, RlsFilter, WITHIN, clear_of_window_end,
    healthy, node_id, plain_client, ratelimit_link, runtime_root, swap, write,
};
use crate::support::upstream::Upstream;
use crate::support::yaml;

/// Istio's sample rules (its `ratelimit-config` ConfigMap), at `config.yaml`.
const ISTIO_RULES: &str = "\
domain: ratelimit
descriptors:
  - key: PATH
    value: \"/productpage\"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// What Envoy Gateway's translator emits (domain [`EG_DOMAIN`]) for an HTTPRoute
/// `default/http-ratelimit` with one rule of 3 per minute on a header match (the dashboard's
/// example).
const EG_ROUTE: &str = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";
const EG_RULE: &str = "rule-0-match-0";

/// Every metric name Envoy Gateway's rate-limit Grafana dashboard
/// (charts/gateway-addons-helm/dashboards/global-ratelimit.json) queries.
const DASHBOARD_NAMES: &[&str] = &[
    "go_memstats_gc_cpu_fraction",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_over_limit",
];

/// The other names Envoy Gateway's statsd-exporter mapping (statsd_conf.yaml) renders.
const MAPPING_NAMES: &[&str] = &[
    "ratelimit_service_rate_limit_within_limit",
    "ratelimit_service_rate_limit_shadow_mode",
    "ratelimit_service_should_rate_limit_error",
    "ratelimit_service_total_requests",
    "ratelimit_service_response_time_seconds_bucket",
    "ratelimit_service_response_time_seconds_count",
    "ratelimit_service_config_load_success",
    "ratelimit_service_config_load_error",
];

// ---------------------------------------------------------------------------------------
// The listeners, and the rules Envoy Gateway pushes.

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(loopback(port)).is_ok()
}

fn eg_rules(requests_per_unit: u32) -> DiscoveryResponse {
    let config = RateLimitConfig {
        name: EG_DOMAIN.into(),
        domain: EG_DOMAIN.into(),
        descriptors: vec![RateLimitDescriptor {
            key: EG_ROUTE.into(),
            value: EG_ROUTE.into(),
            descriptors: vec![RateLimitDescriptor {
                key: EG_RULE.into(),
                value: EG_RULE.into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Minute as i32,
                    requests_per_unit,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    snapshot("eg-1", &[config])
}

// ---------------------------------------------------------------------------------------
// Envoy.

/// Envoy with a rate-limit filter for `domain` whose route sends `actions`, asking the RLS
/// on `rls` (over TLS trusting `ca` when given) with `failure_mode_deny: true`, so an RLS it
/// cannot reach answers 500, never a silent 200.
async fn envoy(
    domain: &str,
    actions: &str,
    rls: u16,
    ca: Option<&str>,
    upstream: u16,
) -> (EnvoyProcess, u16) {
    let filter = RlsFilter {
        name: "envoy.filters.http.ratelimit",
        domain,
        settings: "failure_mode_deny: true, timeout: 5s,",
    };
    let route = format!(
        "{{ match: {{ prefix: \"/\" }}, route: {{ cluster: upstream, rate_limits: [{{ actions: {actions} }}] }} }}"
    );
    ratelimit::envoy(&filter, &[route], rls, ca, upstream).await
}

async fn through(port: u16, path: &str) -> Answer {
    get(loopback(port), path).await
}

// ---------------------------------------------------------------------------------------
// The table.

/// What one deployment's env must give.
struct Expect {
    /// gRPC is served over TLS (trusting this CA) rather than plain.
    tls_ca: Option<String>,
    /// `/rlconfig` on the debug port holds this.
    rlconfig: &'static str,
    /// The Prometheus port serves envoyproxy/ratelimit's names.
    prometheus: bool,
}

/// Checks the listeners and the rules source a started instance shows.
async fn check_settings(ports: &Ports, expect: &Expect, domain: &str, entries: &[(&str, &str)]) {
    healthy(ports).await;
    let dump = get(loopback(ports.debug), "/rlconfig").await;
    assert_eq!(dump.status, 200);
    assert!(dump.body.contains(expect.rlconfig), "{}", dump.body);
    assert_eq!(
        listening(ports.prometheus),
        expect.prometheus,
        "Prometheus port"
    );
    // gRPC: over TLS exactly when asked.
    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![WireDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let plain = format!("http://127.0.0.1:{}", ports.grpc);
    let plain_answer = async {
        let channel = Channel::from_shared(plain).unwrap().connect().await.ok()?;
        RateLimitServiceClient::new(channel)
            .should_rate_limit(request.clone())
            .await
            .ok()
    }
    .await;
    match &expect.tls_ca {
        None => assert!(plain_answer.is_some(), "plain gRPC must answer"),
        Some(ca) => {
            assert!(
                plain_answer.is_none(),
                "plain gRPC must be refused under TLS"
            );
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost");
            let channel = Channel::from_shared(format!("https://127.0.0.1:{}", ports.grpc))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .expect("TLS connection");
            RateLimitServiceClient::new(channel)
                .should_rate_limit(request)
                .await
                .expect("gRPC over TLS answers");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_env_starts_as_intended_and_envoy_gets_answers() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // Under that environment the limits are fixed windows of a minute: the requests below
    // must not straddle a window's end.
    clear_of_window_end(Duration::from_secs(60), Duration::from_secs(20)).await;
    let (push, snapshot) = watch::channel(Some(eg_rules(3)));
    let EnvoyGateway {
        ca_pem,
        ca_file,
        ports,
        mut requests,
        process: _rl,
    } = EnvoyGateway::start(dir.path(), redis.port, snapshot).await;
    let expect = Expect {
        tls_ca: Some(ca_pem.clone()),
        rlconfig: "# xds version eg-1",
        prometheus: true,
    };
    check_settings(
        &ports,
        &expect,
        EG_DOMAIN,
        &[(EG_ROUTE, EG_ROUTE), (EG_RULE, EG_RULE)],
    )
    .await;
    assert_eq!(node_id(&mut requests).await, "envoy-ratelimit");

    // Envoy, as Envoy Gateway configures it: generic keys for the route and the rule, over
    // TLS to the rate-limit service.
    let actions = format!(
        "[{{ generic_key: {{ descriptor_key: \"{EG_ROUTE}\", descriptor_value: \"{EG_ROUTE}\" }} }}, \
           {{ generic_key: {{ descriptor_key: \"{EG_RULE}\", descriptor_value: \"{EG_RULE}\" }} }}]"
    );
    let (proxy, port) = envoy(
        EG_DOMAIN,
        &actions,
        ports.grpc,
        Some(&ca_file),
        upstream.port,
    )
    .await;
    // The gRPC check above took one of the 3.
    for i in 0..2 {
        let answer = through(port, "/").await;
        assert_eq!(
            answer.status,
            200,
            "request {i}: {answer:?}\n{}",
            proxy.log()
        );
    }
    let over = through(port, "/").await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(over.header("x-envoy-ratelimited"), Some("true"));

    // The dashboard's queries, with its exact labels.
    let metrics = get(loopback(ports.prometheus), "/metrics").await;
    assert_eq!(metrics.status, 200);
    let names: Vec<&str> = metrics
        .body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for name in DASHBOARD_NAMES.iter().chain(MAPPING_NAMES) {
        assert!(
            names.contains(name),
            "{name} missing from /metrics:\n{}",
            metrics.body
        );
    }
    let labels = format!(
        "{{domain=\"{EG_DOMAIN}\",key1=\"{EG_ROUTE}_{EG_ROUTE}\",key2=\"{EG_RULE}_{EG_RULE}\"}}"
    );
    for (name, value) in [
        ("total_hits", 4),
        ("over_limit", 1),
        ("within_limit", 3),
        ("near_limit", 1),
    ] {
        let series = format!("ratelimit_service_rate_limit_{name}{labels} {value}");
        assert!(
            metrics.body.lines().any(|l| l == series),
            "no `{series}` in:\n{}",
            metrics.body
        );
    }
    assert!(
        metrics
            .body
            .contains("ratelimit_service_config_load_success 1"),
        "{}",
        metrics.body
    );
    assert!(
        metrics
            .body
            .contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 4")
    );
    // The limit gauge, in sluice's names, on the HTTP port's /metrics.
    let own = get(loopback(ports.http), "/metrics").await.body;
    let gauge = format!(
        "sluice_rule_limit{{domain=\"{EG_DOMAIN}\",rule=\"{EG_ROUTE}_{EG_ROUTE}.{EG_RULE}_{EG_RULE}\",limit=\""
    );
    assert!(
        own.lines()
            .any(|line| line.starts_with(&gauge) && line.ends_with("} 3")),
        "no `{gauge}...}} 3` in:\n{own}"
    );
    assert!(own.contains("sluice_rule_period_seconds{"), "{own}");
    drop(push);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_sample_env_starts_as_intended_and_envoy_gets_answers() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // A ConfigMap's internals beside the rules: dot-files that must be ignored.
    let files = [
        ("config.yaml", ISTIO_RULES),
        ("..2026_11_24.yaml", "not: [rules"),
    ];
    let data = runtime_root(dir.path(), "ratelimit/config", &files);
    let env = swap(
        ISTIO,
        &[
            ("RUNTIME_ROOT", data),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ],
    );
    // Fixed windows of a minute under that environment: keep clear of a window's end.
    clear_of_window_end(Duration::from_secs(60), Duration::from_secs(20)).await;
    let rl = Ratelimit::start(&link, &env);
    let ports = rl.ports;
    let expect = Expect {
        tls_ca: None,
        rlconfig: "ratelimit.PATH_/productpage: ",
        prometheus: false,
    };
    check_settings(&ports, &expect, "ratelimit", &[("PATH", "/other")]).await;
    let dump = get(loopback(ports.debug), "/rlconfig").await.body;
    assert!(!dump.contains("xds version"), "{dump}");

    // Envoy, as Istio's sample configures it: the path as descriptor PATH.
    let actions = "[{ request_headers: { header_name: \":path\", descriptor_key: PATH } }]";
    let (_envoy, port) = envoy("ratelimit", actions, ports.grpc, None, upstream.port).await;
    let first = through(port, "/productpage").await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, "upstream");
    let second = through(port, "/productpage").await;
    assert_eq!(second.status, 429, "{second:?}");
    for i in 0..5 {
        let answer = through(port, "/reviews").await;
        assert_eq!(answer.status, 200, "request {i} to /reviews: {answer:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_lines_carry_envoyproxy_ratelimits_names_over_tcp() {
    statsd_lines(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dogstatsd_lines_carry_the_same_names_and_tags_over_udp() {
    statsd_lines(true).await;
}

/// `USE_DOG_STATSD_MOGRIFIERS` with envoyproxy/ratelimit's README example (DOMAIN and HITS,
/// HITS's tags from its variables, DOMAIN's pattern from the bare `PATTERN` fallback never
/// needed): per-rule names become one name with `domain` and `descriptor` tags, after
/// `EXTRA_TAGS`; names no pattern matches go as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dogstatsd_mogrifiers_move_name_parts_into_tags() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let mut server = StatsdServer::udp().await;
    let data = runtime_root(dir.path(), "config", &[("rules.yaml", STATS_RULES)]);
    let mut env = swap(
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("USE_STATSD", "false"),
            ("USE_DOG_STATSD", "true"),
            ("STATSD_HOST", "localhost"),
            ("STATSD_PORT", "8125"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("EXTRA_TAGS", "env:test"),
        ],
        &[
            ("RUNTIME_ROOT", data),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("STATSD_HOST", "127.0.0.1".into()),
            ("STATSD_PORT", server.port.to_string()),
        ],
    );
    for (k, v) in [
        ("USE_DOG_STATSD_MOGRIFIERS", "hits,Load"),
        (
            "DOG_STATSD_MOGRIFIER_HITS_PATTERN",
            r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
        ),
        (
            "DOG_STATSD_MOGRIFIER_HITS_NAME",
            "ratelimit.service.rate_limit.$3",
        ),
        ("DOG_STATSD_MOGRIFIER_HITS_TAGS", "domain:$1,descriptor:$2"),
        ("DOG_STATSD_MOGRIFIER_LOAD_PATTERN", r"config_load_(\w+)$"),
        ("DOG_STATSD_MOGRIFIER_LOAD_NAME", "ratelimit.config_load"),
        ("DOG_STATSD_MOGRIFIER_LOAD_TAGS", "outcome:$1,unknown:$7"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let rl = Ratelimit::start(&link, &env);
    let ports = rl.ports;
    healthy(&ports).await;
    let mut client = plain_client(&ports).await;
    clear_of_window_end(Duration::from_secs(60), Duration::from_secs(5)).await;
    stats_traffic(&mut client, 6, 0).await;

    let want = [
        "ratelimit.service.rate_limit.total_hits|c|#env:test,domain:rl,descriptor:user_alice",
        "ratelimit.service.rate_limit.over_limit|c|#env:test,domain:rl,descriptor:user_alice",
        "ratelimit.service.rate_limit.within_limit|c|#env:test,domain:rl,descriptor:user_alice",
        "ratelimit_server.ShouldRateLimit.total_requests|c|#env:test",
        "ratelimit_server.ShouldRateLimit.response_time|ms|#env:test",
    ];
    let mut totals: HashMap<String, u64> = HashMap::new();
    let mut seen = Vec::new();
    let deadline = Instant::now() + WITHIN;
    while totals.get(want[0]).copied().unwrap_or(0) < 6
        || !want.iter().all(|w| totals.contains_key(*w))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(line)) = tokio::time::timeout(left, server.lines.recv()).await else {
            panic!("mogrified lines missing: want {want:?}, got {totals:?}; lines {seen:?}");
        };
        seen.push(line.clone());
        // name:value|kind|#tags, keyed without the value.
        let (name, rest) = line.split_once(':').unwrap();
        let (value, tail) = rest.split_once('|').unwrap();
        let value = value.parse::<f64>().unwrap() as u64;
        *totals.entry(format!("{name}|{tail}")).or_default() += value;
    }
    assert_eq!(totals[want[0]], 6, "{totals:?}");
    assert_eq!(totals[want[1]], 1, "{totals:?}");
    let unmogrified: Vec<&String> = seen
        .iter()
        .filter(|l| l.contains("rl.user_alice") || l.contains("config_load_"))
        .collect();
    assert!(unmogrified.is_empty(), "{unmogrified:?}");
}

/// Lines received by a statsd server here: over UDP (datagrams), or over TCP (every
/// connection accepted; dropping it closes the listener and the connections).
struct StatsdServer {
    lines: mpsc::UnboundedReceiver<String>,
    port: u16,
    _tasks: tokio::task::JoinSet<()>,
}

impl StatsdServer {
    async fn udp() -> StatsdServer {
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = udp.local_addr().unwrap().port();
        let (tx, lines) = mpsc::unbounded_channel();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = udp.recv(&mut buf).await {
                for line in String::from_utf8_lossy(&buf[..n]).lines() {
                    let _ = tx.send(line.to_owned());
                }
            }
        });
        StatsdServer {
            lines,
            port,
            _tasks: tasks,
        }
    }

    /// A TCP server on `port`, one from the kernel that the test holds ([`HeldPort`]), so
    /// that it is there for the server's return. It is retried for a while: the listener of a
    /// server just dropped on it closes when its aborted task is dropped, which the runtime
    /// may not have done yet.
    async fn tcp(port: u16) -> StatsdServer {
        let start = Instant::now();
        let listener = loop {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_reuseaddr(true).unwrap();
            match socket.bind(loopback(port)).and_then(|()| socket.listen(16)) {
                Ok(listener) => break listener,
                Err(e) if start.elapsed() < WITHIN => {
                    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("port {port} still in use after {WITHIN:?}: {e}"),
            }
        };
        let port = listener.local_addr().unwrap().port();
        let (tx, lines) = mpsc::unbounded_channel();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(async move {
            let mut readers = tokio::task::JoinSet::new();
            while let Ok((conn, _)) = listener.accept().await {
                let tx = tx.clone();
                readers.spawn(async move {
                    use tokio::io::AsyncBufReadExt as _;
                    let mut lines = tokio::io::BufReader::new(conn).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let _ = tx.send(line);
                    }
                });
            }
        });
        StatsdServer {
            lines,
            port,
            _tasks: tasks,
        }
    }

    /// Sums counters (tag taken off) until every `want` total is reached and `timers`
    /// response times arrived; returns the totals.
    async fn until(
        &mut self,
        want: &[(String, u64)],
        timers: usize,
        dog: bool,
    ) -> HashMap<String, u64> {
        let mut totals: HashMap<String, u64> = HashMap::new();
        let mut seen_timers = 0;
        let deadline = Instant::now() + WITHIN;
        while !want
            .iter()
            .all(|(n, v)| totals.get(n).copied().unwrap_or(0) >= *v)
            || seen_timers < timers
        {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(line)) = tokio::time::timeout(left, self.lines.recv()).await else {
                panic!("statsd lines missing; want {want:?}, got {totals:?}, {seen_timers} timers");
            };
            // Every line carries the tag, in the name or after `|#`.
            let line = if dog {
                line.strip_suffix("|#env:test")
                    .unwrap_or_else(|| panic!("no DogStatsD tag: {line}"))
                    .to_owned()
            } else {
                assert!(line.contains(".__env=test:"), "no tag in the name: {line}");
                line.replacen(".__env=test", "", 1)
            };
            let Some((name, rest)) = line.split_once(':') else {
                panic!("not a statsd line: {line}");
            };
            if let Some(count) = rest.strip_suffix("|c") {
                *totals.entry(name.to_owned()).or_default() += count.parse::<u64>().unwrap();
            } else if rest.ends_with("|ms")
                && name == "ratelimit_server.ShouldRateLimit.response_time"
            {
                seen_timers += 1;
            } else {
                panic!("unexpected statsd line {line}");
            }
        }
        totals
    }
}

/// A request of one descriptor per `(key, value)`.
fn rls(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: entries
            .iter()
            .map(|(k, v)| WireDescriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// The rules of the stats tests: 5 per minute for user alice, a shadow-mode rule on ip.
const STATS_RULES: &str = "domain: rl\ndescriptors:\n  - key: user\n    value: alice\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  \
     - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    shadow_mode: true\n";

/// The stats of a few requests, as statsd lines over TCP (tags in the name; with
/// SHADOW_MODE, and the TCP server restarted midway) or DogStatsD lines over UDP (`|#` tags).
async fn statsd_lines(dog: bool) {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    // The TCP server comes back on the same port: one from the kernel, held meanwhile.
    let held = HeldPort::new();
    let mut server = if dog {
        StatsdServer::udp().await
    } else {
        StatsdServer::tcp(held.port()).await
    };
    let data = runtime_root(dir.path(), "config", &[("rules.yaml", STATS_RULES)]);
    let env = swap(
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("USE_STATSD", if dog { "false" } else { "true" }),
            ("USE_DOG_STATSD", if dog { "true" } else { "false" }),
            ("STATSD_HOST", "localhost"),
            ("STATSD_PORT", "8125"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("EXTRA_TAGS", "env:test"),
            ("SHADOW_MODE", if dog { "false" } else { "true" }),
            // Denied costs not charged: the deny cache then answers a key already over, as
            // that project's local cache does (a charged cost always goes to Redis).
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
        &[
            ("RUNTIME_ROOT", data),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("STATSD_HOST", "127.0.0.1".into()),
            ("STATSD_PORT", server.port.to_string()),
        ],
    );
    let rl = Ratelimit::start(&link, &env);
    let ports = rl.ports;
    healthy(&ports).await;
    let mut client = plain_client(&ports).await;
    // Over TCP, with SHADOW_MODE: two more for alice, over the limit, let through by the
    // global shadow mode; Redis denies the first, the deny cache answers the second.
    let alice = if dog { 5 } else { 7 };
    stats_traffic(&mut client, alice, 3).await;
    client
        .should_rate_limit(RateLimitRequest::default())
        .await
        .unwrap_err();

    let over = alice - 5;
    let rule = |stat: &str, n: u64| (format!("ratelimit.service.rate_limit.rl.{stat}"), n);
    let want = vec![
        rule("user_alice.total_hits", alice),
        rule("user_alice.within_limit", 5),
        rule("user_alice.near_limit", 1),
        rule("user_alice.over_limit", over),
        rule("user_alice.over_limit_with_local_cache", over / 2),
        // The global shadow mode counts in global_shadow_mode, not in the rule's.
        rule("user_alice.shadow_mode", 0),
        rule("ip.total_hits", 3),
        rule("ip.over_limit", 2),
        rule("ip.within_limit", 1),
        rule("ip.shadow_mode", 2),
        (
            "ratelimit.service.rate_limit.nowhere.domain_not_found".into(),
            2,
        ),
        ("ratelimit.service.global_shadow_mode".into(), over),
        (
            "ratelimit.service.call.should_rate_limit.service_error".into(),
            1,
        ),
        ("ratelimit.service.config_load_success".into(), 0),
        (
            "ratelimit_server.ShouldRateLimit.total_requests".into(),
            alice + 5,
        ),
    ];
    let requests = usize::try_from(alice + 5).unwrap();
    let totals = server.until(&want, requests, dog).await;
    for (name, value) in &want {
        assert_eq!(
            totals.get(name).copied().unwrap_or(0),
            *value,
            "{name} in {totals:?}"
        );
    }
    if dog {
        return;
    }
    // The statsd server goes away and comes back on the same port: sluice reconnects and
    // sends what was counted since.
    drop(server);
    let mut server = StatsdServer::tcp(held.port()).await;
    client
        .should_rate_limit(rls("nowhere", &[("a", "1")]))
        .await
        .unwrap();
    let again = [(
        "ratelimit.service.rate_limit.nowhere.domain_not_found".to_owned(),
        1,
    )];
    server.until(&again, 1, dog).await;
}

/// A mapping file of the operator's (PROMETHEUS_MAPPER_YAML) names the Prometheus series:
/// renamed, relabelled, dropped; the stats no built-in name covers (unknown domains, the
/// global shadow mode, the deny cache's answers with a real Redis) included.
/// Envoy Gateway's Prometheus deployment (statsd off, the mapping file mounted), its rules
/// under `data`, Redis at `redis`, the mapping file at `mapper`.
fn mapper_env(data: &str, redis: &RedisServer, mapper: String) -> HashMap<String, String> {
    swap(
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ],
        &[
            ("RUNTIME_ROOT", data.to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
            ("PROMETHEUS_MAPPER_YAML", mapper),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapper_file_names_the_prometheus_series() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let data = runtime_root(dir.path(), "config", &[("rules.yaml", STATS_RULES)]);
    let mapper = write(
        dir.path(),
        "mapper.yaml",
        "\
mappings:
  - match: ratelimit.service.rate_limit.*.*.*
    name: rl_$3
    help: per rule
    labels: {domain: $1, rule: $2}
  - match: ratelimit.service.rate_limit.*.domain_not_found
    name: rl_domain_not_found
    labels: {domain: $1}
  - match: ratelimit.service.global_shadow_mode
    name: rl_global_shadow
  - match: ratelimit.service.config_load_*
    action: drop
  - match: 'ratelimit_server\\.(.*)\\.response_time'
    match_type: regex
    name: rl_latency_seconds
    timer_type: histogram
    ttl: 1m
    labels: {method: $1}
",
    );
    let mut env = mapper_env(&data, &redis, mapper);
    env.insert("SHADOW_MODE".into(), "true".into());
    // As in statsd_lines: the deny cache answers only costs that are not charged.
    env.insert(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT".into(),
        "true".into(),
    );
    let rl = Ratelimit::start(&link, &env);
    let ports = rl.ports;
    healthy(&ports).await;
    let mut client = plain_client(&ports).await;
    stats_traffic(&mut client, 7, 0).await;
    let body = get(loopback(ports.prometheus), "/metrics").await.body;
    let alice = "{domain=\"rl\",rule=\"user_alice\"}";
    for want in [
        "# HELP rl_total_hits per rule".to_owned(),
        format!("rl_total_hits{alice} 7"),
        format!("rl_within_limit{alice} 5"),
        format!("rl_over_limit{alice} 2"),
        format!("rl_over_limit_with_local_cache{alice} 1"),
        "rl_domain_not_found{domain=\"nowhere\"} 2".to_owned(),
        "rl_global_shadow 2".to_owned(),
        "rl_latency_seconds_count{method=\"ShouldRateLimit\"} 8".to_owned(),
        // Unmatched: the default name.
        "ratelimit_server_ShouldRateLimit_total_requests 8".to_owned(),
    ] {
        assert!(
            body.lines()
                .any(|l| l == want || (want.starts_with('#') && l.starts_with(&want))),
            "no `{want}` in:\n{body}"
        );
    }
    assert!(!body.contains("config_load"), "dropped:\n{body}");
    assert!(
        !body.contains("ratelimit_service_rate_limit_total_hits"),
        "the built-in names are replaced:\n{body}"
    );
}

/// The response time as a mapping file types it, read over the real scrape: a summary of
/// the quantiles it names (`summary_options`), then a histogram of its buckets
/// (`histogram_options`); and `glob_disable_ordering: true`, under which a later glob with
/// more literal segments wins over an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapper_file_types_the_response_time_and_may_unorder_globs() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let data = runtime_root(dir.path(), "config", &[("rules.yaml", STATS_RULES)]);
    let globs = r"
  - match: ratelimit.service.rate_limit.*.*.*
    name: rl_$3
    labels: {domain: $1, rule: $2}
  - match: ratelimit.service.rate_limit.rl.*.total_hits
    name: rl_literal_total_hits
    labels: {rule: $1}
  - match: ratelimit_server.*.response_time
    name: rl_latency_seconds
";
    let files = [
        (
            "summary.yaml",
            format!(
                r"defaults:
  glob_disable_ordering: true
mappings:{globs}    observer_type: summary
    summary_options:
      quantiles: [{{quantile: 0.5, error: 0.05}}, {{quantile: 0.99, error: 0.001}}]
      max_age: 1m
      age_buckets: 2
"
            ),
        ),
        (
            "histogram.yaml",
            format!(
                r"mappings:{globs}    timer_type: histogram
    histogram_options: {{buckets: [0.0001, 0.001, 0.01]}}
"
            ),
        ),
    ];
    for (file, text) in files {
        let mapper = write(dir.path(), file, &text);
        let env = mapper_env(&data, &redis, mapper);
        redis.cmd::<()>(&["FLUSHALL"]);
        let rl = Ratelimit::start(&link, &env);
        let ports = rl.ports;
        healthy(&ports).await;
        let mut client = plain_client(&ports).await;
        stats_traffic(&mut client, 3, 0).await;
        let body = get(loopback(ports.prometheus), "/metrics").await.body;
        let alice = "rule=\"user_alice\"";
        if file == "summary.yaml" {
            // Unordered: the later, more literal glob takes total_hits.
            assert!(
                body.lines()
                    .any(|l| l == format!("rl_literal_total_hits{{{alice}}} 3")),
                "{body}"
            );
            assert!(!body.contains("rl_total_hits"), "{body}");
            assert!(
                body.contains("# TYPE rl_latency_seconds summary\n"),
                "{body}"
            );
            for q in ["0.5", "0.99"] {
                let prefix = format!("rl_latency_seconds{{quantile=\"{q}\"}} ");
                let value: f64 = body
                    .lines()
                    .find_map(|l| l.strip_prefix(&prefix))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no quantile {q} in:\n{body}"));
                assert!(
                    value > 0.0 && value < 1.0,
                    "quantile {q}: {value} s:\n{body}"
                );
            }
            assert!(!body.contains("quantile=\"0.9\""), "{body}");
        } else {
            // In file order: the first glob takes total_hits.
            assert!(
                body.lines()
                    .any(|l| l == format!("rl_total_hits{{domain=\"rl\",{alice}}} 3")),
                "{body}"
            );
            assert!(
                body.contains("# TYPE rl_latency_seconds histogram\n"),
                "{body}"
            );
            for le in ["0.0001", "0.001", "0.01", "+Inf"] {
                let bucket = format!("rl_latency_seconds_bucket{{le=\"{le}\"}} ");
                assert!(body.contains(&bucket), "no `{bucket}` in:\n{body}");
            }
            assert!(!body.contains("le=\"0.005\""), "{body}");
        }
        // Four requests: three for alice, one for an unknown domain.
        assert!(
            body.lines().any(|l| l == "rl_latency_seconds_count 4"),
            "{body}"
        );
    }
}

/// A mapping file statsd_exporter would refuse stops the start (64), naming the file, the
/// line and the key.
#[test]
fn a_bad_mapper_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let config = dir.path().join("config");
    std::fs::create_dir_all(&config).unwrap();
    write(&config, "rules.yaml", STATS_RULES);
    for (text, want) in [
        (
            "mappings:\n  - match: a.*\n    name: a\n    buckets: [1, 0.1]\n",
            "bad.yaml:4: mappings[0].buckets: buckets must be finite and increase",
        ),
        ("mappings: [\n", "bad.yaml:"),
    ] {
        let file = write(dir.path(), "bad.yaml", text);
        let out = Command::new(&link)
            .env_clear()
            .env("RUNTIME_ROOT", dir.path())
            .env("USE_STATSD", "false")
            .env("USE_PROMETHEUS", "true")
            .env("PROMETHEUS_ADDR", "127.0.0.1:0")
            .env("PROMETHEUS_MAPPER_YAML", &file)
            .output()
            .expect("run ratelimit");
        assert_eq!(out.status.code(), Some(64), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}", dir.path().join(want).display())),
            "{err}"
        );
    }
    let out = Command::new(&link)
        .env_clear()
        .env("USE_STATSD", "false")
        .env("USE_PROMETHEUS", "true")
        .env("PROMETHEUS_MAPPER_YAML", dir.path().join("absent.yaml"))
        .output()
        .expect("run ratelimit");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.yaml"));
}

#[test]
fn what_sluice_cannot_honour_stops_the_start_with_64_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    for (var, value) in [
        ("BACKEND_TYPE", "memcache"),
        ("TRACING_SAMPLING_RATE", "half"),
    ] {
        let out = Command::new(&link)
            .env_clear()
            .env(var, value)
            .output()
            .expect("run ratelimit");
        assert_eq!(out.status.code(), Some(64), "{var}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{var}={value}")), "{err}");
    }
    // The flag does the same for a binary with another name.
    let out = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .arg("--ratelimit-env")
        .env_clear()
        .env("BACKEND_TYPE", "memcache")
        .output()
        .expect("run sluice --ratelimit-env");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("BACKEND_TYPE=memcache"));
}

/// The Deployment Envoy Gateway renders, with sluice's image, is valid Kubernetes
/// (kubernetes-validate --strict), and is the one the test above starts: same command, env,
/// ports and probes.
#[test]
fn envoy_gateways_deployment_with_sluices_image_validates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("deploy/envoy-gateway/ratelimit-deployment.yaml");
    let validate = root.join(".venv/bin/kubernetes-validate");
    assert!(
        validate.is_file(),
        "{} is missing; install it: python3 -m venv .venv && .venv/bin/pip install kubernetes-validate==1.37.0",
        validate.display()
    );
    let out = Command::new(&validate)
        .args(["--strict", "--quiet"])
        .arg(&file)
        .output()
        .expect("run kubernetes-validate");
    assert!(
        out.status.success(),
        "kubernetes-validate --strict failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let docs = yaml::documents(&text);
    let c = yaml::at(&docs[0].yaml, "spec.template.spec.containers.0");
    assert!(yaml::str_at(c, "image").starts_with("sluice:"));
    assert_eq!(yaml::str_at(c, "command.0"), "/bin/ratelimit");
    let env: Vec<(String, String)> = yaml::seq_at(c, "env")
        .iter()
        .map(|e| {
            (
                yaml::str_at(e, "name").to_owned(),
                yaml::str_at(e, "value").to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = ENVOY_GATEWAY
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(env, expected);
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(
            yaml::str_at(c, &format!("{probe}.httpGet.path")),
            "/healthcheck"
        );
        assert_eq!(yaml::int_at(c, &format!("{probe}.httpGet.port")), 8080);
    }
    let ports: Vec<i64> = yaml::seq_at(c, "ports")
        .iter()
        .map(|p| yaml::int_at(p, "containerPort"))
        .collect();
    assert_eq!(ports, [8081, 19001]);
}

/// The requests whose stats the tests read: `alice` for user alice and `ips` for one IP in
/// domain `rl`, then one for `nowhere`, a domain with no rules.
async fn stats_traffic(client: &mut RateLimitServiceClient<Channel>, alice: u64, ips: u64) {
    let requests = std::iter::repeat_n(("user", "alice"), alice as usize)
        .chain(std::iter::repeat_n(("ip", "10.0.0.1"), ips as usize));
    for entry in requests {
        client.should_rate_limit(rls("rl", &[entry])).await.unwrap();
    }
    client
        .should_rate_limit(rls("nowhere", &[("a", "1"), ("b", "2")]))
        .await
        .unwrap();
}
