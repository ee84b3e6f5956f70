//! Property tests of the token bucket: its bound, exact retry times, denials that change
//! nothing, and the memory backend answering exactly what the pure bucket does.

use crate::support::*;
use proptest::prelude::*;
use sluice::config::model::Algorithm;
use sluice::limiter::LimitParams;
use sluice::limiter::token_bucket::{Bucket, FULL, TokenBucket};

proptest! {
    #![proptest_config(config())]

    /// The cost admitted in any closed interval of length L is at most B + Q * ceil(L / P):
    /// a full bucket, plus one refill per period begun (refills that add tokens are at least
    /// P apart, as the schedule starts when a full bucket gives its first token).
    #[test]
    fn admitted_cost_in_any_interval_is_bounded(
        quota in 1u32..50,
        period in MS..=10 * SEC,
        burst in 1u32..60,
        start in 0u64..=10 * SEC,
        steps in steps(200, 6),
    ) {
        let limit = LimitParams {
            burst,
            ..limit(Algorithm::TokenBucket, quota, period)
        };
        let events = admitted_events(limit, start, period / 4, &steps);
        assert_interval_bound(&events, |len| {
            u128::from(burst) + u128::from(quota) * u128::from(len.div_ceil(period))
        })?;
    }

    /// The retry time of a denial is exact: still denied one nanosecond before it, admitted
    /// at it (without other traffic). The deny cache of the Redis backend relies on it.
    #[test]
    fn the_retry_time_is_exact(
        quota in 1u32..20,
        period in 1u64..=10 * SEC,
        burst in 1u32..30,
        borrow in any::<bool>(),
        used in 0u64..100,
        anchor in 0u64..=10 * SEC,
        later in 0u64..=20 * SEC,
        cost in 0u64..40,
    ) {
        let fits = (if borrow { cost.min(1) } else { cost }) <= u64::from(burst);
        let b = TokenBucket::new(quota, period, burst, borrow);
        assert_retry_time_is_exact(&b, &Bucket { used, anchor, refundable: 0 }, anchor + later, cost, fits)?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing((limits, requests) in denials(Algorithm::TokenBucket)) {
        assert_denials_change_nothing(&limits, &requests)?;
    }

    /// For single hits, the memory backend answers exactly what the pure bucket does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_bucket(
        (limit, start, hits) in single_hits(Algorithm::TokenBucket),
    ) {
        let (q, p, b, borrow) = (limit.quota, limit.period_nanos, limit.burst, limit.borrow);
        let bucket = TokenBucket::new(q, p, b, borrow);
        assert_memory_agrees(limit, start, p, &hits, &bucket, FULL)?;
    }
}
