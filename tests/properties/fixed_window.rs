//! Property tests of the fixed window: at most Q per epoch-aligned window, remaining and reset
//! as envoyproxy/ratelimit reports them, exact retry times, denials that change nothing, and
//! the memory backend answering exactly what the pure window does.

use std::collections::HashMap;

use crate::support::*;
use proptest::prelude::*;
use sluice::config::model::Algorithm;
use sluice::limiter::fixed_window::{EMPTY, FixedWindow, Window};

proptest! {
    #![proptest_config(config())]

    /// At most Q is admitted in each window [k*P, (k+1)*P): windows are aligned to the epoch.
    /// Every admitted hit reports `Q - count` remaining and the time to its window's end, as
    /// envoyproxy/ratelimit does (without counting denied costs).
    #[test]
    fn at_most_the_quota_per_aligned_window((quota, period, start, steps) in window_runs()) {
        let limit = limit(Algorithm::FixedWindow, quota, period);
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for (now, cost, o) in outcomes(limit, start, period / 4, &steps) {
            let counted = per_window.entry(now / period).or_default();
            if o.admitted {
                *counted += cost;
                prop_assert!(*counted <= u64::from(quota));
                prop_assert_eq!(o.hits[0].remaining, u64::from(quota) - *counted);
                prop_assert_eq!(o.hits[0].reset_nanos, (now / period + 1) * period - now);
            } else {
                prop_assert!(*counted + cost > u64::from(quota));
            }
        }
    }

    /// The retry time of a denial is exact: still denied one nanosecond before it, admitted
    /// at it (without other traffic).
    #[test]
    fn the_retry_time_is_exact(
        quota in 1u32..20,
        period in 1u64..=10 * SEC,
        count in 0u64..40,
        windows_ago in 0u64..3,
        offset in 0u64..=10 * SEC,
        cost in 0u64..30,
    ) {
        let w = FixedWindow::new(quota, period);
        let now = 100 * period + offset % period;
        let state = Window { start: w.window_start(now) - windows_ago * period, count, refundable: 0 };
        assert_retry_time_is_exact(&w, &state, now, cost, cost <= u64::from(quota))?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing((limits, requests) in denials(Algorithm::FixedWindow)) {
        assert_denials_change_nothing(&limits, &requests)?;
    }

    /// For single hits, the memory backend answers exactly what the pure window does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_window(
        (limit, start, hits) in single_hits(Algorithm::FixedWindow),
    ) {
        let w = FixedWindow::new(limit.quota, limit.period_nanos);
        assert_memory_agrees(limit, start, limit.period_nanos, &hits, &w, EMPTY)?;
    }
}
