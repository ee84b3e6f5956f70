//! sluice as a drop-in for limitador: the real binary started through a symlink named
//! `limitador-server` with limitador's command line, and a real Envoy with limitador's example
//! Envoy config (limitador-server/examples/envoy.yaml) in front of it:
//!
//! - with limitador's example limits file, every request is admitted: Envoy sends `user_id`
//!   and `descriptors[0]['method']`, so the per-user POST limit (on `req.method`) never applies
//!   and the namespace-wide one is far away, as with limitador itself;
//! - with the limits of limitador's sandbox (GET 10 and POST 5 a minute but on `/json`) and
//!   the sandbox's actions (`req.method`, `req.path`), the 11th GET and the 6th POST get 429.
//!
//! The example config is limitador's but for what Envoy 1.40 no longer reads (`hosts` is now
//! a `load_assignment`, the router names its type) and the ports (port 0, read back).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice::testing::http::{self, request};
use sluice::testing::process::{Served, limitador_server, loopback, serving};

use crate::support::envoy::EnvoyProcess;
use crate::support::upstream::Upstream;

/// limitador-server/examples/limits.yaml.
const EXAMPLE_LIMITS: &str = include_str!("../fixtures/limitador/limits.yaml");

/// limitador-server/sandbox/limits.yaml.
const SANDBOX_LIMITS: &str = r#"---
- namespace: test_namespace
  max_value: 10
  seconds: 60
  conditions:
    - "descriptors[0]['req.method'] == 'GET'"
    - "descriptors[0]['req.path'] != '/json'"
  variables: []
- namespace: test_namespace
  max_value: 5
  seconds: 60
  conditions:
    - "descriptors[0]['req.method'] == 'POST'"
    - "descriptors[0]['req.path'] != '/json'"
  variables: []
- namespace: test_namespace
  max_value: 50000
  seconds: 10
  conditions:
    - "descriptors[0]['req.method'] == 'GET'"
    - "descriptors[0]['req.path'] == '/json'"
  variables: []
"#;

/// The example's actions, and the sandbox's.
const EXAMPLE_ACTIONS: &str = r#"- { request_headers: { header_name: "userid", descriptor_key: "user_id" } }
                        - { request_headers: { header_name: ":method", descriptor_key: "descriptors[0]['method']" } }"#;
const SANDBOX_ACTIONS: &str = r#"- { request_headers: { header_name: ":method", descriptor_key: "req.method" } }
                        - { request_headers: { header_name: ":path", descriptor_key: "req.path" } }"#;

/// limitador-server/examples/envoy.yaml, for Envoy 1.40 and these ports.
const ENVOY: &str = r#"static_resources:
  listeners:
  - address:
      socket_address:
        address: 127.0.0.1
        port_value: LISTEN_PORT
    filter_chains:
    - filters:
      - name: envoy.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: local
          route_config:
            name: local_route
            virtual_hosts:
            - name: static_response
              domains: ['*']
              routes:
              - match:
                  prefix: "/direct"
                direct_response:
                  status: 200
                  body:
                    inline_string: 'direct'
              - match: { prefix: / }
                route:
                  cluster: app
                  rate_limits:
                    - stage: 0
                      actions:
                        ACTIONS
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: "test_namespace"
              failure_mode_deny: true
              timeout: 3s
              rate_limit_service:
                "transport_api_version": "v3"
                grpc_service:
                  envoy_grpc:
                    cluster_name: rate_limit
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: rate_limit
    connect_timeout: 1s
    type: STATIC
    lb_policy: round_robin
    http2_protocol_options: {}
    load_assignment:
      cluster_name: rate_limit
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: { address: 127.0.0.1, port_value: RLS_PORT }
  - name: app
    connect_timeout: 0.25s
    type: STATIC
    lb_policy: round_robin
    load_assignment:
      cluster_name: app
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: { address: 127.0.0.1, port_value: APP_PORT }
admin:
  address:
    socket_address:
      address: 127.0.0.1
      port_value: ADMIN_PORT
"#;

/// `limitador-server` (a symlink to sluice) with limitador's flags, killed when dropped.
struct Limitador {
    _process: Served,
    rls: u16,
}

impl Limitador {
    async fn start(dir: &Path, limits: &str) -> Limitador {
        let file = dir.join("limits.yaml");
        std::fs::write(&file, limits).expect("write the limits");
        let mut child = limitador_server(env!("CARGO_BIN_EXE_sluice"), dir)
            .arg(&file)
            .arg("memory")
            .spawn()
            .expect("start limitador-server");
        let [rls, http_addr] = serving(&mut child, ["gRPC", "admin HTTP"]);
        let started = Limitador {
            _process: Served(child),
            rls: rls.port(),
        };
        http::until_ok(http_addr, "/healthcheck", "limitador-server").await;
        started
    }
}

async fn envoy(actions: &str, rls: u16, app: u16) -> (EnvoyProcess, u16) {
    // Envoy's listener and admin on ports from the kernel, read back once it runs.
    let config = ENVOY
        .replace("LISTEN_PORT", "0")
        .replace("RLS_PORT", &rls.to_string())
        .replace("APP_PORT", &app.to_string())
        .replace("ADMIN_PORT", "0")
        .replace("ACTIONS", actions);
    let envoy = EnvoyProcess::start(&config).await;
    let listen = envoy.listener();
    (envoy, listen)
}

async fn status(port: u16, method: &str, path: &str, user: &str) -> u16 {
    request(loopback(port), method, path, &[("userid", user)], "")
        .await
        .status
}

/// sluice's fixed windows end on multiples of their length: keep clear of a minute's end.
async fn clear_of_minute_end() {
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    while secs() % 60 >= 50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitadors_example_envoy_config_in_front_of_limitador_server() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let app = Upstream::start().await;
    let sluice = Limitador::start(dir.path(), EXAMPLE_LIMITS).await;
    let (_envoy, port) = envoy(EXAMPLE_ACTIONS, sluice.rls, app.port).await;
    for i in 0..8 {
        assert_eq!(status(port, "POST", "/", "alice").await, 200, "POST {i}");
        assert_eq!(status(port, "GET", "/", "alice").await, 200, "GET {i}");
    }
    assert_eq!(status(port, "GET", "/direct", "alice").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitadors_sandbox_limits_give_429s() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let app = Upstream::start().await;
    let sluice = Limitador::start(dir.path(), SANDBOX_LIMITS).await;
    let (_envoy, port) = envoy(SANDBOX_ACTIONS, sluice.rls, app.port).await;
    clear_of_minute_end().await;
    for i in 0..10 {
        assert_eq!(status(port, "GET", "/", "a").await, 200, "GET {i}");
    }
    assert_eq!(status(port, "GET", "/", "a").await, 429);
    for i in 0..5 {
        assert_eq!(status(port, "POST", "/", "a").await, 200, "POST {i}");
    }
    assert_eq!(status(port, "POST", "/", "a").await, 429);
    for i in 0..5 {
        assert_eq!(
            status(port, "GET", "/json", "a").await,
            200,
            "GET /json {i}"
        );
    }
}

/// Runs `limitador-server ARGS` to its end: (exit code, stdout, stderr).
fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let link = dir.join("limitador-server");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).expect("symlink");
    }
    let out = Command::new(&link)
        .env_clear()
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run limitador-server");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn validate_and_what_sluice_cannot_honour() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("good.yaml"), EXAMPLE_LIMITS).expect("write");
    let bad =
        "- namespace: n\n  max_value: 1\n  seconds: 1\n  conditions: [\"descriptors[0].x ==\"]\n";
    std::fs::write(dir.path().join("bad.yaml"), bad).expect("write");
    let (code, out, _) = run(dir.path(), &["--validate", "good.yaml"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "ok: 2 limitador limit(s), 0 domain(s)\n")
    );
    let (code, _, err) = run(dir.path(), &["--validate", "bad.yaml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("bad.yaml:4: [0].conditions[0]: invalid CEL expression"),
        "{err}"
    );
    for (args, named) in [
        (
            &["good.yaml", "distributed", "a", "127.0.0.1:1"][..],
            "distributed",
        ),
        (&[][..], "LIMITS_FILE"),
    ] {
        let (code, _, err) = run(dir.path(), args);
        assert_eq!(code, 64, "{args:?}: {err}");
        assert!(
            err.contains(&format!("not supported: {named}")),
            "{args:?}: {err}"
        );
    }
    let (code, _, err) = run(dir.path(), &["good.yaml", "--no-such-flag"]);
    assert_eq!(code, 64, "{err}");
}
