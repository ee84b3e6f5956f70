//! Property tests of the fixed window: at most Q per epoch-aligned window, remaining and reset
//! as envoyproxy/ratelimit reports them, exact retry times, denials that change nothing, and
//! the memory backend answering exactly what the pure window does.

#[path = "support/props.rs"]
mod props;

use std::collections::HashMap;

use props::*;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::fixed_window::{EMPTY, FixedWindow, Window};
use sluice::limiter::{HitOutcome, LimitParams, ManualClock, MemoryLimiter, Role};

fn window(quota: u32, period: u64, charge: Charge) -> LimitParams {
    params(Algorithm::FixedWindow, quota, period, quota, false, charge)
}

proptest! {
    #![proptest_config(ProptestConfig {
        max_global_rejects: 1 << 20,
        ..ProptestConfig::with_cases(256)
    })]

    /// At most Q is admitted in each window [k*P, (k+1)*P): windows are aligned to the epoch.
    /// Every admitted hit reports `Q - count` remaining and the time to its window's end, as
    /// envoyproxy/ratelimit does (without counting denied costs).
    #[test]
    fn at_most_the_quota_per_aligned_window(
        quota in 1u32..50,
        period in MS..=10 * SEC,
        start in 0u64..=100 * SEC,
        steps in steps(200, 6),
    ) {
        let limit = window(quota, period, Charge::Admitted);
        let clock = ManualClock::at(start);
        let limiter = MemoryLimiter::with_clock(16, clock.clone());
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        let mut now = start;
        for &(permille, cost) in &steps {
            now += step(period / 4, permille);
            clock.set(now);
            let o = check(&limiter, vec![hit("k", limit, cost, false, 0, Role::Enforced)]);
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

    /// A denied request changes no state (but that of its `charge: always` limits).
    #[test]
    fn a_denied_request_changes_nothing(
        limits in proptest::collection::vec(key_limit(Algorithm::FixedWindow), 4),
        requests in requests(),
    ) {
        assert_denials_change_nothing(&limits, &requests)?;
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
        let state = Window { start: w.window_start(now) - windows_ago * period, count };
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
    s: Window,
    now: u64,
    cost: u64,
    refund: bool,
) -> (HitOutcome, Window) {
    let w = FixedWindow::new(limit.quota, limit.period_nanos);
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
            reset_nanos: w.until_window_end(now),
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
        let limit = window(quota, period, charge);
        let mut state = EMPTY;
        let hits = steps.iter().zip(&refunds).map(|(&(permille, cost), &refund)| (step(period, permille), cost, refund));
        assert_memory_agrees(limit, start, hits, |now, cost, refund| {
            let (want, next) = model(&limit, state, now, cost, refund);
            state = next;
            want
        })?;
    }
}
