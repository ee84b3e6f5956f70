//! One shard's states: the keys' bytes in one [`Arena`], and one hash table per kind of state
//! whose entries name their key by [`Span`]. An entry holds only what its kind needs: a
//! funnel's is its span and [`Tat`] (24 bytes; its `tat` is when it becomes fresh), the others
//! add the time they become fresh to their state. A state is found by its key in the table of
//! its algorithm only: state keys name their algorithm, so one key never has states of two
//! kinds (and were the same bytes used by two algorithms, they would simply be two states).
//!
//! The tables hash a key with the shards' router (`Shards::place`), so a key is hashed once
//! per batch: the same hash picks its shard and finds it in its table.

use ahash::RandomState;
use hashbrown::HashTable;

use super::keys::{Arena, Span};
use crate::config::model::Algorithm;
use crate::limiter::algorithm::State;
use crate::limiter::concurrency::Holds;
use crate::limiter::fixed_window::Window;
use crate::limiter::funnel::Tat;
use crate::limiter::sliding_log::Log;
use crate::limiter::sliding_window::Counters;
use crate::limiter::token_bucket::Bucket;

/// How many entries a full store evicts at once when none is fresh: 1/32 of its capacity
/// (at least 1), the ones closest to fresh.
pub(super) fn eviction_slice(capacity: usize) -> usize {
    (capacity / 32).max(1)
}

/// Dead key bytes below this are never worth rewriting the arena for.
const COMPACT_AT_LEAST: usize = 4096;

/// A kind of state, naming the table that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Funnel,
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    Concurrency,
    /// A key's penalty box (`block_for`): until when it is blocked, under the key of the
    /// state it belongs to.
    Block,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Funnel,
        Kind::TokenBucket,
        Kind::FixedWindow,
        Kind::SlidingWindow,
        Kind::SlidingLog,
        Kind::Concurrency,
        Kind::Block,
    ];

    /// The kind of state an algorithm keeps.
    pub(super) fn of(algorithm: Algorithm) -> Kind {
        match algorithm {
            Algorithm::Funnel => Kind::Funnel,
            Algorithm::TokenBucket => Kind::TokenBucket,
            Algorithm::FixedWindow => Kind::FixedWindow,
            Algorithm::SlidingWindow => Kind::SlidingWindow,
            Algorithm::SlidingLog => Kind::SlidingLog,
            Algorithm::Concurrency => Kind::Concurrency,
        }
    }
}

/// Where a held key is: its table and its bucket there. Valid until that table grows (only
/// inserting a key can make it grow; removing one moves nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Found {
    kind: Kind,
    index: usize,
}

/// What an entry keeps beside its key: a state of one kind, and when it becomes fresh.
trait Value: Sized {
    fn fresh_at(&self) -> u64;
    /// A copy of the state.
    fn peek(&self) -> State;
    /// The state, moved out when it owns memory (a log); `restore` puts it back.
    fn take(&mut self) -> State;
    /// The value for a state of this kind; `None` for a state of another kind.
    fn new(fresh_at: u64, state: State) -> Option<Self>;
}

/// A funnel's `tat` is the time it becomes fresh: nothing else is stored.
impl Value for Tat {
    fn fresh_at(&self) -> u64 {
        self.tat
    }

    fn peek(&self) -> State {
        State::Funnel(*self)
    }

    fn take(&mut self) -> State {
        self.peek()
    }

    fn new(_fresh_at: u64, state: State) -> Option<Tat> {
        match state {
            State::Funnel(s) => Some(s),
            _ => None,
        }
    }
}

/// A penalty box: the time it ends is the time it becomes fresh.
struct Until(u64);

impl Value for Until {
    fn fresh_at(&self) -> u64 {
        self.0
    }

    fn peek(&self) -> State {
        State::Blocked(self.0)
    }

    fn take(&mut self) -> State {
        self.peek()
    }

    fn new(_fresh_at: u64, state: State) -> Option<Until> {
        match state {
            State::Blocked(until) => Some(Until(until)),
            _ => None,
        }
    }
}

/// A state stored with the time it becomes fresh.
struct Timed<S> {
    fresh_at: u64,
    state: S,
}

/// A state that is stored as it is, converted from and to [`State`].
trait Plain: Sized + Copy {
    fn wrap(self) -> State;
    fn unwrap(state: State) -> Option<Self>;
}

macro_rules! plain {
    ($type:ty, $variant:ident) => {
        impl Plain for $type {
            fn wrap(self) -> State {
                State::$variant(self)
            }

            fn unwrap(state: State) -> Option<Self> {
                match state {
                    State::$variant(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}

plain!(Bucket, TokenBucket);
plain!(Window, FixedWindow);
plain!(Counters, SlidingWindow);

impl<S: Plain> Value for Timed<S> {
    fn fresh_at(&self) -> u64 {
        self.fresh_at
    }

    fn peek(&self) -> State {
        self.state.wrap()
    }

    fn take(&mut self) -> State {
        self.peek()
    }

    fn new(fresh_at: u64, state: State) -> Option<Self> {
        S::unwrap(state).map(|state| Timed { fresh_at, state })
    }
}

/// A log owns its entries: a batch moves it out (`None` meanwhile) and back, never copies it.
impl Value for Timed<Option<Box<Log>>> {
    fn fresh_at(&self) -> u64 {
        self.fresh_at
    }

    fn peek(&self) -> State {
        State::SlidingLog(self.state.clone().unwrap_or_default())
    }

    fn take(&mut self) -> State {
        State::SlidingLog(self.state.take().unwrap_or_default())
    }

    fn new(fresh_at: u64, state: State) -> Option<Self> {
        match state {
            State::SlidingLog(log) => Some(Timed {
                fresh_at,
                state: Some(log),
            }),
            _ => None,
        }
    }
}

/// Holds own their records, as a log does.
impl Value for Timed<Option<Box<Holds>>> {
    fn fresh_at(&self) -> u64 {
        self.fresh_at
    }

    fn peek(&self) -> State {
        State::Concurrency(self.state.clone().unwrap_or_default())
    }

    fn take(&mut self) -> State {
        State::Concurrency(self.state.take().unwrap_or_default())
    }

    fn new(fresh_at: u64, state: State) -> Option<Self> {
        match state {
            State::Concurrency(holds) => Some(Timed {
                fresh_at,
                state: Some(holds),
            }),
            _ => None,
        }
    }
}

struct Entry<V> {
    key: Span,
    value: V,
}

/// The table of one kind of state.
struct Table<V> {
    map: HashTable<Entry<V>>,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            map: HashTable::new(),
        }
    }
}

/// A table whatever its kind, as the store drives it.
trait AnyTable {
    fn len(&self) -> usize;
    fn find(&self, keys: &Arena, hash: u64, key: &[u8]) -> Option<usize>;
    fn take(&mut self, index: usize) -> Option<(u64, State)>;
    /// Overwrites the entry at `index`; false (and nothing written) for a state of another
    /// kind.
    fn put(&mut self, index: usize, fresh_at: u64, state: State) -> bool;
    fn remove(&mut self, index: usize) -> Option<Span>;
    /// Inserts a new entry; false (and nothing inserted) for a state of another kind.
    fn insert(&mut self, at: Place<'_>, fresh_at: u64, state: State) -> bool;
    /// Removes the entries fresh at `now`, freeing their keys; returns how many.
    fn drop_fresh(&mut self, now: u64, keys: &mut Arena) -> usize;
    /// Every entry's time of becoming fresh, with its index.
    fn each_fresh_at(&self, f: &mut dyn FnMut(u64, usize));
    fn each_key(&mut self, f: &mut dyn FnMut(&mut Span));
    /// Every entry's key, when it becomes fresh, and a copy of its state.
    fn each(&self, f: &mut dyn FnMut(Span, u64, State));
}

/// Where to insert a new entry: its key's span and hash, and how to hash the other keys
/// should the table grow.
struct Place<'a> {
    key: Span,
    hash: u64,
    keys: &'a Arena,
    hasher: &'a RandomState,
}

impl<V: Value> AnyTable for Table<V> {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn find(&self, keys: &Arena, hash: u64, key: &[u8]) -> Option<usize> {
        self.map.find_bucket_index(hash, |e| keys.get(e.key) == key)
    }

    fn take(&mut self, index: usize) -> Option<(u64, State)> {
        let entry = self.map.get_bucket_mut(index)?;
        Some((entry.value.fresh_at(), entry.value.take()))
    }

    fn put(&mut self, index: usize, fresh_at: u64, state: State) -> bool {
        match (self.map.get_bucket_mut(index), V::new(fresh_at, state)) {
            (Some(entry), Some(value)) => {
                entry.value = value;
                true
            }
            _ => false,
        }
    }

    fn remove(&mut self, index: usize) -> Option<Span> {
        let entry = self.map.get_bucket_entry(index).ok()?;
        Some(entry.remove().0.key)
    }

    fn insert(&mut self, at: Place<'_>, fresh_at: u64, state: State) -> bool {
        let Some(value) = V::new(fresh_at, state) else {
            return false;
        };
        let rehash = |e: &Entry<V>| at.hasher.hash_one(at.keys.get(e.key));
        self.map
            .insert_unique(at.hash, Entry { key: at.key, value }, rehash);
        true
    }

    fn drop_fresh(&mut self, now: u64, keys: &mut Arena) -> usize {
        let before = self.map.len();
        self.map.retain(|e| {
            let fresh = e.value.fresh_at() <= now;
            if fresh {
                keys.free(e.key);
            }
            !fresh
        });
        before - self.map.len()
    }

    fn each_fresh_at(&self, f: &mut dyn FnMut(u64, usize)) {
        for i in self.map.iter_buckets() {
            if let Some(e) = self.map.get_bucket(i) {
                f(e.value.fresh_at(), i);
            }
        }
    }

    fn each_key(&mut self, f: &mut dyn FnMut(&mut Span)) {
        self.map.iter_mut().for_each(|e| f(&mut e.key));
    }

    fn each(&self, f: &mut dyn FnMut(Span, u64, State)) {
        self.map
            .iter()
            .for_each(|e| f(e.key, e.value.fresh_at(), e.value.peek()));
    }
}

/// One table per kind of state.
#[derive(Default)]
struct Tables {
    funnel: Table<Tat>,
    token_bucket: Table<Timed<Bucket>>,
    fixed_window: Table<Timed<Window>>,
    sliding_window: Table<Timed<Counters>>,
    sliding_log: Table<Timed<Option<Box<Log>>>>,
    concurrency: Table<Timed<Option<Box<Holds>>>>,
    block: Table<Until>,
}

impl Tables {
    fn get(&self, kind: Kind) -> &dyn AnyTable {
        match kind {
            Kind::Funnel => &self.funnel,
            Kind::TokenBucket => &self.token_bucket,
            Kind::FixedWindow => &self.fixed_window,
            Kind::SlidingWindow => &self.sliding_window,
            Kind::SlidingLog => &self.sliding_log,
            Kind::Concurrency => &self.concurrency,
            Kind::Block => &self.block,
        }
    }

    fn get_mut(&mut self, kind: Kind) -> &mut dyn AnyTable {
        match kind {
            Kind::Funnel => &mut self.funnel,
            Kind::TokenBucket => &mut self.token_bucket,
            Kind::FixedWindow => &mut self.fixed_window,
            Kind::SlidingWindow => &mut self.sliding_window,
            Kind::SlidingLog => &mut self.sliding_log,
            Kind::Concurrency => &mut self.concurrency,
            Kind::Block => &mut self.block,
        }
    }
}

/// One shard's states, at most `capacity` of them (at least 1).
pub(super) struct Store {
    capacity: usize,
    keys: Arena,
    tables: Tables,
    /// The shards' router, hashing keys again when a table grows.
    hasher: RandomState,
}

impl Store {
    pub(super) fn new(capacity: usize, hasher: RandomState) -> Store {
        Store {
            capacity: capacity.max(1),
            keys: Arena::default(),
            tables: Tables::default(),
            hasher,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The number of keys held.
    pub(super) fn len(&self) -> usize {
        Kind::ALL.iter().map(|&k| self.tables.get(k).len()).sum()
    }

    /// Finds a key (of `hash`) in the table of `kind`.
    pub(super) fn find(&self, hash: u64, key: &[u8], kind: Kind) -> Option<Found> {
        let table = self.tables.get(kind);
        if table.len() == 0 {
            return None;
        }
        let index = table.find(&self.keys, hash, key)?;
        Some(Found { kind, index })
    }

    /// The state of a found key and when it becomes fresh; a log is moved out, and must be
    /// put back with [`Store::put`] (or the key removed).
    pub(super) fn take(&mut self, found: Found) -> Option<(u64, State)> {
        self.tables.get_mut(found.kind).take(found.index)
    }

    /// Writes a found key's state in place. A state of another kind (which a batch never
    /// writes: its states are of their key's kind) removes the key instead.
    pub(super) fn put(&mut self, found: Found, fresh_at: u64, state: State) {
        if !self
            .tables
            .get_mut(found.kind)
            .put(found.index, fresh_at, state)
        {
            self.remove(found);
        }
    }

    /// Removes a found key, counting its bytes as dead.
    pub(super) fn remove(&mut self, found: Found) {
        if let Some(key) = self.tables.get_mut(found.kind).remove(found.index) {
            self.keys.free(key);
        }
    }

    /// Stores a key not held (of `hash`) in the table of `kind` with its non-fresh state,
    /// making room first in a full store (see the module doc of `memory`). A key the arena
    /// cannot take (past 4 GiB of keys) is not stored, as if evicted at once; nor is a state
    /// of another kind.
    pub(super) fn insert(
        &mut self,
        kind: Kind,
        hash: u64,
        key: &[u8],
        fresh_at: u64,
        state: State,
        now: u64,
    ) {
        if state == State::Fresh {
            return;
        }
        self.make_room(now);
        let span = match self.keys.push(key) {
            Some(span) => Some(span),
            None => {
                self.compact();
                self.keys.push(key)
            }
        };
        let Some(key) = span else {
            return;
        };
        let place = Place {
            key,
            hash,
            keys: &self.keys,
            hasher: &self.hasher,
        };
        if !self.tables.get_mut(kind).insert(place, fresh_at, state) {
            self.keys.free(key);
        }
    }

    /// In a full store, drops every fresh entry, then evicts the entries closest to fresh
    /// until [`eviction_slice`] entries are free (none when the fresh ones were enough). Each
    /// step scans the whole store, so a flood of new keys into a full store pays for one scan
    /// per slice of new keys, not one per key.
    fn make_room(&mut self, now: u64) {
        if self.len() < self.capacity {
            return;
        }
        self.drop_fresh(now);
        let keep = self.capacity.saturating_sub(eviction_slice(self.capacity));
        let evict = self.len().saturating_sub(keep);
        if evict == 0 {
            return;
        }
        let mut all: Vec<(u64, Found)> = Vec::with_capacity(self.len());
        for kind in Kind::ALL {
            self.tables
                .get(kind)
                .each_fresh_at(&mut |at, index| all.push((at, Found { kind, index })));
        }
        if evict < all.len() {
            all.select_nth_unstable_by_key(evict - 1, |&(at, _)| at);
            all.truncate(evict);
        }
        // Removing an entry leaves every other entry at its index.
        for (_, found) in all {
            self.remove(found);
        }
    }

    /// Drops every entry fresh at `now`; returns how many.
    pub(super) fn drop_fresh(&mut self, now: u64) -> usize {
        Kind::ALL
            .into_iter()
            .map(|kind| self.tables.get_mut(kind).drop_fresh(now, &mut self.keys))
            .sum()
    }

    /// Reclaims the bytes of removed keys once they outweigh the held ones.
    pub(super) fn tidy(&mut self) {
        if self.keys.dead() == 0 {
            return;
        }
        if self.len() == 0 {
            self.keys.clear();
        } else if self.keys.dead() > self.keys.live().max(COMPACT_AT_LEAST) {
            self.compact();
        }
    }

    /// Copies the held keys into a new arena, updating their spans.
    fn compact(&mut self) {
        let old = &self.keys;
        let mut new = Arena::with_capacity(old.live());
        for kind in Kind::ALL {
            self.tables.get_mut(kind).each_key(&mut |span| {
                if let Some(moved) = new.push(old.get(*span)) {
                    *span = moved;
                }
            });
        }
        self.keys = new;
    }

    /// Calls `f` with every held key and a copy of its state, in no order.
    pub(super) fn each(&self, f: &mut dyn FnMut(&[u8], State)) {
        self.each_timed(&mut |key, _, state| f(key, state));
    }

    /// Calls `f` with every held key, when its state becomes fresh, and a copy of the state,
    /// in no order (snapshots).
    pub(super) fn each_timed(&self, f: &mut dyn FnMut(&[u8], u64, State)) {
        for kind in Kind::ALL {
            let keys = &self.keys;
            self.tables
                .get(kind)
                .each(&mut |key, at, state| f(keys.get(key), at, state));
        }
    }

    /// Every held key with its state, in no order.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn snapshot(&self) -> Vec<(Vec<u8>, State)> {
        let mut all = Vec::with_capacity(self.len());
        for kind in Kind::ALL {
            self.tables
                .get(kind)
                .each(&mut |key, _, state| all.push((self.keys.get(key).to_vec(), state)));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        store: Store,
        hasher: RandomState,
    }

    fn tat(tat: u64) -> Tat {
        Tat {
            tat,
            ..Tat::default()
        }
    }

    impl Fixture {
        fn new(capacity: usize) -> Fixture {
            let hasher = RandomState::new();
            Fixture {
                store: Store::new(capacity, hasher.clone()),
                hasher,
            }
        }

        fn insert(&mut self, key: &str, fresh_at: u64, now: u64) {
            let hash = self.hasher.hash_one(key.as_bytes());
            let state = State::Funnel(tat(fresh_at));
            self.store
                .insert(Kind::Funnel, hash, key.as_bytes(), fresh_at, state, now);
        }

        fn find(&self, key: &str, kind: Kind) -> Option<Found> {
            let hash = self.hasher.hash_one(key.as_bytes());
            self.store.find(hash, key.as_bytes(), kind)
        }

        fn keys(&self) -> Vec<String> {
            let mut keys: Vec<String> = self
                .store
                .snapshot()
                .into_iter()
                .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
                .collect();
            keys.sort();
            keys
        }
    }

    #[test]
    fn a_full_store_drops_fresh_entries_then_the_one_closest_to_fresh() {
        let mut f = Fixture::new(3);
        f.insert("a", 5, 0);
        f.insert("b", 9, 0);
        f.insert("c", 7, 0);
        f.insert("d", 8, 0);
        assert_eq!(f.keys(), ["b", "c", "d"]);
        f.insert("e", 20, 8);
        assert_eq!(f.keys(), ["b", "e"]);
    }

    #[test]
    fn writing_a_held_key_in_place_never_evicts() {
        let mut f = Fixture::new(1);
        f.insert("a", 5, 0);
        let found = f.find("a", Kind::Funnel).unwrap();
        assert_eq!(f.store.take(found), Some((5, State::Funnel(tat(5)))));
        f.store.put(found, 6, State::Funnel(tat(6)));
        assert_eq!(f.store.snapshot(), [(b"a".to_vec(), State::Funnel(tat(6)))]);
    }

    #[test]
    fn a_key_is_looked_up_only_in_the_table_of_its_kind() {
        let mut f = Fixture::new(4);
        f.insert("a", 5, 0);
        assert!(f.find("a", Kind::Funnel).is_some());
        for kind in Kind::ALL.into_iter().filter(|&k| k != Kind::Funnel) {
            assert_eq!(f.find("a", kind), None, "{kind:?}");
        }
        // The same bytes under another kind are another state.
        let hash = f.hasher.hash_one(b"a".as_slice());
        let bucket = State::TokenBucket(Bucket {
            used: 1,
            anchor: 2,
            refundable: 0,
        });
        f.store
            .insert(Kind::TokenBucket, hash, b"a", 9, bucket.clone(), 0);
        assert_eq!(f.store.len(), 2);
        let found = f.find("a", Kind::TokenBucket).unwrap();
        assert_eq!(f.store.take(found), Some((9, bucket)));
    }

    #[test]
    fn a_state_of_another_kind_is_never_stored() {
        let mut f = Fixture::new(4);
        let hash = f.hasher.hash_one(b"a".as_slice());
        f.store
            .insert(Kind::SlidingLog, hash, b"a", 9, State::Funnel(tat(9)), 0);
        f.insert("b", 5, 0);
        let found = f.find("b", Kind::Funnel).unwrap();
        f.store.put(found, 9, State::FixedWindow(Window::default()));
        assert_eq!(f.store.len(), 0);
        f.store.tidy();
        assert_eq!(f.store.keys.live(), 0);
    }

    #[test]
    fn a_log_is_moved_out_and_back_not_copied() {
        let mut f = Fixture::new(4);
        let hash = f.hasher.hash_one(b"log".as_slice());
        let log = State::SlidingLog(Box::default());
        f.store
            .insert(Kind::SlidingLog, hash, b"log", 7, log.clone(), 0);
        let found = f.find("log", Kind::SlidingLog).unwrap();
        assert_eq!(f.store.take(found), Some((7, log.clone())));
        f.store.put(found, 7, log.clone());
        assert_eq!(f.store.snapshot(), [(b"log".to_vec(), log)]);
    }

    #[test]
    fn removed_keys_bytes_are_reclaimed_and_held_keys_still_found() {
        let mut f = Fixture::new(10_000);
        let key = |i: usize| format!("some-rather-long-key-{i}");
        for i in 0..1_000 {
            f.insert(&key(i), 100, 0);
        }
        let bytes = f.store.keys.live();
        for i in (0..1_000).filter(|i| i % 4 != 0) {
            let found = f.find(&key(i), Kind::Funnel).unwrap();
            f.store.remove(found);
        }
        f.store.tidy();
        assert_eq!(f.store.keys.dead(), 0);
        assert!(f.store.keys.live() < bytes / 3);
        for i in 0..1_000 {
            assert_eq!(f.find(&key(i), Kind::Funnel).is_some(), i % 4 == 0, "{i}");
        }
        assert_eq!(f.store.drop_fresh(100), 250);
        f.store.tidy();
        assert_eq!((f.store.len(), f.store.keys.live()), (0, 0));
    }

    #[test]
    fn growing_tables_rehash_keys_from_the_arena() {
        let mut f = Fixture::new(100_000);
        for i in 0..5_000 {
            f.insert(&format!("k{i}"), 10, 0);
        }
        assert!((0..5_000).all(|i| f.find(&format!("k{i}"), Kind::Funnel).is_some()));
        assert!(f.find("k5000", Kind::Funnel).is_none());
    }
}
