//! The in-process backend: a sharded map of limiter states, bounded in size.
//!
//! # State
//!
//! One [`State`] per key (the algorithm's own state, see [`super::algorithm`]), with the time
//! at which it becomes fresh. A key whose state is fresh (a funnel or bucket that has drained, a
//! window that has passed) holds no information, so it is never stored: a commit that leaves a
//! key fresh removes it, and check-only hits (cost 0), zero-quota limits and denied requests
//! never create an entry. docs/algorithms.md gives the bytes held per key for each algorithm.
//!
//! # Concurrency
//!
//! Keys are spread over a fixed number of shards (a power of two, at most 64), each a
//! `parking_lot::Mutex` around a `HashMap`. A batch locks every shard it touches, each once and in
//! ascending shard order (so two batches never deadlock), reads the clock once while holding them,
//! decides, writes back and unlocks. [`Limiter::check`] does all of this synchronously and returns
//! a ready future: no lock is ever held across an `.await`, and there is no global lock.
//!
//! # Bound and eviction
//!
//! At most `max_keys` entries are held (`0` counts as `1`). The bound is split evenly across the
//! shards, at least 16 keys per shard when `max_keys` allows it (so a small limiter has fewer
//! shards, down to one). When a new key must be stored in a full shard:
//!
//! 1. every fresh entry of that shard is dropped (this loses nothing);
//! 2. if the shard is still full, the entry that becomes fresh soonest is evicted: the one
//!    closest to fresh, so the least information is lost. Its key starts over as fresh, which can admit
//!    more than the limit would have; size `max_keys` so that this is rare, and watch `len`.
//!
//! Fresh entries that nothing touches again stay until [`MemoryLimiter::sweep`] (called
//! periodically by the app) or an eviction removes them.

mod decide;
mod shards;

use std::sync::Arc;

use super::algorithm::State;
use super::{Batch, BatchOutcome, BoxFuture, Clock, Limiter, LimiterError, MonotonicClock};
use decide::{Slots, Write};
use shards::{Locked, Shards, Stored};

/// Limiter state in this process's memory.
///
/// ```
/// use futures_util::FutureExt;
/// use sluice::config::model::{Algorithm, Charge};
/// use sluice::limiter::{Batch, Hit, LimitParams, Limiter, ManualClock, MemoryLimiter, Role};
///
/// let clock = ManualClock::at(1_000_000_000);
/// let limiter = MemoryLimiter::with_clock(10_000, clock.clone());
/// let limit = LimitParams {
///     algorithm: Algorithm::Funnel,
///     quota: 2,
///     period_nanos: 1_000_000_000,
///     burst: 2,
///     charge: Charge::Admitted,
///     borrow: false,
/// };
/// let hit = Hit {
///     key: b"api|alice".as_slice().into(),
///     limit,
///     cost: 1,
///     refund: false,
///     group: 0,
///     role: Role::Enforced,
/// };
/// let batch = Batch { hits: vec![hit] };
/// let mut check = || limiter.check(&batch).now_or_never().unwrap().unwrap();
/// assert!(check().admitted);
/// assert!(check().admitted);
/// let denied = check();
/// assert!(!denied.admitted);
/// assert_eq!(denied.hits[0].reset_nanos, 500_000_000);
/// clock.advance(500_000_000);
/// assert!(check().admitted);
/// assert_eq!(limiter.len(), 1);
/// ```
pub struct MemoryLimiter<C: Clock = MonotonicClock> {
    clock: C,
    shards: Shards,
}

impl MemoryLimiter<MonotonicClock> {
    /// A limiter holding at most `max_keys` states, on the monotonic clock.
    pub fn new(max_keys: usize) -> Self {
        Self::with_clock(max_keys, MonotonicClock::new())
    }
}

impl<C: Clock> MemoryLimiter<C> {
    /// A limiter holding at most `max_keys` states, reading time from `clock`.
    pub fn with_clock(max_keys: usize, clock: C) -> Self {
        MemoryLimiter {
            clock,
            shards: Shards::new(max_keys),
        }
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every held key with its state, sorted by key (for tests: a denied request must leave
    /// this unchanged).
    #[cfg(any(test, feature = "test-util"))]
    pub fn snapshot(&self) -> Vec<(Vec<u8>, State)> {
        self.shards.snapshot()
    }

    /// Drops every fresh entry; returns how many were dropped.
    pub fn sweep(&self) -> usize {
        self.shards.sweep(&self.clock)
    }

    /// Decides a batch: lock its shards, take its states out, decide, put them back.
    fn decide(&self, batch: &Batch) -> BatchOutcome {
        let slots = Slots::new(&batch.hits);
        let shard_of: Vec<usize> = slots.keys.iter().map(|k| self.shards.index(k)).collect();
        let mut locked = self.shards.lock(&shard_of);
        let now = self.clock.now_nanos();
        let taken: Vec<Option<Stored>> = slots
            .keys
            .iter()
            .zip(&shard_of)
            .map(|(key, &shard)| locked.take(shard, key))
            .collect();
        let kept_until: Vec<Option<u64>> = taken
            .iter()
            .map(|t| t.as_ref().map(|s| s.fresh_at))
            .collect();
        let mut states: Vec<State> = taken
            .into_iter()
            .map(|t| t.map_or(State::Fresh, |s| s.state))
            .collect();
        let decided = decide::decide(&batch.hits, &slots.of_hit, &mut states, now);
        let places: Vec<(&Arc<[u8]>, usize)> = slots.keys.iter().copied().zip(shard_of).collect();
        put_back(
            &mut locked,
            &places,
            states,
            &decided.writes,
            &kept_until,
            now,
        );
        decided.outcome
    }
}

/// Puts a batch's states back at their `places` (key, shard) as `writes` say; `held` is when
/// each taken state was to become fresh (`None`: the key was not held). Keys that were held go
/// back first, so that only new keys can cause an eviction.
fn put_back(
    locked: &mut Locked<'_>,
    places: &[(&Arc<[u8]>, usize)],
    states: Vec<State>,
    writes: &[Write],
    held: &[Option<u64>],
    now: u64,
) {
    let mut puts: Vec<(usize, Stored, bool)> = Vec::with_capacity(states.len());
    for (slot, (state, write)) in states.into_iter().zip(writes).enumerate() {
        let held = held.get(slot).copied().flatten();
        let fresh_at = match *write {
            Write::Keep => held,
            Write::Store(at) => Some(at),
            Write::Remove => None,
        };
        if let Some(fresh_at) = fresh_at {
            puts.push((slot, Stored { fresh_at, state }, held.is_some()));
        }
    }
    puts.sort_by_key(|p| !p.2);
    for (slot, stored, _) in puts {
        if let Some(&(key, shard)) = places.get(slot) {
            locked.store(shard, key, stored, now);
        }
    }
}

impl<C: Clock> Limiter for MemoryLimiter<C> {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        let outcome = self.decide(batch);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

impl<C: Clock> std::fmt::Debug for MemoryLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLimiter")
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}
