//! Property tests of the sliding window: its documented error bound, at most Q per aligned
//! window, exact retry and fresh times, denials that change nothing, and the memory backend
//! answering exactly what the pure window does.

use std::collections::HashMap;

use crate::support::*;
use proptest::prelude::*;
use sluice::config::model::Algorithm;
use sluice::limiter::sliding_window::{Counters, EMPTY, SlidingWindow};

proptest! {
    #![proptest_config(config())]

    /// The documented error bound: the cost admitted in any closed interval of length L is at
    /// most Q + ceil(Q * L / P); and at most Q in each aligned window.
    #[test]
    fn admitted_cost_is_bounded((quota, period, start, steps) in window_runs()) {
        let limit = limit(Algorithm::SlidingWindow, quota, period);
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
        let state = Counters { start, current, previous, refundable: 0 };
        let fresh = w.until_fresh(state, now);
        prop_assert_eq!(w.estimate(state, now + fresh), 0);
        if fresh > 0 {
            prop_assert!(w.estimate(state, now + fresh - 1) > 0);
        }
        assert_retry_time_is_exact(&w, &state, now, cost, cost <= u64::from(quota))?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing((limits, requests) in denials(Algorithm::SlidingWindow)) {
        assert_denials_change_nothing(&limits, &requests)?;
    }

    /// For single hits, the memory backend answers exactly what the pure window does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_window(
        (limit, start, hits) in single_hits(Algorithm::SlidingWindow),
    ) {
        let w = SlidingWindow::new(limit.quota, limit.period_nanos);
        assert_memory_agrees(limit, start, limit.period_nanos, &hits, &w, EMPTY)?;
    }
}
