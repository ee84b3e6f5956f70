//! Chaos under load, bounded in time (about 40 s): a real `sluice serve` on a real
//! `redis-server` (`on_error = "local"`) takes `sluice bench` load and the test's own clients
//! while Redis is killed and restarted, SIGHUP reloads alternate good rules (which flip a
//! limit between "never" and "always") and broken ones, and connections are opened and
//! dropped. Afterwards: the process is alive and ready, its RSS is back near its start, every
//! answer was the one the rules active at that moment give (whether Redis or the local
//! fallback decided), and the clients' counts add up to the metrics. docs/robustness.md.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice::testing::grpc::*;
use sluice::testing::http::{get, sample};
use sluice::testing::process::*;
use sluice::testing::redis::RedisServer;
use tokio::io::AsyncWriteExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A quota that never denies (a cost of 1 per request against a burst of a billion).
const ALWAYS: u32 = 1_000_000_000;
/// Good rules, then broken ones, this many times each.
const CYCLES: usize = 8;
const MIB: f64 = 1024.0 * 1024.0;
/// RSS after the chaos may exceed the RSS under load before it by this much at most
/// (docs/robustness.md): allocator caches and the few buffers of a busier moment.
const RSS_TOLERANCE: f64 = 16.0 * MIB;
/// Connections of `sluice bench` (its requests in flight at its end may go uncounted by it).
const BENCH_CONCURRENCY: u64 = 4;

/// The quota of `flip` in generation `g` of the rules: 0 (always denied) or ALWAYS.
fn flip_quota(generation: usize) -> u32 {
    if generation.is_multiple_of(2) {
        0
    } else {
        ALWAYS
    }
}

/// Generation `g` of the rules: `flip` named `gen-<g>` with its quota; the others never change.
fn good_rules(generation: usize) -> String {
    format!(
        "domain: chaos
descriptors:
  - key: flip
    rate_limit: {{unit: second, requests_per_unit: {}, name: gen-{generation}}}
  - key: open
    rate_limit: {{unit: second, requests_per_unit: {ALWAYS}}}
  - key: blocked
    rate_limit: {{unit: second, requests_per_unit: 0}}
  - key: free
    rate_limit: {{unlimited: true}}
---
domain: bench
descriptors:
  - key: user
    rate_limit: {{unit: second, requests_per_unit: {ALWAYS}}}
",
        flip_quota(generation)
    )
}

/// Rules that fail to load, in turn: a YAML error, an unknown key, an unknown unit.
fn broken_rules(n: usize) -> String {
    let broken = [
        "domain: chaos\ndescriptors: [\n",
        "domain: chaos\ndescriptors:\n  - key: flip\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
        "domain: chaos\ndescriptors:\n  - key: flip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    ];
    broken[n % broken.len()].to_owned()
}

/// The descriptors the test's clients send, in turn.
const KINDS: [&str; 4] = ["flip", "open", "blocked", "free"];

/// One answered (or failed) request of the test's clients.
#[derive(Debug, Clone)]
struct Answer {
    kind: &'static str,
    sent: Instant,
    received: Instant,
    /// `(code, current_limit (requests_per_unit, name))`, or the gRPC error.
    result: Result<(Code, Option<(u32, String)>), String>,
}

type Answers = Arc<Mutex<Vec<Answer>>>;

async fn ask(c: &mut Client, kind: &'static str, answers: &Answers) {
    let sent = Instant::now();
    let result = c
        .should_rate_limit(req("chaos", vec![desc(&[(kind, "v")])]))
        .await
        .map(|r| {
            let r = r.into_inner();
            let status = &r.statuses[0];
            assert_eq!(overall(&r), code(status), "{r:?}");
            let limit = limit_of(status).map(|(rpu, _, name)| (rpu, name));
            (code(status), limit)
        })
        .map_err(|s| s.to_string());
    let received = Instant::now();
    answers.lock().push(Answer {
        kind,
        sent,
        received,
        result,
    });
}

/// The test's own load: `clients` steady clients, and one that churns connections (a new
/// client every few requests, and raw TCP connections dropped half-way through the HTTP/2
/// preface). Returns the churned connections' count when stopped.
fn start_load(
    url: &str,
    clients: usize,
    answers: &Answers,
    stop: &CancellationToken,
) -> tokio::task::JoinSet<usize> {
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..clients {
        let (url, answers, stop) = (url.to_owned(), answers.clone(), stop.clone());
        tasks.spawn(async move {
            let mut c = connect_within(&url, Duration::from_secs(10)).await;
            for i in n.. {
                if stop.is_cancelled() {
                    break;
                }
                ask(&mut c, KINDS[i % KINDS.len()], &answers).await;
            }
            0
        });
    }
    let (url, answers, stop) = (url.to_owned(), answers.clone(), stop.clone());
    tasks.spawn(async move {
        let addr = url.trim_start_matches("http://").to_owned();
        let mut churned = 0;
        for i in 0.. {
            if stop.is_cancelled() {
                break;
            }
            let mut c = connect_within(&url, Duration::from_secs(10)).await;
            for kind in KINDS.iter().cycle().skip(i).take(3) {
                ask(&mut c, kind, &answers).await;
            }
            drop(c);
            if let Ok(mut raw) = tokio::net::TcpStream::connect(&addr).await {
                let _ = raw.write_all(b"PRI * HTTP/2.0\r\n").await;
            }
            churned += 2;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        churned
    });
    tasks
}

/// When each generation of the rules was signalled and when the test saw it active.
#[derive(Debug, Default)]
struct Timeline {
    /// Per generation: (SIGHUP sent, seen active).
    generations: Vec<(Instant, Instant)>,
}

impl Timeline {
    /// Whether an answer of generation `g` fits: received after its SIGHUP, and sent before
    /// the next generation was seen active.
    fn allows(&self, g: usize, a: &Answer) -> bool {
        let Some(&(signalled, _)) = self.generations.get(g) else {
            return false;
        };
        let superseded = self.generations.get(g + 1).map(|&(_, seen)| seen);
        a.received >= signalled && superseded.is_none_or(|seen| a.sent <= seen)
    }
}

/// What is wrong with an answer under the rules of the timeline, if anything.
fn wrong(a: &Answer, timeline: &Timeline) -> Option<String> {
    let (code, limit) = match &a.result {
        Ok(r) => r.clone(),
        Err(e) => return Some(format!("an error: {e}")),
    };
    let expected = match (a.kind, &limit) {
        ("open", Some((ALWAYS, _))) => Code::Ok,
        ("blocked", Some((0, _))) => Code::OverLimit,
        ("free", None) => Code::Ok,
        ("flip", Some((quota, name))) => {
            let Some(g) = name.strip_prefix("gen-").and_then(|g| g.parse().ok()) else {
                return Some(format!("not a generation's name: {name}"));
            };
            if *quota != flip_quota(g) || !timeline.allows(g, a) {
                return Some(format!("generation {g} was not active"));
            }
            if *quota == 0 {
                Code::OverLimit
            } else {
                Code::Ok
            }
        }
        _ => return Some(format!("not the rules' limit: {limit:?}")),
    };
    (code != expected).then(|| format!("{code:?}, expected {expected:?}"))
}

async fn metrics(admin: SocketAddr) -> String {
    get(admin, "/metrics").await.body
}

async fn metric(admin: SocketAddr, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(&metrics(admin).await, name, labels).unwrap_or(0.0)
}

/// Polls `check` every 50 ms for up to 15 s (a loaded machine); fails after.
async fn within<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "not within 15 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sighup(sluice: &SluiceProcess) {
    let status = Command::new("kill")
        .args(["-HUP", &sluice.pid().to_string()])
        .status()
        .expect("run kill (procps)");
    assert!(status.success(), "kill -HUP failed");
}

/// Writes generation `g` of the rules, signals, and waits until it answers.
async fn reload_good(sluice: &SluiceProcess, rules: &Path, g: usize, timeline: &mut Timeline) {
    std::fs::write(rules, good_rules(g)).expect("write the rules");
    let signalled = Instant::now();
    sighup(sluice);
    let version = (g + 1) as f64;
    within(&format!("generation {g} active"), || async {
        metric(sluice.admin(), "sluice_config_version", &[]).await == version
    })
    .await;
    timeline.generations.push((signalled, Instant::now()));
}

/// Writes broken rules, signals, and waits until the failed reload is counted.
async fn reload_broken(sluice: &SluiceProcess, rules: &Path, n: usize) {
    std::fs::write(rules, broken_rules(n)).expect("write the rules");
    sighup(sluice);
    let failures = [("outcome", "failure")];
    within("the failed reload counted", || async {
        metric(sluice.admin(), "sluice_config_reloads_total", &failures).await == (n + 1) as f64
    })
    .await;
}

/// `sluice bench` on domain `bench` for `secs`, in the background.
fn start_bench(url: &str, secs: u64) -> std::process::Child {
    sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "--target", url, "--json", "--quiet"])
        .args(["--warmup", "0s", "--duration", &format!("{secs}s")])
        .args([
            "--domain",
            "bench",
            "--descriptor",
            "user=x",
            "--spread",
            "user=100000",
        ])
        .args(["--connections", "2", "--threads", "1", "--concurrency"])
        .arg(BENCH_CONCURRENCY.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start sluice bench")
}

/// Waits for `sluice bench` to finish; its JSON result.
fn bench_result(mut bench: Served) -> serde_json::Value {
    let mut out = String::new();
    let stdout = bench.0.stdout.take().expect("bench's stdout");
    std::io::Read::read_to_string(&mut { stdout }, &mut out).expect("read bench's output");
    let status = bench.0.wait().expect("sluice bench ran");
    assert!(status.success(), "sluice bench failed: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Client counts per kind: (ok, over limit, errors).
fn tally(answers: &[Answer]) -> HashMap<&'static str, [u64; 3]> {
    let mut counts: HashMap<&'static str, [u64; 3]> = HashMap::new();
    for a in answers {
        let slot = match a.result {
            Ok((Code::Ok, _)) => 0,
            Ok(_) => 1,
            Err(_) => 2,
        };
        counts.entry(a.kind).or_default()[slot] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_under_load_keeps_answers_right_and_memory_bounded() {
    let started = Instant::now();
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, good_rules(0)).expect("write the rules");
    let env = [
        ("SLUICE_REDIS__ON_ERROR", "local"),
        ("SLUICE_REDIS__BREAKER_COOLDOWN_MS", "200"),
        ("SLUICE_RELOAD__WATCH", "false"),
        ("SLUICE_MEMORY__SWEEP_INTERVAL_SECS", "1"),
    ];
    let mut sluice =
        SluiceProcess::over_redis(env!("CARGO_BIN_EXE_sluice"), &rules, &redis.url(), &env);
    let (pid, admin) = (sluice.pid(), sluice.admin());
    within("ready", || async {
        get(admin, "/readyz").await.status == 200
    })
    .await;
    let mut timeline = Timeline::default();
    timeline.generations.push((started, Instant::now()));

    // Load, and its steady state before any chaos.
    let answers: Answers = Arc::default();
    let stop = CancellationToken::new();
    let bench = Served(start_bench(&sluice.url(), 30));
    let mut load = start_load(&sluice.url(), 3, &answers, &stop);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_start = rss(pid);

    // The chaos: every cycle a good reload and a broken one; Redis down every other cycle.
    for cycle in 0..CYCLES {
        reload_good(&sluice, &rules, cycle + 1, &mut timeline).await;
        if cycle.is_multiple_of(2) {
            tokio::task::block_in_place(|| redis.kill());
        } else {
            tokio::task::block_in_place(|| redis.restart());
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        reload_broken(&sluice, &rules, cycle).await;
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    let rss_under_chaos = rss(pid);
    stop.cancel();
    let mut churned = 0;
    while let Some(done) = load.join_next().await {
        churned += done.expect("a load task");
    }
    let bench = tokio::task::block_in_place(|| bench_result(bench));

    // Alive, ready again, and back to Redis.
    assert!(sluice.exited().is_none(), "sluice exited");
    assert_eq!(get(admin, "/healthz").await.status, 200);
    within("ready after the chaos", || async {
        get(admin, "/readyz").await.status == 200
    })
    .await;
    redis.reset_stats();
    let mut c = connect_within(&sluice.url(), Duration::from_secs(10)).await;
    let after = Arc::default();
    ask(&mut c, "open", &after).await;
    ask(&mut c, "flip", &after).await;
    let back = Instant::now();
    while redis.script_calls() == 0 {
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "Redis never decided again"
        );
        ask(&mut c, "open", &after).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answers = {
        let mut all = answers.lock().clone();
        all.extend(after.lock().iter().cloned());
        all
    };

    // Every answer right for the rules active when it was given.
    let wrong: Vec<String> = answers
        .iter()
        .filter_map(|a| wrong(a, &timeline).map(|w| format!("{w}: {a:?}")))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} wrong answers, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );

    // Counters add up.
    let text = metrics(admin).await;
    let counts = tally(&answers);
    let rule = |name: &str, rule: &str| {
        let labels = [("domain", "chaos"), ("rule", rule)];
        sample(&text, &format!("sluice_rule_{name}_total"), &labels).unwrap_or(0.0) as u64
    };
    for kind in ["flip", "open", "blocked"] {
        let [ok, over, errors] = counts.get(kind).copied().unwrap_or_default();
        assert_eq!(errors, 0, "{kind}");
        assert_eq!(rule("hits", kind), ok + over, "{kind}");
        assert_eq!(rule("within_limit", kind), ok, "{kind}");
        assert_eq!(rule("over_limit", kind), over, "{kind}");
    }
    let field = |f: &str| {
        bench[f]
            .as_u64()
            .unwrap_or_else(|| panic!("no {f} in {bench}"))
    };
    assert_eq!(field("errors"), 0, "{bench}");
    assert_eq!(field("over_limit"), 0, "{bench}");
    let bench_hits = sample(
        &text,
        "sluice_rule_hits_total",
        &[("domain", "bench"), ("rule", "user")],
    )
    .unwrap_or(0.0) as u64;
    let bench_ok = field("ok");
    // bench counts what completed within its window; the last requests in flight may not be.
    assert!(
        (bench_ok..=bench_ok + BENCH_CONCURRENCY).contains(&bench_hits),
        "bench saw {bench_ok} OK, sluice counted {bench_hits}"
    );
    let client_ok: u64 = counts.values().map(|c| c[0]).sum();
    let client_over: u64 = counts.values().map(|c| c[1]).sum();
    let requests = |result: &str| {
        sample(&text, "sluice_requests_total", &[("result", result)]).unwrap_or(0.0) as u64
    };
    assert_eq!(requests("ok"), client_ok + bench_hits, "{text}");
    assert_eq!(requests("over_limit"), client_over, "{text}");
    assert_eq!(requests("invalid") + requests("unavailable"), 0, "{text}");
    let events = |event: &str| {
        sample(
            &text,
            "sluice_backend_events_total",
            &[("backend", "redis"), ("event", event)],
        )
        .unwrap_or(0.0) as u64
    };
    assert!(events("fallback") > 0, "Redis was down under load: {text}");
    let reloads = |outcome: &str| {
        sample(
            &text,
            "sluice_config_reloads_total",
            &[("outcome", outcome)],
        )
        .unwrap_or(0.0) as u64
    };
    assert_eq!(
        (reloads("success"), reloads("failure")),
        (CYCLES as u64, CYCLES as u64)
    );

    // Memory back near its start once the load is gone and the sweeps ran.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_end = rss(pid);
    let keys = metric(admin, "sluice_memory_keys", &[]).await;
    eprintln!(
        "chaos: {:?} in all; {} client answers ({counts:?}), bench {bench_ok} OK, {churned} \
         connections churned, {CYCLES} good and {CYCLES} broken reloads, Redis killed {} times, \
         {} answers from the local fallback; RSS {:.1} MiB before, {:.1} MiB during, {:.1} MiB \
         after; {keys} keys held after",
        started.elapsed(),
        answers.len(),
        CYCLES.div_ceil(2),
        events("fallback"),
        rss_start as f64 / MIB,
        rss_under_chaos as f64 / MIB,
        rss_end as f64 / MIB,
    );
    assert!(churned > 20, "connections churned: {churned}");
    assert!(
        rss_end as f64 <= rss_start as f64 + RSS_TOLERANCE,
        "RSS {rss_end} bytes after, {rss_start} before"
    );
    assert!(keys <= 100.0, "{keys} keys still held");
}
