//! A slow node and a partitioned one under load from two replicas of sluice (two limiters),
//! through a test proxy ([`sluice::testing::proxy`]) between sluice and that node: first every
//! packet delayed past `timeout_ms` (a slow node), then every packet held (a partition), each
//! for 2 s and then healed.
//!
//! - Cluster (3 masters): the proxied master announces the proxy's port
//!   (`CONFIG SET cluster-announce-port`), so that sluice's slot map names the proxy; the
//!   Cluster bus does not go through it, so no failover starts. The other masters' keys see
//!   no error, the node's own keys fail fast once its breaker opens, they answer again
//!   within 1 s of the heal, and readiness holds (another master answers) while naming it.
//! - Sentinel (the only master, watched through the proxy, no replica): every key fails, at
//!   once after the first time-outs, and answers again within 1 s of the heal.

use std::sync::Arc;
use std::time::Duration;

use sluice::limiter::{Batch, RedisLimiter};
use sluice::testing::proxy::Proxy;
use sluice::testing::redis::{RedisCluster, RedisServer, wait_until};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::redis_cluster_faults::{TIMEOUT_MS, one, settings, watch_breakers};
use crate::redis_load::{Load, Tally, first};

/// Each way: a round trip of 800 ms, past the 500 ms time-out.
const DELAY: Duration = Duration::from_millis(400);

/// How long each fault lasts.
const FAULT: Duration = Duration::from_secs(2);

/// Within this of a fault's start, requests may still wait for the time-out (the breaker
/// opens after a few).
const OPENING: Duration = Duration::from_secs(1);

/// A fault: when it began and when it healed.
#[derive(Debug, Clone, Copy)]
struct Fault {
    name: &'static str,
    from: Instant,
    healed: Instant,
}

/// Through `proxy`: a slow node for [`FAULT`], healed, then a partition for [`FAULT`],
/// healed; 1.5 s after each heal.
async fn slow_then_partitioned(proxy: &Proxy) -> [Fault; 2] {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let slow = Instant::now();
    proxy.delay(DELAY);
    tokio::time::sleep(FAULT).await;
    proxy.heal();
    let slow = Fault {
        name: "slow node",
        from: slow,
        healed: Instant::now(),
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = Instant::now();
    proxy.hold();
    tokio::time::sleep(FAULT).await;
    proxy.heal();
    let held = Fault {
        name: "partition",
        from: held,
        healed: Instant::now(),
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    [slow, held]
}

/// The keys behind the faulty node: errors only during the faults and within 1 s of their
/// heal; during each, once the breaker is open, most errors answered at once.
fn check_faulty(class: &str, tally: &Tally, faults: [Fault; 2]) {
    for ((sent, e), end) in tally.errors.iter().zip(&tally.error_ends) {
        // A request sent up to a time-out before a fault may meet it.
        let during = faults.iter().any(|f| {
            *sent + Duration::from_millis(TIMEOUT_MS) >= f.from
                && *end <= f.healed + Duration::from_secs(1)
        });
        assert!(
            during,
            "{class}: an error outside the faults and their second after: {e}, sent {:?} and \
             answered {:?} after the start of each fault, which healed {:?} after it",
            faults.map(|f| sent.saturating_duration_since(f.from)),
            faults.map(|f| end.saturating_duration_since(f.from)),
            faults.map(|f| f.healed - f.from),
        );
    }
    for fault in faults {
        let opened = fault.from + OPENING;
        let waits: Vec<Duration> = (tally.errors.iter().zip(&tally.error_ends))
            .filter(|((sent, _), _)| *sent >= opened && *sent < fault.healed)
            .map(|((sent, _), end)| *end - *sent)
            .collect();
        let fast = waits
            .iter()
            .filter(|w| **w < Duration::from_millis(50))
            .count();
        let last = (tally.error_ends.iter())
            .filter(|end| **end >= fault.from && **end <= fault.healed + Duration::from_secs(1))
            .max()
            .map(|end| end.saturating_duration_since(fault.healed));
        let answered: Vec<Duration> = (tally.answers.iter())
            .filter(|(sent, _)| *sent >= fault.from && *sent < fault.healed)
            .map(|(sent, end)| *end - *sent)
            .collect();
        let errors = (tally.errors.iter())
            .filter(|(sent, _)| *sent >= fault.from && *sent < fault.healed)
            .count();
        eprintln!(
            "{class}, {}: {} requests sent, {errors} failed (the longest answer {:?}); {} failed \
             after the breaker's first second, {fast} of them within 50 ms; the last error \
             {last:?} after the heal",
            fault.name,
            answered.len(),
            answered.iter().max(),
            waits.len()
        );
        assert!(
            !waits.is_empty(),
            "{class}, {}: the keys failed",
            fault.name
        );
        assert!(
            fast * 10 >= waits.len() * 9,
            "{class}, {}: only {fast} of {} errors fast once the breaker was open",
            fault.name,
            waits.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_partitioned_cluster_master_fails_only_its_keys_fast_and_answers_after_the_heal()
{
    let _serial = crate::serial_async().await;
    let cluster = RedisCluster::start();
    let slot = cluster.slot_of("sluice:{hot}");
    let victim = cluster.owner(slot);
    let tag_on = |node: usize, name: &str| -> Vec<Batch> {
        (0..)
            .map(|i| format!("{name}{i}"))
            .filter(|t| cluster.owner(cluster.slot_of(&format!("sluice:{{{t}}}"))) == node)
            .take(2)
            .map(|t| one(&t))
            .collect()
    };
    let behind = tag_on(victim, "behind");
    let others: Vec<Batch> = (cluster.masters().into_iter())
        .filter(|&m| m != victim)
        .flat_map(|m| tag_on(m, &format!("other{m}_")))
        .collect();
    let proxy = Proxy::start(cluster.nodes[victim].addr().parse().expect("an address"))
        .await
        .expect("the proxy");
    let port = proxy.port().to_string();
    let _: () = cluster.nodes[victim].cmd(&["CONFIG", "SET", "cluster-announce-port", &port]);
    let announced = format!("127.0.0.1:{port}@");
    wait_until(
        Duration::from_secs(10),
        "every node to know the proxy's port",
        || {
            (cluster.nodes.iter())
                .all(|n| n.cmd::<String>(&["CLUSTER", "NODES"]).contains(&announced))
        },
    );
    // The seeds: the proxy in place of the proxied master.
    let seeds: Vec<String> = (0..cluster.nodes.len())
        .map(|i| match i == victim {
            true => proxy.addr().to_string(),
            false => cluster.nodes[i].addr(),
        })
        .collect();
    let url = format!("redis+cluster://{}", seeds.join(","));
    let replicas = [(); 2]
        .map(|_| Arc::new(RedisLimiter::new(&settings(url.clone()), 1000).expect("settings")));

    let mut load = Load::new();
    for limiter in &replicas {
        load.add(limiter, "behind the proxy", 3, &behind);
        load.add(limiter, "other masters", 3, &others);
    }
    let stop = CancellationToken::new();
    let (opened, watcher) = watch_breakers(&replicas, stop.clone());
    let probing = replicas[0].clone();
    let readiness = tokio::spawn(async move {
        // During the partition: readiness from a probe of the Cluster, and the nodes down.
        tokio::time::sleep(Duration::from_millis(500) + FAULT + Duration::from_millis(1500)).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        probing.probe().await;
        (probing.health(), probing.nodes())
    });
    let faults = slow_then_partitioned(&proxy).await;
    let (tallies, _) = load.finish().await;
    stop.cancel();
    watcher.await.expect("the breaker watcher");
    let (health, nodes) = readiness.await.expect("the readiness probe");

    let others = &tallies["other masters"];
    assert!(others.errors.is_empty(), "{:?}", first(&others.errors));
    check_faulty("behind the proxy", &tallies["behind the proxy"], faults);
    let proxied = proxy.addr().to_string();
    assert_eq!(
        opened.lock().iter().collect::<Vec<_>>(),
        [&proxied],
        "only the proxied master's breaker opened"
    );
    eprintln!("during the partition: health {health:?}, nodes {nodes:?}");
    assert_eq!(health, Ok(()), "ready while the other masters answer");
    assert!(
        nodes.contains(&(proxied.clone(), true)),
        "the partitioned master named as down: {nodes:?}"
    );
    for limiter in &replicas {
        assert!(
            limiter.nodes().iter().all(|(_, open)| !open),
            "every breaker closed after the heal"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_partitioned_sentinel_master_fails_every_key_fast_and_answers_after_the_heal() {
    let _serial = crate::serial_async().await;
    let master = RedisServer::start();
    let proxy = Proxy::start(master.addr().parse().expect("an address"))
        .await
        .expect("the proxy");
    // The sentinel watches the master through the proxy, so it names the proxy; with no
    // replica, nothing can be promoted, and the partition is an outage.
    let sentinel = RedisServer::sentinel("mymaster", proxy.port(), 1);
    // The sentinels stand for those on the master's side of the partition: they keep seeing
    // it (nor do they mark it down while the proxy delays it).
    let _: () = sentinel.cmd(&[
        "SENTINEL",
        "SET",
        "mymaster",
        "down-after-milliseconds",
        "60000",
    ]);
    let url = format!("redis+sentinel://{}/mymaster", sentinel.addr());
    let replicas = [(); 2]
        .map(|_| Arc::new(RedisLimiter::new(&settings(url.clone()), 1000).expect("settings")));
    let keys: Vec<Batch> = (0..4).map(|i| one(&format!("key{i}"))).collect();

    let mut load = Load::new();
    for limiter in &replicas {
        load.add(limiter, "every key", 4, &keys);
    }
    let faults = slow_then_partitioned(&proxy).await;
    let (tallies, _) = load.finish().await;

    check_faulty("every key", &tallies["every key"], faults);
    let addr: Vec<String> = sentinel.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
    assert_eq!(addr.get(1), Some(&proxy.port().to_string()), "no failover");
    for limiter in &replicas {
        assert!(
            limiter.nodes().iter().all(|(_, open)| !open),
            "the breaker closed after the heal"
        );
    }
}
