//! Reservations (the Throttle API's Reserve and Commit): an estimate charged to a key's limit
//! now, under an id, and settled later to the amount really used. Each call is one atomic
//! operation of the backend on two things: the key's rate state (any rate algorithm, through
//! an ordinary [`Batch`]) and the key's open reservations, kept beside it under
//! [`records_key`]. docs/holds.md has the semantics and why they are so.
//!
//! - **Reserve** runs its batch (the amount, all or nothing, `charge: admitted`); when it is
//!   admitted, the take is named ([`Algo::name_take`](super::algorithm::Algo::name_take)) and a
//!   record `(id, amount, now + ttl, mark)` is opened, the mark saying where the amount was
//!   counted. A refused reserve leaves nothing.
//! - **Commit** closes the live record with that id. Below the estimate, it returns
//!   `estimate - actual` by name
//!   ([`Algo::give_back_named`](super::algorithm::Algo::give_back_named)): only what still
//!   counts of the reservation's units comes back, and [`settle`]'s hit is then a refund of 0
//!   (a report). Above it, [`settle`]'s hit charges `actual - estimate` with `charge: always`
//!   (owed: it is charged even over the limit, as debt, within the algorithm's debt bound).
//!   With no such record (unknown, already committed, or expired) it charges nothing: the hit
//!   is a check.
//!   A check ([`check_after`]) follows in the same call, to report what the key holds.
//! - **Expiry** drops a record and keeps its estimate charged.

use std::sync::Arc;

use super::{Batch, BatchOutcome, Hit, Role};
use crate::config::model::Charge;

/// The most reservations open at once on one key: a reserve beyond it is refused, whatever
/// the limit says (records are dropped when they expire or are committed).
pub(crate) const MAX_OPEN: usize = 1000;

/// What to do.
#[derive(Debug, Clone)]
pub enum ReserveOp {
    /// Run `batch` (its first hit takes the amount); when the batch is admitted, open a
    /// reservation of `amount` leased for the request's ttl.
    Reserve { batch: Batch, amount: u64 },
    /// Settle the open reservation `id` to `actual`; `hit` names the key and its limit (its
    /// cost and refund are set by [`settle`]).
    Commit { id: u64, actual: u64, hit: Hit },
}

/// One operation on a key's reservations.
#[derive(Debug, Clone)]
pub struct ReserveRequest {
    /// Where the key's open reservations are kept ([`records_key`] of its state key).
    pub records: Arc<[u8]>,
    /// How long a reservation stays open (nanoseconds, at least 1).
    pub ttl_nanos: u64,
    pub op: ReserveOp,
}

/// The answer to a [`ReserveRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveOutcome {
    /// Reserve: admitted and opened; commit: the reservation was open and is now settled.
    pub done: bool,
    /// Reserve, when done: the reservation's id (the backend's, from 0).
    pub id: u64,
    /// Commit, when done: the reservation's estimate.
    pub estimate: u64,
    /// Reservations open on the key after the call.
    pub open: u64,
    /// The batch's outcome; commit: two hits, the settling hit's and [`check_after`]'s, the
    /// verdict the settling hit's. `None` when a reserve was refused because [`MAX_OPEN`]
    /// reservations are open on the key (then nothing ran).
    pub outcome: Option<BatchOutcome>,
}

/// The key of a state key's open reservations: the state key and `:reservations` (the same
/// Redis Cluster hash tag, so the same slot).
pub fn records_key(state_key: &[u8]) -> Arc<[u8]> {
    [state_key, b":reservations"].concat().into()
}

/// The hit that settles a reservation of `estimate` to `actual` on `template`'s key: a
/// refund of the difference, a charge of it that is owed (`charge: always`), or a check (cost
/// 0) when they are equal or nothing is settled (`estimate` `None`).
pub fn settle(template: &Hit, estimate: Option<u64>, actual: u64) -> Hit {
    let mut hit = template.clone();
    hit.role = Role::Enforced;
    hit.limit.charge = Charge::Always;
    hit.limit.borrow = false;
    let (cost, refund) = match estimate {
        Some(e) if actual < e => (e - actual, true),
        Some(e) => (actual - e, false),
        None => (0, false),
    };
    hit.cost = cost;
    hit.refund = refund;
    hit
}

/// The check (cost 0) run after a commit's settling hit, in the same atomic call: what the
/// key holds after it (denied while the key is in debt, with the wait until it is paid).
pub(crate) fn check_after(template: &Hit) -> Hit {
    let mut hit = template.clone();
    hit.role = Role::Enforced;
    hit.limit.charge = Charge::Admitted;
    hit.limit.borrow = false;
    hit.cost = 0;
    hit.refund = false;
    hit
}

/// One key's open reservations, in the memory backend (the Redis script keeps the same in a
/// hash, see `redis/lua/reserve.lua`).
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// The next id to hand out (a fresh key counts on from the time in microseconds).
    pub next_id: u64,
    /// The open reservations, in the order opened.
    pub open: Vec<Record>,
}

/// One open reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub id: u64,
    /// The estimate charged.
    pub amount: u64,
    /// When it expires (its estimate then stays charged).
    pub expiry: u64,
    /// Where the amount was counted ([`Algo::name_take`](super::algorithm::Algo::name_take)):
    /// what a commit's return by name needs.
    pub mark: u64,
}

impl Records {
    /// Drops the records expired at `now`.
    pub fn expire(&mut self, now: u64) {
        self.open.retain(|r| r.expiry > now);
    }

    /// Opens a record of `amount` counted at `mark`, expiring at `expiry`; returns its id.
    pub fn open(&mut self, now: u64, amount: u64, expiry: u64, mark: u64) -> u64 {
        let id = self.next_id.max(now / 1_000);
        self.next_id = id.saturating_add(1);
        self.open.push(Record {
            id,
            amount,
            expiry,
            mark,
        });
        id
    }

    /// Closes the live record `id` (call [`Records::expire`] first); returns it.
    pub fn close(&mut self, id: u64) -> Option<Record> {
        let at = self.open.iter().position(|r| r.id == id)?;
        Some(self.open.remove(at))
    }

    /// Whether no reservation is open (the key can be forgotten, its next id with it).
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::Algorithm;
    use crate::limiter::LimitParams;

    fn template() -> Hit {
        Hit {
            key: Arc::from(&b"k"[..]),
            limit: LimitParams {
                algorithm: Algorithm::Funnel,
                quota: 10,
                period_nanos: 1_000,
                burst: 10,
                charge: Charge::Admitted,
                borrow: false,
                block_nanos: 0,
                global: false,
                calendar: None,
            },
            cost: 7,
            refund: false,
            hold: None,
            group: 0,
            role: Role::Shadow,
        }
    }

    #[test]
    fn a_settlement_gives_back_or_owes_the_difference() {
        let below = settle(&template(), Some(10), 3);
        assert_eq!((below.cost, below.refund), (7, true));
        let above = settle(&template(), Some(10), 14);
        assert_eq!(
            (above.cost, above.refund, above.limit.charge),
            (4, false, Charge::Always)
        );
        assert_eq!(above.role, Role::Enforced);
        let unknown = settle(&template(), None, 14);
        assert_eq!((unknown.cost, unknown.refund), (0, false));
    }

    #[test]
    fn records_open_close_once_and_expire() {
        let mut r = Records::default();
        let a = r.open(5_000_000, 4, 10, 7);
        let b = r.open(5_000_000, 6, 20, 8);
        assert_eq!((a, b), (5_000, 5_001));
        assert_eq!(r.close(a).map(|r| (r.amount, r.mark)), Some((4, 7)));
        assert_eq!(r.close(a), None);
        r.expire(20);
        assert_eq!(r.close(b), None);
        assert!(r.is_empty());
    }
}
