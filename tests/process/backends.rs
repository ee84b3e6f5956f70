//! The binary started as `ratelimit` on envoyproxy/ratelimit's other stores: per-second
//! limits in a Redis of their own (`REDIS_PERSECOND=true`, two real `redis-server`s), and
//! Memcached (`BACKEND_TYPE=memcache`, a real `memcached` shared by two replicas), each
//! answering request for request as the same rules on one Redis do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice::testing::dns::SrvServer;
use sluice::testing::grpc::*;
use sluice::testing::http::try_get;
use sluice::testing::memcached::MemcachedServer;
use sluice::testing::process::{Served, loopback, serving, sluice_command};
use sluice::testing::redis::RedisServer;
use tokio::time::Instant;

/// The shared semantics rules, less what fixed windows cannot take (`burst`, `borrow`,
/// other algorithms): what envoyproxy/ratelimit's own rules can say.
fn fixed_window_rules() -> String {
    let all = include_str!("../fixtures/semantics.yaml");
    let dropped = ["bursty", "borrow", "bucket", "sliding", "log"];
    let mut out = String::new();
    let mut keep = true;
    for line in all.lines() {
        if let Some(key) = line.strip_prefix("  - key: ") {
            keep = !dropped.contains(&key.trim());
        } else if !line.starts_with("    ") && !line.starts_with("  #") {
            keep = true;
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A `ratelimit` (the sluice binary through a symlink of that name) with `env` and the
/// rules `rules` in its runtime directory, on loopback ports from the kernel; killed when dropped.
struct Ratelimit {
    grpc: u16,
    http: u16,
    _process: Served,
}

impl Ratelimit {
    async fn start(dir: &Path, name: &str, rules: &str, env: &[(&str, String)]) -> Ratelimit {
        let rl = Ratelimit::spawn(dir, name, rules, env);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = try_get(loopback(rl.http), "/healthcheck").await;
            if answer.as_ref().is_some_and(|a| a.status == 200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: /healthcheck: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rl
    }

    /// Started and listening, ready or not.
    fn spawn(dir: &Path, name: &str, rules: &str, env: &[(&str, String)]) -> Ratelimit {
        let home = dir.join(name);
        let config = home.join("data/ratelimit/config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("rules.yaml"), rules).unwrap();
        let link = home.join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).unwrap();
        let mut vars: HashMap<String, String> = [
            ("RUNTIME_ROOT", home.join("data").display().to_string()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
            ("USE_STATSD", "false".to_owned()),
            // Its listeners on ports from the kernel, which its log (`info`) names.
            ("LOG_LEVEL", "info".to_owned()),
            ("GRPC_HOST", "127.0.0.1".to_owned()),
            ("GRPC_PORT", "0".to_owned()),
            ("HOST", "127.0.0.1".to_owned()),
            ("PORT", "0".to_owned()),
            ("DEBUG_HOST", "127.0.0.1".to_owned()),
            ("DEBUG_PORT", "0".to_owned()),
            // Long enough that a loaded test machine never turns these behaviour tests into
            // latency tests.
            ("SLUICE_REDIS__TIMEOUT_MS", "5000".to_owned()),
            ("SLUICE_MEMCACHE__TIMEOUT_MS", "5000".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        let mut child = Command::new(&link)
            .env_clear()
            .envs(&vars)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ratelimit");
        let [grpc, http] = serving(&mut child, ["gRPC", "admin HTTP"]);
        let process = Served(child);
        Ratelimit {
            grpc: grpc.port(),
            http: http.port(),
            _process: process,
        }
    }

    async fn client(&self) -> Client {
        let url = format!("http://{}", loopback(self.grpc));
        connect_within(&url, Duration::from_secs(10)).await
    }
}

/// What a client sees of an answer: the overall code, and per descriptor its code, limit,
/// remaining and reset in seconds.
type Seen = (
    i32,
    Vec<(i32, Option<(u32, i32, String)>, u32, Option<i64>)>,
);

fn seen(r: &RateLimitResponse) -> Seen {
    let statuses = r
        .statuses
        .iter()
        .map(|s| {
            let limit = s
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit, l.name.clone()));
            (s.code, limit, s.limit_remaining, reset_secs(s))
        })
        .collect();
    (r.overall_code, statuses)
}

/// Whether two answers agree, the resets within a second (the two calls are apart in time,
/// and a reset is whole seconds).
fn agree(a: &Seen, b: &Seen) -> bool {
    a.0 == b.0
        && a.1.len() == b.1.len()
        && a.1.iter().zip(&b.1).all(|(x, y)| {
            x.0 == y.0
                && x.1 == y.1
                && x.2 == y.2
                && match (x.3, y.3) {
                    (Some(p), Some(q)) => (p - q).abs() <= 1,
                    (p, q) => p == q,
                }
        })
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Waits until the wall clock is at least `margin` away from the end of its `window`.
async fn clear_of_window_end(window: Duration, margin: Duration) {
    let into = unix_nanos() % window.as_nanos();
    let left = window.as_nanos() - into;
    if left < margin.as_nanos() {
        let wait = u64::try_from(left).unwrap_or(0) + 50_000_000;
        tokio::time::sleep(Duration::from_nanos(wait)).await;
    }
}

/// Waits for the start of the next wall-clock second.
async fn next_second() {
    let into = unix_nanos() % 1_000_000_000;
    let wait = u64::try_from(1_000_000_000 - into).unwrap_or(0) + 5_000_000;
    tokio::time::sleep(Duration::from_nanos(wait)).await;
}

/// The requests of the shared semantics cases that fixed windows answer: each case's
/// requests in order (tests/redis/semantics.rs), `tag` making its values fresh.
fn fixed_window_cases(tag: &str) -> Vec<RateLimitRequest> {
    let v = |s: &str| format!("{s}-{tag}");
    let one = |k: &str, val: &str| req("test", vec![desc(&[(k, &v(val))])]);
    let mut steps = Vec::new();
    // Within, then over the limit; a key-only rule gives each value its own state.
    steps.extend([one("one_per_minute", "a"), one("one_per_minute", "a")]);
    steps.extend([one("one_per_minute", "b"), one("one_per_minute", "a")]);
    // Unknown domain, no match, unlimited.
    steps.push(req("nope", vec![desc(&[("one_per_minute", "a")])]));
    steps.push(req("test", vec![desc(&[("no_such_key", "a")])]));
    steps.push(one("path", "/healthz"));
    steps.push(req("test", vec![desc(&[("path", "/healthz")])]));
    // A share threshold: matching values share one state.
    for f in ["files/a", "files/b", "files/c"] {
        steps.push(req("test", vec![desc(&[("shared", f)])]));
    }
    // A denied request consumes nothing anywhere.
    let both = || {
        let (y, x) = (v("y"), v("x"));
        each(&[("one_per_minute", y.as_str()), ("five_minutes", x.as_str())])
    };
    steps.extend([both(), both(), one("five_minutes", "x")]);
    // Cost precedence and check-only.
    let mut r = one("five_minutes", "c");
    r.hits_addend = 2;
    steps.push(r);
    let mut r = costing("five_minutes", &v("c"), 1);
    r.hits_addend = 4;
    steps.push(r);
    steps.extend((0..3).map(|_| costing("five_minutes", &v("c"), 0)));
    // Refunds give back, never below empty.
    steps.extend([one("five_minutes", "r"), one("five_minutes", "r")]);
    steps.push(refund("five_minutes", &v("r"), 1));
    steps.push(refund("five_minutes", &v("r"), 1_000));
    // A limit override in the request.
    let d = overridden(
        desc(&[("one_per_minute", &v("ov"))]),
        3,
        RateLimitUnit::Hour,
    );
    steps.extend((0..4).map(|_| req("test", vec![d.clone()])));
    // `replaces` drops the named limit.
    let gv = || {
        let (g, vip) = (v("g"), v("v"));
        each(&[("general", g.as_str()), ("vip", vip.as_str())])
    };
    steps.extend([gv(), gv(), gv(), one("general", "g"), one("general", "g")]);
    // A zero quota blocks every request with a cost, not a check.
    steps.extend([one("blocked", "x"), costing("blocked", &v("x"), 0)]);
    // Shadow rules are counted but never block.
    steps.extend([one("shadow", "x"), one("shadow", "x")]);
    let (sx, ss) = (v("x"), v("s"));
    steps.push(each(&[
        ("shadow", sx.as_str()),
        ("one_per_minute", ss.as_str()),
    ]));
    steps.push(one("one_per_minute", "s"));
    // Quota mode denies only when every quota descriptor is over.
    let (qa, qb) = (v("q"), v("q"));
    let quota = || each(&[("quota_a", qa.as_str()), ("quota_b", qb.as_str())]);
    steps.extend([one("quota_a", "q"), one("quota_a", "q"), quota(), quota()]);
    // `charge: always` charges denied costs.
    steps.extend([
        costing("tokens", &v("t"), 150),
        costing("tokens", &v("t"), 0),
    ]);
    // Statuses follow the request's order; nested descriptors.
    let (o, admin) = (v("o"), v("u"));
    steps.push(each(&[
        ("path", "/healthz"),
        ("nothing", "here"),
        ("one_per_minute", o.as_str()),
    ]));
    let nested = req(
        "test",
        vec![desc(&[("user", admin.as_str()), ("route", "/admin")])],
    );
    steps.extend((0..6).map(|_| nested.clone()));
    // Values Memcached cannot take in a key as they are: spaces, control characters, and
    // one long enough to pass its 250 bytes.
    let long = "l".repeat(300);
    for value in ["sp ace\n%", "sp ace\n%", long.as_str(), long.as_str()] {
        steps.push(one("one_per_minute", value));
    }
    steps
}

/// The per-second cases: `multi` (2 a second and 3 a minute on one descriptor), and a
/// per-second and a per-minute descriptor in one request.
fn per_second_cases(tag: &str) -> Vec<RateLimitRequest> {
    let x = format!("x-{tag}");
    let multi = req("test", vec![desc(&[("multi", x.as_str())])]);
    let pair = each(&[
        ("two_per_second", x.as_str()),
        ("one_per_minute", x.as_str()),
    ]);
    let minute = req("test", vec![desc(&[("one_per_minute", x.as_str())])]);
    vec![
        multi.clone(),
        multi.clone(),
        multi,
        pair.clone(),
        pair.clone(),
        pair,
        minute,
    ]
}

/// Sends each of `steps` to `reference` and then to `subjects` in turn, and asserts the
/// answers agree; `false` when a second of the wall clock ended during them (per-second
/// windows would then differ) and `strict_second` asks for one second.
async fn compare(
    reference: &mut Client,
    subjects: &mut [Client],
    steps: &[RateLimitRequest],
    strict_second: bool,
) -> bool {
    let second = unix_nanos() / 1_000_000_000;
    let mut answers = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let want = call(reference, step.clone()).await;
        let n = subjects.len();
        let got = call(&mut subjects[i % n], step.clone()).await;
        answers.push((i, seen(&want), seen(&got)));
    }
    if strict_second && unix_nanos() / 1_000_000_000 != second {
        return false;
    }
    let over = i32::from(Code::OverLimit);
    assert!(
        answers.iter().any(|(_, want, _)| want.0 == over),
        "the cases reach a limit (the rules are served)"
    );
    for (i, want, got) in answers {
        assert!(
            agree(&want, &got),
            "step {i}: {:?}\nwant {want:?}\ngot  {got:?}",
            steps[i]
        );
    }
    true
}

/// Runs `cases` (fresh values each try) within one second of the wall clock: up to five
/// tries, each from the start of a second.
async fn compare_within_a_second(
    reference: &mut Client,
    subjects: &mut [Client],
    cases: impl Fn(&str) -> Vec<RateLimitRequest>,
) {
    for attempt in 0..5 {
        next_second().await;
        if compare(reference, subjects, &cases(&format!("s{attempt}")), true).await {
            return;
        }
    }
    panic!("no try fitted in one second of the wall clock");
}

/// Every key of a Redis (`SCAN`).
fn scan(redis: &RedisServer) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let (next, page): (String, Vec<String>) =
            redis.cmd(&["SCAN", &cursor, "MATCH", "*", "COUNT", "1000"]);
        keys.extend(page);
        if next == "0" {
            return keys;
        }
        cursor = next;
    }
}

fn redis_env(redis: &RedisServer) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", redis.addr()),
    ]
}

/// envoyproxy/ratelimit's counting (every cost kept, denied or not), then sluice's all or
/// nothing (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`: a denied request keeps nothing,
/// so what was taken is given back).
const COUNTINGS: [&[(&str, &str)]; 2] =
    [&[], &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")]];

fn with(
    env: &[(&'static str, String)],
    counting: &[(&'static str, &'static str)],
) -> Vec<(&'static str, String)> {
    let mut out = env.to_vec();
    out.extend(counting.iter().map(|(k, v)| (*k, (*v).to_owned())));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_second_limits_live_in_their_own_redis_and_answers_do_not_change() {
    let dir = tempfile::tempdir().unwrap();
    let rules = fixed_window_rules();
    for (n, counting) in COUNTINGS.into_iter().enumerate() {
        let (plain, main, second) = (
            RedisServer::start(),
            RedisServer::start(),
            RedisServer::start(),
        );
        let env = with(&redis_env(&plain), counting);
        let reference = Ratelimit::start(dir.path(), &format!("one{n}"), &rules, &env).await;
        let mut env = with(&redis_env(&main), counting);
        env.extend([
            ("REDIS_PERSECOND", "true".to_owned()),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_PERSECOND_URL", second.addr()),
        ]);
        let split = Ratelimit::start(dir.path(), &format!("split{n}"), &rules, &env).await;
        let mut want = reference.client().await;
        let mut got = [split.client().await];
        clear_of_window_end(Duration::from_secs(60), Duration::from_secs(10)).await;
        compare_within_a_second(&mut want, &mut got, per_second_cases).await;
        compare(&mut want, &mut got, &fixed_window_cases("ps"), false).await;

        let (slow, fast) = (scan(&main), scan(&second));
        assert!(!fast.is_empty() && !slow.is_empty(), "{slow:?} {fast:?}");
        for key in &fast {
            assert!(
                key.contains("multi") || key.contains("two_per_second"),
                "{key}"
            );
        }
        for key in &slow {
            assert!(
                !key.contains("two_per_second"),
                "a per-second key in the main Redis: {key}"
            );
        }
        assert!(
            slow.iter().any(|k| k.contains("multi")),
            "multi's per-minute limit: {slow:?}"
        );
        assert!(
            slow.iter().any(|k| k.contains("one_per_minute")),
            "{slow:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_answers_the_fixed_window_cases_as_redis_across_two_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let rules = fixed_window_rules();
    for (n, counting) in COUNTINGS.into_iter().enumerate() {
        let (redis, memcached) = (RedisServer::start(), MemcachedServer::start());
        let env = with(&redis_env(&redis), counting);
        let reference = Ratelimit::start(dir.path(), &format!("redis{n}"), &rules, &env).await;
        let env = with(
            &[
                ("BACKEND_TYPE", "memcache".to_owned()),
                ("MEMCACHE_HOST_PORT", memcached.addr()),
            ],
            counting,
        );
        let a = Ratelimit::start(dir.path(), &format!("a{n}"), &rules, &env).await;
        let b = Ratelimit::start(dir.path(), &format!("b{n}"), &rules, &env).await;
        let mut want = reference.client().await;
        let mut replicas = [a.client().await, b.client().await];
        clear_of_window_end(Duration::from_secs(60), Duration::from_secs(10)).await;
        compare_within_a_second(&mut want, &mut replicas, per_second_cases).await;
        compare(&mut want, &mut replicas, &fixed_window_cases("mc"), false).await;
        let keys = memcached.keys();
        assert!(
            keys.iter().any(|k| k.contains("one_per_minute")),
            "the counters live in memcached: {keys:?}"
        );
    }
}

/// `MEMCACHE_SRV`: the servers are the SRV record's targets, asked of a DNS server here
/// (`memcache.srv_resolver`); `MEMCACHE_SRV_REFRESH` follows the record when it changes to
/// another memcached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcache_srv_finds_its_servers_and_follows_the_record() {
    const NAME: &str = "_memcache._tcp.mc.sluice.test";
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (MemcachedServer::start(), MemcachedServer::start());
    let dns = SrvServer::start(NAME, &[("localhost", first.port)]).await;
    let env = [
        ("BACKEND_TYPE", "memcache".to_owned()),
        ("MEMCACHE_SRV", NAME.to_owned()),
        ("MEMCACHE_SRV_REFRESH", "100ms".to_owned()),
        ("SLUICE_MEMCACHE__SRV_RESOLVER", dns.addr()),
    ];
    let rules = fixed_window_rules();
    let rl = Ratelimit::start(dir.path(), "srv", &rules, &env).await;
    let mut client = rl.client().await;
    clear_of_window_end(Duration::from_secs(60), Duration::from_secs(10)).await;
    let one = |value: &str| req("test", vec![desc(&[("one_per_minute", value)])]);
    assert_eq!(overall(&call(&mut client, one("a")).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, one("a")).await), Code::OverLimit);
    let keys = first.keys();
    assert!(
        keys.iter().any(|k| k.contains("one_per_minute")),
        "the SRV target holds the counters: {keys:?}"
    );
    assert!(second.keys().is_empty());

    // The record now names the other memcached: new counters go there.
    dns.set(vec![("localhost".to_owned(), second.port)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while !second.keys().iter().any(|k| k.contains("one_per_minute")) {
        assert!(
            Instant::now() < deadline,
            "the refresh never moved to the second server"
        );
        n += 1;
        call(&mut client, one(&format!("probe{n}"))).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // `a` is counted afresh there, as envoyproxy/ratelimit's does after a server change.
    assert_eq!(overall(&call(&mut client, one("a")).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, one("a")).await), Code::OverLimit);

    // A record with no target keeps the servers in use.
    dns.set(Vec::new());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = second.keys().len();
    assert_eq!(overall(&call(&mut client, one("b")).await), Code::Ok);
    assert_eq!(second.keys().len(), before + 1, "{:?}", second.keys());
}

/// A CA, and a leaf of it for `names`, in `dir`: (CA file, leaf certificate, leaf key).
fn tls_files(dir: &Path, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    (
        write("ca.crt", &ca.pem()),
        write("memcached.crt", &leaf.pem()),
        write("memcached.key", &key.serialize_pem()),
    )
}

/// `MEMCACHE_TLS` with `MEMCACHE_TLS_CACERT`: a real memcached speaking only TLS (`-Z`) with
/// a certificate for `localhost` keeps the counters. Reached as 127.0.0.1 (a name the
/// certificate lacks) it is refused, unless `MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION` (with
/// the CA file, or without it against the system's roots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcache_tls_reaches_a_tls_memcached_and_checks_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_files(dir.path(), &["localhost"]);
    let memcached = MemcachedServer::start_tls(&cert, &key);
    let rules = fixed_window_rules();
    let env = |host: &str, more: &[(&'static str, &str)]| {
        let mut env = vec![
            ("BACKEND_TYPE", "memcache".to_owned()),
            ("MEMCACHE_HOST_PORT", format!("{host}:{}", memcached.port)),
            ("MEMCACHE_TLS", "true".to_owned()),
            ("MEMCACHE_TLS_CACERT", ca.display().to_string()),
        ];
        env.extend(more.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    };
    let one = |value: &str| req("test", vec![desc(&[("one_per_minute", value)])]);
    clear_of_window_end(Duration::from_secs(60), Duration::from_secs(10)).await;

    let rl = Ratelimit::start(dir.path(), "tls", &rules, &env("localhost", &[])).await;
    let mut client = rl.client().await;
    assert_eq!(overall(&call(&mut client, one("a")).await), Code::Ok);
    assert_eq!(overall(&call(&mut client, one("a")).await), Code::OverLimit);
    let keys = memcached.keys();
    assert!(
        keys.iter().any(|k| k.contains("one_per_minute")),
        "{keys:?}"
    );

    let skip = [("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "true")];
    let rl = Ratelimit::start(dir.path(), "skip", &rules, &env("127.0.0.1", &skip)).await;
    let mut client = rl.client().await;
    assert_eq!(
        overall(&call(&mut client, one("a")).await),
        Code::OverLimit,
        "the same counter, through the same server"
    );

    // Without MEMCACHE_TLS_CACERT, as envoyproxy/ratelimit takes it: the chain against the
    // system's roots (here the test's CA, through SSL_CERT_FILE), the name not.
    let no_ca: Vec<(&str, String)> = env("127.0.0.1", &skip)
        .into_iter()
        .filter(|(k, _)| *k != "MEMCACHE_TLS_CACERT")
        .chain([("SSL_CERT_FILE", ca.display().to_string())])
        .collect();
    let rl = Ratelimit::start(dir.path(), "skip-no-ca", &rules, &no_ca).await;
    let mut client = rl.client().await;
    assert_eq!(
        overall(&call(&mut client, one("a")).await),
        Code::OverLimit,
        "the same counter, the chain checked against the system's roots"
    );

    let rl = Ratelimit::spawn(dir.path(), "wrong-name", &rules, &env("127.0.0.1", &[]));
    let mut client = rl.client().await;
    let answer = client.should_rate_limit(one("c")).await;
    let status = answer.expect_err("a certificate without the name is refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let health = try_get(loopback(rl.http), "/healthcheck").await;
    assert_ne!(health.map(|h| h.status), Some(200));
}

/// A rules file with another algorithm does not load on the memcache backend: `check`
/// (which validates as `serve` would) fails, naming the file, the line and why.
#[test]
fn other_algorithms_stop_a_memcache_start_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let rules: PathBuf = dir.path().join("rules.yaml");
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      algorithm: sliding_window\n";
    std::fs::write(&rules, text).unwrap();
    let out = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--rules"])
        .arg(&rules)
        .env("SLUICE_LIMITER__BACKEND", "memcache")
        .env("SLUICE_LIMITS__DEFAULT_ALGORITHM", "fixed_window")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}{stderr}");
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("rules.yaml:7"), "{all}");
    assert!(all.contains("memcache backend"), "{all}");
    // A default algorithm of another kind stops it before the rules, naming the setting.
    let out = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--rules"])
        .arg(&rules)
        .env("SLUICE_LIMITER__BACKEND", "memcache")
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{all}");
    assert!(all.contains("limits.default_algorithm is funnel"), "{all}");
}
