//! Arbitrary sequences of operations (take if admitted, take always, give back, check) with
//! costs and clock steps, against every algorithm through `sluice_core::limiter::algorithm::Algo`.
//!
//! Before each operation, whatever the state: `remaining` is at most the capacity (the burst
//! of `funnel` and `token_bucket`, the quota of a window); a denied cost gets an exact retry
//! time (still denied one nanosecond before it; at it, admitted exactly when a fresh state
//! would admit it); at `fresh_at` the state answers as a fresh one does. After an admitted
//! take, the reported reset is the time to fresh (to the window's end for `fixed_window`).
//! For sequences of plain takes (no `charge: always`, refunds or borrowing), the admitted
//! cost stays within each algorithm's bound (docs/algorithms.md). Nothing may overflow.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sluice_core::config::model::{Algorithm, Charge};
use sluice_core::limiter::LimitParams;
use sluice_core::limiter::algorithm::{Algo, State};

/// The longest period rules allow: 100 years of 365 days.
const MAX_PERIOD: u64 = 100 * 365 * 86_400 * 1_000_000_000;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    Funnel,
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

#[derive(Arbitrary, Debug)]
enum Size {
    Small(u8),
    Any(u32),
}

#[derive(Arbitrary, Debug)]
enum Period {
    Nanos(u16),
    Seconds(u32),
    /// Beyond what rules allow: only "no panic" is checked then.
    Any(u64),
}

#[derive(Arbitrary, Debug)]
enum Cost {
    Small(u8),
    Any(u64),
}

#[derive(Arbitrary, Debug)]
enum Wait {
    None,
    /// Thousandths of the period.
    Permille(u16),
    Any(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// `charge: admitted`: take the cost only when admitted.
    Take,
    /// `charge: always`: take it anyway.
    Charge,
    Refund,
    /// Only ask.
    Check,
}

#[derive(Arbitrary, Debug)]
struct Op {
    action: Action,
    cost: Cost,
    wait: Wait,
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: Kind,
    quota: Size,
    burst: Size,
    period: Period,
    borrow: bool,
    start: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| run(input));

fn run(input: Input) {
    let limit = params(&input);
    let algo = Algo::of(&limit);
    let mut state = State::Fresh;
    let mut now = input.start;
    let mut events = Vec::new();
    let mut plain = !limit.borrow || !matches!(input.kind, Kind::Funnel | Kind::TokenBucket);
    for op in input.ops.iter().take(300) {
        now = now.saturating_add(wait(&op.wait, limit.period_nanos));
        let cost = match op.cost {
            Cost::Small(c) => u64::from(c),
            Cost::Any(c) => c,
        };
        check_state(&algo, &limit, &state, now, cost);
        match op.action {
            Action::Take if algo.admits(&state, now, cost) => {
                algo.take(&mut state, now, cost);
                check_reset(&algo, &state, now, limit.period_nanos);
                if cost > 0 {
                    events.push((now, cost));
                }
            }
            Action::Take | Action::Check => {}
            Action::Charge => {
                plain = false;
                algo.take(&mut state, now, cost);
            }
            Action::Refund => {
                plain = false;
                algo.give_back(&mut state, now, cost);
            }
        }
    }
    check_state(&algo, &limit, &state, now, 1);
    if plain && within_range(&limit, now) {
        check_bound(input.kind, &limit, &events);
    }
}

/// Where the exact checks apply: periods the rules allow, times up to 2262, and a funnel
/// whose capacity `B x ceil(P/Q)` spans at most 292 years. Beyond, the funnel's saturating
/// arithmetic admits any cost once `tat` would pass the end of u64 time (which the rules
/// rule out: a capacity is at most 100 years, see tests/properties/fuzz_regressions.rs), so only
/// "no panic" and `remaining` are checked there.
fn within_range(limit: &LimitParams, end: u64) -> bool {
    let half = u128::from(u64::MAX / 2);
    let interval = limit.period_nanos.div_ceil(u64::from(limit.quota.max(1)));
    let capacity = u128::from(interval) * u128::from(limit.burst);
    limit.period_nanos <= MAX_PERIOD && u128::from(end) <= half && capacity <= half
}

fn params(input: &Input) -> LimitParams {
    let size = |s: &Size| match *s {
        Size::Small(n) => u32::from(n),
        Size::Any(n) => n,
    };
    let period = match input.period {
        Period::Nanos(n) => u64::from(n).max(1),
        Period::Seconds(s) => u64::from(s).max(1) * 1_000_000_000,
        Period::Any(n) => n.max(1),
    };
    let algorithm = match input.kind {
        Kind::Funnel => Algorithm::Funnel,
        Kind::TokenBucket => Algorithm::TokenBucket,
        Kind::FixedWindow => Algorithm::FixedWindow,
        Kind::SlidingWindow => Algorithm::SlidingWindow,
        Kind::SlidingLog => Algorithm::SlidingLog,
    };
    LimitParams {
        algorithm,
        quota: size(&input.quota),
        period_nanos: period,
        burst: size(&input.burst),
        charge: Charge::Admitted,
        borrow: input.borrow,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

/// The most `remaining` may ever be.
fn capacity(limit: &LimitParams) -> u64 {
    match limit.algorithm {
        Algorithm::Funnel | Algorithm::TokenBucket => u64::from(limit.burst),
        _ => u64::from(limit.quota),
    }
}

fn wait(wait: &Wait, period: u64) -> u64 {
    match *wait {
        Wait::None => 0,
        Wait::Permille(p) => {
            let nanos = u128::from(period) * u128::from(p) / 1000;
            u64::try_from(nanos).unwrap_or(u64::MAX)
        }
        Wait::Any(n) => n,
    }
}

/// What must hold of any state at `now`, for a hit of `cost`.
fn check_state(algo: &Algo, limit: &LimitParams, state: &State, now: u64, cost: u64) {
    let cap = capacity(limit);
    let remaining = algo.remaining(state, now);
    assert!(
        remaining <= cap,
        "remaining {remaining} > {cap} at {now}: {state:?}"
    );
    if !algo.admits(state, now, cost) {
        check_retry(algo, limit, state, now, cost);
    }
    let fresh = algo.fresh_at(state, now);
    let at = fresh.unwrap_or(now);
    if !within_range(limit, at) {
        return;
    }
    if let Some(at) = fresh {
        assert!(at > now, "fresh at {at}, not after {now}");
    }
    let same = |c| algo.admits(state, at, c) == algo.admits(&State::Fresh, at, c);
    assert!(
        same(cost) && same(1),
        "not fresh at {at} ({fresh:?}) for cost {cost}: {state:?}"
    );
    assert_eq!(
        algo.remaining(state, at),
        algo.remaining(&State::Fresh, at),
        "not fresh at {at}: {state:?}"
    );
}

/// A denied cost: denied until its retry time, then admitted if it ever can be.
fn check_retry(algo: &Algo, limit: &LimitParams, state: &State, now: u64, cost: u64) {
    let wait = algo.until_admitted(state, now, cost);
    assert!(wait >= 1, "a denial with no wait at {now}: {state:?}");
    let Some(at) = now.checked_add(wait).filter(|&at| within_range(limit, at)) else {
        return;
    };
    assert!(
        !algo.admits(state, at - 1, cost),
        "cost {cost} admitted at {} before its retry time {at}: {state:?}",
        at - 1
    );
    let fits = algo.admits(&State::Fresh, at, cost);
    assert_eq!(
        algo.admits(state, at, cost),
        fits,
        "cost {cost} at its retry time {at} (wait {wait}): {state:?}"
    );
}

/// The reset of an admitted hit: the time to fresh, or for a fixed window to its end.
fn check_reset(algo: &Algo, state: &State, now: u64, period: u64) {
    let reset = algo.reset_after(state, now);
    if let Algo::FixedWindow(_) = algo {
        assert!(
            (1..=period).contains(&reset),
            "reset {reset} of a window of {period}"
        );
    } else {
        let fresh = algo.fresh_at(state, now).map_or(0, |at| at - now);
        assert_eq!(
            reset, fresh,
            "reset {reset} but fresh in {fresh}: {state:?}"
        );
    }
}

/// The admitted cost within the bound each algorithm states (docs/algorithms.md).
fn check_bound(kind: Kind, limit: &LimitParams, events: &[(u64, u64)]) {
    let (q, p, b) = (
        u128::from(limit.quota),
        u128::from(limit.period_nanos),
        u128::from(limit.burst),
    );
    // The most that may be admitted in [start, start + len].
    let bound = |len: u128| match kind {
        Kind::Funnel => b + q * len / p,
        Kind::TokenBucket => b + q * len.div_ceil(p),
        Kind::FixedWindow => q * (len / p + 2),
        Kind::SlidingWindow => q + (q * len).div_ceil(p),
        Kind::SlidingLog => q * (len / p + 1),
    };
    let mut prefix = vec![0u128];
    for &(_, cost) in events {
        prefix.push(prefix[prefix.len() - 1] + u128::from(cost));
    }
    for (i, &(start, _)) in events.iter().enumerate() {
        for (j, &(end, _)) in events.iter().enumerate().skip(i) {
            let admitted = prefix[j + 1] - prefix[i];
            let len = u128::from(end - start);
            assert!(
                admitted <= bound(len),
                "{admitted} admitted in [{start}, {end}] by {limit:?}"
            );
            let same_window = start / limit.period_nanos == end / limit.period_nanos;
            if same_window && matches!(kind, Kind::FixedWindow | Kind::SlidingWindow) {
                assert!(
                    admitted <= q,
                    "{admitted} admitted in one window by {limit:?}"
                );
            }
        }
    }
}
