//! What operators ask of the Redis backend besides requests: a dry run (admin `/why`), and
//! resetting keys (admin `/counters/reset`) for every replica at once.
//!
//! # Dry run
//!
//! The request goes to the same script, in its `dry` mode (see `lua/prelude.lua`): decided
//! and reported exactly as a request, but nothing is written (but for what every read of a
//! sliding log does: its expired entries are dropped, which counts for nothing). It skips the
//! deny cache (whose answers are Redis's own anyway), the breaker and `on_error`: a failure
//! is an error. In a Cluster, each slot group is a dry call of its own and the request is
//! planned whole from every hit's verdict, as `cluster.rs` plans a request.
//!
//! # Reset
//!
//! The keys are deleted (`DEL`, in a Cluster one per key on its slot's master, following
//! redirections like a request's call), with their
//! penalty boxes (`<key>:block`), then a
//! message on the channel `<prefix>resets` tells every replica to forget its deny cache
//! (the whole of it: a cached denial is only a shortcut, so forgetting too much costs round
//! trips, never an answer). Each replica listens on that channel ([`listen`]) and, when its
//! subscription is (re)made, forgets its deny cache too, so a message missed while it was
//! disconnected loses nothing. In a Cluster a replica listens on one node (a Cluster delivers
//! every `PUBLISH` to the subscribers of all its nodes).

use std::time::Duration;

use futures_util::StreamExt as _;
use redis::RedisResult;
use tokio::time::Instant;

use super::script::{Mode, Unit};
use super::{Call, RedisLimiter, cluster, limiter_error};
use crate::limiter::{Batch, BatchOutcome, LimiterError, plan};

/// The least time an admin call may wait for Redis.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a lost subscription waits before subscribing again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(500);

impl RedisLimiter {
    fn admin_call(&self, mode: Mode) -> Call {
        Call {
            mode,
            unit: Unit::Nanos,
            now_micros: self.script_clock.then(|| self.clock.now_nanos() / 1_000),
            clock_nanos: self.clock.now_nanos(),
            deadline: Instant::now() + self.timeout.max(ADMIN_TIMEOUT),
        }
    }

    /// The verdict a request would get now, writing nothing.
    pub(super) async fn dry(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        let call = self.admin_call(Mode::Dry);
        if !self.commit.shared().connector.is_cluster() {
            return self
                .submit(batch.hits.clone(), call)
                .await
                .map_err(limiter_error);
        }
        let mut outcome = BatchOutcome {
            hits: Vec::with_capacity(batch.hits.len()),
            admitted: false,
        };
        let mut order = Vec::with_capacity(batch.hits.len());
        for indices in cluster::by_slot(self.prefix(), &batch.hits) {
            let hits = indices.iter().filter_map(|&i| batch.hits.get(i).cloned());
            let part = self.submit(hits.collect(), call).await;
            let part = part.map_err(limiter_error)?;
            order.extend(indices.into_iter().zip(part.hits));
        }
        order.sort_by_key(|(i, _)| *i);
        outcome.hits.extend(order.into_iter().map(|(_, h)| h));
        let verdicts: Vec<bool> = outcome.hits.iter().map(|h| h.admitted).collect();
        outcome.admitted = plan::plan(&batch.hits, &verdicts).admitted;
        Ok(outcome)
    }

    /// Deletes `keys` and tells every replica to forget its cached denials; returns how many
    /// keys Redis held.
    pub(super) async fn reset_keys(
        &self,
        keys: &[crate::limiter::StateKey],
    ) -> Result<usize, LimiterError> {
        let deadline = Instant::now() + self.timeout.max(ADMIN_TIMEOUT);
        let work = async {
            let mut deleted = self.delete(keys).await?;
            // A global key's state lives in the home Redis (and this region's pool was
            // deleted above): a reset starts it over there too. Shares other regions hold
            // stay theirs until they expire.
            if let Some(global) = &self.global {
                deleted += global.home().delete(keys).await?;
            }
            self.deny.clear();
            self.leases.clear();
            self.announce().await?;
            Ok::<usize, redis::RedisError>(deleted)
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(result) => result.map_err(limiter_error),
            Err(_) => Err(super::unavailable(
                "no answer from Redis to a reset in time",
            )),
        }
    }

    async fn delete(&self, keys: &[crate::limiter::StateKey]) -> RedisResult<usize> {
        let prefix = self.prefix();
        let connector = &self.commit.shared().connector;
        let full = |key: &[u8]| [prefix, key].concat();
        // A key's penalty box (`block_for`) lives beside it, in the same slot: a reset ends it.
        let boxed = |key: &[u8]| [prefix, key, b":block"].concat();
        // And its leases' records (`lua/lease.lua`): a return made after the reset gives
        // nothing back.
        let leased = |key: &[u8]| [prefix, key, b":lease"].concat();
        // And a global key's pool of shares in this region (`lua/share.lua`).
        let pooled = |key: &[u8]| [prefix, key, b":share"].concat();
        if !connector.is_cluster() {
            if keys.is_empty() {
                return Ok(0);
            }
            let (mut del, mut unblock) = (redis::cmd("DEL"), redis::cmd("DEL"));
            for (key, _) in keys {
                del.arg(full(key));
                unblock.arg(boxed(key));
                unblock.arg(leased(key));
                unblock.arg(pooled(key));
            }
            let mut conn = connector.get(0).await?;
            let deleted = del.query_async(&mut conn).await?;
            let _: usize = unblock.query_async(&mut conn).await?;
            return Ok(deleted);
        }
        // In a Cluster, a key's two `DEL`s go to its slot's master, each following the Cluster.
        let deadline = Instant::now() + self.timeout.max(ADMIN_TIMEOUT);
        let mut deleted = 0;
        for (key, _) in keys {
            let del = |name: Vec<u8>| {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(name);
                cmd
            };
            let n = self.keyed(key, &del(full(key)), deadline).await?;
            self.keyed(key, &del(boxed(key)), deadline).await?;
            self.keyed(key, &del(leased(key)), deadline).await?;
            self.keyed(key, &del(pooled(key)), deadline).await?;
            deleted += redis::from_redis_value::<usize>(n)?;
        }
        Ok(deleted)
    }

    /// The channel on which replicas hear of resets.
    fn channel(&self) -> Vec<u8> {
        [self.prefix(), b"resets"].concat()
    }

    async fn announce(&self) -> RedisResult<()> {
        let mut conn = self.commit.shared().connector.get(0).await?;
        let _: i64 = redis::cmd("PUBLISH")
            .arg(self.channel())
            .arg("all")
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Listens for other replicas' resets, forgetting the deny cache on each, for ever
    /// (subscribing again after a lost connection). Returns at once in a Cluster.
    pub(super) async fn listen(&self) {
        let connector = &self.commit.shared().connector;
        loop {
            match connector.pubsub().await {
                Ok(mut pubsub) => {
                    if let Err(e) = pubsub.subscribe(self.channel()).await {
                        tracing::debug!(error = %e, "redis: cannot subscribe to resets");
                    } else {
                        // Whatever was missed while not subscribed is forgotten now.
                        self.deny.clear();
                        self.leases.clear();
                        let mut messages = pubsub.on_message();
                        while messages.next().await.is_some() {
                            self.deny.clear();
                            self.leases.clear();
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "redis: cannot listen for resets"),
            }
            tokio::time::sleep(RESUBSCRIBE_AFTER).await;
        }
    }
}
