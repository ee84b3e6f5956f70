//! Property tests of the token bucket: its bound, exact retry times, denials that change
//! nothing, and the memory backend answering exactly what the pure bucket does.

#[path = "support/props.rs"]
mod props;

use props::*;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::token_bucket::{Bucket, FULL, TokenBucket};
use sluice::limiter::{HitOutcome, LimitParams};

fn bucket(quota: u32, period: u64, burst: u32, borrow: bool, charge: Charge) -> LimitParams {
    params(Algorithm::TokenBucket, quota, period, burst, borrow, charge)
}

proptest! {
    #![proptest_config(ProptestConfig {
        max_global_rejects: 1 << 20,
        ..ProptestConfig::with_cases(256)
    })]

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
        let limit = bucket(quota, period, burst, false, Charge::Admitted);
        let events = admitted_events(limit, start, period / 4, &steps);
        assert_interval_bound(&events, |len| {
            u128::from(burst) + u128::from(quota) * u128::from(len.div_ceil(period))
        })?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing(
        limits in proptest::collection::vec(key_limit(Algorithm::TokenBucket), 4),
        requests in requests(),
    ) {
        assert_denials_change_nothing(&limits, &requests)?;
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
        let b = TokenBucket::new(quota, period, burst, borrow);
        let state = Bucket { used, anchor };
        let now = anchor + later;
        prop_assume!(!b.admits(state, now, cost));
        let wait = b.until_admitted(state, now, cost);
        prop_assert!(wait >= 1);
        prop_assert!(!b.admits(state, now + wait - 1, cost));
        let fits = (if borrow { cost.min(1) } else { cost }) <= u64::from(burst);
        prop_assert_eq!(b.admits(state, now + wait, cost), fits);
    }
}

/// The pure bucket's answer for one hit, and the state it leaves.
fn model(
    limit: &LimitParams,
    s: Bucket,
    now: u64,
    cost: u64,
    refund: bool,
) -> (HitOutcome, Bucket) {
    let b = TokenBucket::new(limit.quota, limit.period_nanos, limit.burst, limit.borrow);
    let admitted = refund || b.admits(s, now, cost);
    let next = match (admitted || limit.charge == Charge::Always, refund) {
        (false, _) => s,
        (true, true) => b.refund(s, now, cost),
        (true, false) => b.consume(s, now, cost),
    };
    let outcome = if admitted {
        HitOutcome {
            admitted,
            remaining: b.remaining(next, now),
            reset_nanos: b.until_full(next, now),
        }
    } else {
        HitOutcome {
            admitted,
            remaining: 0,
            reset_nanos: b.until_admitted(s, now, cost),
        }
    };
    (outcome, next)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For single hits, the memory backend answers exactly what the pure bucket does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_bucket(
        quota in 0u32..20,
        period in 1u64..=10 * SEC,
        burst in 0u32..30,
        borrow in any::<bool>(),
        always in any::<bool>(),
        start in 0u64..=SEC,
        steps in steps(200, 8),
        refunds in proptest::collection::vec(prop::bool::weighted(0.2), 200),
    ) {
        let charge = if always { Charge::Always } else { Charge::Admitted };
        let limit = bucket(quota, period, burst, borrow, charge);
        let mut state = FULL;
        let hits = steps.iter().zip(&refunds).map(|(&(permille, cost), &refund)| (step(period, permille), cost, refund));
        assert_memory_agrees(limit, start, hits, |now, cost, refund| {
            let (want, next) = model(&limit, state, now, cost, refund);
            state = next;
            want
        })?;
    }
}
