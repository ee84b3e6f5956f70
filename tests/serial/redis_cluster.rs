//! A Redis Cluster changing under load (docs/redis.md, "Redis events and what each costs"): callers keep
//! asking the in-process Redis limiter while a slot moves to another master and back, or
//! while a master is killed and its replica takes over. Redirections (MOVED, ASK) and
//! transient cluster errors (TRYAGAIN, CLUSTERDOWN) are followed, never surfaced; one master's
//! trouble never fails a key on another; the funnel stays exact while its slot moves.
//! Serial: the answers are bounded by `timeout_ms`, which a load beside them would eat.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;
use sluice::config::model::Algorithm;
use sluice::config::settings::{LeaseMode, RedisSettings};
use sluice::limiter::{Batch, LimitParams, Limiter, RedisLimiter};
use sluice::testing::limits::{hit, limit};
use sluice::testing::redis::RedisCluster;
use tokio::time::Instant;

use crate::redis_load::{Load, first, no_redirection_surfaced};

const SECOND: u64 = 1_000_000_000;

/// Long enough that a loaded 2-core machine running six Redis nodes does not turn these into
/// latency tests; short enough that a failover outlasts it.
const TIMEOUT_MS: u64 = 500;

fn settings(cluster: &RedisCluster) -> RedisSettings {
    RedisSettings {
        url: cluster.url(),
        timeout_ms: TIMEOUT_MS,
        connect_timeout_ms: 200,
        ..sluice::testing::redis::default_settings()
    }
}

/// A limit no load here reaches.
fn roomy() -> LimitParams {
    limit(Algorithm::Funnel, 10_000_000, SECOND)
}

/// One descriptor `{tag}` with one roomy limit.
fn one(tag: &str) -> Batch {
    Batch {
        hits: vec![hit(format!("{{{tag}}}:funnel:1"), roomy(), 1)],
    }
}

/// `count` tags whose keys share `tag`'s slot.
fn same_slot(tag: &str, count: usize) -> Vec<String> {
    let slot = Slot::for_key(format!("sluice:{{{tag}}}"));
    (0..)
        .map(|i| format!("{tag}{i}"))
        .filter(|t| Slot::for_key(format!("sluice:{{{t}}}")) == slot)
        .take(count)
        .collect()
}

/// A tag whose slot master `node` serves, other than `except`.
fn tag_on(cluster: &RedisCluster, node: usize, except: u16, name: &str) -> String {
    (0..)
        .map(|i| format!("{name}{i}"))
        .find(|t| {
            let slot = cluster.slot_of(&format!("sluice:{{{t}}}"));
            slot != except && cluster.owner(slot) == node
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moving_under_load_fails_no_request_and_stays_exact() {
    let _serial = crate::serial_async().await;
    let cluster = Arc::new(RedisCluster::start());
    let limiter = Arc::new(RedisLimiter::new(&settings(&cluster), 1000).expect("settings"));
    let slot = cluster.slot_of("sluice:{hot}");
    let source = cluster.owner(slot);
    let masters = cluster.masters();
    let target = *masters
        .iter()
        .find(|&&m| m != source)
        .expect("another master");
    // The hot descriptor: a funnel of 100/s with a burst of 20, and a second, roomy limit, so
    // that its calls carry two keys (which a migration may find on different nodes).
    let funnel = LimitParams {
        burst: 20,
        ..limit(Algorithm::Funnel, 100, SECOND)
    };
    let hot = Batch {
        hits: vec![
            hit("{hot}:funnel:1", funnel, 1),
            hit("{hot}:funnel:60", roomy(), 1),
        ],
    };
    let neighbours: Vec<Batch> = same_slot("hot", 4).iter().map(|t| one(t)).collect();
    let others: Vec<Batch> = masters
        .iter()
        .map(|&m| one(&tag_on(&cluster, m, slot, "other")))
        .collect();

    let mut load = Load::new();
    load.add(&limiter, "hot", 6, &[hot]);
    load.add(&limiter, "same slot", 4, &neighbours);
    load.add(&limiter, "other slots", 3, &others);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let moving = cluster.clone();
    let moved = tokio::task::spawn_blocking(move || {
        let there = moving.migrate(slot, target, Duration::from_millis(20));
        assert_eq!(moving.owner(slot), target);
        std::thread::sleep(Duration::from_millis(500));
        let back = moving.migrate(slot, source, Duration::from_millis(20));
        assert_eq!(moving.owner(slot), source);
        (there, back)
    })
    .await
    .expect("the migrations");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (tallies, elapsed) = load.finish().await;
    eprintln!(
        "moved {moved:?} keys; ASKING: {} on the target, {} on the source",
        cluster.nodes[target].calls("asking"),
        cluster.nodes[source].calls("asking")
    );

    no_redirection_surfaced(&tallies);
    for (class, tally) in &tallies {
        assert!(
            tally.errors.is_empty(),
            "{class}: {:?}",
            first(&tally.errors)
        );
    }
    let hot = &tallies["hot"];
    let bound = 20.0 + 100.0 * elapsed.as_secs_f64();
    eprintln!(
        "hot: admitted {} of a bound of {bound:.1} over {elapsed:?}",
        hot.admitted
    );
    assert!(
        hot.admitted as f64 <= bound,
        "admitted {} > {bound:.1}",
        hot.admitted
    );
    assert!(hot.denied > hot.admitted, "the load exceeded the limit");
    assert!(moved.0 > 0 && moved.1 > 0, "keys moved each way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_master_fails_only_its_keys_and_only_until_its_replica_takes_over() {
    let _serial = crate::serial_async().await;
    let mut cluster = RedisCluster::start_replicated(Duration::from_millis(500), false);
    let limiter = Arc::new(RedisLimiter::new(&settings(&cluster), 1000).expect("settings"));
    let slot = cluster.slot_of("sluice:{hot}");
    let victim = cluster.owner(slot);
    let replica = cluster.replica_of(victim);
    let masters = cluster.masters();
    let lost = [one("hot"), one(&tag_on(&cluster, victim, slot, "lost"))];
    let healthy: Vec<Batch> = masters
        .iter()
        .filter(|&&m| m != victim)
        .flat_map(|&m| [0, 1].map(|i| one(&tag_on(&cluster, m, slot, &format!("ok{i}_")))))
        .collect();

    // Two replicas of sluice: this test's limiter and another on the same Cluster.
    let other = Arc::new(RedisLimiter::new(&settings(&cluster), 1000).expect("settings"));
    let mut load = Load::new();
    for replica in [&limiter, &other] {
        load.add(replica, "lost master", 3, &lost);
        load.add(replica, "healthy masters", 3, &healthy);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = tokio::task::block_in_place(|| {
        cluster.wait_new_owner(slot, victim, Duration::from_secs(15))
    });
    let taken_over = Instant::now();
    eprintln!("failover took {:?}", taken_over - killed);
    assert_eq!(promoted, replica, "the replica took over");
    let calls_before = cluster.nodes[promoted].script_calls();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (tallies, _) = load.finish().await;

    no_redirection_surfaced(&tallies);
    let healthy = &tallies["healthy masters"];
    assert!(healthy.errors.is_empty(), "{:?}", first(&healthy.errors));
    // A request in flight when the master died may fail (whether it ran is unknown), and so
    // may those sent before the replica took over, and for a second after.
    let from = killed - Duration::from_millis(TIMEOUT_MS);
    let until = taken_over + Duration::from_secs(1);
    let lost_errors = &tallies["lost master"].errors;
    if let (Some(a), Some(b)) = (lost_errors.first(), lost_errors.last()) {
        eprintln!(
            "lost master: errors from {:?} after the kill to {:?} after it",
            a.0.saturating_duration_since(killed),
            b.0.saturating_duration_since(killed)
        );
    }
    for (sent, e) in lost_errors {
        assert!(
            *sent >= from && *sent <= until,
            "an error {:?} after the kill, {:?} after the takeover: {e}",
            *sent - from,
            sent.saturating_duration_since(taken_over)
        );
    }
    assert!(
        cluster.nodes[promoted].script_calls() > calls_before,
        "decided by the new master"
    );
    for batch in &lost {
        let outcome = limiter
            .check(batch)
            .await
            .expect("answered after the failover");
        assert!(outcome.admitted);
    }
}

/// A master that stops answering (SIGSTOP: as a network partition between sluice and it looks
/// from sluice) for less than the Cluster's node time-out, so that no failover starts: its
/// keys wait for `timeout_ms` until its breaker opens and are then answered at once; the
/// other masters' keys never wait on it; after SIGCONT it decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_hangs_holds_up_only_its_own_keys() {
    let _serial = crate::serial_async().await;
    let cluster = RedisCluster::start();
    // Leases off: what is checked is how calls to a hung master fail, and a hot key decided
    // from a lease (rightly: Redis counted its units) would make none.
    let settings = RedisSettings {
        leases: LeaseMode::Off,
        ..settings(&cluster)
    };
    let limiter = Arc::new(RedisLimiter::new(&settings, 1000).expect("settings"));
    let slot = cluster.slot_of("sluice:{hot}");
    let victim = cluster.owner(slot);
    let hung = [one("hot"), one(&tag_on(&cluster, victim, slot, "hung"))];
    let healthy: Vec<Batch> = cluster
        .masters()
        .iter()
        .filter(|&&m| m != victim)
        .map(|&m| one(&tag_on(&cluster, m, slot, "ok")))
        .collect();

    let mut load = Load::new();
    load.add(&limiter, "hung master", 4, &hung);
    load.add(&limiter, "healthy masters", 6, &healthy);
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.nodes[victim].pause();
    let paused = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.nodes[victim].resume();
    let resumed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (tallies, _) = load.finish().await;

    no_redirection_surfaced(&tallies);
    let healthy = &tallies["healthy masters"];
    assert!(healthy.errors.is_empty(), "{:?}", first(&healthy.errors));
    let waited = &tallies["hung master"];
    assert!(!waited.errors.is_empty(), "the hung master's keys failed");
    let until = resumed + Duration::from_secs(1);
    for (sent, e) in &waited.errors {
        assert!(
            *sent >= paused - Duration::from_millis(50) && *sent <= until,
            "an error {:?} after the resume: {e}",
            sent.saturating_duration_since(resumed)
        );
    }
    assert_eq!(cluster.owner(slot), victim, "no failover");
    for batch in &hung {
        assert!(limiter.check(batch).await.expect("answered again").admitted);
    }
}

/// A tag whose slot is in `first..first + count`.
fn tag_in(cluster: &RedisCluster, first: u16, count: u16, name: &str) -> String {
    (0..)
        .map(|i| format!("{name}{i}"))
        .find(|t| {
            let slot = cluster.slot_of(&format!("sluice:{{{t}}}"));
            (first..first + count).contains(&slot)
        })
        .unwrap_or_default()
}

/// A live reshard as an operator runs it: `redis-cli --cluster reshard` moves 200 slots,
/// the hot key's among them, from one master to another and then back, while two replicas of
/// sluice (two limiters on the Cluster) keep deciding the hot key, keys in the moving slots
/// and keys elsewhere. No request fails, and the hot funnel stays within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_reshard_there_and_back_fails_no_request_and_stays_exact() {
    const MOVED: u16 = 200;
    let _serial = crate::serial_async().await;
    let cluster = Arc::new(RedisCluster::start());
    let replicas =
        [(); 2].map(|_| Arc::new(RedisLimiter::new(&settings(&cluster), 1000).expect("settings")));
    let masters = cluster.masters();
    let source = *masters
        .iter()
        .min_by_key(|&&m| cluster.first_slot(m))
        .expect("masters");
    let target = *masters.iter().find(|&&m| m != source).expect("another");
    let lowest = cluster.first_slot(source);
    let hot_tag = tag_in(&cluster, lowest, MOVED / 4, "hot");
    let hot_slot = cluster.slot_of(&format!("sluice:{{{hot_tag}}}"));
    let funnel = LimitParams {
        burst: 20,
        ..limit(Algorithm::Funnel, 100, SECOND)
    };
    let hot = Batch {
        hits: vec![
            hit(format!("{{{hot_tag}}}:funnel:1"), funnel, 1),
            hit(format!("{{{hot_tag}}}:funnel:60"), roomy(), 1),
        ],
    };
    let moving: Vec<Batch> = (0..6)
        .map(|i| one(&tag_in(&cluster, lowest, MOVED, &format!("moving{i}_"))))
        .collect();
    let staying: Vec<Batch> = masters
        .iter()
        .map(|&m| {
            let tag = (0..)
                .map(|i| format!("staying{m}_{i}"))
                .find(|t| {
                    let slot = cluster.slot_of(&format!("sluice:{{{t}}}"));
                    cluster.owner(slot) == m && !(lowest..lowest + MOVED).contains(&slot)
                })
                .unwrap_or_default();
            one(&tag)
        })
        .collect();

    let mut load = Load::new();
    for limiter in &replicas {
        load.add(limiter, "hot", 3, std::slice::from_ref(&hot));
        load.add(limiter, "moving slots", 3, &moving);
        load.add(limiter, "other slots", 2, &staying);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resharding = cluster.clone();
    let owners = tokio::task::spawn_blocking(move || {
        resharding.reshard(source, target, usize::from(MOVED), 10);
        let there = resharding.owner(hot_slot);
        std::thread::sleep(Duration::from_millis(300));
        resharding.reshard(target, source, usize::from(MOVED), 10);
        (there, resharding.owner(hot_slot))
    })
    .await
    .expect("the reshards");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (tallies, elapsed) = load.finish().await;

    assert_eq!(
        owners,
        (target, source),
        "the hot slot moved there and back"
    );
    no_redirection_surfaced(&tallies);
    for (class, tally) in &tallies {
        assert!(
            tally.errors.is_empty(),
            "{class}: {} errors: {:?}",
            tally.errors.len(),
            first(&tally.errors)
        );
    }
    let hot = &tallies["hot"];
    let bound = 20.0 + 100.0 * elapsed.as_secs_f64();
    eprintln!(
        "reshard: hot admitted {} of a bound of {bound:.1} over {elapsed:?}; {} redirections \
         followed",
        hot.admitted,
        replicas.iter().map(|l| redirects(l)).sum::<u64>()
    );
    assert!(
        hot.admitted as f64 <= bound,
        "admitted {} > {bound:.1}",
        hot.admitted
    );
    assert!(hot.denied > hot.admitted, "the load exceeded the limit");
    assert!(
        replicas.iter().map(|l| redirects(l)).sum::<u64>() > 0,
        "the calls met the reshard (redirections followed)"
    );
}

/// The `redirect` backend event: Cluster redirections and transient errors followed.
fn redirects(limiter: &RedisLimiter) -> u64 {
    limiter
        .events()
        .into_iter()
        .find_map(|(event, n)| (event == "redirect").then_some(n))
        .expect("the redirect event")
}
