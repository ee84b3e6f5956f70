//! The Lua script against a real `redis-server`: the differential test (the same random
//! batches, some limits with a penalty box, through the memory backend and through the script
//! give identical outcomes, with
//! steps of every size, and with batches at one instant or under a millisecond apart; one of
//! them on the requests the script's funnel fast path takes), TTLs and deletion of fresh
//! states, the commands a call of many requests runs (one `MGET`, one write per changed key),
//! and reloading after `SCRIPT FLUSH`.

use tokio::time::Instant;

use crate::support::rng::Rng;
use sluice::config::model::Algorithm;
use sluice::config::settings::RedisSettings;
use sluice::limiter::redis::script::Via;
use sluice::limiter::{
    Batch, Hit, LimitParams, Limiter, ManualClock, MemoryLimiter, RedisLimiter, Role,
};
use sluice::testing::limits;
use sluice::testing::redis::RedisServer;

const SECOND_MICROS: u64 = 1_000_000;

/// A random hit; periods are in microseconds, the unit of the script (and of the memory
/// limiter in this test, whose clock counts microseconds too).
fn random_hit(rng: &mut Rng, seed: u64) -> Hit {
    let group = rng.below(6) as usize;
    let limit = LimitParams {
        algorithm: Algorithm::Funnel,
        quota: rng.pick(&[0, 1, 2, 3, 5, 7]),
        period_nanos: rng.pick(&[
            SHORT_PERIOD,
            SECOND_MICROS,
            3 * SECOND_MICROS + 1,
            7 * SECOND_MICROS,
            60 * SECOND_MICROS,
        ]),
        burst: rng.pick(&[0, 1, 2, 3, 6]),
        charge: rng.charge(15),
        borrow: rng.chance(15),
        // A penalty box on some limits (in microseconds here, like the periods).
        block_nanos: if rng.chance(20) {
            rng.pick(&[SECOND_MICROS, 3 * SECOND_MICROS + 7])
        } else {
            0
        },
        global: false,
        calendar: None,
    };
    Hit {
        key: format!("{{diff|seed={seed}}}:{}", rng.pick(&["a", "b", "c"]))
            .into_bytes()
            .into(),
        limit,
        cost: rng.pick(&[0, 1, 1, 1, 2, 3, 5, 40]),
        refund: rng.chance(10),
        group,
        role: role_of(group),
        hold: None,
    }
}

/// The role of a random hit's descriptor `group` (0 to 5).
fn role_of(group: usize) -> Role {
    [
        Role::Enforced,
        Role::Enforced,
        Role::Shadow,
        Role::Quota,
        Role::Quota,
        Role::QuotaShadow,
    ][group % 6]
}

fn random_batch(rng: &mut Rng, seed: u64) -> Batch {
    let n = 1 + rng.below(5);
    Batch {
        hits: (0..n).map(|_| random_hit(rng, seed)).collect(),
    }
}

/// Time steps between batches, in microseconds: none, a fraction of an interval, about an
/// interval, several.
fn random_step(rng: &mut Rng) -> u64 {
    rng.pick(&[
        0,
        0,
        1,
        999,
        100_000,
        333_334,
        SECOND_MICROS,
        3 * SECOND_MICROS,
        20 * SECOND_MICROS,
    ])
}

/// Fake time must advance at least as fast as real time, because Redis expires keys on its
/// own clock: with that, a key Redis has expired is one the memory backend sees as fresh too.
/// Each step therefore adds the real time elapsed since the last one, plus a margin for the
/// time between measuring it and the script running.
const MARGIN_MICROS: u64 = 20_000;

/// The shortest period of the random limits: a few steps of [`MARGIN_MICROS`], so that a state
/// is often still in its period at the next batch.
const SHORT_PERIOD: u64 = 50_000;

/// How fake time moves in a differential run.
#[derive(Clone, Copy)]
struct Timing {
    /// The first instant of each sequence.
    start: fn(&mut Rng) -> u64,
    /// The time before each batch.
    step: fn(&mut Rng) -> u64,
    /// Each step also adds the real time elapsed and [`MARGIN_MICROS`].
    follows_real_time: bool,
}

/// Steps of every size, following real time.
const FOLLOWING_REAL_TIME: Timing = Timing {
    start: start_within_a_second,
    step: random_step,
    follows_real_time: true,
};

fn start_within_a_second(rng: &mut Rng) -> u64 {
    1_700_000_000 * SECOND_MICROS + rng.below(SECOND_MICROS)
}

/// Batches at one instant or under a millisecond apart, without following real time. Only for
/// limits of [`LONG_PERIODS`]: starting 10 to 40 s into a minute, and at least 10 minutes into
/// an hour and a day, no state of a sequence (which lasts well under a second) becomes fresh
/// for seconds, so Redis expiring keys on its own clock cannot change an answer.
const SAME_INSTANT: Timing = Timing {
    start: start_inside_long_windows,
    step: sub_millisecond_step,
    follows_real_time: false,
};

/// Periods of the limits in runs of [`SAME_INSTANT`].
const LONG_PERIODS: [u64; 3] = [
    60 * SECOND_MICROS,
    3_600 * SECOND_MICROS,
    86_400 * SECOND_MICROS,
];

fn start_inside_long_windows(rng: &mut Rng) -> u64 {
    // 2023-11-15 00:00 UTC, a whole day since the epoch.
    const MIDNIGHT: u64 = 1_700_006_400 * SECOND_MICROS;
    MIDNIGHT + 610 * SECOND_MICROS + rng.below(30 * SECOND_MICROS)
}

fn sub_millisecond_step(rng: &mut Rng) -> u64 {
    rng.pick(&[0, 0, 0, 1, 7, 250, 999])
}

/// Runs `seeds` random sequences of 50 batches through the memory backend and the script and
/// requires identical outcomes; returns how many batches were compared.
async fn compare(seeds: std::ops::RangeInclusive<u64>, batch: fn(&mut Rng, u64) -> Batch) -> usize {
    compare_timed(seeds, batch, FOLLOWING_REAL_TIME, Via::Function).await
}

/// The same through the form `via` of the limiter's code in Redis: every call of the run is
/// checked to have been made in that form.
async fn compare_timed(
    seeds: std::ops::RangeInclusive<u64>,
    batch: fn(&mut Rng, u64) -> Batch,
    timing: Timing,
    via: Via,
) -> usize {
    let redis = RedisServer::start();
    let settings = RedisSettings {
        functions: via == Via::Function,
        ..redis.settings()
    };
    let script = RedisLimiter::new(&settings, 1).expect("valid settings");
    let mut compared = 0;
    for seed in seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut fake = (timing.start)(&mut rng);
        let clock = ManualClock::at(fake);
        let memory = MemoryLimiter::with_clock(10_000, clock.clone());
        let mut last = Instant::now();
        for step in 0..50 {
            let now = Instant::now();
            let real = u64::try_from((now - last).as_micros()).unwrap_or(u64::MAX);
            last = now;
            fake += (timing.step)(&mut rng);
            if timing.follows_real_time {
                fake += real + MARGIN_MICROS;
            }
            clock.set(fake);
            let batch = batch(&mut rng, seed);
            let expected = memory.check(&batch).await.expect("memory never fails");
            let got = script
                .check_micros(&batch, Some(fake))
                .await
                .expect("the script answers");
            assert_eq!(got, expected, "seed {seed}, step {step}, batch {batch:#?}");
            compared += 1;
        }
    }
    assert_eq!(script.via(), via);
    let calls = redis.command_calls();
    let by = |name| calls.get(name).copied().unwrap_or(0);
    let made = u64::try_from(compared).expect("fits");
    match via {
        Via::Function => assert_eq!((by("fcall"), by("evalsha")), (made + 1, 0), "{calls:?}"),
        Via::Script => assert_eq!((by("evalsha"), by("fcall")), (made, 0), "{calls:?}"),
    }
    compared
}

/// Funnels whose hits on one key mix every parameter (a funnel's state is read the same way
/// whatever the limit).
#[tokio::test]
async fn lua_and_memory_give_identical_outcomes_on_random_sequences() {
    assert_eq!(compare(1..=60, random_batch).await, 3_000);
}

/// Periods of the limits in runs of [`FOLLOWING_REAL_TIME`].
const PERIODS: [u64; 4] = [
    SHORT_PERIOD,
    SECOND_MICROS,
    3 * SECOND_MICROS,
    60 * SECOND_MICROS,
];

/// A hit of `algorithm` on one of three keys of a seed; each key has its own quota and
/// period (one of `periods`), as real state keys (which name the algorithm and the period)
/// have; burst, borrow, charge, cost, refund and role vary per hit.
fn algorithm_hit(rng: &mut Rng, seed: u64, algorithm: Algorithm, periods: &[u64]) -> Hit {
    let name = rng.below(3);
    let mut keyed = Rng((seed << 8 | name << 4 | algorithm as u64).wrapping_mul(0x2545_F491));
    let mut hit = random_hit(rng, seed);
    hit.limit.algorithm = algorithm;
    hit.limit.quota = keyed.pick(&[0, 1, 2, 3, 5, 7]);
    hit.limit.period_nanos = keyed.pick(periods);
    hit.limit.borrow &= algorithm.has_capacity();
    hit.key = format!("{{diff|seed={seed}}}:{}:{name}", algorithm.as_str())
        .into_bytes()
        .into();
    // Half the concurrency hits name their hold (a rule's hold_id), from a few ids so that
    // they repeat, beside anonymous ones on the same keys.
    if algorithm == Algorithm::Concurrency && rng.chance(50) {
        let id = rng.pick(&["r1", "r2", "r3", "r4"]);
        hit.hold = std::num::NonZeroU64::new(sluice::limiter::concurrency::hold_id(id.as_bytes()));
    }
    hit
}

fn batch_of(rng: &mut Rng, seed: u64, algorithms: &[Algorithm], periods: &[u64]) -> Batch {
    let n = 1 + rng.below(5);
    Batch {
        hits: (0..n)
            .map(|_| {
                let algorithm = rng.pick(algorithms);
                algorithm_hit(rng, seed, algorithm, periods)
            })
            .collect(),
    }
}

/// Random sequences per differential test (`SLUICE_DIFF_SEEDS` runs more, e.g. 1000).
fn seeds() -> u64 {
    std::env::var("SLUICE_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// One test per algorithm, and one mixing them all in each batch, for a timing and the
/// periods it allows.
macro_rules! differential {
    ($timing:expr, $periods:expr; $($name:ident: $algorithms:expr;)*) => {
        differential! { $timing, $periods, Via::Function; $($name: $algorithms;)* }
    };
    ($timing:expr, $periods:expr, $via:expr; $($name:ident: $algorithms:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            fn batch(rng: &mut Rng, seed: u64) -> Batch {
                batch_of(rng, seed, &$algorithms, &$periods)
            }
            let seeds = seeds();
            let compared = compare_timed(1..=seeds, batch, $timing, $via).await;
            assert_eq!(u64::try_from(compared).ok(), Some(seeds * 50));
        }
    )*};
}

differential! {
    FOLLOWING_REAL_TIME, PERIODS;
    differential_funnel: [Algorithm::Funnel];
    differential_token_bucket: [Algorithm::TokenBucket];
    differential_fixed_window: [Algorithm::FixedWindow];
    differential_sliding_window: [Algorithm::SlidingWindow];
    differential_sliding_log: [Algorithm::SlidingLog];
    differential_concurrency: [Algorithm::Concurrency];
    differential_every_algorithm_in_one_batch: Algorithm::ALL;
}

differential! {
    SAME_INSTANT, LONG_PERIODS;
    same_instant_funnel: [Algorithm::Funnel];
    same_instant_token_bucket: [Algorithm::TokenBucket];
    same_instant_fixed_window: [Algorithm::FixedWindow];
    same_instant_sliding_window: [Algorithm::SlidingWindow];
    same_instant_sliding_log: [Algorithm::SlidingLog];
    same_instant_concurrency: [Algorithm::Concurrency];
    same_instant_every_algorithm_in_one_batch: Algorithm::ALL;
}

// The script form (`EVALSHA`, for a Redis that refuses functions) runs the same code, made per
// call instead of once: every algorithm through it too.
differential! {
    FOLLOWING_REAL_TIME, PERIODS, Via::Script;
    by_script_every_algorithm_in_one_batch: Algorithm::ALL;
}

differential! {
    SAME_INSTANT, LONG_PERIODS, Via::Script;
    by_script_same_instant_every_algorithm_in_one_batch: Algorithm::ALL;
}

/// A batch whose hits are often followed by copies on the same key and limit (in another
/// descriptor, with their own cost and refund): the runs the script reports once (a repeat in
/// its reply) and evaluates against tentative states, as the end-to-end shape with every
/// descriptor naming one key does.
fn repeated_batch(rng: &mut Rng, seed: u64) -> Batch {
    let mut batch = batch_of(rng, seed, &Algorithm::ALL, &PERIODS);
    let mut hits = Vec::new();
    for hit in batch.hits.drain(..) {
        let copies = rng.pick(&[0, 0, 1, 2, 4]);
        hits.push(hit.clone());
        for _ in 0..copies {
            let mut copy = hit.clone();
            copy.group = hits.len() % 5;
            copy.role = role_of(copy.group);
            copy.cost = rng.pick(&[0, 1, 1, 1, 2]);
            copy.refund = rng.chance(10);
            hits.push(copy);
        }
    }
    Batch { hits }
}

/// [`seeds`] random sequences of `batch`, following real time, through both forms.
async fn compare_both_forms(batch: fn(&mut Rng, u64) -> Batch) {
    for via in [Via::Function, Via::Script] {
        let seeds = seeds();
        let compared = compare_timed(1..=seeds, batch, FOLLOWING_REAL_TIME, via).await;
        assert_eq!(u64::try_from(compared).ok(), Some(seeds * 50), "{via:?}");
    }
}

#[tokio::test]
async fn differential_repeated_key_and_limit() {
    compare_both_forms(repeated_batch).await;
}

/// Requests of the kind the script's funnel fast path decides whenever every hit admits:
/// funnel hits on distinct keys, none a refund; quotas, bursts, periods, borrow, charge,
/// roles and costs vary as in [`random_hit`], and each key is named by its place in the
/// request, so the next requests find its state where the last left it (often at the edge
/// of its burst, where the fast path must give a request to the general path).
fn fast_path_batch(rng: &mut Rng, seed: u64) -> Batch {
    let mut batch = random_batch(rng, seed);
    for (place, hit) in batch.hits.iter_mut().enumerate() {
        hit.refund = false;
        hit.key = format!("{{diff|seed={seed}}}:fast:{place}")
            .into_bytes()
            .into();
    }
    batch
}

#[tokio::test]
async fn differential_funnel_fast_path() {
    compare_both_forms(fast_path_batch).await;
}

/// A funnel of `quota` per `period_secs`.
fn limit(quota: u32, period_secs: u64) -> LimitParams {
    limits::limit(Algorithm::Funnel, quota, period_secs * 1_000_000_000)
}

/// A hit of `cost` on `key` in descriptor `group`.
fn hit(key: &str, limit: LimitParams, cost: u64, group: usize) -> Hit {
    Hit {
        group,
        ..limits::hit(key, limit, cost)
    }
}

#[tokio::test]
async fn every_written_key_expires_when_fresh_and_fresh_states_are_deleted() {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1).expect("valid settings");
    let check = |hits: Vec<Hit>| {
        let batch = Batch { hits };
        let limiter = &limiter;
        async move { limiter.check(&batch).await.expect("redis answers") }
    };
    // One unit of 1/minute: fresh again in 60 s.
    assert!(
        check(vec![hit("{t|a}:funnel:60", limit(1, 60), 1, 0)])
            .await
            .admitted
    );
    let ttl: i64 = redis.cmd(&["PTTL", "sluice:{t|a}:funnel:60"]);
    assert!((59_000..=60_000).contains(&ttl), "PTTL {ttl}");
    // Two units of 5 per 5 minutes: 120 s.
    assert!(
        check(vec![hit("{t|b}:funnel:300", limit(5, 300), 2, 0)])
            .await
            .admitted
    );
    let ttl: i64 = redis.cmd(&["PTTL", "sluice:{t|b}:funnel:300"]);
    assert!((119_000..=120_000).contains(&ttl), "PTTL {ttl}");
    // Giving everything back deletes the key.
    let mut back = hit("{t|b}:funnel:300", limit(5, 300), 2, 0);
    back.refund = true;
    assert!(check(vec![back]).await.admitted);
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|b}:funnel:300"]);
    assert_eq!(exists, 0);
    // A check-only hit and a denied request write nothing.
    check(vec![hit("{t|c}:funnel:60", limit(1, 60), 0, 0)]).await;
    let denied = check(vec![
        hit("{t|d}:funnel:60", limit(1, 60), 1, 0),
        hit("{t|a}:funnel:60", limit(1, 60), 1, 1),
    ])
    .await;
    assert!(!denied.admitted);
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert_eq!(keys, ["sluice:{t|a}:funnel:60"]);
    // Nothing without a TTL.
    let ttl: i64 = redis.cmd(&["PTTL", "sluice:{t|a}:funnel:60"]);
    assert!(ttl > 0);
}

/// A state fresh again within a millisecond is stored for 1 ms: its TTL is rounded up, never
/// down to `PX 0` (which Redis refuses), by the funnel's fast path (distinct keys, every hit
/// admitted) and by the general path (two hits on one key), in both forms.
#[tokio::test]
async fn a_state_fresh_within_a_millisecond_is_stored_for_one() {
    const NOW: u64 = 1_700_000_000_000_000;
    let redis = RedisServer::start();
    // 1,000,000 a second: a unit is 1 µs of the funnel.
    let quick = limit(1_000_000, 1);
    for via in [Via::Script, Via::Function] {
        let (fast, general) = (
            format!("{{ms}}:fast:{via:?}"),
            format!("{{ms}}:general:{via:?}"),
        );
        let requests = [
            vec![hit(&fast, quick, 1, 0)],
            vec![hit(&general, quick, 1, 0), hit(&general, quick, 1, 1)],
        ];
        let outcomes = one_call(&redis, via, NOW, &requests).await;
        assert!(outcomes.iter().all(|o| o.admitted), "{outcomes:?}");
        for key in [fast, general] {
            // 1, 0, or -2 once the millisecond has passed.
            let ttl: i64 = redis.cmd(&["PTTL", &format!("sluice:{key}")]);
            assert!(ttl <= 1, "{key}: PTTL {ttl}");
        }
    }
}

/// A key of `algorithm` and its PTTL after a request of `cost`, given a limit.
async fn ttl_after(
    redis: &RedisServer,
    limiter: &RedisLimiter,
    limit: LimitParams,
    cost: u64,
) -> i64 {
    let key = format!(
        "{{ttl}}:{}:{}",
        limit.algorithm.as_str(),
        limit.period_nanos
    );
    let batch = Batch {
        hits: vec![hit(&key, limit, cost, 0)],
    };
    let outcome = limiter.check(&batch).await.expect("redis answers");
    assert!(outcome.admitted, "{outcome:?}");
    redis.cmd(&["PTTL", &format!("sluice:{key}")])
}

#[tokio::test]
async fn every_algorithm_keys_its_state_until_it_is_fresh() {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1).expect("valid settings");
    let bucket = LimitParams {
        algorithm: Algorithm::TokenBucket,
        burst: 5,
        ..limit(2, 10)
    };
    // 5 tokens missing, 2 back per 10 s: full again after 3 refills.
    let ttl = ttl_after(&redis, &limiter, bucket, 5).await;
    assert!((29_000..=30_000).contains(&ttl), "token bucket PTTL {ttl}");
    // A window lives until its end: within the hour of Redis time, to the millisecond.
    let window = LimitParams {
        algorithm: Algorithm::FixedWindow,
        ..limit(5, 3_600)
    };
    let ttl = ttl_after(&redis, &limiter, window, 1).await;
    let to_end = millis_to_the_hour();
    assert!(
        ttl.abs_diff(to_end) < 1_000,
        "fixed window PTTL {ttl}, {to_end} ms to the hour"
    );
    // A sliding window's count of 4 weighs until the next window is 3/4 through (plus 1 µs):
    // the end of this hour, then 2,700 s.
    let sliding = LimitParams {
        algorithm: Algorithm::SlidingWindow,
        ..limit(4, 3_600)
    };
    let ttl = ttl_after(&redis, &limiter, sliding, 4).await;
    let to_end = millis_to_the_hour();
    assert!(
        ttl.abs_diff(to_end + 2_700_000) < 1_000,
        "sliding window PTTL {ttl}, {to_end} ms to the hour"
    );
    // A log entry counts for one period from now.
    let log = LimitParams {
        algorithm: Algorithm::SlidingLog,
        ..limit(3, 3_600)
    };
    let ttl = ttl_after(&redis, &limiter, log, 1).await;
    assert!(
        (3_599_000..=3_600_000).contains(&ttl),
        "sliding log PTTL {ttl}"
    );
}

/// Milliseconds from now (Unix time) to the end of the hour.
fn millis_to_the_hour() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let millis = i64::try_from(since.as_millis()).expect("in range");
    3_600_000 - millis % 3_600_000
}

#[tokio::test]
async fn the_script_is_reloaded_after_script_flush() {
    let redis = RedisServer::start();
    // Every request a script call, whatever the suites' leases switch: the test counts them.
    let settings = RedisSettings {
        leases: sluice::config::settings::LeaseMode::Off,
        ..redis.settings()
    };
    let limiter = RedisLimiter::new(&settings, 1).expect("valid settings");
    assert_eq!(limiter.via(), Via::Script, "the script is the default");
    let batch = Batch {
        hits: vec![hit("{f|x}:funnel:60", limit(100, 60), 1, 0)],
    };
    for _ in 0..2 {
        let _: () = redis.cmd(&["SCRIPT", "FLUSH"]);
        redis.reset_stats();
        assert!(limiter.check(&batch).await.expect("redis answers").admitted);
        assert!(limiter.check(&batch).await.expect("redis answers").admitted);
        let calls = redis.command_calls();
        assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");
        assert_eq!(calls.get("eval"), Some(&1), "one reload: {calls:?}");
        assert_eq!(calls.get("fcall"), None, "{calls:?}");
    }
}

#[tokio::test]
async fn the_library_is_reloaded_after_function_flush() {
    let redis = RedisServer::start();
    let settings = RedisSettings {
        functions: true,
        // Every request a script call, whatever the suites' leases switch: the test counts
        // the calls and reads Redis's exact `remaining` (an answer from a lease reports the
        // units left in the lease, a lower bound).
        leases: sluice::config::settings::LeaseMode::Off,
        ..redis.settings()
    };
    let limiter = RedisLimiter::new(&settings, 1).expect("valid settings");
    let batch = Batch {
        hits: vec![hit("{f|y}:funnel:60", limit(100, 60), 1, 0)],
    };
    for round in 0..2 {
        let _: () = redis.cmd(&["FUNCTION", "FLUSH"]);
        redis.reset_stats();
        let first = limiter.check(&batch).await.expect("redis answers");
        assert_eq!(first.hits[0].remaining, 99 - round * 2);
        let second = limiter.check(&batch).await.expect("redis answers");
        assert_eq!(second.hits[0].remaining, 98 - round * 2);
        let calls = redis.command_calls();
        // Not found, loaded, called again; then called.
        assert_eq!(calls.get("fcall"), Some(&3), "{calls:?}");
        assert_eq!(calls.get("function|load"), Some(&1), "{calls:?}");
        assert_eq!(calls.get("evalsha"), None, "{calls:?}");
        assert_eq!(limiter.via(), Via::Function);
    }
    let listed: redis::Value = redis.cmd(&["FUNCTION", "LIST"]);
    assert!(
        format!("{listed:?}").contains("sluice_"),
        "the library stays loaded: {listed:?}"
    );
}

/// A Redis user allowed the script but not functions (an ACL, or a Redis before 7.0, which
/// answers `unknown command` the same way): the limiter decides by script, and keeps to it.
#[tokio::test]
async fn a_user_without_functions_is_served_by_the_script() {
    let redis = RedisServer::start();
    // Without FCALL, the call is refused; without FUNCTION, the one FCALL finds no function
    // and loading it is refused.
    for (denied, fcalls) in [("-fcall", 0), ("-function", 1)] {
        let user = format!("nofn{}", &denied[1..]);
        let _: () = redis.cmd(&["ACL", "SETUSER", &user, "on", ">pw", "~*", "+@all", denied]);
        let settings = RedisSettings {
            url: format!("redis://{user}:pw@{}", redis.addr()),
            functions: true,
            ..redis.settings()
        };
        let limiter = RedisLimiter::new(&settings, 1).expect("valid settings");
        let _: () = redis.cmd(&["FUNCTION", "FLUSH"]);
        redis.reset_stats();
        let key = format!("{{f|{user}}}:funnel:60");
        let batch = Batch {
            hits: vec![hit(&key, limit(3, 60), 1, 0)],
        };
        let remaining: Vec<u64> = {
            let mut out = Vec::new();
            for _ in 0..4 {
                let o = limiter.check(&batch).await.expect("redis answers");
                out.push(if o.admitted { o.hits[0].remaining } else { 99 });
            }
            out
        };
        assert_eq!(remaining, [2, 1, 0, 99], "{denied}: decided by script");
        assert_eq!(limiter.via(), Via::Script, "{denied}");
        let calls = redis.command_calls();
        assert_eq!(calls.get("evalsha"), Some(&4), "{denied}: {calls:?}");
        // A refused command is counted as rejected, not as a call.
        assert_eq!(
            calls.get("fcall").copied().unwrap_or(0),
            fcalls,
            "{denied}: {calls:?}"
        );
    }
}

/// A Redis on the same host can be reached over its Unix socket (`unix://` or `redis+unix://`,
/// e.g. a sidecar), which costs less per call than loopback TCP.
#[tokio::test]
async fn a_unix_socket_url_reaches_redis() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().expect("a UTF-8 path");
    let redis = RedisServer::start_with(&["--unixsocket", socket, "--unixsocketperm", "700"]);
    for (i, scheme) in ["unix", "redis+unix"].into_iter().enumerate() {
        let settings = RedisSettings {
            url: format!("{scheme}://{socket}"),
            ..redis.settings()
        };
        let limiter = RedisLimiter::new(&settings, 1).expect("valid settings");
        redis.reset_stats();
        let batch = Batch {
            hits: vec![hit(&format!("{{u|{i}}}:funnel:60"), limit(2, 60), 1, 0)],
        };
        let mut admitted = Vec::new();
        for _ in 0..3 {
            admitted.push(limiter.check(&batch).await.expect("redis answers").admitted);
        }
        assert_eq!(admitted, [true, true, false], "{scheme}");
        assert!(
            redis.calls("evalsha") >= 3,
            "{scheme}: decided by this server"
        );
    }
}

/// Sends `requests` as one script call (each request one part, decided in order) at `now`
/// (microseconds) in the form `via`, and decodes the outcomes.
async fn one_call(
    redis: &RedisServer,
    via: Via,
    now: u64,
    requests: &[Vec<Hit>],
) -> Vec<sluice::limiter::BatchOutcome> {
    use sluice::limiter::redis::script::{self, Functions, Mode, Part, Unit};
    let mut conn = ::redis::Client::open(redis.url())
        .expect("a redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test redis-server");
    let parts: Vec<Part<'_>> = requests
        .iter()
        .map(|hits| Part {
            hits,
            mode: Mode::Request,
        })
        .collect();
    let call = script::encode(
        &parts,
        b"sluice:",
        Unit::Nanos,
        (Some(now), now * 1_000),
        via,
    );
    let functions = Functions::new(via == Via::Function);
    let reply = script::invoke(&mut conn, &call, &functions)
        .await
        .expect("the script answers");
    assert_eq!(functions.via(), via);
    script::decode(reply, &call).expect("a well-formed reply")
}

/// One call of many requests reads its keys with one `MGET` and writes each key it changed
/// once, after its last request, as each request left it: through real Redis, in both forms,
/// counted in `INFO commandstats` (commands called from Lua count there too).
///
/// - 40 requests of one unit each on one hot funnel key (100 per minute: 0.6 s per unit):
///   each admitted with one unit less left, the key then 24 s ahead of now, one `SET`.
/// - A key taken by one request and given back by a later one: fresh again, so absent, and
///   as it was absent before the call, neither `SET` nor `DEL`.
/// - A key Redis held, given back to fresh: one `DEL`.
/// - A check-only hit: read, not written.
#[tokio::test]
async fn a_call_reads_its_keys_with_one_mget_and_writes_each_changed_key_once() {
    const NOW: u64 = 1_700_000_000_000_000;
    for via in [Via::Function, Via::Script] {
        let redis = RedisServer::start();
        // Loads the code, so that the call below is one command.
        one_call(
            &redis,
            via,
            NOW,
            &[vec![hit("{w}:funnel:60", limit(1, 60), 1, 0)]],
        )
        .await;
        let unit = limit(100, 60);
        // Held in the funnel's format, "tat:quota:refundable": one unit refundable.
        let held = format!("{}:100:1", NOW + 600_000);
        let _: () = redis.cmd(&["SET", "sluice:{held}:funnel:60", &held, "PX", "60000"]);
        let mut requests: Vec<Vec<Hit>> = (0..40)
            .map(|_| vec![hit("{hot}:funnel:60", unit, 1, 0)])
            .collect();
        requests[3].push(hit("{back}:funnel:60", unit, 2, 1));
        requests[9].push(Hit {
            refund: true,
            ..hit("{back}:funnel:60", unit, 2, 1)
        });
        requests[20].push(Hit {
            refund: true,
            ..hit("{held}:funnel:60", unit, 1, 1)
        });
        requests[30].push(hit("{look}:funnel:60", unit, 0, 1));
        redis.reset_stats();
        let outcomes = one_call(&redis, via, NOW, &requests).await;
        let calls = redis.command_calls();
        let by = |name: &str| calls.get(name).copied().unwrap_or(0);
        assert_eq!(
            (by("mget"), by("get"), by("set"), by("del")),
            (1, 0, 1, 1),
            "{via:?}: {calls:?}"
        );
        for (outcome, r) in outcomes.iter().zip(0u64..) {
            assert!(outcome.admitted, "{via:?}: request {r}: {outcome:?}");
            assert_eq!(outcome.hits[0].remaining, 99 - r, "{via:?}: request {r}");
        }
        let hot = redis.state("sluice:{hot}:funnel:60");
        assert_eq!(hot, [NOW + 40 * 600_000, 100, 40], "{via:?}");
        // The TTL is counted from the test's `now`, 24 s before the state is fresh.
        let ttl: i64 = redis.cmd(&["PTTL", "sluice:{hot}:funnel:60"]);
        assert!((23_000..=24_000).contains(&ttl), "{via:?}: PTTL {ttl}");
        let mut keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
        keys.sort();
        assert_eq!(
            keys,
            ["sluice:{hot}:funnel:60", "sluice:{w}:funnel:60"],
            "{via:?}"
        );
    }
}

/// A call with more keys than one `MGET` takes (512) reads them in several, beside a sliding
/// log's own commands, and writes every key it changed.
#[tokio::test]
async fn a_call_of_many_keys_reads_them_in_several_mgets() {
    const NOW: u64 = 1_700_000_000_000_000;
    let redis = RedisServer::start();
    let log = LimitParams {
        algorithm: Algorithm::SlidingLog,
        ..limit(5, 60)
    };
    let mut requests: Vec<Vec<Hit>> = (0..30)
        .map(|r| {
            (0..40)
                .map(|h| hit(&format!("{{many}}:funnel:60:{r}:{h}"), limit(5, 60), 1, h))
                .collect()
        })
        .collect();
    requests[0].push(hit("{many}:sliding_log:60", log, 1, 40));
    requests[29].push(hit("{many}:sliding_log:60", log, 1, 40));
    one_call(&redis, Via::Script, NOW, &[vec![]]).await;
    redis.reset_stats();
    let outcomes = one_call(&redis, Via::Script, NOW, &requests).await;
    assert!(outcomes.iter().all(|o| o.admitted), "{outcomes:?}");
    assert_eq!(outcomes[29].hits[40].remaining, 3);
    let calls = redis.command_calls();
    let by = |name: &str| calls.get(name).copied().unwrap_or(0);
    assert_eq!(
        (by("mget"), by("set"), by("get")),
        (3, 1_200, 0),
        "{calls:?}"
    );
    let size: i64 = redis.cmd(&["DBSIZE"]);
    assert_eq!(size, 1_201);
}
