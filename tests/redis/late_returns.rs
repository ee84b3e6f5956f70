//! Returns that never give back drained capacity, and limits that keep what was used when
//! they change (docs/algorithms.md, "Returns" and "A changed limit"), on both backends.
//!
//! - Through the real Throttle gRPC path, on each backend (memory on a manual clock; a real
//!   `redis-server`, which reads its own clock): a funnel of 10 a second with `max_burst` 39;
//!   40 reserved at 0; at 3.9 s a Throttle of 38 is admitted; then a commit of 0 used (one
//!   key), or a `refund: true` Throttle of 40 (another): the next Throttle of 40 is refused.
//! - Through a real reload (the rules file rewritten, the app's reload trigger), on each
//!   backend, a funnel and a token bucket: lowered from 10 to 5 a minute after 5 requests, the
//!   next is refused; raised from 5 to 10 after 5, the next 5 are admitted and the 6th refused.
//! - The limiters themselves on one manual clock: random takes, anonymous refunds, reserves,
//!   commits and limit changes (quota and burst) on every rate algorithm give identical
//!   outcomes on the memory backend and on Redis, step by step.
//! - States written by an older sluice (Redis) are still read, as they meant.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice::app::{App, Listeners};
use sluice::config::model::{Algorithm, Charge};
use sluice::config::settings::Settings;
use sluice::limiter::reserve::{ReserveOp, ReserveOutcome, ReserveRequest, records_key};
use sluice::limiter::{
    Batch, BatchOutcome, Clock, Hit, LimitParams, Limiter, MemoryLimiter, RedisLimiter, Role,
};
use sluice::reload::ReloadTrigger;
use sluice::testing::eventually;
use sluice::testing::grpc::*;
use sluice::testing::redis::RedisServer;
use sluice_client::pb::sluice::v1::throttle_client::ThrottleClient;
use sluice_client::pb::sluice::v1::{
    self as pb, CommitRequest, ReserveRequest as ReserveCall, ThrottleKey, ThrottleRequest,
    commit_request, reserve_request, throttle_key,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::support::backends::{Backend, memory_serving, redis_serving};
use crate::support::limiters::Backends;
use crate::support::rng::Rng;

const SEC: u64 = 1_000_000_000;

// The measured case, through the Throttle API.

/// 10 a second, `max_burst` 39: 40 at once.
fn throttle_key(key: &str, quantity: i64, refund: bool) -> ThrottleKey {
    ThrottleKey {
        id: Some(throttle_key::Id::Key(key.to_owned())),
        max_burst: 39,
        count: 10,
        period_ms: 1_000,
        quantity: Some(quantity),
        refund,
        algorithm: pb::Algorithm::Funnel.into(),
    }
}

/// A Throttle call of one key: (limited, remaining).
async fn throttle(
    s: &mut ThrottleClient<Channel>,
    key: &str,
    quantity: i64,
    refund: bool,
) -> (bool, u64) {
    let request = ThrottleRequest {
        keys: vec![throttle_key(key, quantity, refund)],
        name: String::new(),
    };
    let answer = s.throttle(request).await.expect("an answer").into_inner();
    (answer.limited, answer.results[0].remaining)
}

async fn reserve_40(s: &mut ThrottleClient<Channel>, key: &str) -> u64 {
    let call = ReserveCall {
        id: Some(reserve_request::Id::Key(key.to_owned())),
        max_burst: 39,
        count: 10,
        period_ms: 1_000,
        algorithm: pb::Algorithm::Funnel.into(),
        amount: 40,
        ttl_ms: 60_000,
        name: "late".to_owned(),
    };
    let r = s.reserve(call).await.expect("an answer").into_inner();
    assert!(r.admitted && r.remaining == 0, "{key}: {r:?}");
    r.reservation_id
}

async fn commit_0(s: &mut ThrottleClient<Channel>, key: &str, id: u64) -> pb::CommitResponse {
    let call = CommitRequest {
        id: Some(commit_request::Id::Key(key.to_owned())),
        max_burst: 39,
        count: 10,
        period_ms: 1_000,
        algorithm: pb::Algorithm::Funnel.into(),
        reservation_id: id,
        actual: 0,
        name: "late".to_owned(),
    };
    s.commit(call).await.expect("an answer").into_inner()
}

/// Lets `by` pass: the memory backend's manual clock moves; Redis reads its own clock, so
/// the test sleeps.
async fn pass(b: &Backend, by: Duration) {
    match b.memory_clock() {
        Some(clock) => clock.advance(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX)),
        None => tokio::time::sleep(by).await,
    }
}

/// Both late returns, each on its own key, at one 3.9 s.
async fn late_returns_never_give_back_drained_units(b: &Backend) {
    let mut s = ThrottleClient::connect(b.url()).await.expect("connect");
    let by_commit = reserve_40(&mut s, "late-commit").await;
    reserve_40(&mut s, "late-refund").await;
    pass(b, Duration::from_millis(3_900)).await;
    for key in ["late-commit", "late-refund"] {
        let (limited, _) = throttle(&mut s, key, 38, false).await;
        assert!(!limited, "{key}: 38 fit once 39 units have drained");
    }
    let settled = commit_0(&mut s, "late-commit", by_commit).await;
    assert!(settled.settled, "{settled:?}");
    assert!(
        settled.remaining <= 3,
        "only the slots still ahead come back: {settled:?}"
    );
    // The anonymous refund gives back at most what anonymous takes put in since the
    // reservation: the 38, not the reservation's drained units.
    let (_, after_refund) = throttle(&mut s, "late-refund", 40, true).await;
    assert!(after_refund <= 40, "{after_refund}");
    for key in ["late-commit", "late-refund"] {
        let (limited, remaining) = throttle(&mut s, key, 40, false).await;
        assert!(
            limited,
            "{key}: a Throttle of 40 is refused (remaining {remaining})"
        );
    }
}

#[tokio::test]
async fn a_late_commit_or_refund_gives_back_no_drained_capacity_memory() {
    let (b, _) = memory_serving(crate::support::backends::RULES).await;
    within(late_returns_never_give_back_drained_units(&b)).await;
}

#[tokio::test]
async fn a_late_commit_or_refund_gives_back_no_drained_capacity_redis() {
    let (b, _) = redis_serving(crate::support::backends::RULES).await;
    within(late_returns_never_give_back_drained_units(&b)).await;
}

async fn within(body: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), body)
        .await
        .expect("the scenario ends within 60 s");
}

// A changed limit, through a real reload.

fn per_minute(n: u32) -> String {
    format!(
        "domain: test\ndescriptors:\n  - key: f\n    rate_limit: {{unit: minute, requests_per_unit: {n}, algorithm: funnel}}\n  - key: b\n    rate_limit: {{unit: minute, requests_per_unit: {n}, algorithm: token_bucket}}\n"
    )
}

struct Reloading {
    grpc: String,
    trigger: ReloadTrigger,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn serve(file: &Path, limiter: Arc<dyn Limiter>) -> Reloading {
    let mut settings = Settings::default();
    settings.rules.paths = vec![file.to_path_buf()];
    settings.reload.watch = false;
    let model = sluice::reload::load(&settings.rules.paths, (&settings.limits).into())
        .expect("valid rules at start");
    let app = App::from_parts(&settings, sluice::rules::RuleSet::compile(model), limiter);
    let trigger = app.reload_trigger();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = grpc.local_addr().expect("an address");
    let stop = CancellationToken::new();
    let listeners = Listeners {
        grpc: grpc.into(),
        admin: None,
    };
    let task = tokio::spawn(app.run(listeners, stop.clone().cancelled_owned()));
    Reloading {
        grpc: format!("http://{addr}"),
        trigger,
        stop,
        task,
    }
}

impl Reloading {
    /// Whether one request on `key=value` is admitted.
    async fn admits(&self, key: &str, value: &str) -> bool {
        let mut c = RateLimitServiceClient::connect(self.grpc.clone())
            .await
            .expect("connect");
        overall(&hit(&mut c, key, value).await) == Code::Ok
    }

    /// Rewrites the rules to `n` a minute and reloads; returns once `key` answers with it
    /// (asked on a value of its own, which the test does not use otherwise).
    async fn reload_to(&self, file: &Path, n: u32, round: usize) {
        std::fs::write(file, per_minute(n)).expect("write the rules");
        self.trigger.reload();
        let probe = std::sync::atomic::AtomicUsize::new(0);
        let grpc = &self.grpc;
        eventually(Duration::from_secs(5), "the reload", || {
            let value = format!(
                "probe-{round}-{}",
                probe.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            async move {
                let mut c = RateLimitServiceClient::connect(grpc.clone())
                    .await
                    .expect("connect");
                let r = call(&mut c, req("test", vec![desc(&[("f", &value)])])).await;
                limit_of(&r.statuses[0]).is_some_and(|l| l.0 == n)
            }
        })
        .await;
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn a_changed_limit_keeps_what_was_used(limiter: Arc<dyn Limiter>) {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, per_minute(10)).expect("write the rules");
    let server = serve(&file, limiter).await;
    for key in ["f", "b"] {
        for n in 0..5 {
            assert!(server.admits(key, "lowered").await, "{key}: request {n}");
        }
    }
    server.reload_to(&file, 5, 1).await;
    for key in ["f", "b"] {
        assert!(
            !server.admits(key, "lowered").await,
            "{key}: lowered to 5 after 5: the next is refused"
        );
        for n in 0..5 {
            assert!(server.admits(key, "raised").await, "{key}: request {n}");
        }
    }
    server.reload_to(&file, 10, 2).await;
    for key in ["f", "b"] {
        for n in 0..5 {
            assert!(
                server.admits(key, "raised").await,
                "{key}: raised to 10 after 5: request {n} of the 5 more"
            );
        }
        assert!(
            !server.admits(key, "raised").await,
            "{key}: the 6th is refused"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_changed_limit_keeps_what_was_used_memory() {
    within(a_changed_limit_keeps_what_was_used(Arc::new(
        MemoryLimiter::new(1_000),
    )))
    .await;
}

#[tokio::test]
async fn a_changed_limit_keeps_what_was_used_redis() {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1_000).expect("valid redis settings");
    within(a_changed_limit_keeps_what_was_used(Arc::new(limiter))).await;
}

// The limiters, side by side, on one manual clock.

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Funnel,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

/// One hour; 50 or 100 an hour (intervals of 72 and 36 s, whose ratio keeps a funnel's
/// converted level in whole microseconds, the script's unit, on steps of whole seconds).
const PERIOD: u64 = 3_600 * SEC;

fn random_limit(rng: &mut Rng, algorithm: Algorithm) -> LimitParams {
    let quota = rng.pick(&[50, 100]);
    let capacity = matches!(algorithm, Algorithm::Funnel | Algorithm::TokenBucket);
    LimitParams {
        algorithm,
        quota,
        period_nanos: PERIOD,
        burst: if capacity {
            rng.pick(&[40, 60, 100])
        } else {
            quota
        },
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

fn hit_of(algorithm: Algorithm, limit: LimitParams, cost: u64, refund: bool) -> Hit {
    let name = format!("returns:{{k}}:{}:3600", algorithm.as_str());
    Hit {
        key: Arc::from(name.as_bytes()),
        limit,
        cost,
        refund,
        hold: None,
        group: 0,
        role: Role::Enforced,
    }
}

/// Times rounded up to the microsecond (the script's unit), and no deny-cache flag.
fn normal(mut outcome: BatchOutcome) -> BatchOutcome {
    for hit in &mut outcome.hits {
        hit.reset_nanos = hit.reset_nanos.div_ceil(1_000) * 1_000;
        hit.from_local_cache = false;
    }
    outcome
}

fn normal_reserve(mut outcome: ReserveOutcome) -> ReserveOutcome {
    outcome.outcome = outcome.outcome.map(normal);
    outcome
}

impl Backends {
    async fn both_check(&mut self, batch: Batch) -> BatchOutcome {
        let expected = normal(self.memory.check(&batch).await.expect("memory answers"));
        let got = normal(self.replicas[0].check(&batch).await.expect("redis answers"));
        self.step += 1;
        assert_eq!(got, expected, "step {}: {batch:?}", self.step);
        expected
    }

    async fn both_reserve(&mut self, request: ReserveRequest) -> ReserveOutcome {
        let expected = normal_reserve(self.memory.reserve(&request).await.expect("memory"));
        let got = normal_reserve(self.replicas[0].reserve(&request).await.expect("redis"));
        self.step += 1;
        assert_eq!(got, expected, "step {}: {:?}", self.step, request.op);
        expected
    }
}

/// 200 random steps per algorithm: the clock moves 0 to 200 s in whole seconds; the limit
/// changes (quota 50 or 100 an hour, burst 40, 60 or 100) at a fifth of the steps; a step is
/// a take (0 to 60), an anonymous refund (1 to 60), a reserve (1 to 40, ttl 30 s to 10 min)
/// or a commit (0 to 50 used) of an open, settled or expired reservation.
#[tokio::test]
async fn random_returns_and_limit_changes_agree_on_both_backends() {
    within(random_returns()).await;
}

async fn random_returns() {
    let mut b = Backends::start();
    let mut rng = Rng::new(37);
    let (mut named, mut refunds, mut changes) = (0, 0, 0);
    for algorithm in ALGORITHMS {
        let mut limit = random_limit(&mut rng, algorithm);
        let mut ids: Vec<u64> = Vec::new();
        for _ in 0..200 {
            b.clock.advance(rng.pick(&[0, 0, 1, 5, 36, 200]) * SEC);
            if rng.chance(20) {
                limit = random_limit(&mut rng, algorithm);
                changes += 1;
            }
            match rng.below(4) {
                0 => {
                    let cost = rng.below(61);
                    b.both_check(Batch {
                        hits: vec![hit_of(algorithm, limit, cost, false)],
                    })
                    .await;
                }
                1 => {
                    refunds += 1;
                    let cost = 1 + rng.below(60);
                    b.both_check(Batch {
                        hits: vec![hit_of(algorithm, limit, cost, true)],
                    })
                    .await;
                }
                2 => {
                    let amount = 1 + rng.below(40);
                    let hit = hit_of(algorithm, limit, amount, false);
                    let request = ReserveRequest {
                        records: records_key(&hit.key),
                        ttl_nanos: (30 + rng.below(570)) * SEC,
                        op: ReserveOp::Reserve {
                            batch: Batch { hits: vec![hit] },
                            amount,
                        },
                    };
                    let r = b.both_reserve(request).await;
                    if r.done {
                        ids.push(r.id);
                    }
                }
                _ => {
                    let Some(id) = (!ids.is_empty()).then(|| rng.pick(&ids)) else {
                        continue;
                    };
                    let hit = hit_of(algorithm, limit, 0, false);
                    let request = ReserveRequest {
                        records: records_key(&hit.key),
                        ttl_nanos: 1,
                        op: ReserveOp::Commit {
                            id,
                            actual: rng.below(51),
                            hit,
                        },
                    };
                    if b.both_reserve(request).await.done {
                        named += 1;
                        ids.retain(|&i| i != id);
                    }
                }
            }
        }
    }
    println!(
        "random returns: {named} commits settled, {refunds} refunds, {changes} limit changes, {} steps",
        b.step
    );
    assert!(
        named >= 30 && refunds >= 100 && changes >= 100,
        "{named}, {refunds}, {changes}"
    );
}

/// Keys written by an older sluice, in either text format (`tat`, `used:anchor`,
/// `start:count`, `start:current:previous`; and the same with a refundable count last, here 0)
/// are read as they were: 3 of 10 used; nothing refundable (a refund gives nothing back); the
/// next take writes the packed format, with its refundable count.
#[tokio::test]
async fn states_of_the_older_formats_are_still_read() {
    let b = Backends::start();
    let now = b.clock.now_nanos() / 1_000;
    let hour = 3_600_000_000;
    let window = now - now % hour;
    let tat = now + 3 * 360_000_000;
    let olds = [
        (Algorithm::Funnel, format!("{tat}"), 3),
        (Algorithm::TokenBucket, format!("3:{now}"), 3),
        (Algorithm::FixedWindow, format!("{window}:3"), 3),
        (Algorithm::SlidingWindow, format!("{window}:3:0"), 4),
        (Algorithm::Funnel, format!("{tat}:10:0"), 3),
        (Algorithm::TokenBucket, format!("3:{now}:0"), 3),
        (Algorithm::FixedWindow, format!("{window}:3:0"), 3),
        (Algorithm::SlidingWindow, format!("{window}:3:0:0"), 4),
    ];
    for (algorithm, text, fields) in olds {
        let limit = LimitParams {
            algorithm,
            quota: 10,
            period_nanos: PERIOD,
            burst: 10,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        };
        let hit = hit_of(algorithm, limit, 0, false);
        let key = format!("sluice:{}", String::from_utf8_lossy(&hit.key));
        let _: () = b.redis.cmd(&["SET", &key, &text, "PX", "3600000"]);
        let replica = &b.replicas[0];
        let check = |cost: u64, refund: bool| Batch {
            hits: vec![hit_of(algorithm, limit, cost, refund)],
        };
        let seen = replica.check(&check(0, false)).await.expect("an answer");
        assert_eq!(seen.hits[0].remaining, 7, "{algorithm:?}: {text}");
        let refunded = replica.check(&check(2, true)).await.expect("an answer");
        assert_eq!(
            refunded.hits[0].remaining, 7,
            "{algorithm:?}: nothing refundable"
        );
        let taken = replica.check(&check(1, false)).await.expect("an answer");
        assert_eq!(taken.hits[0].remaining, 6, "{algorithm:?}");
        // Written back packed, with the refundable count last.
        let stored = b.redis.state(&key);
        if algorithm == Algorithm::Funnel {
            assert!(
                stored.len() == fields && stored.ends_with(&[10, 1]),
                "{stored:?}"
            );
        } else {
            assert_eq!(stored.len(), fields, "{algorithm:?}: {stored:?}");
            assert_eq!(stored.last(), Some(&1), "{algorithm:?}: {stored:?}");
        }
    }
}
