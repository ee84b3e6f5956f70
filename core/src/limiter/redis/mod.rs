//! The Redis backend: every replica shares one state, decided by one atomic Lua call per
//! request (see `lua/prelude.lua` for the script's KEYS/ARGV contract, `lua/` for one file per
//! algorithm, docs/redis.md for the operator's view).
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | `script` | encoding a batch for the Lua code (`lua/`), EVALSHA of the script (EVAL on NOSCRIPT) or FCALL of the function library (`redis.functions`), decoding |
//! | `connection` | URL forms (one server, Sentinel, Cluster), lazy, self-healing connections (one per lane), and the one place the three kinds are told apart |
//! | `group_commit` | the lanes: while a call is in flight, requests queue; the next call carries them all |
//! | `cluster` | splitting a request by Cluster slot, planning it whole, refunding |
//! | `breaker` | the circuit breaker that stops waiting on a dead Redis |
//! | `deny_cache` | the exact local deny cache |
//!
//! # One request
//!
//! 1. If every hit is a cached denial, answer from the deny cache (no round trip).
//! 2. If the breaker is open, answer from `on_error` at once.
//! 3. Otherwise the request joins a lane's next script call (group commit: one call carries
//!    every request that queued while the previous one was in flight; per slot group in a
//!    Cluster), bounded by `timeout_ms` (queueing and connecting included). Time is Redis
//!    `TIME`, in microseconds.
//! 4. On failure (time-out, connection lost, error reply), count it in the breaker and answer
//!    from `on_error`: `error` (a transient [`LimiterError`], which the gRPC layer maps to
//!    `UNAVAILABLE`), `allow`, `deny`, or `local` (an in-process [`MemoryLimiter`]).

mod breaker;
mod cluster;
pub mod connection;
mod deny_cache;
mod group_commit;
mod scan;
pub mod script;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{RedisError, RedisResult};

use super::{
    Batch, BatchOutcome, BoxFuture, Clock, HitOutcome, Limiter, LimiterError, MemoryLimiter,
    MonotonicClock, plan,
};
use crate::config::settings::{OnError, RedisSettings};
use breaker::Breaker;
use connection::{Connector, Timeouts, Tls};
use deny_cache::DenyCache;
use group_commit::{GroupCommit, Request, Shared};
use script::{Functions, Mode, Unit};

/// Limiter state in Redis, shared by every replica.
pub struct RedisLimiter {
    /// The connections, their lanes and the script calls.
    commit: GroupCommit,
    timeout: Duration,
    on_error: OnError,
    breaker: Breaker,
    deny: DenyCache,
    /// The deny cache's time; with `script_clock`, the script's too.
    clock: Arc<dyn Clock>,
    /// Send the clock's time to the script instead of letting it read Redis `TIME` (tests).
    script_clock: bool,
    local: Option<MemoryLimiter>,
    /// What the last exchange with Redis (a request or a probe) said: readiness.
    health: parking_lot::Mutex<Result<(), String>>,
    events: Events,
}

/// Counts of what happened instead of a plain script call, for metrics.
#[derive(Debug, Default)]
struct Events {
    deny_cache_hits: AtomicU64,
    breaker_open: AtomicU64,
    failures: AtomicU64,
    fallbacks: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl RedisLimiter {
    /// A limiter on the Redis of `settings`; no connection is made until the first request.
    /// `local_max_keys` bounds the in-process fallback of `on_error = "local"`.
    pub fn new(
        settings: &RedisSettings,
        local_max_keys: usize,
    ) -> Result<RedisLimiter, LimiterError> {
        Self::build(
            settings,
            local_max_keys,
            Arc::new(MonotonicClock::new()),
            false,
        )
    }

    /// A limiter whose time is `clock`'s, for tests: the deny cache reads it, and every script
    /// call carries it (rounded down to the microsecond) instead of reading Redis `TIME`.
    pub fn with_clock(
        settings: &RedisSettings,
        local_max_keys: usize,
        clock: Arc<dyn Clock>,
    ) -> Result<RedisLimiter, LimiterError> {
        Self::build(settings, local_max_keys, clock, true)
    }

    fn build(
        settings: &RedisSettings,
        local_max_keys: usize,
        clock: Arc<dyn Clock>,
        script_clock: bool,
    ) -> Result<RedisLimiter, LimiterError> {
        if settings.prefix.contains('{') {
            return Err(config_error(
                "redis.prefix must not contain '{' (it would break the Cluster hash tag)",
            ));
        }
        let timeouts = Timeouts {
            connect: Duration::from_millis(settings.connect_timeout_ms.max(1)),
            response: Duration::from_millis(settings.timeout_ms.max(1)),
        };
        let tls = Tls::from_settings(settings).map_err(|e| config_error(&e))?;
        let connector = Connector::new(&settings.url, &tls, timeouts, settings.connections)
            .map_err(|e| config_error(&e.to_string()))?;
        Ok(RedisLimiter {
            commit: GroupCommit::new(Shared {
                connector,
                functions: Functions::new(settings.functions),
                prefix: settings.prefix.as_bytes().to_vec(),
                timeout: timeouts.response,
            }),
            timeout: timeouts.response,
            on_error: settings.on_error,
            breaker: Breaker::new(
                settings.breaker_failures,
                Duration::from_millis(settings.breaker_cooldown_ms),
            ),
            deny: DenyCache::new(settings.deny_cache_size),
            clock,
            script_clock,
            local: (settings.on_error == OnError::Local)
                .then(|| MemoryLimiter::new(local_max_keys)),
            health: parking_lot::Mutex::new(Err("not connected to Redis yet".to_owned())),
            events: Events::default(),
        })
    }

    /// Runs the script once for `batch`, whose periods are already in microseconds, at
    /// `now_micros` instead of Redis `TIME` when given; the outcome's resets stay in
    /// microseconds. No deny cache, breaker, time-out or fallback: this is the script itself,
    /// for tests (the differential test drives it on a controlled clock).
    pub async fn check_micros(
        &self,
        batch: &Batch,
        now_micros: Option<u64>,
    ) -> Result<BatchOutcome, LimiterError> {
        self.submit(batch.hits.clone(), Mode::Request, Unit::Micros, now_micros)
            .await
            .map_err(limiter_error)
    }

    /// Running totals since start: requests answered from the deny cache, requests answered
    /// at once because the breaker was open, failed Redis calls, and answers given by
    /// `on_error` (`allow`, `deny`, `local`) instead of Redis.
    pub fn events(&self) -> Vec<(&'static str, u64)> {
        let e = &self.events;
        vec![
            ("deny_cache_hit", e.deny_cache_hits.load(Ordering::Relaxed)),
            ("breaker_open", e.breaker_open.load(Ordering::Relaxed)),
            ("failure", e.failures.load(Ordering::Relaxed)),
            ("fallback", e.fallbacks.load(Ordering::Relaxed)),
        ]
    }

    /// Whether Redis answered the last exchange (request or probe); the reason if not.
    pub fn health(&self) -> Result<(), String> {
        self.health.lock().clone()
    }

    /// Sends one `PING` within the time-out and records the result as the health. It also
    /// makes the first connection, so that the first request does not pay for it.
    pub async fn probe(&self) {
        let ping = async {
            let connector = &self.commit.shared().connector;
            let reply: RedisResult<String> = match connector.get(0).await {
                Ok(mut c) => redis::cmd("PING").query_async(&mut c).await,
                Err(e) => Err(e),
            };
            reply.inspect_err(|e| connector.failed(0, e))
        };
        let result = match tokio::time::timeout(self.timeout, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("redis: {e}")),
            Err(_) => {
                self.commit.shared().connector.timed_out(0);
                Err(format!(
                    "redis: no answer to PING within {:?}",
                    self.timeout
                ))
            }
        };
        *self.health.lock() = result;
    }

    /// Drops expired deny-cache entries and drained local-fallback states.
    pub fn sweep(&self) -> usize {
        self.deny.sweep(self.clock.now_nanos())
            + self.local.as_ref().map_or(0, MemoryLimiter::sweep)
    }

    /// Entries held in process: deny cache and local fallback.
    pub fn held(&self) -> usize {
        self.deny.len() + self.local.as_ref().map_or(0, MemoryLimiter::len)
    }

    async fn decide(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        let sent = self.clock.now_nanos();
        if let Some(outcome) = self.deny.answer(batch, sent) {
            bump(&self.events.deny_cache_hits);
            return Ok(outcome);
        }
        if !self.breaker.allow() {
            bump(&self.events.breaker_open);
            return self
                .fallback(
                    batch,
                    unavailable("circuit breaker open after repeated failures"),
                )
                .await;
        }
        let result = match tokio::time::timeout(self.timeout, self.remote(batch, sent)).await {
            Ok(result) => result,
            // The lane's own time-out (which drops a Sentinel connection) fires a little
            // later, if the call is still in flight then.
            Err(_) => Err(unavailable(&format!("no answer within {:?}", self.timeout))),
        };
        match result {
            Ok(outcome) => {
                *self.health.lock() = Ok(());
                self.breaker.record(true);
                self.deny.learn(batch, &outcome, sent);
                Ok(outcome)
            }
            Err(e) => {
                bump(&self.events.failures);
                if e.transient {
                    self.breaker.record(false);
                    *self.health.lock() = Err(format!("redis: {}", e.message));
                }
                self.fallback(batch, e).await
            }
        }
    }

    /// The decision from Redis, times in nanoseconds.
    async fn remote(&self, batch: &Batch, now: u64) -> Result<BatchOutcome, LimiterError> {
        let now_micros = self.script_clock.then_some(now / 1_000);
        let outcome = if self.commit.shared().connector.is_cluster() {
            cluster::check(self, batch, now_micros).await
        } else {
            let hits = batch.hits.clone();
            self.submit(hits, Mode::Request, Unit::Nanos, now_micros)
                .await
        };
        outcome.map_err(limiter_error)
    }

    /// Decides `hits` (all of one Cluster slot, in a Cluster) in a lane's next script call.
    async fn submit(
        &self,
        hits: Vec<super::Hit>,
        mode: Mode,
        unit: Unit,
        now_micros: Option<u64>,
    ) -> Result<BatchOutcome, RedisError> {
        let shared = self.commit.shared();
        let slot = shared
            .connector
            .is_cluster()
            .then(|| hits.first().map(|h| cluster::slot(&shared.prefix, &h.key)))
            .flatten();
        let request = Request {
            hits,
            mode,
            unit,
            now_micros,
            slot,
        };
        self.commit.submit(request).await
    }

    async fn fallback(
        &self,
        batch: &Batch,
        err: LimiterError,
    ) -> Result<BatchOutcome, LimiterError> {
        tracing::debug!(error = %err, on_error = ?self.on_error, "redis backend failed");
        if self.on_error != OnError::Error {
            bump(&self.events.fallbacks);
        }
        match (self.on_error, &self.local) {
            (OnError::Allow, _) => Ok(uniform(batch, true)),
            (OnError::Deny, _) => Ok(uniform(batch, false)),
            (OnError::Local, Some(local)) => local.check(batch).await,
            _ => Err(err),
        }
    }

    /// The prefix in front of every key.
    fn prefix(&self) -> &[u8] {
        &self.commit.shared().prefix
    }

    /// Whether the next call goes to the function library (`FCALL`) or to the script
    /// (`EVALSHA`): the former when `redis.functions` is on, until Redis refuses functions.
    pub fn via(&self) -> script::Via {
        self.commit.shared().functions.via()
    }
}

/// Every hit admitted (with nothing known about what is left), or every hit denied (retry in
/// one second).
fn uniform(batch: &Batch, admitted: bool) -> BatchOutcome {
    let hit = HitOutcome {
        admitted,
        remaining: 0,
        reset_nanos: if admitted { 0 } else { 1_000_000_000 },
        from_local_cache: false,
    };
    let verdicts = vec![admitted; batch.hits.len()];
    BatchOutcome {
        hits: vec![hit; batch.hits.len()],
        admitted: plan::plan(&batch.hits, &verdicts).admitted,
    }
}

fn config_error(message: &str) -> LimiterError {
    LimiterError {
        backend: "redis",
        message: message.to_owned(),
        transient: false,
        source: None,
    }
}

fn unavailable(message: &str) -> LimiterError {
    LimiterError {
        backend: "redis",
        message: message.to_owned(),
        transient: true,
        source: None,
    }
}

/// Classifies a Redis error: transient when retrying later may work.
fn limiter_error(e: RedisError) -> LimiterError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || e.is_unrecoverable_error()
        || matches!(
            e.code(),
            Some("READONLY" | "MASTERDOWN" | "LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN")
        );
    LimiterError {
        backend: "redis",
        message: e.to_string(),
        transient,
        source: Some(Box::new(e)),
    }
}

impl Limiter for RedisLimiter {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(self.decide(batch))
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn sweep(&self) -> usize {
        RedisLimiter::sweep(self)
    }

    fn held(&self) -> usize {
        RedisLimiter::held(self)
    }

    fn probe(&self) -> Option<BoxFuture<'_, ()>> {
        Some(Box::pin(RedisLimiter::probe(self)))
    }

    /// Follows Redis only with `on_error = "error"`: the other settings answer while Redis
    /// is down (`allow`, `deny`, or the local limiter), so a replica that cannot reach Redis
    /// still serves, and taking every replica out of the Service at once would hand the
    /// decision to the client's failure mode instead.
    fn ready(&self) -> Result<(), String> {
        match self.on_error {
            OnError::Error => self.health(),
            OnError::Allow | OnError::Deny | OnError::Local => Ok(()),
        }
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        RedisLimiter::events(self)
    }

    fn counters<'a>(
        &'a self,
        query: &'a super::counters::CounterQuery<'a>,
    ) -> BoxFuture<'a, Result<super::counters::CounterPage, LimiterError>> {
        Box::pin(scan::page(self, query))
    }

    fn status(&self) -> super::counters::BackendStatus {
        scan::status(self)
    }
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &String::from_utf8_lossy(self.prefix()))
            .field("on_error", &self.on_error)
            .field("breaker_open", &self.breaker.is_open())
            .finish_non_exhaustive()
    }
}
