//! `sluice bench`, the real binary, for about a second each: against the no-op server it runs
//! itself (`--noop-server`), and against `sluice serve`; the JSON result must be sane.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice::testing::process::*;
use tokio::time::Instant;

/// The rules file, shared with the allocation tests.
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/rules/suites/bench.yaml"
);

fn sluice() -> Command {
    sluice_command(env!("CARGO_BIN_EXE_sluice"))
}

fn noop_server() -> (Served, String) {
    let (served, addr) = noop(&[]);
    (served, format!("http://{addr}"))
}

/// `sluice bench --noop-server 127.0.0.1:0` plus `more` arguments: the server, and the
/// address it bound (the first line of its standard error).
fn noop(more: &[&str]) -> (Served, std::net::SocketAddr) {
    use std::io::BufRead as _;
    let mut child = sluice()
        .args(["bench", "--noop-server", "127.0.0.1:0", "--duration", "60s"])
        .args(more)
        .env("SLUICE_LOG__LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sluice binary");
    let stderr = child.stderr.take().expect("its standard error, piped");
    let served = Served(child);
    let mut stderr = std::io::BufReader::new(stderr);
    let mut line = String::new();
    stderr
        .read_line(&mut line)
        .expect("the no-op server's first line");
    // The rest goes on to this process's standard error (a closed pipe would fail its writes).
    std::thread::spawn(move || {
        for more in stderr.lines().map_while(Result::ok) {
            eprintln!("{more}");
        }
    });
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (served, addr)
}

fn sluice_server(rules: &Path) -> (Served, String) {
    sluice_server_with(rules, &[])
}

/// `sluice serve` on ports it binds itself (read from its log), with `SLUICE_*` settings.
fn sluice_server_with(rules: &Path, env: &[(&str, &str)]) -> (Served, String) {
    let mut child = sluice()
        .arg("serve")
        .arg("--rules")
        .arg(rules)
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sluice binary");
    let grpc = serving_grpc(&mut child);
    (Served(child), format!("http://{grpc}"))
}

/// Runs `sluice bench --json` with `args`; its parsed result.
fn bench(target: &str, args: &[&str]) -> Value {
    let out = run_ok(
        sluice()
            .args(["bench", "--target", target, "--json", "--quiet"])
            .args(["--warmup", "200ms", "--duration", "1s"])
            .args(args),
        "sluice bench",
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn count(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

/// Requests were made, the counts add up, the percentiles are ordered and positive.
fn assert_sane(v: &Value) {
    let requests = count(v, "requests");
    assert!(requests > 0, "no request measured: {v}");
    let kinds: u64 = v["error_kinds"]
        .as_object()
        .expect("error_kinds")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(count(v, "errors"), kinds, "{v}");
    assert_eq!(
        count(v, "ok") + count(v, "over_limit") + count(v, "errors"),
        requests,
        "{v}"
    );
    let rps = v["requests_per_sec"].as_f64().expect("requests_per_sec");
    let secs = v["duration_secs"].as_f64().expect("duration_secs");
    assert!((rps * secs - requests as f64).abs() < 1.0, "{v}");
    let p = &v["latency_us"];
    let at = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("no {k} in {p}"));
    assert!(at("p50") > 0.0, "{v}");
    assert!(at("p50") <= at("p90") && at("p90") <= at("p99"), "{v}");
    assert!(at("p99") <= at("p99_9") && at("p99_9") <= at("max"), "{v}");
}

#[test]
fn closed_loop_against_the_noop_server_is_all_ok() {
    let (_noop, url) = noop_server();
    let v = bench(
        &url,
        &[
            "--domain",
            "any",
            "--descriptor",
            "user=x,path=/",
            "--spread",
            "user=100",
        ],
    );
    assert_sane(&v);
    assert_eq!(v["mode"], "closed");
    assert_eq!(count(&v, "ok"), count(&v, "requests"), "{v}");
}

#[test]
fn against_sluice_a_tight_rule_is_over_limit() {
    let rules = Path::new(RULES);
    let (_server, url) = sluice_server(rules);
    // Spread over many users: all within their limit.
    let wide = bench(
        &url,
        &[
            "--domain",
            "bench",
            "--descriptor",
            "user=x",
            "--spread",
            "user=10000",
            "--connections",
            "2",
            "--concurrency",
            "8",
        ],
    );
    assert_sane(&wide);
    assert_eq!(count(&wide, "ok"), count(&wide, "requests"), "{wide}");
    // One key of 5 per hour, from a request file: all but the first 5 are over the limit.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let request = dir.path().join("request.yaml");
    std::fs::write(
        &request,
        "domain: bench\ndescriptors:\n  - entries: [{key: tight, value: one}]\n",
    )
    .expect("write the request");
    let tight = bench(&url, &["--request", request.to_str().expect("UTF-8")]);
    assert_sane(&tight);
    assert_eq!(count(&tight, "errors"), 0, "{tight}");
    assert!(count(&tight, "over_limit") > 0, "{tight}");
    assert!(count(&tight, "ok") <= 5, "{tight}");
}

#[test]
fn open_loop_keeps_its_rate() {
    let (_noop, url) = noop_server();
    let started = Instant::now();
    let v = bench(
        &url,
        &[
            "--domain",
            "any",
            "--descriptor",
            "k=v",
            "--rate",
            "500",
            "--concurrency",
            "16",
        ],
    );
    assert_sane(&v);
    assert_eq!(v["mode"], "open");
    // 500 due in the measured second, every one sent and answered (none late beyond the
    // time-out), and the run did not stretch much past warm-up + duration.
    assert_eq!(count(&v, "requests"), 500, "{v}");
    assert_eq!(count(&v, "ok"), 500, "rate not kept: {v}");
    let rps = v["requests_per_sec"].as_f64().expect("requests_per_sec");
    assert!((rps - 500.0).abs() < 1.0, "{v}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}: {v}");
    let service = &v["service_time_us"];
    assert!(service["p50"].as_f64().is_some_and(|p| p > 0.0), "{v}");
}

#[test]
fn bad_options_fail_with_a_message() {
    let out = sluice()
        .args(["bench", "--target", "http://127.0.0.1:1", "--domain", "d"])
        .output()
        .expect("run sluice bench");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--descriptor"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sluice()
        .args(["bench", "--target", "http://127.0.0.1:1", "--domain", "d"])
        .args(["--descriptor", "k=v", "--spread", "other=5"])
        .output()
        .expect("run sluice bench");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no entry of the request has this key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The threads of a process named `sluice-worker` (the serving runtime's workers), once two
/// readings 100 ms apart agree: a thread that a worker has just started carries its creator's
/// name until it sets its own (`sluice-blocking` for the blocking pool's), which is what a
/// single reading may catch.
fn workers(served: &Served) -> usize {
    let count = || {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", served.0.id())).expect("/proc");
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "sluice-worker")
            .count()
    };
    let mut last = count();
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = count();
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the worker threads' count never settled (last {last})")
}

#[test]
fn worker_threads_are_set_for_sluice_and_the_noop_server_alike() {
    let rules = Path::new(RULES);
    let (sluice, url) = sluice_server_with(rules, &[("SLUICE_SERVER__WORKER_THREADS", "3")]);
    // By default one per CPU; tokio's own variable, which panics tokio on a bad value, plays
    // no part.
    let (default, _) = sluice_server_with(rules, &[("TOKIO_WORKER_THREADS", "not a number")]);
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(workers(&default), cpus);
    let (noop, addr) = noop(&["--threads", "1"]);
    assert_eq!(workers(&sluice), 3);
    assert_eq!(workers(&noop), 1);
    // Both still serve.
    for target in [url, format!("http://{addr}")] {
        let v = bench(&target, &["--domain", "bench", "--descriptor", "user=x"]);
        assert_sane(&v);
        assert_eq!(count(&v, "ok"), count(&v, "requests"), "{v}");
    }
}
