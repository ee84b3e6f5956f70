//! Reservations in the memory backend: each key's open reservations in one table beside the
//! shards, bounded by the limiter's `max_keys` and [`MAX_OPEN`] per key. An operation holds the
//! table's lock while it decides its batch on the shards (which it locks after the table, as
//! nothing else does), so a reservation's record and its charge change together.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Clock, MemoryLimiter};
use crate::limiter::reserve::{
    MAX_OPEN, Records, ReserveOp, ReserveOutcome, ReserveRequest, check_after, settle,
};
use crate::limiter::{Batch, LimiterError};

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
                    let id = outcome
                        .admitted
                        .then(|| records.open(now, *amount, now.saturating_add(request.ttl_nanos)));
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
                let estimate = records.close(*id);
                let batch = Batch {
                    hits: vec![settle(hit, estimate, *actual)],
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
}
