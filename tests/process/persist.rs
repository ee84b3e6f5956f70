//! `limiter.persist` on the real binary: a day's fixed window and a funnel keep their counts
//! through SIGTERM and a restart; after `kill -9`, what was decided up to one interval before
//! is kept; a corrupt or truncated snapshot is refused with a log line naming it, and sluice
//! starts empty and serves. Then the same as `limitador-server ... disk PATH`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sluice::proto::rate_limit_response::Code;
use sluice::testing::grpc::{call, connect_within, desc, req};
use sluice::testing::http;
use sluice::testing::process::{
    Served, limitador_server, logged_listener, serving, sluice_command,
};
use tokio::time::Instant;

const RULES: &str = r#"
domain: persist
descriptors:
  - key: day
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window}
  - key: funnel
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: funnel}
  - key: many
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}
"#;

/// A running `sluice serve` whose log goes to a file.
struct Replica {
    process: Served,
    grpc: SocketAddr,
    log: PathBuf,
}

impl Replica {
    /// Serves `RULES` with its state in `state`, every `interval_ms`.
    fn start(dir: &Path, state: &Path, interval_ms: u64, name: &str) -> Replica {
        let rules = dir.join("rules.yaml");
        std::fs::write(&rules, RULES).expect("write the rules");
        let log = dir.join(format!("{name}.log"));
        let child = sluice_command(env!("CARGO_BIN_EXE_sluice"))
            .arg("serve")
            .arg("--rules")
            .arg(&rules)
            .args([
                "--grpc-listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .env("SLUICE_LOG__LEVEL", "info")
            .env("SLUICE_LIMITER__PERSIST", state)
            .env(
                "SLUICE_LIMITER__PERSIST_INTERVAL_MS",
                interval_ms.to_string(),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("start sluice");
        let process = Served(child);
        let grpc = logged_listener(&log, "gRPC");
        Replica { process, grpc, log }
    }

    /// The code and remaining of one hit on `key`.
    async fn hit(&self, key: &str) -> (Code, u32) {
        let mut c = connect_within(&format!("http://{}", self.grpc), Duration::from_secs(10)).await;
        let r = call(&mut c, req("persist", vec![desc(&[(key, "alice")])])).await;
        let s = &r.statuses[0];
        (
            Code::try_from(s.code).unwrap_or(Code::Unknown),
            s.limit_remaining,
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Sends `signal` (`-TERM`, `-KILL`) to `process` and waits up to 10 s for it to exit.
async fn signal(process: &mut Served, signal: &str) -> ExitStatus {
    let pid = process.0.id().to_string();
    let sent = Command::new("kill").args([signal, &pid]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill {signal} {pid}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = process.0.try_wait().expect("the child's status") {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit after kill {signal}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits past the end of the current window of `period_secs` when it ends within 30 s, so
/// that a test's counts all fall in one window.
async fn clear_of_window_end(period_secs: u64) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let left = period_secs - secs % period_secs;
    if left < 30 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

#[tokio::test]
async fn a_days_window_and_a_funnel_continue_after_a_graceful_restart() {
    clear_of_window_end(86_400).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let state = dir.path().join("state").join("sluice.snapshot");
    // An hour between periodic writes: only the one at SIGTERM can carry the counts.
    let mut first = Replica::start(dir.path(), &state, 3_600_000, "first");
    assert!(
        first.log().contains("no limiter snapshot yet"),
        "{}",
        first.log()
    );
    assert_eq!(first.hit("day").await, (Code::Ok, 4));
    assert_eq!(first.hit("day").await, (Code::Ok, 3));
    assert_eq!(first.hit("funnel").await, (Code::Ok, 2));
    assert_eq!(first.hit("funnel").await, (Code::Ok, 1));
    assert!(!state.exists(), "nothing written before the stop");
    assert_eq!(signal(&mut first.process, "-TERM").await.code(), Some(0));
    assert!(
        first.log().contains("limiter state saved"),
        "{}",
        first.log()
    );

    let second = Replica::start(dir.path(), &state, 3_600_000, "second");
    assert!(
        second.log().contains("limiter state restored"),
        "{}",
        second.log()
    );
    assert_eq!(second.hit("day").await, (Code::Ok, 2));
    assert_eq!(second.hit("funnel").await, (Code::Ok, 0));
    assert_eq!(second.hit("funnel").await.0, Code::OverLimit);
    assert_eq!(second.hit("day").await, (Code::Ok, 1));
}

#[tokio::test]
async fn after_kill_9_the_counts_are_those_of_one_interval_before() {
    clear_of_window_end(86_400).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let state = dir.path().join("sluice.snapshot");
    let interval = 200;
    let mut first = Replica::start(dir.path(), &state, interval, "first");
    for left in [99, 98, 97] {
        assert_eq!(first.hit("many").await, (Code::Ok, left));
    }
    // Several intervals: these three are written.
    tokio::time::sleep(Duration::from_millis(5 * interval)).await;
    for left in [96, 95] {
        assert_eq!(first.hit("many").await, (Code::Ok, left));
    }
    assert!(!signal(&mut first.process, "-KILL").await.success());

    let second = Replica::start(dir.path(), &state, interval, "second");
    let (code, left) = second.hit("many").await;
    assert_eq!(code, Code::Ok);
    // 3 to 5 were counted before (at most the last interval's 2 lost), and this one.
    assert!((94..=96).contains(&left), "{left} left: {}", second.log());
}

#[tokio::test]
async fn a_corrupt_or_truncated_snapshot_is_refused_and_sluice_starts_empty() {
    clear_of_window_end(86_400).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let state = dir.path().join("sluice.snapshot");
    let mut first = Replica::start(dir.path(), &state, 3_600_000, "first");
    assert_eq!(first.hit("day").await, (Code::Ok, 4));
    assert_eq!(signal(&mut first.process, "-TERM").await.code(), Some(0));
    let good = std::fs::read(&state).expect("a snapshot written at SIGTERM");
    let mut flipped = good.clone();
    let middle = good.len() / 2;
    flipped[middle] ^= 0x01;
    for (name, bytes, reason) in [
        ("corrupt", flipped, "checksum mismatch"),
        ("truncated", good[..good.len() - 7].to_vec(), "truncated"),
    ] {
        std::fs::write(&state, &bytes).expect("write the bad snapshot");
        let mut replica = Replica::start(dir.path(), &state, 3_600_000, name);
        let log = replica.log();
        let line = log
            .lines()
            .find(|l| l.contains("limiter snapshot") && l.contains("refused"))
            .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
        assert!(line.contains(&state.display().to_string()), "{line}");
        assert!(line.contains(reason), "{line}");
        assert!(line.contains("starting empty"), "{line}");
        // Empty, and serving: the day's count starts again.
        assert_eq!(replica.hit("day").await, (Code::Ok, 4), "{name}");
        let aside = dir.path().join("sluice.snapshot.refused");
        assert_eq!(std::fs::read(&aside).ok(), Some(bytes), "{name} kept aside");
        assert_eq!(signal(&mut replica.process, "-TERM").await.code(), Some(0));
    }
}

const LIMITS: &str = r#"
- namespace: ns
  max_value: 5
  seconds: 3600
  variables: ["descriptors[0]['user_id']"]
"#;

/// `limitador-server LIMITS -b 127.0.0.1 ... disk DIR`, with the snapshot every `interval_ms`.
async fn limitador(dir: &Path, interval_ms: u64) -> (Served, SocketAddr) {
    let file = dir.join("limits.yaml");
    std::fs::write(&file, LIMITS).expect("write the limits");
    let mut child = limitador_server(env!("CARGO_BIN_EXE_sluice"), dir)
        .env(
            "SLUICE_LIMITER__PERSIST_INTERVAL_MS",
            interval_ms.to_string(),
        )
        .arg(&file)
        .arg("disk")
        .arg(dir.join("db"))
        .spawn()
        .expect("start limitador-server");
    let [_, http_addr] = serving(&mut child, ["gRPC", "admin HTTP"]);
    let served = Served(child);
    http::until_ok(http_addr, "/healthcheck", "limitador-server").await;
    (served, http_addr)
}

/// The status of `path` (`/check`, `/report`, `/check_and_report`) for `delta` on user `u`.
async fn ask(addr: SocketAddr, path: &str, delta: u64) -> u16 {
    let body = json!({"namespace": "ns", "values": {"user_id": "u"}, "delta": delta});
    http::post(addr, path, &body.to_string()).await.status
}

#[tokio::test]
async fn limitador_disk_keeps_counters_through_term_and_within_the_interval_through_kill_9() {
    clear_of_window_end(3_600).await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let (mut served, addr) = limitador(dir.path(), 200).await;
    assert_eq!(ask(addr, "/check_and_report", 3).await, 200);
    assert_eq!(signal(&mut served, "-TERM").await.code(), Some(0));
    let snapshot = dir
        .path()
        .join("db")
        .join(sluice::compat::limitador::DISK_SNAPSHOT);
    assert!(snapshot.exists(), "the snapshot in the disk PATH");

    let (mut served, addr) = limitador(dir.path(), 200).await;
    // 3 of 5 were counted before the restart: 2 fit, 3 do not.
    assert_eq!(ask(addr, "/check", 3).await, 429);
    assert_eq!(ask(addr, "/check_and_report", 1).await, 200);
    // 4 counted; several intervals pass, then one more, and kill -9 at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ask(addr, "/report", 1).await, 200);
    assert!(!signal(&mut served, "-KILL").await.success());

    let (mut served, addr) = limitador(dir.path(), 200).await;
    // At least the 4 counted an interval before the kill are kept (4 + 2 > 5).
    assert_eq!(ask(addr, "/check", 2).await, 429, "at least 4 kept");
    assert_eq!(signal(&mut served, "-TERM").await.code(), Some(0));
}
