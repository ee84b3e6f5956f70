//! `redis.wait_replicas`: closing the replication gap of a failover, at a price.
//!
//! Redis replicates asynchronously: a master answers a script call before its replicas have
//! the writes, so a replica promoted after the master dies may lack the last moments of
//! state, and what those writes had used up can be admitted again. With `wait_replicas` set,
//! every script call is followed on the same connection by `WAIT <replicas> <timeout>`, and
//! the answer goes back only when that many replicas confirmed the writes, or the time-out
//! passed. The price is a replication round trip on every call, and the connection (a lane of
//! group commit) carries nothing else meanwhile.
//!
//! The decision was made when the script ran, so a `WAIT` that comes back short (or fails)
//! never turns the answer into an error, which would also invite a retry that decides twice:
//! the answer stands, and the shortfall is counted (the `wait_short` backend event).

use std::sync::atomic::{AtomicU64, Ordering};

use redis::RedisResult;
use redis::Value;
use redis::aio::ConnectionLike;

use super::script::{self, Call, Functions};
use crate::config::settings::RedisSettings;

/// What to wait for after each script call.
#[derive(Debug)]
pub(super) struct Wait {
    /// Replicas that must confirm the writes.
    replicas: u32,
    /// How long Redis may wait for them, in milliseconds.
    timeout_ms: u64,
    /// Calls whose `WAIT` came back with fewer replicas, or failed.
    short: AtomicU64,
}

impl Wait {
    /// The wait the settings ask for; `None` when `wait_replicas` is 0.
    pub(super) fn from_settings(settings: &RedisSettings) -> Option<Wait> {
        (settings.wait_replicas > 0).then(|| Wait {
            replicas: settings.wait_replicas,
            timeout_ms: settings.wait_timeout_ms,
            short: AtomicU64::new(0),
        })
    }

    /// Calls so far whose writes fewer replicas than asked confirmed in time.
    pub(super) fn short(&self) -> u64 {
        self.short.load(Ordering::Relaxed)
    }

    /// `WAIT` on `conn`, after a script call that ran there.
    pub(super) async fn after<C: ConnectionLike + Send>(&self, conn: &mut C) {
        let confirmed: RedisResult<u64> = redis::cmd("WAIT")
            .arg(self.replicas)
            .arg(self.timeout_ms)
            .query_async(conn)
            .await;
        match confirmed {
            Ok(n) if n >= u64::from(self.replicas) => {}
            other => {
                self.short.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    replicas = self.replicas,
                    confirmed = ?other,
                    "redis: fewer replicas than redis.wait_replicas confirmed a call's writes"
                );
            }
        }
    }
}

/// Runs `call` on `conn` ([`script::invoke`]) and, when it ran and `wait` is set, waits for the
/// replicas before handing its reply back.
pub(super) async fn invoke<C: ConnectionLike + Send>(
    conn: &mut C,
    call: &Call,
    functions: &Functions,
    wait: Option<&Wait>,
) -> RedisResult<Value> {
    let reply = script::invoke(conn, call, functions).await;
    if let (Ok(_), Some(wait)) = (&reply, wait) {
        wait.after(conn).await;
    }
    reply
}
