//! Operators see a node's trouble (docs/redis.md, "Faults"): with the Redis server killed and
//! its breaker open, `/readyz` stays ready (`on_error = "allow"`) and names the node as down,
//! and `/metrics` has the node's breaker gauge at 1; once the server is back, the breaker
//! closes, the gauge reads 0 and `/readyz` names nothing.

use std::sync::Arc;
use std::time::Duration;

use sluice::config::model::Algorithm;
use sluice::config::settings::{OnError, RedisSettings, Settings};
use sluice::limiter::{Batch, Limiter, RedisLimiter};
use sluice::testing::limits::{hit, limit};
use sluice::testing::redis::RedisServer;
use sluice::testing::{TestServer, eventually, http};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

fn batch() -> Batch {
    let roomy = limit(Algorithm::Funnel, 1_000_000, 1_000_000_000);
    Batch {
        hits: vec![hit("{d|k=v}:funnel:1", roomy, 1)],
    }
}

/// The value of the breaker gauge of `node` in `/metrics`, if served.
async fn gauge(server: &TestServer, node: &str) -> Option<String> {
    let text = http::get(server.admin_addr, "/metrics").await.body;
    let series = format!("sluice_backend_breaker_open{{backend=\"redis\",node=\"{node}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map(str::to_owned)
}

#[tokio::test]
async fn a_node_down_is_named_by_readyz_and_by_its_breaker_gauge() {
    let mut redis = RedisServer::start();
    let settings = RedisSettings {
        on_error: OnError::Allow,
        timeout_ms: 500,
        connect_timeout_ms: 200,
        breaker_cooldown_ms: 200,
        ..redis.settings()
    };
    let limiter = Arc::new(RedisLimiter::new(&settings, 1000).expect("settings"));
    let server = TestServer::start_over(Settings::default(), RULES, limiter.clone()).await;
    let node = redis.addr();
    limiter.check(&batch()).await.expect("Redis answers");
    assert_eq!(gauge(&server, &node).await.as_deref(), Some("0"));
    let ready = http::get(server.admin_addr, "/readyz").await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));

    redis.kill();
    for _ in 0..5 {
        let answer = limiter.check(&batch()).await.expect("on_error = allow");
        assert!(answer.admitted);
    }
    let ready = http::get(server.admin_addr, "/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.body,
        format!("ready\nnodes down (circuit breaker open): {node}\n")
    );
    assert_eq!(gauge(&server, &node).await.as_deref(), Some("1"));

    redis.restart();
    eventually(Duration::from_secs(5), "the breaker closing", || async {
        let _ = limiter.check(&batch()).await;
        gauge(&server, &node).await.as_deref() == Some("0")
    })
    .await;
    let ready = http::get(server.admin_addr, "/readyz").await;
    assert_eq!((ready.status, ready.body.as_str()), (200, "ready\n"));
    server.stop().await.expect("a clean stop");
}
