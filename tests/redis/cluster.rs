//! Redis Cluster: three masters built with `redis-cli --cluster create`. A request whose
//! descriptors live in different slots stays all or nothing (admitted groups are given back
//! when another denies), three `sluice` processes on the cluster stay within the limit, and a
//! key is decided through every stage of its slot moving; `/why` across slots charges nothing
//! and a reset forgets a key on its master. (The same under load, and a master
//! lost, are in tests/serial/redis_cluster.rs.)

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;
use sluice::config::model::Algorithm;
use sluice::config::settings::{RedisSettings, Settings};
use sluice::limiter::{Batch, BatchOutcome, Limiter as _, RedisLimiter};
use sluice::testing::grpc::*;
use sluice::testing::limits::{hit, limit};
use sluice::testing::process::SluiceProcess;
use sluice::testing::redis::RedisCluster;
use tokio::time::Instant;

use crate::support::load;

const RULES: &str = include_str!("../fixtures/rules/suites/redis.yaml");

const SECOND: u64 = 1_000_000_000;

fn slot(key: &str, value: &str, period: u32) -> Slot {
    Slot::for_key(format!("sluice:{{redis|{key}={value}}}:funnel:{period}"))
}

/// A value of `wide` whose key is in another slot than `one=a`'s.
fn other_slot_value() -> String {
    other_slot_value_of("wide")
}

/// A value of `key` whose state key is in another slot than `one=a`'s (the slot depends only
/// on the descriptor part, the hash tag).
fn other_slot_value_of(key: &str) -> String {
    let taken = slot("one", "a", 60);
    (0..)
        .map(|i| format!("w{i}"))
        .find(|v| slot(key, v, 60) != taken)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_across_slots_is_all_or_nothing() {
    let cluster = RedisCluster::start();
    let settings = RedisSettings {
        url: cluster.url(),
        // Redis's own answers, whatever the suites' leases switch: the test reads the exact
        // `remaining` after each request (a key busy enough to be leased would answer the
        // units left in its lease, a lower bound).
        leases: sluice::config::settings::LeaseMode::Off,
        ..sluice::testing::redis::default_settings()
    };
    let limiter = RedisLimiter::new(&settings, 100).expect("valid settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let mut c = client(&server).await;
    let wide = other_slot_value();
    let both = || {
        req(
            "redis",
            vec![desc(&[("one", "a")]), desc(&[("wide", &wide)])],
        )
    };

    let r = call(&mut c, both()).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 999);
    let r = call(&mut c, both()).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(code(&r.statuses[1]), Code::Ok);
    assert_eq!(
        r.statuses[1].limit_remaining, 999,
        "given back: still 999 left"
    );
    let r = call(&mut c, req("redis", vec![desc(&[("wide", &wide)])])).await;
    assert_eq!(
        r.statuses[1 - 1].limit_remaining,
        998,
        "only the admitted request consumed"
    );
    // Every algorithm gives back what a denied request took in another slot.
    for key in ["wide_bucket", "wide_window", "wide_sliding", "wide_log"] {
        let value = other_slot_value_of(key);
        let both = req("redis", vec![desc(&[("one", "a")]), desc(&[(key, &value)])]);
        let r = call(&mut c, both).await;
        assert_eq!(overall(&r), Code::OverLimit, "{key}");
        assert_eq!(r.statuses[1].limit_remaining, 1000, "{key}: given back");
        let r = call(&mut c, req("redis", vec![desc(&[(key, &value)])])).await;
        assert_eq!(
            r.statuses[0].limit_remaining, 999,
            "{key}: nothing was kept"
        );
    }
    assert!(
        cluster
            .nodes
            .iter()
            .filter(|n| n.script_calls() > 0)
            .count()
            >= 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_descriptor_is_one_call_on_a_cluster() {
    let cluster = RedisCluster::start();
    // The script (the default), then the function library (`redis.functions`).
    for functions in [false, true] {
        let settings = RedisSettings {
            url: cluster.url(),
            functions,
            ..sluice::testing::redis::default_settings()
        };
        let limiter = RedisLimiter::new(&settings, 100).expect("valid settings");
        let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
        let mut c = client(&server).await;
        for n in &cluster.nodes {
            n.reset_stats();
        }
        // Warm up: every node gets the code once. The script is loaded per node by its first
        // call there (NOSCRIPT, then EVAL); the library by the first call of all (no function,
        // then FUNCTION LOAD, which goes to every master at once).
        for i in 0..30 {
            call(
                &mut c,
                req(
                    "redis",
                    vec![desc(&[("wide", &format!("warm{functions}{i}"))])],
                ),
            )
            .await;
        }
        let loads = if functions { "function|load" } else { "eval" };
        for n in &cluster.nodes {
            assert_eq!(
                n.calls(loads),
                1,
                "each node loaded the code once ({loads})"
            );
            n.reset_stats();
        }
        for i in 0..10 {
            let value = format!("v{functions}{i}");
            call(&mut c, req("redis", vec![desc(&[("wide", &value)])])).await;
        }
        let command = if functions { "fcall" } else { "evalsha" };
        let calls: u64 = cluster.nodes.iter().map(|n| n.calls(command)).sum();
        assert_eq!(calls, 10, "one {command} per request");
        assert_eq!(cluster.script_calls(), 10, "and no other call of the code");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sluice_processes_on_a_cluster_admit_no_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let (_rules, replicas) = load::replicas(3, RULES, &cluster.url());
    let urls: Vec<String> = replicas.iter().map(SluiceProcess::url).collect();
    // Each request also carries a per-client descriptor, in various slots: the hot limit's
    // denials make the cluster give those back.
    let tally = load::hammer(&urls, 8, Duration::from_secs(4), |i| {
        req(
            "redis",
            vec![
                desc(&[("hot", "one")]),
                desc(&[("wide", &format!("client{i}"))]),
            ],
        )
    })
    .await;
    load::assert_exact(tally, 20.0, 10.0);
}

/// A key's state follows it through every stage of a slot migration, and each stage's answer
/// from the Cluster (ASK, TRYAGAIN, MOVED) is followed, never surfaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_decided_through_every_stage_of_its_slot_moving() {
    let cluster = Arc::new(RedisCluster::start());
    let settings = RedisSettings {
        url: cluster.url(),
        timeout_ms: 5_000,
        ..sluice::testing::redis::default_settings()
    };
    let limiter = RedisLimiter::new(&settings, 100).expect("valid settings");
    let hasty = RedisLimiter::new(
        &RedisSettings {
            timeout_ms: 100,
            ..settings.clone()
        },
        100,
    )
    .expect("valid settings");
    let ten = limit(Algorithm::Funnel, 10, 60 * SECOND);
    let one = |key: &str| Batch {
        hits: vec![hit(key, ten, 1)],
    };
    let both = Batch {
        hits: vec![hit("{mig}:a", ten, 1), hit("{mig}:b", ten, 1)],
    };
    let remaining = |outcome: BatchOutcome| -> Vec<u64> {
        assert!(outcome.admitted);
        outcome.hits.iter().map(|h| h.remaining).collect()
    };
    assert_eq!(remaining(limiter.check(&both).await.unwrap()), [9, 9]);
    let slot = cluster.slot_of("sluice:{mig}");
    let to = *cluster
        .masters()
        .iter()
        .find(|&&m| m != cluster.owner(slot))
        .expect("another master");

    // One key moved, the other not yet: each alone goes where it is (ASK for the moved one),
    // and both together get TRYAGAIN until the other one moves too.
    let from = cluster.begin_migration(slot, to);
    assert_eq!(cluster.migrate_keys(slot, from, to, 1, Duration::ZERO), 1);
    assert_eq!(
        remaining(limiter.check(&one("{mig}:a")).await.unwrap()),
        [8]
    );
    assert_eq!(
        remaining(limiter.check(&one("{mig}:b")).await.unwrap()),
        [8]
    );
    assert!(cluster.nodes[to].calls("asking") > 0, "ASK was followed");
    let split = hasty
        .check(&both)
        .await
        .expect_err("split past the time-out");
    assert!(
        split.transient && split.message.contains("TryAgain"),
        "{split:?}"
    );
    let moving = cluster.clone();
    let rest = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(150));
        moving.migrate_keys(slot, from, to, usize::MAX, Duration::ZERO)
    });
    let asked = Instant::now();
    assert_eq!(remaining(limiter.check(&both).await.unwrap()), [7, 7]);
    assert!(
        asked.elapsed() >= Duration::from_millis(100),
        "waited for the migration"
    );
    assert_eq!(rest.await.expect("the rest migrated"), 1);
    // A key the slot never held is made on the target (ASK).
    assert_eq!(
        remaining(limiter.check(&one("{mig}:new")).await.unwrap()),
        [9]
    );

    // The slot handed over: MOVED, then the refreshed map sends calls there at once.
    cluster.end_migration(slot, from, to);
    assert_eq!(remaining(limiter.check(&both).await.unwrap()), [6, 6]);
    assert_eq!(cluster.owner(slot), to);
}

/// `/why` across two slots charges nothing in either, and a reset by request forgets a key
/// on its own master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_and_reset_across_slots_on_a_cluster() {
    use sluice::testing::http;
    let cluster = RedisCluster::start();
    let settings = RedisSettings {
        url: cluster.url(),
        ..sluice::testing::redis::default_settings()
    };
    let limiter = RedisLimiter::new(&settings, 100).expect("valid settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let addr = server.admin_addr;
    let wide = other_slot_value();
    let post = |path: &'static str, body: String| async move {
        http::request(addr, "POST", path, &[], &body).await
    };
    let one = r#"{"domain":"redis","descriptors":[{"entries":[{"key":"one","value":"a"}]}]}"#;
    assert_eq!(post("/json", one.to_owned()).await.status, 200);
    let both = format!(
        r#"{{"domain":"redis","descriptors":[{{"entries":[{{"key":"one","value":"a"}}]}},{{"entries":[{{"key":"wide","value":"{wide}"}}]}}]}}"#
    );
    for _ in 0..10 {
        let answer = post("/why", both.clone()).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let w: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
        assert_eq!(w["overall_code"], "OVER_LIMIT", "{w}");
        let verdict = |d: usize| w["descriptors"][d]["limits"][0]["verdict"].clone();
        assert_eq!(verdict(0)["admitted"], false, "{w}");
        assert_eq!(verdict(1)["admitted"], true, "{w}");
        assert_eq!(verdict(1)["remaining"], 999, "{w}");
    }
    let wide_only = format!(
        r#"{{"domain":"redis","descriptors":[{{"entries":[{{"key":"wide","value":"{wide}"}}]}}]}}"#
    );
    let answer = post("/json", wide_only).await;
    assert!(
        answer.body.contains(r#""limitRemaining":999"#),
        "{}",
        answer.body
    );
    let reset = post("/counters/reset", one.to_owned()).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert!(reset.body.contains(r#""held":1"#), "{}", reset.body);
    assert_eq!(post("/json", one.to_owned()).await.status, 200);
}
