//! Listing the held keys for `/counters`, without stalling requests: one shard is locked at a
//! time, only long enough to copy out the next keys of the page (at most `count`, the
//! smallest after the cursor), then released before anything else is done with them.
//!
//! A cursor is `<shard>.<hex of the last key returned>`: within a shard keys come in byte
//! order, so a key held during the whole walk is listed exactly once; one added or removed
//! meanwhile may or may not be.

use std::collections::BinaryHeap;
use std::fmt::Write as _;

use super::decide::{self, Scratch};
use super::shards::Shards;
use crate::limiter::algorithm::{Algo, State};
use crate::limiter::counters::{CounterEntry, CounterPage, CounterQuery, KeyState, Resolved};
use crate::limiter::{Batch, Hit, LimitParams, LimiterError, Role};

/// Where a page starts.
struct Cursor {
    shard: usize,
    after: Option<Vec<u8>>,
}

/// One page of `shards`, read at `now()` (taken after each shard is released).
pub(super) fn page(
    shards: &Shards,
    query: &CounterQuery<'_>,
    now: impl Fn() -> u64,
) -> Result<CounterPage, LimiterError> {
    let mut cursor = parse(query.cursor)?;
    let count = query.count.max(1);
    let mut entries = Vec::new();
    while cursor.shard < shards.count() && entries.len() < count {
        let wanted = count - entries.len();
        let copied = shards.copy_after(cursor.shard, query.prefix, cursor.after.as_deref(), wanted);
        let full = copied.len() == wanted;
        let now = now();
        cursor.after = copied.last().map(|(k, _, _)| k.clone());
        entries.extend(
            copied
                .into_iter()
                .filter_map(|(key, state, until)| read(key, &state, until, query, now)),
        );
        if !full {
            cursor = Cursor {
                shard: cursor.shard + 1,
                after: None,
            };
        }
    }
    let next = (cursor.shard < shards.count()).then(|| format(&cursor));
    Ok(CounterPage { entries, next })
}

/// A copied key's entry, unless it is skipped or its state is fresh (as good as not held) and
/// it is not blocked (`until`: the end of its penalty box, 0 when none).
fn read(
    key: Vec<u8>,
    state: &State,
    until: u64,
    query: &CounterQuery<'_>,
    now: u64,
) -> Option<CounterEntry> {
    let limit = match (query.resolve)(&key) {
        Resolved::Skip => return None,
        Resolved::Unknown => {
            return Some(CounterEntry {
                key,
                limit: None,
                state: None,
            });
        }
        Resolved::Limit(limit) => limit,
    };
    let algo = crate::limiter::algorithm::Algo::of(&limit);
    if algo.fresh_at(state, now).is_none() && until <= now {
        return None;
    }
    let state = check_only(&key, limit, state, until, now);
    Some(CounterEntry {
        key,
        limit: Some(limit),
        state: Some(state),
    })
}

/// What a request of cost 0 would be told about this state: the engine's own decision.
fn check_only(key: &[u8], limit: LimitParams, state: &State, until: u64, now: u64) -> KeyState {
    let hit = Hit {
        key: key.into(),
        limit,
        cost: 0,
        refund: false,
        group: 0,
        role: Role::Enforced,
        hold: None,
    };
    let batch = Batch { hits: vec![hit] };
    let mut states = [state.clone()];
    let mut writes = Scratch::new();
    let mut blocks = [until];
    let outcome = decide::decide(
        &batch.hits,
        &[0],
        &mut states,
        &mut blocks,
        now,
        &mut writes,
    );
    let hit = outcome
        .hits
        .first()
        .copied()
        .unwrap_or(crate::limiter::HitOutcome {
            admitted: true,
            remaining: 0,
            reset_nanos: 0,
            from_local_cache: false,
        });
    let oldest = match (Algo::of(&limit), state) {
        (Algo::Concurrency(c), State::Concurrency(holds)) => c.oldest_expiry(holds, now),
        _ => None,
    };
    KeyState {
        admitted: hit.admitted,
        remaining: hit.remaining,
        reset_nanos: hit.reset_nanos,
        oldest_hold_nanos: oldest.map(|at| at.saturating_sub(now)),
        blocked_nanos: (until > now).then(|| until - now),
        leased: None,
        share: None,
    }
}

impl Shards {
    /// Copies, under the shard's lock, the `n` smallest keys starting with `prefix` and
    /// greater than `after`, with their states and the end of their penalty box (0: none),
    /// sorted. A key with only a penalty box comes with a fresh state.
    pub(super) fn copy_after(
        &self,
        shard: usize,
        prefix: &[u8],
        after: Option<&[u8]>,
        n: usize,
    ) -> Vec<(Vec<u8>, State, u64)> {
        let mut heap: BinaryHeap<ByKey> = BinaryHeap::with_capacity(n + 1);
        let mut boxes: Vec<(Vec<u8>, u64)> = Vec::new();
        self.with_shard(shard, |store| {
            store.each(&mut |key: &[u8], state: State| {
                if !key.starts_with(prefix) || after.is_some_and(|a| key <= a) {
                    return;
                }
                if let State::Blocked(until) = state {
                    boxes.push((key.to_vec(), until));
                    return;
                }
                let room = heap.len() < n || heap.peek().is_some_and(|top| key < top.0.as_slice());
                if room {
                    heap.push(ByKey(key.to_vec(), state));
                    if heap.len() > n {
                        heap.pop();
                    }
                }
            });
        });
        let mut sorted: Vec<(Vec<u8>, State, u64)> =
            heap.into_iter().map(|e| (e.0, e.1, 0)).collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, until) in boxes {
            match sorted.binary_search_by(|e| e.0.as_slice().cmp(&key)) {
                Ok(at) => sorted[at].2 = until,
                Err(at) if at < n => {
                    sorted.insert(at, (key, State::Fresh, until));
                    sorted.truncate(n);
                }
                Err(_) => {}
            }
        }
        sorted
    }
}

/// A copied key, ordered by its bytes alone.
struct ByKey(Vec<u8>, State);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

fn parse(cursor: Option<&str>) -> Result<Cursor, LimiterError> {
    let Some(text) = cursor.filter(|c| !c.is_empty()) else {
        return Ok(Cursor {
            shard: 0,
            after: None,
        });
    };
    let bad = || LimiterError {
        backend: "memory",
        message: format!("invalid cursor {text:?}"),
        transient: false,
        source: None,
    };
    let (shard, hex) = text.split_once('.').ok_or_else(bad)?;
    let shard = shard.parse().map_err(|_| bad())?;
    if hex.is_empty() {
        return Ok(Cursor { shard, after: None });
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    Ok(Cursor {
        shard,
        after: Some(bytes),
    })
}

fn format(cursor: &Cursor) -> String {
    let mut out = format!("{}.", cursor.shard);
    for b in cursor.after.iter().flatten() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt as _;

    use super::*;
    use crate::config::model::{Algorithm, Charge};
    use crate::limiter::{Limiter as _, ManualClock, MemoryLimiter};

    const SEC: u64 = 1_000_000_000;

    fn limit() -> LimitParams {
        LimitParams {
            algorithm: Algorithm::Funnel,
            quota: 10,
            period_nanos: 10 * SEC,
            burst: 10,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: false,
            calendar: None,
        }
    }

    fn take(limiter: &MemoryLimiter<ManualClock>, key: &str, cost: u64) {
        let hit = Hit {
            key: key.as_bytes().into(),
            limit: limit(),
            cost,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        };
        let outcome = limiter.check(&Batch { hits: vec![hit] }).now_or_never();
        assert!(matches!(outcome, Some(Ok(o)) if o.admitted));
    }

    fn all(limiter: &MemoryLimiter<ManualClock>, prefix: &str, count: usize) -> Vec<CounterEntry> {
        let resolve = |_: &[u8]| Resolved::Limit(limit());
        let mut cursor: Option<String> = None;
        let mut out = Vec::new();
        for _ in 0..10_000 {
            let query = CounterQuery {
                prefix: prefix.as_bytes(),
                cursor: cursor.as_deref(),
                count,
                resolve: &resolve,
            };
            let page = limiter
                .counters(&query)
                .now_or_never()
                .and_then(Result::ok)
                .unwrap_or_default();
            assert!(page.entries.len() <= count);
            out.extend(page.entries);
            cursor = page.next;
            if cursor.is_none() {
                return out;
            }
        }
        panic!("the walk never ended");
    }

    #[test]
    fn every_held_key_is_listed_once_with_its_state_page_by_page() {
        let clock = ManualClock::at(100 * SEC);
        let limiter = MemoryLimiter::with_clock(10_000, clock.clone());
        for i in 0..500 {
            take(&limiter, &format!("a{i}"), 1 + i % 9);
        }
        take(&limiter, "b", 3);
        for count in [1, 7, 1000] {
            let listed = all(&limiter, "a", count);
            let mut keys: Vec<String> = listed
                .iter()
                .map(|e| String::from_utf8_lossy(&e.key).into_owned())
                .collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), 500, "count {count}");
            assert_eq!(listed.len(), 500);
            for e in &listed {
                let i: u64 = String::from_utf8_lossy(&e.key[1..]).parse().unwrap_or(0);
                let state = e.state.unwrap_or(KeyState {
                    admitted: false,
                    remaining: 0,
                    reset_nanos: 0,
                    oldest_hold_nanos: None,
                    blocked_nanos: None,
                    leased: None,
                    share: None,
                });
                assert_eq!(state.remaining, 10 - (1 + i % 9), "{e:?}");
                assert_eq!(state.reset_nanos, (1 + i % 9) * SEC, "{e:?}");
            }
        }
        // Drained keys are as good as not held.
        clock.advance(10 * SEC);
        assert!(all(&limiter, "", 3).is_empty());
    }

    #[test]
    fn bad_cursors_are_errors() {
        let limiter = MemoryLimiter::with_clock(100, ManualClock::at(SEC));
        let resolve = |_: &[u8]| Resolved::Unknown;
        for bad in ["x", "1.zz", "1.abc", "."] {
            let query = CounterQuery {
                prefix: b"",
                cursor: Some(bad),
                count: 1,
                resolve: &resolve,
            };
            let page = limiter.counters(&query).now_or_never();
            assert!(matches!(page, Some(Err(_))), "{bad}");
        }
    }
}
