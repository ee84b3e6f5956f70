//! The `sluice` binary: `check` on good and broken rules, `serve` with the embedded rules,
//! exit 64 on bad rules or settings before any port is bound, exit 0 on SIGTERM. (`check` on the invalid fixtures is in
//! tests/api/rules_validation.rs, beside the table of their errors.)

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use tokio::time::Instant;

use sluice::testing::grpc::*;
use sluice::testing::process::{
    HeldPort, LISTENERS_LOG, Log, Served, exit_within, serving_log, sluice_command,
};

fn sluice() -> Command {
    sluice_command(env!("CARGO_BIN_EXE_sluice"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run the sluice binary")
}

/// `sluice serve` with `var=value` in its environment: it must exit 64 (a usage error); its
/// standard error.
fn serve_with_exits_64(var: &str, value: &str) -> String {
    let out = run(sluice().arg("serve").env(var, value));
    assert_eq!(out.status.code(), Some(64), "{var}={value}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `127.0.0.1:0`: a port from the kernel.
const ANY: &str = "127.0.0.1:0";

/// Spawns `cmd`, a `sluice serve` on gRPC and admin port 0, logging at `info` or finer; the
/// process, a client connected to it, its admin address and its log (for the test to read).
async fn serve_and_connect(cmd: &mut Command) -> (Served, Client, std::net::SocketAddr, Log) {
    let mut child = cmd
        .args(["--grpc-listen", ANY, "--admin-listen", ANY])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice serve");
    let ([grpc, admin], log) = serving_log(&mut child, ["gRPC", "admin HTTP"]);
    let served = Served(child);
    let c = connect_within(&format!("http://{grpc}"), Duration::from_secs(20)).await;
    (served, c, admin, log)
}

fn fixtures(dir: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rules")
        .join(dir)
        .display()
        .to_string()
}

#[test]
fn check_accepts_good_rules_and_the_embedded_set() {
    let out = run(sluice().args(["check", "--rules", &fixtures("valid")]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(sluice().arg("check"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: 1 domain"));
}

#[test]
fn check_resolves_limits_with_the_default_algorithm_of_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("r.yaml");
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n";
    std::fs::write(&rules, text).expect("write rules");
    let rules = rules.display().to_string();
    assert!(
        run(sluice().args(["check", "--rules", &rules]))
            .status
            .success()
    );
    let out = run(sluice()
        .env("SLUICE_LIMITS__DEFAULT_ALGORITHM", "sliding_window")
        .args(["check", "--rules", &rules]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("burst only applies to funnel and token_bucket; this limit's algorithm is sliding_window (limits.default_algorithm)"),
        "{stderr}"
    );
    let out = run(sluice()
        .env("SLUICE_LIMITS__DEFAULT_ALGORITHM", "gcra")
        .args(["check", "--rules", &rules]));
    assert_eq!(
        out.status.code(),
        Some(64),
        "a bad setting is a usage error"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown algorithm 'gcra'"));
}

/// Serves the embedded rules, then stops on SIGTERM, and again on SIGINT: both drain and exit 0.
#[tokio::test]
async fn serve_with_embedded_rules_then_stop_on_sigterm_or_sigint() {
    for (signal, logged) in [
        ("-TERM", "SIGTERM received, shutting down"),
        ("-INT", "SIGINT received, shutting down"),
    ] {
        serve_then_stop_with(signal, logged).await;
    }
}

/// Serves, uses the demo's login limit, sends `signal`, and expects exit 0 with `logged`.
async fn serve_then_stop_with(signal: &str, logged: &str) {
    let (mut served, mut c, _, log) = serve_and_connect(sluice().arg("serve")).await;
    let login = || req("demo", vec![desc(&[("path", "/login")])]);
    for _ in 0..5 {
        assert_eq!(overall(&call(&mut c, login()).await), Code::Ok);
    }
    let r = call(&mut c, login()).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        limit_of(&r.statuses[0]).map(|l| l.2).as_deref(),
        Some("login")
    );

    let pid = served.0.id().to_string();
    assert!(
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success()
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = served.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no exit after kill {signal}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "exit after kill {signal}");
    let stderr = log.until_closed();
    assert!(stderr.contains(logged), "kill {signal}:\n{stderr}");
}

/// `sluice serve` on ports from the kernel, its log naming each port it binds
/// ([`LISTENERS_LOG`]).
fn serve_on_any() -> Command {
    let mut cmd = sluice();
    cmd.args(["serve", "--grpc-listen", ANY, "--admin-listen", ANY])
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG);
    cmd
}

#[test]
fn bad_rules_exit_64_before_binding() {
    let out = run(serve_on_any().args(["--rules", &fixtures("invalid")]));
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid"), "{stderr}");
    assert!(!stderr.contains("serving"), "a port was bound: {stderr}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let out = run(sluice().args([
        "serve",
        "--log-format",
        "json",
        "--rules",
        &fixtures("invalid"),
    ]));
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() > 10, "{stderr}");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["level"], "ERROR", "{line}");
    }
}

#[test]
fn bad_settings_exit_64() {
    let stderr = serve_with_exits_64("SLUICE_SERVER__GRPC_LISTN", "127.0.0.1:1");
    assert!(stderr.contains("invalid settings"), "{stderr}");
    let out = run(sluice().args(["serve", "--backend", "redis", "--redis-url", "http://nope"]));
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis"));
    let stderr = serve_with_exits_64("SLUICE_METRICS__NEAR_LIMIT_RATIO", "0");
    assert!(stderr.contains("near_limit_ratio"), "{stderr}");
}

#[cfg(not(feature = "otel"))]
#[test]
fn an_otlp_endpoint_without_the_otel_feature_exits_64() {
    let stderr = serve_with_exits_64("SLUICE_LOG__OTLP_ENDPOINT", "http://127.0.0.1:4317");
    assert!(stderr.contains("without the `otel` feature"), "{stderr}");
}

#[test]
fn bad_tls_files_exit_64_before_binding() {
    let out = run(serve_on_any()
        .env("SLUICE_TLS__CERT_FILE", "/nonexistent/cert.pem")
        .env("SLUICE_TLS__KEY_FILE", "/nonexistent/key.pem"));
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/"), "{stderr}");
    assert!(!stderr.contains("serving"), "a port was bound: {stderr}");
}

#[test]
fn input_bounds_of_zero_exit_64() {
    let stderr = serve_with_exits_64("SLUICE_INPUT__MAX_DESCRIPTORS", "0");
    assert!(
        stderr.contains("input.max_descriptors must be at least 1"),
        "{stderr}"
    );
}

/// The Redis password is in the URL; it must reach no log line nor any answer, at debug
/// level, while Redis is unreachable (startup, readiness probes, failed requests, shutdown).
#[tokio::test]
async fn the_redis_password_is_never_logged() {
    let secret = "s3cret-Pa55word";
    // Nothing listens there: a port from the kernel, held and refusing connections.
    let down = HeldPort::new();
    let (served, mut c, admin, log) = serve_and_connect(
        sluice()
            .args(["serve", "--backend", "redis"])
            .args([
                "--redis-url",
                &format!("redis://:{secret}@127.0.0.1:{}", down.port()),
            ])
            .env("SLUICE_LOG__LEVEL", "debug"),
    )
    .await;
    let err = c
        .should_rate_limit(req("demo", vec![desc(&[("path", "/login")])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(!err.message().contains(secret), "{}", err.message());
    let ready = sluice::testing::http::get(admin, "/readyz").await;
    assert_eq!(ready.status, 503);
    assert!(!ready.body.contains(secret), "{}", ready.body);
    // Past a readiness probe or two.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pid = served.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stderr = log.until_closed();
    assert!(
        stderr.contains("redis backend failed"),
        "the failure was not logged:\n{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
}

#[test]
fn an_invalid_log_filter_exits_64_before_binding() {
    let level = "error parsing level filter: expected one of \"off\", \"error\", \"warn\", \
                 \"info\", \"debug\", \"trace\", or a number 0-5";
    let cases = [
        (
            "SLUICE_LOG__LEVEL",
            "sluice=loud",
            format!("log.level: invalid log filter \"sluice=loud\": {level}"),
        ),
        (
            "RUST_LOG",
            "nonsense=[",
            format!("RUST_LOG: invalid log filter \"nonsense=[\": {level}"),
        ),
        (
            "SLUICE_LOG__LEVEL",
            "",
            "log.level: the log filter is empty; give one such as `info`".to_owned(),
        ),
    ];
    for (var, value, message) in cases {
        // Its standard error holds the message alone: nothing was served.
        let out = exit_within(
            sluice()
                .args(["serve", "--grpc-listen", ANY, "--admin-listen", ANY])
                .env(var, value),
            Duration::from_secs(10),
        );
        assert_eq!(out.status.code(), Some(64), "{var}={value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr, format!("sluice: {message}\n"));
    }
}

#[test]
fn text_logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let out = run(sluice()
        .args(["serve", "--rules", &fixtures("invalid")])
        .env_remove("NO_COLOR"));
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().count() > 10, "{stderr}");
    assert!(stderr.lines().all(|l| l.contains(" ERROR ")), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes in a pipe:\n{stderr}"
    );
}

/// A client of the gRPC server on the Unix socket at `path` (what Envoy's `pipe` address
/// reaches).
#[derive(Clone)]
struct UnixConnector(std::path::PathBuf);

impl tonic::codegen::Service<tonic::codegen::http::Uri> for UnixConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

/// `--grpc-listen unix:PATH`: gRPC on that socket; the file goes when SIGTERM stops the
/// server. `SLUICE_SERVER__GRPC_LISTEN` takes the same form.
#[tokio::test]
async fn serve_listens_on_a_unix_socket_given_as_grpc_listen() {
    let dir = tempfile::tempdir().unwrap();
    for (i, by_env) in [false, true].into_iter().enumerate() {
        let path = dir.path().join(format!("sluice-{i}.sock"));
        let listen = format!("unix:{}", path.display());
        let mut cmd = sluice();
        cmd.arg("serve").args(["--admin-listen", ANY]);
        if by_env {
            cmd.env("SLUICE_SERVER__GRPC_LISTEN", &listen);
        } else {
            cmd.args(["--grpc-listen", &listen]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut served = Served(child);
        // The file appears at bind(2), a moment before listen(2): until then a connection is
        // refused, so the test waits for one to be accepted.
        let deadline = Instant::now() + Duration::from_secs(20);
        let channel = loop {
            let tried = tonic::transport::Endpoint::from_static("http://sluice")
                .connect_with_connector(UnixConnector(path.clone()))
                .await;
            match tried {
                Ok(channel) => break channel,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no gRPC on {}: {e}",
                    path.display()
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut c = Client::new(channel);
        let login = || req("demo", vec![desc(&[("path", "/login")])]);
        let codes: Vec<Code> = {
            let mut codes = Vec::new();
            for _ in 0..6 {
                codes.push(overall(&call(&mut c, login()).await));
            }
            codes
        };
        assert_eq!(codes[..5], [Code::Ok; 5]);
        assert_eq!(codes[5], Code::OverLimit);
        let pid = served.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = loop {
            if let Some(status) = served.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(status.code(), Some(0));
        assert!(!path.exists(), "the socket file is removed at the end");
    }
}
