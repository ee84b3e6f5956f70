use proptest::prelude::*;

use super::*;
use crate::limiter::fixed_window::{FixedWindow, Window};
use crate::limiter::funnel::{Funnel, Tat};
use crate::limiter::sliding_log::SlidingLog;
use crate::limiter::sliding_window::{Counters, SlidingWindow};
use crate::limiter::token_bucket::{Bucket, TokenBucket};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// A funnel state of 1,000 a second, empty at `tat`, with nothing refundable (a lease's take
/// is named).
fn funnel_at(tat: u64) -> State {
    State::Funnel(Tat {
        tat,
        quota: 1_000,
        refundable: 0,
    })
}

#[test]
fn a_funnel_lease_takes_its_slots_from_its_last_moment() {
    // 1,000 a second (T = 1 ms), burst 100 (tau = 100 ms).
    let f = Funnel::new(1_000, SEC, 100, false);
    let algo = Algo::Funnel(f);
    let now = 10 * SEC;
    let (lease, state) = grant(&algo, &State::Fresh, now, 10, 50 * MS).unwrap();
    assert_eq!(
        lease,
        Lease {
            units: 10,
            expires: now + 50 * MS,
            returnable: now + 50 * MS,
            mark: now + 50 * MS - 1 + 10 * MS,
        }
    );
    // S = max(tat, e - 1) = e - 1; tat = S + 10 T.
    assert_eq!(state, funnel_at(now + 50 * MS - 1 + 10 * MS));
}

#[test]
fn a_funnel_lease_takes_at_most_a_quarter_of_what_remains() {
    let algo = Algo::Funnel(Funnel::new(1_000, SEC, 100, false));
    let now = 10 * SEC;
    // 60 ms of the 100 ms of capacity in use: 40 remain, a lease takes 10 of them.
    let state = funnel_at(now + 60 * MS);
    let (lease, after) = grant(&algo, &state, now, 1_000, 20 * MS).unwrap();
    assert_eq!(lease.units, 10);
    assert_eq!(after, funnel_at(now + 70 * MS));
    // 1 remains: a lease of 1; none: no lease.
    let (lease, after) = grant(&algo, &funnel_at(now + 99 * MS), now, 5, 1).unwrap();
    assert_eq!(lease.units, 1);
    // A full funnel leases nothing: the caller asks the shared state, which denies exactly.
    assert_eq!(grant(&algo, &after, now, 5, 20 * MS), None);
}

#[test]
fn a_lease_smaller_than_the_cost_asking_is_not_granted() {
    let algo = Algo::Funnel(Funnel::new(1_000, SEC, 100, false));
    let now = 10 * SEC;
    // 20 remain: a quarter is 5; a request of 6 gets no lease (it goes to the shared state,
    // where no leased unit is taken for nothing), one of 5 gets 5.
    let state = funnel_at(now + 80 * MS);
    assert_eq!(grant_between(&algo, &state, now, (6, 10), 5 * MS), None);
    let (lease, _) = grant_between(&algo, &state, now, (5, 10), 5 * MS).unwrap();
    assert_eq!(lease.units, 5);
    // A whole number of the cost: 40 remain, a quarter is 10, a request of 3 gets 9.
    let state = funnel_at(now + 60 * MS);
    let (lease, _) = grant_between(&algo, &state, now, (3, 20), 5 * MS).unwrap();
    assert_eq!(lease.units, 9);
}

#[test]
fn a_funnel_lease_that_jumps_to_its_expiry_pays_for_the_jump() {
    let algo = Algo::Funnel(Funnel::new(1_000, SEC, 100, false));
    let now = 10 * SEC;
    // tat = now: the jump to e - 1 (90 ms ahead) leaves room for 10 units only.
    let (lease, _) = grant(&algo, &funnel_at(now), now, 50, 90 * MS + 1).unwrap();
    assert_eq!(lease.units, 10);
}

#[test]
fn a_return_gives_back_only_while_the_lease_is_valid() {
    let algo = Algo::Funnel(Funnel::new(1_000, SEC, 100, false));
    let now = 10 * SEC;
    let (lease, state) = grant(&algo, &State::Fresh, now, 10, 50 * MS).unwrap();
    let (back, after) = give_back(&algo, &state, &state, now + 49 * MS, &lease, 4);
    assert_eq!(back, 4);
    assert_eq!(after, funnel_at(now + 50 * MS - 1 + 6 * MS));
    // At its expiry the units count as spent: nothing comes back.
    let (back, after) = give_back(&algo, &state, &state, now + 50 * MS, &lease, 4);
    assert_eq!((back, after), (0, state.clone()));
    // Nothing once another unit was scheduled after the lease's slots.
    let mut later = state.clone();
    algo.take(&mut later, now + 1, 1);
    assert_eq!(give_back(&algo, &later, &state, now + 2, &lease, 4).0, 0);
    // Never more than the lease held.
    assert_eq!(give_back(&algo, &state, &state, now, &lease, 99).0, 10);
}

#[test]
fn a_fixed_window_lease_never_crosses_the_window_end() {
    let algo = Algo::FixedWindow(FixedWindow::new(100, SEC));
    let now = 10 * SEC + 980 * MS;
    let (lease, state) = grant(&algo, &State::Fresh, now, 30, 100 * MS).unwrap();
    assert_eq!((lease.expires, lease.returnable), (11 * SEC, 11 * SEC));
    assert_eq!(lease.units, 25, "a quarter of what remains");
    assert_eq!(
        state,
        State::FixedWindow(Window {
            start: 10 * SEC,
            count: 25,
            refundable: 0,
        })
    );
    let (lease, _) = grant(&algo, &state, now, 1_000, 10 * MS).unwrap();
    assert_eq!(lease.units, 18);
    assert_eq!((lease.expires, lease.returnable), (now + 10 * MS, 11 * SEC));
    // A return in the window gives back to it.
    let (back, after) = give_back(&algo, &state, &state, now + 5 * MS, &lease, 5);
    assert_eq!(back, 5);
    assert_eq!(
        after,
        State::FixedWindow(Window {
            start: 10 * SEC,
            count: 20,
            refundable: 0,
        })
    );
    // Expired, its unspent units still go back to their window while it lasts; not after.
    assert_eq!(
        give_back(&algo, &state, &state, now + 15 * MS, &lease, 5).0,
        5
    );
    assert_eq!(give_back(&algo, &state, &state, 11 * SEC, &lease, 5).0, 0);
}

#[test]
fn a_token_bucket_lease_never_crosses_the_next_refill() {
    let b = TokenBucket::new(10, SEC, 50, false);
    let algo = Algo::TokenBucket(b);
    let state = State::TokenBucket(Bucket {
        used: 20,
        anchor: 10 * SEC,
        refundable: 0,
    });
    let now = 10 * SEC + 950 * MS;
    let (lease, after) = grant(&algo, &state, now, 100, 100 * MS).unwrap();
    assert_eq!(lease.expires, 11 * SEC);
    assert_eq!(lease.units, 7);
    assert_eq!(
        after,
        State::TokenBucket(Bucket {
            used: 27,
            anchor: 10 * SEC,
            refundable: 0,
        })
    );
}

#[test]
fn a_full_token_bucket_lease_expires_within_one_period() {
    // 10 every 50 ms, burst 50; a full bucket: the lease's take starts its steps at the grant
    // (as a take would), and the lease ends by the first refill, one period later.
    let algo = Algo::TokenBucket(TokenBucket::new(10, 50 * MS, 50, false));
    let now = 10 * SEC;
    let (lease, after) = grant(&algo, &State::Fresh, now, 100, 100 * MS).unwrap();
    // Its units may come back until the step they were counted in ends.
    assert_eq!(
        (lease.expires, lease.returnable),
        (now + 50 * MS, now + 50 * MS)
    );
    assert_eq!(lease.units, 12, "a quarter of what remains");
    assert_eq!(lease.mark, now);
    assert_eq!(
        after,
        State::TokenBucket(Bucket {
            used: 12,
            anchor: now,
            refundable: 0,
        })
    );
}

#[test]
fn a_token_bucket_return_gives_back_within_the_step_and_nothing_after() {
    let algo = Algo::TokenBucket(TokenBucket::new(10, SEC, 50, false));
    let state = State::TokenBucket(Bucket {
        used: 10,
        anchor: 10 * SEC,
        refundable: 3,
    });
    let now = 10 * SEC + 100 * MS;
    let (lease, after) = grant(&algo, &state, now, 8, 100 * MS).unwrap();
    assert_eq!(
        (lease.units, lease.expires, lease.returnable),
        (8, now + 100 * MS, 11 * SEC)
    );
    // A named take: the anonymous refunds' 3 are no longer refundable.
    let used = |s: &State| match s {
        State::TokenBucket(b) => b.used,
        _ => 0,
    };
    assert_eq!(used(&after), 18);
    // Within the step (after the lease's expiry too: its units were never spent): used -= u.
    for at in [now + 50 * MS, now + 500 * MS, 11 * SEC - 1] {
        let (back, returned) = give_back(&algo, &after, &after, at, &lease, 5);
        assert_eq!((back, used(&returned)), (5, 13), "at {at}");
    }
    // Once the bucket has refilled, nothing.
    let (back, returned) = give_back(&algo, &after, &after, 11 * SEC, &lease, 5);
    assert_eq!((back, &returned), (0, &after));
}

#[test]
fn a_calendar_window_lease_never_crosses_the_calendar_window_end() {
    use crate::config::calendar::{Calendar, CalendarUnit, Zone};
    let berlin = Zone::named("Europe/Berlin").expect("a zone");
    let calendar = Calendar::new(berlin, CalendarUnit::Day);
    let algo =
        Algo::FixedWindow(FixedWindow::new(1_000, 86_400 * SEC).with_calendar(Some(calendar)));
    // 10 ms before a Berlin midnight (2026-12-04 23:00 UTC), leases valid 100 ms.
    let midnight = 1_796_425_200 * SEC;
    assert_eq!(calendar.window(midnight - 1).1, midnight);
    let now = midnight - 10 * MS;
    let (lease, after) = grant(&algo, &State::Fresh, now, 100, 100 * MS).unwrap();
    assert_eq!(
        (lease.units, lease.expires, lease.returnable),
        (100, midnight, midnight)
    );
    // Its units were counted in the day they may be spent in; the next day starts afresh,
    // and the return comes too late to give anything to it.
    assert_eq!(algo.remaining(&after, midnight - 1), 900);
    assert_eq!(algo.remaining(&after, midnight), 1_000);
    assert_eq!(give_back(&algo, &after, &after, midnight, &lease, 50).0, 0);
    assert_eq!(
        give_back(&algo, &after, &after, midnight - 1, &lease, 50).0,
        50
    );
}

#[test]
fn a_sliding_window_lease_counts_against_the_estimate_at_the_grant() {
    let w = SlidingWindow::new(100, SEC);
    let algo = Algo::SlidingWindow(w);
    // 100 in the previous window: at 10.5 s half of them still count.
    let state = State::SlidingWindow(Counters {
        start: 9 * SEC,
        current: 100,
        previous: 0,
        refundable: 0,
    });
    let now = 10 * SEC + 500 * MS;
    let (lease, _) = grant(&algo, &state, now, 1_000, 100 * MS).unwrap();
    assert_eq!(lease.units, 12);
    assert_eq!(lease.expires, now + 100 * MS);
    let (lease, _) = grant(&algo, &state, 10 * SEC + 990 * MS, 1_000, 100 * MS).unwrap();
    assert_eq!(lease.expires, 11 * SEC);
}

#[test]
fn logs_concurrency_and_direct_limits_are_never_leased() {
    let log = Algo::SlidingLog(SlidingLog::new(10, SEC));
    assert_eq!(grant(&log, &State::Fresh, SEC, 5, 10 * MS), None);
    let limit = LimitParams {
        algorithm: Algorithm::Funnel,
        quota: 10,
        period_nanos: SEC,
        burst: 10,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    };
    assert!(leasable(&limit));
    for other in [
        LimitParams {
            algorithm: Algorithm::SlidingLog,
            ..limit
        },
        LimitParams {
            algorithm: Algorithm::Concurrency,
            ..limit
        },
        LimitParams {
            charge: Charge::Always,
            ..limit
        },
        LimitParams {
            borrow: true,
            ..limit
        },
        LimitParams {
            block_nanos: SEC,
            global: false,
            ..limit
        },
        LimitParams { quota: 0, ..limit },
    ] {
        assert!(!leasable(&other), "{other:?}");
    }
}

fn funnel_limit(quota: u32, burst: u32) -> LimitParams {
    LimitParams {
        algorithm: Algorithm::Funnel,
        quota,
        period_nanos: SEC,
        burst,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

#[test]
fn sizing_follows_the_rate_within_a_share_of_the_burst() {
    let sizing = Sizing::default();
    let limit = funnel_limit(1_000_000, 1_000_000);
    let mut demand = Demand::new(0);
    // 10,000 a second for 100 ms.
    for i in 0..1_000 {
        demand.observe(i * 100_000, 1);
    }
    let now = 100 * MS;
    assert!(demand.busy(now, &sizing));
    let want = demand.want(now, &limit, &sizing);
    assert!(
        (150..=250).contains(&want),
        "{want}: about 20 ms of 10,000/s"
    );
    demand.ended(want, 0, true);
    assert_eq!(demand.want(now, &limit, &sizing), 2 * want);
    demand.ended(2 * want, 2 * want, false);
    demand.ended(want, want, false);
    assert_eq!(demand.want(now, &limit, &sizing), want / 2);
    // 10% of a burst of 100.
    assert_eq!(demand.want(now, &funnel_limit(1_000, 100), &sizing), 10);
    // A quiet key is not leased, nor one with a few hits close together.
    let quiet = Demand::new(0);
    assert!(!quiet.busy(SEC, &sizing));
    let mut few = Demand::new(0);
    for i in 0..3 {
        few.observe(i * MS, 1);
    }
    assert!(
        !few.busy(12 * MS, &sizing),
        "3 hits in 12 ms: 250/s, but only 3"
    );
    for i in 3..10 {
        few.observe(i * MS, 1);
    }
    assert!(
        few.busy(12 * MS, &sizing),
        "10 hits: a window's worth at 200/s"
    );
    assert_eq!(quiet.want(SEC, &limit, &sizing), 0);
}

#[test]
fn a_funnel_lease_is_valid_only_as_long_as_its_jump_costs_a_tenth_of_the_burst() {
    let sizing = Sizing::default();
    // 1,000 a second, burst 100: 10 units' worth of time is 10 ms.
    assert_eq!(validity(&funnel_limit(1_000, 100), &sizing), 10 * MS);
    assert_eq!(
        validity(&funnel_limit(1_000_000, 1_000_000), &sizing),
        100 * MS
    );
}

/// One simulated run: replicas taking decisions at the times of `steps` (replica, time
/// step, cost, want, die), leasing when `want > 0`, spending leases locally, returning what is
/// left when a lease cannot pay a cost; a replica that dies loses its lease. The times at
/// which units were admitted, in order (a cost of c is c units), and how many came from
/// leases.
fn simulate(algo: &Algo, steps: &[Step], validity: u64) -> (Vec<u64>, u64) {
    let mut shared = State::Fresh;
    let mut leases: Vec<Option<(Lease, State, u64)>> = vec![None; 4];
    let mut now = 1_000 * SEC;
    let mut admitted = Vec::new();
    let mut leased = 0;
    for &(replica, dt, cost, want, die) in steps {
        now += dt;
        let slot = &mut leases[replica % 4];
        if die {
            *slot = None;
            continue;
        }
        if let Some((lease, _, left)) = slot
            && *left >= cost
            && now < lease.expires
        {
            *left -= cost;
            admitted.extend(std::iter::repeat_n(now, cost as usize));
            leased += cost;
            continue;
        }
        if let Some((lease, granted, left)) = slot.take() {
            shared = give_back(algo, &shared, &granted, now, &lease, left).1;
        }
        if want > 0
            && let Some((lease, after)) = grant(algo, &shared, now, want, validity)
        {
            shared = after.clone();
            if lease.units >= cost {
                *slot = Some((lease, after, lease.units - cost));
                admitted.extend(std::iter::repeat_n(now, cost as usize));
                leased += cost;
                continue;
            }
            *slot = Some((lease, after, lease.units));
        }
        if algo.admits(&shared, now, cost) {
            algo.take(&mut shared, now, cost);
            admitted.extend(std::iter::repeat_n(now, cost as usize));
        }
    }
    (admitted, leased)
}

type Step = (usize, u64, u64, u64, bool);

/// Every admission would have been admitted by the algorithm alone, replayed at its time.
fn replay_admits(algo: &Algo, admitted: &[u64]) -> Result<(), String> {
    let mut state = State::Fresh;
    for (i, &t) in admitted.iter().enumerate() {
        if !algo.admits(&state, t, 1) {
            return Err(format!("unit {i} at {t} is beyond the bound"));
        }
        algo.take(&mut state, t, 1);
    }
    Ok(())
}

/// A stepwise token bucket's bound: in any closed interval of length d, at most
/// B + Q * ceil(d / P) (refill steps are at least P apart).
fn bucket_bound(admitted: &[u64], burst: u64, quota: u64, period: u64) -> Result<(), String> {
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let (a, b) = (admitted[i], admitted[j]);
            let count = (j - i + 1) as u64;
            let bound = burst + quota * (b - a).div_ceil(period);
            if count > bound {
                return Err(format!("{count} admitted in [{a}, {b}], bound {bound}"));
            }
        }
    }
    Ok(())
}

/// GCRA's bound: in any closed interval of length d, at most B + floor(d / T).
fn funnel_bound(admitted: &[u64], burst: u64, interval: u64) -> Result<(), String> {
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let (a, b) = (admitted[i], admitted[j]);
            let count = (j - i + 1) as u64;
            let bound = burst + (b - a) / interval;
            if count > bound {
                return Err(format!("{count} admitted in [{a}, {b}], bound {bound}"));
            }
        }
    }
    Ok(())
}

fn step() -> impl Strategy<Value = Step> {
    (
        0usize..4,
        prop_oneof![Just(0u64), 0u64..2 * MS, 0u64..60 * MS],
        prop_oneof![Just(1u64), 1u64..5],
        prop_oneof![Just(0u64), 1u64..20],
        proptest::bool::weighted(0.02),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn leased_funnels_stay_within_their_bound(
        quota in 1u32..2_000,
        burst in 1u32..60,
        validity in 1u64..120 * MS,
        steps in proptest::collection::vec(step(), 1..400),
    ) {
        let f = Funnel::new(quota, SEC, burst, false);
        let (admitted, _) = simulate(&Algo::Funnel(f), &steps, validity);
        let interval = SEC.div_ceil(u64::from(quota));
        prop_assert_eq!(funnel_bound(&admitted, u64::from(burst), interval), Ok(()));
    }

    #[test]
    fn leased_windows_and_buckets_admit_only_what_they_would_alone(
        kind in 0u8..3,
        quota in 1u32..60,
        burst in 1u32..60,
        period in 10 * MS..2 * SEC,
        validity in 1u64..120 * MS,
        steps in proptest::collection::vec(step(), 1..400),
    ) {
        let algo = match kind {
            0 => Algo::FixedWindow(FixedWindow::new(quota, period)),
            1 => Algo::SlidingWindow(SlidingWindow::new(quota, period)),
            _ => Algo::TokenBucket(TokenBucket::new(quota, period, burst, false)),
        };
        let (admitted, _) = simulate(&algo, &steps, validity);
        if kind == 2 {
            // The bucket's refill steps start over from the first take after it is full, so
            // counting a leased unit at the grant may move them: not a replay, but the
            // bucket's interval bound.
            let bound = bucket_bound(&admitted, u64::from(burst), u64::from(quota), period);
            prop_assert_eq!(bound, Ok(()));
        } else {
            prop_assert_eq!(replay_admits(&algo, &admitted), Ok(()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A bucket's lease stays in the refill step it is counted in: no refill comes between
    /// the grant and its last moment, and a return gives back `used -= u` (never above full)
    /// within that step, nothing after.
    #[test]
    fn a_token_bucket_lease_stays_in_its_refill_step(
        quota in 1u32..100,
        burst in 1u32..200,
        period in 1u64..2 * SEC,
        used in 0u64..250,
        since in 0u64..4 * SEC,
        want in 1u64..100,
        validity in 1u64..300 * MS,
        later in 0u64..3 * SEC,
        unused in 0u64..100,
    ) {
        let b = TokenBucket::new(quota, period, burst, false);
        let algo = Algo::TokenBucket(b);
        let now = 100 * SEC;
        let state = if used == 0 {
            State::Fresh
        } else {
            State::TokenBucket(Bucket { used, anchor: now - since, refundable: used / 2 })
        };
        let Some((lease, after)) = grant(&algo, &state, now, want, validity) else {
            // Nothing granted only when the bucket has nothing left.
            prop_assert_eq!(algo.remaining(&state, now), 0);
            return Ok(());
        };
        prop_assert!(lease.units >= 1 && lease.units <= want);
        prop_assert!(lease.expires > now && lease.expires <= now + validity);
        let State::TokenBucket(taken) = after.clone() else {
            return Err(TestCaseError::fail("a bucket's state"));
        };
        prop_assert_eq!(b.mark(taken, now), lease.mark);
        prop_assert_eq!(b.mark(taken, lease.expires - 1), lease.mark, "no refill in the lease");
        prop_assert_eq!(taken.refundable, 0, "a named take");
        let at = now + later;
        let (back, returned) = give_back(&algo, &after, &after, at, &lease, unused);
        let left = algo.remaining(&after, at);
        if at < lease.returnable {
            prop_assert_eq!(b.mark(taken, at), lease.mark, "no refill before the return's end");
            let expected = (left + unused.min(lease.units)).min(u64::from(burst));
            prop_assert_eq!(algo.remaining(&returned, at), expected);
        } else {
            prop_assert!(b.mark(taken, at) != lease.mark || left == u64::from(burst));
            prop_assert_eq!(back, 0);
            prop_assert_eq!(&returned, &after);
        }
    }

    /// Buckets of every shape, leased by four replicas: within the bucket's interval bound.
    #[test]
    fn leased_token_buckets_stay_within_their_bound(
        quota in 1u32..40,
        burst in 1u32..80,
        period in MS..500 * MS,
        validity in 1u64..300 * MS,
        steps in proptest::collection::vec(step(), 1..400),
    ) {
        let algo = Algo::TokenBucket(TokenBucket::new(quota, period, burst, false));
        let (admitted, _) = simulate(&algo, &steps, validity);
        let bound = bucket_bound(&admitted, u64::from(burst), u64::from(quota), period);
        prop_assert_eq!(bound, Ok(()));
    }
}

#[test]
fn leases_admit_most_of_the_bound_under_steady_load() {
    // Four replicas, each asking every 100 us (40,000 a second together) of a funnel of
    // 1,000 a second, burst 100, with leases of 10 valid 10 ms: over 10 s, at least 90% of
    // the bound (100 + 10,000) is admitted, and most of it from leases.
    let algo = Algo::Funnel(Funnel::new(1_000, SEC, 100, false));
    let steps: Vec<_> = (0..400_000)
        .map(|i| (i % 4, 25_000, 1, 10, false))
        .collect();
    let (admitted, leased) = simulate(&algo, &steps, 10 * MS);
    funnel_bound_sampled(&admitted, 100, MS);
    assert!(admitted.len() >= 9_090, "{} admitted", admitted.len());
    assert!(
        leased * 2 > admitted.len() as u64,
        "{leased} of them leased"
    );
}

/// [`funnel_bound`] on one-second intervals starting at each admission (the quadratic check
/// is too slow for 10,000 admissions).
fn funnel_bound_sampled(admitted: &[u64], burst: u64, interval: u64) {
    let mut end = 0;
    for (i, &a) in admitted.iter().enumerate() {
        while end < admitted.len() && admitted[end] <= a + SEC {
            end += 1;
        }
        let count = (end - i) as u64;
        let bound = burst + admitted[end - 1].saturating_sub(a) / interval;
        assert!(
            count <= bound,
            "{count} in the second from {a}, bound {bound}"
        );
    }
}

/// A key at `min_rate` or more warms its cell within a window; a key well below it (under
/// half: the two windows together then never hold one window's worth), alone in its cell,
/// never does; and a cell forgets what is two windows old.
#[test]
fn heat_tells_busy_keys_from_quiet_ones() {
    let sizing = Sizing::default(); // 200 a second: 10 units a 50 ms window
    let heat = Heat::default();
    let ms = 1_000_000;
    let start = 1_000 * OBSERVE_NANOS;
    // 400 a second (one unit every 2.5 ms): warm from the tenth unit on.
    let busy: Vec<bool> = (0..40)
        .map(|i| heat.warm(7, start + i * 5 * ms / 2, 1, &sizing))
        .collect();
    assert!(!busy[..9].iter().any(|w| *w), "{busy:?}");
    assert!(busy[9..].iter().all(|w| *w), "{busy:?}");
    // 80 a second (one every 12.5 ms), for a second: never warm.
    let quiet = (0..80).any(|i| heat.warm(8, start + i * 25 * ms / 2, 1, &sizing));
    assert!(!quiet, "a key at 0.4 of min_rate");
    // The busy key, silent for two windows, starts cold again.
    let later = start + 40 * 5 * ms / 2 + 2 * OBSERVE_NANOS;
    assert!(!heat.warm(7, later, 1, &sizing));
    // A cost counts as its units.
    assert!(heat.warm(9, start, 10, &sizing));
}

proptest! {
    /// However keys share cells, a key never reads colder than it is alone: its cell's count
    /// is at least its own, so a busy key is never kept from the lease table.
    #[test]
    fn heat_never_hides_a_busy_key(
        others in proptest::collection::vec((0u64..4, 0u64..200_000_000, 1u64..5), 0..50),
        gaps in proptest::collection::vec(0u64..5_000_000, 30..60),
    ) {
        let sizing = Sizing::default();
        let shared = Heat::default();
        let alone = Heat::default();
        let mut now = 10 * OBSERVE_NANOS;
        let mut events: Vec<(u64, u64, u64)> = others
            .iter()
            .map(|(hash, at, units)| (*hash * HEAT_CELLS as u64, now + at, *units))
            .collect();
        for gap in &gaps {
            now += gap;
            events.push((0, now, 1));
        }
        events.sort_by_key(|(_, at, _)| *at);
        for (hash, at, units) in events {
            let warm_shared = shared.warm(hash, at, units, &sizing);
            if hash == 0 {
                let warm_alone = alone.warm(0, at, units, &sizing);
                prop_assert!(warm_shared || !warm_alone);
            }
        }
    }
}
