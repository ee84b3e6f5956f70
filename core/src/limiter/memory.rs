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
//! # Layout
//!
//! Each shard keeps its keys' bytes end to end in one buffer (`keys.rs`) and one hash table
//! per kind of state (`store.rs`), whose entries name their key by its place in that buffer:
//! a funnel's entry is 16 bytes (the key's place and the `tat`, which is also when it becomes
//! fresh); the other kinds store when they become fresh beside their state, and a sliding log
//! stays boxed. A state is found by its key in its algorithm's table only (state keys name
//! their algorithm; the same bytes under two algorithms would be two states). Keys are
//! compared byte for byte: two keys never share a state. A key is hashed
//! once per batch, the hash choosing both its shard and its slot in the shard's table; the
//! batch reads each state in place, decides on copies, and writes the result back to the same
//! slot. Only a key that becomes fresh is removed, and only a new key is inserted.
//!
//! # Concurrency
//!
//! Keys are spread over a fixed number of shards (a power of two, at most 64), each a
//! `parking_lot::Mutex` around its store. A batch locks every shard it touches, each once and in
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
//! 2. if fewer than 1/32 of the shard's capacity (at least 1) are then free, the entries that
//!    become fresh soonest are evicted until that many are free: the ones closest to fresh, so
//!    the least information is lost. An evicted key starts over as fresh, which can admit more
//!    than the limit would have; size `max_keys` so that this is rare, and watch `len`.
//!
//! Both steps scan the shard, so evicting a slice at once makes a flood of new keys into a full
//! shard pay one scan per 1/32 of its capacity in new keys rather than one per key.
//!
//! Fresh entries that nothing touches again stay until [`MemoryLimiter::sweep`] (called
//! periodically by the app) or an eviction removes them. The bytes of removed keys are
//! reclaimed once they outweigh the held keys' in their shard (the buffer is rewritten, so each
//! removed byte costs one copy on average). A shard holds at most 4 GiB of key bytes; a new
//! key that does not fit is not stored, as if evicted at once.
//!
//! # Snapshots
//!
//! [`MemoryLimiter::encode_snapshot`] and [`MemoryLimiter::restore_snapshot`] turn every state
//! and open reservation into one versioned, checksummed buffer and back (`snapshot.rs`), for
//! `limiter.persist`; the file and its timer are the app's.

mod decide;
mod keys;
mod reserve;
mod shards;
mod snapshot;
mod store;
mod walk;

pub use snapshot::{Restored, SNAPSHOT_VERSION, SnapshotError};

use super::algorithm::State;
use super::counters::{BackendStatus, CounterPage, CounterQuery};
use super::{Batch, BatchOutcome, BoxFuture, Clock, Hit, Limiter, LimiterError, MonotonicClock};
use decide::{Scratch, Slots, Write};
use shards::{Locked, Shards};
use smallvec::SmallVec;
use store::{Found, Kind};

/// Limiter state in this process's memory.
///
/// ```
/// use futures_util::FutureExt;
/// use sluice_core::config::model::{Algorithm, Charge};
/// use sluice_core::limiter::{Batch, Hit, LimitParams, Limiter, ManualClock, MemoryLimiter, Role};
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
///     block_nanos: 0,
///     global: false,
///     calendar: None,
/// };
/// let hit = Hit {
///     key: b"api|alice".as_slice().into(),
///     limit,
///     cost: 1,
///     refund: false,
///     group: 0,
///     role: Role::Enforced,
///     hold: None,
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
    /// Open reservations (the Throttle API's), beside the shards.
    reservations: reserve::Table,
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
            reservations: reserve::Table::new(max_keys),
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
        self.shards.sweep(&self.clock) + self.reservations.sweep(self.clock.now_nanos())
    }

    /// Decides a batch: lock its shards, read its states, decide, write back in place.
    fn decide(&self, batch: &Batch) -> BatchOutcome {
        // Scratch space is filled in place: moving a `SmallVec` copies its inline buffer.
        let slots = Slots::new(&batch.hits);
        let mut places: Scratch<Place> = Scratch::new();
        places.extend(slots.first.iter().map(|hit| Place::new(&self.shards, hit)));
        let mut locked = self.shards.lock(places.iter().map(|p| p.shard));
        let now = self.clock.now_nanos();
        let mut states: Scratch<State> = Scratch::new();
        let read = places.iter_mut().zip(&slots.first);
        states.extend(read.map(|(place, hit)| place.read(&mut locked, &hit.key)));
        let mut boxes: Scratch<Place> = Scratch::new();
        let mut blocks: Scratch<u64> = Scratch::new();
        read_boxes(
            &mut locked,
            batch,
            &places,
            &slots.first,
            &mut boxes,
            &mut blocks,
        );
        let mut before: Scratch<u64> = Scratch::new();
        before.extend_from_slice(&blocks);
        let mut writes = Scratch::new();
        let outcome = decide::decide(
            &batch.hits,
            &slots.of_hit,
            &mut states,
            &mut blocks,
            now,
            &mut writes,
        );
        write_back(
            &mut locked,
            &places,
            &slots.first,
            &mut states,
            &writes,
            now,
        );
        if !boxes.is_empty() {
            write_blocks(&mut locked, &boxes, &slots.first, &before, &blocks, now);
        }
        outcome
    }

    /// Decides a batch as [`MemoryLimiter::decide`] would, then puts every state back as it
    /// was read: the verdict, with nothing changed (admin `/why`).
    fn dry_run(&self, batch: &Batch) -> BatchOutcome {
        let slots = Slots::new(&batch.hits);
        let mut places: Scratch<Place> = Scratch::new();
        places.extend(slots.first.iter().map(|hit| Place::new(&self.shards, hit)));
        let mut locked = self.shards.lock(places.iter().map(|p| p.shard));
        let now = self.clock.now_nanos();
        let mut states: Scratch<State> = Scratch::new();
        let read = places.iter_mut().zip(&slots.first);
        states.extend(read.map(|(place, hit)| place.read(&mut locked, &hit.key)));
        let originals = states.clone();
        // Penalty boxes are read as `decide` reads them, and never written back.
        let mut boxes: Scratch<Place> = Scratch::new();
        let mut blocks: Scratch<u64> = Scratch::new();
        read_boxes(
            &mut locked,
            batch,
            &places,
            &slots.first,
            &mut boxes,
            &mut blocks,
        );
        let mut writes = Scratch::new();
        let outcome = decide::decide(
            &batch.hits,
            &slots.of_hit,
            &mut states,
            &mut blocks,
            now,
            &mut writes,
        );
        for (place, state) in places.iter().zip(originals) {
            if let (Some(found), Some(store)) = (place.found, locked.store(place.shard)) {
                store.put(found, place.fresh_at, state);
            }
        }
        outcome
    }

    /// Forgets the states of `keys` (each with its algorithm); returns how many were held.
    fn reset_keys(&self, keys: &[super::StateKey]) -> usize {
        let mut forgotten = 0;
        for (key, algorithm) in keys {
            let (hash, shard) = self.shards.place(key);
            let mut locked = self.shards.lock(std::iter::once(shard));
            if let Some(store) = locked.store(shard) {
                if let Some(found) = store.find(hash, key, Kind::of(*algorithm)) {
                    store.remove(found);
                    forgotten += 1;
                }
                // Its penalty box (`block_for`) ends with it.
                if let Some(found) = store.find(hash, key, Kind::Block) {
                    store.remove(found);
                }
            }
            locked.tidy();
        }
        forgotten
    }
}

/// The penalty boxes of a batch's slots, only for a batch with a `block_for` limit: each
/// slot's box (`boxes`), read from the same shard (same key bytes) under the same locks, and
/// when it ends (`blocks`; 0: never blocked).
fn read_boxes(
    locked: &mut Locked<'_>,
    batch: &Batch,
    places: &[Place],
    first: &[&Hit],
    boxes: &mut Scratch<Place>,
    blocks: &mut Scratch<u64>,
) {
    if !batch.hits.iter().any(|h| h.limit.block_nanos > 0) {
        return;
    }
    boxes.extend(places.iter().map(Place::penalty_box));
    blocks.extend(boxes.iter_mut().zip(first).map(
        |(place, hit)| match place.read(locked, &hit.key) {
            State::Blocked(until) => until,
            _ => 0,
        },
    ));
}

/// Writes the penalty boxes a batch started (the others are left as read: an ended one is
/// dropped by the sweep, like any fresh state).
fn write_blocks(
    locked: &mut Locked<'_>,
    boxes: &[Place],
    first: &[&Hit],
    before: &[u64],
    after: &[u64],
    now: u64,
) {
    for (((place, hit), &was), &until) in boxes.iter().zip(first).zip(before).zip(after) {
        let Some(store) = locked.store(place.shard) else {
            continue;
        };
        match place.found {
            _ if until == was => {}
            Some(found) => store.put(found, until, State::Blocked(until)),
            None => store.insert(
                Kind::Block,
                place.hash,
                &hit.key,
                until,
                State::Blocked(until),
                now,
            ),
        }
    }
}

impl<C: Clock> MemoryLimiter<C> {
    /// One operation on a key's holds with ids, under the key's shard lock.
    fn hold_op(&self, request: &super::holds::HoldRequest) -> super::holds::HoldOutcome {
        use super::concurrency::Concurrency;
        use super::holds::{HoldOp, HoldOutcome};
        let c = Concurrency::new(request.slots, request.lease_nanos);
        let key = &request.key;
        let (hash, shard) = self.shards.place(key);
        let mut locked = self.shards.lock(std::iter::once(shard));
        let now = self.clock.now_nanos();
        let Some(store) = locked.store(shard) else {
            return HoldOutcome {
                done: false,
                id: 0,
                held: 0,
                wait_nanos: request.lease_nanos,
            };
        };
        let found = store.find(hash, key, Kind::Concurrency);
        let mut holds = match found.and_then(|f| store.take(f)) {
            Some((_, State::Concurrency(holds))) => holds,
            _ => Box::default(),
        };
        let (done, id) = match request.op {
            HoldOp::Acquire { count } => match c.acquire(&mut holds, now, count) {
                Some(id) => (true, id),
                None => (false, 0),
            },
            HoldOp::Release { id } => (c.release_id(&mut holds, now, id), id),
            HoldOp::Extend { id } => (c.extend_id(&mut holds, now, id), id),
        };
        let wait_nanos = match request.op {
            HoldOp::Acquire { count } if !done => c.until_admitted(&holds, now, count),
            _ => 0,
        };
        let held = c.held(&holds, now);
        let until = c.until_fresh(&holds, now);
        match (found, until > 0) {
            (Some(f), true) => store.put(f, now.saturating_add(until), State::Concurrency(holds)),
            (Some(f), false) => store.remove(f),
            (None, true) => store.insert(
                Kind::Concurrency,
                hash,
                key,
                now.saturating_add(until),
                State::Concurrency(holds),
                now,
            ),
            (None, false) => {}
        }
        locked.tidy();
        HoldOutcome {
            done,
            id,
            held,
            wait_nanos,
        }
    }
}

/// One distinct key of a batch: its hash and shard, and once read, where it was held.
#[derive(Clone, Copy)]
struct Place {
    hash: u64,
    shard: usize,
    /// The table of the key's algorithm (a batch's slot is a key and an algorithm).
    kind: Kind,
    found: Option<Found>,
    /// When the state read becomes fresh.
    fresh_at: u64,
}

impl Place {
    fn new(shards: &Shards, hit: &Hit) -> Place {
        let (hash, shard) = shards.place(&hit.key);
        Place {
            hash,
            shard,
            kind: Kind::of(hit.limit.algorithm),
            found: None,
            fresh_at: 0,
        }
    }

    /// The place of the same key's penalty box.
    fn penalty_box(&self) -> Place {
        Place {
            kind: Kind::Block,
            found: None,
            fresh_at: 0,
            ..*self
        }
    }

    /// The key's state (fresh when not held), remembering where it was found.
    fn read(&mut self, locked: &mut Locked<'_>, key: &[u8]) -> State {
        let Some(store) = locked.store(self.shard) else {
            return State::Fresh;
        };
        self.found = store.find(self.hash, key, self.kind);
        match self.found.and_then(|found| store.take(found)) {
            Some((fresh_at, state)) => {
                self.fresh_at = fresh_at;
                state
            }
            None => State::Fresh,
        }
    }
}

/// Writes a batch's states back as `writes` say. Held keys are written in place first (a
/// table does not move its entries until one is inserted), and only then are new keys
/// inserted: only new keys can cause an eviction.
fn write_back(
    locked: &mut Locked<'_>,
    places: &[Place],
    first: &[&Hit],
    states: &mut [State],
    writes: &[Write],
    now: u64,
) {
    let mut inserts: SmallVec<[(usize, u64, State); 4]> = SmallVec::new();
    for (slot, ((place, state), &write)) in places.iter().zip(states).zip(writes).enumerate() {
        let state = std::mem::take(state);
        let Some(store) = locked.store(place.shard) else {
            continue;
        };
        match (place.found, write) {
            // Puts back what was read (a log was moved out), unchanged.
            (Some(found), Write::Keep) => store.put(found, place.fresh_at, state),
            (Some(found), Write::Store(at)) => store.put(found, at, state),
            (Some(found), Write::Remove) => store.remove(found),
            (None, Write::Store(at)) => inserts.push((slot, at, state)),
            (None, Write::Keep | Write::Remove) => {}
        }
    }
    for (slot, at, state) in inserts {
        if let (Some(place), Some(hit)) = (places.get(slot), first.get(slot))
            && let Some(store) = locked.store(place.shard)
        {
            store.insert(place.kind, place.hash, &hit.key, at, state, now);
        }
    }
    locked.tidy();
}

impl<C: Clock> Limiter for MemoryLimiter<C> {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        let outcome = self.decide(batch);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn hold<'a>(
        &'a self,
        request: &'a super::holds::HoldRequest,
    ) -> BoxFuture<'a, Result<super::holds::HoldOutcome, LimiterError>> {
        Box::pin(std::future::ready(Ok(self.hold_op(request))))
    }

    fn reserve<'a>(
        &'a self,
        request: &'a super::reserve::ReserveRequest,
    ) -> BoxFuture<'a, Result<super::reserve::ReserveOutcome, LimiterError>> {
        Box::pin(std::future::ready(self.reserve_op(request)))
    }

    fn dry_run<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(std::future::ready(Ok(MemoryLimiter::dry_run(self, batch))))
    }

    fn reset<'a>(
        &'a self,
        keys: &'a [super::StateKey],
    ) -> BoxFuture<'a, Result<usize, LimiterError>> {
        Box::pin(std::future::ready(Ok(self.reset_keys(keys))))
    }

    fn sweep(&self) -> usize {
        MemoryLimiter::sweep(self)
    }

    fn held(&self) -> usize {
        self.len()
    }

    fn counters<'a>(
        &'a self,
        query: &'a CounterQuery<'a>,
    ) -> BoxFuture<'a, Result<CounterPage, LimiterError>> {
        let page = walk::page(&self.shards, query, || self.clock.now_nanos());
        Box::pin(std::future::ready(page))
    }

    fn blocked<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, LimiterError>> {
        let now = self.clock.now_nanos();
        let left = keys
            .iter()
            .map(|key| {
                let (hash, shard) = self.shards.place(key);
                let mut locked = self.shards.lock(std::iter::once(shard));
                let store = locked.store(shard)?;
                let found = store.find(hash, key, Kind::Block)?;
                let (fresh_at, state) = store.take(found)?;
                let until = match state {
                    State::Blocked(until) => until,
                    _ => 0,
                };
                store.put(found, fresh_at, state);
                (until > now).then(|| until - now)
            })
            .collect();
        Box::pin(std::future::ready(Ok(left)))
    }

    fn status(&self) -> BackendStatus {
        BackendStatus {
            keys_held: Some(self.len()),
            ..BackendStatus::default()
        }
    }
}

impl<C: Clock> std::fmt::Debug for MemoryLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLimiter")
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::config::model::{Algorithm, Charge};
    use crate::limiter::{LimitParams, ManualClock, Role};

    const SEC: u64 = 1_000_000_000;

    fn batch(key: &str, algorithm: Algorithm) -> Batch {
        let limit = LimitParams {
            algorithm,
            quota: 10,
            period_nanos: 60 * SEC,
            burst: 10,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        };
        let hit = Hit {
            key: key.as_bytes().into(),
            limit,
            cost: 1,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        };
        Batch { hits: vec![hit] }
    }

    #[test]
    fn a_dry_run_decides_as_a_check_would_and_changes_nothing() {
        let limiter = MemoryLimiter::with_clock(100, ManualClock::at(SEC));
        for algorithm in Algorithm::ALL {
            let mut b = batch("k", algorithm);
            b.hits[0].limit.charge = Charge::Always;
            b.hits[0].cost = 4;
            for _ in 0..3 {
                let before = limiter.snapshot();
                let dry = Limiter::dry_run(&limiter, &b)
                    .now_or_never()
                    .and_then(Result::ok);
                assert_eq!(limiter.snapshot(), before, "{}", algorithm.as_str());
                let real = limiter.check(&b).now_or_never().and_then(Result::ok);
                assert_eq!(dry, real, "{}", algorithm.as_str());
            }
        }
    }

    #[test]
    fn a_reset_forgets_exactly_its_keys() {
        let limiter = MemoryLimiter::with_clock(100, ManualClock::at(SEC));
        let check = |b: &Batch| limiter.check(b).now_or_never().and_then(Result::ok);
        for key in ["a", "b"] {
            check(&batch(key, Algorithm::Funnel));
        }
        check(&batch("a", Algorithm::FixedWindow));
        let forget = [(std::sync::Arc::from(&b"a"[..]), Algorithm::Funnel)];
        let held = limiter.reset(&forget).now_or_never().and_then(Result::ok);
        assert_eq!(held, Some(1));
        assert_eq!(limiter.len(), 2);
        let again = limiter.reset(&forget).now_or_never().and_then(Result::ok);
        assert_eq!(again, Some(0));
        let fresh = check(&batch("a", Algorithm::Funnel)).map(|o| o.hits[0].remaining);
        assert_eq!(fresh, Some(9));
    }

    #[test]
    fn the_same_key_bytes_under_two_algorithms_are_two_states() {
        let limiter = MemoryLimiter::with_clock(100, ManualClock::at(SEC));
        let check = |b: &Batch| limiter.check(b).now_or_never().and_then(Result::ok);
        for round in 0..2 {
            for algorithm in Algorithm::ALL {
                let outcome = check(&batch("k", algorithm)).map(|o| o.hits[0].remaining);
                // Each algorithm sees only its own state: 10 less what it took so far.
                assert_eq!(outcome, Some(9 - round), "{}", algorithm.as_str());
            }
            assert_eq!(limiter.len(), Algorithm::ALL.len());
        }
        // In one batch, too: each hit on its own state.
        let mut both = batch("k", Algorithm::Funnel);
        both.hits.extend(batch("k", Algorithm::FixedWindow).hits);
        let outcome = check(&both).map(|o| [o.hits[0].remaining, o.hits[1].remaining]);
        assert_eq!(outcome, Some([7, 7]));
        assert_eq!(limiter.len(), Algorithm::ALL.len());
    }
}

/// The penalty box and calendar windows on the memory backend, on a manual clock.
#[cfg(test)]
mod penalty_and_calendar {
    use futures_util::FutureExt;

    use super::*;
    use crate::config::calendar::{Calendar, CalendarUnit, Zone};
    use crate::config::model::{Algorithm, Charge};
    use crate::limiter::{LimitParams, ManualClock, Role};

    const SEC: u64 = 1_000_000_000;

    fn hit(limit: LimitParams, cost: u64) -> Batch {
        let hit = Hit {
            key: b"k".as_slice().into(),
            limit,
            cost,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        };
        Batch { hits: vec![hit] }
    }

    fn limit(algorithm: Algorithm, quota: u32, period: u64) -> LimitParams {
        LimitParams {
            algorithm,
            quota,
            period_nanos: period,
            burst: quota,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        }
    }

    fn check(l: &MemoryLimiter<ManualClock>, b: &Batch) -> (bool, u64) {
        let o = l
            .check(b)
            .now_or_never()
            .and_then(Result::ok)
            .expect("decided");
        (o.admitted, o.hits[0].reset_nanos)
    }

    #[test]
    fn a_denied_key_stays_denied_for_block_for_and_no_longer() {
        let clock = ManualClock::at(1_000 * SEC);
        let limiter = MemoryLimiter::with_clock(100, clock.clone());
        let blocked = LimitParams {
            block_nanos: 10 * SEC,
            global: false,
            ..limit(Algorithm::Funnel, 1, SEC)
        };
        let b = hit(blocked, 1);
        assert!(check(&limiter, &b).0);
        // The denial starts a 10 s block: the wait reported is the block's.
        assert_eq!(check(&limiter, &b), (false, 10 * SEC));
        // The funnel drains after 1 s, but the key stays denied, and knocking does not extend
        // the block nor charge the funnel.
        for _ in 0..9 {
            clock.advance(SEC);
            let (ok, wait) = check(&limiter, &b);
            assert!(!ok);
            assert_eq!(wait, 1_010 * SEC - clock.now_nanos());
        }
        assert!(
            !check(&limiter, &hit(blocked, 0)).0,
            "a check-only request too"
        );
        clock.advance(SEC);
        assert!(check(&limiter, &b).0, "the block is over");
        assert_eq!(
            check(&limiter, &b),
            (false, 10 * SEC),
            "a new denial, a new block"
        );
    }

    #[test]
    fn the_penalty_box_is_shown_on_counters() {
        use crate::limiter::counters::{CounterQuery, Resolved};
        let clock = ManualClock::at(1_000 * SEC);
        let limiter = MemoryLimiter::with_clock(100, clock.clone());
        let blocked = LimitParams {
            block_nanos: 60 * SEC,
            global: false,
            ..limit(Algorithm::Funnel, 1, SEC)
        };
        let b = hit(blocked, 1);
        check(&limiter, &b);
        check(&limiter, &b);
        // Past the funnel's drain, only the box is left.
        clock.advance(5 * SEC);
        let resolve = move |_: &[u8]| Resolved::Limit(blocked);
        let query = CounterQuery {
            prefix: b"",
            cursor: None,
            count: 10,
            resolve: &resolve,
        };
        let page = limiter.counters(&query).now_or_never().and_then(Result::ok);
        let entries = page.map(|p| p.entries).unwrap_or_default();
        assert_eq!(entries.len(), 1, "{entries:?}");
        let state = entries[0].state.expect("a state");
        assert_eq!(state.blocked_nanos, Some(55 * SEC));
        assert!(!state.admitted);
        assert_eq!(state.reset_nanos, 55 * SEC);
        clock.advance(55 * SEC);
        let page = limiter.counters(&query).now_or_never().and_then(Result::ok);
        assert!(page.map(|p| p.entries).unwrap_or_default().is_empty());
        assert_eq!(limiter.sweep(), 2, "the drained funnel and the ended box");
    }

    #[test]
    fn calendar_windows_change_at_local_midnight_across_dst() {
        // 2026-10-24 12:00 UTC; Berlin's next midnight is 22:00 UTC (summer time), the one
        // after at 23:00 UTC on the 25th (a 25-hour day).
        let noon = 1_792_843_200 * SEC;
        let clock = ManualClock::at(noon);
        let limiter = MemoryLimiter::with_clock(100, clock.clone());
        let berlin = Zone::named("Europe/Berlin").expect("a zone");
        let day = LimitParams {
            calendar: Some(Calendar::new(berlin, CalendarUnit::Day)),
            ..limit(Algorithm::FixedWindow, 2, 86_400 * SEC)
        };
        let b = hit(day, 1);
        assert_eq!(check(&limiter, &b), (true, 10 * 3_600 * SEC));
        assert!(check(&limiter, &b).0);
        assert_eq!(check(&limiter, &b), (false, 10 * 3_600 * SEC));
        clock.set(noon + 10 * 3_600 * SEC - 1);
        assert_eq!(check(&limiter, &b), (false, 1));
        clock.set(noon + 10 * 3_600 * SEC);
        assert_eq!(check(&limiter, &b), (true, 25 * 3_600 * SEC));
    }
}
