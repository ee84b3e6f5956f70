//! The ordered drain: readiness fails first (HTTP and gRPC health), the drain delay keeps
//! serving, a request in flight completes, then everything stops. In process, and with the
//! real binary on SIGTERM (and SIGHUP reloading), a request held in flight by a stopped
//! redis-server among them.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use sluice::config::settings::Settings;
use sluice::limiter::Limiter;
use sluice::testing::grpc::*;
use sluice::testing::http::get;
use sluice::testing::limits::Gate;
use sluice::testing::process::*;
use sluice::testing::redis::RedisServer;
use tokio::time::Instant;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

async fn readyz_until(admin: std::net::SocketAddr, status: u16) {
    let start = Instant::now();
    while get(admin, "/readyz").await.status != status {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "/readyz never {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn readiness_fails_first_and_the_request_in_flight_completes() {
    let _serial = crate::serial_async().await;
    let gate = Arc::new(Gate::new(100));
    let limiter: Arc<dyn Limiter> = gate.clone();
    let server = TestServer::start_over(Settings::default(), RULES, limiter).await;
    let (url, admin_addr) = (server.url(), server.admin_addr);

    let in_flight = send_in_background(&url).await;
    gate.entered(1).await;
    assert_eq!(get(admin_addr, "/readyz").await.status, 200);

    let stopped_at = Instant::now();
    server.begin_stop();
    readyz_until(admin_addr, 503).await;
    let body = get(admin_addr, "/readyz").await.body;
    assert_eq!(body, "not ready: draining: shutting down\n");
    assert!(
        !in_flight.is_finished(),
        "readiness fails while the request is in flight"
    );

    gate.release(1);
    in_flight_completes_then_stops(server, in_flight).await;
    assert!(stopped_at.elapsed() < Duration::from_secs(5));
    assert!(
        RateLimitServiceClient::connect(url).await.is_err(),
        "gRPC closed"
    );
    assert!(
        tokio::net::TcpStream::connect(admin_addr).await.is_err(),
        "admin closed"
    );
}

#[tokio::test]
async fn during_the_drain_delay_health_fails_but_requests_are_served() {
    let _serial = crate::serial_async().await;
    let mut settings = Settings::default();
    settings.server.drain_delay_secs = 1;
    let server = TestServer::start_with(settings, RULES).await;
    let mut health = HealthClient::new(channel(&server).await);
    let mut c = client(&server).await;
    hit(&mut c, "k", "v").await;
    let (admin, url) = (server.admin_addr, server.url());
    let stopping = tokio::spawn(server.stop());
    readyz_until(admin, 503).await;
    let status = health
        .check(HealthCheckRequest {
            service: "ratelimit".to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::NotServing as i32);
    // Still accepting: a new connection is served.
    let mut fresh = RateLimitServiceClient::connect(url).await.unwrap();
    assert_eq!(overall(&hit(&mut fresh, "k", "v").await), Code::Ok);
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("stops after the drain delay")
        .unwrap()
        .unwrap();
}

/// Sends signal `name` (`-TERM`, ...) to process `pid`.
fn signal(pid: u32, name: &str) {
    let ok = Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {name} {pid}");
}

#[tokio::test]
async fn the_binary_reloads_on_sighup_and_drains_on_sigterm() {
    let _serial = crate::serial_async().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, RULES).unwrap();
    let mut child = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--rules", file.to_str().unwrap()])
        .args(["--grpc-listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .env("SLUICE_SERVER__DRAIN_DELAY_SECS", "1")
        .env("SLUICE_SERVER__SHUTDOWN_GRACE_SECS", "5")
        .env("SLUICE_RELOAD__WATCH", "false")
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let [grpc, admin_addr] = serving(&mut child, ["gRPC", "admin HTTP"]);
    let mut served = Served(child);
    let url = format!("http://{grpc}");
    let mut c = connect_within(&url, Duration::from_secs(20)).await;
    readyz_until(admin_addr, 200).await;

    std::fs::write(
        &file,
        RULES.replace("requests_per_unit: 5", "requests_per_unit: 9"),
    )
    .unwrap();
    signal(served.0.id(), "-HUP");
    let start = Instant::now();
    while !get(admin_addr, "/rlconfig")
        .await
        .body
        .starts_with("# version 2,")
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no reload after SIGHUP"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = call(&mut c, req("test", vec![desc(&[("k", "v")])])).await;
    assert_eq!(limit_of(&r.statuses[0]).map(|l| l.0), Some(9));
    let metrics = get(admin_addr, "/metrics").await.body;
    let keys = sluice::testing::http::sample(&metrics, "sluice_memory_keys", &[]);
    assert_eq!(keys, Some(1.0), "{metrics}");

    signal(served.0.id(), "-TERM");
    let terminated = Instant::now();
    readyz_until(admin_addr, 503).await;
    let mut fresh = connect_within(&url, Duration::from_secs(1)).await;
    assert_eq!(
        overall(&hit_test(&mut fresh).await),
        Code::Ok,
        "served while draining"
    );
    let status = exit_within(terminated, Duration::from_secs(6), || {
        served.0.try_wait().unwrap()
    })
    .await;
    assert_eq!(status.code(), Some(0));
    assert!(
        terminated.elapsed() >= Duration::from_secs(1),
        "the drain delay was kept"
    );
}

/// The exit status `exited` reports, polled every 20 ms; fails if there is none `limit`
/// after `signalled`.
async fn exit_within(
    signalled: Instant,
    limit: Duration,
    mut exited: impl FnMut() -> Option<std::process::ExitStatus>,
) -> std::process::ExitStatus {
    loop {
        if let Some(status) = exited() {
            return status;
        }
        assert!(
            signalled.elapsed() < limit,
            "no exit within {limit:?} of the signal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn hit_test(c: &mut Client) -> RateLimitResponse {
    call(c, req("test", vec![desc(&[("k", "v")])])).await
}

/// The real binary on the Redis backend, a real SIGTERM, and a request held in flight by a
/// stopped redis-server (SIGSTOP): readiness fails at once, the gRPC port closes after the
/// drain delay, and once Redis resumes the request completes and the process exits 0, within
/// the drain delay plus the grace period.
#[tokio::test]
async fn on_sigterm_the_binary_finishes_the_request_in_flight_and_exits_0() {
    let _serial = crate::serial_async().await;
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let settings = [
        ("SLUICE_SERVER__DRAIN_DELAY_SECS", "1"),
        ("SLUICE_SERVER__SHUTDOWN_GRACE_SECS", "3"),
        ("SLUICE_REDIS__TIMEOUT_MS", "20000"),
    ];
    let binary = env!("CARGO_BIN_EXE_sluice");
    let mut sluice = SluiceProcess::over_redis(binary, &rules, &redis.url(), &settings);
    let admin = sluice.admin();
    readyz_until(admin, 200).await;
    let mut c = connect_within(&sluice.url(), Duration::from_secs(5)).await;
    assert_eq!(overall(&hit_test(&mut c).await), Code::Ok, "Redis answers");

    let info: String = redis.cmd(&["INFO", "server"]);
    let redis_pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .expect("redis-server's process id");
    signal(redis_pid, "-STOP");
    let in_flight = tokio::spawn(async move {
        c.should_rate_limit(req("test", vec![desc(&[("k", "v")])]))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!in_flight.is_finished(), "held by the stopped Redis");

    signal(sluice.pid(), "-TERM");
    let terminated = Instant::now();
    readyz_until(admin, 503).await;
    let body = get(admin, "/readyz").await.body;
    assert_eq!(body, "not ready: draining: shutting down\n");
    assert!(!in_flight.is_finished(), "readiness fails first");
    let grpc = sluice.url().replace("http://", "");
    while tokio::net::TcpStream::connect(&grpc).await.is_ok() {
        assert!(
            terminated.elapsed() < Duration::from_secs(3),
            "the gRPC port still accepts after the drain delay"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        terminated.elapsed() >= Duration::from_secs(1),
        "the drain delay was kept"
    );
    assert!(
        !in_flight.is_finished() && sluice.exited().is_none(),
        "waiting for it"
    );

    signal(redis_pid, "-CONT");
    let answer = tokio::time::timeout(Duration::from_secs(3), in_flight)
        .await
        .expect("the request completes once Redis resumes")
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!(overall(answer.get_ref()), Code::Ok);
    // Bounded by drain delay + grace period.
    let status = exit_within(terminated, Duration::from_secs(4), || sluice.exited()).await;
    assert_eq!(status.code(), Some(0));
}
