//! Faults of Redis Cluster nodes under load from two replicas of sluice (two limiters), as
//! docs/redis.md ("Faults: replies, slow nodes and partitions") states them:
//!
//! - with Redis's default `cluster-require-full-coverage yes`, a master killed makes every
//!   master refuse every key (`CLUSTERDOWN`) until its replica takes over: a healthy master's
//!   keys stop failing within 200 ms of that master saying `cluster_state:ok`, and its breaker
//!   never opens (a reply is not a failure to answer);
//! - a slow node (every packet delayed past `timeout_ms`) and a partitioned one (every packet
//!   held), through a test proxy ([`sluice::testing::proxy`]) that the node announces as its
//!   address: the other masters' keys see no error; the node's own keys fail fast once its
//!   breaker opens; they answer again within 1 s of the heal.
//!
//! Serial: the answers are bounded by `timeout_ms`, which a load beside them would eat.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice::config::model::Algorithm;
use sluice::config::settings::{LeaseMode, RedisSettings};
use sluice::limiter::{Batch, LimitParams, RedisLimiter};
use sluice::testing::limits::{hit, limit};
use sluice::testing::redis::RedisCluster;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::redis_load::{Load, first, no_redirection_surfaced};

const SECOND: u64 = 1_000_000_000;

/// As in `redis_cluster`: long enough for a loaded 2-core machine, short beside a failover.
pub(crate) const TIMEOUT_MS: u64 = 500;

pub(crate) fn settings(url: String) -> RedisSettings {
    RedisSettings {
        url,
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
pub(crate) fn one(tag: &str) -> Batch {
    Batch {
        hits: vec![hit(format!("{{{tag}}}:funnel:1"), roomy(), 1)],
    }
}

/// `count` tags whose slots master `node` serves.
fn tags_on(cluster: &RedisCluster, node: usize, count: usize, name: &str) -> Vec<String> {
    (0..)
        .map(|i| format!("{name}{i}"))
        .filter(|t| cluster.owner(cluster.slot_of(&format!("sluice:{{{t}}}"))) == node)
        .take(count)
        .collect()
}

/// Every node whose breaker was seen open by any of `limiters`, sampled every 5 ms until
/// the token is cancelled.
pub(crate) fn watch_breakers(
    limiters: &[Arc<RedisLimiter>],
    stop: CancellationToken,
) -> (Arc<Mutex<BTreeSet<String>>>, tokio::task::JoinHandle<()>) {
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let (limiters, record) = (limiters.to_vec(), seen.clone());
    let task = tokio::spawn(async move {
        while !stop.is_cancelled() {
            for limiter in &limiters {
                for (node, open) in limiter.nodes() {
                    if open {
                        record.lock().insert(node);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    (seen, task)
}

/// Polls `CLUSTER INFO` of the node on `port` every 2 ms: the instant it says
/// `cluster_state:ok` after having said `cluster_state:fail`.
fn ok_again(port: u16, within: Duration) -> Instant {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a URL");
    let mut conn = client
        .get_connection()
        .expect("connect to the healthy master");
    let deadline = Instant::now() + within;
    let mut failed = false;
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut conn)
            .expect("CLUSTER INFO");
        let ok = info.contains("cluster_state:ok");
        if ok && failed {
            return Instant::now();
        }
        failed |= !ok;
        assert!(
            Instant::now() < deadline,
            "no fail-then-ok within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_full_coverage_a_healthy_master_answers_once_the_cluster_is_ok_and_its_breaker_never_opens()
 {
    let _serial = crate::serial_async().await;
    let mut cluster = RedisCluster::start_replicated(Duration::from_millis(500), true);
    // Leases off: what is checked is what Redis's refusals do to calls, and keys decided from
    // leases (rightly: Redis counted their units) would make fewer of them.
    let settings = RedisSettings {
        leases: LeaseMode::Off,
        ..settings(cluster.url())
    };
    let replicas = [(); 2].map(|_| Arc::new(RedisLimiter::new(&settings, 1000).expect("settings")));
    let slot = cluster.slot_of("sluice:{hot}");
    let victim = cluster.owner(slot);
    let masters = cluster.masters();
    let healthy = *masters
        .iter()
        .find(|&&m| m != victim)
        .expect("a healthy master");
    let healthy_port = cluster.nodes[healthy].port;
    let healthy_addr = cluster.nodes[healthy].addr();
    let lost: Vec<Batch> = tags_on(&cluster, victim, 2, "lost")
        .iter()
        .map(|t| one(t))
        .collect();
    let kept: Vec<Batch> = tags_on(&cluster, healthy, 3, "kept")
        .iter()
        .map(|t| one(t))
        .collect();

    let mut load = Load::new();
    for limiter in &replicas {
        load.add(limiter, "lost master", 2, &lost);
        load.add(limiter, "healthy master", 3, &kept);
    }
    let stop = CancellationToken::new();
    let (opened, watcher) = watch_breakers(&replicas, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let ok_at = tokio::task::block_in_place(|| ok_again(healthy_port, Duration::from_secs(15)));
    eprintln!(
        "the healthy master said cluster_state:ok {:?} after the kill",
        ok_at - killed
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (tallies, _) = load.finish().await;
    stop.cancel();
    watcher.await.expect("the breaker watcher");

    no_redirection_surfaced(&tallies);
    let kept = &tallies["healthy master"];
    assert!(
        !kept.errors.is_empty(),
        "the healthy master's keys met the Cluster's refusal (the scenario happened)"
    );
    let last = kept.error_ends.iter().max().copied().expect("errors");
    let after = last.saturating_duration_since(ok_at);
    // The last few errors, sent and answered against the moment the master said ok.
    let mut ends: Vec<_> = kept.errors.iter().zip(&kept.error_ends).collect();
    ends.sort_by_key(|(_, end)| **end);
    let since = |t: Instant| {
        t.checked_duration_since(ok_at)
            .map_or_else(|| format!("-{:?}", ok_at - t), |d| format!("+{d:?}"))
    };
    for ((sent, e), end) in ends.iter().rev().take(6) {
        eprintln!("  sent {} answered {}: {e}", since(*sent), since(**end));
    }
    eprintln!(
        "healthy master: {} errors ({:?}), the last answered {after:?} after cluster_state:ok; \
         breakers seen open: {:?}",
        kept.errors.len(),
        first(&kept.errors),
        opened.lock()
    );
    assert!(
        after <= Duration::from_millis(200),
        "a healthy master's key failed {after:?} after it said cluster_state:ok"
    );
    assert!(
        !opened.lock().contains(&healthy_addr),
        "the healthy master's breaker opened: {:?}",
        opened.lock()
    );
}
