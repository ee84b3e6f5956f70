//! Property tests of the sliding window: its documented error bound, at most Q per aligned
//! window, exact retry and fresh times, denials that change nothing, and the memory backend
//! answering exactly what the pure window does.

#[path = "support/props.rs"]
mod props;

use std::collections::HashMap;

use props::*;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::sliding_window::{Counters, EMPTY, SlidingWindow};
use sluice::limiter::{HitOutcome, LimitParams};

fn sliding(quota: u32, period: u64, charge: Charge) -> LimitParams {
    params(
        Algorithm::SlidingWindow,
        quota,
        period,
        quota,
        false,
        charge,
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        max_global_rejects: 1 << 20,
        ..ProptestConfig::with_cases(256)
    })]

    /// The documented error bound: the cost admitted in any closed interval of length L is at
    /// most Q + ceil(Q * L / P); and at most Q in each aligned window.
    #[test]
    fn admitted_cost_is_bounded(
        quota in 1u32..50,
        period in MS..=10 * SEC,
        start in 0u64..=100 * SEC,
        steps in steps(200, 6),
    ) {
        let limit = sliding(quota, period, Charge::Admitted);
        let events = admitted_events(limit, start, period / 4, &steps);
        let q = u128::from(quota);
        assert_interval_bound(&events, |len| {
            q + (q * u128::from(len)).div_ceil(u128::from(period))
        })?;
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for (t, cost) in events {
            let counted = per_window.entry(t / period).or_default();
            *counted += cost;
            prop_assert!(*counted <= u64::from(quota));
        }
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing(
        limits in proptest::collection::vec(key_limit(Algorithm::SlidingWindow), 4),
        requests in requests(),
    ) {
        assert_denials_change_nothing(&limits, &requests)?;
    }

    /// The retry time of a denial is exact (still denied 1 ns before, admitted at it, without
    /// other traffic), and so is the time the estimate reaches 0.
    #[test]
    fn retry_and_fresh_times_are_exact(
        quota in 1u32..20,
        period in 1u64..=10 * SEC,
        current in 0u64..40,
        previous in 0u64..40,
        windows_ago in 0u64..3,
        offset in 0u64..=10 * SEC,
        cost in 0u64..30,
    ) {
        let w = SlidingWindow::new(quota, period);
        let now = 100 * period + offset % period;
        let start = now - now % period - windows_ago * period;
        let state = Counters { start, current, previous };
        let fresh = w.until_fresh(state, now);
        prop_assert_eq!(w.estimate(state, now + fresh), 0);
        if fresh > 0 {
            prop_assert!(w.estimate(state, now + fresh - 1) > 0);
        }
        prop_assume!(!w.admits(state, now, cost));
        let wait = w.until_admitted(state, now, cost);
        prop_assert!(wait >= 1);
        prop_assert!(!w.admits(state, now + wait - 1, cost));
        prop_assert_eq!(w.admits(state, now + wait, cost), cost <= u64::from(quota));
    }
}

/// The pure window's answer for one hit, and the state it leaves.
fn model(
    limit: &LimitParams,
    s: Counters,
    now: u64,
    cost: u64,
    refund: bool,
) -> (HitOutcome, Counters) {
    let w = SlidingWindow::new(limit.quota, limit.period_nanos);
    let admitted = refund || w.admits(s, now, cost);
    let next = match (admitted || limit.charge == Charge::Always, refund) {
        (false, _) => s,
        (true, true) => w.refund(s, now, cost),
        (true, false) => w.consume(s, now, cost),
    };
    let outcome = if admitted {
        HitOutcome {
            admitted,
            remaining: w.remaining(next, now),
            reset_nanos: w.until_fresh(next, now),
        }
    } else {
        HitOutcome {
            admitted,
            remaining: 0,
            reset_nanos: w.until_admitted(s, now, cost),
        }
    };
    (outcome, next)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For single hits, the memory backend answers exactly what the pure window does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_window(
        quota in 0u32..20,
        period in 1u64..=10 * SEC,
        always in any::<bool>(),
        start in 0u64..=SEC,
        steps in steps(200, 8),
        refunds in proptest::collection::vec(prop::bool::weighted(0.2), 200),
    ) {
        let charge = if always { Charge::Always } else { Charge::Admitted };
        let limit = sliding(quota, period, charge);
        let mut state = EMPTY;
        let hits = steps.iter().zip(&refunds).map(|(&(permille, cost), &refund)| (step(period, permille), cost, refund));
        assert_memory_agrees(limit, start, hits, |now, cost, refund| {
            let (want, next) = model(&limit, state, now, cost, refund);
            state = next;
            want
        })?;
    }
}
