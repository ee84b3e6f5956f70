//! Property tests of the sliding log: never more than Q in any window of length P, exact retry
//! times, a bounded log, denials that change nothing, and the memory backend answering
//! exactly what the pure log does.

use crate::support::*;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::Algorithm;
use sluice::limiter::sliding_log::{Log, MAX_QUOTA, SlidingLog};

proptest! {
    #![proptest_config(config())]

    /// The cost admitted in any window of length P never exceeds Q: in any closed interval
    /// shorter than P, at most Q (and at most Q per P beyond).
    #[test]
    fn admitted_cost_in_any_window_of_length_p_is_at_most_q((quota, period, start, steps) in window_runs()) {
        let limit = limit(Algorithm::SlidingLog, quota, period);
        let events = admitted_events(limit, start, period / 4, &steps);
        let q = u128::from(quota);
        assert_interval_bound(&events, |len| q * u128::from(len / period + 1))?;
    }

    /// The retry time of a denial is exact (still denied 1 ns before, admitted at it, without
    /// other traffic); the log is fresh exactly when its newest entry leaves.
    #[test]
    fn retry_and_fresh_times_are_exact(
        quota in 1u32..20,
        period in 1u64..=10 * SEC,
        logged in vec((0u64..=2 * SEC, 1u64..8), 0..30),
        later in 0u64..=10 * SEC,
        cost in 0u64..30,
    ) {
        let l = SlidingLog::new(quota, period);
        let mut log = Log::default();
        let mut now = 100 * SEC;
        for (step, c) in logged {
            now += step;
            l.consume(&mut log, now, c);
        }
        now += later;
        let fresh = l.until_fresh(&log, now);
        prop_assert_eq!(l.remaining(&log, now + fresh), u64::from(quota));
        if fresh > 0 {
            prop_assert!(l.remaining(&log, now + fresh - 1) < u64::from(quota));
        }
        assert_retry_time_is_exact(&l, &log, now, cost, cost <= u64::from(quota))?;
    }

    /// Whatever is charged (`charge: always`), a log holds at most min(Q, MAX_QUOTA) entries.
    #[test]
    fn the_log_stays_bounded(
        quota in 1u32..20,
        charges in vec((0u64..SEC, 1u64..5), 1..200),
    ) {
        let l = SlidingLog::new(quota, 60 * SEC);
        let mut log = Log::default();
        let mut now = 0;
        for (step, cost) in charges {
            now += step;
            l.consume(&mut log, now, cost);
            prop_assert!(log.len() <= quota.min(MAX_QUOTA) as usize);
        }
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing((limits, requests) in denials(Algorithm::SlidingLog)) {
        assert_denials_change_nothing(&limits, &requests)?;
    }

    /// For single hits, the memory backend answers exactly what the pure log does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_log(
        (limit, start, hits) in single_hits(Algorithm::SlidingLog),
    ) {
        let l = SlidingLog::new(limit.quota, limit.period_nanos);
        assert_memory_agrees(limit, start, limit.period_nanos, &hits, &l, Log::default())?;
    }
}
