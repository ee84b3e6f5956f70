//! The token bucket: stepwise refills, as pure integer functions.
//!
//! A bucket holds at most B tokens (the burst) and starts full. A cost `c` takes `c` tokens;
//! every period P after the first token is taken, Q tokens are put back at once (not one by one
//! as in the funnel), never above B. So a full bucket admits a burst of B, then Q per period,
//! in steps.
//!
//! State is `(used, anchor)`: the tokens missing from a full bucket, as of the refill step at
//! `anchor`; the next refill is at `anchor + P`. A full bucket is [`FULL`] and holds no
//! information (it is never stored). The refill schedule starts when a full bucket gives its
//! first token, so refills that add tokens are always at least P apart; hence the bound: the
//! cost admitted in any closed interval of length L is at most `B + Q * ceil(L / P)`.
//!
//! With `borrow`, a cost is admitted whenever one token is left, and then taken in full (the
//! bucket goes into debt, paid back by later refills). `charge: always` can also take more
//! than is left. In debt, even a check-only cost of 0 is denied. A zero quota admits nothing
//! with a cost and keeps no state. Arithmetic saturates; nothing divides by zero or panics.
//!
//! ```
//! use sluice_core::limiter::token_bucket::{TokenBucket, FULL};
//! const SEC: u64 = 1_000_000_000;
//! // 2 tokens every second, at most 4 held.
//! let b = TokenBucket::new(2, SEC, 4, false);
//! let first = b.evaluate(FULL, 10 * SEC, 4);
//! assert!(first.admitted);
//! assert!(!b.admits(first.bucket, 10 * SEC + SEC - 1, 1), "no refill before a whole period");
//! let later = b.evaluate(first.bucket, 11 * SEC, 2);
//! assert!(later.admitted, "2 tokens are back after one period");
//! assert_eq!(b.until_admitted(later.bucket, 11 * SEC, 1), SEC);
//! ```

/// One limit's bucket parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    /// Q: tokens put back per period. 0 means a zero quota.
    quota: u64,
    /// P, at least 1.
    period: u64,
    /// B: the most tokens held.
    burst: u64,
    borrow: bool,
}

/// A bucket's state: tokens missing from full, as of the refill step at `anchor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bucket {
    pub used: u64,
    pub anchor: u64,
    /// Tokens taken by anonymous takes in the current refill step since the last named take
    /// (a reservation): the most an anonymous refund gives back.
    pub refundable: u64,
}

/// A full bucket: the state of a key never used (or refilled completely).
pub const FULL: Bucket = Bucket {
    used: 0,
    anchor: 0,
    refundable: 0,
};

/// The result of evaluating one cost against a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The bucket alone would admit this cost.
    pub admitted: bool,
    /// The bucket after taking the cost (whether admitted or not).
    pub bucket: Bucket,
}

impl TokenBucket {
    /// A bucket of `burst` tokens, `quota` of them put back every `period`.
    pub fn new(quota: u32, period: u64, burst: u32, borrow: bool) -> TokenBucket {
        TokenBucket {
            quota: u64::from(quota),
            period: period.max(1),
            burst: u64::from(burst),
            borrow,
        }
    }

    fn is_zero(&self) -> bool {
        self.quota == 0
    }

    /// The bucket at `now`, with every refill due by then applied.
    pub(crate) fn refilled(&self, bucket: Bucket, now: u64) -> Bucket {
        if bucket.used == 0 {
            return FULL;
        }
        let steps = now.saturating_sub(bucket.anchor) / self.period;
        if steps == 0 {
            return bucket;
        }
        let used = bucket.used.saturating_sub(steps.saturating_mul(self.quota));
        if used == 0 {
            return FULL;
        }
        Bucket {
            used,
            anchor: bucket
                .anchor
                .saturating_add(steps.saturating_mul(self.period)),
            refundable: 0,
        }
    }

    /// The next refill step after `now` (a lease never crosses it). A full bucket's steps
    /// start from its next take: its next step is one period after `now`, where a take at
    /// `now` (a lease's) puts it.
    pub(crate) fn next_refill(&self, bucket: Bucket, now: u64) -> u64 {
        let at = self.refilled(bucket, now);
        if at.used == 0 {
            return now.saturating_add(self.period);
        }
        at.anchor.saturating_add(self.period)
    }

    fn probe(&self, cost: u64) -> u64 {
        if self.borrow { cost.min(1) } else { cost }
    }

    /// Whether `cost` at `now` is admitted.
    pub fn admits(&self, bucket: Bucket, now: u64, cost: u64) -> bool {
        if self.is_zero() {
            return cost == 0;
        }
        let used = self.refilled(bucket, now).used;
        used.saturating_add(self.probe(cost)) <= self.burst
    }

    /// The bucket after taking `cost` at `now`, admitted or not. What is owed is capped: the
    /// bucket never lacks more than [`TokenBucket::debt_cap`] tokens (nor more than it lacked
    /// before). Only a cost taken beyond what is left meets the cap: one charged while denied
    /// (`charge: always`), or a borrowed one.
    pub fn consume(&self, bucket: Bucket, now: u64, cost: u64) -> Bucket {
        if self.is_zero() || cost == 0 {
            return bucket;
        }
        let at = self.refilled(bucket, now);
        let used = at
            .used
            .saturating_add(cost)
            .min(self.debt_cap().max(at.used));
        Bucket {
            used,
            anchor: if at.used == 0 { now } else { at.anchor },
            refundable: at.refundable.saturating_add(cost),
        }
    }

    /// `at` with `used` tokens missing (full when none).
    fn settled(&self, at: Bucket, used: u64, refundable: u64) -> Bucket {
        if used == 0 {
            return FULL;
        }
        Bucket {
            used,
            anchor: at.anchor,
            refundable: refundable.min(used),
        }
    }

    /// The most tokens a bucket may lack: the burst plus one refill, so at most one period's
    /// quota is owed beyond empty.
    pub(crate) fn debt_cap(&self) -> u64 {
        self.burst.saturating_add(self.quota)
    }

    /// Whether `cost` at `now` is admitted, and the bucket if it is taken.
    pub fn evaluate(&self, bucket: Bucket, now: u64, cost: u64) -> Step {
        Step {
            admitted: self.admits(bucket, now, cost),
            bucket: self.consume(bucket, now, cost),
        }
    }

    /// The bucket after an anonymous refund of `cost` tokens at `now`: at most the tokens
    /// anonymous takes took in the current refill step since the last named take; never above
    /// full.
    pub fn refund(&self, bucket: Bucket, now: u64, cost: u64) -> Bucket {
        if self.is_zero() || cost == 0 {
            return bucket;
        }
        let at = self.refilled(bucket, now);
        let back = cost.min(at.refundable);
        self.settled(at, at.used.saturating_sub(back), at.refundable - back)
    }

    /// Names the take just made at `now`: anonymous refunds no longer give back the tokens
    /// taken so far.
    pub fn name_take(&self, bucket: Bucket, now: u64) -> Bucket {
        let at = self.refilled(bucket, now);
        if at.used == 0 {
            return bucket;
        }
        Bucket {
            refundable: 0,
            ..at
        }
    }

    /// Where a take at `now` counted its tokens: the refill step of the bucket after it (its
    /// `anchor`), the mark a return by name needs ([`TokenBucket::return_units`]).
    pub fn mark(&self, bucket: Bucket, now: u64) -> u64 {
        self.refilled(bucket, now).anchor
    }

    /// The bucket after returning `units` taken in the refill step at `anchor`: given back
    /// only while that step is still the current one (no refill since), never above full;
    /// nothing once a refill has come.
    pub fn return_units(&self, bucket: Bucket, now: u64, units: u64, anchor: u64) -> Bucket {
        let at = self.refilled(bucket, now);
        if self.is_zero() || units == 0 || at.used == 0 || at.anchor != anchor {
            return bucket;
        }
        self.settled(at, at.used.saturating_sub(units), at.refundable)
    }

    /// Tokens left at `now`.
    pub fn remaining(&self, bucket: Bucket, now: u64) -> u64 {
        if self.is_zero() {
            return 0;
        }
        self.burst.saturating_sub(self.refilled(bucket, now).used)
    }

    /// When, after `now`, the refills will have put back `missing` tokens of `at`.
    fn refill_time(&self, at: Bucket, missing: u64, now: u64) -> u64 {
        let steps = missing.div_ceil(self.quota);
        at.anchor
            .saturating_add(steps.saturating_mul(self.period))
            .saturating_sub(now)
    }

    /// Nanoseconds until the bucket is full again (0 when it is).
    pub fn until_full(&self, bucket: Bucket, now: u64) -> u64 {
        let at = self.refilled(bucket, now);
        if self.is_zero() || at.used == 0 {
            return 0;
        }
        self.refill_time(at, at.used, now)
    }

    /// Nanoseconds until `cost` would be admitted: the next refill that makes room. A cost
    /// that never fits (more than the burst, without `borrow`) and a zero quota get at least
    /// one period. Never 0 for a cost that is denied now.
    pub fn until_admitted(&self, bucket: Bucket, now: u64, cost: u64) -> u64 {
        if self.is_zero() {
            return self.period;
        }
        let probe = self.probe(cost);
        let wait = if probe > self.burst {
            self.until_full(bucket, now).max(self.period)
        } else {
            let at = self.refilled(bucket, now);
            let excess = at.used.saturating_sub(self.burst - probe);
            if excess == 0 {
                0
            } else {
                self.refill_time(at, excess, now)
            }
        };
        wait.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn burst_then_stepwise_refills() {
        let b = TokenBucket::new(3, SEC, 5, false);
        let mut s = FULL;
        for left in (0..5).rev() {
            let step = b.evaluate(s, 100, 1);
            assert!(step.admitted);
            s = step.bucket;
            assert_eq!(b.remaining(s, 100), left);
        }
        assert_eq!(
            s.anchor, 100,
            "the schedule starts at the first token taken"
        );
        assert!(!b.admits(s, 100 + SEC - 1, 1));
        assert_eq!(b.until_admitted(s, 100, 1), SEC);
        assert_eq!(b.remaining(s, 100 + SEC), 3);
        assert_eq!(b.until_admitted(s, 100, 4), 2 * SEC);
        assert_eq!(b.until_full(s, 100), 2 * SEC);
        assert_eq!(b.refilled(s, 100 + 2 * SEC), FULL);
    }

    #[test]
    fn zero_quota_denies_costs_and_keeps_no_state() {
        let b = TokenBucket::new(0, SEC, 0, false);
        assert!(!b.admits(FULL, 5, 1));
        assert!(b.admits(FULL, 5, 0));
        assert_eq!(b.consume(FULL, 5, 3), FULL);
        assert_eq!(b.until_admitted(FULL, 5, 1), SEC);
        assert_eq!(b.remaining(FULL, 5), 0);
    }

    #[test]
    fn check_only_is_denied_only_in_debt() {
        let b = TokenBucket::new(2, SEC, 2, false);
        let empty = b.consume(FULL, SEC, 2);
        assert!(b.admits(empty, SEC, 0));
        let debt = b.consume(empty, SEC, 1);
        assert!(!b.admits(debt, SEC, 0));
        assert_eq!(b.until_admitted(debt, SEC, 0), SEC);
    }

    #[test]
    fn borrow_admits_while_a_token_is_left() {
        let b = TokenBucket::new(5, SEC, 5, true);
        let s = b.evaluate(FULL, SEC, 8);
        assert!(s.admitted);
        assert_eq!(b.remaining(s.bucket, SEC), 0);
        assert!(!b.admits(s.bucket, SEC, 1));
        // 8 used: one refill brings it to 3, and a token is left.
        assert_eq!(b.until_admitted(s.bucket, SEC, 1), SEC);
        let strict = TokenBucket::new(5, SEC, 5, false);
        assert!(!strict.admits(FULL, SEC, 6));
        assert_eq!(strict.until_admitted(FULL, SEC, 6), SEC);
    }

    #[test]
    fn refund_never_goes_above_full() {
        let b = TokenBucket::new(4, SEC, 4, false);
        let s = b.consume(FULL, SEC, 3);
        assert_eq!(b.remaining(b.refund(s, SEC, 1), SEC), 2);
        assert_eq!(b.refund(s, SEC, 100), FULL);
        assert_eq!(b.refund(FULL, SEC, 1), FULL);
        let named = b.consume(b.name_take(s, SEC), SEC, 1);
        assert_eq!(
            b.remaining(b.refund(named, SEC, 4), SEC),
            1,
            "only the anonymous token"
        );
        let later = b.consume(FULL, SEC, 4);
        let refunded = b.refund(later, 2 * SEC - 1, 1);
        assert_eq!(b.remaining(refunded, 2 * SEC - 1), 1);
        let at_refill = b.refund(later, 2 * SEC + 1, 1);
        assert_eq!(
            at_refill, FULL,
            "a refill has come: nothing refundable (and full)"
        );
    }

    #[test]
    fn a_return_by_name_counts_only_in_its_refill_step() {
        let b = TokenBucket::new(4, SEC, 4, false);
        let s = b.consume(FULL, SEC, 3);
        let mark = b.mark(s, SEC);
        assert_eq!(
            b.remaining(b.return_units(s, SEC + 10, 2, mark), SEC + 10),
            3
        );
        let s = b.consume(s, SEC, 1);
        assert_eq!(b.return_units(s, 2 * SEC, 2, mark), s, "a refill has come");
        assert_eq!(b.return_units(s, SEC, 2, mark + 1), s, "another step");
    }

    #[test]
    fn huge_numbers_saturate() {
        let b = TokenBucket::new(1, u64::MAX, u32::MAX, true);
        let s = b.evaluate(FULL, u64::MAX - 1, u64::MAX);
        assert!(s.admitted);
        assert_eq!(b.remaining(s.bucket, u64::MAX), 0);
        assert_eq!(b.until_full(s.bucket, 0), u64::MAX);
    }

    /// A bucket charged while denied owes at most one refill beyond empty: a client that
    /// hammers is admitted again once two refills have come (one pays the debt, the next
    /// makes room), however many tries it made.
    #[test]
    fn debt_is_capped_at_one_refill() {
        let b = TokenBucket::new(10, SEC, 20, false);
        let mut bucket = FULL;
        let mut now = SEC;
        for _ in 0..10_000 {
            bucket = b.evaluate(bucket, now, 1).bucket;
            now += SEC / 1_000;
        }
        let last = now - SEC / 1_000;
        assert_eq!(
            b.refilled(bucket, last).used,
            b.debt_cap(),
            "20 + 10 missing, no more"
        );
        assert!(b.admits(bucket, bucket.anchor + 2 * SEC, 1));
        assert!(
            bucket.anchor + 2 * SEC <= last + 2 * SEC,
            "within two periods of the last try"
        );
        assert!(
            !b.admits(bucket, bucket.anchor + SEC, 1),
            "one refill pays the debt only"
        );
    }

    proptest::proptest! {
        /// Whatever is charged, a bucket never lacks more than the burst plus one refill, and
        /// a charge that fits under that is taken whole.
        #[test]
        fn debt_never_passes_the_cap(
            quota in 1u32..1_000,
            period in 1u64..100 * SEC,
            burst in 1u32..2_000,
            steps in proptest::collection::vec((0u64..SEC, 0u64..5_000), 1..60),
        ) {
            let b = TokenBucket::new(quota, period, burst, false);
            let (mut bucket, mut now) = (FULL, SEC);
            for (gap, cost) in steps {
                now += gap;
                let before = b.refilled(bucket, now).used;
                let next = b.evaluate(bucket, now, cost).bucket;
                let used = b.refilled(next, now).used;
                proptest::prop_assert!(used <= b.debt_cap().max(before));
                if before + cost <= b.debt_cap() {
                    proptest::prop_assert_eq!(used, before + cost);
                }
                bucket = next;
            }
        }
    }
}
