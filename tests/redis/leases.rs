//! Leases (`redis.leases = "on"`) on a real redis-server, on a manual clock (sent to the
//! script): a busy key is leased, its decisions then make no script call, the unused part of
//! a lease comes back, requests wait for a renewal under way, a reset on another replica and a
//! changed limit drop leases, and three replicas hammering one funnel, one fixed window, one
//! sliding window and one token bucket stay within the bound, a replica dropped mid-run
//! included; a token bucket's lease ends by its next refill step, a calendar window's by the
//! window's end.

use std::sync::Arc;
use std::time::Duration;

use sluice::config::calendar::{Calendar, CalendarUnit, Zone};
use sluice::config::model::{Algorithm, Charge};
use sluice::config::settings::{LeaseMode, RedisSettings};
use sluice::limiter::{Batch, Hit, LimitParams, Limiter, ManualClock, RedisLimiter, Role};
use sluice::testing::redis::{RedisServer, lease_record, wait_until};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
/// A Unix time to start the clock at.
const START: u64 = 1_800_000_000 * SEC;

fn limit(algorithm: Algorithm, quota: u32, burst: u32) -> LimitParams {
    LimitParams {
        algorithm,
        quota,
        period_nanos: SEC,
        burst,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

fn batch(key: &str, limit: LimitParams, cost: u64) -> Batch {
    Batch {
        hits: vec![Hit {
            key: Arc::from(key.as_bytes()),
            limit,
            cost,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        }],
    }
}

fn leasing(redis: &RedisServer, on: bool) -> RedisSettings {
    RedisSettings {
        leases: if on { LeaseMode::On } else { LeaseMode::Off },
        lease_min_rate: 200,
        ..redis.settings()
    }
}

fn replica(redis: &RedisServer, clock: &ManualClock) -> RedisLimiter {
    RedisLimiter::with_clock(&leasing(redis, true), 1_000, Arc::new(clock.clone()))
        .expect("valid settings")
}

fn event(limiter: &RedisLimiter, name: &str) -> u64 {
    limiter
        .events()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

/// Requests of `cost` on `key` every `step`, `n` of them; how many were admitted.
async fn drive(
    limiter: &RedisLimiter,
    clock: &ManualClock,
    b: &Batch,
    step: u64,
    n: usize,
) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        clock.advance(step);
        let outcome = limiter.check(b).await.expect("redis answers");
        admitted += usize::from(outcome.admitted);
    }
    admitted
}

#[tokio::test]
async fn renewals_on_many_keys_ride_one_call_of_group_commit() {
    let redis = RedisServer::start();
    for functions in [false, true] {
        let clock = ManualClock::at(START);
        let settings = RedisSettings {
            connections: 1,
            functions,
            ..leasing(&redis, true)
        };
        let r = RedisLimiter::with_clock(&settings, 1_000, Arc::new(clock.clone()))
            .expect("valid settings");
        // One request on eight busy keys: their leases run out together, and their eight
        // renewals go as eight requests of one call.
        let l = limit(Algorithm::Funnel, 1_000_000, 1_000_000);
        let keys: Vec<String> = (0..8).map(|k| format!("many{functions}{k}")).collect();
        let b = Batch {
            hits: keys.iter().flat_map(|k| batch(k, l, 1).hits).collect(),
        };
        assert_eq!(drive(&r, &clock, &b, MS, 100).await, 100);
        let taken = event(&r, "lease_taken");
        assert!(taken >= 8, "{:?}", r.events());
        redis.reset_stats();
        assert_eq!(drive(&r, &clock, &b, MS, 1_000).await, 1_000);
        let taken = event(&r, "lease_taken") - taken;
        let calls = redis.script_calls();
        eprintln!("functions {functions}: {calls} script calls for {taken} leases taken");
        assert!(taken >= 40, "{taken} leases taken in 1,000 requests");
        assert!(
            calls * 4 <= taken,
            "functions {functions}: {calls} script calls for {taken} leases taken"
        );
    }
}

#[tokio::test]
async fn a_busy_key_is_leased_and_then_decided_without_script_calls() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    let b = batch("hot", limit(Algorithm::Funnel, 1_000_000, 1_000_000), 1);
    // 1,000 requests a second: busy after a few (200 a second is the threshold).
    assert_eq!(drive(&r, &clock, &b, MS, 100).await, 100);
    assert!(event(&r, "lease_taken") >= 1, "{:?}", r.events());
    redis.reset_stats();
    let before = event(&r, "lease_decided");
    assert_eq!(drive(&r, &clock, &b, MS, 1_000).await, 1_000);
    let decided = event(&r, "lease_decided") - before;
    let calls = redis.script_calls();
    assert!(decided >= 950, "{decided} of 1,000 decided from leases");
    assert!(calls <= 50, "{calls} script calls for 1,000 requests");
    // Off, the same traffic is one script call per request.
    let plain = RedisLimiter::with_clock(&leasing(&redis, false), 1_000, Arc::new(clock.clone()))
        .expect("valid settings");
    let other = batch("hot2", limit(Algorithm::Funnel, 1_000_000, 1_000_000), 1);
    redis.reset_stats();
    assert_eq!(drive(&plain, &clock, &other, MS, 200).await, 200);
    assert_eq!(redis.script_calls(), 200);
}

#[tokio::test]
async fn the_unused_part_of_a_lease_comes_back() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    // A fixed window of 1,000 a second: leases of up to 100.
    let l = limit(Algorithm::FixedWindow, 1_000, 1_000);
    let one = batch("win", l, 1);
    drive(&r, &clock, &one, MS / 2, 100).await;
    let taken = event(&r, "lease_taken");
    assert!(taken >= 1);
    // A request larger than what is left renews the lease, which gives the rest back.
    let big = batch("win", l, 90);
    assert!(r.check(&big).await.expect("redis answers").admitted);
    assert!(event(&r, "lease_returned") > 0, "{:?}", r.events());
    // Redis's count is what was spent plus what is on lease now, nothing more.
    // The fixed window's fields: start, count, refundable.
    let stored = redis.state("sluice:win");
    let count = stored.get(1).copied().unwrap_or(0);
    let spent = 100 + 90;
    assert!(count >= spent, "{stored:?}");
    assert!(
        count <= spent + 100,
        "{stored:?}: at most one lease of 100 beyond"
    );
}

#[tokio::test]
async fn a_funnel_lease_comes_back_only_while_nothing_was_taken_after_it() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    let l = limit(Algorithm::Funnel, 1_000, 1_000);
    drive(&r, &clock, &batch("f", l, 1), MS / 2, 100).await;
    assert!(event(&r, "lease_taken") >= 1);
    // Alone on the key, this replica's lease is the last thing taken: what is left comes back.
    assert!(
        r.check(&batch("f", l, 90))
            .await
            .expect("redis answers")
            .admitted
    );
    let returned = event(&r, "lease_returned");
    assert!(returned > 0, "{:?}", r.events());
    // Another replica takes after this one's lease: nothing of it can come back then.
    let other = replica(&redis, &clock);
    drive(&r, &clock, &batch("f", l, 1), MS / 2, 20).await;
    other.check(&batch("f", l, 1)).await.expect("redis answers");
    // Answered from the lease, `remaining` is what is left of it.
    let left = r
        .check(&batch("f", l, 1))
        .await
        .expect("redis answers")
        .hits[0]
        .remaining;
    assert!(left > 0);
    let lost = event(&r, "lease_lost");
    let more = batch("f", l, left + 1);
    assert!(r.check(&more).await.expect("redis answers").admitted);
    assert_eq!(event(&r, "lease_returned"), returned, "{:?}", r.events());
    assert!(event(&r, "lease_lost") > lost, "{:?}", r.events());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_drops_leases_on_another_replica() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let a = Arc::new(replica(&redis, &clock));
    let b = Arc::new(replica(&redis, &clock));
    let listening = a.clone();
    let listener = tokio::spawn(async move {
        if let Some(listen) = listening.listen() {
            listen.await;
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let l = limit(Algorithm::Funnel, 1_000_000, 1_000_000);
    let hit = batch("shared", l, 1);
    drive(&a, &clock, &hit, MS, 100).await;
    assert!(event(&a, "lease_taken") >= 1);
    let lost = event(&a, "lease_lost");
    let key: Arc<[u8]> = Arc::from(&b"shared"[..]);
    b.reset(&[(key, Algorithm::Funnel)])
        .await
        .expect("reset answers");
    wait_until(
        Duration::from_secs(5),
        "the reset to reach replica a",
        || event(&a, "lease_lost") > lost,
    );
    // The next request takes a new lease from the state as the reset left it (the old lease's
    // record went with it, so nothing of it can come back).
    let taken = event(&a, "lease_taken");
    clock.advance(MS);
    assert!(a.check(&hit).await.expect("redis answers").admitted);
    assert_eq!(event(&a, "lease_taken"), taken + 1);
    assert_eq!(event(&a, "lease_returned"), 0);
    listener.abort();
}

#[tokio::test]
async fn a_changed_limit_drops_the_lease() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    let before = limit(Algorithm::FixedWindow, 1_000, 1_000);
    drive(&r, &clock, &batch("k", before, 1), MS / 2, 100).await;
    assert!(event(&r, "lease_taken") >= 1);
    let lost = event(&r, "lease_lost");
    let decided = event(&r, "lease_decided");
    // Lowered to 150: the next request goes to Redis, which has counted the old lease.
    let after = limit(Algorithm::FixedWindow, 150, 150);
    clock.advance(MS / 2);
    r.check(&batch("k", after, 1)).await.expect("redis answers");
    assert!(event(&r, "lease_lost") > lost, "{:?}", r.events());
    assert_eq!(event(&r, "lease_decided"), decided);
}

#[tokio::test]
async fn a_busy_token_bucket_is_leased_and_its_leases_never_cross_a_refill() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    // 1,000 every 10 s, burst 2,000; one request a millisecond: leases of up to 200, which
    // end by the next refill step. (Periods of seconds: Redis expires the keys by its own
    // clock, which the manual one must stay ahead of.)
    let l = LimitParams {
        period_nanos: 10 * SEC,
        ..limit(Algorithm::TokenBucket, 1_000, 2_000)
    };
    let b = batch("bucket", l, 1);
    assert_eq!(drive(&r, &clock, &b, MS, 300).await, 300);
    assert!(event(&r, "lease_taken") >= 1, "{:?}", r.events());
    redis.reset_stats();
    let before = event(&r, "lease_decided");
    assert_eq!(drive(&r, &clock, &b, MS, 1_000).await, 1_000);
    let decided = event(&r, "lease_decided") - before;
    let calls = redis.script_calls();
    assert!(decided >= 800, "{decided} of 1,000 decided from leases");
    assert!(calls <= 200, "{calls} script calls for 1,000 requests");
    // Redis's record of this replica's lease (units:expires:returnable:mark:state, the state
    // as the grant left it, used, anchor, refundable; in microseconds) ends by the bucket's
    // next refill step, and its units may come back until that step.
    let record: Vec<u8> = redis.cmd(&["HGET", "sluice:bucket:lease", &lease_id(&redis)]);
    let Some(([units, expires, returnable, mark], state)) = lease_record(&record) else {
        panic!("a lease record: {record:?}");
    };
    let [_used, anchor, _] = state[..] else {
        panic!("a token bucket's state in the lease record: {state:?}");
    };
    assert!(units >= 1, "{record:?}");
    assert!(
        expires <= anchor + 10_000_000,
        "{record:?}: past the next refill"
    );
    assert_eq!(
        (returnable, mark),
        (anchor + 10_000_000, anchor),
        "{record:?}"
    );
}

/// The one field of the `:lease` hash of `sluice:bucket` (one replica leases it).
fn lease_id(redis: &RedisServer) -> String {
    let ids: Vec<String> = redis.cmd(&["HKEYS", "sluice:bucket:lease"]);
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids.into_iter().next().unwrap_or_default()
}

#[tokio::test]
async fn a_calendar_window_lease_ends_at_the_window_end() {
    let redis = RedisServer::start();
    // A Berlin midnight (2027-01-14 23:00 UTC), from 300 ms before it.
    let midnight = 1_799_967_600 * SEC;
    let clock = ManualClock::at(midnight - 300 * MS);
    let r = replica(&redis, &clock);
    let zone = Zone::named("Europe/Berlin").expect("a zone");
    let l = LimitParams {
        period_nanos: 86_400 * SEC,
        calendar: Some(Calendar::new(zone, CalendarUnit::Day)),
        ..limit(Algorithm::FixedWindow, 100, 100)
    };
    let b = batch("day", l, 1);
    // One request a millisecond: 299 before midnight (leases of up to 10, all ending at
    // midnight), 300 from it.
    let before = drive(&r, &clock, &b, MS, 299).await;
    let taken = event(&r, "lease_taken");
    assert!(taken >= 2, "{:?}", r.events());
    let after = drive(&r, &clock, &b, MS, 300).await;
    assert!(event(&r, "lease_taken") > taken, "{:?}", r.events());
    // Within the day's 100 on each side of midnight: a lease that crossed it would spend
    // units counted in the old day in the new one, past 100. What a lease held at midnight
    // is lost (under-admission, at most one lease).
    assert!((90..=100).contains(&before), "{before} before midnight");
    assert!((90..=100).contains(&after), "{after} after midnight");
}

#[tokio::test]
async fn requests_that_find_a_renewal_under_way_wait_for_it_instead_of_calling_redis() {
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    // A fixed window of 1,000,000 a second, 1,000 requests a second: leased within the first
    // window, and every lease ends with its window.
    let b = batch(
        "win",
        limit(Algorithm::FixedWindow, 1_000_000, 1_000_000),
        1,
    );
    assert_eq!(drive(&r, &clock, &b, MS, 990).await, 990);
    assert!(event(&r, "lease_taken") >= 1, "{:?}", r.events());
    // Into the next window: the lease has ended, the key is still busy.
    clock.advance(20 * MS);
    redis.reset_stats();
    let decided = event(&r, "lease_decided");
    // Ten requests at once, polled in order as a connection's task polls one read's: the
    // first renews the lease, the nine others wait for its answer and are decided from it.
    let outcomes =
        sluice::runtime::gathered(futures_util::future::join_all((0..10).map(|_| r.check(&b))))
            .await;
    for outcome in outcomes {
        assert!(outcome.expect("redis answers").admitted);
    }
    assert_eq!(redis.script_calls(), 1, "one renewal, no other call");
    assert_eq!(event(&r, "lease_decided") - decided, 10, "{:?}", r.events());
}

/// Three replicas on one clock hammer `l` for 10 of its periods, each 1,000 times a period
/// (3,000 together); `drop_at`: the third is dropped (its leases lost) after that many ticks.
/// The admissions per period.
///
/// Time runs a hundred times slower than the done-when's (periods of 100 s, ticks of 100 ms,
/// leases valid up to 1 s): the manual clock must stay well ahead of real time, since Redis
/// expires keys (up to the funnel's 10 s of capacity) by its own.
async fn hammer(redis: &RedisServer, l: LimitParams, key: &str, drop_at: Option<u64>) -> Vec<u64> {
    hammer_ticks(redis, l, key, drop_at, l.period_nanos / 1_000).await
}

/// [`hammer`] with ticks of `tick` (1,000 of them a "period").
async fn hammer_ticks(
    redis: &RedisServer,
    l: LimitParams,
    key: &str,
    drop_at: Option<u64>,
    tick: u64,
) -> Vec<u64> {
    let clock = ManualClock::at(START);
    let settings = RedisSettings {
        lease_validity_ms: 1_000,
        lease_horizon_ms: 1_000,
        lease_min_rate: 1,
        ..leasing(redis, true)
    };
    let mut replicas: Vec<RedisLimiter> = (0..3)
        .map(|_| RedisLimiter::with_clock(&settings, 1_000, Arc::new(clock.clone())))
        .collect::<Result<_, _>>()
        .expect("valid settings");
    let b = batch(key, l, 1);
    let mut per_period = vec![0u64; 10];
    for i in 0..10_000u64 {
        if drop_at == Some(i) {
            replicas.pop();
        }
        clock.set(START + i * tick);
        for r in &replicas {
            if r.check(&b).await.expect("redis answers").admitted {
                per_period[(i / 1_000) as usize] += 1;
            }
        }
    }
    per_period
}

#[tokio::test]
async fn three_replicas_with_leases_stay_within_the_bound_and_admit_most_of_it() {
    let redis = RedisServer::start();
    let slow = |algorithm, burst| LimitParams {
        period_nanos: 100 * SEC,
        ..limit(algorithm, 1_000, burst)
    };
    for drop_at in [None, Some(5_000)] {
        // A funnel of 1,000 a period, burst 100: at most 100 + 999 in any period (ticks 0 to
        // 999 of it), and 1,000 a period once the burst is spent; leases of at most 10, valid
        // at most 10 ticks.
        let funnel = hammer(&redis, slow(Algorithm::Funnel, 100), "funnel", drop_at).await;
        eprintln!("funnel, replica dropped at {drop_at:?}: {funnel:?}");
        for (i, &n) in funnel.iter().enumerate() {
            assert!(n <= 1_099, "period {i}: {funnel:?}");
            // Under-admission: a dropped replica holds at most 10 units for 10 ticks.
            assert!(n >= 990, "period {i}: {funnel:?}");
        }
        // A fixed window of 1,000 a period: at most 1,000 per window; leases of at most 100,
        // valid at most 10 ticks.
        let window = hammer(
            &redis,
            slow(Algorithm::FixedWindow, 1_000),
            "window",
            drop_at,
        )
        .await;
        eprintln!("fixed window, replica dropped at {drop_at:?}: {window:?}");
        for (i, &n) in window.iter().enumerate() {
            assert!(n <= 1_000, "window {i}: {window:?}");
            assert!(n >= 900, "window {i}: {window:?}");
        }
        // A sliding window of 1,000 a period: at most 1,000 counted in each aligned window
        // (its estimate never undercounts the current one).
        let sliding = hammer(
            &redis,
            slow(Algorithm::SlidingWindow, 1_000),
            "sliding",
            drop_at,
        )
        .await;
        eprintln!("sliding window, replica dropped at {drop_at:?}: {sliding:?}");
        for (i, &n) in sliding.iter().enumerate() {
            assert!(n <= 1_000, "window {i}: {sliding:?}");
            assert!(n >= 900 || i == 0, "window {i}: {sliding:?}");
        }
        // A token bucket of 100 every 10 s, burst 100, ticks of 100 ms: 10 refill steps a
        // period of 100 s, at most 100 + 100 * 10 in any 99.9 s; leases of at most 10, which
        // end by the next step (a dropped replica's lost until then).
        let bucket = LimitParams {
            period_nanos: 10 * SEC,
            ..limit(Algorithm::TokenBucket, 100, 100)
        };
        let bucket = hammer_ticks(&redis, bucket, "bucket", drop_at, 100 * MS).await;
        eprintln!("token bucket, replica dropped at {drop_at:?}: {bucket:?}");
        for (i, &n) in bucket.iter().enumerate() {
            assert!(n <= 1_100, "period {i}: {bucket:?}");
            assert!(n >= 950, "period {i}: {bucket:?}");
        }
        redis.cmd::<u64>(&[
            "DEL",
            "sluice:funnel",
            "sluice:window",
            "sluice:sliding",
            "sluice:bucket",
        ]);
    }
}

/// A reservation on a funnel key that a replica holds a lease on: its commit gives nothing
/// back while the lease is out (a return would move the leased units' slots earlier, before
/// the moments they may be spent: docs/algorithms.md, "Returns"); once no lease is out, a
/// commit gives back as usual.
#[tokio::test]
async fn a_funnel_commit_gives_nothing_back_while_a_lease_is_out() {
    use sluice::limiter::reserve::{ReserveOp, ReserveRequest, records_key};
    let redis = RedisServer::start();
    let clock = ManualClock::at(START);
    let r = replica(&redis, &clock);
    let l = limit(Algorithm::Funnel, 1_000, 1_000);
    let hot = batch("mixed", l, 1);
    // Busy: leased.
    assert_eq!(drive(&r, &clock, &hot, MS, 100).await, 100);
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:mixed:lease"]);
    assert_eq!(exists, 1, "a lease is out: {:?}", r.events());
    let reserve_then_cancel = |amount: u64| {
        let (r, redis) = (&r, &redis);
        async move {
            let hit = batch("mixed", l, amount).hits.remove(0);
            let reserve = ReserveRequest {
                records: records_key(&hit.key),
                ttl_nanos: 60 * SEC,
                op: ReserveOp::Reserve {
                    batch: Batch {
                        hits: vec![hit.clone()],
                    },
                    amount,
                },
            };
            let done = r.reserve(&reserve).await.expect("redis answers");
            assert!(done.done, "reserved");
            let before = redis.state("sluice:mixed");
            let commit = ReserveRequest {
                records: records_key(&hit.key),
                ttl_nanos: 1,
                op: ReserveOp::Commit {
                    id: done.id,
                    actual: 0,
                    hit: Hit { cost: 0, ..hit },
                },
            };
            assert!(r.reserve(&commit).await.expect("redis answers").done);
            (before, redis.state("sluice:mixed"))
        }
    };
    let (before, after) = reserve_then_cancel(50).await;
    assert_eq!(before[0], after[0], "the tat stayed: nothing given back");
    // The leases expire (no traffic for a second), their records with them.
    clock.advance(SEC);
    redis.cmd::<()>(&["DEL", "sluice:mixed:lease"]);
    let (before, after) = reserve_then_cancel(50).await;
    // All 50 back: the funnel is empty again, its key gone.
    assert!(
        !before.is_empty() && after.is_empty(),
        "given back: {before:?} -> {after:?}"
    );
}
