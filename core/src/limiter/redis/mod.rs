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
//! | `topology` | a Cluster's slot map (refreshed apart from the calls) and a connection per master and lane |
//! | `slots` | a key's Cluster slot; `CLUSTER SLOTS` read into the slot map |
//! | `redirect` | a Cluster call following MOVED, ASK, TRYAGAIN and CLUSTERDOWN within the time-out, never running the script twice |
//! | `group_commit` | the lanes: while a call is in flight, requests queue; the next call carries them all |
//! | `cluster` | splitting a request by Cluster slot, planning it whole, refunding |
//! | `breaker` | the circuit breakers, one per node, that stop waiting on a dead node |
//! | `deny_cache` | the exact local deny cache |
//! | `lease` | this replica's leases on busy keys (`redis.leases`), renewed by lease requests of group commit's calls |
//!
//! # One request
//!
//! 1. If every hit is a cached denial, answer from the deny cache (no round trip).
//! 2. If the breaker of a node the request needs is open (the server; the master Sentinel
//!    named; in a Cluster, the master of one of its slots), answer from `on_error` at once.
//! 3. Otherwise the request joins a lane's next script call (group commit: one call carries
//!    every request that queued while the previous one was in flight; per slot group in a
//!    Cluster), bounded by `timeout_ms` (queueing, connecting and following the Cluster
//!    included). Time is Redis `TIME`, in microseconds.
//! 4. Each call tells the breaker of its node whether the node answered (a reply, even an
//!    error reply such as `CLUSTERDOWN`, is an answer; a time-out or a refused or lost
//!    connection is not: only those open it). On failure (time-out, connection lost, error
//!    reply), answer from `on_error`: `error` (a transient [`LimiterError`], which the
//!    gRPC layer maps to `UNAVAILABLE`), `allow`, `deny`, or `local` (an in-process
//!    [`MemoryLimiter`]).

mod breaker;
mod cluster;
pub mod connection;
mod deny_cache;
mod global;
mod group_commit;
mod holds;
mod lease;
mod lease_view;
mod operate;
mod redirect;
mod replication;
mod reserve;
mod scan;
pub mod script;
mod sentinel;
mod slots;
mod topology;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{RedisError, RedisResult};
use tokio::time::Instant;

use super::{
    Batch, BatchOutcome, BoxFuture, Clock, HitOutcome, Limiter, LimiterError, MemoryLimiter,
    MonotonicClock, plan,
};
use crate::config::settings::{LeaseMode, OnError, RedisSettings};
use breaker::Breakers;
use connection::{Connector, SentinelAuth, Timeouts, Tls};
use deny_cache::DenyCache;
use group_commit::{GroupCommit, Request, Shared};
use script::{Functions, Mode, Unit};
use topology::Node;

/// Limiter state in Redis, shared by every replica.
pub struct RedisLimiter {
    /// The connections, their lanes and the script calls.
    commit: GroupCommit,
    timeout: Duration,
    on_error: OnError,
    breakers: Arc<Breakers>,
    deny: DenyCache,
    /// The deny cache's time; with `script_clock`, the script's too.
    clock: Arc<dyn Clock>,
    /// Send the clock's time to the script instead of letting it read Redis `TIME` (tests).
    script_clock: bool,
    local: Option<MemoryLimiter>,
    /// What the last exchange with Redis (a request or a probe) said: readiness.
    health: parking_lot::Mutex<Result<(), String>>,
    events: Events,
    /// This replica's leases (`redis.leases`).
    leases: lease::Leases,
    /// The shares of global limits (`redis.global_url`), if any.
    global: Option<Arc<global::Global>>,
}

/// Counts of what happened instead of a plain script call, for metrics.
#[derive(Debug, Default)]
struct Events {
    deny_cache_hits: AtomicU64,
    breaker_open: AtomicU64,
    failures: AtomicU64,
    fallbacks: AtomicU64,
}

fn load(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
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
        let global = global::Global::new(settings, clock.clone(), script_clock)?;
        let mut limiter = Self::build_one(settings, local_max_keys, clock, script_clock)?;
        limiter.global = global.map(Arc::new);
        Ok(limiter)
    }

    /// A limiter on `settings.url` alone (no global side).
    fn build_one(
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
        let sentinel = SentinelAuth {
            username: settings.sentinel_username.clone(),
            password: settings.sentinel_password.clone(),
        };
        let connector = Connector::with_sentinel_auth(
            &settings.url,
            &tls,
            &sentinel,
            timeouts,
            settings.connections,
        )
        .map_err(|e| config_error(&e.to_string()))?;
        let breakers = Arc::new(Breakers::new(
            settings.breaker_failures,
            Duration::from_millis(settings.breaker_cooldown_ms),
        ));
        Ok(RedisLimiter {
            commit: GroupCommit::new(Shared {
                connector,
                functions: Functions::new(settings.functions),
                prefix: settings.prefix.as_bytes().to_vec(),
                timeout: timeouts.response,
                wait: replication::Wait::from_settings(settings),
                redirects: Default::default(),
                breakers: breakers.clone(),
            }),
            timeout: timeouts.response,
            on_error: settings.on_error,
            breakers,
            deny: DenyCache::new(settings.deny_cache_size),
            clock,
            script_clock,
            local: (settings.on_error == OnError::Local)
                .then(|| MemoryLimiter::new(local_max_keys)),
            health: parking_lot::Mutex::new(Err("not connected to Redis yet".to_owned())),
            events: Events::default(),
            leases: lease::Leases::new(
                settings.leases == LeaseMode::On,
                crate::limiter::lease::Sizing {
                    horizon_nanos: settings.lease_horizon_ms.saturating_mul(1_000_000),
                    validity_nanos: settings.lease_validity_ms.saturating_mul(1_000_000),
                    burst_percent: settings.lease_burst_percent,
                    min_rate: settings.lease_min_rate,
                },
            ),
            global: None,
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
        let whenever = Instant::now() + Duration::from_secs(3600);
        let call = Call {
            mode: Mode::Request,
            unit: Unit::Micros,
            now_micros,
            clock_nanos: now_micros.map_or_else(|| self.clock.now_nanos(), |n| n * 1_000),
            deadline: whenever,
        };
        self.submit(batch.hits.clone(), call)
            .await
            .map_err(limiter_error)
    }

    /// Running totals since start: requests answered from the deny cache, requests answered
    /// at once because the breaker was open, failed Redis calls, answers given by
    /// `on_error` (`allow`, `deny`, `local`) instead of Redis, a Cluster's attempts after a
    /// call's first (`redirect`), of which `MOVED` and `ASK` redirections followed, calls
    /// whose `WAIT` came back short, and with `redis.leases`: leases taken, units returned,
    /// units lost (expired or dropped unspent), requests decided from leases.
    pub fn events(&self) -> Vec<(&'static str, u64)> {
        let e = &self.events;
        let shared = self.commit.shared();
        let mut events = vec![
            ("deny_cache_hit", e.deny_cache_hits.load(Ordering::Relaxed)),
            ("breaker_open", e.breaker_open.load(Ordering::Relaxed)),
            ("failure", e.failures.load(Ordering::Relaxed)),
            ("fallback", e.fallbacks.load(Ordering::Relaxed)),
            ("redirect", shared.redirects.total()),
            ("moved", shared.redirects.moved()),
            ("ask", shared.redirects.ask()),
            (
                "wait_short",
                shared.wait.as_ref().map_or(0, replication::Wait::short),
            ),
            ("lease_taken", load(&self.leases.counts.taken)),
            ("lease_returned", load(&self.leases.counts.returned)),
            ("lease_lost", load(&self.leases.counts.lost)),
            ("lease_decided", load(&self.leases.counts.decided)),
        ];
        if let Some(global) = &self.global {
            events.extend(global.events());
        }
        events
    }

    /// The nodes known now (the server, the master Sentinel last named, the masters of a
    /// Cluster's map) and those whose breaker is open, each with whether it is open.
    pub fn nodes(&self) -> Vec<(String, bool)> {
        let connector = &self.commit.shared().connector;
        let open = self.breakers.open();
        let mut nodes: Vec<Node> = match connector.topology() {
            Some(topology) => topology.masters(),
            None => connector.node(None).into_iter().collect(),
        };
        nodes.extend(open.iter().cloned());
        nodes.sort();
        nodes.dedup();
        let states = nodes.into_iter().map(|n| {
            let down = open.contains(&n);
            (n.to_string(), down)
        });
        states.collect()
    }

    /// Whether Redis answered the last exchange (request or probe); the reason if not. In a
    /// Cluster, a failed request does not count (it failed on one master, and the others may
    /// serve): only whether some node answers the probe, and the last request's success.
    pub fn health(&self) -> Result<(), String> {
        self.health.lock().clone()
    }

    /// Sends one `PING` within the time-out (in a Cluster, to a few nodes at once: one answer
    /// will do) and records the result as the health. It also makes the first
    /// connection (in a Cluster, loads the slot map), so that the first request does not pay
    /// for it.
    pub async fn probe(&self) {
        let ping = async {
            let connector = &self.commit.shared().connector;
            if let Some(topology) = connector.topology() {
                return topology.ping().await;
            }
            let reply: RedisResult<String> = match connector.get(0).await {
                Ok(mut c) => redis::cmd("PING").query_async(&mut c).await,
                Err(e) => Err(e),
            };
            reply.map(drop).inspect_err(|e| connector.failed(0, e))
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
        self.leases.sweep(self.clock.now_nanos())
            + self.deny.sweep(self.clock.now_nanos())
            + self.local.as_ref().map_or(0, MemoryLimiter::sweep)
    }

    /// Entries held in process: deny cache and local fallback.
    pub fn held(&self) -> usize {
        self.deny.len() + self.leases.len() + self.local.as_ref().map_or(0, MemoryLimiter::len)
    }

    async fn decide(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        if let Some(global) = &self.global
            && batch.hits.iter().any(|h| h.limit.global)
        {
            return self.decide_global(global, batch).await;
        }
        self.decide_local(batch).await
    }

    /// A request without global hits (or a global request's local hits).
    async fn decide_local(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        let sent = self.clock.now_nanos();
        if let Some(outcome) = self.deny.answer(batch, sent) {
            bump(&self.events.deny_cache_hits);
            return Ok(outcome);
        }
        if let Some(outcome) = self.leased(batch).await {
            return Ok(outcome);
        }
        if let Some(node) = self.refused(batch) {
            bump(&self.events.breaker_open);
            let why = format!("circuit breaker open for {node} after repeated failures");
            return self.fallback(batch, unavailable(&why)).await;
        }
        let deadline = Instant::now() + self.timeout;
        match self.remote(batch, sent, deadline).await {
            Ok(outcome) => {
                *self.health.lock() = Ok(());
                self.deny.learn(batch, &outcome, sent);
                Ok(outcome)
            }
            Err(e) => {
                bump(&self.events.failures);
                if e.transient {
                    // A failover or a lost connection: what Redis counted as leased may be
                    // gone, so this replica spends none of it.
                    self.leases.clear();
                }
                if e.transient && !self.commit.shared().connector.is_cluster() {
                    *self.health.lock() = Err(format!("redis: {}", e.message));
                }
                self.fallback(batch, e).await
            }
        }
    }

    /// A node `batch` needs whose breaker refuses calls now, if any. In a Cluster, the masters
    /// of its slots by the map (whose refresh this asks for, so that a failover is seen).
    fn refused(&self, batch: &Batch) -> Option<Node> {
        if self.breakers.quiet() {
            return None;
        }
        let connector = &self.commit.shared().connector;
        let mut nodes: Vec<Node> = Vec::new();
        if connector.is_cluster() {
            for hit in &batch.hits {
                let node = connector.node(Some(cluster::slot(self.prefix(), &hit.key)));
                if let Some(node) = node.filter(|n| !nodes.contains(n)) {
                    nodes.push(node);
                }
            }
        } else {
            nodes.extend(connector.node(None));
        }
        let refused = nodes.into_iter().find(|n| !self.breakers.allow(n))?;
        if let Some(topology) = connector.topology() {
            topology.stale();
        }
        Some(refused)
    }

    /// The decision from Redis, times in nanoseconds; every call ends by `deadline`.
    async fn remote(
        &self,
        batch: &Batch,
        now: u64,
        deadline: Instant,
    ) -> Result<BatchOutcome, LimiterError> {
        let call = Call {
            mode: Mode::Request,
            unit: Unit::Nanos,
            now_micros: self.script_clock.then_some(now / 1_000),
            clock_nanos: now,
            deadline,
        };
        let outcome = if self.commit.shared().connector.is_cluster() {
            cluster::check(self, batch, call).await
        } else {
            self.submit(batch.hits.clone(), call).await
        };
        outcome.map_err(limiter_error)
    }

    /// Decides `hits` (all of one Cluster slot, in a Cluster) in a lane's next script call, by
    /// `call.deadline`.
    async fn submit(&self, hits: Vec<super::Hit>, call: Call) -> Result<BatchOutcome, RedisError> {
        match self.submit_any(hits, call).await? {
            script::Decided::Batch(outcome) => Ok(outcome),
            script::Decided::Lease(_) => Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "sluice: a lease reply to a request",
            ))),
        }
    }

    /// [`RedisLimiter::submit`] for any request, a lease's too.
    async fn submit_any(
        &self,
        hits: Vec<super::Hit>,
        call: Call,
    ) -> Result<script::Decided, RedisError> {
        let shared = self.commit.shared();
        let slot = shared
            .connector
            .is_cluster()
            .then(|| hits.first().map(|h| cluster::slot(&shared.prefix, &h.key)))
            .flatten();
        let expected = shared.connector.node(slot);
        let request = Request {
            hits,
            mode: call.mode,
            unit: call.unit,
            now_micros: call.now_micros,
            clock_nanos: call.clock_nanos,
            slot,
            node: expected.clone(),
        };
        // The breaker of the node a call went to learns from the call itself whether the node
        // answered; a request whose time-out passed first counts against the node it waited
        // for, unless that node was replying (its calls were being tried again) or the
        // time-out fired so late that this process was stalled (`breaker::stalled`).
        match tokio::time::timeout_at(call.deadline, self.commit.submit(request)).await {
            Ok(answer) => answer.result,
            // The lane's own time-out (which drops a Sentinel connection) fires a little
            // later, if the call is still in flight then.
            Err(_) => {
                if let Some(node) = &expected
                    && !breaker::stalled(call.deadline)
                {
                    self.breakers.timed_out(node, self.timeout);
                }
                Err(timed_out(self.timeout))
            }
        }
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

    /// One direct call (a hold's, a reservation's) within `redis.timeout_ms`: `call` gets the
    /// deadline to pass down; a time-out is a backend error and counts against lane 0's
    /// connection, as a batch call's does.
    async fn within_timeout<T, F>(&self, call: impl FnOnce(Instant) -> F) -> Result<T, LimiterError>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        let deadline = Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, call(deadline)).await {
            Ok(result) => result.map_err(limiter_error),
            Err(_) => {
                self.commit.shared().connector.timed_out(0);
                Err(limiter_error(timed_out(self.timeout)))
            }
        }
    }

    /// Sends `call`, a command outside a batch that names `key` (without the prefix), by
    /// `deadline` on lane 0: the path of a batch's call, so in a Cluster it goes to the key's
    /// slot's master and follows redirections.
    async fn keyed<E: redirect::Exchange>(
        &self,
        key: &[u8],
        call: &E,
        deadline: Instant,
    ) -> RedisResult<redis::Value> {
        let shared = self.commit.shared();
        let slot = shared
            .connector
            .is_cluster()
            .then(|| cluster::slot(self.prefix(), key));
        group_commit::send(shared, 0, slot, call, deadline, &mut None).await
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

/// Whether retrying later may work after `e`.
fn transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || e.is_unrecoverable_error()
        || matches!(
            e.code(),
            Some("READONLY" | "MASTERDOWN" | "LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN")
        )
}

/// Classifies a Redis error: transient when retrying later may work.
fn limiter_error(e: RedisError) -> LimiterError {
    LimiterError {
        backend: "redis",
        message: e.to_string(),
        transient: transient(&e),
        source: Some(Box::new(e)),
    }
}

/// No answer within `timeout` (queueing, connecting and following the Cluster included).
fn timed_out(timeout: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {timeout:?}"),
    ))
}

/// How a request's script calls are made.
#[derive(Debug, Clone, Copy)]
struct Call {
    mode: Mode,
    unit: Unit,
    /// The script's time instead of Redis `TIME` (tests).
    now_micros: Option<u64>,
    /// The limiter's clock: calendar windows are computed from it, in Rust.
    clock_nanos: u64,
    /// When the request stops waiting.
    deadline: Instant,
}

impl Limiter for RedisLimiter {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(self.decide(batch))
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn dry_run<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(self.read_split(batch, global::Read::Dry))
    }

    fn shares<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<super::counters::ShareView>>, LimiterError>> {
        Box::pin(self.shares_of(keys))
    }

    fn reset<'a>(
        &'a self,
        keys: &'a [super::StateKey],
    ) -> BoxFuture<'a, Result<usize, LimiterError>> {
        Box::pin(self.reset_keys(keys))
    }

    fn hold<'a>(
        &'a self,
        request: &'a super::holds::HoldRequest,
    ) -> BoxFuture<'a, Result<super::holds::HoldOutcome, LimiterError>> {
        Box::pin(self.hold_op(request))
    }

    fn reserve<'a>(
        &'a self,
        request: &'a super::reserve::ReserveRequest,
    ) -> BoxFuture<'a, Result<super::reserve::ReserveOutcome, LimiterError>> {
        Box::pin(self.reserve_op(request))
    }

    fn listen(&self) -> Option<BoxFuture<'_, ()>> {
        Some(Box::pin(RedisLimiter::listen(self)))
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

    fn nodes(&self) -> Vec<(String, bool)> {
        RedisLimiter::nodes(self)
    }

    fn counters<'a>(
        &'a self,
        query: &'a super::counters::CounterQuery<'a>,
    ) -> BoxFuture<'a, Result<super::counters::CounterPage, LimiterError>> {
        Box::pin(scan::page(self, query))
    }

    fn blocked<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, LimiterError>> {
        Box::pin(scan::blocks(self, keys))
    }

    fn leases<'a>(
        &'a self,
        keys: &'a [(&'a [u8], super::LimitParams)],
    ) -> BoxFuture<'a, Result<Vec<Option<super::counters::LeaseView>>, LimiterError>> {
        Box::pin(self.lease_views(keys))
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
            .field("breaker_open", &self.breakers.any_open())
            .finish_non_exhaustive()
    }
}
