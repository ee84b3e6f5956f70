//! `redis.wait_replicas`: each script call followed by `WAIT`, so that a replica holds the
//! writes of every answer given (what a promoted replica would need to forget nothing), and an
//! answer still given, and counted, when fewer replicas confirm in time.

use std::time::Duration;

use tokio::time::Instant;

use sluice::config::model::Algorithm;
use sluice::config::settings::RedisSettings;
use sluice::limiter::{Batch, Limiter, RedisLimiter};
use sluice::testing::limits::{hit, limit};
use sluice::testing::redis::{RedisServer, wait_until};

const SECOND: u64 = 1_000_000_000;

fn replicated() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    wait_until(Duration::from_secs(10), "replication", || {
        replica
            .cmd::<String>(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    (master, replica)
}

fn waiting(master: &RedisServer, replicas: u32) -> RedisLimiter {
    let settings = RedisSettings {
        wait_replicas: replicas,
        wait_timeout_ms: 40,
        timeout_ms: 500,
        // Every answer here is Redis's, whatever the suites' leases switch: these tests check
        // that each answer's write reached the replica (an answer from a lease writes
        // nothing) and the exact count of admissions (a lease that expires unspent loses its
        // units until the window ends: the documented under-admission).
        leases: sluice::config::settings::LeaseMode::Off,
        ..master.settings()
    };
    RedisLimiter::new(&settings, 100).expect("settings")
}

fn event(limiter: &RedisLimiter, name: &str) -> u64 {
    limiter
        .events()
        .into_iter()
        .find_map(|(event, n)| (event == name).then_some(n))
        .unwrap_or_else(|| panic!("no {name} event"))
}

/// The serialized value of `key` on `server` (`DUMP`), `Nil` when it has none.
fn dump(server: &RedisServer, key: &str) -> redis::Value {
    server.cmd(&["DUMP", key])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_on_the_replica_when_it_is_given() {
    let (master, replica) = replicated();
    let limiter = waiting(&master, 1);
    let algorithms = [
        Algorithm::Funnel,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        let key = format!("{{w{i}}}:k");
        let batch = Batch {
            hits: vec![hit(&key, limit(algorithm, 30, 60 * SECOND), 1)],
        };
        for n in 0..40 {
            let outcome = limiter.check(&batch).await.expect("answered");
            assert_eq!(outcome.admitted, n < 30, "{algorithm:?} request {n}");
            // Read at once after the answer: the replica already has what the master has.
            let stored = format!("sluice:{key}");
            let on_master = dump(&master, &stored);
            assert_ne!(on_master, redis::Value::Nil, "{algorithm:?}: state written");
            assert_eq!(
                dump(&replica, &stored),
                on_master,
                "{algorithm:?} request {n}: the replica lags the answer"
            );
        }
    }
    // One WAIT after each script call that ran: all but the first `EVALSHA`, which met
    // `NOSCRIPT` and went again as `EVAL`.
    assert_eq!(
        master.calls("wait"),
        master.script_calls() - 1,
        "one WAIT per script call that ran"
    );
    assert_eq!(event(&limiter, "wait_short"), 0);
}

/// With the replica stopped (SIGSTOP), the answer waits for it: it comes only once the
/// replica, resumed, has the write (without `WAIT` it would come at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_waits_until_a_stopped_replica_has_its_write() {
    let (master, replica) = replicated();
    let settings = RedisSettings {
        wait_replicas: 1,
        wait_timeout_ms: 2_000,
        timeout_ms: 3_000,
        ..master.settings()
    };
    let limiter = std::sync::Arc::new(RedisLimiter::new(&settings, 100).expect("settings"));
    let batch = Batch {
        hits: vec![hit("{stop}:k", limit(Algorithm::Funnel, 5, SECOND), 1)],
    };
    limiter.check(&batch).await.expect("a first answer");
    replica.pause();
    let asking = limiter.clone();
    let answer = tokio::spawn(async move { asking.check(&batch).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!answer.is_finished(), "answered before the replica had it");
    replica.resume();
    let outcome = answer.await.expect("joined").expect("answered");
    assert!(outcome.admitted);
    assert_eq!(
        dump(&replica, "sluice:{stop}:k"),
        dump(&master, "sluice:{stop}:k"),
        "the replica holds the answered write"
    );
    assert_eq!(event(&limiter, "wait_short"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_still_answer_after_the_wait_and_are_counted() {
    let (master, _replica) = replicated();
    // Two asked, one there: every WAIT runs out its 40 ms.
    let limiter = waiting(&master, 2);
    let batch = Batch {
        hits: vec![hit("{short}:k", limit(Algorithm::Funnel, 5, SECOND), 1)],
    };
    let started = Instant::now();
    for n in 0..3 {
        let outcome = limiter.check(&batch).await.expect("answered anyway");
        assert!(outcome.admitted, "request {n}");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(3 * 40),
        "each answer waited for the replicas: {:?}",
        started.elapsed()
    );
    assert_eq!(event(&limiter, "wait_short"), 3);
}
