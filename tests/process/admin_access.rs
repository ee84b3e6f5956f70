//! Secure by default, on the real binary: an admin port beyond loopback (`0.0.0.0`, called
//! here on 127.0.0.1) without `admin.token` refuses every endpoint that reveals or changes
//! limiter state with a 403 naming the fix, and changes nothing; health, readiness,
//! `/rlconfig`, `/metrics` and limitador's `/limits` and `/status` stay open. Started as
//! `ratelimit` or as `limitador-server`, the decision endpoints those projects serve to anyone
//! (`/json`; `/check`, `/report`, `/check_and_report`) stay open, and sluice's own stay refused
//! (docs/security.md).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use sluice::testing::grpc::{Code, RateLimitServiceClient, call, desc, overall, req};
use sluice::testing::http::{self, Answer};
use sluice::testing::process::{Served, logged_listener, sluice_command};
use sluice::testing::redis::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// One request per key per hour: a second is denied unless something resets the key.
const RULES: &str = "\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
";

/// A limitador limits file: one per hour per user.
const LIMITS: &str = r#"
- namespace: ns
  max_value: 1
  seconds: 3600
  conditions: []
  variables: ["descriptors[0]['user']"]
"#;

const JSON_BODY: &str = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
const CHECK_BODY: &str = r#"{"namespace":"ns","values":{"user":"u"},"delta":1}"#;

/// Every endpoint that reveals or changes limiter state, other than the decision endpoints.
fn state_endpoints() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        ("POST", "/counters/reset", JSON_BODY),
        ("POST", "/counters/reset", r#"{"rule": "k"}"#),
        ("POST", "/why", JSON_BODY),
        ("GET", "/counters", ""),
        ("GET", "/counters?domain=d&format=text", ""),
        ("GET", "/counters/top", ""),
        ("GET", "/counters/ns", ""),
        ("GET", "/ui", ""),
        ("GET", "/ui?token=anything", ""),
        ("GET", "/ui/data", ""),
    ]
}

/// The decision endpoints: open as the gRPC port only with `admin.open_decisions`.
const DECISIONS: [(&str, &str); 4] = [
    ("/json", JSON_BODY),
    ("/check", CHECK_BODY),
    ("/report", CHECK_BODY),
    ("/check_and_report", CHECK_BODY),
];

/// Endpoints open whatever the address and the token.
const OPEN: [&str; 7] = [
    "/healthz",
    "/readyz",
    "/healthcheck",
    "/rlconfig",
    "/metrics",
    "/limits/ns",
    "/status",
];

async fn send(admin: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
    let json = [("content-type", "application/json")];
    http::request(admin, method, path, &json, body).await
}

/// The answer must be the refusal: 403, naming the endpoint and the settings that open it.
fn assert_refused(answer: &Answer, method: &str, path: &str) {
    let what = format!("{method} {path}: {} {}", answer.status, answer.body);
    assert_eq!(answer.status, 403, "{what}");
    let endpoint = path.split('?').next().unwrap_or(path);
    for needed in [
        endpoint,
        "0.0.0.0:",
        "admin.token_file",
        "SLUICE_ADMIN__TOKEN",
        "127.0.0.1:8080",
        "docs/security.md",
    ] {
        assert!(answer.body.contains(needed), "no {needed:?} in {what}");
    }
}

/// Waits until the admin address in `log` answers `/readyz` 200.
async fn ready(log: &Path, child: &mut Served) -> SocketAddr {
    let bound = logged_listener(log, "admin HTTP");
    assert!(bound.ip().is_unspecified(), "listens on {bound}");
    let admin = SocketAddr::from(([127, 0, 0, 1], bound.port()));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!(
                "sluice exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if http::try_get(admin, "/readyz")
            .await
            .is_some_and(|a| a.status == 200)
        {
            return admin;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sluice was not ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn spawn(command: &mut Command, log: &Path) -> Served {
    let file = std::fs::File::create(log).expect("the log file");
    Served(
        command
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start sluice"),
    )
}

/// `sluice serve` on the rules and the limitador limits in `dir`, gRPC on loopback and the
/// admin port on 0.0.0.0 (ports from the kernel), without a token, with `env`, logging to
/// `log`; once it is ready: the process and the admin address to call.
async fn beyond_loopback(dir: &Path, log: &Path, env: &[(&str, &str)]) -> (Served, SocketAddr) {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("write the rules");
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, LIMITS).expect("write the limits");
    let mut child = spawn(
        sluice_command(BIN)
            .args(["serve", "--rules"])
            .arg(&rules)
            .arg("--rules")
            .arg(&limits)
            .args([
                "--grpc-listen",
                "127.0.0.1:0",
                "--admin-listen",
                "0.0.0.0:0",
            ])
            .env("SLUICE_LOG__LEVEL", "info")
            .envs(env.iter().copied()),
        log,
    );
    let admin = ready(log, &mut child).await;
    (child, admin)
}

#[tokio::test]
async fn beyond_loopback_without_a_token_state_endpoints_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("sluice.log");
    let (_child, admin) = beyond_loopback(dir.path(), &log, &[]).await;
    let grpc = logged_listener(&log, "gRPC");
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(
        text.contains("without admin.token") && text.contains("answer 403"),
        "no warning at start: {text}"
    );

    // The key's one request of the hour.
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let request = || req("d", vec![desc(&[("k", "v")])]);
    assert_eq!(overall(&call(&mut client, request()).await), Code::Ok);

    for (method, path, body) in state_endpoints() {
        let answer = send(admin, method, path, body).await;
        assert_refused(&answer, method, path);
    }
    for (path, body) in DECISIONS {
        let answer = send(admin, "POST", path, body).await;
        assert_refused(&answer, "POST", path);
        assert!(
            answer.body.contains("admin.open_decisions"),
            "{path}: {}",
            answer.body
        );
    }
    for path in OPEN {
        let answer = http::get(admin, path).await;
        assert_eq!(answer.status, 200, "GET {path}: {}", answer.body);
    }
    // The refused reset forgot nothing, and the refused /json and /report spent nothing.
    assert_eq!(
        overall(&call(&mut client, request()).await),
        Code::OverLimit
    );
    let user = req("ns", vec![desc(&[("user", "u")])]);
    assert_eq!(overall(&call(&mut client, user).await), Code::Ok);
}

#[tokio::test]
async fn open_decisions_opens_json_and_the_check_endpoints_only() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("sluice.log");
    let (_child, admin) = beyond_loopback(
        dir.path(),
        &log,
        &[("SLUICE_ADMIN__OPEN_DECISIONS", "true")],
    )
    .await;
    let json = send(admin, "POST", "/json", JSON_BODY).await;
    assert_eq!(json.status, 200, "{}", json.body);
    let checked = send(admin, "POST", "/check_and_report", CHECK_BODY).await;
    assert_eq!(checked.status, 200, "{}", checked.body);
    let over = send(admin, "POST", "/check", CHECK_BODY).await;
    assert_eq!(over.status, 429, "the /check_and_report above counted");
    for (method, path, body) in state_endpoints() {
        let answer = send(admin, method, path, body).await;
        assert_refused(&answer, method, path);
    }
}

/// Started as `ratelimit` with its defaults (HTTP on 0.0.0.0): `/json` answers anyone, as
/// envoyproxy/ratelimit's does; sluice's own state endpoints do not.
#[tokio::test]
async fn as_ratelimit_json_stays_open_and_sluices_own_endpoints_are_refused() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&config).expect("the rules directory");
    std::fs::write(config.join("config.yaml"), RULES).expect("write the rules");
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(BIN, &link).expect("symlink");
    let log = dir.path().join("sluice.log");
    let data = dir.path().join("data");
    let mut child = spawn(
        Command::new(&link)
            .env_clear()
            .env("RUNTIME_ROOT", &data)
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", redis.addr())
            .env("LOG_LEVEL", "info")
            // Its own default host (0.0.0.0); the ports are the child's to choose.
            .env("PORT", "0")
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", "0")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("DEBUG_PORT", "0"),
        &log,
    );
    let admin = ready(&log, &mut child).await;
    let json = send(admin, "POST", "/json", JSON_BODY).await;
    assert_eq!(json.status, 200, "{}", json.body);
    let again = send(admin, "POST", "/json", JSON_BODY).await;
    assert_eq!(again.status, 429, "{}", again.body);
    for (method, path, body) in state_endpoints() {
        let answer = send(admin, method, path, body).await;
        assert_refused(&answer, method, path);
    }
}

/// Started as `limitador-server` with its defaults (HTTP on 0.0.0.0): its HTTP API's
/// decisions answer anyone, as limitador's do; `/counters/{namespace}`, which lists every
/// user's counters, does not.
#[tokio::test]
async fn as_limitador_the_check_endpoints_stay_open_and_counters_are_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).expect("write the limits");
    let link = dir.path().join("limitador-server");
    std::os::unix::fs::symlink(BIN, &link).expect("symlink");
    let log = dir.path().join("sluice.log");
    let mut child = spawn(
        Command::new(&link)
            .env_clear()
            .args(["-b", "127.0.0.1", "-p", "0", "-P", "0", "-vv"])
            .arg(&limits),
        &log,
    );
    let admin = ready(&log, &mut child).await;
    let report = send(admin, "POST", "/check_and_report", CHECK_BODY).await;
    assert_eq!(report.status, 200, "{}", report.body);
    let over = send(admin, "POST", "/check", CHECK_BODY).await;
    assert_eq!(over.status, 429, "{}", over.body);
    let limits = http::get(admin, "/limits/ns").await;
    assert_eq!(limits.status, 200, "{}", limits.body);
    let counters = http::get(admin, "/counters/ns").await;
    assert_refused(&counters, "GET", "/counters/ns");
}
