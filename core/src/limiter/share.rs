//! Regions: the rules of a global limit's shares, as pure functions (no I/O).
//!
//! A limit with `scope: global` lives in a home Redis (`redis.global_url`), which lends each
//! region a share of it with the lease rules of [`super::lease`] (the lessee being the region,
//! one of its two pool slots): home counts a share's units as spent at the share's expiry, so
//! no interval over-admits, partitions included. The region spends its share in its own
//! Redis, for all its replicas at once (`redis/lua/share.lua`). These functions size a share,
//! bound its validity, map home's expiry onto the region's clock, and size the one documented
//! way to over-admit (`redis.global_on_error = "share"`).
//!
//! ```
//! use sluice_core::limiter::share::{self, Sizing};
//! const MS: u64 = 1_000_000;
//! let sizing = Sizing { share_nanos: 2_000 * MS, lease_nanos: 10_000 * MS, percent: 10 };
//! // 20 a second seen in the region: a share covers 2 s of it.
//! assert_eq!(share::want(20, 1, &sizing), 40);
//! // Home's share expires 9 s after home's now; the region asked at its own t = 100 s.
//! assert_eq!(share::until(100_000 * MS, 5_000 * MS, 14_000 * MS), 109_000 * MS);
//! ```

use super::LimitParams;
use super::lease;
use crate::config::model::Algorithm;

/// How shares are sized (`redis.global_*` settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// A share covers about this much of the region's observed traffic (`global_share_ms`).
    pub share_nanos: u64,
    /// A share may be spent at most this long (`global_lease_ms`).
    pub lease_nanos: u64,
    /// `global_share_percent`: what a cut-off region admits per period under `share`.
    pub percent: u64,
}

impl Default for Sizing {
    fn default() -> Self {
        Sizing {
            share_nanos: 2_000_000_000,
            lease_nanos: 10_000_000_000,
            percent: 10,
        }
    }
}

/// The share to ask home for: about `share_nanos` of the region's rate (units a second),
/// never less than the cost at hand (nor 1). Home gives at most a quarter of what it has left
/// (the lease rule), which shrinks shares as the quota runs out, so that one region does not
/// take what another would spend.
pub fn want(rate: u64, cost: u64, sizing: &Sizing) -> u64 {
    let covered = u128::from(rate) * u128::from(sizing.share_nanos) / 1_000_000_000;
    u64::try_from(covered).unwrap_or(u64::MAX).max(cost).max(1)
}

/// How long a share on `limit` may be spent: `lease_nanos`, and for a funnel short enough
/// that the jump of its slots to the expiry wastes at most a tenth of its burst (the lease
/// rule of [`lease::validity`]). Home shortens it further to the algorithm's horizon (a
/// window's end, a bucket's next refill).
pub fn validity(limit: &LimitParams, sizing: &Sizing) -> u64 {
    let lease_sizing = lease::Sizing {
        validity_nanos: sizing.lease_nanos,
        burst_percent: 10,
        ..lease::Sizing::default()
    };
    lease::validity(limit, &lease_sizing).max(1_000_000)
}

/// Until when the region may spend a share, on its own clock: `sent` (the region's time
/// before the call to home left) plus what home said was left of the share
/// (`expires - home_now`). Never later than home's expiry, whatever the clocks: the call
/// reached home after `sent`.
pub fn until(sent: u64, home_now: u64, expires: u64) -> u64 {
    sent.saturating_add(expires.saturating_sub(home_now))
}

/// What each cut-off region admits of `limit` per period under `global_on_error = "share"`:
/// `percent` of its capacity (the quota; the burst for a funnel or a bucket), rounded down.
/// With R regions, at most R times this over the limit per period.
pub fn fallback(limit: &LimitParams, sizing: &Sizing) -> u64 {
    lease::capacity(limit).saturating_mul(sizing.percent) / 100
}

/// Whether `limit` can be global: the algorithms whose shares are exact (fixed windows without
/// a calendar, sliding windows, token buckets, funnels), counted when admitted, without
/// `borrow` or `block_for` (the rules file refuses the others at load).
pub fn shareable(limit: &LimitParams) -> bool {
    lease::leasable(limit)
        && limit.calendar.is_none()
        && matches!(
            limit.algorithm,
            Algorithm::FixedWindow
                | Algorithm::SlidingWindow
                | Algorithm::TokenBucket
                | Algorithm::Funnel
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::Charge;

    const MS: u64 = 1_000_000;

    fn limit(algorithm: Algorithm, quota: u32, period: u64, burst: u32) -> LimitParams {
        LimitParams {
            algorithm,
            quota,
            period_nanos: period,
            burst,
            charge: Charge::Admitted,
            borrow: false,
            block_nanos: 0,
            global: true,
            calendar: None,
        }
    }

    #[test]
    fn a_share_covers_the_regions_rate_for_share_ms_and_at_least_the_cost() {
        let sizing = Sizing::default();
        assert_eq!(want(20, 1, &sizing), 40);
        assert_eq!(want(0, 1, &sizing), 1);
        assert_eq!(want(0, 7, &sizing), 7);
        assert_eq!(want(u64::MAX, 1, &sizing), u64::MAX);
    }

    #[test]
    fn a_funnels_share_is_short_enough_to_waste_a_tenth_of_its_burst_at_most() {
        let sizing = Sizing::default();
        // 10 a second, burst 600: 60 units are 6 s.
        let funnel = limit(Algorithm::Funnel, 600, 60_000 * MS, 600);
        assert_eq!(validity(&funnel, &sizing), 6_000 * MS);
        // A window: the lease length (home cuts it at the window's end).
        let window = limit(Algorithm::FixedWindow, 600, 60_000 * MS, 600);
        assert_eq!(validity(&window, &sizing), 10_000 * MS);
        // Never under a millisecond.
        let fast = limit(Algorithm::Funnel, 1_000_000, 1_000 * MS, 10);
        assert_eq!(validity(&fast, &sizing), MS);
    }

    #[test]
    fn the_regions_until_is_never_later_than_homes_expiry() {
        // Home's now came after the region's sent: the region stops no later than home.
        assert_eq!(until(100, 50, 80), 130);
        assert_eq!(until(100, 90, 80), 100, "an expired share ends at once");
    }

    #[test]
    fn the_fallback_is_a_percent_of_the_capacity_rounded_down() {
        let sizing = Sizing::default();
        assert_eq!(
            fallback(&limit(Algorithm::FixedWindow, 600, MS, 600), &sizing),
            60
        );
        assert_eq!(
            fallback(&limit(Algorithm::TokenBucket, 5, MS, 100), &sizing),
            10
        );
        assert_eq!(
            fallback(&limit(Algorithm::FixedWindow, 9, MS, 9), &sizing),
            0
        );
    }

    #[test]
    fn only_exact_algorithms_are_shareable() {
        let ok = [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::Funnel,
        ];
        for a in ok {
            assert!(shareable(&limit(a, 5, MS, 5)), "{a:?}");
        }
        for a in [Algorithm::SlidingLog, Algorithm::Concurrency] {
            assert!(!shareable(&limit(a, 5, MS, 5)), "{a:?}");
        }
        let always = LimitParams {
            charge: Charge::Always,
            ..limit(Algorithm::FixedWindow, 5, MS, 5)
        };
        assert!(!shareable(&always));
    }
}
