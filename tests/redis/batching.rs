//! The Redis backend at speed, and still exact, against a real `redis-server`:
//!
//! - the deny cache answers only what Redis would answer: the case (a key named twice
//!   in one request, then once), and a differential run of thousands of random sequences
//!   through Redis with the deny cache on and off, on one controlled clock;
//! - group commit: requests that arrive while a call is in flight share the next call, each
//!   decided as if alone (memory against Redis with batches of random size), one call per
//!   request when they come one at a time, and every request of a failed batch answered by
//!   `on_error`.

use std::sync::Arc;

use crate::support::rng::Rng;
use sluice::config::model::{Algorithm, Charge};
use sluice::config::settings::{RedisSettings, Settings};
use sluice::limiter::{
    Batch, BatchOutcome, Hit, LimitParams, Limiter, ManualClock, RedisLimiter, Role,
};
use sluice::testing::grpc::*;
use sluice::testing::redis::{RedisServer, wait_until};

const MILLI: u64 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// The deny cache

const OVERRIDES: &str = "
domain: dc
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 100}
";

/// The case, through the gRPC API: two descriptors with the same entries, each with a
/// `limit` override of 1 per minute, cost 2 together and are denied; the next request naming
/// the descriptor once costs 1 and fits, with the deny cache on (the default) as with it off.
#[tokio::test]
async fn a_key_denied_when_named_twice_is_admitted_when_named_once() {
    for deny_cache_size in [100_000, 0] {
        let redis = RedisServer::start();
        let settings = RedisSettings {
            deny_cache_size,
            ..redis.settings()
        };
        let limiter = RedisLimiter::new(&settings, 1_000).expect("valid redis settings");
        let server =
            TestServer::start_over(Settings::default(), OVERRIDES, Arc::new(limiter)).await;
        let mut c = client(&server).await;
        let once = || {
            let mut d = desc(&[("k", "v")]);
            d.limit = Some(RateLimitOverride {
                requests_per_unit: 1,
                unit: 2, // MINUTE
            });
            d
        };
        let twice = call(&mut c, req("dc", vec![once(), once()])).await;
        assert_eq!(overall(&twice), Code::OverLimit, "cache {deny_cache_size}");
        let alone = call(&mut c, req("dc", vec![once()])).await;
        assert_eq!(overall(&alone), Code::Ok, "cache {deny_cache_size}");
        // Now the key is full: denied, and with the cache, the next denial is answered locally.
        for _ in 0..2 {
            let again = call(&mut c, req("dc", vec![once()])).await;
            assert_eq!(overall(&again), Code::OverLimit, "cache {deny_cache_size}");
        }
    }
}

/// A hit on `key` under `limit` in `group` (whose role is fixed by the group), with a cost
/// drawn from `costs` and a refund with a chance of `refund_percent`.
fn hit_of(
    rng: &mut Rng,
    key: String,
    limit: LimitParams,
    group: usize,
    costs: &[u64],
    refund_percent: u64,
) -> Hit {
    Hit {
        key: key.into_bytes().into(),
        limit,
        cost: rng.pick(costs),
        refund: rng.chance(refund_percent),
        group,
        role: [Role::Enforced, Role::Enforced, Role::Shadow, Role::Quota][group],
        hold: None,
    }
}

/// Key names per sequence; each names one algorithm and period, as real state keys do.
const NAMES: [&str; 3] = ["a", "b", "c"];

/// A hit on one of a sequence's keys; a key's algorithm and period are fixed by its name,
/// while quota and burst vary (a rule and a client's override on one key).
fn dc_hit(rng: &mut Rng, seed: u64, algorithms: &[Algorithm]) -> Hit {
    let name = rng.below(NAMES.len() as u64);
    let mut keyed = Rng::new(seed << 8 | name);
    let algorithm = keyed.pick(algorithms);
    let period = keyed.pick(&[SECOND, 2 * SECOND, 60 * SECOND, 3_600 * SECOND]);
    let group = rng.below(4) as usize;
    let key = format!(
        "{{dc|{seed}}}:{}:{}",
        algorithm.as_str(),
        NAMES[name as usize]
    );
    let limit = LimitParams {
        algorithm,
        quota: rng.pick(&[1, 1, 2, 3]),
        period_nanos: period,
        burst: rng.pick(&[1, 2, 3]),
        charge: rng.charge(5),
        borrow: rng.chance(10) && algorithm.has_capacity(),
        block_nanos: 0,
        global: false,
        calendar: None,
    };
    hit_of(rng, key, limit, group, &[0, 1, 1, 1, 1, 2, 3], 5)
}

/// A few request shapes per sequence, each sent again and again (so denials repeat, which is
/// when the deny cache answers).
fn dc_templates(rng: &mut Rng, seed: u64, algorithms: &[Algorithm]) -> Vec<Batch> {
    (0..3)
        .map(|_| {
            let n = 1 + rng.below(3);
            Batch {
                hits: (0..n).map(|_| dc_hit(rng, seed, algorithms)).collect(),
            }
        })
        .collect()
}

/// Fake time moves at least as fast as real time (plus a margin for the time between reading
/// the real clock and the script running: a stall longer than that on a loaded machine could
/// let Redis expire a key the fake clock does not see as fresh yet), so that a key Redis
/// has expired on its own clock is one the fake clock sees as fresh too.
const MARGIN: u64 = 300 * MILLI;

/// Requests per sequence.
const STEPS: u64 = 16;

/// Sequences per deny-cache differential test (`SLUICE_DIFF_SEEDS` runs more).
fn dc_seeds() -> u64 {
    std::env::var("SLUICE_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

/// The same random sequences through two limiters on one `redis-server` and one clock, one
/// with the deny cache and one without (each under its own key prefix), must give identical
/// outcomes, resets included; returns (requests compared, answered by the deny cache).
async fn deny_cache_differential(algorithms: &[Algorithm], seeds: u64) -> (u64, u64) {
    let redis = RedisServer::start();
    let clock = ManualClock::at(1_700_000_000 * SECOND);
    let with = RedisSettings {
        prefix: "on:".to_owned(),
        ..redis.settings()
    };
    let without = RedisSettings {
        prefix: "off:".to_owned(),
        deny_cache_size: 0,
        ..redis.settings()
    };
    let cached = RedisLimiter::with_clock(&with, 1, Arc::new(clock.clone())).expect("settings");
    let plain = RedisLimiter::with_clock(&without, 1, Arc::new(clock.clone())).expect("settings");
    let mut compared = 0;
    let mut local = 0;
    for seed in 0..seeds {
        let mut rng = Rng::new(seed);
        let templates = dc_templates(&mut rng, seed, algorithms);
        let mut last = tokio::time::Instant::now();
        for step in 0..STEPS {
            let real = u64::try_from(last.elapsed().as_nanos()).unwrap_or(u64::MAX);
            last = tokio::time::Instant::now();
            let jump = rng.pick(&[0, 0, 0, 0, 0, MILLI, 7 * MILLI, 40 * MILLI, 300 * MILLI]);
            // Whole microseconds: the script's unit.
            clock.advance((jump + real + MARGIN) / 1_000 * 1_000);
            let batch = &templates[rng.below(templates.len() as u64) as usize];
            let want: BatchOutcome = plain.check(batch).await.expect("redis answers");
            let mut got = cached.check(batch).await.expect("redis answers");
            // The answers must agree; only where they came from may differ (the cache
            // answers whole batches).
            if got.hits.iter().any(|h| h.from_local_cache) {
                assert!(got.hits.iter().all(|h| h.from_local_cache), "{got:?}");
                local += 1;
            }
            for hit in &mut got.hits {
                hit.from_local_cache = false;
            }
            assert_eq!(got, want, "seed {seed}, step {step}, batch {batch:#?}");
            compared += 1;
        }
    }
    let hits = cached
        .events()
        .into_iter()
        .find(|(name, _)| *name == "deny_cache_hit")
        .map_or(0, |(_, n)| n);
    assert_eq!(local, hits, "answers marked as the deny cache's");
    (compared, hits)
}

macro_rules! deny_cache_differential {
    ($($name:ident: $algorithms:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            let seeds = dc_seeds();
            let (compared, answered) = deny_cache_differential(&$algorithms, seeds).await;
            assert_eq!(compared, seeds * STEPS);
            // The cache must have been used, or the comparison proves nothing.
            assert!(
                answered * 20 > compared,
                "only {answered} of {compared} requests answered by the deny cache"
            );
        }
    )*};
}

deny_cache_differential! {
    deny_cache_on_and_off_agree_funnel: [Algorithm::Funnel];
    deny_cache_on_and_off_agree_token_bucket: [Algorithm::TokenBucket];
    deny_cache_on_and_off_agree_fixed_window: [Algorithm::FixedWindow];
    deny_cache_on_and_off_agree_sliding_window: [Algorithm::SlidingWindow];
    deny_cache_on_and_off_agree_sliding_log: [Algorithm::SlidingLog];
    deny_cache_on_and_off_agree_every_algorithm: Algorithm::ALL;
}

// ---------------------------------------------------------------------------------------------
// Group commit

/// A hit of one of a seed's keys; a key's algorithm, quota and period are its own (as real
/// state keys, which name the algorithm and the period), burst, borrow, charge, cost, refund
/// and role vary per hit. Periods in microseconds (the unit of `check_micros`).
fn gc_hit(rng: &mut Rng, seed: u64) -> Hit {
    let name = rng.below(4);
    let mut keyed = Rng::new(seed << 8 | name);
    let algorithm = keyed.pick(&Algorithm::ALL);
    let group = rng.below(4) as usize;
    let key = format!("{{gc|{seed}}}:{}:{name}", algorithm.as_str());
    let limit = LimitParams {
        algorithm,
        quota: keyed.pick(&[0, 1, 2, 3, 5, 7]),
        period_nanos: keyed.pick(&[500_000, 1_000_000, 3_000_000, 60_000_000]),
        burst: rng.pick(&[0, 1, 2, 3, 6]),
        charge: rng.charge(15),
        borrow: rng.chance(15) && algorithm.has_capacity(),
        block_nanos: 0,
        global: false,
        calendar: None,
    };
    hit_of(rng, key, limit, group, &[0, 1, 1, 1, 2, 3, 5], 10)
}

/// Random requests in batches of random size (1 to 29), each batch sent at once behind a
/// first request on an unrelated key, all polled in one gathering pass (`join_all`, as a
/// connection's task polls the streams of one read): the first finds the lane idle and
/// leads, the others queue behind it in that pass, and the leader's call carries them all.
/// The memory backend decides the same requests one after the other at the same instant.
/// Identical outcomes required, and exactly one script call per batch.
///
/// (The batch's requests share one `now` here, which does not follow real time between two
/// calls: a key written by one call with a TTL of a millisecond could expire in Redis before
/// the next reads it, while the memory backend's clock has not moved. In one call, Redis
/// expires nothing, so the batch must be one call, and the first request is on a key of its
/// own so that nothing it writes is read by the batch.)
async fn memory_and_lua_agree_on_batches(functions: bool) {
    use sluice::limiter::MemoryLimiter;
    let redis = RedisServer::start();
    let settings = RedisSettings {
        functions,
        connections: 1,
        ..redis.settings()
    };
    let script = RedisLimiter::new(&settings, 1).expect("valid settings");
    // Load the code first, so that every call below is one command.
    let warm = Batch {
        hits: vec![gc_hit(&mut Rng::new(u64::MAX), u64::MAX)],
    };
    script
        .check_micros(&warm, Some(1))
        .await
        .expect("redis answers");
    redis.reset_stats();
    let plug = Batch {
        hits: vec![gc_hit(&mut Rng::new(u64::MAX - 1), u64::MAX - 1)],
    };
    let (mut batches, mut requests) = (0u64, 0u64);
    for seed in 0..dc_seeds() / 10 {
        let mut rng = Rng::new(seed);
        let mut fake = 1_700_000_000 * 1_000_000 + rng.below(1_000_000);
        let clock = ManualClock::at(fake);
        let memory = MemoryLimiter::with_clock(10_000, clock.clone());
        let mut last = tokio::time::Instant::now();
        for _ in 0..6 {
            let real = u64::try_from(last.elapsed().as_micros()).unwrap_or(u64::MAX);
            last = tokio::time::Instant::now();
            fake += rng.pick(&[0, 0, 1, 999, 30_000, 333_334, 1_000_000]) + real + MARGIN / 1_000;
            let size = rng.pick(&[1, 1, 2, 3, 5, 8, 13, 29]);
            let batch: Vec<Batch> = (0..size)
                .map(|_| Batch {
                    hits: (0..1 + rng.below(4))
                        .map(|_| gc_hit(&mut rng, seed))
                        .collect(),
                })
                .collect();
            // At most 30 futures: `join_all` then polls them in order, so they queue in order.
            let first = std::iter::once(&plug);
            // Polled as a connection's task polls the streams of one read.
            let mut got = sluice::runtime::gathered(futures_util::future::join_all(
                first
                    .chain(&batch)
                    .map(|b| script.check_micros(b, Some(fake))),
            ))
            .await;
            got.remove(0).expect("redis answers");
            clock.set(fake);
            for (b, got) in batch.iter().zip(got) {
                let want = memory.check(b).await.expect("memory never fails");
                assert_eq!(
                    got.expect("redis answers"),
                    want,
                    "seed {seed}, batch of {size}"
                );
            }
            batches += 1;
            requests += size;
        }
    }
    let calls = redis.script_calls();
    assert_eq!(calls, batches, "{requests} requests in {batches} batches");
    assert!(requests > 3 * batches, "batches of several requests");
}

#[tokio::test]
async fn memory_and_lua_agree_on_batches_of_random_size_by_script() {
    memory_and_lua_agree_on_batches(false).await;
}

#[tokio::test]
async fn memory_and_lua_agree_on_batches_of_random_size_by_function() {
    memory_and_lua_agree_on_batches(true).await;
}

/// Requests polled together share the call of the one that finds the lane idle only under a
/// gathering poll (a connection's task polling the streams of one read): there the leader lets
/// the others queue first, and one call carries all six; anywhere else (a request on a task of
/// its own) the leader sends at once, alone, and the five others go in the next call.
#[tokio::test]
async fn a_leader_waits_for_the_requests_polled_with_it_only_under_a_gathering_poll() {
    let redis = RedisServer::start();
    let settings = RedisSettings {
        connections: 1,
        ..redis.settings()
    };
    let limiter = RedisLimiter::new(&settings, 1).expect("valid settings");
    let batch = |round: u64| -> Vec<Batch> {
        (0..6)
            .map(|i| Batch {
                hits: vec![gc_hit(&mut Rng::new(round * 10 + i), round * 10 + i)],
            })
            .collect()
    };
    // Load the code first, so that every call below is one command.
    limiter.check(&batch(0)[0]).await.expect("redis answers");
    for (round, gathering, calls) in [(1, true, 1), (2, false, 2), (3, true, 1)] {
        redis.reset_stats();
        let requests = batch(round);
        let all = futures_util::future::join_all(requests.iter().map(|b| limiter.check(b)));
        let answers = if gathering {
            sluice::runtime::gathered(all).await
        } else {
            all.await
        };
        for answer in answers {
            answer.expect("redis answers");
        }
        assert_eq!(
            redis.script_calls(),
            calls,
            "six requests polled together, gathering: {gathering}"
        );
    }
}

/// What one task of the kill test saw.
#[derive(Default)]
struct Seen {
    redis: u64,
    on_error: u64,
}

/// Many requests in flight on one lane (so they go in batches), and `redis-server` killed
/// while they do: every answer is the request's own, either Redis's (each hit admitted, with
/// what is left of the task's own quota) or the `on_error = deny` answer for its own hits
/// (as many as it asked, each denied, retry in 1 s); none is another request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_failed_batch_gets_its_own_on_error_answer() {
    use sluice::config::settings::OnError;
    let mut redis = RedisServer::start();
    let settings = RedisSettings {
        on_error: OnError::Deny,
        timeout_ms: 300,
        connections: 1,
        deny_cache_size: 0,
        ..redis.settings()
    };
    let limiter = Arc::new(RedisLimiter::new(&settings, 1).expect("valid settings"));
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..48u32)
        .map(|task| {
            let (limiter, answered, stop) = (limiter.clone(), answered.clone(), stop.clone());
            tokio::spawn(async move {
                let quota = 100_000 + 7 * task;
                let hits = (0..1 + task % 3)
                    .map(|h| Hit {
                        key: format!("{{kill|{task}}}:funnel:{h}").into_bytes().into(),
                        limit: LimitParams {
                            algorithm: Algorithm::Funnel,
                            quota,
                            period_nanos: 8_640_000 * SECOND,
                            burst: quota,
                            charge: Charge::Admitted,
                            borrow: false,
                            block_nanos: 0,
                            global: false,
                            calendar: None,
                        },
                        cost: 1,
                        refund: false,
                        group: h as usize,
                        role: Role::Enforced,
                        hold: None,
                    })
                    .collect::<Vec<_>>();
                let batch = Batch { hits };
                let mut seen = Seen::default();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let o = limiter
                        .check(&batch)
                        .await
                        .expect("on_error = deny answers");
                    assert_eq!(o.hits.len(), batch.hits.len(), "task {task}: its own hits");
                    if o.admitted {
                        seen.redis += 1;
                        let left = u64::from(quota) - seen.redis;
                        for h in &o.hits {
                            assert!(h.admitted, "task {task}: {o:?}");
                            // Redis's own answer for this task's keys (a unit drips back
                            // in every 86 s: none during the test).
                            assert_eq!(h.remaining, left, "task {task}: {o:?}");
                        }
                    } else {
                        seen.on_error += 1;
                        for h in &o.hits {
                            assert!(!h.admitted && h.remaining == 0, "task {task}: {o:?}");
                            assert_eq!(h.reset_nanos, SECOND, "task {task}: the deny answer");
                        }
                    }
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                seen
            })
        })
        .collect();
    // Let batches form, then kill Redis with calls in flight, and keep asking a while.
    wait_until(std::time::Duration::from_secs(20), "2,000 answers", || {
        answered.load(std::sync::atomic::Ordering::Relaxed) >= 2_000
    });
    let calls = redis.script_calls();
    let before = answered.load(std::sync::atomic::Ordering::Relaxed);
    redis.kill();
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = Seen::default();
    for task in tasks {
        let seen = task.await.expect("the task's checks hold");
        total.redis += seen.redis;
        total.on_error += seen.on_error;
    }
    assert!(
        calls * 2 < before,
        "batches formed: {calls} calls for about {before} requests"
    );
    assert!(total.redis >= 2_000, "{} answers from Redis", total.redis);
    assert!(total.on_error >= 48, "{} on_error answers", total.on_error);
    let failures = limiter
        .events()
        .into_iter()
        .find(|(name, _)| *name == "failure")
        .map_or(0, |(_, n)| n);
    assert!(failures >= 1, "failed calls counted");
}
