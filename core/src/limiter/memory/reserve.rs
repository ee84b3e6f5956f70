//! Reservations in the memory backend: each key's open reservations in one table beside the
//! shards, bounded by the limiter's `max_keys` and [`MAX_OPEN`] per key. An operation holds the
//! table's lock while it decides its batch on the shards (which it locks after the table, as
//! nothing else does), so a reservation's record and its charge change together.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::store::Kind;
use super::{Clock, MemoryLimiter};
use crate::limiter::algorithm::{Algo, State};
use crate::limiter::reserve::{
    MAX_OPEN, Records, ReserveOp, ReserveOutcome, ReserveRequest, check_after, settle,
};
use crate::limiter::{Batch, Hit, LimiterError};

/// Every key's open reservations.
pub(super) struct Table {
    keys: Mutex<HashMap<Arc<[u8]>, Records>>,
    max_keys: usize,
}

impl Table {
    pub(super) fn new(max_keys: usize) -> Table {
        Table {
            keys: Mutex::new(HashMap::new()),
            max_keys: max_keys.max(1),
        }
    }

    /// Calls `f` with every key's records, under the table's lock (snapshots).
    pub(super) fn each(&self, f: &mut dyn FnMut(&[u8], &Records)) {
        self.keys.lock().iter().for_each(|(key, r)| f(key, r));
    }

    /// Sets a key's records (restoring a snapshot); records with none open are not kept.
    pub(super) fn install(&self, key: &[u8], records: Records) {
        if !records.is_empty() {
            self.keys.lock().insert(Arc::from(key), records);
        }
    }

    /// Drops expired records, and keys left with none; returns how many keys went.
    pub(super) fn sweep(&self, now: u64) -> usize {
        let mut keys = self.keys.lock();
        let before = keys.len();
        keys.retain(|_, r| {
            r.expire(now);
            !r.is_empty()
        });
        before - keys.len()
    }
}

impl<C: Clock> MemoryLimiter<C> {
    /// One reservation operation, atomic on the key's records and its rate state.
    pub(super) fn reserve_op(
        &self,
        request: &ReserveRequest,
    ) -> Result<ReserveOutcome, LimiterError> {
        let mut keys = self.reservations.keys.lock();
        let now = self.clock.now_nanos();
        if !keys.contains_key(&request.records) && keys.len() >= self.reservations.max_keys {
            keys.retain(|_, r| {
                r.expire(now);
                !r.is_empty()
            });
            if keys.len() >= self.reservations.max_keys {
                return Err(LimiterError {
                    backend: "memory",
                    message: format!(
                        "{} keys hold open reservations, the most the limiter keeps",
                        keys.len()
                    ),
                    transient: true,
                    source: None,
                });
            }
        }
        let mut records = keys.remove(&request.records).unwrap_or_default();
        records.expire(now);
        let outcome = match &request.op {
            ReserveOp::Reserve { batch, amount } => {
                if records.open.len() >= MAX_OPEN {
                    ReserveOutcome {
                        done: false,
                        id: 0,
                        estimate: 0,
                        open: records.open.len() as u64,
                        outcome: None,
                    }
                } else {
                    let outcome = self.decide(batch);
                    let id = match batch.hits.first() {
                        Some(hit) if outcome.admitted => {
                            let open = records.open.iter().map(|r| r.amount).sum::<u64>();
                            let mark = self.with_state(hit, |algo, state, now| {
                                algo.name_reservation(state, now, hit.cost, open)
                            });
                            let expiry = now.saturating_add(request.ttl_nanos);
                            Some(records.open(now, *amount, expiry, mark))
                        }
                        _ => None,
                    };
                    ReserveOutcome {
                        done: id.is_some(),
                        id: id.unwrap_or(0),
                        estimate: 0,
                        open: records.open.len() as u64,
                        outcome: Some(outcome),
                    }
                }
            }
            ReserveOp::Commit { id, actual, hit } => {
                let record = records.close(*id);
                let estimate = record.map(|r| r.amount);
                let mut settling = settle(hit, estimate, *actual);
                if let (Some(r), true) = (record, settling.refund) {
                    let units = settling.cost;
                    self.with_state(hit, |algo, state, now| {
                        algo.give_back_named(state, now, units, r.mark);
                    });
                    settling.cost = 0;
                }
                let batch = Batch {
                    hits: vec![settling],
                };
                let mut outcome = self.decide(&batch);
                let after = Batch {
                    hits: vec![check_after(hit)],
                };
                outcome.hits.extend(self.decide(&after).hits);
                ReserveOutcome {
                    done: estimate.is_some(),
                    id: 0,
                    estimate: estimate.unwrap_or(0),
                    open: records.open.len() as u64,
                    outcome: Some(outcome),
                }
            }
        };
        if !records.is_empty() {
            keys.insert(Arc::clone(&request.records), records);
        }
        Ok(outcome)
    }

    /// Applies `f` to the state of `hit`'s key (under its limit's algorithm) at the clock's
    /// now, under the key's shard lock, and stores the result.
    fn with_state<R>(&self, hit: &Hit, f: impl FnOnce(&Algo, &mut State, u64) -> R) -> R {
        let algo = Algo::of(&hit.limit);
        let kind = Kind::of(hit.limit.algorithm);
        let (hash, shard) = self.shards.place(&hit.key);
        let mut locked = self.shards.lock(std::iter::once(shard));
        let now = self.clock.now_nanos();
        let Some(store) = locked.store(shard) else {
            return f(&algo, &mut State::Fresh, now);
        };
        let found = store.find(hash, &hit.key, kind);
        let mut state = found
            .and_then(|at| store.take(at))
            .map_or(State::Fresh, |(_, s)| s);
        let out = f(&algo, &mut state, now);
        match (found, algo.fresh_at(&state, now)) {
            (Some(at), Some(fresh_at)) => store.put(at, fresh_at, state),
            (Some(at), None) => store.remove(at),
            (None, Some(fresh_at)) => store.insert(kind, hash, &hit.key, fresh_at, state, now),
            (None, None) => {}
        }
        locked.tidy();
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::model::{Algorithm, Charge};
    use crate::limiter::reserve::records_key;
    use crate::limiter::{Hit, LimitParams, ManualClock, Role};

    const SEC: u64 = 1_000_000_000;

    fn reserve(key: &str, amount: u64) -> ReserveRequest {
        let hit = Hit {
            key: Arc::from(key.as_bytes()),
            limit: LimitParams {
                algorithm: Algorithm::Funnel,
                quota: 10,
                period_nanos: 10 * SEC,
                burst: 10,
                charge: Charge::Admitted,
                borrow: false,
                block_nanos: 0,
                global: false,
                calendar: None,
            },
            cost: amount,
            refund: false,
            hold: None,
            group: 0,
            role: Role::Enforced,
        };
        ReserveRequest {
            records: records_key(&hit.key),
            ttl_nanos: SEC,
            op: ReserveOp::Reserve {
                batch: Batch { hits: vec![hit] },
                amount,
            },
        }
    }

    #[test]
    fn keys_with_open_reservations_are_bounded_by_max_keys() {
        let clock = ManualClock::at(SEC);
        let limiter = MemoryLimiter::with_clock(2, clock.clone());
        assert!(limiter.reserve_op(&reserve("a", 1)).is_ok_and(|o| o.done));
        assert!(limiter.reserve_op(&reserve("b", 1)).is_ok_and(|o| o.done));
        let full = limiter.reserve_op(&reserve("c", 1));
        assert!(full.is_err_and(|e| e.transient), "a third key is refused");
        assert!(
            limiter
                .reserve_op(&reserve("a", 1))
                .is_ok_and(|o| o.open == 2)
        );
        clock.advance(SEC);
        assert!(
            limiter.reserve_op(&reserve("c", 1)).is_ok_and(|o| o.done),
            "expired records make room"
        );
        clock.advance(SEC);
        assert_eq!(limiter.reservations.sweep(clock.now_nanos()), 1);
        assert!(limiter.reservations.keys.lock().is_empty());
    }

    #[test]
    fn a_refused_reserve_opens_nothing() {
        let limiter = MemoryLimiter::with_clock(8, ManualClock::at(SEC));
        let over = limiter.reserve_op(&reserve("a", 11)).expect("an answer");
        assert!(!over.done && over.open == 0);
        assert!(limiter.reservations.keys.lock().is_empty());
        assert!(limiter.snapshot().is_empty(), "nothing charged");
    }
}
