//! Property tests of the sliding log: never more than Q in any window of length P, exact retry
//! times, a bounded log, denials that change nothing, and the memory backend answering
//! exactly what the pure log does.

#[path = "support/props.rs"]
mod props;

use props::*;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::sliding_log::{Log, MAX_QUOTA, SlidingLog};
use sluice::limiter::{HitOutcome, LimitParams};

fn sliding_log(quota: u32, period: u64, charge: Charge) -> LimitParams {
    params(Algorithm::SlidingLog, quota, period, quota, false, charge)
}

proptest! {
    #![proptest_config(ProptestConfig {
        max_global_rejects: 1 << 20,
        ..ProptestConfig::with_cases(256)
    })]

    /// The cost admitted in any window of length P never exceeds Q: in any closed interval
    /// shorter than P, at most Q (and at most Q per P beyond).
    #[test]
    fn admitted_cost_in_any_window_of_length_p_is_at_most_q(
        quota in 1u32..50,
        period in MS..=10 * SEC,
        start in 0u64..=100 * SEC,
        steps in steps(200, 6),
    ) {
        let limit = sliding_log(quota, period, Charge::Admitted);
        let events = admitted_events(limit, start, period / 4, &steps);
        let q = u128::from(quota);
        assert_interval_bound(&events, |len| q * u128::from(len / period + 1))?;
    }

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing(
        limits in vec(key_limit(Algorithm::SlidingLog), 4),
        requests in requests(),
    ) {
        assert_denials_change_nothing(&limits, &requests)?;
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
        prop_assume!(!l.admits(&log, now, cost));
        let wait = l.until_admitted(&log, now, cost);
        prop_assert!(wait >= 1);
        prop_assert!(!l.admits(&log, now + wait - 1, cost));
        prop_assert_eq!(l.admits(&log, now + wait, cost), cost <= u64::from(quota));
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
}

/// The pure log's answer for one hit; the log is updated in place.
fn model(limit: &LimitParams, log: &mut Log, now: u64, cost: u64, refund: bool) -> HitOutcome {
    let l = SlidingLog::new(limit.quota, limit.period_nanos);
    let admitted = refund || l.admits(log, now, cost);
    let wait = l.until_admitted(log, now, cost);
    match (admitted || limit.charge == Charge::Always, refund) {
        (false, _) => {}
        (true, true) => l.refund(log, now, cost),
        (true, false) => l.consume(log, now, cost),
    }
    if admitted {
        HitOutcome {
            admitted,
            remaining: l.remaining(log, now),
            reset_nanos: l.until_fresh(log, now),
        }
    } else {
        HitOutcome {
            admitted,
            remaining: 0,
            reset_nanos: wait,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For single hits, the memory backend answers exactly what the pure log does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_log(
        quota in 0u32..20,
        period in 1u64..=10 * SEC,
        always in any::<bool>(),
        start in 0u64..=SEC,
        steps in steps(200, 8),
        refunds in vec(prop::bool::weighted(0.2), 200),
    ) {
        let charge = if always { Charge::Always } else { Charge::Admitted };
        let limit = sliding_log(quota, period, charge);
        let mut log = Log::default();
        let hits = steps.iter().zip(&refunds).map(|(&(permille, cost), &refund)| (step(period, permille), cost, refund));
        assert_memory_agrees(limit, start, hits, |now, cost, refund| {
            model(&limit, &mut log, now, cost, refund)
        })?;
    }
}
