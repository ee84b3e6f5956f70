//! Property tests of the funnel through the memory backend: the rate bound, exact retry times,
//! denials that change nothing, and agreement with the pure funnel.

use crate::support::*;
use proptest::prelude::*;
use sluice::config::model::Algorithm;
use sluice::limiter::LimitParams;
use sluice::limiter::funnel::{FRESH_STATE, Funnel, Tat};

/// The nominal interval P/Q, the unit of the time steps.
fn interval(period: u64, quota: u32) -> u64 {
    period / u64::from(quota.max(1))
}

proptest! {
    #![proptest_config(config())]

    /// For `funnel`, the admitted cost in any interval of length L is at most B + Q*L/P, in
    /// exact integers (a whole cost is at most B + floor(Q*L/P) iff it is at most B + Q*L/P).
    #[test]
    fn admitted_cost_in_any_interval_is_bounded(
        quota in 1u32..1000,
        period in MS..=10 * SEC,
        burst in prop_oneof![1u32..10, 1u32..2000],
        start in 0u64..=SEC,
        steps in steps(200, 5),
    ) {
        let limit = LimitParams {
            burst,
            ..limit(Algorithm::Funnel, quota, period)
        };
        let events = admitted_events(limit, start, interval(period, quota), &steps);
        assert_interval_bound(&events, |len| {
            u128::from(burst) + u128::from(quota) * u128::from(len) / u128::from(period)
        })?;
    }

    /// The retry time of a denial is exact: still denied one nanosecond before it, admitted
    /// at it (without other traffic) when the cost fits at all. The deny cache of the Redis
    /// backend relies on it.
    #[test]
    fn the_retry_time_is_exact(
        quota in 0u32..20,
        period in 1u64..=10 * SEC,
        burst in 0u32..30,
        borrow in any::<bool>(),
        tat in 0u64..=40 * SEC,
        now in 0u64..=20 * SEC,
        cost in 0u64..40,
    ) {
        let probe = if borrow { cost.min(1) } else { cost };
        let fits = quota > 0 && probe <= u64::from(burst);
        let f = Funnel::new(quota, period, burst, borrow);
        let state = Tat { tat, quota, refundable: 0 };
        assert_retry_time_is_exact(&f, &state, now, cost, fits)?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing((limits, requests) in denials(Algorithm::Funnel)) {
        assert_denials_change_nothing(&limits, &requests)?;
    }

    /// For single hits, the memory backend answers exactly what the pure funnel does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_funnel(
        (limit, start, hits) in single_hits(Algorithm::Funnel),
    ) {
        let unit = interval(limit.period_nanos, limit.quota);
        assert_memory_agrees(limit, start, unit, &hits, &limit.funnel(), FRESH_STATE)?;
    }
}
