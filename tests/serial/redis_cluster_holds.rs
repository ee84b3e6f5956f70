//! Holds on a Redis Cluster, through the real binary (docs/holds.md, and docs/redis.md's
//! events table): `sluice.v1.Throttle` holds with ids (acquire, extend, release) keep working
//! while their key's slot moves to another master and back (the `ASK` of the migration and
//! the `MOVED` after it followed, never surfaced), the holds move with their key (none is
//! lost, none counted twice: the holders inside never exceed the slots, and every release
//! finds its hold); through a master's failover, only that master's holds fail, and only
//! until its replica took over; and an `algorithm: concurrency` rule takes and refunds holds over
//! `ShouldRateLimit` on a Cluster, its pending denial and holds surviving a move, as `/why` and
//! a reset find its key after a move; reservations settle across a move (the commit follows the
//! key's records to their new master).
//! Serial: the answers are bounded by `redis.timeout_ms`, which a load beside them would eat.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sluice::testing::grpc::{Code, RateLimitRequest, call, desc, limit_of, overall, refund, req};
use sluice::testing::http;
use sluice::testing::process::SluiceProcess;
use sluice::testing::redis::RedisCluster;
use sluice_client::pb::sluice::v1::throttle_client::ThrottleClient;
use sluice_client::pb::sluice::v1::{
    AcquireHoldRequest, Algorithm, CommitRequest, HoldRequest, ReserveRequest,
    acquire_hold_request, commit_request, hold_request, reserve_request,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const SLOTS: u32 = 10;

/// Long enough that no hold expires during a test: every slot freed is freed by a release.
const LEASE_MS: u64 = 60_000;

/// A Cluster call's time-out in the binary: redirections are followed within it.
const TIMEOUT_MS: &str = "1000";

const BINARY: &str = env!("CARGO_BIN_EXE_sluice");

fn acquire(key: &str, count: u32) -> AcquireHoldRequest {
    AcquireHoldRequest {
        id: Some(acquire_hold_request::Id::Key(key.to_owned())),
        slots: SLOTS,
        lease_ms: LEASE_MS,
        count,
        name: String::new(),
    }
}

fn touch(key: &str, hold_id: u64) -> HoldRequest {
    HoldRequest {
        id: Some(hold_request::Id::Key(key.to_owned())),
        slots: SLOTS,
        lease_ms: LEASE_MS,
        hold_id,
        name: String::new(),
    }
}

/// `sluice serve` on the Cluster with `rules`.
async fn start(cluster: &RedisCluster, rules: &std::path::Path) -> SluiceProcess {
    let env = [("SLUICE_REDIS__TIMEOUT_MS", TIMEOUT_MS)];
    SluiceProcess::over_redis(BINARY, rules, &cluster.url(), &env)
        .ready()
        .await
}

/// The `redirect` backend event on the binary's `/metrics`: redirections and transient
/// Cluster errors followed.
async fn redirects(sluice: &SluiceProcess) -> u64 {
    let text = http::get(sluice.admin(), "/metrics").await.body;
    http::sample(
        &text,
        "sluice_backend_events_total",
        &[("backend", "redis"), ("event", "redirect")],
    )
    .unwrap_or(0.0) as u64
}

/// What the holders of the load saw.
#[derive(Debug, Default)]
struct Seen {
    acquired: u64,
    full: u64,
    extended: u64,
    released: u64,
    /// Extensions or releases that did not find their hold.
    lost: Vec<String>,
    /// gRPC errors, with when their call was sent.
    errors: Vec<(Instant, String)>,
    /// The largest `held` the server answered.
    most_held: u64,
}

/// Holders taking one slot of `key` in a loop until `stop`: acquire, extend, a few
/// milliseconds inside, release. `inside` counts the holders inside, `peak` its maximum.
fn holders(
    url: &str,
    key: &'static str,
    count: usize,
    stop: &CancellationToken,
    inside: &Arc<AtomicUsize>,
    peak: &Arc<AtomicUsize>,
    seen: &Arc<Mutex<Seen>>,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (url, stop, inside, peak, seen) = (
            url.to_owned(),
            stop.clone(),
            inside.clone(),
            peak.clone(),
            seen.clone(),
        );
        tasks.spawn(async move {
            let mut stub = ThrottleClient::connect(url).await.expect("connect");
            while !stop.is_cancelled() {
                let sent = Instant::now();
                let a = match stub.acquire_hold(acquire(key, 1)).await {
                    Ok(a) => a.into_inner(),
                    Err(e) => {
                        seen.lock().errors.push((sent, format!("acquire: {e}")));
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                };
                {
                    let mut seen = seen.lock();
                    seen.most_held = seen.most_held.max(a.held);
                }
                if !a.acquired {
                    seen.lock().full += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                seen.lock().acquired += 1;
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let sent = Instant::now();
                match stub.extend_hold(touch(key, a.hold_id)).await {
                    Ok(e) if e.get_ref().found => seen.lock().extended += 1,
                    Ok(e) => seen.lock().lost.push(format!("extend: {:?}", e.get_ref())),
                    Err(e) => seen.lock().errors.push((sent, format!("extend: {e}"))),
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let sent = Instant::now();
                match stub.release_hold(touch(key, a.hold_id)).await {
                    Ok(r) if r.get_ref().found => seen.lock().released += 1,
                    Ok(r) => seen.lock().lost.push(format!("release: {:?}", r.get_ref())),
                    Err(e) => seen.lock().errors.push((sent, format!("release: {e}"))),
                }
            }
        });
    }
    tasks
}

/// The master that holds `slot` now, and another one to move it to.
fn source_and_target(cluster: &RedisCluster, slot: u16) -> (usize, usize) {
    let source = cluster.owner(slot);
    let target = *cluster
        .masters()
        .iter()
        .find(|&&m| m != source)
        .expect("another master");
    (source, target)
}

/// `sluice serve` on the Cluster with the demo rules, and a Throttle client of it.
async fn throttle_on(cluster: &RedisCluster) -> (SluiceProcess, ThrottleClient<Channel>) {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules/demo.yaml");
    let sluice = start(cluster, demo.as_ref()).await;
    let stub = ThrottleClient::connect(sluice.url())
        .await
        .expect("connect");
    (sluice, stub)
}

/// Moves `slot` to master `to` as an operator does, staying `ask_for` between the key's
/// `MIGRATE` and the end (while the source answers `ASK`); returns how many keys moved.
fn move_slot(cluster: &RedisCluster, slot: u16, to: usize, ask_for: Duration) -> usize {
    let from = cluster.begin_migration(slot, to);
    std::thread::sleep(ask_for);
    let moved = cluster.migrate_keys(slot, from, to, usize::MAX, ask_for);
    cluster.end_migration(slot, from, to);
    assert_eq!(cluster.owner(slot), to, "slot {slot} moved");
    moved
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_holds_follow_their_slot_to_another_master_and_back() {
    const KEY: &str = "semaphore";
    const LONG: u32 = 3;
    let _serial = crate::serial_async().await;
    let cluster = Arc::new(RedisCluster::start());
    let (sluice, mut stub) = throttle_on(&cluster).await;
    let slot = cluster.slot_of(&format!("{{{KEY}}}"));
    let (source, target) = source_and_target(&cluster, slot);

    // A hold taken before the moves, extended between them, released after them.
    let long = stub
        .acquire_hold(acquire(KEY, LONG))
        .await
        .expect("answer")
        .into_inner();
    assert!(long.acquired && long.held == u64::from(LONG), "{long:?}");

    let stop = CancellationToken::new();
    let (inside, peak) = (Arc::default(), Arc::default());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = holders(&sluice.url(), KEY, 12, &stop, &inside, &peak, &seen);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = seen.lock().acquired;
    let moving = cluster.clone();
    let there = tokio::task::spawn_blocking(move || {
        move_slot(&moving, slot, target, Duration::from_millis(200))
    })
    .await
    .expect("the move there");
    let kept = stub
        .extend_hold(touch(KEY, long.hold_id))
        .await
        .expect("answer")
        .into_inner();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let on_target = seen.lock().acquired - before;
    let moving = cluster.clone();
    let back = tokio::task::spawn_blocking(move || {
        move_slot(&moving, slot, source, Duration::from_millis(200))
    })
    .await
    .expect("the move back");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    let released = stub
        .release_hold(touch(KEY, long.hold_id))
        .await
        .expect("answer")
        .into_inner();
    let asking = cluster.nodes[target].calls("asking") + cluster.nodes[source].calls("asking");
    let followed = redirects(&sluice).await;
    let seen = std::mem::take(&mut *seen.lock());
    let peak = peak.load(Ordering::SeqCst);
    eprintln!(
        "holds on a moving slot: {seen:?}; peak {peak} inside beside {LONG} held; {on_target} \
         acquired while on the target; keys moved {there} and {back}; ASKING {asking}; \
         {followed} redirections followed"
    );

    assert!(seen.errors.is_empty(), "errors surfaced: {:?}", seen.errors);
    assert!(
        seen.lost.is_empty(),
        "holds lost in the moves: {:?}",
        seen.lost
    );
    assert!(
        peak + LONG as usize <= SLOTS as usize,
        "{peak} inside beside {LONG} held: more than {SLOTS} slots"
    );
    assert!(seen.most_held <= u64::from(SLOTS), "{seen:?}");
    assert_eq!(
        (seen.acquired, seen.extended),
        (seen.released, seen.released),
        "every hold extended and released"
    );
    assert!(seen.full > 0, "the holders wanted more than the slots");
    assert!(on_target > 0, "holds were taken while the slot was away");
    assert!(kept.found && kept.held >= u64::from(LONG), "{kept:?}");
    assert!(
        released.found && released.held == 0,
        "the long hold came back with its key, and nothing else is held: {released:?}"
    );
    assert_eq!((there, back), (1, 1), "the holds' key moved each way");
    assert!(asking > 0, "calls met a migration under way (ASK followed)");
    assert!(
        followed > 0,
        "calls met a moved slot (redirections followed)"
    );
}

/// A master killed while holds on its keys and on another master's are taken and released
/// (no full coverage required, so the other masters serve on): the other master's holds see
/// no error, the lost master's fail only from the kill until its replica took over (and a
/// second after), and a hold taken well before the kill is found on the new master.
/// (Without `redis.wait_replicas`: with it, the promoted replica has no replica of its own to
/// wait for, so every call after the failover waits its whole `wait_timeout_ms`, as
/// docs/redis.md says; replication's own test is tests/redis/replication.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_holds_come_through_a_failover_on_their_replica() {
    const LOST: &str = "failing";
    let _serial = crate::serial_async().await;
    let mut cluster = RedisCluster::start_replicated(Duration::from_millis(500), false);
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules/demo.yaml");
    let sluice = start(&cluster, demo.as_ref()).await;
    let slot = cluster.slot_of(&format!("{{{LOST}}}"));
    let victim = cluster.owner(slot);
    let replica = cluster.replica_of(victim);
    let healthy: &'static str = Box::leak(
        (0..)
            .map(|i| format!("healthy{i}"))
            .find(|k| cluster.owner(cluster.slot_of(&format!("{{{k}}}"))) != victim)
            .unwrap_or_default()
            .into_boxed_str(),
    );

    let mut stub = ThrottleClient::connect(sluice.url())
        .await
        .expect("connect");
    let long = stub
        .acquire_hold(acquire(LOST, 3))
        .await
        .expect("answer")
        .into_inner();
    assert!(long.acquired, "{long:?}");
    let stop = CancellationToken::new();
    let (inside, peak) = (Arc::default(), Arc::default());
    let lost = Arc::new(Mutex::new(Seen::default()));
    let kept = Arc::new(Mutex::new(Seen::default()));
    let mut tasks = holders(&sluice.url(), LOST, 4, &stop, &inside, &peak, &lost);
    let (inside, peak) = (Arc::default(), Arc::default());
    let mut others = holders(&sluice.url(), healthy, 4, &stop, &inside, &peak, &kept);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = tokio::task::block_in_place(|| {
        cluster.wait_new_owner(slot, victim, Duration::from_secs(15))
    });
    let taken_over = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    while others.join_next().await.is_some() {}
    let found = stub
        .extend_hold(touch(LOST, long.hold_id))
        .await
        .expect("answered after the failover")
        .into_inner();
    let (lost, kept) = (
        std::mem::take(&mut *lost.lock()),
        std::mem::take(&mut *kept.lock()),
    );
    eprintln!(
        "failover took {:?}; lost master: {lost:?}; healthy master: {kept:?}",
        taken_over - killed
    );

    assert_eq!(promoted, replica, "the replica took over");
    assert!(kept.errors.is_empty() && kept.lost.is_empty(), "{kept:?}");
    assert!(kept.acquired > 0 && lost.acquired > 0, "{kept:?} {lost:?}");
    // A call in flight when the master died may fail (whether it ran is unknown: its time-out,
    // and the way to sluice), and so may those sent before the replica took over, and for a
    // second after (sluice's map is refreshed by the calls that fail).
    let timeout = Duration::from_millis(TIMEOUT_MS.parse().unwrap_or(0));
    let from = killed - timeout - Duration::from_millis(500);
    let until = taken_over + Duration::from_secs(1);
    for (sent, e) in &lost.errors {
        assert!(
            !e.to_ascii_uppercase().contains("MOVED") && !e.contains("ASK"),
            "a redirection reached the caller: {e}"
        );
        assert!(
            *sent >= from && *sent <= until,
            "an error {:?} after the takeover: {e}",
            sent.saturating_duration_since(taken_over)
        );
    }
    // Replication is asynchronous: a hold taken in the last moment before the kill may not
    // have reached the replica (`lost` may name one), but one taken half a second before has.
    assert!(
        found.found,
        "the hold taken before the kill, on the new master: {found:?}"
    );
}

const INFLIGHT: &str = "
domain: inflight
descriptors:
  - key: tenant
    rate_limit:
      algorithm: concurrency
      requests_per_unit: 10
      unit: minute
";

/// `tenant=<value>` taking (`cost` 1) or releasing (a refund of 1) a hold.
fn take(value: &str) -> RateLimitRequest {
    req("inflight", vec![desc(&[("tenant", value)])])
}

fn give_back(value: &str) -> RateLimitRequest {
    let mut r = refund("tenant", value, 1);
    r.domain = "inflight".to_owned();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_rules_take_and_release_holds_on_a_cluster_across_a_move() {
    let _serial = crate::serial_async().await;
    let cluster = Arc::new(RedisCluster::start());
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rules = dir.path().join("inflight.yaml");
    std::fs::write(&rules, INFLIGHT).expect("write the rules");
    let sluice = start(&cluster, &rules).await;
    let mut client =
        sluice::testing::grpc::connect_within(&sluice.url(), Duration::from_secs(10)).await;
    let tenant = "a";
    let slot = cluster.slot_of(&format!("sluice:{{inflight|tenant={tenant}}}"));
    let (source, target) = source_and_target(&cluster, slot);

    for i in 0..10 {
        let r = call(&mut client, take(tenant)).await;
        assert_eq!(overall(&r), Code::Ok, "hold {i}: {r:?}");
    }
    let denied = call(&mut client, take(tenant)).await;
    assert_eq!(overall(&denied), Code::OverLimit, "the 11th: {denied:?}");
    assert_eq!(
        limit_of(&denied.statuses[0]).map(|l| l.0),
        Some(10),
        "the concurrency rule answered"
    );
    let moving = cluster.clone();
    let moved = tokio::task::spawn_blocking(move || {
        move_slot(&moving, slot, target, Duration::from_millis(20))
    })
    .await
    .expect("the move");
    assert_eq!(moved, 1, "the key of the holds moved");

    // The denial's refund frees nothing: the ten holds moved with their key.
    let r = call(&mut client, give_back(tenant)).await;
    assert_eq!(overall(&r), Code::Ok, "{r:?}");
    let r = call(&mut client, take(tenant)).await;
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "ten held on the new master: {r:?}"
    );
    // That denial's refund, then one admitted request's: one slot free.
    for _ in 0..2 {
        let r = call(&mut client, give_back(tenant)).await;
        assert_eq!(overall(&r), Code::Ok, "{r:?}");
    }
    let r = call(&mut client, take(tenant)).await;
    assert_eq!(
        overall(&r),
        Code::Ok,
        "a released slot is taken again: {r:?}"
    );
    assert_eq!(r.statuses[0].limit_remaining, 0, "{r:?}");
    let r = call(&mut client, take(tenant)).await;
    assert_eq!(overall(&r), Code::OverLimit, "{r:?}");

    // Operators' calls follow the key too: `/why` (a dry run) as the first call after the
    // slot moved back, and a reset as the first call after it moved there again.
    let body = format!(
        r#"{{"domain":"inflight","descriptors":[{{"entries":[{{"key":"tenant","value":"{tenant}"}}]}}]}}"#
    );
    let moving = cluster.clone();
    tokio::task::spawn_blocking(move || move_slot(&moving, slot, source, Duration::ZERO))
        .await
        .expect("the move back");
    let why = http::post(sluice.admin(), "/why", &body).await;
    assert_eq!(why.status, 200, "{}", why.body);
    let why: serde_json::Value = serde_json::from_str(&why.body).expect("JSON");
    assert_eq!(why["overall_code"], "OVER_LIMIT", "ten held: {why}");
    // The `MOVED` made sluice refresh its slot map: time for that refresh to end, so that the
    // map is out of date again after the next move (not refreshed after it by chance).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moving = cluster.clone();
    tokio::task::spawn_blocking(move || move_slot(&moving, slot, target, Duration::ZERO))
        .await
        .expect("the move there again");
    let reset = http::post(sluice.admin(), "/counters/reset", &body).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert!(reset.body.contains(r#""held":1"#), "{}", reset.body);
    let r = call(&mut client, take(tenant)).await;
    assert_eq!(overall(&r), Code::Ok, "{r:?}");
    assert_eq!(
        r.statuses[0].limit_remaining, 9,
        "the reset freed every slot: {r:?}"
    );

    let followed = redirects(&sluice).await;
    eprintln!("concurrency on a cluster: {followed} redirections followed");
    assert!(followed > 0, "calls met the moved slot (MOVED followed)");
}

/// A reservation on `key`'s funnel of 100 a minute.
fn reserve(key: &str, amount: u64) -> ReserveRequest {
    ReserveRequest {
        id: Some(reserve_request::Id::Key(key.to_owned())),
        max_burst: 99,
        count: 100,
        period_ms: 60_000,
        algorithm: Algorithm::Funnel.into(),
        amount,
        ttl_ms: LEASE_MS,
        name: String::new(),
    }
}

fn commit(key: &str, reservation_id: u64, actual: u64) -> CommitRequest {
    CommitRequest {
        id: Some(commit_request::Id::Key(key.to_owned())),
        max_burst: 99,
        count: 100,
        period_ms: 60_000,
        algorithm: Algorithm::Funnel.into(),
        reservation_id,
        actual,
        name: String::new(),
    }
}

/// Reservations opened before their key's slot moves are settled after it: each commit finds
/// its record on the new master (`MOVED` followed, never surfaced), gives back or charges the
/// difference once, and a second commit of the same id finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_opened_before_a_move_settle_after_it() {
    const KEY: &str = "budget";
    let _serial = crate::serial_async().await;
    let cluster = Arc::new(RedisCluster::start());
    let (sluice, mut stub) = throttle_on(&cluster).await;
    let slot = cluster.slot_of(&format!("{{{KEY}}}"));
    let (source, target) = source_and_target(&cluster, slot);
    let under = stub
        .reserve(reserve(KEY, 60))
        .await
        .expect("answer")
        .into_inner();
    assert!(under.admitted && under.open == 1, "{under:?}");

    let moving = cluster.clone();
    let there = tokio::task::spawn_blocking(move || {
        move_slot(&moving, slot, target, Duration::from_millis(0))
    })
    .await
    .expect("the move there");
    let settled = stub
        .commit(commit(KEY, under.reservation_id, 20))
        .await
        .expect("the commit after the move answers")
        .into_inner();
    assert!(
        settled.settled && settled.estimate == 60 && settled.given_back == 40,
        "the commit found its reservation on the new master: {settled:?}"
    );
    assert!(settled.remaining >= 79, "40 came back: {settled:?}");
    let over = stub
        .reserve(reserve(KEY, 30))
        .await
        .expect("answer")
        .into_inner();
    assert!(over.admitted, "{over:?}");

    let moving = cluster.clone();
    let back = tokio::task::spawn_blocking(move || {
        move_slot(&moving, slot, source, Duration::from_millis(0))
    })
    .await
    .expect("the move back");
    let charged = stub
        .commit(commit(KEY, over.reservation_id, 45))
        .await
        .expect("the commit after the move back answers")
        .into_inner();
    let again = stub
        .commit(commit(KEY, over.reservation_id, 45))
        .await
        .expect("answer")
        .into_inner();
    let followed = redirects(&sluice).await;
    eprintln!(
        "reservations across moves: keys moved {there} and {back}; {settled:?}; {charged:?}; \
         {followed} redirections followed"
    );
    assert!(
        charged.settled && charged.charged == 15 && charged.given_back == 0,
        "the overshoot was charged on the old master again: {charged:?}"
    );
    assert!(!again.settled, "a commit applies once: {again:?}");
    assert!(
        there >= 1 && back >= 1,
        "the key and its records moved each way"
    );
    assert!(followed > 0, "the commits met a moved slot");
}
