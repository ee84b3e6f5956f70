//! Property tests of the funnel through the memory backend: the rate bound, exact retry times,
//! denials that change nothing, and agreement with the pure funnel.

#[path = "support/props.rs"]
mod props;

use props::*;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::funnel::{FRESH, Funnel};
use sluice::limiter::{HitOutcome, LimitParams};

fn funnel(quota: u32, period: u64, burst: u32, borrow: bool, charge: Charge) -> LimitParams {
    params(Algorithm::Funnel, quota, period, burst, borrow, charge)
}

/// The nominal interval P/Q, the unit of the time steps.
fn interval(period: u64, quota: u32) -> u64 {
    period / u64::from(quota.max(1))
}

proptest! {
    #![proptest_config(ProptestConfig {
        max_global_rejects: 1 << 20,
        ..ProptestConfig::with_cases(256)
    })]

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
        let limit = funnel(quota, period, burst, false, Charge::Admitted);
        let events = admitted_events(limit, start, interval(period, quota), &steps);
        assert_interval_bound(&events, |len| {
            u128::from(burst) + u128::from(quota) * u128::from(len) / u128::from(period)
        })?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing(
        limits in vec(key_limit(Algorithm::Funnel), 4),
        requests in requests(),
    ) {
        assert_denials_change_nothing(&limits, &requests)?;
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
        let f = Funnel::new(quota, period, burst, borrow);
        prop_assume!(!f.evaluate(tat, now, cost).admitted);
        let wait = f.until_admitted(tat, now, cost);
        prop_assert!(wait >= 1);
        prop_assert!(!f.evaluate(tat, now + wait - 1, cost).admitted);
        let probe = if borrow { cost.min(1) } else { cost };
        let fits = quota > 0 && probe <= u64::from(burst);
        prop_assert_eq!(f.evaluate(tat, now + wait, cost).admitted, fits);
    }
}

/// The pure funnel's answer for one hit, and the state it leaves.
fn model(limit: &LimitParams, tat: u64, now: u64, cost: u64, refund: bool) -> (HitOutcome, u64) {
    let f: Funnel = limit.funnel();
    let admitted = refund || f.evaluate(tat, now, cost).admitted;
    let next = match (admitted || limit.charge == Charge::Always, refund) {
        (false, _) => tat,
        (true, true) => f.refund(tat, now, cost),
        (true, false) => f.consume(tat, now, cost),
    };
    let outcome = if admitted {
        HitOutcome {
            admitted,
            remaining: f.remaining(next, now),
            reset_nanos: f.until_empty(next, now),
        }
    } else {
        HitOutcome {
            admitted,
            remaining: 0,
            reset_nanos: f.until_admitted(tat, now, cost),
        }
    };
    (outcome, next)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For single hits, the memory backend answers exactly what the pure funnel does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_funnel(
        quota in 0u32..20,
        period in 1u64..=10 * SEC,
        burst in 0u32..30,
        borrow in any::<bool>(),
        always in any::<bool>(),
        start in 0u64..=SEC,
        steps in steps(200, 8),
        refunds in vec(prop::bool::weighted(0.2), 200),
    ) {
        let charge = if always { Charge::Always } else { Charge::Admitted };
        let limit = funnel(quota, period, burst, borrow, charge);
        let unit = interval(period, quota);
        let mut tat = FRESH;
        let hits = steps.iter().zip(&refunds).map(|(&(permille, cost), &refund)| (step(unit, permille), cost, refund));
        assert_memory_agrees(limit, start, hits, |now, cost, refund| {
            let (want, next) = model(&limit, tat, now, cost, refund);
            tat = next;
            want
        })?;
    }
}
