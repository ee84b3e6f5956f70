//! The funnel: a leaky bucket in GCRA form, as pure integer functions.
//!
//! State is one timestamp, `tat`: the time (in nanoseconds of the backend's clock) at which the
//! funnel will be empty. With interval `T = ceil(P / Q)` and capacity `tau = B * T`, a cost `c`
//! at `now` is admitted iff `max(tat, now) + c*T - now <= tau`, and then `tat` moves there.
//! Rounding `T` up keeps the admitted rate at or below `Q / P`. Arithmetic saturates; nothing
//! here divides by zero or panics. A zero quota is its own case: nothing with a cost passes,
//! and no state is ever kept.
//!
//! A key stores a [`Tat`]: the `tat`, the quota it was taken under, and how many units
//! anonymous refunds may still give back. A state taken under another quota (a reload changed
//! the limit; the period is part of the state key, so a changed period is a new key) is read at
//! its next use as the same units at the new interval: `level' = ceil(level * T' / T)`, where
//! `level = tat - now`. Units used stay units used: raising the quota gives the difference at
//! once, lowering it never admits beyond the new bound.
//!
//! Returns: a return by name ([`Funnel::return_units`], a reservation's commit) gives back only
//! the units whose slots, ending at the mark the take left ([`Funnel::name_take`]), are still
//! wholly ahead of now. An anonymous refund ([`Funnel::refund_state`]) gives back at most the
//! units taken by anonymous takes since the last named take (`refundable`), and never below
//! empty: it cannot give back a reservation's units nor any that have drained.
//!
//! ```
//! use sluice_core::limiter::funnel::{Funnel, FRESH};
//! // 2 per second, burst 2.
//! let f = Funnel::new(2, 1_000_000_000, 2, false);
//! let a = f.evaluate(FRESH, 0, 1);
//! assert!(a.admitted);
//! let b = f.evaluate(a.tat, 0, 1);
//! assert!(b.admitted);
//! assert!(!f.evaluate(b.tat, 0, 1).admitted);
//! // Half a second later one unit has leaked out.
//! assert!(f.evaluate(b.tat, 500_000_000, 1).admitted);
//! ```

/// The state of a key that has never been used (or has fully drained).
pub const FRESH: u64 = 0;

/// A funnel key's stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tat {
    /// When the funnel is empty (nanoseconds of the backend's clock).
    pub tat: u64,
    /// The quota the state was taken under; 0: unknown (a state of an older format), read as
    /// the quota of the limit using it.
    pub quota: u32,
    /// Units taken by anonymous takes since the last named take (a reservation): the most an
    /// anonymous refund gives back (saturating).
    pub refundable: u32,
}

/// The stored state of a key never used (or fully drained).
pub const FRESH_STATE: Tat = Tat {
    tat: FRESH,
    quota: 0,
    refundable: 0,
};

/// `ceil(x * y / z)` in 128 bits, saturating (`z > 0`).
fn mul_div_ceil(x: u64, y: u64, z: u64) -> u64 {
    let q = (u128::from(x) * u128::from(y)).div_ceil(u128::from(z.max(1)));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// `floor(x * y / z)` in 128 bits, saturating (`z > 0`).
fn mul_div_floor(x: u64, y: u64, z: u64) -> u64 {
    let q = u128::from(x) * u128::from(y) / u128::from(z.max(1));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// One limit's funnel parameters, precomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Funnel {
    /// Q, kept in the states taken under it.
    quota: u32,
    /// T: nanoseconds one unit of cost takes to leak out. 0 means a zero quota.
    interval: u64,
    /// tau: how far ahead of now `tat` may be.
    tolerance: u64,
    /// P, used as the retry time of a zero quota.
    period: u64,
    borrow: bool,
}

/// The result of evaluating one cost against a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The funnel alone would admit this cost.
    pub admitted: bool,
    /// The state after taking the cost (whether admitted or not; see [`Funnel::consume`]).
    pub tat: u64,
}

impl Funnel {
    /// A funnel of `quota` per `period` nanoseconds with capacity `burst`. With `borrow`, a
    /// cost is admitted whenever one unit of it would be, and is then charged in full.
    pub fn new(quota: u32, period: u64, burst: u32, borrow: bool) -> Funnel {
        let period = period.max(1);
        let interval = if quota == 0 {
            0
        } else {
            period.div_ceil(u64::from(quota)).max(1)
        };
        Funnel {
            quota,
            interval,
            tolerance: interval.saturating_mul(u64::from(burst)),
            period,
            borrow,
        }
    }

    fn is_zero(&self) -> bool {
        self.interval == 0
    }

    /// The state after taking `cost` at `now`, admitted or not.
    pub fn consume(&self, tat: u64, now: u64, cost: u64) -> u64 {
        if self.is_zero() || cost == 0 {
            return tat;
        }
        tat.max(now)
            .saturating_add(cost.saturating_mul(self.interval))
    }

    /// The state after charging `cost` at `now`: as [`Funnel::consume`], but never more than
    /// [`Funnel::debt_cap`] ahead of `now` (nor behind where it was). Only a cost taken
    /// beyond the capacity meets the cap: one charged while denied (`charge: always`), or a
    /// borrowed one.
    pub fn take(&self, tat: u64, now: u64, cost: u64) -> u64 {
        let next = self.consume(tat, now, cost);
        next.min(self.debt_cap(now).max(tat))
    }

    /// How far `tat` may run ahead of `now`: the capacity plus one period, so at most one
    /// period's quota is owed beyond the burst, and a key charged at `now` is admitted again
    /// by `now + period + interval` at the latest.
    pub(crate) fn debt_cap(&self, now: u64) -> u64 {
        now.saturating_add(self.tolerance)
            .saturating_add(self.period)
    }

    /// Whether `cost` at `now` is admitted, and the state if it is taken.
    pub fn evaluate(&self, tat: u64, now: u64, cost: u64) -> Step {
        let admitted = if self.is_zero() {
            cost == 0
        } else {
            let probe = if self.borrow { cost.min(1) } else { cost };
            self.consume(tat, now, probe).saturating_sub(now) <= self.tolerance
        };
        Step {
            admitted,
            tat: self.take(tat, now, cost),
        }
    }

    /// The interval of a funnel of `quota` over this one's period (0 for a zero quota).
    fn interval_of(&self, quota: u32) -> u64 {
        if quota == 0 {
            0
        } else {
            self.period.div_ceil(u64::from(quota)).max(1)
        }
    }

    /// The `tat` of `state` at `now` under this funnel: a state taken under another quota
    /// keeps its units, its level scaled to this interval (rounded up).
    pub fn tat_of(&self, state: Tat, now: u64) -> u64 {
        if !self.converts(state, now) {
            return state.tat;
        }
        let old = self.interval_of(state.quota);
        let level = state.tat - now;
        now.saturating_add(mul_div_ceil(level, self.interval, old))
    }

    /// Whether `state` is read converted at `now` (taken under another quota, not drained).
    fn converts(&self, state: Tat, now: u64) -> bool {
        state.quota != 0 && state.quota != self.quota && !self.is_zero() && state.tat > now
    }

    /// [`Funnel::until_admitted`] for a stored state, exact also for one taken under another
    /// quota: until a write converts it, its level drains at the rate it was taken under, so
    /// `cost` fits once `tat - t <= floor(room * T_old / T)`, `room = tau - cost * T`.
    pub fn until_admitted_state(&self, state: Tat, now: u64, cost: u64) -> u64 {
        if !self.converts(state, now) {
            return self.until_admitted(state.tat, now, cost);
        }
        let probe = if self.borrow { cost.min(1) } else { cost };
        let need = probe.saturating_mul(self.interval);
        if need > self.tolerance {
            return self.until_empty(state.tat, now).max(self.period).max(1);
        }
        let old = self.interval_of(state.quota);
        let slack = mul_div_floor(self.tolerance - need, old, self.interval);
        state.tat.saturating_sub(slack).saturating_sub(now).max(1)
    }

    /// Units `state` may still give back to an anonymous refund at `now` (none once drained).
    fn refundable(&self, state: Tat, now: u64) -> u32 {
        if state.tat <= now {
            0
        } else {
            state.refundable
        }
    }

    /// The state after an anonymous take of `cost` at `now` ([`Funnel::take`]).
    pub fn take_state(&self, state: Tat, now: u64, cost: u64) -> Tat {
        if self.is_zero() || cost == 0 {
            return state;
        }
        let cost32 = u32::try_from(cost).unwrap_or(u32::MAX);
        Tat {
            tat: self.take(self.tat_of(state, now), now, cost),
            quota: self.quota,
            refundable: self.refundable(state, now).saturating_add(cost32),
        }
    }

    /// The state after an anonymous refund of `cost` at `now`: at most the units anonymous
    /// takes put in since the last named take, never below empty.
    pub fn refund_state(&self, state: Tat, now: u64, cost: u64) -> Tat {
        if self.is_zero() || cost == 0 {
            return state;
        }
        let refundable = self.refundable(state, now);
        let units = cost.min(u64::from(refundable));
        let back = self
            .tat_of(state, now)
            .saturating_sub(units.saturating_mul(self.interval));
        if back <= now {
            return FRESH_STATE;
        }
        Tat {
            tat: back,
            quota: self.quota,
            refundable: refundable - u32::try_from(units).unwrap_or(refundable),
        }
    }

    /// Marks the take just made at `now` as named (a reservation's): anonymous refunds no
    /// longer give back the units taken so far. Returns the state and the mark a return by
    /// name needs: the end of the slots the take's units hold (the `tat`).
    pub fn name_take(&self, state: Tat, now: u64) -> (Tat, u64) {
        if self.is_zero() || state.tat == FRESH {
            return (state, FRESH);
        }
        let tat = self.tat_of(state, now);
        let named = Tat {
            tat,
            quota: self.quota,
            refundable: 0,
        };
        (named, tat)
    }

    /// The mark of a reservation's take of `cost` at `now` whose [`Funnel::name_take`] mark is
    /// `mark` (the take's tat), `open` units being reserved on the key and not yet settled:
    /// the earliest its units' slots can come to end. Only those open reservations can
    /// give units back ahead of them (an anonymous refund gives back only units taken after
    /// the last named take, and a lease only while its units are the last), and each at most
    /// its own units, so the slots move earlier by at most `open * T`; nor can they end
    /// before they would in an empty funnel (`now + cost * T`). A return by this mark never
    /// gives back units that have drained, whatever was returned ahead of them meanwhile;
    /// with nothing else open, it is the take's tat, exactly.
    pub fn reservation_mark(&self, mark: u64, now: u64, cost: u64, open: u64) -> u64 {
        let front = now.saturating_add(cost.saturating_mul(self.interval));
        let moved = mark.saturating_sub(open.saturating_mul(self.interval));
        front.max(moved).min(mark)
    }

    /// The state after returning `units` of a named take whose slots end at `slots_end`: only
    /// the units whose slots are still wholly ahead of `now`, `tat -= T * min(units,
    /// (slots_end - now) / T)`; never below empty.
    pub fn return_units(&self, state: Tat, now: u64, units: u64, slots_end: u64) -> Tat {
        if self.is_zero() || units == 0 {
            return state;
        }
        let ahead = slots_end.saturating_sub(now) / self.interval;
        let back = self
            .tat_of(state, now)
            .saturating_sub(units.min(ahead).saturating_mul(self.interval));
        if back <= now {
            return FRESH_STATE;
        }
        Tat {
            tat: back,
            quota: self.quota,
            refundable: self.refundable(state, now),
        }
    }

    /// Whole units of cost that would still be admitted at `now`.
    pub fn remaining(&self, tat: u64, now: u64) -> u64 {
        if self.is_zero() {
            return 0;
        }
        let level = tat.saturating_sub(now);
        self.tolerance.saturating_sub(level) / self.interval
    }

    /// Nanoseconds until the funnel is empty again (0 when it is).
    pub fn until_empty(&self, tat: u64, now: u64) -> u64 {
        tat.saturating_sub(now)
    }

    /// Nanoseconds until `cost` would be admitted. A cost that never fits (more than the
    /// burst, without `borrow`) and a zero quota get at least one period: "much later".
    /// Never 0 for a cost that is denied now.
    pub fn until_admitted(&self, tat: u64, now: u64, cost: u64) -> u64 {
        if self.is_zero() {
            return self.period;
        }
        let probe = if self.borrow { cost.min(1) } else { cost };
        let need = probe.saturating_mul(self.interval);
        let wait = if need > self.tolerance {
            self.until_empty(tat, now).max(self.period)
        } else {
            self.consume(tat, now, probe)
                .saturating_sub(now)
                .saturating_sub(self.tolerance)
        };
        wait.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn burst_then_steady_rate() {
        let f = Funnel::new(10, SEC, 10, false);
        let mut tat = FRESH;
        for _ in 0..10 {
            let s = f.evaluate(tat, SEC, 1);
            assert!(s.admitted);
            tat = s.tat;
        }
        assert!(!f.evaluate(tat, SEC, 1).admitted);
        assert_eq!(f.remaining(tat, SEC), 0);
        assert_eq!(f.until_admitted(tat, SEC, 1), SEC / 10);
        assert!(f.evaluate(tat, SEC + SEC / 10, 1).admitted);
        assert_eq!(f.until_empty(tat, SEC), SEC);
    }

    #[test]
    fn zero_quota_denies_costs_and_keeps_no_state() {
        let f = Funnel::new(0, SEC, 0, false);
        let s = f.evaluate(FRESH, 5, 1);
        assert!(!s.admitted);
        assert_eq!(s.tat, FRESH);
        assert!(f.evaluate(FRESH, 5, 0).admitted);
        assert_eq!(f.remaining(FRESH, 5), 0);
        assert_eq!(f.until_admitted(FRESH, 5, 1), SEC);
        assert_eq!(f.consume(FRESH, 5, 7), FRESH);
    }

    #[test]
    fn check_only_is_denied_only_in_debt() {
        let f = Funnel::new(2, SEC, 2, false);
        let full = f.consume(FRESH, SEC, 2);
        assert!(f.evaluate(full, SEC, 0).admitted);
        let debt = f.consume(full, SEC, 1);
        assert!(!f.evaluate(debt, SEC, 0).admitted);
        assert_eq!(f.remaining(debt, SEC), 0);
    }

    #[test]
    fn cost_above_capacity_never_fits_unless_borrowing() {
        let strict = Funnel::new(5, SEC, 5, false);
        assert!(!strict.evaluate(FRESH, SEC, 6).admitted);
        assert_eq!(strict.until_admitted(FRESH, SEC, 6), SEC);
        let borrow = Funnel::new(5, SEC, 5, true);
        let s = borrow.evaluate(FRESH, SEC, 8);
        assert!(s.admitted);
        assert_eq!(borrow.remaining(s.tat, SEC), 0);
        assert!(!borrow.evaluate(s.tat, SEC, 1).admitted);
        // 3 units of debt plus one unit to leak: 4 intervals of 200 ms.
        assert_eq!(borrow.until_admitted(s.tat, SEC, 1), 4 * SEC / 5);
    }

    #[test]
    fn an_anonymous_refund_gives_back_only_anonymous_units_still_in() {
        let f = Funnel::new(4, SEC, 4, false);
        let s = f.take_state(FRESH_STATE, SEC, 3);
        assert_eq!(f.remaining(f.refund_state(s, SEC, 1).tat, SEC), 2);
        assert_eq!(f.refund_state(s, SEC, 100), FRESH_STATE);
        // A named take's units are not given back anonymously.
        let (named, _) = f.name_take(s, SEC);
        let more = f.take_state(named, SEC, 1);
        let back = f.refund_state(more, SEC, 4);
        assert_eq!(
            f.remaining(back.tat, SEC),
            1,
            "only the anonymous unit came back"
        );
        // Nor units that drained: a fresh take after draining starts a new count.
        let later = f.take_state(more, 10 * SEC, 1);
        assert_eq!(later.refundable, 1);
    }

    /// Two reservations, the first returned whole: the second's unit moves to the front and
    /// drains there, so its own return, later, gives back only what is still ahead of it by
    /// the reservation mark (the first one's slots' end had nothing ahead). By the take's own
    /// tat as the mark, it gave back a unit already 0.91 drained: 19 admitted where the bound
    /// is 18 (the case the property test `returns::funnel_returns_stay_within_the_bound`
    /// found).
    #[test]
    fn a_return_after_a_return_ahead_gives_back_no_drained_unit() {
        let f = Funnel::new(1, SEC, 17, false);
        let t0 = 1_000 * SEC;
        let first = f.take_state(FRESH_STATE, t0, 11);
        let (first, mark0) = f.name_take(first, t0);
        let mark0 = f.reservation_mark(mark0, t0, 11, 0);
        let second = f.take_state(first, t0, 1);
        let (second, tat_mark1) = f.name_take(second, t0);
        // The first reservation's 11 units are open: its return may move this one's slots.
        let mark1 = f.reservation_mark(tat_mark1, t0, 1, 11);
        assert_eq!(
            (mark0, tat_mark1, mark1),
            (t0 + 11 * SEC, t0 + 12 * SEC, t0 + SEC)
        );
        // With nothing open ahead, the take's own tat: nothing can move the slots.
        assert_eq!(f.reservation_mark(tat_mark1, t0, 1, 0), tat_mark1);
        let s = f.return_units(second, t0, 11, mark0);
        assert_eq!(s.tat, t0 + SEC, "the first reservation's 11 units back");
        let now = t0 + 910 * SEC / 1000;
        let s = f.take_state(s, now, 11);
        assert_eq!(
            f.return_units(s, now, 1, mark1),
            s,
            "its unit has mostly drained"
        );
        assert_ne!(
            f.return_units(s, now, 1, tat_mark1),
            s,
            "the take's tat would return it"
        );
        let later = t0 + 2 * SEC;
        assert!(
            !f.evaluate(s.tat, later, 8).admitted,
            "18 at most in 1.09 s"
        );
    }

    /// The measured case of a late commit: 10 a second, burst 40; 40 reserved at 0, 38
    /// taken at 3.9 s, the reservation committed with 0 used: one unit comes back.
    #[test]
    fn a_return_by_name_gives_back_only_slots_still_ahead() {
        let f = Funnel::new(10, SEC, 40, false);
        let reserved = f.take_state(FRESH_STATE, 0, 40);
        let (named, mark) = f.name_take(reserved, 0);
        assert_eq!(mark, 4 * SEC);
        let now = 39 * SEC / 10;
        let step = f.evaluate(f.tat_of(named, now), now, 38);
        assert!(step.admitted);
        let taken = f.take_state(named, now, 38);
        let back = f.return_units(taken, now, 40, mark);
        assert_eq!(f.remaining(back.tat, now), 2);
        assert!(!f.evaluate(back.tat, now, 40).admitted);
        assert_eq!(
            f.return_units(taken, 5 * SEC, 40, mark),
            taken,
            "its slots have passed"
        );
    }

    #[test]
    fn a_changed_quota_keeps_the_units_used() {
        const MIN: u64 = 60 * SEC;
        let ten = Funnel::new(10, MIN, 10, false);
        let five = Funnel::new(5, MIN, 5, false);
        let mut s = FRESH_STATE;
        for _ in 0..5 {
            s = ten.take_state(s, 0, 1);
        }
        assert_eq!(
            five.remaining(five.tat_of(s, 0), 0),
            0,
            "lowered: nothing left"
        );
        let mut s = FRESH_STATE;
        for _ in 0..5 {
            s = five.take_state(s, 0, 1);
        }
        assert_eq!(
            ten.remaining(ten.tat_of(s, 0), 0),
            5,
            "raised: the difference at once"
        );
        let s = ten.take_state(s, 0, 5);
        assert_eq!(s.quota, 10);
        assert_eq!(ten.remaining(s.tat, 0), 0);
        assert_eq!(
            five.tat_of(Tat { quota: 0, ..s }, 0),
            s.tat,
            "an old state is not scaled"
        );
    }

    #[test]
    fn huge_numbers_saturate() {
        let f = Funnel::new(1, u64::MAX, u32::MAX, true);
        let s = f.evaluate(FRESH, u64::MAX - 1, u64::MAX);
        assert!(s.admitted);
        assert_eq!(s.tat, u64::MAX);
        assert_eq!(f.remaining(s.tat, 0), 0);
    }

    /// The AI Gateway example: a 1,000-token budget per hour, an answer of 1,200 tokens
    /// charged while denied: the 200 tokens of debt are owed exactly (under the cap), so a
    /// check of cost 0 is denied until they have drained.
    #[test]
    fn a_report_under_the_cap_is_owed_exactly() {
        const HOUR: u64 = 3_600 * SEC;
        let f = Funnel::new(1_000, HOUR, 1_000, false);
        let now = 10 * HOUR;
        let report = f.evaluate(FRESH, now, 1_200);
        assert!(!report.admitted);
        assert_eq!(report.tat, now + 1_200 * f.interval);
        assert!(
            !f.evaluate(report.tat, now, 0).admitted,
            "in debt: a check is denied"
        );
        let paid = now + 200 * f.interval;
        assert!(!f.evaluate(report.tat, paid - 1, 0).admitted);
        assert!(
            f.evaluate(report.tat, paid, 0).admitted,
            "debt paid: a check passes"
        );
    }

    /// A client that hammers under `charge: always` owes at most one period beyond the
    /// burst, so once it stops it is admitted again within a period and one interval of its
    /// last try, however many tries it made.
    #[test]
    fn a_hammering_client_is_admitted_again_within_the_bound() {
        let f = Funnel::new(10, SEC, 20, false);
        let mut tat = FRESH;
        let mut now = SEC;
        for _ in 0..100_000 {
            tat = f.evaluate(tat, now, 1).tat;
            now += SEC / 1_000;
        }
        let last = now - SEC / 1_000;
        assert!(tat <= f.debt_cap(last), "owes at most the cap");
        let bound = last + SEC + f.interval;
        assert!(f.evaluate(tat, bound, 1).admitted, "admitted within P + T");
        assert!(
            !f.evaluate(tat, last + SEC / 2, 1).admitted,
            "still owing half-way"
        );
    }

    proptest::proptest! {
        /// Whatever is charged, `tat` never runs more than the capacity plus one period
        /// ahead, never moves back, and a charge below the cap is taken whole.
        #[test]
        fn debt_never_passes_the_cap(
            quota in 1u32..1_000,
            period in 1u64..100 * SEC,
            burst in 1u32..2_000,
            steps in proptest::collection::vec((0u64..SEC, 0u64..5_000), 1..60),
        ) {
            let f = Funnel::new(quota, period, burst, false);
            let (mut tat, mut now) = (FRESH, SEC);
            for (gap, cost) in steps {
                now += gap;
                let next = f.evaluate(tat, now, cost).tat;
                proptest::prop_assert!(next <= f.debt_cap(now).max(tat));
                proptest::prop_assert!(next >= tat);
                let whole = f.consume(tat, now, cost);
                if whole <= f.debt_cap(now) {
                    proptest::prop_assert_eq!(next, whole);
                }
                tat = next;
            }
        }
    }
}
