//! Reservations (the Throttle API's Reserve and Commit) on both backends (docs/holds.md,
//! "Reservations").
//!
//! - The limiters themselves, on one manual clock: the memory backend and two replicas on one
//!   real `redis-server` give identical outcomes for the same operations, on every rate
//!   algorithm, each operation one script call on Redis: a scripted sequence, and 150 random
//!   steps per algorithm.
//! - Through the real gRPC server, on each backend (memory; a real `redis-server`): a commit
//!   below the estimate gives back the difference (the next reserve and check see it), one
//!   above charges it even over the limit (owed: the key is in debt), a second commit and an
//!   unknown id settle nothing, an expired reservation keeps its estimate and its commit
//!   settles nothing, a key keeps at most 1000 open, bad input is `INVALID_ARGUMENT`, and the
//!   Rust client's `Reservation` commits, cancels, and keeps the estimate when dropped.

use std::sync::Arc;
use std::time::Duration;

use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::reserve::{ReserveOp, ReserveOutcome, ReserveRequest, records_key};
use sluice::limiter::{Batch, Hit, LimitParams, Limiter, Role};
use sluice_client::pb::sluice::v1::throttle_client::ThrottleClient;
use sluice_client::pb::sluice::v1::{
    self as pb, CommitRequest, ReserveRequest as ReserveCall, ThrottleKey, ThrottleRequest,
    commit_request, reserve_request, throttle_key,
};
use sluice_client::{Client, Limit, Reserve, ReserveError};
use tonic::transport::Channel;

use crate::support::backends::{Backend, memory_serving, redis_serving};
use crate::support::limiters::Backends;

const SEC: u64 = 1_000_000_000;
/// 100 per hour, 100 at once: one unit every 36 s, so nothing drains during a test.
const COUNT: u32 = 100;
const PERIOD_MS: u64 = 3_600_000;

const ALGORITHMS: [(Algorithm, pb::Algorithm); 5] = [
    (Algorithm::Funnel, pb::Algorithm::Funnel),
    (Algorithm::TokenBucket, pb::Algorithm::TokenBucket),
    (Algorithm::FixedWindow, pb::Algorithm::FixedWindow),
    (Algorithm::SlidingWindow, pb::Algorithm::SlidingWindow),
    (Algorithm::SlidingLog, pb::Algorithm::SlidingLog),
];

// The limiters, side by side.

fn rate_hit(algorithm: Algorithm, cost: u64) -> Hit {
    let name = format!("throttle:{{k}}:{algorithm:?}:{PERIOD_MS}ms");
    Hit {
        key: Arc::from(name.as_bytes()),
        limit: LimitParams {
            algorithm,
            quota: COUNT,
            period_nanos: PERIOD_MS * 1_000_000,
            burst: COUNT,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        },
        cost,
        refund: false,
        hold: None,
        group: 0,
        role: Role::Enforced,
    }
}

fn reserve_op(algorithm: Algorithm, amount: u64, ttl_nanos: u64) -> ReserveRequest {
    let hit = rate_hit(algorithm, amount);
    ReserveRequest {
        records: records_key(&hit.key),
        ttl_nanos,
        op: ReserveOp::Reserve {
            batch: Batch { hits: vec![hit] },
            amount,
        },
    }
}

fn commit_op(algorithm: Algorithm, id: u64, actual: u64) -> ReserveRequest {
    let hit = rate_hit(algorithm, 0);
    ReserveRequest {
        records: records_key(&hit.key),
        ttl_nanos: 1,
        op: ReserveOp::Commit { id, actual, hit },
    }
}

/// The outcome with its times rounded up to the microsecond, the script's unit (a sliding
/// window's reset, in nanoseconds on the memory backend, can be a few nanoseconds over a
/// whole microsecond).
fn micros(mut outcome: ReserveOutcome) -> ReserveOutcome {
    for hit in outcome.outcome.iter_mut().flat_map(|o| o.hits.iter_mut()) {
        hit.reset_nanos = hit.reset_nanos.div_ceil(1_000) * 1_000;
    }
    outcome
}

impl Backends {
    /// One operation on both backends (the next replica in turn): their common outcome,
    /// after checking it took one script call.
    async fn reserve(&mut self, request: ReserveRequest) -> ReserveOutcome {
        let expected = micros(self.memory.reserve(&request).await.expect("memory answers"));
        let replica = &self.replicas[self.step % 2];
        self.step += 1;
        self.redis.reset_stats();
        let got = replica.reserve(&request).await.expect("redis answers");
        // The first call of all finds the script not cached yet: EVALSHA, NOSCRIPT, EVAL.
        let calls = if self.step == 1 { 2 } else { 1 };
        assert_eq!(self.redis.script_calls(), calls, "step {}", self.step);
        assert_eq!(
            micros(got),
            expected,
            "step {}: {:?}",
            self.step,
            request.op
        );
        expected
    }
}

#[tokio::test]
async fn both_backends_settle_every_algorithm_alike_in_one_script_call() {
    within(settle_every_algorithm_alike()).await;
}

async fn settle_every_algorithm_alike() {
    let mut b = Backends::start();
    for (algorithm, _) in ALGORITHMS {
        let r = b.reserve(reserve_op(algorithm, 40, 2 * SEC)).await;
        assert!(r.done, "{algorithm:?}: {r:?}");
        let remaining = |o: &ReserveOutcome| o.outcome.as_ref().map(|o| o.hits[0].remaining);
        assert_eq!(remaining(&r), Some(60), "{algorithm:?}");
        let below = b.reserve(commit_op(algorithm, r.id, 25)).await;
        assert!(
            below.done && below.estimate == 40,
            "{algorithm:?}: {below:?}"
        );
        let after = |o: &ReserveOutcome| o.outcome.as_ref().map(|o| o.hits[1]);
        assert_eq!(
            after(&below).map(|h| h.remaining),
            Some(75),
            "{algorithm:?}"
        );
        let again = b.reserve(commit_op(algorithm, r.id, 25)).await;
        assert!(!again.done, "{algorithm:?}: committed once");
        let big = b.reserve(reserve_op(algorithm, 70, 2 * SEC)).await;
        assert!(big.done && big.open == 1, "{algorithm:?}: {big:?}");
        let refused = b.reserve(reserve_op(algorithm, 6, 2 * SEC)).await;
        assert!(
            !refused.done && refused.open == 1,
            "{algorithm:?}: {refused:?}"
        );
        let over = b.reserve(commit_op(algorithm, big.id, 90)).await;
        let owed = after(&over).expect("a check after");
        assert!(
            over.done && !owed.admitted,
            "{algorithm:?}: in debt: {over:?}"
        );
        let more = b.reserve(reserve_op(algorithm, 1, SEC)).await;
        assert!(
            !more.done,
            "{algorithm:?}: in debt, nothing more is admitted"
        );
    }
    // Past every ttl: the next call on a key drops its records, and the key with them.
    b.clock.advance(3 * SEC);
    for (algorithm, _) in ALGORITHMS {
        let gone = b.reserve(commit_op(algorithm, 1, 0)).await;
        assert!(!gone.done && gone.open == 0, "{algorithm:?}: {gone:?}");
        let key = records_key(&rate_hit(algorithm, 0).key);
        let key = format!("sluice:{}", String::from_utf8_lossy(&key));
        let exists: u64 = b.redis.cmd(&["EXISTS", &key]);
        assert_eq!(exists, 0, "{algorithm:?}: no record kept in Redis");
    }
}

#[tokio::test]
async fn an_expired_reservation_keeps_its_estimate_on_both_backends() {
    within(expired_estimate_kept()).await;
}

async fn expired_estimate_kept() {
    let mut b = Backends::start();
    let r = b.reserve(reserve_op(Algorithm::Funnel, 30, SEC)).await;
    assert!(r.done);
    b.clock.advance(SEC);
    let late = b.reserve(commit_op(Algorithm::Funnel, r.id, 0)).await;
    assert!(!late.done, "expired at its ttl: {late:?}");
    let after = late.outcome.expect("a check").hits[1];
    assert_eq!(after.remaining, 70, "the estimate stays charged");
}

// Through the gRPC server.

/// Lets `by` pass: the memory backend's manual clock moves; Redis reads its own, so the test
/// sleeps.
async fn pass(b: &Backend, by: Duration) {
    match b.memory_clock() {
        Some(clock) => clock.advance(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX)),
        None => tokio::time::sleep(by).await,
    }
}

async fn stub(b: &Backend) -> ThrottleClient<Channel> {
    ThrottleClient::connect(b.url()).await.expect("connect")
}

fn ask(key: &str, algorithm: pb::Algorithm, amount: u64, ttl_ms: u64) -> ReserveCall {
    ReserveCall {
        id: Some(reserve_request::Id::Key(key.to_owned())),
        max_burst: COUNT - 1,
        count: COUNT,
        period_ms: PERIOD_MS,
        algorithm: algorithm.into(),
        amount,
        ttl_ms,
        name: "reserve".to_owned(),
    }
}

fn settle(key: &str, algorithm: pb::Algorithm, reservation_id: u64, actual: u64) -> CommitRequest {
    CommitRequest {
        id: Some(commit_request::Id::Key(key.to_owned())),
        max_burst: COUNT - 1,
        count: COUNT,
        period_ms: PERIOD_MS,
        algorithm: algorithm.into(),
        reservation_id,
        actual,
        name: "reserve".to_owned(),
    }
}

/// A Throttle check (quantity 0) of the same key and limit: (limited, remaining).
async fn check(
    s: &mut ThrottleClient<Channel>,
    key: &str,
    algorithm: pb::Algorithm,
) -> (bool, u64) {
    let request = ThrottleRequest {
        keys: vec![ThrottleKey {
            id: Some(throttle_key::Id::Key(key.to_owned())),
            max_burst: COUNT - 1,
            count: COUNT,
            period_ms: PERIOD_MS,
            quantity: Some(0),
            refund: false,
            algorithm: algorithm.into(),
        }],
        name: String::new(),
    };
    let answer = s.throttle(request).await.expect("a check").into_inner();
    (answer.limited, answer.results[0].remaining)
}

async fn reserve(s: &mut ThrottleClient<Channel>, r: ReserveCall) -> pb::ReserveResponse {
    s.reserve(r).await.expect("an answer").into_inner()
}

async fn commit(s: &mut ThrottleClient<Channel>, c: CommitRequest) -> pb::CommitResponse {
    s.commit(c).await.expect("an answer").into_inner()
}

/// Runs `body`, failing the test when it takes more than 60 s (the slowest, 1000 reserves
/// on Redis, takes a few seconds).
async fn within(body: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), body)
        .await
        .expect("the scenario ends within 60 s");
}

/// Runs `scenario` on a server over memory, then over a real `redis-server`.
macro_rules! on_both_backends {
    ($name:ident, |$b:ident| $body:block) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn memory() {
                let ($b, _) = memory_serving(crate::support::backends::RULES).await;
                within(async { $body }).await;
            }

            #[tokio::test]
            async fn redis() {
                let ($b, _) = redis_serving(crate::support::backends::RULES).await;
                within(async { $body }).await;
            }
        }
    };
}

on_both_backends!(a_commit_gives_back_or_owes_the_difference, |b| {
    let mut s = stub(&b).await;
    for (_, algorithm) in ALGORITHMS {
        let key = format!("tenant-{}", algorithm.as_str_name());
        let key = key.as_str();
        let r = reserve(&mut s, ask(key, algorithm, 40, 60_000)).await;
        assert!(r.admitted && r.reservation_id != 0, "{key}: {r:?}");
        assert_eq!(
            (r.limit, r.remaining, r.retry_after_ms, r.open),
            (100, 60, -1, 1)
        );
        assert_eq!(check(&mut s, key, algorithm).await, (false, 60));

        // Below the estimate: 15 given back, and the key admits them again.
        let below = commit(&mut s, settle(key, algorithm, r.reservation_id, 25)).await;
        assert!(below.settled && !below.owed, "{key}: {below:?}");
        assert_eq!(
            (below.estimate, below.given_back, below.charged),
            (40, 15, 0)
        );
        assert_eq!((below.remaining, below.retry_after_ms), (75, -1));
        assert_eq!(check(&mut s, key, algorithm).await, (false, 75), "{key}");

        // A second commit of the same id, and an unknown id, settle nothing.
        let twice = commit(&mut s, settle(key, algorithm, r.reservation_id, 0)).await;
        assert!(!twice.settled && twice.given_back == 0, "{key}: {twice:?}");
        let unknown = commit(&mut s, settle(key, algorithm, r.reservation_id + 999, 0)).await;
        assert!(!unknown.settled, "{key}: {unknown:?}");
        assert_eq!(check(&mut s, key, algorithm).await, (false, 75), "{key}");

        // A reserve the limit refuses takes nothing and opens nothing.
        let big = reserve(&mut s, ask(key, algorithm, 70, 60_000)).await;
        assert!(big.admitted && big.remaining == 5, "{key}: {big:?}");
        let refused = reserve(&mut s, ask(key, algorithm, 6, 60_000)).await;
        assert!(
            !refused.admitted && refused.reservation_id == 0,
            "{key}: {refused:?}"
        );
        assert!(
            refused.retry_after_ms > 0 && refused.open == 1,
            "{key}: {refused:?}"
        );
        assert_eq!(check(&mut s, key, algorithm).await, (false, 5), "{key}");

        // Above the estimate: the 20 are charged though only 5 remain; 15 are owed.
        let over = commit(&mut s, settle(key, algorithm, big.reservation_id, 90)).await;
        assert!(over.settled && over.owed, "{key}: {over:?}");
        assert_eq!((over.charged, over.given_back, over.remaining), (20, 0, 0));
        assert!(
            over.retry_after_ms > 0,
            "{key}: until the debt is paid: {over:?}"
        );
        assert_eq!(
            check(&mut s, key, algorithm).await,
            (true, 0),
            "{key}: in debt, a check is over the limit"
        );
    }
});

on_both_backends!(an_expired_reservation_keeps_its_estimate, |b| {
    let mut s = stub(&b).await;
    let f = pb::Algorithm::Funnel;
    let r = reserve(&mut s, ask("expiring", f, 30, 200)).await;
    assert!(r.admitted && r.remaining == 70, "{r:?}");
    pass(&b, Duration::from_millis(300)).await;
    // Kept: the estimate stays charged; the commit finds nothing and settles nothing, even
    // one that would give everything back.
    let late = commit(&mut s, settle("expiring", f, r.reservation_id, 0)).await;
    assert!(
        !late.settled && late.given_back == 0 && late.remaining == 70,
        "{late:?}"
    );
    assert_eq!(check(&mut s, "expiring", f).await, (false, 70));
    let next = reserve(&mut s, ask("expiring", f, 1, 200)).await;
    assert_eq!(
        (next.admitted, next.open),
        (true, 1),
        "the expired record is gone"
    );
});

on_both_backends!(a_key_keeps_at_most_a_thousand_open, |b| {
    let mut s = stub(&b).await;
    let f = pb::Algorithm::Funnel;
    // 10000 at once, one unit back every 864 s: nothing drains during the test.
    const LONG_MS: u64 = 8_640_000_000;
    let mut wide = ask("crowded", f, 1, 60_000);
    wide.count = 10_000;
    wide.max_burst = 9_999;
    wide.period_ms = LONG_MS;
    let started = tokio::time::Instant::now();
    for n in 1..=1000 {
        let r = reserve(&mut s, wide.clone()).await;
        assert!(r.admitted && r.open == n, "{n}: {r:?}");
    }
    println!("1000 reserves on one key: {:?}", started.elapsed());
    let full = s.reserve(wide.clone()).await.expect_err("full");
    assert_eq!(full.code(), tonic::Code::ResourceExhausted, "{full:?}");
    assert!(full.message().contains("1000 reservations"), "{full:?}");
    let probe = ThrottleKey {
        id: Some(throttle_key::Id::Key("crowded".to_owned())),
        max_burst: 9_999,
        count: 10_000,
        period_ms: LONG_MS,
        quantity: Some(0),
        refund: false,
        algorithm: f.into(),
    };
    let seen = s
        .throttle(ThrottleRequest {
            keys: vec![probe.clone()],
            name: String::new(),
        })
        .await
        .expect("a check")
        .into_inner();
    assert_eq!(
        seen.results[0].remaining, 9_000,
        "the refused one took nothing"
    );
});

on_both_backends!(bad_input_is_invalid_argument, |b| {
    let mut s = stub(&b).await;
    let f = pb::Algorithm::Funnel;
    let bad_reserves = [
        (ask("k", f, 0, 1000), "amount must be at least 1"),
        (
            ask("k", f, 101, 1000),
            "amount: 101, more than the key's limit 100",
        ),
        (ask("k", f, u64::MAX, 1000), "amount: "),
        (ask("k", f, 1, 0), "ttl_ms must be from 1 to 86400000"),
        (
            ask("k", f, 1, 86_400_001),
            "ttl_ms must be from 1 to 86400000",
        ),
        (ask("", f, 1, 1000), "key: "),
        (
            ReserveCall {
                count: 0,
                ..ask("k", f, 1, 1000)
            },
            "count must be at least 1",
        ),
        (
            ReserveCall {
                algorithm: 99,
                ..ask("k", f, 1, 1000)
            },
            "algorithm: unknown value 99",
        ),
    ];
    for (request, message) in bad_reserves {
        let e = s.reserve(request.clone()).await.expect_err("invalid");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{request:?}: {e:?}");
        assert!(e.message().starts_with(message), "{request:?}: {e:?}");
    }
    let bad_commits = [
        (settle("k", f, 0, 1), "reservation_id: "),
        (settle("k", f, 1, u64::MAX), "actual: "),
        (settle("", f, 1, 1), "key: "),
    ];
    for (request, message) in bad_commits {
        let e = s.commit(request.clone()).await.expect_err("invalid");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{request:?}: {e:?}");
        assert!(e.message().starts_with(message), "{request:?}: {e:?}");
    }
    assert_eq!(
        check(&mut s, "k", f).await,
        (false, 100),
        "nothing was charged"
    );
});

on_both_backends!(the_rust_clients_reservation, |b| {
    let client = Client::builder(b.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    let mut s = stub(&b).await;
    let f = pb::Algorithm::Funnel;
    let limit = Limit::per(COUNT, Duration::from_millis(PERIOD_MS)).max_burst(COUNT - 1);
    let ttl = Duration::from_secs(60);

    let r = client
        .reserve(Reserve::key("client", limit, 50, ttl))
        .await
        .expect("reserved");
    assert_eq!(r.remaining(), 50);
    let settled = r.commit(20).await.expect("an answer");
    assert!(settled.settled && settled.given_back == 30 && settled.remaining == 80);

    let r = client
        .reserve(Reserve::key("client", limit, 10, ttl))
        .await
        .expect("reserved");
    let cancelled = r.cancel().await.expect("an answer");
    assert!(cancelled.settled && cancelled.given_back == 10 && cancelled.remaining == 80);

    // Dropped uncommitted: nothing is sent, the estimate stays charged.
    let r = client
        .reserve(Reserve::key("client", limit, 60, ttl))
        .await
        .expect("reserved");
    drop(r);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(check(&mut s, "client", f).await, (false, 20));

    let refused = client
        .reserve(Reserve::key("client", limit, 21, ttl))
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, ReserveError::Refused { retry_after } if retry_after > Duration::ZERO),
        "{refused:?}"
    );
    let invalid = client
        .reserve(Reserve::key("client", limit, 0, ttl))
        .await
        .expect_err("invalid");
    assert!(
        matches!(&invalid, ReserveError::Failed(sluice_client::Error::Status(s))
            if s.code() == tonic::Code::InvalidArgument),
        "{invalid:?}"
    );
});

/// A reserve or commit on a fast limit (10 per 10 s, 10 at once), for the random sequences.
fn fast(algorithm: Algorithm, op: Result<(u64, u64), (u64, u64)>) -> ReserveRequest {
    let mut hit = rate_hit(algorithm, 0);
    hit.key = Arc::from(format!("throttle:{{fast}}:{algorithm:?}:10000ms").as_bytes());
    hit.limit.quota = 10;
    hit.limit.burst = 10;
    hit.limit.period_nanos = 10 * SEC;
    let records = records_key(&hit.key);
    match op {
        Ok((amount, ttl_ms)) => {
            hit.cost = amount;
            ReserveRequest {
                records,
                ttl_nanos: ttl_ms * 1_000_000,
                op: ReserveOp::Reserve {
                    batch: Batch { hits: vec![hit] },
                    amount,
                },
            }
        }
        Err((id, actual)) => ReserveRequest {
            records,
            ttl_nanos: 1,
            op: ReserveOp::Commit { id, actual, hit },
        },
    }
}

#[tokio::test]
async fn random_reserves_and_commits_agree_on_both_backends() {
    within(random_sequences()).await;
}

/// 150 random steps per algorithm (reserves of 1 to 6 with ttls of 0.5 to 3 s, commits of 0
/// to 8 of an open, settled, expired or unknown id, the clock moving 0 to 1.5 s): the memory
/// backend and the Redis replicas answer alike, one script call each.
async fn random_sequences() {
    let mut b = Backends::start();
    let mut rng = crate::support::rng::Rng::new(30);
    let (mut reserved, mut settled) = (0, 0);
    for (algorithm, _) in ALGORITHMS {
        let mut ids: Vec<u64> = Vec::new();
        for _ in 0..150 {
            b.clock.advance(rng.below(1_500) * 1_000_000);
            let op = if ids.is_empty() || rng.chance(50) {
                Ok((1 + rng.below(6), 500 + rng.below(2_500)))
            } else {
                let id = if rng.chance(10) {
                    rng.next() >> 20
                } else if rng.chance(60) {
                    ids.last().copied().unwrap_or(0)
                } else {
                    rng.pick(&ids)
                };
                Err((id, rng.below(9)))
            };
            let outcome = b.reserve(fast(algorithm, op)).await;
            match op {
                Ok(_) if outcome.done => {
                    reserved += 1;
                    ids.push(outcome.id);
                }
                Err((id, _)) if outcome.done => {
                    settled += 1;
                    if rng.chance(70) {
                        ids.retain(|&i| i != id);
                    }
                }
                _ => {}
            }
        }
    }
    println!(
        "random reserves and commits: {reserved} reserved, {settled} settled, {} steps",
        b.step
    );
    assert!(
        reserved >= 100 && settled >= 50,
        "{reserved} reserved, {settled} settled"
    );
}
