//! The sliding window: an approximate sliding counter, as pure integer functions.
//!
//! Time is cut into windows of length P aligned to the Unix epoch, as for the fixed window,
//! but the count a cost is checked against slides: at `e` into the current window it is
//! `current + floor(previous * (P - e) / P)`, the current window's count plus the previous
//! window's, weighted by the part of the previous window still inside the last P (as if its
//! traffic had been spread evenly). A cost `c` is admitted while that estimate plus `c` is at
//! most Q. Two counters per key: constant memory.
//!
//! Error bound. The estimate never undercounts the current window, so at most Q is admitted
//! per aligned window. Against an exact sliding window (at most Q in any interval of length P)
//! it errs when the previous window's traffic was uneven: late traffic there is underweighted
//! (admits more), early traffic overweighted (admits less). The cost admitted in any closed
//! interval of length L is at most `Q + ceil(Q * L / P)`: close to Q for a short interval
//! (no burst of 2Q at a window's edge, unlike the fixed window), but up to 2Q over a full P in
//! the worst case (Q at the very end of a window, Q at the very end of the next). A property
//! test checks the bound on random traffic.
//!
//! State is `(start, current, previous)` for the window starting at `start`. A state whose
//! estimate is 0 holds no information (it is never stored). `borrow` means nothing here (rules
//! refuse it). With `charge: always` the estimate may pass Q; even a check-only cost of 0 is
//! then denied. A zero quota admits nothing with a cost and keeps no state. The weighting is
//! exact integer math (128-bit products); nothing divides by zero or panics.
//!
//! ```
//! use sluice_core::limiter::sliding_window::{SlidingWindow, EMPTY};
//! const SEC: u64 = 1_000_000_000;
//! // 10 per minute; 10 taken in the last second of a minute.
//! let w = SlidingWindow::new(10, 60 * SEC);
//! let full = w.consume(EMPTY, 59 * SEC, 10);
//! assert!(!w.admits(full, 60 * SEC, 1), "no new burst as the next window begins");
//! assert_eq!(w.estimate(full, 66 * SEC), 9, "6 s later, 54/60 of the 10 still count");
//! assert!(w.admits(full, 66 * SEC, 1));
//! ```

/// One limit's sliding window parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Q. 0 means a zero quota.
    quota: u64,
    /// P, at least 1.
    period: u64,
}

/// The counts of the window starting at `start` and of the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub start: u64,
    pub current: u64,
    pub previous: u64,
    /// Units of the current count taken by anonymous takes since the last named take (a
    /// reservation): the most an anonymous refund gives back.
    pub refundable: u64,
}

/// Nothing counted: the state of a key never used (or whose windows have passed).
pub const EMPTY: Counters = Counters {
    start: 0,
    current: 0,
    previous: 0,
    refundable: 0,
};

/// The result of evaluating one cost against the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The window alone would admit this cost.
    pub admitted: bool,
    /// The counters after counting the cost (whether admitted or not).
    pub counters: Counters,
}

/// `floor(x * y / z)` and whether it was exact, in 128 bits (`z > 0`).
fn mul_div(x: u64, y: u64, z: u64) -> (u64, bool) {
    let product = u128::from(x) * u128::from(y);
    let z = u128::from(z.max(1));
    let q = u64::try_from(product / z).unwrap_or(u64::MAX);
    (q, product % z == 0)
}

impl SlidingWindow {
    /// A sliding window of `quota` per `period`.
    pub fn new(quota: u32, period: u64) -> SlidingWindow {
        SlidingWindow {
            quota: u64::from(quota),
            period: period.max(1),
        }
    }

    fn is_zero(&self) -> bool {
        self.quota == 0
    }

    /// The counters moved to the window holding `now`: the current count becomes the
    /// previous one when that window follows; older counts are dropped. Counters of a later
    /// window (a clock that went back) are kept as they are.
    fn rolled(&self, c: Counters, now: u64) -> Counters {
        let start = now - now % self.period;
        if c.start >= start {
            c
        } else if c.start.saturating_add(self.period) == start {
            Counters {
                start,
                previous: c.current,
                ..EMPTY
            }
        } else {
            Counters { start, ..EMPTY }
        }
    }

    /// The end of the aligned window holding `now` (a lease never crosses it).
    pub(crate) fn window_end(&self, now: u64) -> u64 {
        (now - now % self.period).saturating_add(self.period)
    }

    /// The sliding count at `now`: `current + floor(previous * (P - e) / P)`.
    pub fn estimate(&self, c: Counters, now: u64) -> u64 {
        let c = self.rolled(c, now);
        let left = self.period.saturating_sub(now.saturating_sub(c.start));
        let (weighted, _) = mul_div(c.previous, left, self.period);
        c.current.saturating_add(weighted)
    }

    /// Whether `cost` at `now` is admitted.
    pub fn admits(&self, c: Counters, now: u64, cost: u64) -> bool {
        if self.is_zero() {
            return cost == 0;
        }
        self.estimate(c, now).saturating_add(cost) <= self.quota
    }

    /// The counters after counting `cost` at `now`, admitted or not.
    pub fn consume(&self, c: Counters, now: u64, cost: u64) -> Counters {
        if self.is_zero() || cost == 0 {
            return c;
        }
        let c = self.rolled(c, now);
        Counters {
            current: c.current.saturating_add(cost),
            refundable: c.refundable.saturating_add(cost),
            ..c
        }
    }

    /// Whether `cost` at `now` is admitted, and the counters if it is counted.
    pub fn evaluate(&self, c: Counters, now: u64, cost: u64) -> Step {
        Step {
            admitted: self.admits(c, now, cost),
            counters: self.consume(c, now, cost),
        }
    }

    /// The counters after an anonymous refund of `cost` at `now`: from the current window's
    /// count only, never below 0 (what earlier windows counted stays counted).
    pub fn refund(&self, c: Counters, now: u64, cost: u64) -> Counters {
        if self.is_zero() || cost == 0 {
            return c;
        }
        let c = self.rolled(c, now);
        let back = cost.min(c.refundable);
        let refunded = Counters {
            refundable: c.refundable - back,
            ..c
        };
        self.settled(refunded, c.current.saturating_sub(back), c.previous)
    }

    /// `c` with these counts (empty when both are 0).
    fn settled(&self, c: Counters, current: u64, previous: u64) -> Counters {
        if current == 0 && previous == 0 {
            return EMPTY;
        }
        Counters {
            start: c.start,
            current,
            previous,
            refundable: c.refundable.min(current),
        }
    }

    /// Names the take just made at `now`: anonymous refunds no longer give back what the
    /// current window counted so far.
    pub fn name_take(&self, c: Counters, now: u64) -> Counters {
        let r = self.rolled(c, now);
        if r.current == 0 {
            return c;
        }
        Counters { refundable: 0, ..r }
    }

    /// Where a take at `now` counted its units: the start of its window, the mark a return
    /// by name needs ([`SlidingWindow::return_units`]).
    pub fn mark(&self, now: u64) -> u64 {
        now - now % self.period
    }

    /// The counters after returning `units` counted in the window starting at `start`: to
    /// the current count while that window is the current one, to the previous count once the
    /// window has rolled, and to nothing after that; never below 0.
    pub fn return_units(&self, c: Counters, now: u64, units: u64, start: u64) -> Counters {
        if self.is_zero() || units == 0 {
            return c;
        }
        let r = self.rolled(c, now);
        if r.start == start {
            self.settled(r, r.current.saturating_sub(units), r.previous)
        } else if r.start == start.saturating_add(self.period) {
            self.settled(r, r.current, r.previous.saturating_sub(units))
        } else {
            c
        }
    }

    /// What the window still admits at `now`.
    pub fn remaining(&self, c: Counters, now: u64) -> u64 {
        if self.is_zero() {
            return 0;
        }
        self.quota.saturating_sub(self.estimate(c, now))
    }

    /// The offset into a window from which a previous count of `count` weighs 0:
    /// `P - floor((P - 1) / count)`.
    fn weightless_from(&self, count: u64) -> u64 {
        self.period - (self.period - 1) / count.max(1)
    }

    /// Nanoseconds until the estimate is 0 (then the state holds no information).
    pub fn until_fresh(&self, c: Counters, now: u64) -> u64 {
        let c = self.rolled(c, now);
        let at = if c.current > 0 {
            c.start
                .saturating_add(self.period)
                .saturating_add(self.weightless_from(c.current))
        } else if c.previous > 0 {
            c.start.saturating_add(self.weightless_from(c.previous))
        } else {
            return 0;
        };
        at.saturating_sub(now)
    }

    /// Nanoseconds until `cost` would be admitted (without other traffic): exact, from the
    /// decay of the weighted counts. A cost above the quota (which never fits) and a zero
    /// quota get at least one period. Never 0 for a cost that is denied now.
    pub fn until_admitted(&self, c: Counters, now: u64, cost: u64) -> u64 {
        if self.is_zero() || cost > self.quota {
            return self.until_fresh(c, now).max(self.period);
        }
        let c = self.rolled(c, now);
        let room = self.quota - cost;
        let at = if c.current <= room {
            // In this window, once floor(previous * (P - e) / P) <= room - current.
            match self.decayed_at(c.previous, room - c.current) {
                Some(offset) => c.start.saturating_add(offset),
                None => now,
            }
        } else {
            // In the next window, where the current count becomes the previous one.
            let offset = self.decayed_at(c.current, room).unwrap_or(0);
            c.start.saturating_add(self.period).saturating_add(offset)
        };
        at.saturating_sub(now).max(1)
    }

    /// The first offset into a window at which a previous count `count` weighs at most
    /// `allowed`: `P - (ceil((allowed + 1) * P / count) - 1)`; `None` when it always does.
    fn decayed_at(&self, count: u64, allowed: u64) -> Option<u64> {
        if count <= allowed {
            return None;
        }
        let (q, exact) = mul_div(allowed + 1, self.period, count);
        let longest = if exact { q } else { q.saturating_add(1) } - 1;
        Some(self.period - longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const MIN: u64 = 60 * SEC;

    #[test]
    fn the_previous_window_weighs_by_its_part_still_inside() {
        let w = SlidingWindow::new(10, MIN);
        let s = w.consume(EMPTY, 30 * SEC, 8);
        assert_eq!(w.estimate(s, 59 * SEC), 8);
        assert_eq!(
            w.estimate(s, MIN),
            8,
            "all of the previous window still inside"
        );
        assert_eq!(w.estimate(s, MIN + 15 * SEC), 6);
        assert_eq!(w.estimate(s, 2 * MIN - 1), 0);
        assert_eq!(w.estimate(s, 3 * MIN), 0);
        assert_eq!(w.remaining(s, MIN + 15 * SEC), 4);
    }

    #[test]
    fn retry_and_fresh_times_follow_the_decay() {
        let w = SlidingWindow::new(10, MIN);
        let s = w.consume(EMPTY, 59 * SEC, 10);
        // At 60 s the previous 10 all count; one more unit fits as soon as they weigh 9.
        assert_eq!(w.until_admitted(s, MIN, 1), 1);
        let s = w.consume(s, MIN + 1, 1);
        // The next once floor(10 * (P - e) / P) <= 8: P - e < 54 s, from 6 s + 1 ns on.
        assert_eq!(w.until_admitted(s, MIN + 1, 1), 6 * SEC);
        assert!(!w.admits(s, 66 * SEC, 1));
        assert!(w.admits(s, 66 * SEC + 1, 1));
        let s = w.consume(EMPTY, 59 * SEC, 10);
        // Fresh once floor(10 * (P - e) / P) is 0: e > 54 s.
        assert_eq!(w.until_fresh(s, 59 * SEC), SEC + 54 * SEC + 1);
        assert_eq!(w.estimate(s, 2 * MIN - 6 * SEC + 1), 0);
        assert_eq!(w.estimate(s, 2 * MIN - 6 * SEC), 1);
    }

    #[test]
    fn zero_quota_and_oversized_costs() {
        let zero = SlidingWindow::new(0, MIN);
        assert!(!zero.admits(EMPTY, 5, 1));
        assert!(zero.admits(EMPTY, 5, 0));
        assert_eq!(zero.consume(EMPTY, 5, 3), EMPTY);
        assert_eq!(zero.until_admitted(EMPTY, 5, 1), MIN);
        let w = SlidingWindow::new(2, MIN);
        assert_eq!(w.until_admitted(EMPTY, 5, 3), MIN);
    }

    #[test]
    fn check_only_is_denied_only_over_the_quota() {
        let w = SlidingWindow::new(2, MIN);
        let full = w.consume(EMPTY, 0, 2);
        assert!(w.admits(full, 0, 0));
        let over = w.consume(full, 0, 1);
        assert!(!w.admits(over, 0, 0));
        // 3 previous: weighs at most 2 once 3 * m < 3 * P, i.e. from 1 ns into the next window.
        assert_eq!(w.until_admitted(over, 0, 0), MIN + 1);
    }

    #[test]
    fn an_anonymous_refund_takes_from_the_current_window_only() {
        let w = SlidingWindow::new(10, MIN);
        let s = w.consume(w.consume(EMPTY, 0, 4), MIN, 3);
        let back = w.refund(s, MIN, 5);
        assert_eq!((back.current, back.previous), (0, 4));
        let only_previous = w.consume(EMPTY, 0, 4);
        assert_eq!(w.refund(only_previous, MIN, 5).previous, 4);
        let named = w.consume(w.name_take(s, MIN), MIN, 1);
        assert_eq!(
            w.refund(named, MIN, 5).current,
            3,
            "only the anonymous unit"
        );
    }

    #[test]
    fn a_return_by_name_goes_to_its_window_then_to_nothing() {
        let w = SlidingWindow::new(10, MIN);
        let s = w.consume(EMPTY, 5, 4);
        let mark = w.mark(5);
        assert_eq!(w.return_units(s, 10, 3, mark).current, 1);
        let rolled = w.consume(s, MIN + 1, 2);
        let back = w.return_units(rolled, MIN + 2, 3, mark);
        assert_eq!((back.current, back.previous), (2, 1));
        assert_eq!(
            w.return_units(rolled, 2 * MIN, 3, mark),
            rolled,
            "two windows on"
        );
    }

    #[test]
    fn huge_numbers_saturate() {
        let w = SlidingWindow::new(u32::MAX, u64::MAX);
        let s = w.consume(EMPTY, u64::MAX - 1, u64::MAX);
        assert_eq!(w.estimate(s, u64::MAX - 1), u64::MAX);
        assert_eq!(w.remaining(s, u64::MAX - 1), 0);
        assert!(w.until_admitted(s, u64::MAX - 1, 0) >= 1);
    }
}
