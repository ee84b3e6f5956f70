//! One batch decided against a snapshot of its keys' states, as a pure function: evaluate every
//! hit (seeing earlier hits of the batch on the same key), plan (all or nothing), commit from the
//! original states, report. The caller reads the states from the map and writes the result
//! back in place. Tentative states are only copied for a key that a later hit of the batch
//! reads, so a large state (a sliding log) is not copied on the common path. Batches of up to
//! [`INLINE`] hits decide without allocating scratch space.

use std::collections::HashMap;

use ahash::RandomState;
use smallvec::SmallVec;

use crate::limiter::algorithm::{Algo, State};
use crate::limiter::{BatchOutcome, Hit, HitOutcome, plan};

/// Batches of up to this many hits keep their scratch space on the stack.
pub(super) const INLINE: usize = 16;

/// Per-batch scratch space: one element per hit or per key slot.
pub(super) type Scratch<T> = SmallVec<[T; INLINE]>;

/// Tentative states of the keys a batch hits more than once (rare, so kept short inline).
type Overlay = SmallVec<[Option<State>; 4]>;

/// Above this many hits, distinct keys are found with a hash map instead of a linear scan.
const LINEAR_SCAN_MAX: usize = 16;

/// The distinct states of a batch, in order of first appearance: one per key and algorithm
/// (state keys name their algorithm, so in practice one per key).
pub(super) struct Slots<'a> {
    /// One per distinct state: the first hit on it.
    pub(super) first: Scratch<&'a Hit>,
    /// Per hit: the index of its key in `first`.
    pub(super) of_hit: Scratch<usize>,
}

impl<'a> Slots<'a> {
    #[inline]
    pub(super) fn new(hits: &'a [Hit]) -> Slots<'a> {
        let mut slots = Slots {
            first: Scratch::new(),
            of_hit: Scratch::with_capacity(hits.len()),
        };
        if hits.len() <= LINEAR_SCAN_MAX {
            for hit in hits {
                let found = slots.first.iter().position(|h| same_state(h, hit));
                slots.push(hit, found);
            }
        } else {
            let mut seen = HashMap::with_capacity_and_hasher(hits.len(), RandomState::new());
            for hit in hits {
                let next = slots.first.len();
                let slot = *seen.entry((&*hit.key, hit.limit.algorithm)).or_insert(next);
                slots.push(hit, (slot != next).then_some(slot));
            }
        }
        slots
    }

    #[inline]
    fn push(&mut self, hit: &'a Hit, found: Option<usize>) {
        let slot = found.unwrap_or_else(|| {
            self.first.push(hit);
            self.first.len() - 1
        });
        self.of_hit.push(slot);
    }
}

/// Whether two hits are on one state: the same key, and the same algorithm.
#[inline]
fn same_state(a: &Hit, b: &Hit) -> bool {
    a.limit.algorithm == b.limit.algorithm && a.key == b.key
}

/// What to do with one key's state after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    /// No hit changed it: put the original back as it was.
    Keep,
    /// Fresh after commit: forget it.
    Remove,
    /// Store the committed state, which becomes fresh at this time.
    Store(u64),
}

/// Decides a batch: `of_hit[i]` is the slot of `hits[i]`, `states[s]` the state of slot `s`,
/// `blocks[s]` until when its key is in the penalty box (0: not; an empty slice when no hit
/// of the batch has `block_for`). On return, `states` holds the committed states (those a
/// [`Write::Keep`] leaves untouched), `blocks` the penalty boxes after the batch, and `writes`
/// one write per slot.
///
/// A hit whose limit has `block_for` and whose key is blocked at `now` is denied without
/// asking its algorithm (its wait: to the end of the block, or longer if its algorithm says
/// so); a hit its algorithm denies puts its key in the box for `block_for` from `now`. A hit
/// denied by a block does not start a new one: only a denial after the block does. (Scratch space is filled in place, never returned: moving a
/// `SmallVec` copies its whole inline buffer.)
pub(super) fn decide(
    hits: &[Hit],
    of_hit: &[usize],
    states: &mut [State],
    blocks: &mut [u64],
    now: u64,
    writes: &mut Scratch<Write>,
) -> BatchOutcome {
    let mut reports = Scratch::new();
    evaluate(hits, of_hit, states, blocks, now, &mut reports);
    let mut admitted: Scratch<bool> = Scratch::new();
    admitted.extend(reports.iter().map(Option::is_none));
    let plan = plan::plan(hits, &admitted);
    let mut changed: Scratch<bool> = Scratch::new();
    changed.resize(states.len(), false);
    commit(hits, of_hit, states, &plan.consume, now, &mut changed);
    for ((hit, &slot), report) in hits.iter().zip(of_hit).zip(&mut reports) {
        if report.is_none() {
            *report = Some(admitted_report(hit, states.get(slot), now));
        }
    }
    let mut outcomes = Vec::with_capacity(hits.len());
    outcomes.extend(reports.iter().flatten());
    plan_writes(hits, of_hit, states, &changed, now, writes);
    BatchOutcome {
        hits: outcomes,
        admitted: plan.admitted,
    }
}

/// Takes a hit's cost (or gives it back, for a refund).
fn apply(hit: &Hit, algo: &Algo, state: &mut State, now: u64) {
    if let Some(id) = hit.hold {
        algo.apply_id(state, now, hit.cost, id.get(), hit.refund);
    } else if hit.refund {
        algo.give_back(state, now, hit.cost);
    } else {
        algo.take(state, now, hit.cost);
    }
}

/// Evaluates hits in order; a hit sees the tentative effect of the earlier hits on its key
/// (those admitted, and those charged always). Pushes to `reports` the report of each denied
/// hit (from the state it was evaluated against) and `None` for each admitted one.
#[inline]
fn evaluate(
    hits: &[Hit],
    of_hit: &[usize],
    states: &[State],
    blocks: &mut [u64],
    now: u64,
    reports: &mut Scratch<Option<HitOutcome>>,
) {
    // Only a batch with several hits on one key needs to count uses and keep tentative
    // states; others leave both empty (read as "no later use", "no tentative state").
    let repeats = of_hit.len() > states.len();
    let slots = if repeats { states.len() } else { 0 };
    let mut uses_left: Scratch<usize> = Scratch::new();
    uses_left.resize(slots, 0);
    for &slot in of_hit.iter().filter(|_| repeats) {
        if let Some(n) = uses_left.get_mut(slot) {
            *n += 1;
        }
    }
    // A slot's tentative state, materialised only when a later hit will read it.
    let mut overlay = Overlay::new();
    overlay.resize(slots, None);
    let fresh = State::Fresh;
    for (hit, &slot) in hits.iter().zip(of_hit) {
        let algo = Algo::of(&hit.limit);
        let later = uses_left.get_mut(slot).map_or(0, |n| {
            *n = n.saturating_sub(1);
            *n
        });
        let current = match overlay.get(slot) {
            Some(Some(tentative)) => tentative,
            _ => states.get(slot).unwrap_or(&fresh),
        };
        let boxed = if hit.limit.block_nanos > 0 && !hit.refund {
            blocks.get_mut(slot)
        } else {
            None
        };
        let report = match boxed {
            None => {
                let admitted = hit.refund || algo.admits(current, now, hit.cost);
                (!admitted).then(|| denied(algo.until_admitted(current, now, hit.cost)))
            }
            Some(until) => penalty(hit, &algo, current, until, now),
        };
        let admitted = report.is_none();
        reports.push(report);
        if later > 0 && (admitted || hit.limit.takes_when_denied()) {
            let mut next = current.clone();
            apply(hit, &algo, &mut next, now);
            if let Some(o) = overlay.get_mut(slot) {
                *o = Some(next);
            }
        }
    }
}

/// A denied hit's outcome, admitted after `wait`.
fn denied(wait: u64) -> HitOutcome {
    HitOutcome {
        admitted: false,
        remaining: 0,
        reset_nanos: wait,
        from_local_cache: false,
    }
}

/// The verdict on a hit whose limit has `block_for`, its key blocked `until` (0: never
/// blocked): denied while the block lasts; after it, its algorithm decides, and a denial
/// blocks the key for `block_for` from `now`. The wait reported is the time to the block's
/// end (when the algorithm still denies then, that denial starts a new block), so that a
/// deny cache holding the answer until then never outlives the block.
fn penalty(hit: &Hit, algo: &Algo, state: &State, until: &mut u64, now: u64) -> Option<HitOutcome> {
    if *until > now {
        return Some(denied(*until - now));
    }
    if algo.admits(state, now, hit.cost) {
        return None;
    }
    *until = now.saturating_add(hit.limit.block_nanos);
    Some(denied(hit.limit.block_nanos))
}

/// Applies the planned hits to the original states, in batch order, and keeps the pending
/// denial of each hit that does not consume and keeps denials (see [`Algo::deny`]; a hit
/// naming its hold keeps none: its release names it too); marks in
/// `changed` the slots a cost (not a check-only 0) was applied to.
fn commit(
    hits: &[Hit],
    of_hit: &[usize],
    states: &mut [State],
    consume: &[bool],
    now: u64,
    changed: &mut [bool],
) {
    for ((hit, &slot), &go) in hits.iter().zip(of_hit).zip(consume) {
        let denial = !go && !hit.refund && hit.limit.keeps_denials() && hit.hold.is_none();
        if !(go || denial) || hit.cost == 0 {
            continue;
        }
        if let (Some(state), Some(flag)) = (states.get_mut(slot), changed.get_mut(slot)) {
            let algo = Algo::of(&hit.limit);
            if go {
                apply(hit, &algo, state, now);
            } else {
                algo.deny(state, now, hit.cost);
            }
            *flag = true;
        }
    }
}

/// An admitted hit's outcome, from its key's committed state.
fn admitted_report(hit: &Hit, state: Option<&State>, now: u64) -> HitOutcome {
    let algo = Algo::of(&hit.limit);
    let state = state.unwrap_or(&State::Fresh);
    HitOutcome {
        admitted: true,
        remaining: algo.remaining(state, now),
        reset_nanos: algo.reset_after(state, now),
        from_local_cache: false,
    }
}

/// One write per slot: keep what no cost touched; store the rest until it is fresh (by the
/// limit of the slot's first hit), or remove it when it already is.
fn plan_writes(
    hits: &[Hit],
    of_hit: &[usize],
    states: &[State],
    changed: &[bool],
    now: u64,
    writes: &mut Scratch<Write>,
) {
    let mut first_hit: Scratch<Option<&Hit>> = Scratch::new();
    first_hit.resize(states.len(), None);
    for (hit, &slot) in hits.iter().zip(of_hit) {
        if let Some(first @ None) = first_hit.get_mut(slot) {
            *first = Some(hit);
        }
    }
    let each =
        states
            .iter()
            .zip(changed)
            .zip(first_hit)
            .map(|((state, &changed), hit)| match hit {
                _ if !changed => Write::Keep,
                Some(hit) => match Algo::of(&hit.limit).fresh_at(state, now) {
                    Some(at) => Write::Store(at),
                    None => Write::Remove,
                },
                None => Write::Remove,
            });
    writes.extend(each);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::Charge;
    use crate::limiter::Role;

    const SEC: u64 = 1_000_000_000;

    struct Decided {
        outcome: BatchOutcome,
        writes: Scratch<Write>,
    }

    fn decide_all(hits: &[Hit], of_hit: &[usize], states: &mut [State], now: u64) -> Decided {
        let mut writes = Scratch::new();
        let outcome = decide(hits, of_hit, states, &mut [], now, &mut writes);
        Decided { outcome, writes }
    }

    fn hit(key: &str, group: usize, cost: u64) -> Hit {
        Hit {
            cost,
            ..crate::limiter::funnel_hit(key, group, Role::Enforced, Charge::Admitted, 4, SEC)
        }
    }

    #[test]
    fn slots_group_equal_keys_with_either_strategy() {
        for n in [3, 40] {
            let hits: Vec<Hit> = (0..n).map(|i| hit(["a", "b", "a"][i % 3], i, 1)).collect();
            let slots = Slots::new(&hits);
            assert_eq!(slots.first.len(), 2);
            let want: Vec<usize> = (0..n).map(|i| [0, 1, 0][i % 3]).collect();
            assert_eq!(slots.of_hit.as_slice(), want);
        }
    }

    #[test]
    fn a_later_hit_sees_an_earlier_one_on_the_same_key() {
        let hits = [hit("a", 0, 3), hit("a", 1, 2)];
        let d = decide_all(&hits, &[0, 0], &mut [State::Fresh], SEC);
        assert!(!d.outcome.admitted);
        assert_eq!(
            d.outcome
                .hits
                .iter()
                .map(|h| h.admitted)
                .collect::<Vec<_>>(),
            [true, false]
        );
        assert_eq!(d.writes.as_slice(), [Write::Keep]);
    }

    #[test]
    fn admitted_hits_report_the_final_state_of_their_key() {
        let hits = [hit("a", 0, 1), hit("a", 1, 2)];
        let mut states = [State::Fresh];
        let d = decide_all(&hits, &[0, 0], &mut states, SEC);
        assert!(d.outcome.admitted);
        assert!(d.outcome.hits.iter().all(|h| h.remaining == 1));
        assert_eq!(d.writes.as_slice(), [Write::Store(SEC + 3 * SEC / 4)]);
        let tat = crate::limiter::funnel::Tat {
            tat: SEC + 3 * SEC / 4,
            quota: 4,
            refundable: 3,
        };
        assert_eq!(states, [State::Funnel(tat)]);
    }

    #[test]
    fn a_refund_to_empty_removes_the_key() {
        let mut back = hit("a", 0, 9);
        back.refund = true;
        let tat = crate::limiter::funnel::Tat {
            tat: SEC + 1,
            quota: 4,
            refundable: 1,
        };
        let d = decide_all(&[back], &[0], &mut [State::Funnel(tat)], SEC);
        assert_eq!(d.writes.as_slice(), [Write::Remove]);
        assert_eq!(d.outcome.hits[0].remaining, 4);
    }
}
