//! Redis Cluster: one script call per slot, all or nothing across them.
//!
//! A script call may only touch keys of one slot. A descriptor's keys share a hash tag (its
//! descriptor part), so they always share a slot; different descriptors may not. So:
//!
//! 1. the request's hits are grouped by the slot of their key;
//! 2. with one group, it is one ordinary call (`request` mode), exactly as on one server;
//! 3. with several, every group is called concurrently in `independent` mode: each
//!    descriptor consumes when all its limits admit, whatever the other descriptors do;
//! 4. the request is then planned whole ([`plan::plan`]) from every hit's verdict, and what
//!    was taken but must not have been (the request is denied) is given back by one call per
//!    slot group concerned; those hits report the state after the give-back.
//!
//! Between steps 3 and 4 other requests can see the tentative consumption: a request that
//! ends up denied may, for a round trip, make another one look fuller than it is. That errs
//! on the side of denying, never of admitting more than the limit.
//!
//! Each slot group's call goes to its slot's master and follows the Cluster from there
//! (`super::redirect`); a group that fails fails the request (after the give-back), and counts
//! against its own master's breaker only.

use std::collections::HashMap;

use futures_util::future::join_all;
use redis::RedisError;

use super::script::Mode;
use super::{Call, RedisLimiter, slots};
use crate::config::model::{Algorithm, Charge};
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, plan};

/// The outcome of a hit whose slot group failed.
const UNKNOWN: HitOutcome = HitOutcome {
    admitted: false,
    remaining: 0,
    reset_nanos: 0,
    from_local_cache: false,
};

/// One slot's hits as their own script call, each hit decided on its own.
async fn independent(
    limiter: &RedisLimiter,
    hits: Vec<Hit>,
    call: Call,
) -> Result<BatchOutcome, RedisError> {
    let call = Call {
        mode: Mode::Independent,
        ..call
    };
    limiter.submit(hits, call).await
}

/// The Cluster slot of a key (with the prefix, which holds no `{`, in front).
pub(super) fn slot(prefix: &[u8], key: &[u8]) -> u16 {
    slots::prefixed_slot(prefix, key)
}

/// Decides `batch` on a Cluster (`call` in `Request` mode).
pub(super) async fn check(
    limiter: &RedisLimiter,
    batch: &Batch,
    call: Call,
) -> Result<BatchOutcome, RedisError> {
    let groups = by_slot(limiter.prefix(), &batch.hits);
    if groups.len() <= 1 {
        return limiter.submit(batch.hits.clone(), call).await;
    }
    let calls = groups.iter().map(|indices| {
        let hits: Vec<Hit> = indices
            .iter()
            .filter_map(|&i| batch.hits.get(i).cloned())
            .collect();
        independent(limiter, hits, call)
    });
    let results = join_all(calls).await;
    let mut outcome = BatchOutcome {
        hits: vec![UNKNOWN; batch.hits.len()],
        admitted: false,
    };
    let mut failed = None;
    for (indices, result) in groups.iter().zip(results) {
        match result {
            Ok(part) => scatter(&mut outcome, indices, part),
            Err(e) => failed = Some(e),
        }
    }
    let verdicts: Vec<bool> = outcome.hits.iter().map(|h| h.admitted).collect();
    let planned = plan::plan(&batch.hits, &verdicts);
    outcome.admitted = planned.admitted && failed.is_none();
    let undo = to_undo(batch, &verdicts, outcome.admitted);
    give_back(limiter, batch, &groups, &undo, &mut outcome, call).await?;
    match failed {
        Some(e) => Err(e),
        None => Ok(outcome),
    }
}

/// Hit indices grouped by the Cluster slot of their prefixed key, in order of first slot.
pub(super) fn by_slot(prefix: &[u8], hits: &[Hit]) -> Vec<Vec<usize>> {
    let mut order: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<u16, usize> = HashMap::new();
    for (i, hit) in hits.iter().enumerate() {
        let slot = slot(prefix, &hit.key);
        let next = order.len();
        let at = *index.entry(slot).or_insert(next);
        if at == next {
            order.push(Vec::new());
        }
        if let Some(group) = order.get_mut(at) {
            group.push(i);
        }
    }
    order
}

fn scatter(outcome: &mut BatchOutcome, indices: &[usize], part: BatchOutcome) {
    for (&i, hit) in indices.iter().zip(part.hits) {
        if let Some(slot) = outcome.hits.get_mut(i) {
            *slot = hit;
        }
    }
}

/// Per hit: it was applied in `independent` mode but must not have been (the request is
/// denied, and it is not `charge: always`). A `concurrency` hold is kept: undone by a
/// release, it would consume another request's pending denial first, and the request's own
/// release is still to come (Envoy sends it for denied requests too); kept, it counts as held
/// until that release frees it, which only ever admits less (docs/holds.md).
fn to_undo(batch: &Batch, verdicts: &[bool], request_ok: bool) -> Vec<bool> {
    let mut group_ok: HashMap<usize, bool> = HashMap::new();
    for (hit, &ok) in batch.hits.iter().zip(verdicts) {
        *group_ok.entry(hit.group).or_insert(true) &= ok;
    }
    batch
        .hits
        .iter()
        .map(|h| {
            let applied = h.cost > 0 && group_ok.get(&h.group).copied().unwrap_or(false);
            !request_ok
                && applied
                && h.limit.charge != Charge::Always
                && h.limit.algorithm != Algorithm::Concurrency
        })
        .collect()
}

/// Undoes what `undo` marks, one call per slot group concerned (concurrently); those hits
/// then report the state after the undo.
async fn give_back(
    limiter: &RedisLimiter,
    batch: &Batch,
    groups: &[Vec<usize>],
    undo: &[bool],
    outcome: &mut BatchOutcome,
    call: Call,
) -> Result<(), RedisError> {
    let todo: Vec<Vec<usize>> = groups
        .iter()
        .map(|g| {
            g.iter()
                .copied()
                .filter(|&i| undo.get(i) == Some(&true))
                .collect::<Vec<_>>()
        })
        .filter(|g| !g.is_empty())
        .collect();
    let calls = todo.iter().map(|indices| {
        let hits: Vec<Hit> = indices
            .iter()
            .filter_map(|&i| batch.hits.get(i))
            .map(|h| Hit {
                refund: !h.refund,
                ..h.clone()
            })
            .collect();
        independent(limiter, hits, call)
    });
    for (indices, result) in todo.iter().zip(join_all(calls).await) {
        let mut part = result?;
        for hit in &mut part.hits {
            // Reported as part of a denied request: admitted by its own limit, nothing taken.
            hit.admitted = true;
        }
        scatter(outcome, indices, part);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Role;

    fn hit(key: &str, group: usize, charge: Charge) -> Hit {
        crate::limiter::funnel_hit(key, group, Role::Enforced, charge, 1, 1)
    }

    #[test]
    fn one_descriptor_stays_in_one_slot() {
        let hits = [
            hit("{d|a=1}:funnel:1", 0, Charge::Admitted),
            hit("{d|b=2}:funnel:1", 1, Charge::Admitted),
            hit("{d|a=1}:funnel:60", 0, Charge::Admitted),
        ];
        let groups = by_slot(b"sluice:", &hits);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0], [0, 2]);
    }

    #[test]
    fn undo_only_admitted_descriptors_of_a_denied_request() {
        let batch = Batch {
            hits: vec![
                hit("a", 0, Charge::Admitted),
                hit("a2", 0, Charge::Always),
                hit("b", 1, Charge::Admitted),
            ],
        };
        assert_eq!(
            to_undo(&batch, &[true, true, false], false),
            [true, false, false]
        );
        assert_eq!(
            to_undo(&batch, &[true, true, true], true),
            [false, false, false]
        );
    }
}
