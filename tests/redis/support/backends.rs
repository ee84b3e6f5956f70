//! The two backends of the behaviour suites, and `scenario!`, which runs one test body on each:
//! `scenario!(name, |c| { ... })` makes a module `name` with a `memory` and a `redis` test,
//! each with a fresh client `c` of a server over that backend (Redis: a real `redis-server` on
//! a loopback port). Both serve the rules of tests/fixtures/semantics.yaml, or other rules with
//! `scenario!(name, rules = TEXT, |c, b| { ... })`.

use std::sync::Arc;

use sluice::config::settings::Settings;
use sluice::limiter::clock::Clock;
use sluice::limiter::{ManualClock, RedisLimiter};
use sluice::testing::grpc::{Client, TestServer, client};
use sluice::testing::redis::RedisServer;

pub(crate) const RULES: &str = include_str!("../../fixtures/semantics.yaml");

/// What a test holds on to: the server, and the Redis behind it (if any).
pub(crate) struct Backend {
    _server: TestServer,
    _redis: Option<RedisServer>,
}

impl Backend {
    /// Whole seconds since the Unix epoch on the clock this backend's limiter reads: the
    /// server's manual clock over memory, the wall clock (Redis's `TIME`) over Redis.
    pub(crate) fn now_secs(&self) -> u64 {
        if self._redis.is_some() {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("a clock after 1970")
                .as_secs()
        } else {
            self._server.clock.now_nanos() / 1_000_000_000
        }
    }

    /// The server's gRPC URL (for the other clients).
    pub(crate) fn url(&self) -> String {
        self._server.url()
    }

    /// The memory backend's manual clock; `None` over Redis, which reads its own.
    pub(crate) fn memory_clock(&self) -> Option<&ManualClock> {
        self._redis.is_none().then_some(&self._server.clock)
    }
}

pub(crate) async fn memory_serving(rules: &str) -> (Backend, Client) {
    let server = TestServer::start(rules).await;
    let c = client(&server).await;
    (
        Backend {
            _server: server,
            _redis: None,
        },
        c,
    )
}

pub(crate) async fn redis_serving(rules: &str) -> (Backend, Client) {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1_000).expect("valid redis settings");
    let server = TestServer::start_over(Settings::default(), rules, Arc::new(limiter)).await;
    let c = client(&server).await;
    (
        Backend {
            _server: server,
            _redis: Some(redis),
        },
        c,
    )
}

/// `scenario!(name, |c| { ... })`: the body runs once per backend with a fresh client `c`;
/// `scenario!(name, |c, b| { ... })` also names the [`Backend`] `b`, and
/// `scenario!(name, rules = TEXT, |c, b| { ... })` serves the rules `TEXT`.
macro_rules! scenario {
    ($name:ident, rules = $rules:expr, |$c:ident, $b:ident| $body:block) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn memory() {
                let ($b, mut $c) = $crate::support::backends::memory_serving($rules).await;
                $body
            }

            #[tokio::test]
            async fn redis() {
                let ($b, mut $c) = $crate::support::backends::redis_serving($rules).await;
                $body
            }
        }
    };
    ($name:ident, |$c:ident, $b:ident| $body:block) => {
        scenario!($name, rules = $crate::support::backends::RULES, |$c, $b| {
            $body
        });
    };
    ($name:ident, |$c:ident| $body:block) => {
        scenario!($name, rules = $crate::support::backends::RULES, |$c, _b| {
            $body
        });
    };
}
