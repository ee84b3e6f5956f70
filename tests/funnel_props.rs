//! Property tests of the funnel through the memory backend: the rate bound, denials that change
//! nothing, and agreement with the pure funnel.

use futures_util::FutureExt;
use proptest::collection::vec;
use proptest::prelude::*;
use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::funnel::{FRESH, Funnel};
use sluice::limiter::{
    Batch, BatchOutcome, Clock, Hit, HitOutcome, LimitParams, Limiter, ManualClock, MemoryLimiter,
    Role,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn params(quota: u32, period_nanos: u64, burst: u32, borrow: bool, charge: Charge) -> LimitParams {
    LimitParams {
        algorithm: Algorithm::Funnel,
        quota,
        period_nanos,
        burst,
        charge,
        borrow,
    }
}

fn hit(key: &str, limit: LimitParams, cost: u64, refund: bool, group: usize, role: Role) -> Hit {
    Hit {
        key: key.as_bytes().into(),
        limit,
        cost,
        refund,
        group,
        role,
    }
}

fn check(limiter: &MemoryLimiter<ManualClock>, hits: Vec<Hit>) -> BatchOutcome {
    let batch = Batch { hits };
    let result = limiter.check(&batch).now_or_never();
    result.expect("ready future").expect("no backend error")
}

/// A time step of `permille` thousandths of the nominal interval P/Q.
fn step(period: u64, quota: u32, permille: u64) -> u64 {
    let nanos = u128::from(period) * u128::from(permille) / (1000 * u128::from(quota.max(1)));
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

/// Steps in thousandths of an interval: often none (a burst at one instant), up to three.
fn permilles(max_len: usize) -> impl Strategy<Value = Vec<u64>> {
    vec(prop_oneof![Just(0u64), 0u64..3000], 1..=max_len)
}

/// Every pair of admitted events (time, cost): the cost admitted in [t_i, t_j] is at most
/// B + Q * (t_j - t_i) / P, in exact integers.
fn assert_bounded(
    events: &[(u64, u64)],
    quota: u32,
    period: u64,
    burst: u32,
) -> Result<(), TestCaseError> {
    let mut prefix = vec![0u128];
    for &(_, cost) in events {
        prefix.push(prefix[prefix.len() - 1] + u128::from(cost));
    }
    for (i, &(start, _)) in events.iter().enumerate() {
        for (j, &(end, _)) in events.iter().enumerate().skip(i) {
            let cost = prefix[j + 1] - prefix[i];
            let Some(over) = cost.checked_sub(u128::from(burst)) else {
                continue;
            };
            let allowed = u128::from(quota) * u128::from(end - start);
            prop_assert!(
                over * u128::from(period) <= allowed,
                "{cost} admitted in [{start}, {end}] with Q={quota} P={period} B={burst}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For `funnel`, the admitted cost in any interval of length L is at most B + Q*L/P.
    #[test]
    fn admitted_cost_in_any_interval_is_bounded(
        quota in 1u32..1000,
        period in MS..=10 * SEC,
        burst in prop_oneof![1u32..10, 1u32..2000],
        start in 0u64..=SEC,
        steps in permilles(200).prop_flat_map(|s| {
            let n = s.len();
            (Just(s), vec(0u64..=5, n))
        }),
    ) {
        let clock = ManualClock::at(start);
        let limiter = MemoryLimiter::with_clock(16, clock.clone());
        let limit = params(quota, period, burst, false, Charge::Admitted);
        let mut events = Vec::new();
        for (&permille, &cost) in steps.0.iter().zip(&steps.1) {
            clock.advance(step(period, quota, permille));
            let hits = vec![hit("k", limit, cost, false, 0, Role::Enforced)];
            if check(&limiter, hits).admitted && cost > 0 {
                events.push((clock.now_nanos(), cost));
            }
        }
        assert_bounded(&events, quota, period, burst)?;
    }
}

/// One key's limit in the batches of the second property (never `charge: always`).
fn key_limit() -> impl Strategy<Value = LimitParams> {
    (0u32..5, MS..=SEC, 0u32..6, any::<bool>())
        .prop_map(|(q, p, b, borrow)| params(q, p, b, borrow, Charge::Admitted))
}

/// A descriptor: its role and its hits as (key index, cost, refund).
type Descriptor = (Role, Vec<(usize, u64, bool)>);

fn descriptor() -> impl Strategy<Value = Descriptor> {
    let role = prop_oneof![
        3 => Just(Role::Enforced),
        1 => Just(Role::Shadow),
        1 => Just(Role::Quota),
    ];
    let hit = (0usize..4, 0u64..4, prop::bool::weighted(0.15));
    (role, vec(hit, 1..=3))
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A denied request changes no state: the same batch at the same instant gets the same
    /// outcome again, and no key appears or disappears.
    #[test]
    fn a_denied_request_changes_nothing(
        limits in vec(key_limit(), 4),
        requests in vec((0u64..300 * MS, vec(descriptor(), 1..=3)), 1..=60),
    ) {
        let clock = ManualClock::at(SEC);
        let limiter = MemoryLimiter::with_clock(64, clock.clone());
        for (advance, descriptors) in &requests {
            clock.advance(*advance);
            let len = limiter.len();
            let first = check(&limiter, batch(&limits, descriptors));
            if first.admitted {
                continue;
            }
            prop_assert_eq!(limiter.len(), len);
            let again = check(&limiter, batch(&limits, descriptors));
            prop_assert_eq!(&again, &first);
            prop_assert_eq!(limiter.len(), len);
        }
    }
}

/// The pure funnel's answer for one hit, and the state it leaves.
fn model(limit: &LimitParams, tat: u64, now: u64, cost: u64, refund: bool) -> (HitOutcome, u64) {
    let f: Funnel = limit.funnel();
    let admitted = refund || f.evaluate(tat, now, cost).admitted;
    let next = match (admitted || limit.charge == Charge::Always, refund) {
        (false, _) => tat,
        (true, true) => f.refund(tat, now, cost),
        (true, false) => f.consume(tat, now, cost),
    };
    let outcome = if admitted {
        HitOutcome {
            admitted,
            remaining: f.remaining(next, now),
            reset_nanos: f.until_empty(next, now),
        }
    } else {
        HitOutcome {
            admitted,
            remaining: 0,
            reset_nanos: f.until_admitted(tat, now, cost),
        }
    };
    (outcome, next)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For single hits, the memory backend answers exactly what the pure funnel does.
    #[test]
    fn the_memory_backend_agrees_with_the_pure_funnel(
        quota in 0u32..20,
        period in 1u64..=10 * SEC,
        burst in 0u32..30,
        borrow in any::<bool>(),
        always in any::<bool>(),
        start in 0u64..=SEC,
        steps in permilles(200).prop_flat_map(|s| {
            let n = s.len();
            (Just(s), vec((0u64..8, prop::bool::weighted(0.2)), n))
        }),
    ) {
        let charge = if always { Charge::Always } else { Charge::Admitted };
        let limit = params(quota, period, burst, borrow, charge);
        let clock = ManualClock::at(start);
        let limiter = MemoryLimiter::with_clock(16, clock.clone());
        let mut tat = FRESH;
        for (&permille, &(cost, refund)) in steps.0.iter().zip(&steps.1) {
            clock.advance(step(period, quota, permille));
            let now = clock.now_nanos();
            let (want, next) = model(&limit, tat, now, cost, refund);
            let got = check(&limiter, vec![hit("k", limit, cost, refund, 0, Role::Enforced)]);
            prop_assert_eq!(got.admitted, want.admitted);
            prop_assert_eq!(got.hits, vec![want]);
            prop_assert!(limiter.len() <= 1);
            tat = next;
        }
    }
}
