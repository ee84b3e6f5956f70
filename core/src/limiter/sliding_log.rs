//! The sliding log: an exact log of admitted cost, as pure integer functions.
//!
//! The log keeps each admitted cost with its time; an entry counts for P after its time (an
//! entry at `t` is gone at `t + P`). A cost `c` is admitted while the cost logged in the last P
//! plus `c` is at most Q, so the cost admitted in any interval of length P never exceeds Q:
//! no burst at any edge. The price is memory: one entry per admitted request (costs at one
//! instant share an entry), so up to Q entries per key; rules cap Q at [`MAX_QUOTA`].
//!
//! The log is kept in time order. A cost is appended at `max(now, newest time)` (a clock that
//! went back never reorders it), merged into the newest entry when that has the same time.
//! A refund gives back the newest cost first. With `charge: always` the log may hold more
//! than Q; to stay bounded, a log of [`MAX_QUOTA`] entries (or Q, if smaller) merges a new
//! cost into its newest entry, moved to the new time (it then counts a little longer: this
//! only ever denies more). In debt, even a check-only cost of 0 is denied. `borrow` means
//! nothing here (rules refuse it). A zero quota admits nothing with a cost and keeps no state.
//!
//! ```
//! use sluice_core::limiter::sliding_log::{Log, SlidingLog};
//! const SEC: u64 = 1_000_000_000;
//! // 3 per minute.
//! let l = SlidingLog::new(3, 60 * SEC);
//! let mut log = Log::default();
//! l.consume(&mut log, 10 * SEC, 2);
//! l.consume(&mut log, 40 * SEC, 1);
//! assert!(!l.admits(&log, 69 * SEC, 1));
//! assert_eq!(l.until_admitted(&log, 69 * SEC, 1), SEC, "the entry of 10 s leaves at 70 s");
//! assert!(l.admits(&log, 70 * SEC, 2));
//! let (admitted, after) = l.evaluate(&log, 70 * SEC, 2);
//! assert!(admitted);
//! assert_eq!(after.sum(), 3);
//! ```

use std::collections::VecDeque;

/// The largest `requests_per_unit` the rules accept for a sliding log, and the most entries a
/// log holds.
pub const MAX_QUOTA: u32 = crate::config::model::SLIDING_LOG_MAX_QUOTA;

/// One limit's log parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    /// Q. 0 means a zero quota.
    quota: u64,
    /// P, at least 1.
    period: u64,
}

/// Admitted costs by time, oldest first, times strictly increasing; and their sum. It may
/// still hold entries that have expired (they are dropped when it next changes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    entries: VecDeque<(u64, u64)>,
    /// The exact sum of the entries' costs: at most `MAX_QUOTA` entries of at most
    /// `u64::MAX` each never overflow a u128, so a sum never saturates and then loses track
    /// of the entries (a saturated sum, less an entry that left, would be less than the
    /// entries still there).
    sum: u128,
}

impl Log {
    /// No entries.
    pub const EMPTY: Log = Log {
        entries: VecDeque::new(),
        sum: 0,
    };

    /// The entries `(time, cost)`, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// The sum of the entries' costs, expired ones included (`u64::MAX` if it is more).
    pub fn sum(&self) -> u64 {
        clamp(self.sum)
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The log of these entries `(time, cost)`, as [`Log::entries`] gave them (a snapshot's);
    /// `None` unless their times strictly increase.
    pub(crate) fn from_entries(entries: VecDeque<(u64, u64)>) -> Option<Log> {
        let ordered = entries
            .iter()
            .zip(entries.iter().skip(1))
            .all(|(a, b)| a.0 < b.0);
        let sum = entries.iter().map(|&(_, c)| u128::from(c)).sum();
        ordered.then_some(Log { entries, sum })
    }
}

impl SlidingLog {
    /// A log of `quota` per `period`.
    pub fn new(quota: u32, period: u64) -> SlidingLog {
        SlidingLog {
            quota: u64::from(quota),
            period: period.max(1),
        }
    }

    fn is_zero(&self) -> bool {
        self.quota == 0
    }

    /// The most entries a log holds.
    fn max_entries(&self) -> usize {
        let cap = self.quota.clamp(1, u64::from(MAX_QUOTA));
        usize::try_from(cap).unwrap_or(1)
    }

    fn expired(&self, time: u64, now: u64) -> bool {
        time.saturating_add(self.period) <= now
    }

    /// The entries still counting at `now`, oldest first.
    fn live<'a>(&self, log: &'a Log, now: u64) -> impl Iterator<Item = (u64, u64)> + 'a {
        let period = self.period;
        log.entries()
            .skip_while(move |&(t, _)| t.saturating_add(period) <= now)
    }

    /// The cost logged in the last P at `now` (`u64::MAX` if it is more).
    pub fn logged(&self, log: &Log, now: u64) -> u64 {
        clamp(self.logged_exactly(log, now))
    }

    fn logged_exactly(&self, log: &Log, now: u64) -> u128 {
        let expired: u128 = log
            .entries()
            .take_while(|&(t, _)| self.expired(t, now))
            .map(|(_, c)| u128::from(c))
            .sum();
        log.sum - expired
    }

    /// Drops the entries that no longer count at `now`.
    fn trim(&self, log: &mut Log, now: u64) {
        while let Some(&(t, c)) = log.entries.front() {
            if !self.expired(t, now) {
                break;
            }
            log.entries.pop_front();
            log.sum -= u128::from(c);
        }
    }

    /// Whether `cost` at `now` is admitted.
    pub fn admits(&self, log: &Log, now: u64, cost: u64) -> bool {
        if self.is_zero() {
            return cost == 0;
        }
        self.logged(log, now).saturating_add(cost) <= self.quota
    }

    /// Logs `cost` at `now`, admitted or not.
    pub fn consume(&self, log: &mut Log, now: u64, cost: u64) {
        if self.is_zero() || cost == 0 {
            return;
        }
        self.trim(log, now);
        let full = log.entries.len() >= self.max_entries();
        // What the entries gain: an entry's cost saturates at u64::MAX.
        let added = match log.entries.back_mut() {
            Some(back) if back.0 >= now || full => {
                back.0 = back.0.max(now);
                let before = back.1;
                back.1 = back.1.saturating_add(cost);
                back.1 - before
            }
            _ => {
                log.entries.push_back((now, cost));
                cost
            }
        };
        log.sum += u128::from(added);
    }

    /// Whether `cost` at `now` is admitted, and the log if it is logged: the pure function of
    /// (state, now, cost). The backends use [`Self::admits`] and [`Self::consume`] instead,
    /// which do not copy the log.
    pub fn evaluate(&self, log: &Log, now: u64, cost: u64) -> (bool, Log) {
        let mut after = log.clone();
        self.consume(&mut after, now, cost);
        (self.admits(log, now, cost), after)
    }

    /// Gives `cost` back at `now`, newest entries first; never below empty.
    pub fn refund(&self, log: &mut Log, now: u64, cost: u64) {
        if self.is_zero() || cost == 0 {
            return;
        }
        self.trim(log, now);
        let mut left = cost;
        while left > 0 {
            let Some(back) = log.entries.back_mut() else {
                break;
            };
            let take = left.min(back.1);
            back.1 -= take;
            left -= take;
            log.sum -= u128::from(take);
            if back.1 == 0 {
                log.entries.pop_back();
            }
        }
    }

    /// Where a take at `now` logged its cost: the time of the newest entry (the mark a return
    /// by name needs, [`SlidingLog::return_units`]).
    pub fn mark(&self, log: &Log, now: u64) -> u64 {
        log.entries.back().map_or(now, |&(t, _)| t)
    }

    /// Returns `units` logged in the entry of time `at`: taken from that entry while it still
    /// counts, never below empty; nothing once it has left the log.
    pub fn return_units(&self, log: &mut Log, now: u64, units: u64, at: u64) {
        if self.is_zero() || units == 0 {
            return;
        }
        self.trim(log, now);
        let Ok(i) = log.entries.binary_search_by_key(&at, |&(t, _)| t) else {
            return;
        };
        let Some(entry) = log.entries.get_mut(i) else {
            return;
        };
        let take = units.min(entry.1);
        entry.1 -= take;
        log.sum -= u128::from(take);
        if entry.1 == 0 {
            log.entries.remove(i);
        }
    }

    /// What the log still admits at `now`.
    pub fn remaining(&self, log: &Log, now: u64) -> u64 {
        if self.is_zero() {
            return 0;
        }
        self.quota.saturating_sub(self.logged(log, now))
    }

    /// Nanoseconds until the newest entry stops counting (0 when none counts).
    pub fn until_fresh(&self, log: &Log, now: u64) -> u64 {
        log.entries.back().map_or(0, |&(t, _)| {
            t.saturating_add(self.period).saturating_sub(now)
        })
    }

    /// Nanoseconds until `cost` would be admitted (without other traffic): when enough of the
    /// oldest entries have left. A cost above the quota (which never fits) and a zero quota get
    /// at least one period. Never 0 for a cost that is denied now.
    pub fn until_admitted(&self, log: &Log, now: u64, cost: u64) -> u64 {
        if self.is_zero() || cost > self.quota {
            return self.until_fresh(log, now).max(self.period);
        }
        // Exact, in u128: what must leave the log for `cost` to fit.
        let need = (self.logged_exactly(log, now) + u128::from(cost))
            .saturating_sub(u128::from(self.quota));
        if need == 0 {
            return 1;
        }
        let mut freed = 0u128;
        for (t, c) in self.live(log, now) {
            freed += u128::from(c);
            if freed >= need {
                return t.saturating_add(self.period).saturating_sub(now).max(1);
            }
        }
        self.period
    }
}

/// `n`, or `u64::MAX` if it is more.
fn clamp(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const MIN: u64 = 60 * SEC;

    fn entries(log: &Log) -> Vec<(u64, u64)> {
        log.entries().collect()
    }

    #[test]
    fn entries_leave_one_period_after_their_time() {
        let l = SlidingLog::new(5, MIN);
        let mut log = Log::default();
        l.consume(&mut log, 0, 2);
        l.consume(&mut log, 0, 1);
        l.consume(&mut log, 30 * SEC, 2);
        assert_eq!(entries(&log), [(0, 3), (30 * SEC, 2)]);
        assert!(!l.admits(&log, MIN - 1, 1));
        assert_eq!(l.until_admitted(&log, MIN - 1, 1), 1);
        assert_eq!(l.remaining(&log, MIN), 3);
        assert_eq!(
            l.until_admitted(&log, 10 * SEC, 4),
            80 * SEC,
            "both entries must leave"
        );
        assert_eq!(l.until_fresh(&log, 10 * SEC), 80 * SEC);
        l.consume(&mut log, MIN, 1);
        assert_eq!(
            entries(&log),
            [(30 * SEC, 2), (MIN, 1)],
            "trimmed as it changes"
        );
        assert_eq!(log.sum(), 3);
    }

    #[test]
    fn refunds_give_back_the_newest_first() {
        let l = SlidingLog::new(10, MIN);
        let mut log = Log::default();
        l.consume(&mut log, 0, 3);
        l.consume(&mut log, SEC, 2);
        l.refund(&mut log, SEC, 4);
        assert_eq!(entries(&log), [(0, 1)]);
        l.refund(&mut log, SEC, 100);
        assert!(log.is_empty());
        assert_eq!(log.sum(), 0);
    }

    #[test]
    fn a_return_by_name_comes_from_its_entry() {
        let l = SlidingLog::new(10, MIN);
        let mut log = Log::default();
        l.consume(&mut log, 0, 3);
        let mark = l.mark(&log, 0);
        l.consume(&mut log, SEC, 2);
        l.return_units(&mut log, SEC, 5, mark);
        assert_eq!(entries(&log), [(SEC, 2)]);
        l.consume(&mut log, 2 * SEC, 1);
        let mark = l.mark(&log, 2 * SEC);
        l.return_units(&mut log, 2 * SEC + MIN, 1, mark);
        assert!(log.is_empty(), "the entry had left");
        assert_eq!(log.sum(), 0);
    }

    #[test]
    fn a_full_log_merges_into_its_newest_entry() {
        let l = SlidingLog::new(2, MIN);
        let mut log = Log::default();
        for t in 0..4 {
            l.consume(&mut log, t * SEC, 1);
        }
        assert_eq!(entries(&log), [(0, 1), (3 * SEC, 3)]);
        assert!(!l.admits(&log, 0, 0), "in debt: 4 logged for a quota of 2");
    }

    #[test]
    fn time_never_goes_back_in_the_log() {
        let l = SlidingLog::new(5, MIN);
        let mut log = Log::default();
        l.consume(&mut log, 10 * SEC, 1);
        l.consume(&mut log, 5 * SEC, 1);
        assert_eq!(entries(&log), [(10 * SEC, 2)]);
    }

    #[test]
    fn zero_quota_and_oversized_costs() {
        let zero = SlidingLog::new(0, MIN);
        let mut log = Log::default();
        assert!(!zero.admits(&log, 5, 1));
        assert!(zero.admits(&log, 5, 0));
        zero.consume(&mut log, 5, 3);
        assert!(log.is_empty());
        assert_eq!(zero.until_admitted(&log, 5, 1), MIN);
        let l = SlidingLog::new(2, MIN);
        assert_eq!(l.until_admitted(&log, 5, 3), MIN);
    }

    #[test]
    fn a_sum_beyond_u64_stays_exact_when_an_entry_leaves() {
        // The entries hold 2^64 + 14 together; once the first leaves, 77 still count.
        let l = SlidingLog::new(130, 100);
        let mut log = Log::default();
        l.consume(&mut log, 0, u64::MAX - 62);
        l.consume(&mut log, 10, 77);
        assert_eq!(l.logged(&log, 50), u64::MAX);
        assert_eq!(
            l.until_admitted(&log, 50, 62),
            60,
            "until the second leaves, at 110"
        );
        assert_eq!(l.logged(&log, 100), 77);
        assert!(!l.admits(&log, 109, 62));
        assert!(l.admits(&log, 110, 62));
        l.consume(&mut log, 105, 1);
        assert_eq!((log.len(), log.sum()), (2, 78));
        assert_eq!(l.logged(&log, 105), 78);
    }

    #[test]
    fn huge_numbers_saturate() {
        let l = SlidingLog::new(u32::MAX, u64::MAX);
        let mut log = Log::default();
        l.consume(&mut log, 0, u64::MAX);
        l.consume(&mut log, 1, 5);
        assert_eq!(log.sum(), u64::MAX);
        assert_eq!(l.remaining(&log, 1), 0);
        assert_eq!(l.until_admitted(&log, 1, 1), u64::MAX - 1);
    }
}
