//! The exact local deny cache: a hit that Redis denied is remembered until its retry time, so a
//! request made only of such hits is answered without a round trip.
//!
//! Why it is exact: every algorithm reports the exact time a denied cost would be admitted
//! without other traffic (e.g. `tat + c*T - tau` for a funnel); other replicas' traffic only
//! makes a limiter fuller (a later `tat`, fewer tokens, higher counts, more log entries), so the
//! same limit keeps denying the same cost at least until then (the reported retry time is then
//! a lower bound, as it is from Redis itself). The retry time is counted from when the request was *sent* (before Redis read
//! its clock), so the cached denial never outlasts the real one. Entries are per state key and
//! limit parameters (a rule and a client override may share a key with different quotas).
//!
//! Not cached: check-only hits (cost 0), refunds, and `charge: always` limits (a denied request
//! must still charge those, so it must reach Redis). Exception: a refund made through another
//! replica is seen here only after the cached retry time.
//!
//! Bounded: at most `capacity` entries; a full cache first drops expired entries, then refuses
//! new ones (the oldest denials expire first anyway). It looks for expired entries only once
//! the earliest retry time it holds has passed, so a full cache of long denials (a zero quota
//! per client, say) refuses a flood of new ones in constant time, not with a scan each.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::model::Charge;
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, plan};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Id {
    key: Arc<[u8]>,
    quota: u32,
    period: u64,
    burst: u32,
    borrow: bool,
}

#[derive(Debug, Clone, Copy)]
struct Denial {
    until: Instant,
    cost: u64,
}

/// Denied hits, until their retry time.
#[derive(Debug)]
pub struct DenyCache {
    capacity: usize,
    held: Mutex<Held>,
}

/// The denials, and a time no later than the earliest of their retry times.
#[derive(Debug, Default)]
struct Held {
    map: HashMap<Id, Denial, ahash::RandomState>,
    earliest: Option<Instant>,
}

impl Held {
    /// Drops the expired entries, if any can have expired; returns how many went.
    fn purge(&mut self, now: Instant) -> usize {
        if self.earliest.is_some_and(|t| t > now) {
            return 0;
        }
        let before = self.map.len();
        let mut earliest: Option<Instant> = None;
        self.map.retain(|_, d| {
            let keep = d.until > now;
            if keep {
                earliest = Some(earliest.map_or(d.until, |e| e.min(d.until)));
            }
            keep
        });
        self.earliest = earliest;
        before - self.map.len()
    }

    fn insert(&mut self, id: Id, denial: Denial) {
        let until = denial.until;
        self.earliest = Some(self.earliest.map_or(until, |e| e.min(until)));
        self.map.insert(id, denial);
    }
}

fn id(hit: &Hit) -> Id {
    Id {
        key: hit.key.clone(),
        quota: hit.limit.quota,
        period: hit.limit.period_nanos,
        burst: hit.limit.burst,
        borrow: hit.limit.borrow,
    }
}

fn cacheable(hit: &Hit) -> bool {
    hit.cost > 0 && !hit.refund && hit.limit.charge != Charge::Always
}

impl DenyCache {
    /// A cache of at most `capacity` denials (0 disables it).
    pub fn new(capacity: usize) -> DenyCache {
        DenyCache {
            capacity,
            held: Mutex::new(Held::default()),
        }
    }

    /// The answer to `batch` when every one of its hits is a cached denial, else `None`.
    pub fn answer(&self, batch: &Batch) -> Option<BatchOutcome> {
        if self.capacity == 0 || batch.hits.is_empty() {
            return None;
        }
        let now = Instant::now();
        let held = self.held.lock();
        let hits = batch
            .hits
            .iter()
            .map(|hit| {
                let d = held.map.get(&id(hit)).filter(|_| cacheable(hit))?;
                (d.until > now && hit.cost == d.cost).then(|| HitOutcome {
                    admitted: false,
                    remaining: 0,
                    reset_nanos: nanos(d.until - now),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let admitted = plan::plan(&batch.hits, &vec![false; hits.len()]).admitted;
        Some(BatchOutcome { hits, admitted })
    }

    /// Remembers the denials of an outcome Redis gave for a batch sent at `sent`.
    pub fn learn(&self, batch: &Batch, outcome: &BatchOutcome, sent: Instant) {
        if self.capacity == 0 {
            return;
        }
        let denied = batch
            .hits
            .iter()
            .zip(&outcome.hits)
            .filter(|(hit, o)| !o.admitted && cacheable(hit));
        let mut held = None;
        for (hit, o) in denied {
            let held = held.get_or_insert_with(|| self.held.lock());
            let denial = Denial {
                until: sent + Duration::from_nanos(o.reset_nanos),
                cost: hit.cost,
            };
            if held.map.len() >= self.capacity {
                held.purge(Instant::now());
            }
            if held.map.len() < self.capacity {
                held.insert(id(hit), denial);
            }
        }
    }

    /// Drops expired entries; returns how many went.
    pub fn sweep(&self) -> usize {
        self.held.lock().purge(Instant::now())
    }

    /// Entries held (expired ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.held.lock().map.len()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::Algorithm;
    use crate::limiter::{LimitParams, Role};

    fn hit(key: &str, cost: u64) -> Hit {
        Hit {
            key: key.as_bytes().into(),
            limit: LimitParams {
                algorithm: Algorithm::Funnel,
                quota: 1,
                period_nanos: 1_000_000_000,
                burst: 1,
                charge: Charge::Admitted,
                borrow: false,
            },
            cost,
            refund: false,
            group: 0,
            role: Role::Enforced,
        }
    }

    fn denied(reset: u64) -> HitOutcome {
        HitOutcome {
            admitted: false,
            remaining: 0,
            reset_nanos: reset,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_only_whole_batches_of_live_denials_of_no_smaller_cost() {
        let cache = DenyCache::new(10);
        let batch = Batch {
            hits: vec![hit("a", 2)],
        };
        let out = BatchOutcome {
            hits: vec![denied(1_000_000)],
            admitted: false,
        };
        cache.learn(&batch, &out, Instant::now());
        let answer = cache.answer(&batch).unwrap();
        assert!(!answer.admitted);
        assert_eq!(answer.hits[0].reset_nanos, 1_000_000);
        assert!(
            cache
                .answer(&Batch {
                    hits: vec![hit("a", 1)]
                })
                .is_none(),
            "another cost"
        );
        assert!(
            cache
                .answer(&Batch {
                    hits: vec![hit("a", 0)]
                })
                .is_none(),
            "check only"
        );
        assert!(
            cache
                .answer(&Batch {
                    hits: vec![hit("a", 3), hit("b", 1)]
                })
                .is_none()
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(cache.answer(&batch).is_none(), "expired");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_denied_keys_stays_within_capacity() {
        let cache = DenyCache::new(1_000);
        let learn = |range: std::ops::Range<usize>, reset: u64| {
            for n in range {
                let batch = Batch {
                    hits: vec![hit(&format!("flood-{n}"), 1)],
                };
                let out = BatchOutcome {
                    hits: vec![denied(reset)],
                    admitted: false,
                };
                cache.learn(&batch, &out, Instant::now());
                assert!(cache.len() <= 1_000);
            }
        };
        learn(0..10_000, 1_000_000_000);
        assert_eq!(
            cache.len(),
            1_000,
            "the first denials are kept, later ones refused"
        );
        let earliest = cache.held.lock().earliest;
        assert!(
            earliest.is_some_and(|t| t > Instant::now()),
            "no scan until then"
        );
        let cached = |n: usize| {
            let batch = Batch {
                hits: vec![hit(&format!("flood-{n}"), 1)],
            };
            cache.answer(&batch).is_some()
        };
        assert!(cached(0) && !cached(9_999));
        // Once they expire, new denials take their place.
        tokio::time::advance(Duration::from_secs(1)).await;
        learn(10_000..20_000, 1_000_000_000);
        assert_eq!(cache.len(), 1_000);
        assert!(!cached(0) && cached(10_000));
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_and_skips_charge_always() {
        let cache = DenyCache::new(1);
        let mut always = hit("x", 1);
        always.limit.charge = Charge::Always;
        let batch = Batch {
            hits: vec![always, hit("a", 1), hit("b", 1)],
        };
        let out = BatchOutcome {
            hits: vec![denied(5); 3],
            admitted: false,
        };
        cache.learn(&batch, &out, Instant::now());
        assert_eq!(cache.len(), 1);
        assert!(
            cache
                .answer(&Batch {
                    hits: vec![hit("a", 1)]
                })
                .is_some()
        );
    }
}
