//! `block_for` (the penalty box) and `time_zone` (calendar windows) through gRPC, on both
//! backends: the box keeps a key denied for its duration and no longer, through two `sluice`
//! processes on one `redis-server`, on a Redis Cluster, and in process over memory (where a
//! shadow limit's box is shown, never enforced); calendar windows change at
//! local midnight across daylight-saving changes and a month end, with
//! `duration_until_reset` the time to that boundary, and both backends answer alike on the
//! same controlled clock (the Redis limiter's script reads it instead of Redis `TIME`).

use std::sync::Arc;
use std::time::Duration;

use sluice::config::settings::Settings;
use sluice::limiter::{ManualClock, RedisLimiter};
use sluice::testing::grpc::*;
use sluice::testing::redis::RedisServer;
use sluice::testing::{SECOND, TestServer, http};
use tokio::time::Instant;

use crate::support::load;

/// 1 per second, then 3 s in the box; a shadow twin of it.
const BOX_RULES: &str = "
domain: pb
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1, block_for: 3s}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, block_for: 3s}
";

fn user(name: &str) -> RateLimitRequest {
    req("pb", vec![desc(&[("user", name)])])
}

/// Two replicas on one Redis: a denial at one boxes the key at both, for 3 s; the funnel
/// alone would admit again after 1 s. After the box, the key is admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_box_holds_across_two_replicas_for_its_duration_and_no_longer() {
    let redis = RedisServer::start();
    let (_rules, replicas) = load::replicas(2, BOX_RULES, &redis.url());
    let mut a = connect_within(&replicas[0].url(), Duration::from_secs(20)).await;
    let mut b = connect_within(&replicas[1].url(), Duration::from_secs(20)).await;
    assert_eq!(overall(&call(&mut a, user("eve")).await), Code::Ok);
    let denied = call(&mut a, user("eve")).await;
    let boxed_at = Instant::now();
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(
        reset_secs(&denied.statuses[0]),
        Some(3),
        "the reset is the box's end"
    );
    let at_b = call(&mut b, user("eve")).await;
    assert_eq!(
        overall(&at_b),
        Code::OverLimit,
        "the other replica sees the box at once"
    );
    assert!(matches!(reset_secs(&at_b.statuses[0]), Some(2..=3)));
    // /counters shows the box, read from Redis.
    let counters = http::get(replicas[1].admin(), "/counters?format=text").await;
    let line = counters.body.lines().find(|l| l.contains("user=eve"));
    assert!(
        line.is_some_and(|l| l.contains(" blocked=")),
        "the box on /counters: {}",
        counters.body
    );
    // Past the funnel's 1 s, the box still denies, at both replicas (A may answer from its
    // deny cache, B asks Redis); knocking does not extend it.
    tokio::time::sleep_until(boxed_at + Duration::from_millis(1_500)).await;
    for c in [&mut a, &mut b] {
        let r = call(c, user("eve")).await;
        if boxed_at.elapsed() < Duration::from_millis(2_900) {
            assert_eq!(overall(&r), Code::OverLimit, "still in the box");
            assert!(matches!(reset_secs(&r.statuses[0]), Some(1..=2)));
        }
    }
    assert_eq!(
        overall(&call(&mut b, user("other")).await),
        Code::Ok,
        "only that key"
    );
    // No longer than the box: admitted right after it ends, at either replica.
    tokio::time::sleep_until(boxed_at + Duration::from_millis(3_100)).await;
    assert_eq!(
        overall(&call(&mut b, user("eve")).await),
        Code::Ok,
        "the box is over"
    );
    assert_eq!(
        overall(&call(&mut a, user("eve")).await),
        Code::OverLimit,
        "1 per second"
    );
}

/// In process over memory, on the server's manual clock: the same box, to the nanosecond;
/// and a shadow limit's box is counted and shown, never denies.
#[tokio::test]
async fn the_box_holds_over_memory_and_a_shadow_box_never_denies() {
    let server = TestServer::start(BOX_RULES).await;
    let mut c = client(&server).await;
    assert_eq!(overall(&call(&mut c, user("eve")).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, user("eve")).await), Code::OverLimit);
    server.clock.advance(3 * SECOND - 1);
    let r = call(&mut c, user("eve")).await;
    assert_eq!(overall(&r), Code::OverLimit, "1 ns before the box ends");
    assert_eq!(reset_secs(&r.statuses[0]), Some(1));
    server.clock.advance(1);
    assert_eq!(overall(&call(&mut c, user("eve")).await), Code::Ok);
    let shadow = || req("pb", vec![desc(&[("shadow", "s")])]);
    for _ in 0..3 {
        assert_eq!(
            overall(&call(&mut c, shadow()).await),
            Code::Ok,
            "shadow never denies"
        );
    }
    let counters = http::get(server.admin_addr, "/counters?format=text").await;
    assert_eq!(counters.status, 200, "{}", counters.body);
    let line = counters.body.lines().find(|l| l.contains("shadow=s"));
    assert!(
        line.is_some_and(|l| l.contains("blocked=3.0s")),
        "the shadow key's box is counted and shown: {}",
        counters.body
    );
}

/// A UTC time (`2026-03-29T12:00:00Z`) in nanoseconds since the epoch.
fn utc(text: &str) -> u64 {
    let ts: jiff::Timestamp = text.parse().expect("a timestamp");
    u64::try_from(ts.as_nanosecond()).expect("after 1970")
}

const CALENDAR_RULES: &str = "
domain: cal
descriptors:
  - key: berlin
    rate_limit: {unit: day, requests_per_unit: 1, algorithm: fixed_window, time_zone: Europe/Berlin}
  - key: ny
    rate_limit: {unit: month, requests_per_unit: 1, algorithm: fixed_window, time_zone: America/New_York}
";

/// Each step: the clock (UTC), the descriptor, the expected code and reset in seconds.
const STEPS: &[(&str, &str, Code, i64)] = &[
    // Berlin, spring forward on 2026-03-29: that day is 23 hours, from 2026-03-28 23:00 UTC.
    ("2026-03-28T22:59:59Z", "berlin", Code::Ok, 1),
    ("2026-03-28T23:00:00Z", "berlin", Code::Ok, 23 * 3_600),
    (
        "2026-03-29T12:00:00Z",
        "berlin",
        Code::OverLimit,
        10 * 3_600,
    ),
    ("2026-03-29T21:59:59Z", "berlin", Code::OverLimit, 1),
    ("2026-03-29T22:00:00Z", "berlin", Code::Ok, 24 * 3_600),
    // Fall back on 2026-10-25: 25 hours, from 2026-10-24 22:00 UTC.
    ("2026-10-24T21:00:00Z", "berlin", Code::Ok, 3_600),
    ("2026-10-24T22:00:00Z", "berlin", Code::Ok, 25 * 3_600),
    ("2026-10-25T22:30:00Z", "berlin", Code::OverLimit, 1_800),
    ("2026-10-25T23:00:00Z", "berlin", Code::Ok, 24 * 3_600),
    // New York, a month end: February ends at 2026-03-01 05:00 UTC (EST), March at
    // 2026-04-01 04:00 UTC (EDT, after the 2026-03-08 change): 31 days less an hour.
    ("2026-02-28T12:00:00Z", "ny", Code::Ok, 17 * 3_600),
    ("2026-03-01T04:59:59Z", "ny", Code::OverLimit, 1),
    ("2026-03-01T05:00:00Z", "ny", Code::Ok, 31 * 86_400 - 3_600),
    (
        "2026-03-20T00:00:00Z",
        "ny",
        Code::OverLimit,
        12 * 86_400 + 4 * 3_600,
    ),
];

/// Runs [`STEPS`] against a client whose limiter reads `clock`; returns what it saw.
async fn walk(c: &mut Client, clock: &ManualClock) -> Vec<(Code, Option<i64>)> {
    let mut seen = Vec::new();
    for &(at, key, code, reset) in STEPS {
        clock.set(utc(at));
        let r = call(c, req("cal", vec![desc(&[(key, "x")])])).await;
        assert_eq!(
            (overall(&r), reset_secs(&r.statuses[0])),
            (code, Some(reset)),
            "{at} {key}"
        );
        seen.push((overall(&r), reset_secs(&r.statuses[0])));
    }
    seen
}

#[tokio::test]
async fn calendar_windows_change_at_local_midnight_and_both_backends_agree() {
    let memory = TestServer::start(CALENDAR_RULES).await;
    let mut m = client(&memory).await;
    let on_memory = walk(&mut m, &memory.clock).await;

    let redis = RedisServer::start();
    let clock = ManualClock::at(utc("2026-01-01T00:00:00Z"));
    let limiter = RedisLimiter::with_clock(&redis.settings(), 1_000, Arc::new(clock.clone()))
        .expect("valid redis settings");
    let server =
        TestServer::start_over(Settings::default(), CALENDAR_RULES, Arc::new(limiter)).await;
    let mut r = client(&server).await;
    let on_redis = walk(&mut r, &clock).await;
    assert_eq!(on_memory, on_redis);
}

/// On a Redis Cluster: the box's key (the state key with `:block`, the same hash tag) is in
/// the state key's slot, so the script reads and writes it on the node that owns that slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_box_works_on_a_redis_cluster() {
    let cluster = sluice::testing::redis::RedisCluster::start();
    let settings = sluice::config::settings::RedisSettings {
        url: cluster.url(),
        ..Default::default()
    };
    let limiter = RedisLimiter::new(&settings, 100).expect("valid settings");
    let server = TestServer::start_over(Settings::default(), BOX_RULES, Arc::new(limiter)).await;
    let mut c = client(&server).await;
    assert_eq!(overall(&call(&mut c, user("eve")).await), Code::Ok);
    let denied = call(&mut c, user("eve")).await;
    let boxed_at = Instant::now();
    assert_eq!(overall(&denied), Code::OverLimit);
    assert_eq!(reset_secs(&denied.statuses[0]), Some(3));
    tokio::time::sleep_until(boxed_at + Duration::from_millis(1_200)).await;
    let r = call(
        &mut c,
        req("pb", vec![with_hits(desc(&[("user", "eve")]), 0)]),
    )
    .await;
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "a check-only request is boxed too"
    );
    tokio::time::sleep_until(boxed_at + Duration::from_millis(3_100)).await;
    assert_eq!(overall(&call(&mut c, user("eve")).await), Code::Ok);
}
