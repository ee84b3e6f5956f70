//! The sharded, bounded map of states: shard routing, ordered locking, eviction, sweeping.

use std::collections::HashMap;
use std::sync::Arc;

use ahash::RandomState;
use parking_lot::{Mutex, MutexGuard};

use crate::limiter::Clock;
use crate::limiter::algorithm::State;

/// A stored state and when it becomes fresh (see `Algo::fresh_at`): the map can tell a fresh
/// entry, and the one closest to fresh, without knowing the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) fresh_at: u64,
    pub(super) state: State,
}

type Map = HashMap<Arc<[u8]>, Stored, RandomState>;

/// The most shards a limiter has.
const MAX_SHARDS: usize = 64;
/// Fewer shards rather than fewer keys than this per shard.
const MIN_KEYS_PER_SHARD: usize = 16;

/// Whether a stored state holds no information at `now`.
fn is_fresh(stored: &Stored, now: u64) -> bool {
    stored.fresh_at <= now
}

/// One shard: its map and how many keys it may hold (at least 1).
struct Shard {
    map: Mutex<Map>,
    capacity: usize,
}

/// A power-of-two number of shards whose capacities add up to `max_keys`.
pub(super) struct Shards {
    shards: Box<[Shard]>,
    /// Routes keys to shards; distinct from the maps' own hashers.
    router: RandomState,
}

impl Shards {
    pub(super) fn new(max_keys: usize) -> Shards {
        let max_keys = max_keys.max(1);
        let count = shard_count(max_keys);
        let (base, extra) = (max_keys / count, max_keys % count);
        let shards = (0..count)
            .map(|i| Shard {
                map: Mutex::new(Map::default()),
                capacity: base + usize::from(i < extra),
            })
            .collect();
        Shards {
            shards,
            router: RandomState::new(),
        }
    }

    /// The shard of a key.
    pub(super) fn index(&self, key: &[u8]) -> usize {
        let mask = self.shards.len().saturating_sub(1);
        (self.router.hash_one(key) as usize) & mask
    }

    /// Locks the given shards (any order, repeats allowed) in ascending order, each once.
    pub(super) fn lock(&self, indices: &[usize]) -> Locked<'_> {
        let mut order = indices.to_vec();
        order.sort_unstable();
        order.dedup();
        let guards = order
            .into_iter()
            .filter_map(|i| self.shards.get(i).map(|s| (i, s.capacity, s.map.lock())))
            .collect();
        Locked { guards }
    }

    /// The number of keys held (shard by shard, so only a snapshot under concurrent use).
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.map.lock().len()).sum()
    }

    /// Every held key with its state, sorted by key.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn snapshot(&self) -> Vec<(Vec<u8>, State)> {
        let mut all: Vec<(Vec<u8>, State)> = self
            .shards
            .iter()
            .flat_map(|s| {
                let map = s.map.lock();
                map.iter()
                    .map(|(k, v)| (k.to_vec(), v.state.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Drops every fresh entry, shard by shard, reading the clock under each shard's lock.
    pub(super) fn sweep(&self, clock: &impl Clock) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let mut map = s.map.lock();
                let now = clock.now_nanos();
                let before = map.len();
                map.retain(|_, s| !is_fresh(s, now));
                before - map.len()
            })
            .sum()
    }
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("count", &self.shards.len())
            .field(
                "max_keys",
                &self.shards.iter().map(|s| s.capacity).sum::<usize>(),
            )
            .finish_non_exhaustive()
    }
}

/// The largest power of two that is at most 64 and leaves 16 keys per shard (at least 1).
fn shard_count(max_keys: usize) -> usize {
    let wanted = (max_keys / MIN_KEYS_PER_SHARD).clamp(1, MAX_SHARDS);
    1 << wanted.ilog2()
}

/// The shards one batch touches, locked, sorted by shard index.
pub(super) struct Locked<'a> {
    guards: Vec<(usize, usize, MutexGuard<'a, Map>)>,
}

impl Locked<'_> {
    fn shard(&mut self, shard: usize) -> Option<(usize, &mut Map)> {
        let pos = self.guards.binary_search_by_key(&shard, |g| g.0).ok()?;
        self.guards
            .get_mut(pos)
            .map(|(_, cap, map)| (*cap, &mut **map))
    }

    /// Takes a key's state out of the map (the batch puts it back, changed or not).
    pub(super) fn take(&mut self, shard: usize, key: &[u8]) -> Option<Stored> {
        self.shard(shard).and_then(|(_, map)| map.remove(key))
    }

    /// Stores a non-fresh state, making room in a full shard first (see the module doc).
    pub(super) fn store(&mut self, shard: usize, key: &Arc<[u8]>, stored: Stored, now: u64) {
        if let Some((capacity, map)) = self.shard(shard) {
            insert_bounded(map, capacity, key, stored, now);
        }
    }
}

fn insert_bounded(map: &mut Map, capacity: usize, key: &Arc<[u8]>, stored: Stored, now: u64) {
    if let Some(state) = map.get_mut(&**key) {
        *state = stored;
        return;
    }
    if map.len() >= capacity {
        map.retain(|_, s| !is_fresh(s, now));
    }
    while map.len() >= capacity.max(1) {
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, s)| s.fresh_at)
            .map(|(k, _)| Arc::clone(k))
        else {
            break;
        };
        map.remove(&oldest);
    }
    map.insert(Arc::clone(key), stored);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Arc<[u8]> {
        s.as_bytes().into()
    }

    fn at(fresh_at: u64) -> Stored {
        Stored {
            fresh_at,
            state: State::Funnel(fresh_at),
        }
    }

    #[test]
    fn shard_counts_are_powers_of_two_with_room_for_max_keys() {
        for (max_keys, count) in [
            (0, 1),
            (1, 1),
            (31, 1),
            (32, 2),
            (100, 4),
            (1023, 32),
            (1 << 20, 64),
        ] {
            let s = Shards::new(max_keys);
            assert_eq!(s.shards.len(), count, "max_keys {max_keys}");
            let total: usize = s.shards.iter().map(|s| s.capacity).sum();
            assert_eq!(total, max_keys.max(1));
            assert!(s.shards.iter().all(|s| s.capacity >= 1));
        }
    }

    #[test]
    fn a_full_shard_drops_fresh_entries_then_the_one_closest_to_fresh() {
        let mut map = Map::default();
        insert_bounded(&mut map, 3, &key("a"), at(5), 0);
        insert_bounded(&mut map, 3, &key("b"), at(9), 0);
        insert_bounded(&mut map, 3, &key("c"), at(7), 0);
        insert_bounded(&mut map, 3, &key("d"), at(8), 0);
        assert!(!map.contains_key(b"a".as_slice()));
        assert_eq!(map.len(), 3);
        insert_bounded(&mut map, 3, &key("e"), at(20), 8);
        let mut left: Vec<_> = map.keys().map(|k| k.to_vec()).collect();
        left.sort();
        assert_eq!(left, [b"b".to_vec(), b"e".to_vec()]);
    }

    #[test]
    fn updating_a_held_key_never_evicts() {
        let mut map = Map::default();
        insert_bounded(&mut map, 1, &key("a"), at(5), 0);
        insert_bounded(&mut map, 1, &key("a"), at(6), 0);
        assert_eq!(map.get(b"a".as_slice()), Some(&at(6)));
    }

    #[test]
    fn locking_repeats_and_any_order_takes_each_shard_once() {
        let s = Shards::new(1 << 12);
        let locked = s.lock(&[5, 1, 5, 63, 1]);
        let order: Vec<usize> = locked.guards.iter().map(|g| g.0).collect();
        assert_eq!(order, [1, 5, 63]);
    }
}
