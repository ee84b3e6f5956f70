//! The limiters themselves, without a server, on one manual clock: the memory backend, and two
//! replicas on one real `redis-server`, so that a test can ask all three the same thing and
//! compare (the suites of `concurrency` and `throttle_holds` add their own methods).

use std::sync::Arc;

use sluice::limiter::{ManualClock, MemoryLimiter, RedisLimiter};
use sluice::testing::redis::RedisServer;

const SEC: u64 = 1_000_000_000;

pub(crate) struct Backends {
    pub redis: RedisServer,
    pub clock: ManualClock,
    pub memory: MemoryLimiter<ManualClock>,
    pub replicas: [RedisLimiter; 2],
    /// How many steps a test has taken (for its messages).
    pub step: usize,
}

impl Backends {
    pub(crate) fn start() -> Backends {
        let redis = RedisServer::start();
        let clock = ManualClock::at(1_700_000_000 * SEC);
        let replica = || {
            RedisLimiter::with_clock(&redis.settings(), 1, Arc::new(clock.clone()))
                .expect("valid settings")
        };
        let replicas = [replica(), replica()];
        Backends {
            memory: MemoryLimiter::with_clock(64, clock.clone()),
            clock,
            replicas,
            redis,
            step: 0,
        }
    }

    /// The members of `key`'s sorted set in Redis (a concurrency key's holds).
    pub(crate) fn members(&self, key: &str) -> Vec<String> {
        self.redis
            .cmd(&["ZRANGE", &format!("sluice:{key}"), "0", "-1"])
    }
}
