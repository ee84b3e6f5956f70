//! Who reports each shared state, and how much they ask: the members among which a rule's
//! rate is split (see [`super::share`]).
//!
//! A member is one bucket of one stream; members are grouped by the state key of the limit
//! they charge, so buckets that share a state (several Envoys, or several values of a
//! `share_threshold` pattern) share one rate. Each state has a generation, bumped when a
//! member joins or leaves, so that the others rebalance at their next timer tick instead of
//! their next report. This replica sees only its own streams. One lock, never held across an
//! `.await`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::share;

/// One bucket of one stream: (stream id, bucket serial within the stream).
pub(crate) type MemberId = (u64, u64);

#[derive(Debug, Default)]
struct Members {
    demands: HashMap<MemberId, Option<u64>>,
    generation: u64,
}

/// The members of every shared state.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    states: Mutex<HashMap<Arc<[u8]>, Members>>,
}

impl Registry {
    /// Records `member`'s demand on `state` (`None`: not measured yet; a measured demand is
    /// kept until a new one comes) and returns its fair share of `total`, with the state's
    /// generation.
    pub(crate) fn share(
        &self,
        state: &Arc<[u8]>,
        member: MemberId,
        demand: Option<u64>,
        total: u64,
    ) -> (u64, u64) {
        let mut states = self.states.lock();
        let members = states.entry(state.clone()).or_default();
        if !members.demands.contains_key(&member) {
            members.generation += 1;
        }
        let slot = members.demands.entry(member).or_insert(None);
        if demand.is_some() {
            *slot = demand;
        }
        let mut ids: Vec<MemberId> = members.demands.keys().copied().collect();
        ids.sort_unstable();
        let demands: Vec<Option<u64>> = ids.iter().map(|id| members.demands[id]).collect();
        let rates = share::fair_rates(total, &demands);
        let rate = ids
            .iter()
            .position(|id| *id == member)
            .and_then(|i| rates.get(i).copied())
            .unwrap_or(0);
        (rate, members.generation)
    }

    /// The generation of `state` (0 when nobody is on it).
    pub(crate) fn generation(&self, state: &Arc<[u8]>) -> u64 {
        self.states.lock().get(state).map_or(0, |m| m.generation)
    }

    /// Forgets `member` on `state`.
    pub(crate) fn leave(&self, state: &Arc<[u8]>, member: MemberId) {
        let mut states = self.states.lock();
        if let Some(members) = states.get_mut(state) {
            if members.demands.remove(&member).is_some() {
                members.generation += 1;
            }
            if members.demands.is_empty() {
                states.remove(state);
            }
        }
    }

    /// Shared states with at least one member.
    #[cfg(test)]
    pub(crate) fn states(&self) -> usize {
        self.states.lock().len()
    }

    /// Members on all states.
    pub(crate) fn members(&self) -> usize {
        self.states.lock().values().map(|m| m.demands.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rlqs::share::NANOS;

    #[test]
    fn members_come_and_go() {
        let r = Registry::default();
        let s: Arc<[u8]> = Arc::from(&b"k"[..]);
        assert_eq!(r.share(&s, (1, 0), None, 10 * NANOS), (10 * NANOS, 1));
        assert_eq!(r.share(&s, (2, 0), None, 10 * NANOS), (5 * NANOS, 2));
        // A measured small demand leaves the rest to the other member.
        assert_eq!(r.share(&s, (2, 0), Some(NANOS), 10 * NANOS).0, 2 * NANOS);
        assert_eq!(r.share(&s, (1, 0), None, 10 * NANOS), (8 * NANOS, 2));
        assert_eq!((r.states(), r.members()), (1, 2));
        r.leave(&s, (2, 0));
        assert_eq!(r.generation(&s), 3);
        assert_eq!(r.share(&s, (1, 0), None, 10 * NANOS).0, 10 * NANOS);
        r.leave(&s, (1, 0));
        assert_eq!((r.states(), r.members(), r.generation(&s)), (0, 0, 0));
    }
}
