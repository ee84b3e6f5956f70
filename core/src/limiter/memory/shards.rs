//! The sharded, bounded map of states: shard routing, ordered locking, sweeping. Each shard
//! is a [`Store`] behind a mutex.

use ahash::RandomState;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::store::Store;
use crate::limiter::Clock;
#[cfg(any(test, feature = "test-util"))]
use crate::limiter::algorithm::State;

/// The most shards a limiter has.
const MAX_SHARDS: usize = 64;
/// Fewer shards rather than fewer keys than this per shard.
const MIN_KEYS_PER_SHARD: usize = 16;
/// A key's shard is taken from these bits of its hash: above those a table of fewer than
/// 2^51 buckets indexes by, below the 7 it keeps as a tag (so keys of one shard still spread
/// over all of its table).
const SHARD_BITS_SHIFT: u32 = 51;

/// Batches up to this many shards lock them without allocating.
const INLINE_SHARDS: usize = 16;

/// A power-of-two number of shards whose capacities add up to `max_keys`.
pub(super) struct Shards {
    shards: Box<[Mutex<Store>]>,
    /// Hashes keys, for routing and in the shards' tables alike.
    router: RandomState,
}

impl Shards {
    pub(super) fn new(max_keys: usize) -> Shards {
        let max_keys = max_keys.max(1);
        let count = shard_count(max_keys);
        let (base, extra) = (max_keys / count, max_keys % count);
        let router = RandomState::new();
        let shards = (0..count)
            .map(|i| Mutex::new(Store::new(base + usize::from(i < extra), router.clone())))
            .collect();
        Shards { shards, router }
    }

    /// A key's hash (for its shard's table) and its shard.
    pub(super) fn place(&self, key: &[u8]) -> (u64, usize) {
        let hash = self.router.hash_one(key);
        let mask = self.shards.len().saturating_sub(1);
        (hash, (hash >> SHARD_BITS_SHIFT) as usize & mask)
    }

    /// Locks the given shards (any order, repeats allowed) in ascending order, each once.
    #[inline]
    pub(super) fn lock(&self, indices: impl Iterator<Item = usize>) -> Locked<'_> {
        let mut order: SmallVec<[usize; INLINE_SHARDS]> = SmallVec::new();
        order.extend(indices);
        order.sort_unstable();
        order.dedup();
        let mut locked = Locked {
            guards: SmallVec::new(),
        };
        let guards = order
            .iter()
            .filter_map(|&i| self.shards.get(i).map(|s| (i, s.lock())));
        locked.guards.extend(guards);
        locked
    }

    /// The number of shards.
    pub(super) fn count(&self) -> usize {
        self.shards.len()
    }

    /// Runs `f` on one shard's store, holding its lock only meanwhile.
    pub(super) fn with_shard<T>(&self, shard: usize, f: impl FnOnce(&Store) -> T) -> Option<T> {
        self.shards.get(shard).map(|s| f(&s.lock()))
    }

    /// The number of keys held (shard by shard, so only a snapshot under concurrent use).
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Every held key with its state, sorted by key.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn snapshot(&self) -> Vec<(Vec<u8>, State)> {
        let mut all: Vec<(Vec<u8>, State)> = self
            .shards
            .iter()
            .flat_map(|s| s.lock().snapshot())
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Drops every fresh entry, shard by shard, reading the clock under each shard's lock.
    pub(super) fn sweep(&self, clock: &impl Clock) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let mut store = s.lock();
                let dropped = store.drop_fresh(clock.now_nanos());
                store.tidy();
                dropped
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
                &self
                    .shards
                    .iter()
                    .map(|s| s.lock().capacity())
                    .sum::<usize>(),
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
    guards: SmallVec<[(usize, MutexGuard<'a, Store>); INLINE_SHARDS]>,
}

impl Locked<'_> {
    /// The store of a locked shard.
    pub(super) fn store(&mut self, shard: usize) -> Option<&mut Store> {
        let pos = self.guards.binary_search_by_key(&shard, |g| g.0).ok()?;
        self.guards.get_mut(pos).map(|(_, store)| &mut **store)
    }

    /// Reclaims dead key bytes in every locked shard that needs it (see [`Store::tidy`]).
    pub(super) fn tidy(&mut self) {
        self.guards.iter_mut().for_each(|(_, store)| store.tidy());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let capacities: Vec<usize> = s.shards.iter().map(|s| s.lock().capacity()).collect();
            assert_eq!(capacities.iter().sum::<usize>(), max_keys.max(1));
            assert!(capacities.iter().all(|&c| c >= 1));
        }
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let s = Shards::new(1 << 20);
        let mut seen = [false; MAX_SHARDS];
        for i in 0..10_000 {
            let (_, shard) = s.place(format!("key{i}").as_bytes());
            if let Some(flag) = seen.get_mut(shard) {
                *flag = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn locking_repeats_and_any_order_takes_each_shard_once() {
        let s = Shards::new(1 << 12);
        let locked = s.lock([5, 1, 5, 63, 1].into_iter());
        let order: Vec<usize> = locked.guards.iter().map(|g| g.0).collect();
        assert_eq!(order, [1, 5, 63]);
    }
}
