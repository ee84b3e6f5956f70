//! Global limits (`scope: global`, `redis.global_url`) on real redis-servers, in process: a home
//! and two regions, two limiters (replicas) per region. The share pool is exact across a
//! region's replicas and both regions together never admit more than a global window; a
//! region cut from home spends what it held and then denies (or, under `global_on_error =
//! "share"`, admits its fixed percent); a limit without `scope: global` makes no call to home.
//! The fault test with the binary and a delaying proxy is tests/serial/redis_regions.rs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice::config::model::{Algorithm, Charge};
use sluice::config::settings::{GlobalOnError, RedisSettings};
use sluice::limiter::{Batch, Hit, LimitParams, Limiter, RedisLimiter, Role};
use sluice::testing::redis::RedisServer;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

fn limit(algorithm: Algorithm, quota: u32, period: u64, global: bool) -> LimitParams {
    LimitParams {
        algorithm,
        quota,
        period_nanos: period,
        burst: quota,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global,
        calendar: None,
    }
}

fn batch(key: &str, limit: LimitParams) -> Batch {
    Batch {
        hits: vec![Hit {
            key: Arc::from(key.as_bytes()),
            limit,
            cost: 1,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        }],
    }
}

fn regional(region: &RedisServer, home: &RedisServer, name: &str) -> RedisSettings {
    RedisSettings {
        global_url: Some(home.url()),
        region: Some(name.to_owned()),
        global_share_ms: 500,
        global_lease_ms: 2_000,
        ..region.settings()
    }
}

fn replica(settings: &RedisSettings) -> Arc<RedisLimiter> {
    Arc::new(RedisLimiter::new(settings, 1_000).expect("valid settings"))
}

fn event(limiter: &RedisLimiter, name: &str) -> u64 {
    limiter
        .events()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

fn unix_nanos() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.as_nanos()).unwrap_or(u64::MAX)
}

/// Admissions of one replica: (sent, answered) Unix nanoseconds of each admitted request.
async fn hammer(
    limiter: Arc<RedisLimiter>,
    b: Batch,
    until: u64,
    every: Duration,
) -> Vec<(u64, u64)> {
    let mut admitted = Vec::new();
    while unix_nanos() < until {
        let sent = unix_nanos();
        let outcome = limiter.check(&b).await.expect("an answer");
        if outcome.admitted {
            admitted.push((sent, unix_nanos()));
        }
        tokio::time::sleep(every).await;
    }
    admitted
}

/// Every replica asks for `b` every 4 ms until `until`, all at once: the admissions of all.
async fn hammer_all(replicas: &[Arc<RedisLimiter>], b: &Batch, until: u64) -> Vec<(u64, u64)> {
    let tasks: Vec<_> = replicas
        .iter()
        .map(|r| {
            tokio::spawn(hammer(
                r.clone(),
                b.clone(),
                until,
                Duration::from_millis(4),
            ))
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a task"));
    }
    all
}

/// Four replicas (two per region) ask faster than a global window of 200 per 2 s admits:
/// every window admits at most 200 (counting an admission in a window only when it was
/// surely decided in it), the three at least 80% of it, and home is asked per share, not per
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_never_admit_more_than_a_global_window() {
    let (home, east, west) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let period = 2 * SEC;
    let quota = 200;
    let l = limit(Algorithm::FixedWindow, quota, period, true);
    let e = regional(&east, &home, "east");
    let w = regional(&west, &home, "west");
    let replicas = [replica(&e), replica(&e), replica(&w), replica(&w)];
    // Start just after a window's start, and run three whole windows.
    let start = (unix_nanos() / period + 1) * period;
    tokio::time::sleep(Duration::from_nanos(start.saturating_sub(unix_nanos()))).await;
    let until = start + 3 * period;
    let all = hammer_all(&replicas, &batch("tenant", l), until).await;
    let mut per_window = Vec::new();
    for k in 0..3 {
        let (from, to) = (start + k * period, start + (k + 1) * period);
        let surely = all.iter().filter(|(s, a)| *s >= from && *a < to).count();
        let maybe = all.iter().filter(|(s, a)| *a >= from && *s < to).count();
        assert!(
            surely <= quota as usize,
            "window {k}: {surely} admitted of {quota}"
        );
        per_window.push(maybe);
    }
    // At least 80% over the three windows (this suite runs beside others on a shared
    // machine, where a replica may stall a while; tests/serial/redis_regions.rs holds each
    // window to 95% with the machine to itself).
    let admitted: usize = per_window.iter().sum();
    assert!(
        admitted * 10 >= quota as usize * 3 * 8,
        "only {per_window:?} admitted of {quota} a window"
    );
    let taken: u64 = replicas
        .iter()
        .map(|r| event(r, "global_share_taken"))
        .sum();
    assert!(taken >= 6, "shares taken: {taken}");
    // Home is asked once per share (not per request); the regions' Redis hold only pools.
    let home_calls = home.script_calls();
    assert!(
        (taken..=all.len() as u64 / 2).contains(&home_calls),
        "{home_calls} calls to home for {taken} shares and {} admissions",
        all.len()
    );
    let east_keys: Vec<String> = east.cmd(&["KEYS", "*"]);
    assert!(
        east_keys.iter().all(|k| k.ends_with(":share")),
        "{east_keys:?}"
    );
}

/// A global token bucket (100 per 2 s, burst 100) shared by two regions: by the end of the
/// k-th period from the first request, at most 100 + 100·k admitted, and at least 90% of the
/// refills taken while both ask more than it gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_share_a_global_token_bucket_within_its_bound() {
    let (home, east, west) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let period = 2 * SEC;
    let l = limit(Algorithm::TokenBucket, 100, period, true);
    let replicas = [
        replica(&regional(&east, &home, "east")),
        replica(&regional(&west, &home, "west")),
    ];
    let begin = unix_nanos();
    let until = begin + 3 * period;
    let all = hammer_all(&replicas, &batch("bucket", l), until).await;
    for k in 1..=3 {
        let by = begin + k * period;
        let admitted = all.iter().filter(|(_, a)| *a < by).count() as u64;
        assert!(admitted <= 100 + 100 * k, "by period {k}: {admitted}");
    }
    let total = all.len() as u64;
    assert!(
        total >= 270,
        "{total} admitted in 3 periods of a bucket of 100 (burst 100)"
    );
}

/// A region cut from home (home stopped) spends what its pool holds and then denies; a region
/// under `global_on_error = "share"` then admits its percent of the limit per period, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cut_from_home_spends_what_it_holds_then_answers_by_global_on_error() {
    let (mut home, east, west) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    // A window long enough not to end during the test.
    let l = limit(Algorithm::FixedWindow, 1_000, 3_600 * SEC, true);
    let e = regional(&east, &home, "east");
    let w = RedisSettings {
        global_on_error: GlobalOnError::Share,
        global_share_percent: 5,
        ..regional(&west, &home, "west")
    };
    let (east_r, west_r) = (replica(&e), replica(&w));
    let b = batch("cut", l);
    // Some traffic, so that each region holds a share.
    for _ in 0..40 {
        assert!(east_r.check(&b).await.expect("an answer").admitted);
        assert!(west_r.check(&b).await.expect("an answer").admitted);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held: u64 = ["0", "1"]
        .iter()
        .map(|s| {
            let until: Option<u64> = east.cmd(&["HGET", "sluice:cut:share", &format!("u{s}")]);
            let left: Option<u64> = east.cmd(&["HGET", "sluice:cut:share", &format!("l{s}")]);
            let now_us = unix_nanos() / 1_000;
            if until.unwrap_or(0) > now_us {
                left.unwrap_or(0)
            } else {
                0
            }
        })
        .sum();
    home.kill();
    let mut east_admitted = 0;
    let mut west_admitted = 0;
    for _ in 0..200 {
        east_admitted += u64::from(east_r.check(&b).await.expect("an answer").admitted);
        west_admitted += u64::from(west_r.check(&b).await.expect("an answer").admitted);
    }
    assert!(
        east_admitted <= held,
        "east admitted {east_admitted} with {held} held when cut"
    );
    assert!(
        event(&east_r, "global_home_failure") >= 1,
        "{:?}",
        east_r.events()
    );
    // West: what it held, then at most 5% of 1,000 a period.
    let west_pool: u64 = west
        .cmd::<Option<u64>>(&["HGET", "sluice:cut:share", "fb"])
        .unwrap_or(0);
    assert!(west_pool <= 50, "fallback admitted {west_pool}");
    assert!(west_admitted >= 50, "west admitted {west_admitted}");
    assert!(event(&west_r, "global_fallback_admitted") == west_pool);
}

/// A request with a global and a local limit: when the local one denies it, the global units
/// it spent from the pool go back.
#[tokio::test]
async fn a_request_denied_by_its_local_limit_gives_its_global_units_back() {
    let (home, east) = (RedisServer::start(), RedisServer::start());
    let r = replica(&regional(&east, &home, "east"));
    let mut b = batch(
        "mixed",
        limit(Algorithm::FixedWindow, 1_000, 3_600 * SEC, true),
    );
    b.hits.push(Hit {
        key: Arc::from(&b"mixed_local"[..]),
        limit: limit(Algorithm::FixedWindow, 2, 3_600 * SEC, false),
        cost: 1,
        refund: false,
        group: 1,
        role: Role::Enforced,
        hold: None,
    });
    let mut admitted = 0;
    for _ in 0..6 {
        admitted += u64::from(r.check(&b).await.expect("an answer").admitted);
    }
    assert_eq!(admitted, 2);
    // Each denied request's unit goes back to the share it came from while that share is in
    // the pool; one that meets its share being renewed is lost (under-admission, never more).
    let spent: u64 = east.cmd(&["HGET", "sluice:mixed:share", "spent"]);
    assert!(
        (2..6).contains(&spent),
        "{spent} spent for 2 admitted of 6: the denied requests' units did not go back"
    );
}

/// A limit without `scope: global` makes no call to home and leaves no pool: the same path
/// as without `redis.global_url`.
#[tokio::test]
async fn a_local_limit_makes_no_call_to_home() {
    let (home, east) = (RedisServer::start(), RedisServer::start());
    let r = replica(&regional(&east, &home, "east"));
    let b = batch("local", limit(Algorithm::FixedWindow, 10, 60 * SEC, false));
    home.reset_stats();
    let calls = AtomicU64::new(0);
    for _ in 0..12 {
        if r.check(&b).await.expect("an answer").admitted {
            calls.fetch_add(1, Ordering::Relaxed);
        }
    }
    assert_eq!(calls.load(Ordering::Relaxed), 10);
    assert_eq!(home.script_calls(), 0);
    let keys: Vec<String> = east.cmd(&["KEYS", "*"]);
    assert!(keys.iter().all(|k| !k.ends_with(":share")), "{keys:?}");
}

/// `/counters` and `/why` on a global limit: home's state (which counts the shares lent as
/// spent) and this region's share of it (held, spent); `/counters/reset` starts it over at
/// home and empties the region's pool.
#[tokio::test]
async fn counters_and_why_show_homes_state_and_the_regions_share() {
    use sluice::config::rules_file::{LoadOptions, from_sources_with};
    use sluice::config::settings::Settings;
    use sluice::testing::TestServer;
    use sluice::testing::http;

    let (home, east) = (RedisServer::start(), RedisServer::start());
    let rules = "domain: g\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, \
                 requests_per_unit: 1000, algorithm: fixed_window, scope: global}\n";
    let options = LoadOptions {
        global_url: true,
        ..LoadOptions::default()
    };
    let model = from_sources_with(&[("g.yaml".into(), rules.to_owned())], options)
        .unwrap_or_else(|e| panic!("{e}"));
    let limiter: Arc<dyn Limiter> = replica(&regional(&east, &home, "east"));
    let server = TestServer::start_model_over(Settings::default(), model, limiter).await;
    let body = r#"{"domain":"g","descriptors":[{"entries":[{"key":"tenant","value":"a"}]}]}"#;
    for _ in 0..5 {
        let answer = http::request(
            server.admin_addr,
            "POST",
            "/json",
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    // A renewal in the background has landed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let page = http::get(server.admin_addr, "/counters?domain=g").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let page: serde_json::Value = serde_json::from_str(&page.body).expect("JSON");
    let keys = page["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 1, "{page}");
    let entry = &keys[0];
    assert_eq!(entry["scope"], "global", "{entry}");
    let share = &entry["region_share"];
    assert_eq!(share["spent"], 5, "{entry}");
    let held = share["held"].as_u64().expect("held");
    let remaining = entry["remaining"].as_u64().expect("remaining");
    // Home counts what it lent as spent: what it has left and what east holds and spent
    // make the limit.
    assert_eq!(remaining + held + 5, 1_000, "{entry}");
    let why = http::request(
        server.admin_addr,
        "POST",
        "/why",
        &[("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(why.status, 200, "{}", why.body);
    let why: serde_json::Value = serde_json::from_str(&why.body).expect("JSON");
    let limit = &why["descriptors"][0]["limits"][0];
    assert_eq!(limit["scope"], "global", "{why}");
    assert_eq!(limit["state"]["remaining"], remaining, "{why}");
    assert_eq!(limit["state"]["region_share"]["held"], held, "{why}");
    // A reset starts the key over at home and empties this region's pool.
    let reset = http::request(
        server.admin_addr,
        "POST",
        "/counters/reset",
        &[("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    let home_keys: Vec<String> = home.cmd(&["KEYS", "*"]);
    let east_keys: Vec<String> = east.cmd(&["KEYS", "*"]);
    assert!(
        home_keys.is_empty() && east_keys.is_empty(),
        "{home_keys:?} {east_keys:?}"
    );
}
