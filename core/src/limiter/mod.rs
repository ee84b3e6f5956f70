//! The limiters: the algorithms as pure functions, and the backends that keep their state.
//!
//! Each algorithm is a module of pure integer functions of (state, now, cost, parameters):
//! [`funnel`], [`token_bucket`], [`fixed_window`], [`sliding_window`], [`sliding_log`],
//! [`concurrency`].
//! [`algorithm`] puts them behind one interface for the memory backend; the Redis backend
//! mirrors them in Lua (`redis/lua/`). docs/algorithms.md compares them. The Memcached
//! backend ([`memcache`]) keeps fixed windows only; [`per_second`] routes per-second limits
//! to a limiter of their own.
//!
//! A request reaches a backend as one [`Batch`]: every limit of every descriptor that must be
//! checked, so that a backend makes one decision (and, for Redis, one round trip) per request.
//! The backend evaluates every hit against the current state, decides which hits consume with
//! [`plan`] (all or nothing), commits, and reports a [`HitOutcome`] per hit.

pub mod algorithm;
pub use crate::config::calendar;

pub mod clock;
pub mod concurrency;
pub mod counters;
pub mod fixed_window;
pub mod funnel;
pub mod gathering;
pub mod holds;
pub mod lease;
pub mod memcache;
mod memcache_conn;
mod memcache_tls;
pub mod memory;
pub mod per_second;
pub mod plan;
pub mod redis;
pub mod reserve;
pub mod share;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use self::redis::RedisLimiter;
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use memcache::MemcacheLimiter;
pub use memory::MemoryLimiter;
pub use per_second::PerSecond;

use crate::config::model::{Algorithm, Charge};

/// The parameters of one limit, in the integer time of the limiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitParams {
    pub algorithm: Algorithm,
    /// Q.
    pub quota: u32,
    /// P in nanoseconds (> 0).
    pub period_nanos: u64,
    /// B.
    pub burst: u32,
    pub charge: Charge,
    pub borrow: bool,
    /// The penalty box (`block_for`): once this limit denies a key, the key stays denied this
    /// many nanoseconds; 0: none.
    pub block_nanos: u64,
    /// `scope: global`: counted once across regions, in the home Redis
    /// (`redis.global_url`), which lends shares of it to this region (docs/regions.md).
    pub global: bool,
    /// Calendar windows (`time_zone`, `fixed_window` only): the window is a local day, week,
    /// month or year instead of an epoch-aligned block of `period_nanos`.
    pub calendar: Option<calendar::Calendar>,
}

/// How a descriptor's verdict counts towards the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A denial denies the whole request.
    Enforced,
    /// Computed and counted, never denies the request (per-rule `shadow_mode`).
    Shadow,
    /// Denies the request only when every quota-mode descriptor of it denies (`quota_mode`).
    Quota,
    /// Both: computed and counted, never denies, and counts among the quota-mode descriptors
    /// as one that passes, so that while one is in a request the quota-mode descriptors never
    /// all deny it (envoyproxy/ratelimit's reading of `shadow_mode` with `quota_mode`).
    QuotaShadow,
}

impl Role {
    /// Whether the descriptor is reported OK whatever its limits say.
    pub fn is_shadow(self) -> bool {
        matches!(self, Role::Shadow | Role::QuotaShadow)
    }
}

/// One limit to check for one descriptor of a request.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The state key: unique per (domain, matched entries, algorithm, period).
    pub key: Arc<[u8]>,
    pub limit: LimitParams,
    /// The cost; 0 checks without consuming.
    pub cost: u64,
    /// Give `cost` back instead of taking it (`is_negative_hits`).
    pub refund: bool,
    /// Index of the request descriptor this hit belongs to; hits of one descriptor are adjacent.
    pub group: usize,
    pub role: Role,
    /// The hold this hit names, for a `concurrency` limit whose rule declares `hold_id`
    /// ([`concurrency::hold_id`] of the request's id): an admitted cost is held under it, a
    /// denied one leaves nothing, a refund frees only it (docs/holds.md). `None`: anonymous.
    /// (Non-zero: ids are at least [`concurrency::BY_ID`], and the field takes 8 bytes.)
    pub hold: Option<std::num::NonZeroU64>,
}

/// All hits of one request.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub hits: Vec<Hit>,
}

/// The verdict on one hit, after the batch was committed (or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HitOutcome {
    /// This limit alone would admit the hit.
    pub admitted: bool,
    /// What is left after this request (0 when not admitted).
    pub remaining: u64,
    /// Nanoseconds: when admitted, until the full quota is back; when not, until this hit
    /// would be admitted.
    pub reset_nanos: u64,
    /// Answered from a local copy of an earlier denial (the Redis deny cache), without
    /// asking the backend.
    pub from_local_cache: bool,
}

/// The answer of a backend for one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// One per hit, in batch order.
    pub hits: Vec<HitOutcome>,
    /// Whether the request as a whole was admitted (see [`plan`]).
    pub admitted: bool,
}

/// A backend failure. Denials are never errors.
#[derive(Debug, thiserror::Error)]
#[error("{backend} backend error: {message}")]
pub struct LimiterError {
    /// The backend that failed: its [`Limiter::name`] (`redis`, ...).
    pub backend: &'static str,
    /// What went wrong, for clients and logs (for a wrapped error, its text).
    pub message: String,
    /// Retrying later may succeed (connection lost, time-out, ...).
    pub transient: bool,
    /// The error underneath (a Redis client error), when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// A state key with its algorithm (the same bytes under two algorithms are two states): what
/// [`Limiter::reset`] forgets.
pub type StateKey = (Arc<[u8]>, Algorithm);

/// A boxed future, as returned by [`Limiter::check`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A place where limiter state lives. One call per request, carrying all its hits.
///
/// Besides [`Limiter::check`], the app drives a backend through provided methods that do
/// nothing by default: housekeeping ([`Limiter::sweep`], [`Limiter::held`]), readiness
/// ([`Limiter::probe`], [`Limiter::ready`]) and [`Limiter::events`] for metrics. The memory
/// and Redis backends override what applies to them.
pub trait Limiter: Send + Sync + 'static {
    /// Decides a whole batch atomically: either every admitted hit consumes, or (when the request
    /// is denied) only `charge: always` hits do; a `concurrency` hit with `charge: always` that
    /// does not consume keeps its cost as a pending denial instead (docs/holds.md).
    ///
    /// A caller that polls many requests in one pass (a connection's task polling its streams)
    /// should poll them inside [`gathering::gather`]. Under such a poll a backend may return
    /// `Pending` once, having woken itself, so that the requests polled after it can join its
    /// round trip (the Redis backend's group commit does); the caller must then poll it again in
    /// the same pass, after the others. Outside a gathering poll, a backend never waits on
    /// purpose: a lone request goes at once.
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>>;

    /// A short name for logs and metrics.
    fn name(&self) -> &'static str;

    /// One operation on a key's holds with ids (the Throttle API's holds), atomic on the
    /// key's concurrency state. A backend without holds answers an error.
    fn hold<'a>(
        &'a self,
        _request: &'a holds::HoldRequest,
    ) -> BoxFuture<'a, Result<holds::HoldOutcome, LimiterError>> {
        Box::pin(std::future::ready(Err(LimiterError {
            backend: self.name(),
            message: "this backend keeps no holds with ids".to_owned(),
            transient: false,
            source: None,
        })))
    }

    /// One operation on a key's reservations (the Throttle API's Reserve and Commit), atomic
    /// on the key's rate state and its open reservations. A backend without them answers an
    /// error.
    fn reserve<'a>(
        &'a self,
        _request: &'a reserve::ReserveRequest,
    ) -> BoxFuture<'a, Result<reserve::ReserveOutcome, LimiterError>> {
        Box::pin(std::future::ready(Err(LimiterError {
            backend: self.name(),
            message: "this backend keeps no reservations".to_owned(),
            transient: false,
            source: None,
        })))
    }

    /// The verdict [`Limiter::check`] would give `batch` now, computed the same way and
    /// changing nothing: no state is written, no cost charged (admin `/why`). A backend that
    /// cannot do this answers an error.
    fn dry_run<'a>(
        &'a self,
        _batch: &'a Batch,
    ) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(std::future::ready(Err(LimiterError {
            backend: self.name(),
            message: "this backend cannot check without charging".to_owned(),
            transient: false,
            source: None,
        })))
    }

    /// Forgets the state of each key (a state key and its algorithm), as if it had never been
    /// used, for every replica (admin `/counters/reset`); returns how many keys were held.
    fn reset<'a>(&'a self, _keys: &'a [StateKey]) -> BoxFuture<'a, Result<usize, LimiterError>> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// What the backend keeps doing in the background while the process runs (Redis: hearing
    /// other replicas' resets, to forget their keys' cached denials); `None`: nothing. The app
    /// runs it until shutdown.
    fn listen(&self) -> Option<BoxFuture<'_, ()>> {
        None
    }

    /// Drops state that is no longer needed (called periodically); returns how many entries
    /// went.
    fn sweep(&self) -> usize {
        0
    }

    /// Entries held in process (a gauge).
    fn held(&self) -> usize {
        0
    }

    /// Checks that the backend is reachable and records it for [`Limiter::ready`] (called
    /// periodically); `None` when the backend has nothing to probe.
    fn probe(&self) -> Option<BoxFuture<'_, ()>> {
        None
    }

    /// Whether the backend can answer now; `Err` carries a short reason, shown by `/readyz`.
    /// Called on every readiness check, so cheap: a flag kept up to date by the backend (by
    /// requests and [`Limiter::probe`]), never a round trip.
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }

    /// Running totals of backend events (`(event, count)`), exported as metrics.
    fn events(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// The nodes of a remote backend (the server, the master Sentinel named, each master of
    /// a Cluster, and any node whose breaker is open), each with whether its circuit breaker
    /// is open (its requests answered by `on_error` at once); sorted by node. Cheap: no
    /// round trip. By default, none.
    fn nodes(&self) -> Vec<(String, bool)> {
        Vec::new()
    }

    /// One page of the keys held and their state, read as a check-only request would see
    /// them, changing nothing (admin `/counters`). By default, none.
    fn counters<'a>(
        &'a self,
        _query: &'a counters::CounterQuery<'a>,
    ) -> BoxFuture<'a, Result<counters::CounterPage, LimiterError>> {
        Box::pin(std::future::ready(Ok(counters::CounterPage::default())))
    }

    /// Per key (a state key), the nanoseconds left in its penalty box (`block_for`), `None`
    /// when it is not in one; changes nothing (admin `/why`). By default, none is.
    fn blocked<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, LimiterError>> {
        Box::pin(std::future::ready(Ok(vec![None; keys.len()])))
    }

    /// Per key (a state key of a global limit), this region's share of it (admin `/why`); by
    /// default, none.
    fn shares<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<counters::ShareView>>, LimiterError>> {
        Box::pin(std::future::ready(Ok(vec![None; keys.len()])))
    }

    /// What the backend says of its health, for people (the admin page). By default, nothing.
    fn status(&self) -> counters::BackendStatus {
        counters::BackendStatus::default()
    }
}

impl LimitParams {
    /// The parameters of a configured limit.
    pub fn from_rule(rule: &crate::config::model::LimitRule) -> LimitParams {
        LimitParams {
            algorithm: rule.algorithm,
            quota: rule.requests_per_unit,
            period_nanos: rule.period_nanos(),
            burst: rule.burst,
            charge: rule.charge,
            borrow: rule.borrow,
            block_nanos: rule.block_nanos,
            global: rule.global,
            calendar: rule.calendar(),
        }
    }

    /// Whether a denied request takes this limit's cost as it would an admitted one's:
    /// `charge: always`, except on `concurrency` (see [`Self::keeps_denials`]).
    #[inline]
    pub(crate) fn takes_when_denied(&self) -> bool {
        self.charge == Charge::Always && self.algorithm != Algorithm::Concurrency
    }

    /// Whether a denied request keeps its cost as a pending denial: `concurrency` with
    /// `charge: always` (its default: Envoy releases denied requests too, docs/holds.md).
    #[inline]
    pub(crate) fn keeps_denials(&self) -> bool {
        self.charge == Charge::Always && self.algorithm == Algorithm::Concurrency
    }

    /// The funnel of these parameters.
    pub fn funnel(&self) -> funnel::Funnel {
        funnel::Funnel::new(self.quota, self.period_nanos, self.burst, self.borrow)
    }
}

/// A funnel hit for unit tests: `quota` per `period_nanos` with a burst of `quota`, cost 1,
/// not a refund.
#[cfg(test)]
pub(crate) fn funnel_hit(
    key: &str,
    group: usize,
    role: Role,
    charge: Charge,
    quota: u32,
    period_nanos: u64,
) -> Hit {
    Hit {
        key: key.as_bytes().into(),
        limit: LimitParams {
            algorithm: Algorithm::Funnel,
            quota,
            period_nanos,
            burst: quota,
            charge,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        },
        cost: 1,
        refund: false,
        group,
        role,
        hold: None,
    }
}
