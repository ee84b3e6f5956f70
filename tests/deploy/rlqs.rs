//! The Rate Limit Quota Service through a real Envoy 1.40 (`deploy/envoy/rlqs.yaml`, the
//! shipped recipe) and the real `sluice` binary: admitted requests within the bound of
//! docs/rlqs.md, alone, with two Envoys, with the Redis backend and two replicas, and the
//! fallbacks when sluice is gone. (The service in process is in tests/api/rlqs.rs.)

use std::time::Duration;

use sluice::testing::SECOND;
use sluice::testing::http;
use sluice::testing::process::loopback;
use sluice::testing::redis::RedisServer;

use crate::support::envoy::{self, EnvoyProcess, replace_once};
use crate::support::upstream::Upstream;
use crate::support::{deploy_file, start_sluice};

/// An Envoy running `deploy/envoy/rlqs.yaml` on loopback ports.
struct Proxy {
    port: u16,
    envoy: EnvoyProcess,
}

impl Proxy {
    async fn start(upstream: u16, sluice: u16) -> Proxy {
        let mut config = std::fs::read_to_string(deploy_file("rlqs.yaml")).expect("the recipe");
        // Envoy's admin and listener on ports from the kernel, read back once it runs.
        for (from, to) in [
            ("address: 127.0.0.1, port_value: 9901", 0),
            ("address: 0.0.0.0, port_value: 10000", 0),
            ("address: app, port_value: 8000", upstream),
            ("address: sluice, port_value: 8081", sluice),
        ] {
            let to = format!("address: 127.0.0.1, port_value: {to}");
            config = replace_once(&config, from, &to);
        }
        let envoy = EnvoyProcess::start(&config).await;
        Proxy {
            port: envoy.port("ingress"),
            envoy,
        }
    }
}

/// Answers by status over a load run.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    ok: u64,
    denied: u64,
    other: u64,
}

/// `rate` requests per second for `tenant` through `port`, for `secs` seconds; each answer's
/// status with the time it was sent (seconds since the start).
async fn load(port: u16, tenant: &'static str, rate: u64, secs: u64) -> Vec<(f64, u16)> {
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_nanos(SECOND / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..rate * secs {
        tick.tick().await;
        let at = started.elapsed().as_secs_f64();
        sent.spawn(async move {
            let answer = http::get_with(loopback(port), "/", &[("x-tenant", tenant)]).await;
            (at, answer.status)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = sent.join_next().await {
        answers.push(done.expect("a request task"));
    }
    answers.sort_by(|a, b| a.0.total_cmp(&b.0));
    answers
}

fn tally(answers: &[(f64, u16)]) -> Tally {
    let mut t = Tally::default();
    for &(_, status) in answers {
        match status {
            200 => t.ok += 1,
            429 => t.denied += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// The bound of docs/rlqs.md for a limit of `rate` per second and burst `burst` over `secs`
/// seconds, `envoys` Envoys starting together on `replicas` sluice replicas: the rate over
/// the window, the first buckets and their one rebalancing (2 x burst), 3 per Envoy (the
/// request that creates its bucket, and rounding), and, per extra replica, the rate for one
/// report period and a second (5 + 1 s) before the shared state shows the excess.
fn bound(rate: u64, burst: u64, secs: u64, envoys: u64, replicas: u64) -> u64 {
    rate * secs + 2 * burst + 3 * envoys + (replicas - 1) * rate * 6
}

/// Checks a run of `envoys` Envoys at 50/s each on the 10/s bucket for 10 s.
fn assert_within_bound(what: &str, t: Tally, envoys: u64, replicas: u64) {
    let max = bound(10, 10, 10, envoys, replicas);
    eprintln!("{what}: {t:?}, bound {max}");
    assert_eq!(t.other, 0, "{what}: only 200 and 429 expected: {t:?}");
    assert!(
        t.ok <= max,
        "{what}: {} admitted, above the bound {max}",
        t.ok
    );
    // Not starved either: at least 60% of the rate over the run.
    assert!(t.ok >= 60, "{what}: only {} admitted", t.ok);
    assert!(t.denied > 0, "{what}: nothing denied: {t:?}");
}

async fn metric(admin_port: u16, line_start: &str) -> Option<f64> {
    let answer = http::get(loopback(admin_port), "/metrics").await;
    answer
        .body
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// One Envoy: the 10/s tenant within the bound; a tenant with no rule follows
/// no_assignment_behavior (allow all); an unlimited one is allowed.
async fn one_envoy(upstream: u16) {
    let sluice = start_sluice(&deploy_file("rlqs-rules.yaml"), &[]).await;
    let proxy = Proxy::start(upstream, sluice.port).await;
    let (acme, other, internal) = tokio::join!(
        load(proxy.port, "acme", 50, 10),
        load(proxy.port, "other", 20, 10),
        load(proxy.port, "internal", 20, 10),
    );
    assert_within_bound("one Envoy", tally(&acme), 1, 1);
    let other = tally(&other);
    assert_eq!(
        (other.ok, other.denied),
        (200, 0),
        "no rule: allowed, {other:?}"
    );
    let internal = tally(&internal);
    assert_eq!(
        (internal.ok, internal.denied),
        (200, 0),
        "unlimited: {internal:?}"
    );
    // sluice holds acme and internal; "other" got no assignment and holds no state.
    let held = metric(sluice.admin_port, "sluice_rlqs_buckets ").await;
    assert_eq!(
        held,
        Some(2.0),
        "buckets held; Envoy log:\n{}",
        proxy.envoy.log()
    );
    let allowed = metric(
        sluice.admin_port,
        "sluice_rlqs_reported_requests_total{domain=\"edge\",rule=\"tenant_acme\",result=\"allowed\"}",
    )
    .await;
    assert!(
        allowed.is_some_and(|n| n > 0.0),
        "per-rule report counters: {allowed:?}"
    );
}

/// The same load through two Envoys at once: each one's tally, and their sum.
async fn load_both(a: u16, b: u16, label: &str) -> (Tally, Tally, Tally) {
    let (ra, rb) = tokio::join!(load(a, "acme", 50, 10), load(b, "acme", 50, 10));
    let (ta, tb) = (tally(&ra), tally(&rb));
    eprintln!("{label}: {ta:?} {tb:?}");
    let total = Tally {
        ok: ta.ok + tb.ok,
        denied: ta.denied + tb.denied,
        other: ta.other + tb.other,
    };
    (ta, tb, total)
}

/// Two Envoys on one sluice share the bucket: the same bound in total.
async fn two_envoys(upstream: u16) {
    let sluice = start_sluice(&deploy_file("rlqs-rules.yaml"), &[]).await;
    let (a, b) = tokio::join!(
        Proxy::start(upstream, sluice.port),
        Proxy::start(upstream, sluice.port),
    );
    let (ta, tb, total) = load_both(a.port, b.port, "two Envoys").await;
    assert_within_bound("two Envoys", total, 2, 1);
    assert!(
        ta.ok >= 15 && tb.ok >= 15,
        "both get a share: {ta:?} {tb:?}"
    );
}

/// sluice stopped: Envoy keeps enforcing its last assignment until its time to live, then
/// follows expired_assignment_behavior (allow all).
async fn sluice_stopped(upstream: u16) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let settings = dir.path().join("sluice.toml");
    std::fs::write(&settings, "[rlqs]\nassignment_ttl_secs = 7\n").expect("write settings");
    let settings = settings.display().to_string();
    let extra = ["--config", settings.as_str()];
    let mut sluice = start_sluice(&deploy_file("rlqs-rules.yaml"), &extra).await;
    let proxy = Proxy::start(upstream, sluice.port).await;
    let port = proxy.port;
    let running = tokio::spawn(load(port, "acme", 50, 17));
    // The report at about 5 s renewed the assignment until about 12 s.
    tokio::time::sleep(Duration::from_secs(7)).await;
    sluice.stop();
    let answers = running.await.expect("the load run");
    let window = |from: f64, to: f64| {
        let part: Vec<_> = answers
            .iter()
            .copied()
            .filter(|(at, _)| *at >= from && *at < to)
            .collect();
        tally(&part)
    };
    let held = window(7.5, 10.5);
    eprintln!("sluice stopped, before the TTL: {held:?}");
    assert!(
        held.ok <= 3 * 10 + 10 && held.denied > 0,
        "the last assignment still applies: {held:?}"
    );
    let expired = window(13.5, 17.0);
    eprintln!("sluice stopped, after the TTL: {expired:?}");
    assert_eq!(
        expired.denied, 0,
        "expired: allow all, as configured: {expired:?}"
    );
    assert!(expired.ok > 100, "{expired:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_admits_within_the_bound_and_falls_back_as_configured() {
    envoy::binary();
    let upstream = Upstream::start().await;
    tokio::join!(
        one_envoy(upstream.port),
        two_envoys(upstream.port),
        sluice_stopped(upstream.port),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_redis_and_two_replicas_shares_one_quota() {
    envoy::binary();
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let url = redis.url();
    let backend = ["--backend", "redis", "--redis-url", url.as_str()];
    let rules = deploy_file("rlqs-rules.yaml");
    let (r1, r2) = tokio::join!(
        start_sluice(&rules, &backend),
        start_sluice(&rules, &backend),
    );
    let (a, b) = tokio::join!(
        Proxy::start(upstream.port, r1.port),
        Proxy::start(upstream.port, r2.port),
    );
    let (_, _, total) = load_both(a.port, b.port, "two replicas").await;
    assert_within_bound("two Envoys on two replicas (Redis)", total, 2, 2);
    let keys: Vec<String> = redis.cmd(&["KEYS", "sluice:*"]);
    assert!(
        keys.iter().any(|k| k.contains("tenant=acme")),
        "the usage went to Redis: {keys:?}"
    );
}
