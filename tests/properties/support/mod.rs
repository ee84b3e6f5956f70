//! Shared parts of the per-algorithm property tests: driving the
//! memory backend on a manual clock, checking interval bounds, exact retry times, and the
//! properties every algorithm shares: a denied request changes no state (but that of its
//! `charge: always` limits), and for single hits the memory backend answers exactly what the
//! pure algorithm does.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::algorithm::{Algo, State};
use sluice::limiter::fixed_window::{FixedWindow, Window};
use sluice::limiter::funnel::{Funnel, Tat};
use sluice::limiter::sliding_log::{Log, SlidingLog};
use sluice::limiter::sliding_window::{Counters, SlidingWindow};
use sluice::limiter::token_bucket::{Bucket, TokenBucket};
use sluice::limiter::{
    BatchOutcome, Clock, Hit, HitOutcome, LimitParams, ManualClock, MemoryLimiter, Role,
};
pub(crate) use sluice::testing::limits::{check_now, hit, limit};

pub(crate) const MS: u64 = 1_000_000;
pub(crate) const SEC: u64 = 1_000_000_000;

/// The configuration of every property test: 256 cases, and room for the rejects of the
/// retry-time properties (which skip the draws whose cost is admitted).
pub(crate) fn config() -> ProptestConfig {
    ProptestConfig {
        max_global_rejects: 1 << 20,
        ..ProptestConfig::with_cases(256)
    }
}

/// Time steps in thousandths of `unit`: often none (a burst at one instant), up to three
/// units; and a cost per step.
pub(crate) fn steps(max_len: usize, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    vec(
        (prop_oneof![Just(0u64), 0u64..3000], 0..=max_cost),
        1..=max_len,
    )
}

/// Inputs of the bound properties of the window algorithms: a quota 1 to 49, a period 1 ms to
/// 10 s, a start up to 100 s, and 1 to 200 time steps with costs 0 to 6.
pub(crate) fn window_runs() -> impl Strategy<Value = (u32, u64, u64, Vec<(u64, u64)>)> {
    (1u32..50, MS..=10 * SEC, 0u64..=100 * SEC, steps(200, 6))
}

/// Inputs of the agreement property for `algorithm`: a limit (quota 0 to 19, period 1 ns to
/// 10 s, charged always half the time; for the funnel and the token bucket a burst 0 to 29 and
/// borrowing either way, for the others a window limit), a start up to 1 s, and 1 to 200 single
/// hits as (time step in thousandths of a unit, cost 0 to 8, refund one time in five).
pub(crate) fn single_hits(
    algorithm: Algorithm,
) -> impl Strategy<Value = (LimitParams, u64, Vec<(u64, u64, bool)>)> {
    let capacity = if algorithm.has_capacity() {
        (0u32..30, any::<bool>()).prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    };
    let limit = (0u32..20, 1u64..=10 * SEC, capacity, any::<bool>()).prop_map(
        move |(quota, period, capacity, always)| {
            let charge = if always {
                Charge::Always
            } else {
                Charge::Admitted
            };
            match capacity {
                Some((burst, borrow)) => LimitParams {
                    burst,
                    borrow,
                    charge,
                    ..limit(algorithm, quota, period)
                },
                None => LimitParams {
                    charge,
                    ..limit(algorithm, quota, period)
                },
            }
        },
    );
    let hits = (steps(200, 8), vec(prop::bool::weighted(0.2), 200)).prop_map(|(steps, refunds)| {
        let hits = steps.into_iter().zip(refunds);
        hits.map(|((permille, cost), refund)| (permille, cost, refund))
            .collect()
    });
    (limit, 0u64..=SEC, hits)
}

/// One algorithm's pure functions, as the tests use them to predict what a backend answers.
/// Each implementation calls the algorithm's own module directly (not [`Algo`], which the
/// backends use), so that a wrong dispatch there shows as a disagreement.
pub(crate) trait Pure {
    /// One key's state, as the algorithm's module keeps it.
    type State: Clone;
    /// Whether `cost` at `now` is admitted.
    fn allows(&self, state: &Self::State, now: u64, cost: u64) -> bool;
    /// Takes `cost` at `now`.
    fn take(&self, state: &mut Self::State, now: u64, cost: u64);
    /// Gives `cost` back at `now`.
    fn give_back(&self, state: &mut Self::State, now: u64, cost: u64);
    /// What is left at `now`.
    fn left(&self, state: &Self::State, now: u64) -> u64;
    /// The reset an admitted hit reports.
    fn reset_after(&self, state: &Self::State, now: u64) -> u64;
    /// Until `cost` would be admitted.
    fn retry_after(&self, state: &Self::State, now: u64, cost: u64) -> u64;
}

impl Pure for Funnel {
    type State = Tat;
    fn allows(&self, s: &Tat, now: u64, cost: u64) -> bool {
        self.evaluate(self.tat_of(*s, now), now, cost).admitted
    }
    fn take(&self, s: &mut Tat, now: u64, cost: u64) {
        *s = self.take_state(*s, now, cost);
    }
    fn give_back(&self, s: &mut Tat, now: u64, cost: u64) {
        *s = self.refund_state(*s, now, cost);
    }
    fn left(&self, s: &Tat, now: u64) -> u64 {
        self.remaining(self.tat_of(*s, now), now)
    }
    fn reset_after(&self, s: &Tat, now: u64) -> u64 {
        self.until_empty(self.tat_of(*s, now), now)
    }
    fn retry_after(&self, s: &Tat, now: u64, cost: u64) -> u64 {
        self.until_admitted(self.tat_of(*s, now), now, cost)
    }
}

impl Pure for TokenBucket {
    type State = Bucket;
    fn allows(&self, b: &Bucket, now: u64, cost: u64) -> bool {
        self.admits(*b, now, cost)
    }
    fn take(&self, b: &mut Bucket, now: u64, cost: u64) {
        *b = self.consume(*b, now, cost);
    }
    fn give_back(&self, b: &mut Bucket, now: u64, cost: u64) {
        *b = self.refund(*b, now, cost);
    }
    fn left(&self, b: &Bucket, now: u64) -> u64 {
        self.remaining(*b, now)
    }
    fn reset_after(&self, b: &Bucket, now: u64) -> u64 {
        self.until_full(*b, now)
    }
    fn retry_after(&self, b: &Bucket, now: u64, cost: u64) -> u64 {
        self.until_admitted(*b, now, cost)
    }
}

/// The reset of an admitted hit runs to the end of its window, not until the window is fresh.
impl Pure for FixedWindow {
    type State = Window;
    fn allows(&self, w: &Window, now: u64, cost: u64) -> bool {
        self.admits(*w, now, cost)
    }
    fn take(&self, w: &mut Window, now: u64, cost: u64) {
        *w = self.consume(*w, now, cost);
    }
    fn give_back(&self, w: &mut Window, now: u64, cost: u64) {
        *w = self.refund(*w, now, cost);
    }
    fn left(&self, w: &Window, now: u64) -> u64 {
        self.remaining(*w, now)
    }
    fn reset_after(&self, _: &Window, now: u64) -> u64 {
        self.until_window_end(now)
    }
    fn retry_after(&self, w: &Window, now: u64, cost: u64) -> u64 {
        self.until_admitted(*w, now, cost)
    }
}

impl Pure for SlidingWindow {
    type State = Counters;
    fn allows(&self, c: &Counters, now: u64, cost: u64) -> bool {
        self.admits(*c, now, cost)
    }
    fn take(&self, c: &mut Counters, now: u64, cost: u64) {
        *c = self.consume(*c, now, cost);
    }
    fn give_back(&self, c: &mut Counters, now: u64, cost: u64) {
        *c = self.refund(*c, now, cost);
    }
    fn left(&self, c: &Counters, now: u64) -> u64 {
        self.remaining(*c, now)
    }
    fn reset_after(&self, c: &Counters, now: u64) -> u64 {
        self.until_fresh(*c, now)
    }
    fn retry_after(&self, c: &Counters, now: u64, cost: u64) -> u64 {
        self.until_admitted(*c, now, cost)
    }
}

impl Pure for SlidingLog {
    type State = Log;
    fn allows(&self, log: &Log, now: u64, cost: u64) -> bool {
        self.admits(log, now, cost)
    }
    fn take(&self, log: &mut Log, now: u64, cost: u64) {
        self.consume(log, now, cost);
    }
    fn give_back(&self, log: &mut Log, now: u64, cost: u64) {
        self.refund(log, now, cost);
    }
    fn left(&self, log: &Log, now: u64) -> u64 {
        self.remaining(log, now)
    }
    fn reset_after(&self, log: &Log, now: u64) -> u64 {
        self.until_fresh(log, now)
    }
    fn retry_after(&self, log: &Log, now: u64, cost: u64) -> u64 {
        self.until_admitted(log, now, cost)
    }
}

/// The pure algorithm's answer for one hit of a limit charging `charge`; `state` becomes the
/// state the hit leaves. A refund is always admitted; a denied hit changes the state only
/// under `charge: always`, and reports nothing remaining and its retry time from the old state.
pub(crate) fn answer<P: Pure>(
    pure: &P,
    charge: Charge,
    state: &mut P::State,
    now: u64,
    cost: u64,
    refund: bool,
) -> HitOutcome {
    let admitted = refund || pure.allows(state, now, cost);
    let denied = (!admitted).then(|| HitOutcome {
        admitted,
        remaining: 0,
        reset_nanos: pure.retry_after(state, now, cost),
        from_local_cache: false,
    });
    match (admitted || charge == Charge::Always, refund) {
        (false, _) => {}
        (true, true) => pure.give_back(state, now, cost),
        (true, false) => pure.take(state, now, cost),
    }
    denied.unwrap_or_else(|| HitOutcome {
        admitted,
        remaining: pure.left(state, now),
        reset_nanos: pure.reset_after(state, now),
        from_local_cache: false,
    })
}

/// Single hits `(permille, cost, refund)` on one key of `limit` in a memory backend, each
/// `permille` thousandths of `unit` after the last, from `start`: the backend answers exactly
/// what `pure` (keeping its own state, `fresh` at first) answers, and holds at most that one key.
pub(crate) fn assert_memory_agrees<P: Pure>(
    limit: LimitParams,
    start: u64,
    unit: u64,
    hits: &[(u64, u64, bool)],
    pure: &P,
    fresh: P::State,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::at(start);
    let limiter = MemoryLimiter::with_clock(16, clock.clone());
    let mut state = fresh;
    let mut now = start;
    for &(permille, cost, refund) in hits {
        now += step(unit, permille);
        clock.set(now);
        let want = answer(pure, limit.charge, &mut state, now, cost, refund);
        let got = check_now(
            &limiter,
            vec![Hit {
                refund,
                ..hit("k", limit, cost)
            }],
        );
        prop_assert_eq!(got.admitted, want.admitted);
        prop_assert_eq!(got.hits, vec![want]);
        prop_assert!(limiter.len() <= 1);
    }
    Ok(())
}

/// The retry time of a denial of `cost` at `now` is exact: still denied one nanosecond before
/// it, and at it (without other traffic) admitted exactly when `fits`. Draws where `cost` is
/// admitted at `now` are rejected.
pub(crate) fn assert_retry_time_is_exact<P: Pure>(
    pure: &P,
    state: &P::State,
    now: u64,
    cost: u64,
    fits: bool,
) -> Result<(), TestCaseError> {
    prop_assume!(!pure.allows(state, now, cost));
    let wait = pure.retry_after(state, now, cost);
    prop_assert!(wait >= 1);
    prop_assert!(!pure.allows(state, now + wait - 1, cost));
    prop_assert_eq!(pure.allows(state, now + wait, cost), fits);
    Ok(())
}

/// `permille` thousandths of `unit` nanoseconds.
pub(crate) fn step(unit: u64, permille: u64) -> u64 {
    let nanos = u128::from(unit) * u128::from(permille) / 1000;
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

/// Drives one key of `limit` through `steps` (advance, cost), starting at `start`; returns
/// every hit as (time, cost, outcome).
pub(crate) fn outcomes(
    limit: LimitParams,
    start: u64,
    unit: u64,
    steps: &[(u64, u64)],
) -> Vec<(u64, u64, BatchOutcome)> {
    let clock = ManualClock::at(start);
    let limiter = MemoryLimiter::with_clock(16, clock.clone());
    let mut now = start;
    let mut outcomes = Vec::new();
    for &(permille, cost) in steps {
        now += step(unit, permille);
        clock.set(now);
        let hits = vec![hit("k", limit, cost)];
        outcomes.push((now, cost, check_now(&limiter, hits)));
    }
    outcomes
}

/// [`outcomes`], keeping only the admitted events as (time, cost), costs of 0 left out.
pub(crate) fn admitted_events(
    limit: LimitParams,
    start: u64,
    unit: u64,
    steps: &[(u64, u64)],
) -> Vec<(u64, u64)> {
    let all = outcomes(limit, start, unit, steps);
    let admitted = all
        .into_iter()
        .filter(|(_, cost, o)| o.admitted && *cost > 0);
    admitted.map(|(now, cost, _)| (now, cost)).collect()
}

/// For every pair of admitted events i <= j, the cost admitted in [t_i, t_j] is at most
/// `bound(t_j - t_i)`.
pub(crate) fn assert_interval_bound(
    events: &[(u64, u64)],
    bound: impl Fn(u64) -> u128,
) -> Result<(), TestCaseError> {
    let mut prefix = vec![0u128];
    for &(_, cost) in events {
        prefix.push(prefix[prefix.len() - 1] + u128::from(cost));
    }
    for (i, &(start, _)) in events.iter().enumerate() {
        for (j, &(end, _)) in events.iter().enumerate().skip(i) {
            let cost = prefix[j + 1] - prefix[i];
            let allowed = bound(end - start);
            prop_assert!(
                cost <= allowed,
                "{cost} admitted in [{start}, {end}], bound {allowed}"
            );
        }
    }
    Ok(())
}

/// A descriptor: its role and its hits as (key index, cost, refund).
pub(crate) type Descriptor = (Role, Vec<(usize, u64, bool)>);

pub(crate) fn descriptor() -> impl Strategy<Value = Descriptor> {
    let role = prop_oneof![
        3 => Just(Role::Enforced),
        1 => Just(Role::Shadow),
        1 => Just(Role::Quota),
        1 => Just(Role::QuotaShadow),
    ];
    let hit = (0usize..4, 0u64..4, prop::bool::weighted(0.15));
    (role, vec(hit, 1..=3))
}

/// One key's limit of `algorithm` for the denial property; one in four charges always.
pub(crate) fn key_limit(algorithm: Algorithm) -> impl Strategy<Value = LimitParams> {
    let charge = prop_oneof![3 => Just(Charge::Admitted), 1 => Just(Charge::Always)];
    (0u32..5, MS..=SEC, 0u32..6, any::<bool>(), charge).prop_map(
        move |(q, p, b, borrow, charge)| {
            let borrow = borrow && algorithm.has_capacity();
            LimitParams {
                burst: b,
                borrow,
                charge,
                ..limit(algorithm, q, p)
            }
        },
    )
}

/// Random requests: a time step (up to 300 ms) and 1 to 3 descriptors.
pub(crate) fn requests() -> impl Strategy<Value = Vec<(u64, Vec<Descriptor>)>> {
    vec((0u64..300 * MS, vec(descriptor(), 1..=3)), 1..=60)
}

/// Inputs of the denial property for `algorithm`: four keys' limits and random requests.
pub(crate) fn denials(
    algorithm: Algorithm,
) -> impl Strategy<Value = (Vec<LimitParams>, Vec<(u64, Vec<Descriptor>)>)> {
    (vec(key_limit(algorithm), 4), requests())
}

fn batch(limits: &[LimitParams], descriptors: &[Descriptor]) -> Vec<Hit> {
    let mut hits = Vec::new();
    for (group, (role, entries)) in descriptors.iter().enumerate() {
        for &(k, cost, refund) in entries {
            hits.push(Hit {
                refund,
                group,
                role: *role,
                ..hit(format!("key-{k}"), limits[k], cost)
            });
        }
    }
    hits
}

/// A denied request changes no state but that of its `charge: always` limits: every other
/// held key keeps its state, and each key of such a limit holds what taking (or, for a refund,
/// giving back) their costs in batch order from its old state leaves (nothing, once fresh).
/// Without such a limit, the same batch at the same instant gets the same outcome again.
pub(crate) fn assert_denials_change_nothing(
    limits: &[LimitParams],
    requests: &[(u64, Vec<Descriptor>)],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::at(1_000 * SEC);
    let limiter = MemoryLimiter::with_clock(64, clock.clone());
    for (advance, descriptors) in requests {
        clock.advance(*advance);
        let before = limiter.snapshot();
        let hits = batch(limits, descriptors);
        let charged = charged_always(&before, &hits, clock.now_nanos());
        let first = check_now(&limiter, hits);
        if first.admitted {
            continue;
        }
        prop_assert_eq!(&limiter.snapshot(), &charged);
        if charged != before {
            continue;
        }
        let again = check_now(&limiter, batch(limits, descriptors));
        prop_assert_eq!(&again, &first);
        prop_assert_eq!(&limiter.snapshot(), &before);
    }
    Ok(())
}

/// The states a denied batch leaves: `before`, with the cost of each `charge: always` hit
/// applied in batch order; a key whose state is then fresh is gone.
fn charged_always(before: &[(Vec<u8>, State)], hits: &[Hit], now: u64) -> Vec<(Vec<u8>, State)> {
    let mut states: BTreeMap<Vec<u8>, State> = before.iter().cloned().collect();
    let mut charged: BTreeMap<Vec<u8>, Algo> = BTreeMap::new();
    for hit in hits {
        if hit.limit.charge != Charge::Always || hit.cost == 0 {
            continue;
        }
        let algo = Algo::of(&hit.limit);
        let state = states.entry(hit.key.to_vec()).or_default();
        if hit.refund {
            algo.give_back(state, now, hit.cost);
        } else {
            algo.take(state, now, hit.cost);
        }
        charged.entry(hit.key.to_vec()).or_insert(algo);
    }
    for (key, algo) in charged {
        if states
            .get(&key)
            .is_some_and(|s| algo.fresh_at(s, now).is_none())
        {
            states.remove(&key);
        }
    }
    states.into_iter().collect()
}
