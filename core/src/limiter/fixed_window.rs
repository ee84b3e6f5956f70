//! The fixed window: envoyproxy/ratelimit's counter, as pure integer functions.
//!
//! Time is cut into windows of length P aligned to the Unix epoch (a minute window starts at a
//! whole minute of UTC, a day window at 00:00 UTC; week, month and year are blocks of 7, 30
//! and 365 days since the epoch, as in envoyproxy/ratelimit). Each window counts the cost it
//! admitted and admits a cost `c` while `count + c <= Q`; the count starts again at 0 when the
//! next window begins. Remaining is `Q - count`; the reset reported is the time to the end of
//! the window, always (also for a zero quota and for a cost above the quota, which the next
//! window denies again), as envoyproxy/ratelimit reports it. One difference: a denied cost is not
//! counted (unless `charge: always`), so a client that keeps knocking is not kept out longer.
//!
//! With a calendar (`time_zone`), a window is a local day, ISO week, calendar month or year
//! of that zone instead ([`super::calendar`]): its start and end come from the tz database,
//! and everything else is the same.
//!
//! State is `(start, count)`: the window the count belongs to. A count of another window, or
//! of 0, holds no information (it is never stored). At most Q is admitted per window, but up
//! to 2Q around a window's end (Q at its last instant, Q at the first of the next).
//!
//! `borrow` means nothing here (rules refuse it): a window forgets debt when it ends. With
//! `charge: always` the count may pass Q; until the window ends, even a check-only cost of 0 is
//! then denied. A zero quota admits nothing with a cost and keeps no state. Arithmetic
//! saturates; nothing divides by zero or panics.
//!
//! ```
//! use sluice_core::limiter::fixed_window::{FixedWindow, EMPTY};
//! const SEC: u64 = 1_000_000_000;
//! // 2 per minute.
//! let w = FixedWindow::new(2, 60 * SEC);
//! let now = 1_000 * SEC; // 40 s into the window [960 s, 1020 s)
//! let full = w.consume(w.consume(EMPTY, now, 1), now, 1);
//! assert!(!w.admits(full, now, 1));
//! assert_eq!(w.until_admitted(full, now, 1), 20 * SEC);
//! assert!(w.admits(full, 1_020 * SEC, 2), "a new window");
//! ```

use super::calendar::Calendar;

/// One limit's window parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    /// Q. 0 means a zero quota.
    quota: u64,
    /// P, at least 1.
    period: u64,
    /// Calendar windows instead of epoch-aligned ones, when set.
    calendar: Option<Calendar>,
}

/// A window's count, and the start of the window it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    pub start: u64,
    pub count: u64,
    /// Units of the count taken by anonymous takes since the last named take (a
    /// reservation): the most an anonymous refund gives back.
    pub refundable: u64,
}

/// Nothing counted: the state of a key never used (or whose window has passed).
pub const EMPTY: Window = Window {
    start: 0,
    count: 0,
    refundable: 0,
};

/// The result of evaluating one cost against a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The window alone would admit this cost.
    pub admitted: bool,
    /// The window after counting the cost (whether admitted or not).
    pub window: Window,
}

impl FixedWindow {
    /// A window of `quota` per `period`.
    pub fn new(quota: u32, period: u64) -> FixedWindow {
        FixedWindow {
            quota: u64::from(quota),
            period: period.max(1),
            calendar: None,
        }
    }

    /// The same limit with calendar windows (`None`: epoch-aligned ones).
    pub(crate) fn with_calendar(self, calendar: Option<Calendar>) -> FixedWindow {
        FixedWindow { calendar, ..self }
    }

    fn is_zero(&self) -> bool {
        self.quota == 0
    }

    /// The start of the window holding `now`.
    pub fn window_start(&self, now: u64) -> u64 {
        match &self.calendar {
            None => now - now % self.period,
            Some(c) => c.window(now).0,
        }
    }

    /// The end of the window holding `now` (the start of the next).
    pub(crate) fn window_end(&self, now: u64) -> u64 {
        match &self.calendar {
            None => self.window_start(now).saturating_add(self.period),
            Some(c) => c.window(now).1,
        }
    }

    /// The count of the window holding `now`.
    pub fn count(&self, window: Window, now: u64) -> u64 {
        self.current(window, now).count
    }

    /// `window` if it is the one holding `now`, else nothing counted.
    fn current(&self, window: Window, now: u64) -> Window {
        if window.start == self.window_start(now) {
            window
        } else {
            EMPTY
        }
    }

    /// A window of `count` (EMPTY when 0) at the window holding `now`.
    fn counted(&self, now: u64, count: u64, refundable: u64) -> Window {
        if count == 0 {
            return EMPTY;
        }
        Window {
            start: self.window_start(now),
            count,
            refundable: refundable.min(count),
        }
    }

    /// Whether `cost` at `now` is admitted.
    pub fn admits(&self, window: Window, now: u64, cost: u64) -> bool {
        if self.is_zero() {
            return cost == 0;
        }
        self.count(window, now).saturating_add(cost) <= self.quota
    }

    /// The window after counting `cost` at `now`, admitted or not.
    pub fn consume(&self, window: Window, now: u64, cost: u64) -> Window {
        if self.is_zero() || cost == 0 {
            return window;
        }
        let at = self.current(window, now);
        Window {
            start: self.window_start(now),
            count: at.count.saturating_add(cost),
            refundable: at.refundable.saturating_add(cost),
        }
    }

    /// Whether `cost` at `now` is admitted, and the window if it is counted.
    pub fn evaluate(&self, window: Window, now: u64, cost: u64) -> Step {
        Step {
            admitted: self.admits(window, now, cost),
            window: self.consume(window, now, cost),
        }
    }

    /// The window after an anonymous refund of `cost` at `now`: from the current window's
    /// count only, at most what anonymous takes counted there since the last named take.
    pub fn refund(&self, window: Window, now: u64, cost: u64) -> Window {
        if self.is_zero() || cost == 0 {
            return window;
        }
        let at = self.current(window, now);
        let back = cost.min(at.refundable);
        self.counted(now, at.count - back.min(at.count), at.refundable - back)
    }

    /// Where a take at `now` counted its units: the start of its window, the mark a return
    /// by name needs ([`FixedWindow::return_units`]).
    pub fn mark(&self, now: u64) -> u64 {
        self.window_start(now)
    }

    /// Names the take just made at `now`: anonymous refunds no longer give back what the
    /// window counted so far.
    pub fn name_take(&self, window: Window, now: u64) -> Window {
        let at = self.current(window, now);
        if at.count == 0 {
            return window;
        }
        Window {
            refundable: 0,
            ..at
        }
    }

    /// The window after returning `units` counted in the window starting at `start`: given
    /// back while that window is the current one, never below 0; nothing once it has passed.
    pub fn return_units(&self, window: Window, now: u64, units: u64, start: u64) -> Window {
        if self.is_zero() || self.window_start(now) != start || window.start != start {
            return window;
        }
        let count = window.count.saturating_sub(units);
        self.counted(now, count, window.refundable)
    }

    /// What the window still admits at `now`.
    pub fn remaining(&self, window: Window, now: u64) -> u64 {
        self.quota.saturating_sub(self.count(window, now))
    }

    /// Nanoseconds to the end of the window holding `now` (at least 1): the reset reported.
    pub fn until_window_end(&self, now: u64) -> u64 {
        self.window_end(now).saturating_sub(now).max(1)
    }

    /// Nanoseconds until nothing is counted any more (0 when nothing is).
    pub fn until_fresh(&self, window: Window, now: u64) -> u64 {
        if self.count(window, now) == 0 {
            0
        } else {
            self.until_window_end(now)
        }
    }

    /// Nanoseconds until `cost` would be admitted: the next window. A cost above the quota
    /// (which never fits) and a zero quota get the time to the window's end too, as
    /// envoyproxy/ratelimit reports for every denial (its `requests_per_unit: 0` blocks).
    pub fn until_admitted(&self, window: Window, now: u64, cost: u64) -> u64 {
        if self.is_zero() || cost > self.quota {
            return self.until_window_end(now);
        }
        if self.admits(window, now, cost) {
            return 1;
        }
        self.until_window_end(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const MIN: u64 = 60 * SEC;

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        let w = FixedWindow::new(3, MIN);
        let now = 1_234 * SEC + 300_000_000;
        assert_eq!(w.window_start(now), 1_200 * SEC);
        // envoyproxy/ratelimit: unit - now % unit, in whole seconds: 60 - 34 = 26.
        assert_eq!(w.until_window_end(now).div_ceil(SEC), 26);
        let day = FixedWindow::new(1, 86_400 * SEC);
        assert_eq!(day.window_start(1_000_000 * SEC), 950_400 * SEC);
    }

    #[test]
    fn counts_up_to_the_quota_then_starts_again() {
        let w = FixedWindow::new(3, MIN);
        let mut s = EMPTY;
        for left in [2, 1, 0] {
            let step = w.evaluate(s, MIN + 5, 1);
            assert!(step.admitted);
            s = step.window;
            assert_eq!(w.remaining(s, MIN + 5), left);
        }
        assert!(!w.admits(s, 2 * MIN - 1, 1));
        assert_eq!(w.until_admitted(s, MIN + 5, 1), MIN - 5);
        assert_eq!(w.until_fresh(s, MIN + 5), MIN - 5);
        assert_eq!(w.remaining(s, 2 * MIN), 3);
        assert_eq!(w.until_fresh(s, 2 * MIN), 0);
    }

    #[test]
    fn zero_quota_and_oversized_costs() {
        let zero = FixedWindow::new(0, MIN);
        assert!(!zero.admits(EMPTY, 5, 1));
        assert!(zero.admits(EMPTY, 5, 0));
        assert_eq!(zero.consume(EMPTY, 5, 3), EMPTY);
        assert_eq!(zero.until_admitted(EMPTY, 5, 1), MIN - 5);
        let w = FixedWindow::new(2, MIN);
        assert_eq!(w.until_admitted(EMPTY, 5, 3), MIN - 5);
        // Still denied at the window's end: the retry time is a lower bound, as for others.
        assert!(!w.admits(EMPTY, MIN, 3));
        assert_eq!(w.until_admitted(EMPTY, MIN, 3), MIN);
    }

    #[test]
    fn week_month_and_year_windows_are_blocks_since_the_epoch() {
        use crate::config::model::Unit;
        let (week, month, year) = (604_800, 2_592_000, 31_536_000);
        assert_eq!(Unit::Week.seconds(), week);
        assert_eq!(Unit::Month.seconds(), month);
        assert_eq!(Unit::Year.seconds(), year);
        // 1970-01-08 00:00 UTC, a Thursday like the epoch, starts the second week.
        let w = FixedWindow::new(1, week * SEC);
        assert_eq!(w.window_start((week + 3_600) * SEC), week * SEC);
        // envoyproxy/ratelimit's reset at t = 1_000_000 s: unit - t % unit.
        let t = 1_000_000;
        for unit in [week, month, year] {
            let w = FixedWindow::new(1, unit * SEC);
            assert_eq!(
                w.until_window_end(t * SEC),
                (unit - t % unit) * SEC,
                "{unit}"
            );
        }
    }

    #[test]
    fn check_only_is_denied_only_over_the_quota() {
        let w = FixedWindow::new(2, MIN);
        let full = w.consume(EMPTY, 0, 2);
        assert!(w.admits(full, 0, 0));
        let over = w.consume(full, 0, 1);
        assert!(!w.admits(over, 0, 0));
        assert_eq!(w.until_admitted(over, 10, 0), MIN - 10);
    }

    #[test]
    fn refund_never_goes_below_zero_nor_into_another_window() {
        let w = FixedWindow::new(4, MIN);
        let s = w.consume(EMPTY, 0, 3);
        assert_eq!(w.remaining(w.refund(s, 0, 1), 0), 2);
        assert_eq!(w.refund(s, 0, 100), EMPTY);
        assert_eq!(w.refund(s, MIN, 1), EMPTY, "the window has passed");
        let named = w.consume(w.name_take(s, 0), 0, 1);
        assert_eq!(
            w.count(w.refund(named, 0, 4), 0),
            3,
            "only the anonymous unit"
        );
    }

    #[test]
    fn a_return_by_name_counts_only_in_its_window() {
        let w = FixedWindow::new(4, MIN);
        let s = w.consume(EMPTY, 5, 3);
        let mark = w.mark(5);
        assert_eq!(w.remaining(w.return_units(s, 10, 2, mark), 10), 3);
        let next = w.consume(s, MIN + 1, 4);
        assert_eq!(
            w.return_units(next, MIN + 2, 2, mark),
            next,
            "its window has passed"
        );
    }

    #[test]
    fn huge_numbers_saturate() {
        let w = FixedWindow::new(u32::MAX, u64::MAX);
        let s = w.consume(EMPTY, u64::MAX - 1, u64::MAX);
        assert_eq!(s.count, u64::MAX);
        assert_eq!(w.until_window_end(u64::MAX - 1), 1);
    }
}
