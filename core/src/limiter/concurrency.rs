//! Concurrency: holds on Q slots, each leased for P, as pure integer functions.
//!
//! A key keeps two lists of records, each record a count with an expiry (and an id, which
//! the holds the Throttle API names will use): the **admitted holds**, and the **pending
//! denials**, the cost of denied requests whose release (Envoy's stream-done refund, sent
//! for denied requests too) has not come yet. A record counts until its expiry, taken at
//! `now + P` when it is made; then it is gone (a lost release frees its slot after one lease).
//!
//! - A cost `c` is admitted when the live admitted holds plus `c` are at most Q; an admitted
//!   request adds a hold of `c` ([`Concurrency::take`]), a denied one a pending denial of `c`
//!   ([`Concurrency::deny`]) when its limit keeps them (`charge: always`, the default of the
//!   rules for this algorithm).
//! - A release of `c` ([`Concurrency::give_back`]) first consumes pending denials, then
//!   admitted holds, earliest expiry first in each list, and never more than is held.
//!
//! So the number of releases credited to admitted holds never exceeds the releases that came
//! from admitted requests, and the admitted holds counted are never fewer than the requests
//! really in flight (for releases credited within their hold's lease): docs/holds.md proves
//! it and says what it costs (under steady denials, a release stays parked in the pending
//! denials until they drain or the hold's lease ends).
//!
//! A hold a request names (a rule's `hold_id`: Envoy's `x-request-id`) is an admitted record
//! under the id's hash ([`hold_id`], at least [`BY_ID`]): [`Concurrency::take_id`] makes it (or
//! adds to it), a denied request makes nothing, and [`Concurrency::give_back_id`] frees only
//! it; anonymous releases pass over it. With every request naming its hold, the holds counted
//! are exactly the admitted requests in flight (docs/holds.md, "By request id").
//!
//! Records are kept in expiry order; a record is made at `max(now + P, newest expiry)` (a
//! clock that went back never reorders them: a hold then lasts a little longer), merged into
//! the newest record when that has the same expiry. Admitted holds are at most Q records (each
//! holds at least 1); pending denials are at most [`MAX_RECORDS`]: a full list merges a new
//! denial into its newest record (it then counts longer: this only ever keeps more). A zero
//! quota admits nothing with a cost and keeps no admitted hold.
//!
//! ```
//! use sluice_core::limiter::concurrency::{Concurrency, Holds};
//! const SEC: u64 = 1_000_000_000;
//! // 2 slots, leased for 10 s.
//! let c = Concurrency::new(2, 10 * SEC);
//! let mut h = Holds::default();
//! c.take(&mut h, 0, 1);
//! c.take(&mut h, SEC, 1);
//! assert!(!c.admits(&h, 2 * SEC, 1));
//! c.deny(&mut h, 2 * SEC, 1);
//! c.give_back(&mut h, 3 * SEC, 1); // the denied request's release: frees nothing
//! assert_eq!(c.held(&h, 3 * SEC), 2);
//! c.give_back(&mut h, 3 * SEC, 1); // an admitted one's
//! assert_eq!(c.held(&h, 3 * SEC), 1);
//! assert_eq!(c.held(&h, 11 * SEC), 0, "a lost release frees its slot after one lease");
//! ```

use std::collections::VecDeque;

/// The most records of pending denials a key keeps (and the cap on slots).
pub(crate) const MAX_RECORDS: u32 = crate::config::model::SLIDING_LOG_MAX_QUOTA;

/// The ids of holds named by a request (`hold_id`, docs/holds.md) are in
/// `[BY_ID, 2 * BY_ID)`: above every id a key counts out itself (from 0, or from the time in
/// microseconds, below 2^52 until the year 2112), and exact as the script's numbers (2^53).
pub const BY_ID: u64 = 1 << 52;

/// The most bytes of a request's hold id (`hold_id`): a longer one is refused.
pub const MAX_HOLD_ID_BYTES: usize = 256;

/// The record id of a hold a request names with `request_id` (its `hold_id` entry's value):
/// 52 bits of a fixed 64-bit hash (FNV-1a, then a mix), in `[BY_ID, 2 * BY_ID)`. The same on
/// every replica and backend (the Redis script is sent the number). Two ids share a record
/// only when their hashes agree in 52 bits, about one chance in 2^52 per pair of holds live
/// at once on one key.
///
/// ```
/// use sluice_core::limiter::concurrency::{BY_ID, hold_id};
/// let a = hold_id(b"4f1c2e8a-0b1d-4a5e-9c3f-2d7e6b1a9c00");
/// assert!((BY_ID..2 * BY_ID).contains(&a));
/// assert_eq!(a, hold_id(b"4f1c2e8a-0b1d-4a5e-9c3f-2d7e6b1a9c00"));
/// assert_ne!(a, hold_id(b"4f1c2e8a-0b1d-4a5e-9c3f-2d7e6b1a9c01"));
/// ```
pub fn hold_id(request_id: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in request_id {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // A final mix, so that every bit of the id depends on every byte.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    BY_ID | (h & (BY_ID - 1))
}

/// One limit's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    /// Q, the slots. 0 admits nothing with a cost.
    slots: u64,
    /// P, the lease, at least 1.
    lease: u64,
}

/// One record: `count` units until `expiry`, under `id` (unique within its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub id: u64,
    pub expiry: u64,
    pub count: u64,
}

/// A key's admitted holds and pending denials, each in expiry order. It may still hold
/// records that have expired (they are dropped when it next changes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holds {
    admitted: VecDeque<Record>,
    denied: VecDeque<Record>,
    /// The id of the next record.
    next_id: u64,
}

impl Holds {
    /// No records.
    pub const EMPTY: Holds = Holds {
        admitted: VecDeque::new(),
        denied: VecDeque::new(),
        next_id: 0,
    };

    /// The admitted holds, earliest expiry first (expired ones included).
    pub fn admitted(&self) -> impl Iterator<Item = Record> + '_ {
        self.admitted.iter().copied()
    }

    /// The pending denials, earliest expiry first (expired ones included).
    pub fn denied(&self) -> impl Iterator<Item = Record> + '_ {
        self.denied.iter().copied()
    }

    /// Whether it keeps no record at all.
    pub fn is_empty(&self) -> bool {
        self.admitted.is_empty() && self.denied.is_empty()
    }

    /// The id the next record will take (at least).
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The holds of these records, as [`Holds::admitted`], [`Holds::denied`] and
    /// [`Holds::next_id`] gave them (a snapshot's); `None` unless each list is in expiry
    /// order.
    pub(crate) fn from_records(
        admitted: VecDeque<Record>,
        denied: VecDeque<Record>,
        next_id: u64,
    ) -> Option<Holds> {
        let ordered = |l: &VecDeque<Record>| {
            l.iter()
                .zip(l.iter().skip(1))
                .all(|(a, b)| a.expiry <= b.expiry)
        };
        (ordered(&admitted) && ordered(&denied)).then_some(Holds {
            admitted,
            denied,
            next_id,
        })
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.admitted.len() + self.denied.len()
    }
}

impl Concurrency {
    /// `slots` slots, each hold leased for `lease`.
    pub fn new(slots: u32, lease: u64) -> Concurrency {
        Concurrency {
            slots: u64::from(slots),
            lease: lease.max(1),
        }
    }

    /// The live records of a list at `now`.
    fn live(list: &VecDeque<Record>, now: u64) -> impl Iterator<Item = Record> + '_ {
        list.iter().copied().skip_while(move |r| r.expiry <= now)
    }

    fn sum(list: &VecDeque<Record>, now: u64) -> u64 {
        Self::live(list, now).fold(0, |s, r| s.saturating_add(r.count))
    }

    /// The admitted holds live at `now`.
    pub fn held(&self, holds: &Holds, now: u64) -> u64 {
        Self::sum(&holds.admitted, now)
    }

    /// The pending denials live at `now`.
    pub fn pending(&self, holds: &Holds, now: u64) -> u64 {
        Self::sum(&holds.denied, now)
    }

    /// The earliest expiry of a live admitted hold at `now`.
    pub(crate) fn oldest_expiry(&self, holds: &Holds, now: u64) -> Option<u64> {
        Self::live(&holds.admitted, now).next().map(|r| r.expiry)
    }

    fn trim(holds: &mut Holds, now: u64) {
        for list in [&mut holds.admitted, &mut holds.denied] {
            while list.front().is_some_and(|r| r.expiry <= now) {
                list.pop_front();
            }
        }
    }

    /// Whether `cost` at `now` is admitted.
    pub fn admits(&self, holds: &Holds, now: u64, cost: u64) -> bool {
        if self.slots == 0 {
            return cost == 0;
        }
        self.held(holds, now).saturating_add(cost) <= self.slots
    }

    /// Records an admitted hold of `cost` at `now`; its id.
    pub fn take(&self, holds: &mut Holds, now: u64, cost: u64) -> Option<u64> {
        if self.slots == 0 || cost == 0 {
            return None;
        }
        Self::trim(holds, now);
        let cap = usize::try_from(self.slots.min(u64::from(MAX_RECORDS))).unwrap_or(1);
        Some(self.record(holds, now, cost, cap, true))
    }

    /// Records a pending denial of `cost` at `now` (the request was denied; its release is
    /// still to come).
    pub fn deny(&self, holds: &mut Holds, now: u64, cost: u64) {
        if cost == 0 {
            return;
        }
        Self::trim(holds, now);
        let cap = usize::try_from(MAX_RECORDS).unwrap_or(1);
        self.record(holds, now, cost, cap, false);
    }

    fn record(&self, holds: &mut Holds, now: u64, cost: u64, cap: usize, admitted: bool) -> u64 {
        let id = holds.next_id;
        let list = if admitted {
            &mut holds.admitted
        } else {
            &mut holds.denied
        };
        let mut expiry = now.saturating_add(self.lease);
        let full = list.len() >= cap;
        match list.back_mut() {
            // A request's named hold is never merged with others (its id frees exactly it).
            Some(back) if (back.expiry >= expiry && back.id < BY_ID) || full => {
                back.expiry = back.expiry.max(expiry);
                back.count = back.count.saturating_add(cost);
                back.id
            }
            back => {
                expiry = expiry.max(back.map_or(0, |b| b.expiry));
                list.push_back(Record {
                    id,
                    expiry,
                    count: cost,
                });
                holds.next_id = id.wrapping_add(1);
                id
            }
        }
    }

    /// Releases `cost` at `now`: pending denials first, then admitted holds, earliest expiry
    /// first; never more than is held. A hold a request names (see [`hold_id`]) is freed
    /// only by a release naming it ([`Concurrency::give_back_id`]), never by this one.
    pub fn give_back(&self, holds: &mut Holds, now: u64, cost: u64) {
        Self::trim(holds, now);
        let left = release(&mut holds.denied, cost);
        release(&mut holds.admitted, left);
    }

    /// What is left at `now`.
    pub fn remaining(&self, holds: &Holds, now: u64) -> u64 {
        self.slots.saturating_sub(self.held(holds, now))
    }

    /// Nanoseconds until every admitted hold has expired (0 when none is live).
    pub(crate) fn until_free(&self, holds: &Holds, now: u64) -> u64 {
        holds
            .admitted
            .back()
            .map_or(0, |r| r.expiry.saturating_sub(now))
    }

    /// Nanoseconds until the key keeps nothing (every record expired).
    pub fn until_fresh(&self, holds: &Holds, now: u64) -> u64 {
        let last = |l: &VecDeque<Record>| l.back().map_or(0, |r| r.expiry.saturating_sub(now));
        last(&holds.admitted).max(last(&holds.denied))
    }

    /// Nanoseconds until `cost` would be admitted without releases: when enough of the
    /// earliest holds have expired. A cost above the slots and a zero quota get one lease.
    /// Never 0 for a cost that is denied now.
    pub fn until_admitted(&self, holds: &Holds, now: u64, cost: u64) -> u64 {
        if self.slots == 0 || cost > self.slots {
            return self.lease;
        }
        let need = self
            .held(holds, now)
            .saturating_add(cost)
            .saturating_sub(self.slots);
        if need == 0 {
            return 1;
        }
        let mut freed = 0u64;
        for r in Self::live(&holds.admitted, now) {
            freed = freed.saturating_add(r.count);
            if freed >= need {
                return r.expiry.saturating_sub(now).max(1);
            }
        }
        self.lease
    }
}

/// The holds the Throttle API names (docs/holds.md): each acquisition is a record of its
/// own, never merged, so that its id frees exactly it.
impl Concurrency {
    /// Takes `count` at `now` under a new id when it fits; `None` (nothing taken) otherwise.
    /// The record's expiry is at least the newest one's (the list stays in expiry order).
    pub fn acquire(&self, holds: &mut Holds, now: u64, count: u64) -> Option<u64> {
        if count == 0 || !self.admits(holds, now, count) {
            return None;
        }
        Self::trim(holds, now);
        // Ids count on from the time in microseconds, so that a key that went fresh (its
        // records, and its next id, forgotten) does not hand out an id a late holder of an
        // earlier hold still names (unless it took more than one hold per microsecond).
        let id = holds.next_id.max(now / 1000);
        holds.next_id = id.wrapping_add(1);
        self.push_newest(holds, now, id, count);
        Some(id)
    }

    fn push_newest(&self, holds: &mut Holds, now: u64, id: u64, count: u64) {
        let newest = holds.admitted.back().map_or(0, |r| r.expiry);
        let expiry = now.saturating_add(self.lease).max(newest);
        holds.admitted.push_back(Record { id, expiry, count });
    }

    /// Frees the live hold `id` at `now`; whether there was one (else nothing changes).
    pub(crate) fn release_id(&self, holds: &mut Holds, now: u64, id: u64) -> bool {
        Self::trim(holds, now);
        let at = holds.admitted.iter().position(|r| r.id == id);
        at.and_then(|i| holds.admitted.remove(i)).is_some()
    }

    /// Pushes the live hold `id`'s expiry to `now` + the lease (at least the newest expiry);
    /// whether there was one (else nothing changes).
    pub(crate) fn extend_id(&self, holds: &mut Holds, now: u64, id: u64) -> bool {
        Self::trim(holds, now);
        let at = holds.admitted.iter().position(|r| r.id == id);
        match at.and_then(|i| holds.admitted.remove(i)) {
            Some(r) => {
                self.push_newest(holds, now, r.id, r.count);
                true
            }
            None => false,
        }
    }
}

/// Holds named by the request (a rule's `hold_id`, docs/holds.md): an admitted request's
/// hold is a record under its id, a denied one leaves nothing, and a release frees only the
/// hold with its id.
impl Concurrency {
    /// Takes an admitted `cost` at `now` under `id` (see [`hold_id`]): a new record, or, when
    /// `id` is already held, that record with `cost` more, moved to the back with the new
    /// expiry. Its expiry is `now` + the lease, at least the newest one's.
    pub(crate) fn take_id(&self, holds: &mut Holds, now: u64, id: u64, cost: u64) {
        if self.slots == 0 || cost == 0 {
            return;
        }
        Self::trim(holds, now);
        let at = holds.admitted.iter().position(|r| r.id == id);
        let held = at
            .and_then(|i| holds.admitted.remove(i))
            .map_or(0, |r| r.count);
        self.push_newest(holds, now, id, held.saturating_add(cost));
    }

    /// Releases up to `cost` of the live hold `id` at `now`; frees nothing when `id` is not
    /// held (unknown, expired, released, or its request was denied). Never touches another
    /// record.
    pub(crate) fn give_back_id(&self, holds: &mut Holds, now: u64, id: u64, cost: u64) {
        Self::trim(holds, now);
        let Some(at) = holds.admitted.iter().position(|r| r.id == id) else {
            return;
        };
        if let Some(r) = holds.admitted.get_mut(at) {
            r.count = r.count.saturating_sub(cost);
            if r.count == 0 {
                holds.admitted.remove(at);
            }
        }
    }
}

/// Takes up to `cost` from the front of `list`, passing over the holds requests name (ids
/// from [`BY_ID`]); what was not there to take.
fn release(list: &mut VecDeque<Record>, mut cost: u64) -> u64 {
    let mut at = 0;
    while cost > 0 {
        let Some(r) = list.get_mut(at) else {
            break;
        };
        if r.id >= BY_ID {
            at += 1;
            continue;
        }
        let take = cost.min(r.count);
        r.count -= take;
        cost -= take;
        if r.count == 0 {
            list.remove(at);
        }
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn admits_up_to_the_slots_and_frees_on_release() {
        let c = Concurrency::new(3, 10 * SEC);
        let mut h = Holds::default();
        for t in 0..3 {
            assert!(c.admits(&h, t, 1));
            c.take(&mut h, t, 1);
        }
        assert!(!c.admits(&h, 3, 1));
        assert_eq!(c.until_admitted(&h, 3, 1), 10 * SEC - 3);
        c.give_back(&mut h, 4, 1);
        assert!(c.admits(&h, 4, 1));
        assert_eq!(c.oldest_expiry(&h, 4), Some(10 * SEC + 1));
    }

    #[test]
    fn a_denied_requests_release_frees_nothing() {
        let c = Concurrency::new(1, 10 * SEC);
        let mut h = Holds::default();
        c.take(&mut h, 0, 1);
        c.deny(&mut h, 1, 1);
        c.deny(&mut h, 2, 1);
        c.give_back(&mut h, 3, 1);
        c.give_back(&mut h, 3, 1);
        assert_eq!((c.held(&h, 3), c.pending(&h, 3)), (1, 0));
        c.give_back(&mut h, 3, 1);
        assert_eq!(c.held(&h, 3), 0);
    }

    #[test]
    fn a_release_never_frees_more_than_is_held() {
        let c = Concurrency::new(5, SEC);
        let mut h = Holds::default();
        c.take(&mut h, 0, 2);
        c.give_back(&mut h, 1, 100);
        assert!(h.is_empty());
        c.give_back(&mut h, 1, 1);
        c.take(&mut h, 2, 1);
        assert_eq!(c.held(&h, 2), 1, "an early release is not kept as credit");
    }

    #[test]
    fn a_lost_release_frees_after_one_lease() {
        let c = Concurrency::new(1, 2 * SEC);
        let mut h = Holds::default();
        c.take(&mut h, SEC, 1);
        c.deny(&mut h, SEC, 1);
        assert!(!c.admits(&h, 3 * SEC - 1, 1));
        assert!(c.admits(&h, 3 * SEC, 1));
        assert_eq!(c.until_fresh(&h, SEC), 2 * SEC);
    }

    #[test]
    fn ids_are_distinct_and_records_stay_bounded() {
        let c = Concurrency::new(2, SEC);
        let mut h = Holds::default();
        let a = c.take(&mut h, 0, 1);
        let b = c.take(&mut h, 1, 1);
        assert_ne!(a, b);
        for t in 0..(u64::from(MAX_RECORDS) + 10) {
            c.deny(&mut h, 2 + t, 1);
        }
        assert_eq!(h.denied.len(), MAX_RECORDS as usize);
        assert_eq!(c.pending(&h, 2), u64::from(MAX_RECORDS) + 10);
    }

    #[test]
    fn zero_slots_admit_only_checks() {
        let c = Concurrency::new(0, SEC);
        let mut h = Holds::default();
        assert!(c.admits(&h, 0, 0));
        assert!(!c.admits(&h, 0, 1));
        assert_eq!(c.take(&mut h, 0, 1), None);
        assert_eq!(c.until_admitted(&h, 0, 1), SEC);
    }

    #[test]
    fn holds_with_ids_free_and_extend_exactly_themselves() {
        let c = Concurrency::new(3, 10 * SEC);
        let mut h = Holds::default();
        let a = c.acquire(&mut h, 0, 2).expect("fits");
        let b = c.acquire(&mut h, 0, 1).expect("fits");
        assert_ne!(a, b, "same instant, distinct ids");
        assert_eq!(c.acquire(&mut h, 1, 1), None);
        assert_eq!(c.held(&h, 1), 3);
        assert!(c.release_id(&mut h, 2, a));
        assert!(!c.release_id(&mut h, 2, a), "released once");
        assert!(!c.release_id(&mut h, 2, 99), "unknown id frees nothing");
        assert_eq!(c.held(&h, 2), 1);
        assert!(c.extend_id(&mut h, 9 * SEC, b));
        assert_eq!(c.held(&h, 15 * SEC), 1, "extended to 19 s");
        assert_eq!(c.held(&h, 19 * SEC), 0, "then expires");
        assert!(
            !c.extend_id(&mut h, 19 * SEC, b),
            "an expired hold is not extended"
        );
        assert_eq!(c.acquire(&mut h, 20 * SEC, 4), None, "more than the slots");
    }

    #[test]
    fn holds_named_by_the_request_free_exactly_themselves() {
        let c = Concurrency::new(3, 10 * SEC);
        let mut h = Holds::default();
        let (a, b, x) = (hold_id(b"a"), hold_id(b"b"), hold_id(b"x"));
        c.take_id(&mut h, 0, a, 1);
        c.take_id(&mut h, 0, b, 2);
        assert_eq!(h.admitted.len(), 2, "same instant, two records");
        assert!(!c.admits(&h, 1, 1));
        c.give_back_id(&mut h, 1, x, 1);
        assert_eq!(c.held(&h, 1), 3, "an unknown id frees nothing");
        c.give_back_id(&mut h, 1, b, 5);
        assert_eq!(c.held(&h, 1), 1, "b's 2, never more");
        c.give_back_id(&mut h, 1, b, 1);
        assert_eq!(c.held(&h, 1), 1, "b is gone");
        // The same id again adds up, with a new expiry.
        c.take_id(&mut h, 5 * SEC, a, 1);
        assert_eq!(h.admitted.len(), 1);
        assert_eq!(c.held(&h, 14 * SEC), 2, "both expire at 15 s");
        assert_eq!(c.held(&h, 15 * SEC), 0);
    }

    #[test]
    fn an_anonymous_hold_never_merges_into_a_named_one() {
        let c = Concurrency::new(4, 10 * SEC);
        let mut h = Holds::default();
        let a = hold_id(b"a");
        c.take_id(&mut h, 0, a, 1);
        c.take(&mut h, 0, 1);
        assert_eq!(h.admitted.len(), 2);
        c.give_back_id(&mut h, 1, a, 1);
        assert_eq!(c.held(&h, 1), 1, "the anonymous hold stays");
        assert!(h.admitted().all(|r| r.id < BY_ID));
        // And an anonymous release never frees a named hold.
        c.take_id(&mut h, 2, a, 2);
        c.give_back(&mut h, 3, 5);
        assert_eq!(c.held(&h, 3), 2, "a's 2 stay");
        assert!(h.admitted().all(|r| r.id == a));
    }
}
