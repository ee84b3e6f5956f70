//! Bytes Redis holds per key, for each algorithm (`MEMORY USAGE`; the figures of
//! docs/algorithms.md, printed with `--nocapture`), over a real `redis-server`.

use sluice::config::model::Algorithm;
use sluice::limiter::{Batch, Hit, Limiter, RedisLimiter};
use sluice::testing::limits::{hit, limit};
use sluice::testing::redis::RedisServer;

const SEC: u64 = 1_000_000_000;

/// A hit of cost 1 on `key`, 10,000 per hour.
fn one_on(algorithm: Algorithm, key: &str) -> Hit {
    hit(key, limit(algorithm, 10_000, 3_600 * SEC), 1)
}

/// `MEMORY USAGE` of a key after `requests` requests of cost 1 (a few ms apart).
async fn usage(redis: &RedisServer, algorithm: Algorithm, requests: usize) -> i64 {
    let limiter = RedisLimiter::new(&redis.settings(), 1).expect("valid settings");
    let key = format!("{{api|user=123456}}:{}:3600:{requests}", algorithm.as_str());
    for _ in 0..requests {
        let batch = Batch {
            hits: vec![one_on(algorithm, &key)],
        };
        let outcome = limiter.check(&batch).await.expect("redis answers");
        assert!(outcome.admitted);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    redis.cmd(&["MEMORY", "USAGE", &format!("sluice:{key}")])
}

#[tokio::test]
async fn bytes_held_per_key() {
    let redis = RedisServer::start();
    let mut figures = Vec::new();
    for algorithm in Algorithm::ALL {
        let bytes = usage(&redis, algorithm, 1).await;
        figures.push(format!("{}: {bytes} B", algorithm.as_str()));
        let bound = if algorithm == Algorithm::SlidingLog {
            250
        } else {
            160
        };
        assert!(
            bytes > 0 && bytes < bound,
            "{}: {bytes} bytes",
            algorithm.as_str()
        );
    }
    for entries in [100, 200] {
        let bytes = usage(&redis, Algorithm::SlidingLog, entries).await;
        figures.push(format!("sliding_log with {entries} entries: {bytes} B"));
        assert!(
            bytes < 150 * i64::try_from(entries).unwrap_or(i64::MAX),
            "{bytes} bytes"
        );
    }
    eprintln!("{}", figures.join("\n"));
}
