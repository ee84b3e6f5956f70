//! The share computation, as pure integer functions: how a rule's rate is split among the
//! data planes reporting one bucket, and the token bucket that carries one share.
//!
//! Rates are in nano-requests per second (`u64`), so that a quota of 1 per year and one of
//! `u32::MAX` per second are both exact enough; products go through `u128`.
//!
//! - [`fair_rates`] splits a total rate among members by max-min fairness on what each
//!   asks for (its measured demand plus headroom): nobody gets more than it asks while
//!   another asks for more, and whatever is left is shared out equally; the shares never sum
//!   above the total.
//! - [`token_bucket`] turns one share into the whole-second token bucket Envoy enforces: a
//!   rate of `tokens_per_fill / fill_interval` never above the share, and a capacity that is
//!   the member's part of what the shared state has left (at least 1).
//!
//! ```
//! use sluice::rlqs::share::{NANOS, fair_rates, token_bucket};
//! // 10 per second shared by an Envoy asking for 2/s and one asking for 50/s.
//! let rates = fair_rates(10 * NANOS, &[Some(2 * NANOS), Some(50 * NANOS)]);
//! assert!(rates.iter().sum::<u64>() <= 10 * NANOS);
//! assert!(rates[0] >= 2 * NANOS && rates[1] > rates[0]);
//! let tb = token_bucket(rates[1], 10 * NANOS, 10).unwrap();
//! assert!(u128::from(tb.tokens_per_fill) * u128::from(NANOS)
//!     <= u128::from(rates[1]) * u128::from(tb.fill_interval_secs));
//! ```

/// Nano-requests per second in one request per second.
pub const NANOS: u64 = 1_000_000_000;

/// Longest fill interval handed out, in seconds.
const MAX_FILL_INTERVAL: u64 = 100_000_000;

/// Below this many tokens per fill a longer interval is used, for precision.
const PRECISE_FILL: u64 = 100;

/// The rate a limit of `quota` per `period_secs` allows, in nano-requests per second.
pub(crate) fn limit_rate(quota: u32, period_secs: u64) -> u64 {
    let rate = u128::from(quota) * u128::from(NANOS) / u128::from(period_secs.max(1));
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// The rate measured over a report: `requests` in `elapsed_secs` (0: not measurable).
pub fn demand(requests: u64, elapsed_secs: u64) -> Option<u64> {
    if elapsed_secs == 0 {
        return None;
    }
    let rate = u128::from(requests) * u128::from(NANOS) / u128::from(elapsed_secs);
    Some(u64::try_from(rate).unwrap_or(u64::MAX))
}

/// What a member asks for: its demand plus half of it, plus a twentieth of the total, so a
/// growing data plane is not held at its past rate; `None` (not measured yet) asks for all.
pub fn ask(demand: Option<u64>, total: u64) -> u64 {
    match demand {
        None => total,
        Some(d) => d
            .saturating_add(d / 2)
            .saturating_add(total / 20)
            .min(total),
    }
}

/// Splits `total` among members asking `demands` (see [`ask`]): max-min fair, the rest
/// shared equally. The result has one rate per member and never sums above `total`.
pub fn fair_rates(total: u64, demands: &[Option<u64>]) -> Vec<u64> {
    let n = demands.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let asks: Vec<u64> = demands.iter().map(|&d| ask(d, total)).collect();
    let mut order: Vec<usize> = (0..asks.len()).collect();
    order.sort_by_key(|&i| asks[i]);
    let mut rates = vec![0; asks.len()];
    let mut left = total;
    for (done, &i) in order.iter().enumerate() {
        let equal = left / (n - done as u64);
        rates[i] = asks[i].min(equal);
        left -= rates[i];
    }
    // What nobody asked for is shared out equally (a member may grow into it).
    let extra = left / n;
    for rate in &mut rates {
        *rate += extra;
    }
    rates
}

/// A token bucket as Envoy enforces it: `tokens_per_fill / fill_interval_secs` per second,
/// holding at most `max_tokens` (and starting full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketSpec {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval_secs: u64,
}

/// The token bucket of a member's `rate`, out of a limit's `total` rate, with a capacity that
/// is the member's part of `left` (what the shared state holds now, at most the burst).
/// `None` when the rate is 0: nothing may pass.
pub fn token_bucket(rate: u64, total: u64, left: u64) -> Option<TokenBucketSpec> {
    let (tokens_per_fill, fill_interval_secs) = fill(rate)?;
    let part = u128::from(left) * u128::from(rate) / u128::from(total.max(1));
    let max_tokens = u32::try_from(part).unwrap_or(u32::MAX).max(1);
    Some(TokenBucketSpec {
        max_tokens,
        tokens_per_fill,
        fill_interval_secs,
    })
}

/// Whole-second fill interval and tokens per fill for `rate`, rounded down: the shortest
/// interval of 1, 2, 5, 10, 20, 50, ... seconds that divides exactly or gives at least
/// [`PRECISE_FILL`] tokens.
fn fill(rate: u64) -> Option<(u32, u64)> {
    if rate == 0 {
        return None;
    }
    let mut best = None;
    for interval in intervals() {
        let scaled = u128::from(rate) * u128::from(interval);
        let tokens = scaled / u128::from(NANOS);
        if tokens > u128::from(u32::MAX) {
            return Some(best.unwrap_or((u32::MAX, interval)));
        }
        if tokens >= 1 {
            best = Some((tokens as u32, interval));
        }
        let exact = tokens >= 1 && scaled % u128::from(NANOS) == 0;
        if exact || tokens >= u128::from(PRECISE_FILL) {
            break;
        }
    }
    best
}

/// 1, 2, 5, 10, 20, 50, ... up to [`MAX_FILL_INTERVAL`].
fn intervals() -> impl Iterator<Item = u64> {
    let mut decade = 1u64;
    std::iter::from_fn(move || {
        let steps = [decade, decade * 2, decade * 5];
        decade *= 10;
        Some(steps)
    })
    .flatten()
    .take_while(|&i| i <= MAX_FILL_INTERVAL)
}

/// How many requests a data plane may have legitimately admitted in a report covering
/// `elapsed_secs` (whole seconds, truncated by Envoy: up to one more second really passed)
/// under a limit of rate `total`, beyond the burst: the report is charged in one go, so the
/// limiter is checked with the burst raised by this much.
pub(crate) fn report_allowance(total: u64, elapsed_secs: u64) -> u64 {
    let tokens = u128::from(total) * u128::from(elapsed_secs.saturating_add(1));
    u64::try_from(tokens.div_ceil(u128::from(NANOS))).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_member_gets_everything() {
        assert_eq!(fair_rates(10 * NANOS, &[None]), vec![10 * NANOS]);
        assert_eq!(fair_rates(10 * NANOS, &[Some(NANOS)]), vec![10 * NANOS]);
    }

    #[test]
    fn equal_demands_split_equally() {
        let rates = fair_rates(10 * NANOS, &[Some(50 * NANOS), Some(50 * NANOS)]);
        assert_eq!(rates, vec![5 * NANOS, 5 * NANOS]);
    }

    #[test]
    fn a_small_demand_leaves_the_rest_to_a_big_one() {
        let rates = fair_rates(10 * NANOS, &[Some(NANOS), Some(50 * NANOS)]);
        // The small one asks 1 + 0.5 + 0.5 = 2/s and gets it; the big one the other 8.
        assert_eq!(rates, vec![2 * NANOS, 8 * NANOS]);
    }

    #[test]
    fn ten_per_second_is_ten_tokens_each_second() {
        let tb = token_bucket(10 * NANOS, 10 * NANOS, 10).unwrap();
        assert_eq!(
            tb,
            TokenBucketSpec {
                max_tokens: 10,
                tokens_per_fill: 10,
                fill_interval_secs: 1
            }
        );
    }

    #[test]
    fn a_third_is_rounded_down_precisely() {
        let rate = 10 * NANOS / 3;
        let tb = token_bucket(rate, 10 * NANOS, 10).unwrap();
        assert_eq!((tb.tokens_per_fill, tb.fill_interval_secs), (166, 50));
        assert_eq!(tb.max_tokens, 3);
    }

    #[test]
    fn tiny_rates_get_long_intervals_and_zero_denies() {
        let yearly = limit_rate(1, 365 * 86_400);
        let tb = token_bucket(yearly, yearly, 1).unwrap();
        assert!(tb.fill_interval_secs >= 365 * 86_400 / 2);
        assert!(
            u128::from(tb.tokens_per_fill) * u128::from(NANOS)
                <= u128::from(yearly) * u128::from(tb.fill_interval_secs)
        );
        assert_eq!(token_bucket(0, NANOS, 5), None);
        assert_eq!(
            token_bucket(1, u64::MAX, 0).map(|t| t.tokens_per_fill),
            None
        );
    }

    #[test]
    fn nothing_left_still_leaves_one_token_of_capacity() {
        let tb = token_bucket(5 * NANOS, 10 * NANOS, 0).unwrap();
        assert_eq!(tb.max_tokens, 1);
    }

    #[test]
    fn huge_quotas_saturate_without_panicking() {
        let total = limit_rate(u32::MAX, 1);
        let tb = token_bucket(total, total, u64::MAX).unwrap();
        assert_eq!(tb.max_tokens, u32::MAX);
        assert!(tb.tokens_per_fill > 0);
        assert_eq!(report_allowance(total, u64::MAX), u64::MAX);
        assert_eq!(demand(u64::MAX, 1), Some(u64::MAX));
    }

    #[test]
    fn allowance_covers_the_truncated_second() {
        assert_eq!(report_allowance(10 * NANOS, 5), 60);
        assert_eq!(report_allowance(10 * NANOS, 0), 10);
    }

    proptest! {
        #[test]
        fn shares_never_exceed_the_total(
            total in 0u64..(1u64 << 62),
            demands in proptest::collection::vec(proptest::option::of(0u64..(1u64 << 62)), 0..40),
        ) {
            let rates = fair_rates(total, &demands);
            prop_assert_eq!(rates.len(), demands.len());
            let sum: u128 = rates.iter().map(|&r| u128::from(r)).sum();
            prop_assert!(sum <= u128::from(total));
        }

        #[test]
        fn shares_are_max_min_fair(
            total in 1u64..(1u64 << 50),
            demands in proptest::collection::vec(proptest::option::of(0u64..(1u64 << 50)), 1..40),
        ) {
            let rates = fair_rates(total, &demands);
            let n = demands.len() as u64;
            for (i, &d) in demands.iter().enumerate() {
                // Each gets what it asks, or at least an equal share (less rounding).
                let floor = ask(d, total).min(total / n).saturating_sub(n);
                prop_assert!(rates[i] >= floor, "member {} got {} < {}", i, rates[i], floor);
            }
            // Nothing is wasted beyond rounding.
            let sum: u64 = rates.iter().sum();
            prop_assert!(total - sum <= 2 * n);
        }

        #[test]
        fn a_bucket_never_fills_faster_than_its_share(
            rate in 0u64..(1u64 << 62),
            total in 1u64..(1u64 << 62),
            left in 0u64..(1u64 << 40),
        ) {
            match token_bucket(rate, total, left) {
                None => prop_assert!(rate < NANOS / MAX_FILL_INTERVAL + 1 || rate == 0),
                Some(tb) => {
                    prop_assert!(tb.fill_interval_secs >= 1);
                    prop_assert!(tb.tokens_per_fill >= 1);
                    prop_assert!(tb.max_tokens >= 1);
                    prop_assert!(
                        u128::from(tb.tokens_per_fill) * u128::from(NANOS)
                            <= u128::from(rate) * u128::from(tb.fill_interval_secs)
                    );
                    let part = u128::from(left) * u128::from(rate) / u128::from(total);
                    prop_assert!(u128::from(tb.max_tokens) <= part.max(1));
                }
            }
        }
    }
}
