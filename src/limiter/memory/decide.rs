//! One batch decided against a snapshot of its keys' states, as a pure function: evaluate every
//! hit (seeing earlier hits of the batch on the same key), plan (all or nothing), commit from the
//! original states, report. The caller reads the states and writes the result back.

use std::collections::HashMap;
use std::sync::Arc;

use ahash::RandomState;

use crate::config::model::{Algorithm, Charge};
use crate::limiter::funnel::{FRESH, Funnel};
use crate::limiter::{BatchOutcome, Hit, HitOutcome, LimitParams, plan};

/// Above this many hits, distinct keys are found with a hash map instead of a linear scan.
const LINEAR_SCAN_MAX: usize = 16;

/// The distinct keys of a batch, in order of first appearance.
pub(super) struct Slots<'a> {
    /// One per distinct key.
    pub(super) keys: Vec<&'a Arc<[u8]>>,
    /// Per hit: the index of its key in `keys`.
    pub(super) of_hit: Vec<usize>,
}

impl<'a> Slots<'a> {
    pub(super) fn new(hits: &'a [Hit]) -> Slots<'a> {
        let mut slots = Slots {
            keys: Vec::with_capacity(hits.len()),
            of_hit: Vec::with_capacity(hits.len()),
        };
        if hits.len() <= LINEAR_SCAN_MAX {
            for hit in hits {
                let found = slots.keys.iter().position(|k| **k == hit.key);
                slots.push(hit, found);
            }
        } else {
            let mut seen = HashMap::with_capacity_and_hasher(hits.len(), RandomState::new());
            for hit in hits {
                let next = slots.keys.len();
                let slot = *seen.entry(&*hit.key).or_insert(next);
                slots.push(hit, (slot != next).then_some(slot));
            }
        }
        slots
    }

    fn push(&mut self, hit: &'a Hit, found: Option<usize>) {
        let slot = found.unwrap_or_else(|| {
            self.keys.push(&hit.key);
            self.keys.len() - 1
        });
        self.of_hit.push(slot);
    }
}

/// What to do with one key's stored state after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    /// Unchanged: leave the map alone.
    Keep,
    /// Fresh after commit: forget it.
    Remove,
    /// Store this state.
    Store(u64),
}

/// The result of a batch: the outcome to return and one write per key slot.
pub(super) struct Decided {
    pub(super) outcome: BatchOutcome,
    pub(super) writes: Vec<Write>,
}

/// Decides a batch: `of_hit[i]` is the slot of `hits[i]`, `originals[s]` the state of slot `s`.
pub(super) fn decide(hits: &[Hit], of_hit: &[usize], originals: &[u64], now: u64) -> Decided {
    let evaluated = evaluate(hits, of_hit, originals, now);
    let plan = plan::plan(hits, &evaluated.admitted);
    let finals = commit(hits, of_hit, originals, &plan.consume, now);
    let reported = hits
        .iter()
        .zip(of_hit)
        .zip(evaluated.admitted.iter().zip(&evaluated.against))
        .map(|((hit, &slot), (&admitted, &against))| {
            let fin = finals.get(slot).copied().unwrap_or(FRESH);
            report(hit, admitted, against, fin, now)
        })
        .collect();
    Decided {
        outcome: BatchOutcome {
            hits: reported,
            admitted: plan.admitted,
        },
        writes: writes(hits, of_hit, originals, &finals, now),
    }
}

/// The funnel of a limit. Every algorithm must be handled here before it can reach this backend.
fn funnel_of(limit: &LimitParams) -> Funnel {
    match limit.algorithm {
        Algorithm::Funnel => limit.funnel(),
    }
}

/// The state after `hit` takes its cost (or gives it back, for a refund).
fn apply(hit: &Hit, funnel: &Funnel, tat: u64, now: u64) -> u64 {
    if hit.refund {
        funnel.refund(tat, now, hit.cost)
    } else {
        funnel.consume(tat, now, hit.cost)
    }
}

/// Each hit's own verdict, and the state it was evaluated against.
struct Evaluated {
    admitted: Vec<bool>,
    against: Vec<u64>,
}

/// Evaluates hits in order; a hit sees the tentative effect of the earlier hits on its key
/// (those admitted, and those charged always).
fn evaluate(hits: &[Hit], of_hit: &[usize], originals: &[u64], now: u64) -> Evaluated {
    let mut overlay = originals.to_vec();
    let mut out = Evaluated {
        admitted: Vec::with_capacity(hits.len()),
        against: Vec::with_capacity(hits.len()),
    };
    for (hit, &slot) in hits.iter().zip(of_hit) {
        let funnel = funnel_of(&hit.limit);
        let tat = overlay.get(slot).copied().unwrap_or(FRESH);
        let admitted = hit.refund || funnel.evaluate(tat, now, hit.cost).admitted;
        let takes = admitted || hit.limit.charge == Charge::Always;
        if let Some(state) = overlay.get_mut(slot).filter(|_| takes) {
            *state = apply(hit, &funnel, tat, now);
        }
        out.admitted.push(admitted);
        out.against.push(tat);
    }
    out
}

/// The states after the planned hits consume, from the original states, in batch order.
fn commit(
    hits: &[Hit],
    of_hit: &[usize],
    originals: &[u64],
    consume: &[bool],
    now: u64,
) -> Vec<u64> {
    let mut finals = originals.to_vec();
    for ((hit, &slot), _) in hits.iter().zip(of_hit).zip(consume).filter(|(_, c)| **c) {
        if let Some(state) = finals.get_mut(slot) {
            *state = apply(hit, &funnel_of(&hit.limit), *state, now);
        }
    }
    finals
}

/// One hit's outcome: from the key's final state when admitted, else from the state it was
/// evaluated against.
fn report(hit: &Hit, admitted: bool, against: u64, fin: u64, now: u64) -> HitOutcome {
    let funnel = funnel_of(&hit.limit);
    if admitted {
        HitOutcome {
            admitted,
            remaining: funnel.remaining(fin, now),
            reset_nanos: funnel.until_empty(fin, now),
        }
    } else {
        HitOutcome {
            admitted,
            remaining: 0,
            reset_nanos: funnel.until_admitted(against, now, hit.cost),
        }
    }
}

/// One write per slot: keep what did not change, remove what is fresh, store the rest.
fn writes(
    hits: &[Hit],
    of_hit: &[usize],
    originals: &[u64],
    finals: &[u64],
    now: u64,
) -> Vec<Write> {
    let mut first_hit: Vec<Option<&Hit>> = vec![None; originals.len()];
    for (hit, &slot) in hits.iter().zip(of_hit) {
        if let Some(first @ None) = first_hit.get_mut(slot) {
            *first = Some(hit);
        }
    }
    originals
        .iter()
        .zip(finals)
        .zip(first_hit)
        .map(|((&old, &new), hit)| match hit {
            _ if old == new => Write::Keep,
            Some(hit) if !funnel_of(&hit.limit).is_fresh(new, now) => Write::Store(new),
            _ => Write::Remove,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Role;

    const SEC: u64 = 1_000_000_000;

    fn hit(key: &str, group: usize, cost: u64) -> Hit {
        Hit {
            key: key.as_bytes().into(),
            limit: LimitParams {
                algorithm: Algorithm::Funnel,
                quota: 4,
                period_nanos: SEC,
                burst: 4,
                charge: Charge::Admitted,
                borrow: false,
            },
            cost,
            refund: false,
            group,
            role: Role::Enforced,
        }
    }

    #[test]
    fn slots_group_equal_keys_with_either_strategy() {
        for n in [3, 40] {
            let hits: Vec<Hit> = (0..n).map(|i| hit(["a", "b", "a"][i % 3], i, 1)).collect();
            let slots = Slots::new(&hits);
            assert_eq!(slots.keys.len(), 2);
            let want: Vec<usize> = (0..n).map(|i| [0, 1, 0][i % 3]).collect();
            assert_eq!(slots.of_hit, want);
        }
    }

    #[test]
    fn a_later_hit_sees_an_earlier_one_on_the_same_key() {
        let hits = [hit("a", 0, 3), hit("a", 1, 2)];
        let d = decide(&hits, &[0, 0], &[FRESH], SEC);
        assert!(!d.outcome.admitted);
        assert_eq!(
            d.outcome
                .hits
                .iter()
                .map(|h| h.admitted)
                .collect::<Vec<_>>(),
            [true, false]
        );
        assert_eq!(d.writes, [Write::Keep]);
    }

    #[test]
    fn admitted_hits_report_the_final_state_of_their_key() {
        let hits = [hit("a", 0, 1), hit("a", 1, 2)];
        let d = decide(&hits, &[0, 0], &[FRESH], SEC);
        assert!(d.outcome.admitted);
        assert!(d.outcome.hits.iter().all(|h| h.remaining == 1));
        assert_eq!(d.writes, [Write::Store(SEC + 3 * SEC / 4)]);
    }

    #[test]
    fn a_refund_to_empty_removes_the_key() {
        let mut back = hit("a", 0, 9);
        back.refund = true;
        let d = decide(&[back], &[0], &[SEC + 1], SEC);
        assert_eq!(d.writes, [Write::Remove]);
        assert_eq!(d.outcome.hits[0].remaining, 4);
    }
}
