//! Shared parts of the per-algorithm property tests: building hits, driving the memory
//! backend on a manual clock, checking interval bounds, and the property every algorithm
//! shares: a denied request changes no state (but that of its `charge: always` limits).

#![allow(dead_code)]

use std::collections::BTreeMap;

use futures_util::FutureExt;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::algorithm::{Algo, State};
use sluice::limiter::{
    Batch, BatchOutcome, Clock, Hit, HitOutcome, LimitParams, Limiter, ManualClock, MemoryLimiter,
    Role,
};

pub const MS: u64 = 1_000_000;
pub const SEC: u64 = 1_000_000_000;

pub fn params(
    algorithm: Algorithm,
    quota: u32,
    period_nanos: u64,
    burst: u32,
    borrow: bool,
    charge: Charge,
) -> LimitParams {
    LimitParams {
        algorithm,
        quota,
        period_nanos,
        burst,
        charge,
        borrow,
    }
}

pub fn hit(
    key: &str,
    limit: LimitParams,
    cost: u64,
    refund: bool,
    group: usize,
    role: Role,
) -> Hit {
    Hit {
        key: key.as_bytes().into(),
        limit,
        cost,
        refund,
        group,
        role,
    }
}

pub fn check(limiter: &MemoryLimiter<ManualClock>, hits: Vec<Hit>) -> BatchOutcome {
    let batch = Batch { hits };
    let result = limiter.check(&batch).now_or_never();
    result.expect("ready future").expect("no backend error")
}

/// Time steps in thousandths of `unit`: often none (a burst at one instant), up to three
/// units; and a cost per step.
pub fn steps(max_len: usize, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    vec(
        (prop_oneof![Just(0u64), 0u64..3000], 0..=max_cost),
        1..=max_len,
    )
}

/// Single hits on one key of a memory backend, each `(delta, cost, refund)` `delta`
/// nanoseconds after the last, from `start`: the backend answers exactly what `model` (the pure
/// algorithm, keeping its own state) answers for `(now, cost, refund)`, and holds at most
/// that one key.
pub fn assert_memory_agrees(
    limit: LimitParams,
    start: u64,
    hits: impl IntoIterator<Item = (u64, u64, bool)>,
    mut model: impl FnMut(u64, u64, bool) -> HitOutcome,
) -> Result<(), TestCaseError> {
    let clock = ManualClock::at(start);
    let limiter = MemoryLimiter::with_clock(16, clock.clone());
    let mut now = start;
    for (delta, cost, refund) in hits {
        now += delta;
        clock.set(now);
        let want = model(now, cost, refund);
        let got = check(
            &limiter,
            vec![hit("k", limit, cost, refund, 0, Role::Enforced)],
        );
        prop_assert_eq!(got.admitted, want.admitted);
        prop_assert_eq!(got.hits, vec![want]);
        prop_assert!(limiter.len() <= 1);
    }
    Ok(())
}

/// `permille` thousandths of `unit` nanoseconds.
pub fn step(unit: u64, permille: u64) -> u64 {
    let nanos = u128::from(unit) * u128::from(permille) / 1000;
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

/// Drives one key of `limit` through `steps` (advance, cost), starting at `start`; returns
/// the admitted events as (time, cost), costs of 0 left out.
pub fn admitted_events(
    limit: LimitParams,
    start: u64,
    unit: u64,
    steps: &[(u64, u64)],
) -> Vec<(u64, u64)> {
    let clock = ManualClock::at(start);
    let limiter = MemoryLimiter::with_clock(16, clock.clone());
    let mut now = start;
    let mut events = Vec::new();
    for &(permille, cost) in steps {
        now += step(unit, permille);
        clock.set(now);
        let hits = vec![hit("k", limit, cost, false, 0, Role::Enforced)];
        if check(&limiter, hits).admitted && cost > 0 {
            events.push((now, cost));
        }
    }
    events
}

/// For every pair of admitted events i <= j, the cost admitted in [t_i, t_j] is at most
/// `bound(t_j - t_i)`.
pub fn assert_interval_bound(
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
pub type Descriptor = (Role, Vec<(usize, u64, bool)>);

pub fn descriptor() -> impl Strategy<Value = Descriptor> {
    let role = prop_oneof![
        3 => Just(Role::Enforced),
        1 => Just(Role::Shadow),
        1 => Just(Role::Quota),
    ];
    let hit = (0usize..4, 0u64..4, prop::bool::weighted(0.15));
    (role, vec(hit, 1..=3))
}

/// One key's limit of `algorithm` for the denial property; one in four charges always.
pub fn key_limit(algorithm: Algorithm) -> impl Strategy<Value = LimitParams> {
    let charge = prop_oneof![3 => Just(Charge::Admitted), 1 => Just(Charge::Always)];
    (0u32..5, MS..=SEC, 0u32..6, any::<bool>(), charge).prop_map(
        move |(q, p, b, borrow, charge)| {
            let borrow = borrow && algorithm.has_capacity();
            params(algorithm, q, p, b, borrow, charge)
        },
    )
}

/// Random requests: a time step (up to 300 ms) and 1 to 3 descriptors.
pub fn requests() -> impl Strategy<Value = Vec<(u64, Vec<Descriptor>)>> {
    vec((0u64..300 * MS, vec(descriptor(), 1..=3)), 1..=60)
}

fn batch(limits: &[LimitParams], descriptors: &[Descriptor]) -> Vec<Hit> {
    let mut hits = Vec::new();
    for (group, (role, entries)) in descriptors.iter().enumerate() {
        for &(k, cost, refund) in entries {
            hits.push(hit(
                &format!("key-{k}"),
                limits[k],
                cost,
                refund,
                group,
                *role,
            ));
        }
    }
    hits
}

/// A denied request changes no state but that of its `charge: always` limits: every other
/// held key keeps its state, and each key of such a limit holds what taking (or, for a refund,
/// giving back) their costs in batch order from its old state leaves (nothing, once fresh).
/// Without such a limit, the same batch at the same instant gets the same outcome again.
pub fn assert_denials_change_nothing(
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
        let first = check(&limiter, hits);
        if first.admitted {
            continue;
        }
        prop_assert_eq!(&limiter.snapshot(), &charged);
        if charged != before {
            continue;
        }
        let again = check(&limiter, batch(limits, descriptors));
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
