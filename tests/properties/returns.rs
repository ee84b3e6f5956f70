//! Returns and changed limits through the memory backend on a manual clock
//! (docs/algorithms.md, "Returns" and "A changed limit").
//!
//! - Random takes, reservations, commits (at most the estimate used) and anonymous refunds:
//!   in every interval, the units admitted, less the units returned (a commit's by its
//!   reservation, at the reservation's time; an anonymous refund's, as its stated bound
//!   allows, to the newest units it may give back), stay within the algorithm's bound. That
//!   is: no return makes a limiter fresher than if the returned units had never been taken.
//! - Random limit changes (quota, burst) between takes: the units used stay the units used,
//!   so at the change the new limit has exactly its capacity less what was used left.

use futures_util::FutureExt;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::Algorithm;
use sluice::limiter::reserve::{ReserveOp, ReserveRequest, records_key};
use sluice::limiter::{Batch, Clock, Hit, LimitParams, Limiter, ManualClock, MemoryLimiter};

use crate::support::*;

/// One step: a gap in thousandths of the nominal interval P/Q, what to do, and an amount
/// (in thousandths of the burst) or which reservation to commit.
type Op = (u64, u8, u64, u64);

fn ops() -> impl Strategy<Value = Vec<Op>> {
    vec(
        (
            prop_oneof![Just(0u64), 0u64..3000, 0u64..40_000],
            0u8..4,
            0u64..=1000,
            0u64..=1000,
        ),
        1..=80,
    )
}

/// An admission: (time, units), less what was returned of it.
struct Admitted {
    at: u64,
    units: u64,
    /// A reservation (its units are returned by its commit only), or an anonymous take.
    named: bool,
}

fn key_hit(limit: LimitParams, cost: u64, refund: bool) -> Hit {
    Hit {
        refund,
        ..hit("k", limit, cost)
    }
}

/// Runs `ops` on one key of `limit`; returns the admissions, each less what was returned.
fn run(limit: LimitParams, ops: &[Op]) -> Vec<Admitted> {
    let unit = limit.period_nanos / u64::from(limit.quota.max(1));
    let clock = ManualClock::at(1_000 * limit.period_nanos);
    let limiter = MemoryLimiter::with_clock(16, clock.clone());
    let cap = u64::from(limit.burst.max(limit.quota));
    let mut admitted: Vec<Admitted> = Vec::new();
    // Open reservations: (id, index in `admitted`, estimate).
    let mut open: Vec<(u64, usize, u64)> = Vec::new();
    for &(gap, what, amount, pick) in ops {
        clock.advance(step(unit, gap));
        let now = clock.now_nanos();
        let amount = (cap * amount).div_ceil(1000);
        match what {
            0 => {
                let o = check_now(&limiter, vec![key_hit(limit, amount, false)]);
                if o.admitted && amount > 0 {
                    admitted.push(Admitted {
                        at: now,
                        units: amount,
                        named: false,
                    });
                }
            }
            1 if amount > 0 => {
                let request = ReserveRequest {
                    records: records_key(b"k"),
                    ttl_nanos: 1_000 * limit.period_nanos,
                    op: ReserveOp::Reserve {
                        batch: Batch {
                            hits: vec![key_hit(limit, amount, false)],
                        },
                        amount,
                    },
                };
                let r = reserve(&limiter, &request);
                if r.done {
                    open.push((r.id, admitted.len(), amount));
                    admitted.push(Admitted {
                        at: now,
                        units: amount,
                        named: true,
                    });
                }
            }
            2 if !open.is_empty() => {
                let (id, at, estimate) = open.remove((pick as usize) % open.len());
                let actual = estimate * amount / 1000;
                let request = ReserveRequest {
                    records: records_key(b"k"),
                    ttl_nanos: 1,
                    op: ReserveOp::Commit {
                        id,
                        actual,
                        hit: key_hit(limit, 0, false),
                    },
                };
                assert!(reserve(&limiter, &request).done, "reservation {id} is open");
                admitted[at].units = admitted[at].units.saturating_sub(estimate - actual);
            }
            // A log's anonymous refund may take a reservation's units of a shared entry
            // (docs/algorithms.md): its worst case is stated apart, not checked here.
            3 if amount > 0 && limit.algorithm != Algorithm::SlidingLog => {
                check_now(&limiter, vec![key_hit(limit, amount, true)]);
                give_back_newest(&mut admitted, limit, now, amount);
            }
            _ => {}
        }
    }
    admitted
}

/// An anonymous refund of `units`, attributed to the newest admissions it may give back (its
/// stated bound): for a funnel and a token bucket, anonymous takes since the last reservation;
/// for a window, those of the current window.
fn give_back_newest(admitted: &mut [Admitted], limit: LimitParams, now: u64, mut units: u64) {
    let period = limit.period_nanos;
    let window = now - now % period;
    for a in admitted.iter_mut().rev() {
        let allowed = match limit.algorithm {
            Algorithm::Funnel | Algorithm::TokenBucket => !a.named,
            _ => !a.named && a.at >= window,
        };
        if !allowed || units == 0 {
            break;
        }
        let take = units.min(a.units);
        a.units -= take;
        units -= take;
    }
}

fn reserve(
    limiter: &MemoryLimiter<ManualClock>,
    request: &ReserveRequest,
) -> sluice::limiter::reserve::ReserveOutcome {
    let result = limiter.reserve(request).now_or_never();
    result.expect("a ready future").expect("no backend error")
}

/// For every pair of admissions i <= j, the units in [t_i, t_j] are at most `bound(t_i,
/// t_j)`.
fn assert_bound(
    admitted: &[Admitted],
    bound: impl Fn(u64, u64) -> u128,
) -> Result<(), TestCaseError> {
    let events: Vec<(u64, u64)> = admitted.iter().map(|a| (a.at, a.units)).collect();
    for (i, &(start, _)) in events.iter().enumerate() {
        let mut units = 0u128;
        for &(end, u) in &events[i..] {
            units += u128::from(u);
            let allowed = bound(start, end);
            prop_assert!(
                units <= allowed,
                "{units} in [{start}, {end}], bound {allowed}"
            );
        }
    }
    Ok(())
}

fn limit_of(algorithm: Algorithm, quota: u32, period: u64, burst: u32) -> LimitParams {
    let capacity = matches!(algorithm, Algorithm::Funnel | Algorithm::TokenBucket);
    LimitParams {
        burst: if capacity { burst } else { quota },
        ..limit(algorithm, quota, period)
    }
}

proptest! {
    #![proptest_config(config())]

    /// Funnel: B + Q*L/P, anonymous refunds included.
    #[test]
    fn funnel_returns_stay_within_the_bound(
        quota in 1u32..50, period in SEC..=60 * SEC, burst in 1u32..60, ops in ops(),
    ) {
        let limit = limit_of(Algorithm::Funnel, quota, period, burst);
        let admitted = run(limit, &ops);
        assert_bound(&admitted, |s, e| {
            u128::from(burst) + u128::from(quota) * u128::from(e - s) / u128::from(period)
        })?;
    }

    /// Token bucket: B + Q*ceil(L/P), anonymous refunds included.
    #[test]
    fn token_bucket_returns_stay_within_the_bound(
        quota in 1u32..50, period in SEC..=60 * SEC, burst in 1u32..60, ops in ops(),
    ) {
        let limit = limit_of(Algorithm::TokenBucket, quota, period, burst);
        let admitted = run(limit, &ops);
        assert_bound(&admitted, |s, e| {
            u128::from(burst) + u128::from(quota) * u128::from((e - s).div_ceil(period))
        })?;
    }

    /// Fixed window: Q per window, anonymous refunds included.
    #[test]
    fn fixed_window_returns_stay_within_the_bound(
        quota in 1u32..50, period in SEC..=60 * SEC, ops in ops(),
    ) {
        let limit = limit_of(Algorithm::FixedWindow, quota, period, quota);
        let admitted = run(limit, &ops);
        assert_bound(&admitted, |s, e| {
            u128::from(quota) * u128::from(e / period - s / period + 1)
        })?;
    }

    /// Sliding window: Q + ceil(Q*L/P), anonymous refunds included.
    #[test]
    fn sliding_window_returns_stay_within_the_bound(
        quota in 1u32..50, period in SEC..=60 * SEC, ops in ops(),
    ) {
        let limit = limit_of(Algorithm::SlidingWindow, quota, period, quota);
        let admitted = run(limit, &ops);
        assert_bound(&admitted, |s, e| {
            let q = u128::from(quota);
            q + (q * u128::from(e - s)).div_ceil(u128::from(period))
        })?;
    }

    /// Sliding log: Q in any interval shorter than P (anonymous refunds left out, above).
    #[test]
    fn sliding_log_returns_stay_within_the_bound(
        quota in 1u32..50, period in SEC..=60 * SEC, ops in ops(),
    ) {
        let limit = limit_of(Algorithm::SlidingLog, quota, period, quota);
        let admitted = run(limit, &ops);
        assert_bound(&admitted, |s, e| {
            u128::from(quota) * u128::from((e - s) / period + 1)
        })?;
    }

    /// At a change of quota or burst, the new limit has its capacity less the units used
    /// left: `remaining' = max(0, B' - (B - remaining))` (Q for the windows), every algorithm.
    #[test]
    fn a_changed_limit_keeps_the_units_used(
        algorithm in prop_oneof![
            Just(Algorithm::Funnel),
            Just(Algorithm::TokenBucket),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindow),
            Just(Algorithm::SlidingLog),
        ],
        period in SEC..=60 * SEC,
        steps in vec((0u64..2000, 0u64..8, 1u32..40, 1u32..40, any::<bool>()), 1..60),
    ) {
        let clock = ManualClock::at(1_000 * period);
        let limiter = MemoryLimiter::with_clock(16, clock.clone());
        let mut current = limit_of(algorithm, 20, period, 20);
        for (gap, cost, quota, burst, change) in steps {
            clock.advance(step(period / 20, gap));
            if change {
                let next = limit_of(algorithm, quota, period, burst);
                let capacity = |l: LimitParams| u64::from(l.burst);
                // A token bucket's refills not yet applied are applied at the new quota
                // (docs/algorithms.md): what was used is read so too.
                let reading = if algorithm == Algorithm::TokenBucket {
                    LimitParams { quota: next.quota, ..current }
                } else {
                    current
                };
                let before = check_now(&limiter, vec![hit("k", reading, 0)]).hits[0].remaining;
                let after = check_now(&limiter, vec![hit("k", next, 0)]).hits[0].remaining;
                if before > 0 {
                    let used = capacity(current) - before;
                    prop_assert_eq!(
                        after,
                        capacity(next).saturating_sub(used),
                        "{:?}: {} used under {:?}", algorithm, used, current
                    );
                } else {
                    // At least the old capacity used: at most the difference is left.
                    prop_assert!(
                        after <= capacity(next).saturating_sub(capacity(current)),
                        "{:?}: {} left, all of {:?} used", algorithm, after, current
                    );
                }
                current = next;
            }
            check_now(&limiter, vec![hit("k", current, cost)]);
        }
    }
}
