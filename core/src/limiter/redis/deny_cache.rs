//! The exact local deny cache: a hit that Redis denied is remembered until its retry time, so a
//! request made only of such hits is answered without a round trip, with the very answer Redis
//! would give.
//!
//! # The exactness rule
//!
//! A denial is remembered per state key and limit parameters (a rule and a client override
//! may share a key with different quotas), with **the cost that was denied for the key** and
//! the retry time Redis reported. Within one request the script evaluates the hits on a key
//! one after the other, each against the key's state with the earlier admitted hits of the
//! request tentatively taken: a later hit on a key the request names twice is denied the *sum*
//! of what the request asked of the key so far, not its own cost. Such a denial says nothing
//! about the hit's own cost (the stored state may well admit it: a request naming a key twice
//! at 1 per minute is denied, the next one naming it once is not), so it is not remembered.
//! Only a hit that met the key's stored state (no earlier hit of the request on that key was
//! taken, and no hit of the request on that key is a refund, which would give back) is
//! remembered, with its cost.
//!
//! A request is answered locally only when **every** hit finds a live denial of its key and
//! limit asking **exactly** that cost (a request asking more than a remembered cost would be
//! denied by Redis too, but with a later retry time that the cache does not know; it goes to
//! Redis). Then Redis would deny every hit: each of them meets the stored state (none before
//! it was admitted), which denies that cost until the remembered time; the answer, per hit, is
//! the remembered retry time less the time since, which is what Redis computes too.
//!
//! Why a remembered denial stays true: every algorithm reports the exact time a denied cost
//! would be admitted without other traffic (e.g. `tat + c*T - tau` for a funnel); other
//! replicas' traffic only makes a limiter fuller (a later `tat`, fewer tokens, higher counts,
//! more log entries), so the same limit keeps denying the same cost at least until then. The
//! retry time is counted from when the request was *sent* (before Redis read its clock), so
//! the cached denial never outlasts the real one. A request through this replica that takes
//! from a key or gives back to it (a refund) forgets the key's denials, so the retry times
//! answered are Redis's own. Two exceptions, both through other replicas: their traffic on a
//! cached key makes Redis's retry time later than the remembered one (the denial stays true,
//! the time answered is then a lower bound), and a refund there is seen here only after the
//! remembered retry time.
//!
//! Not cached: check-only hits (cost 0), refunds, `charge: always` limits (a denied request
//! must still charge those, so it must reach Redis), `concurrency` limits (a denied request
//! must leave its pending denial in Redis, and a release must reach the holds), and denials whose retry time is a period
//! or more (a cost the limit can never admit, above its burst or with a zero quota, is
//! answered by Redis with one period every time, not a time counting down).
//!
//! Bounded: at most `capacity` keys; a full cache first drops expired entries, then refuses
//! new ones (the oldest denials expire first anyway). It looks for expired entries only once
//! the earliest retry time it holds has passed, so a full cache of long denials (a quota of a few
//! per hour per client, say) refuses a flood of new ones in constant time, not with a scan each.
//!
//! Time is nanoseconds of the limiter's [`Clock`](crate::limiter::Clock), given by the caller.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::config::model::{Algorithm, Charge};
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, plan};

/// The limit parameters a denial is for (the key is the map's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Params {
    quota: u32,
    period: u64,
    burst: u32,
    borrow: bool,
}

impl Params {
    fn of(hit: &Hit) -> Params {
        Params {
            quota: hit.limit.quota,
            period: hit.limit.period_nanos,
            burst: hit.limit.burst,
            borrow: hit.limit.borrow,
        }
    }
}

/// One remembered denial: these limit parameters deny `cost` until `until`.
#[derive(Debug, Clone, Copy)]
struct Denial {
    params: Params,
    cost: u64,
    until: u64,
}

/// The denials of one key (almost always one).
type Denials = SmallVec<[Denial; 1]>;

/// Denied hits, until their retry time.
#[derive(Debug)]
pub(super) struct DenyCache {
    capacity: usize,
    held: Mutex<Held>,
}

/// The denials by key, and a time no later than the earliest of their retry times.
#[derive(Debug, Default)]
struct Held {
    map: HashMap<Arc<[u8]>, Denials, ahash::RandomState>,
    earliest: Option<u64>,
}

impl Held {
    /// Drops the expired entries, if any can have expired; returns how many keys went.
    fn purge(&mut self, now: u64) -> usize {
        if self.earliest.is_some_and(|t| t > now) {
            return 0;
        }
        let before = self.map.len();
        let mut earliest: Option<u64> = None;
        self.map.retain(|_, denials| {
            denials.retain(|d| d.until > now);
            for d in denials.iter() {
                earliest = Some(earliest.map_or(d.until, |e| e.min(d.until)));
            }
            !denials.is_empty()
        });
        self.earliest = earliest;
        before - self.map.len()
    }

    fn insert(&mut self, key: &Arc<[u8]>, denial: Denial) {
        let until = denial.until;
        self.earliest = Some(self.earliest.map_or(until, |e| e.min(until)));
        let denials = self.map.entry(key.clone()).or_default();
        match denials.iter_mut().find(|d| d.params == denial.params) {
            Some(d) => *d = denial,
            None => denials.push(denial),
        }
    }

    /// The retry time of a live denial of exactly `hit`'s cost on its key and limit.
    fn lookup(&self, hit: &Hit, now: u64) -> Option<u64> {
        if !cacheable(hit) {
            return None;
        }
        let params = Params::of(hit);
        self.map
            .get(&hit.key)?
            .iter()
            .find(|d| d.params == params && d.cost == hit.cost && d.until > now)
            .map(|d| d.until)
    }
}

fn cacheable(hit: &Hit) -> bool {
    hit.cost > 0
        && !hit.refund
        && hit.limit.charge != Charge::Always
        && hit.limit.algorithm != Algorithm::Concurrency
}

/// Per hit of `batch` as Redis decided it, whether the hit took or gave back something (its
/// cost applied), from the outcome's verdicts as the script planned them.
fn applied(batch: &Batch, outcome: &BatchOutcome) -> Vec<bool> {
    let verdicts: Vec<bool> = outcome.hits.iter().map(|o| o.admitted).collect();
    let consume = plan::plan(&batch.hits, &verdicts).consume;
    batch
        .hits
        .iter()
        .zip(consume)
        .map(|(h, c)| c && h.cost > 0)
        .collect()
}

/// Per hit of `batch` as Redis decided it: whether its denial is one of the key's stored
/// state as the call left it (see the module doc), so that it may be remembered: no earlier
/// hit of the request on the key was tentatively taken, and no hit on the key was applied.
fn met_stored_state(batch: &Batch, outcome: &BatchOutcome, applied: &[bool]) -> Vec<bool> {
    let hits = &batch.hits;
    hits.iter()
        .enumerate()
        .map(|(i, hit)| {
            let earlier_untaken = hits[..i]
                .iter()
                .zip(&outcome.hits[..i])
                .filter(|(h, _)| h.key == hit.key)
                .all(|(h, o)| !o.admitted && h.limit.charge != Charge::Always && !h.refund);
            let untouched = !hits
                .iter()
                .zip(applied)
                .any(|(h, &a)| a && h.key == hit.key);
            earlier_untaken && untouched
        })
        .collect()
}

impl DenyCache {
    /// A cache of at most `capacity` keys' denials (0 disables it).
    pub(super) fn new(capacity: usize) -> DenyCache {
        DenyCache {
            capacity,
            held: Mutex::new(Held::default()),
        }
    }

    /// The answer to `batch` at `now` when every one of its hits is a live denial of its cost,
    /// else `None`.
    pub(super) fn answer(&self, batch: &Batch, now: u64) -> Option<BatchOutcome> {
        if self.capacity == 0 || batch.hits.is_empty() {
            return None;
        }
        let held = self.held.lock();
        if held.map.is_empty() {
            return None;
        }
        let hits = batch
            .hits
            .iter()
            .map(|hit| {
                let until = held.lookup(hit, now)?;
                Some(HitOutcome {
                    admitted: false,
                    remaining: 0,
                    reset_nanos: until - now,
                    from_local_cache: true,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let admitted = plan::plan(&batch.hits, &vec![false; hits.len()]).admitted;
        Some(BatchOutcome { hits, admitted })
    }

    /// Remembers the denials of an outcome Redis gave for a batch sent at `sent`, and forgets
    /// those of the keys the batch took from or gave back to (their remembered retry times
    /// would no longer be Redis's).
    pub(super) fn learn(&self, batch: &Batch, outcome: &BatchOutcome, sent: u64) {
        if self.capacity == 0 {
            return;
        }
        let denied = batch
            .hits
            .iter()
            .zip(&outcome.hits)
            .any(|(h, o)| !o.admitted && cacheable(h));
        let mut held = self.held.lock();
        if !denied && held.map.is_empty() {
            return;
        }
        let applied = applied(batch, outcome);
        for (hit, _) in batch.hits.iter().zip(&applied).filter(|(_, a)| **a) {
            held.map.remove(&hit.key);
        }
        if !denied {
            return;
        }
        let met = met_stored_state(batch, outcome, &applied);
        for ((hit, o), met) in batch.hits.iter().zip(&outcome.hits).zip(met) {
            // A retry time of a period or more is not a count-down: a cost the limit can
            // never admit (above its burst, a zero quota) is answered with one period each
            // time; a wait that long (a debt) is left to Redis too.
            if o.admitted || !met || !cacheable(hit) || o.reset_nanos >= hit.limit.period_nanos {
                continue;
            }
            let denial = Denial {
                params: Params::of(hit),
                cost: hit.cost,
                until: sent.saturating_add(o.reset_nanos),
            };
            let known = held.map.contains_key(&hit.key);
            if !known && held.map.len() >= self.capacity {
                held.purge(sent);
            }
            if known || held.map.len() < self.capacity {
                held.insert(&hit.key, denial);
            }
        }
    }

    /// Drops expired entries at `now`; returns how many keys went.
    pub(super) fn sweep(&self, now: u64) -> usize {
        self.held.lock().purge(now)
    }

    /// Forgets every denial (a key was reset, here or by another replica).
    pub(super) fn clear(&self) {
        let mut held = self.held.lock();
        held.map.clear();
        held.earliest = None;
    }

    /// Keys held (expired ones included until they are dropped).
    pub(super) fn len(&self) -> usize {
        self.held.lock().map.len()
    }
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
                period_nanos: 10_000_000_000,
                burst: 1,
                charge: Charge::Admitted,
                borrow: false,
                block_nanos: 0,
                global: false,
                calendar: None,
            },
            cost,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        }
    }

    fn denied(reset: u64) -> HitOutcome {
        HitOutcome {
            admitted: false,
            remaining: 0,
            reset_nanos: reset,
            from_local_cache: false,
        }
    }

    fn batch(hits: Vec<Hit>) -> Batch {
        Batch { hits }
    }

    fn all_denied(n: usize, reset: u64) -> BatchOutcome {
        BatchOutcome {
            hits: vec![denied(reset); n],
            admitted: false,
        }
    }

    #[test]
    fn answers_only_whole_batches_of_live_denials_of_the_same_cost() {
        let cache = DenyCache::new(10);
        let two = batch(vec![hit("a", 2)]);
        cache.learn(&two, &all_denied(1, 1_000_000), 100);
        let answer = cache.answer(&two, 100).unwrap();
        assert!(!answer.admitted);
        assert!(answer.hits[0].from_local_cache, "answered without Redis");
        assert_eq!(answer.hits[0].reset_nanos, 1_000_000);
        assert_eq!(
            cache.answer(&two, 600).unwrap().hits[0].reset_nanos,
            999_500
        );
        for (hits, why) in [
            (vec![hit("a", 1)], "a smaller cost may be admitted"),
            (
                vec![hit("a", 3)],
                "a larger cost waits longer than remembered",
            ),
            (vec![hit("a", 0)], "check only"),
            (vec![hit("a", 2), hit("b", 1)], "b is not cached"),
        ] {
            assert!(cache.answer(&batch(hits), 100).is_none(), "{why}");
        }
        assert!(cache.answer(&two, 1_000_100).is_none(), "expired");
    }

    /// The case: a request naming one key twice at 1 per minute is denied by its
    /// second hit (which met the first one's tentative take); the key's stored state still
    /// admits 1, so nothing is remembered.
    #[test]
    fn a_denial_of_a_key_already_asked_by_the_request_is_not_remembered() {
        let cache = DenyCache::new(10);
        let mut second = hit("k", 1);
        second.group = 1;
        let twice = batch(vec![hit("k", 1), second]);
        let outcome = BatchOutcome {
            hits: vec![
                HitOutcome {
                    admitted: true,
                    remaining: 0,
                    reset_nanos: 60,
                    from_local_cache: false,
                },
                denied(60_000),
            ],
            admitted: false,
        };
        cache.learn(&twice, &outcome, 0);
        assert_eq!(cache.len(), 0);
        assert!(cache.answer(&batch(vec![hit("k", 1)]), 1).is_none());
        // Both hits denied by the stored state: both remembered (one entry of cost 1), and a
        // request naming the key twice or once at that cost is answered.
        cache.learn(&twice, &all_denied(2, 60_000), 0);
        assert!(cache.answer(&twice, 1).is_some());
        assert!(cache.answer(&batch(vec![hit("k", 1)]), 1).is_some());
    }

    #[test]
    fn a_refund_forgets_its_key_and_is_never_answered() {
        let cache = DenyCache::new(10);
        let one = batch(vec![hit("a", 1)]);
        cache.learn(&one, &all_denied(1, 1_000), 0);
        assert!(cache.answer(&one, 1).is_some());
        let mut back = hit("a", 1);
        back.refund = true;
        let refund = batch(vec![back]);
        assert!(cache.answer(&refund, 1).is_none());
        let admitted = BatchOutcome {
            hits: vec![HitOutcome {
                admitted: true,
                remaining: 1,
                reset_nanos: 0,
                from_local_cache: false,
            }],
            admitted: true,
        };
        cache.learn(&refund, &admitted, 2);
        assert!(cache.answer(&one, 3).is_none());
        // A denial met in the same request as a refund of its key is not remembered.
        let mut back = hit("a", 1);
        back.refund = true;
        let mixed = batch(vec![back, hit("a", 1)]);
        let mut outcome = all_denied(2, 1_000);
        outcome.hits[0].admitted = true;
        cache.learn(&mixed, &outcome, 4);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn taking_from_a_key_forgets_its_denials() {
        let cache = DenyCache::new(10);
        let one = batch(vec![hit("a", 1)]);
        cache.learn(&one, &all_denied(1, 1_000), 0);
        // Another limit on the same key (an override) admits and takes: the key is fuller,
        // Redis's retry time for the remembered denial is later now.
        let mut wide = hit("a", 1);
        wide.limit.quota = 100;
        let admitted = BatchOutcome {
            hits: vec![HitOutcome {
                admitted: true,
                remaining: 98,
                reset_nanos: 10,
                from_local_cache: false,
            }],
            admitted: true,
        };
        cache.learn(&batch(vec![wide]), &admitted, 1);
        assert!(cache.answer(&one, 2).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_flood_of_denied_keys_stays_within_capacity() {
        let cache = DenyCache::new(1_000);
        let learn = |range: std::ops::Range<usize>, now: u64| {
            for n in range {
                let b = batch(vec![hit(&format!("flood-{n}"), 1)]);
                cache.learn(&b, &all_denied(1, 1_000_000_000), now);
                assert!(cache.len() <= 1_000);
            }
        };
        learn(0..10_000, 0);
        assert_eq!(
            cache.len(),
            1_000,
            "the first denials are kept, later ones refused"
        );
        let earliest = cache.held.lock().earliest;
        assert_eq!(earliest, Some(1_000_000_000), "no scan until then");
        let cached = |n: usize, now: u64| {
            let b = batch(vec![hit(&format!("flood-{n}"), 1)]);
            cache.answer(&b, now).is_some()
        };
        assert!(cached(0, 1) && !cached(9_999, 1));
        // Once they expire, new denials take their place.
        learn(10_000..20_000, 1_000_000_000);
        assert_eq!(cache.len(), 1_000);
        let now = 1_000_000_001;
        assert!(!cached(0, now) && cached(10_000, now));
    }

    #[test]
    fn bounded_and_skips_charge_always() {
        let cache = DenyCache::new(1);
        let mut always = hit("x", 1);
        always.limit.charge = Charge::Always;
        let b = batch(vec![always, hit("a", 1), hit("b", 1)]);
        cache.learn(&b, &all_denied(3, 5), 0);
        assert_eq!(cache.len(), 1);
        assert!(cache.answer(&batch(vec![hit("a", 1)]), 1).is_some());
        assert_eq!(cache.sweep(5), 1);
        assert_eq!(cache.len(), 0);
    }
}
