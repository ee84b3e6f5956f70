//! The chaos run (`benches/chaos.py`; docs/redis.md, "Chaos run") as a test, on redis-server
//! and on valkey-server: three real `sluice serve` replicas under load for 60 s while a Redis
//! Cluster (3 masters, 3 replicas) and then a Sentinel group go through random faults (at
//! least 5 in all). The driver exits non-zero on over-admission beyond the stated bound, an
//! error for a key whose node was not faulty or later than 1 s after its fault's end, sluice's
//! memory growing, or a fault it could not carry through; the test asserts its exit status
//! and shows its summary. Each run, set-up included, is bounded (killed after
//! [`LIMIT`]); they hold the serial lock, since the 1 s bound is a latency bound.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice::testing::redis::Flavor;
use tokio::time::Instant;

use crate::serial;

/// Seconds of load, split 2:1 between the Cluster and the Sentinel set-ups.
const LOAD_SECS: &str = "60";
/// The whole run, set-ups included, is killed past this.
const LIMIT: Duration = Duration::from_secs(240);

fn chaos_run(flavor: Flavor) {
    let _serial = serial();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let server = flavor.program(flavor.server());
    let cli = flavor.program(flavor.cli());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let svg = dir.path().join("chaos.svg");
    let mut child = Command::new("python3")
        .arg(root.join("benches/chaos.py"))
        .args(["--binary", env!("CARGO_BIN_EXE_sluice")])
        .arg("--server")
        .arg(&server)
        .arg("--cli")
        .arg(&cli)
        .args(["--duration", LOAD_SECS, "--min-faults", "5"])
        // The suites' leases switch (`testing::redis::LEASES_SWITCH`) reaches the replicas.
        .args([
            "--leases",
            if sluice::testing::redis::test_leases() {
                "on"
            } else {
                "off"
            },
        ])
        .arg("--svg")
        .arg(&svg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3 benches/chaos.py");
    // Both pipes read meanwhile, so that the driver never blocks on a full one.
    let stdout = drain(child.stdout.take().expect("the driver's stdout"));
    let stderr = drain(child.stderr.take().expect("the driver's stderr"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the driver's status") {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    println!("{out}");
    let status = status
        .unwrap_or_else(|| panic!("the chaos run took more than {LIMIT:?}:\n{out}\n{stderr}"));
    assert!(
        status.success(),
        "the chaos run on {} failed ({status}):\n{out}\n{stderr}",
        flavor.server()
    );
    assert!(out.contains("\nOK: "), "no verdict from the driver:\n{out}");
    let plot = std::fs::read_to_string(&svg).expect("the timeline SVG");
    assert!(
        plot.starts_with("<svg") && plot.contains("polyline"),
        "an empty timeline"
    );
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

#[test]
fn chaos_run_on_redis() {
    chaos_run(Flavor::Redis);
}

#[test]
fn chaos_run_on_valkey() {
    chaos_run(Flavor::Valkey);
}
