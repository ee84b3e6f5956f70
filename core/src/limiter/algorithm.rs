//! Every algorithm behind one interface: a key's [`State`], and [`Algo`], one limit's algorithm
//! with its parameters, answering what a backend asks about a hit. Each algorithm's math lives
//! in its own module as pure functions; this module only dispatches.
//!
//! A state of one algorithm read by another (which the state keys, naming the algorithm, rule
//! out) counts as fresh.

use super::LimitParams;
use super::concurrency::{Concurrency, Holds};
use super::fixed_window::{self, FixedWindow, Window};
use super::funnel::{self, Funnel, Tat};
use super::sliding_log::{Log, SlidingLog};
use super::sliding_window::{self, Counters, SlidingWindow};
use super::token_bucket::{self, Bucket, TokenBucket};
use crate::config::model::Algorithm;

/// One key's limiter state. [`State::Fresh`] is the state of a key never used, or whose state
/// holds no information any more; backends never store it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum State {
    #[default]
    Fresh,
    /// The funnel's `tat`, with the quota it was taken under and what anonymous refunds may
    /// give back.
    Funnel(Tat),
    TokenBucket(Bucket),
    FixedWindow(Window),
    SlidingWindow(Counters),
    /// Boxed, so that every other state stays small.
    SlidingLog(Box<Log>),
    /// Boxed too.
    Concurrency(Box<Holds>),
    /// Not an algorithm's: a key's penalty box (`block_for`), blocked until this time. The
    /// memory backend stores it beside the key's state; every algorithm reads it as fresh.
    Blocked(u64),
}

/// One limit's algorithm and parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Funnel(Funnel),
    TokenBucket(TokenBucket),
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    SlidingLog(SlidingLog),
    Concurrency(Concurrency),
}

impl Algo {
    /// The algorithm of a limit.
    pub fn of(limit: &LimitParams) -> Algo {
        let (q, p, b, borrow) = (limit.quota, limit.period_nanos, limit.burst, limit.borrow);
        match limit.algorithm {
            Algorithm::Funnel => Algo::Funnel(Funnel::new(q, p, b, borrow)),
            Algorithm::TokenBucket => Algo::TokenBucket(TokenBucket::new(q, p, b, borrow)),
            Algorithm::FixedWindow => {
                Algo::FixedWindow(FixedWindow::new(q, p).with_calendar(limit.calendar))
            }
            Algorithm::SlidingWindow => Algo::SlidingWindow(SlidingWindow::new(q, p)),
            Algorithm::SlidingLog => Algo::SlidingLog(SlidingLog::new(q, p)),
            Algorithm::Concurrency => Algo::Concurrency(Concurrency::new(q, p)),
        }
    }

    /// Whether `cost` at `now` is admitted against `state`.
    pub fn admits(&self, state: &State, now: u64, cost: u64) -> bool {
        match self {
            Algo::Funnel(f) => f.evaluate(tat(f, state, now), now, cost).admitted,
            Algo::TokenBucket(b) => b.admits(bucket(state), now, cost),
            Algo::FixedWindow(w) => w.admits(window(state), now, cost),
            Algo::SlidingWindow(w) => w.admits(counters(state), now, cost),
            Algo::SlidingLog(l) => l.admits(log(state), now, cost),
            Algo::Concurrency(c) => c.admits(holds(state), now, cost),
        }
    }

    /// Takes `cost` at `now`, admitted or not.
    pub fn take(&self, state: &mut State, now: u64, cost: u64) {
        *state = match self {
            Algo::Funnel(f) => State::Funnel(f.take_state(funnel_state(state), now, cost)),
            Algo::TokenBucket(b) => State::TokenBucket(b.consume(bucket(state), now, cost)),
            Algo::FixedWindow(w) => State::FixedWindow(w.consume(window(state), now, cost)),
            Algo::SlidingWindow(w) => State::SlidingWindow(w.consume(counters(state), now, cost)),
            Algo::SlidingLog(l) => {
                let mut log = take_log(state);
                l.consume(&mut log, now, cost);
                State::SlidingLog(log)
            }
            Algo::Concurrency(c) => {
                let mut holds = take_holds(state);
                c.take(&mut holds, now, cost);
                State::Concurrency(holds)
            }
        };
    }

    /// Takes `cost` at `now` under the hold `id` (a request's named hold), or gives it back
    /// from that hold only, for a refund. Only `concurrency` names holds; another algorithm
    /// takes or gives back as without an id.
    #[cold]
    #[inline(never)]
    pub(crate) fn apply_id(&self, state: &mut State, now: u64, cost: u64, id: u64, refund: bool) {
        let Algo::Concurrency(c) = self else {
            if refund {
                self.give_back(state, now, cost);
            } else {
                self.take(state, now, cost);
            }
            return;
        };
        let mut holds = take_holds(state);
        if refund {
            c.give_back_id(&mut holds, now, id, cost);
        } else {
            c.take_id(&mut holds, now, id, cost);
        }
        *state = State::Concurrency(holds);
    }

    /// Records what a denied request leaves behind: for `concurrency`, its cost as a pending
    /// denial (its release is still to come); nothing for the others.
    pub fn deny(&self, state: &mut State, now: u64, cost: u64) {
        if let Algo::Concurrency(c) = self {
            let mut holds = take_holds(state);
            c.deny(&mut holds, now, cost);
            *state = State::Concurrency(holds);
        }
    }

    /// Whether a denied request changes this algorithm's state ([`Self::deny`]).
    pub fn keeps_denials(&self) -> bool {
        matches!(self, Algo::Concurrency(_))
    }

    /// Gives `cost` back at `now` for an anonymous refund (Envoy's `is_negative_hits`,
    /// Throttle's `refund`), within each algorithm's bound (docs/algorithms.md): the funnel
    /// gives back at most the anonymous units taken since the last named take, the windows and
    /// the token bucket only to the current window or refill step and at most what anonymous
    /// takes counted there since the last named take, the log only entries still counting;
    /// never below empty.
    pub fn give_back(&self, state: &mut State, now: u64, cost: u64) {
        *state = match self {
            Algo::Funnel(f) => State::Funnel(f.refund_state(funnel_state(state), now, cost)),
            Algo::TokenBucket(b) => State::TokenBucket(b.refund(bucket(state), now, cost)),
            Algo::FixedWindow(w) => State::FixedWindow(w.refund(window(state), now, cost)),
            Algo::SlidingWindow(w) => State::SlidingWindow(w.refund(counters(state), now, cost)),
            Algo::SlidingLog(l) => {
                let mut log = take_log(state);
                l.refund(&mut log, now, cost);
                State::SlidingLog(log)
            }
            Algo::Concurrency(c) => {
                let mut holds = take_holds(state);
                c.give_back(&mut holds, now, cost);
                State::Concurrency(holds)
            }
        };
    }

    /// Names the take just made on `state` at `now` (a reservation's, or a lease's): returns
    /// the mark a later return by name needs ([`Self::give_back_named`]): the funnel's slots'
    /// end, the window's start, the token bucket's refill step, the log entry's time (0 for
    /// concurrency). The funnel also keeps anonymous refunds off the units taken so far.
    pub fn name_take(&self, state: &mut State, now: u64) -> u64 {
        match self {
            Algo::Funnel(f) => {
                let (named, mark) = f.name_take(funnel_state(state), now);
                if let State::Funnel(s) = state {
                    *s = named;
                }
                mark
            }
            Algo::TokenBucket(b) => {
                let named = b.name_take(bucket(state), now);
                if let State::TokenBucket(s) = state {
                    *s = named;
                }
                b.mark(named, now)
            }
            Algo::FixedWindow(w) => {
                if let State::FixedWindow(s) = state {
                    *s = w.name_take(*s, now);
                }
                w.mark(now)
            }
            Algo::SlidingWindow(w) => {
                if let State::SlidingWindow(s) = state {
                    *s = w.name_take(*s, now);
                }
                w.mark(now)
            }
            Algo::SlidingLog(l) => l.mark(log(state), now),
            Algo::Concurrency(_) => 0,
        }
    }

    /// Names a reservation's take of `cost` just made on `state` at `now`, `open` units being
    /// reserved on the key and not yet settled ([`Self::name_take`]); the mark its commit
    /// returns by. For the funnel, the earliest its units' slots can come to end
    /// ([`Funnel::reservation_mark`]): the open reservations' returns may move them earlier,
    /// and its commit must not give back units that drained meanwhile. (A lease keeps the
    /// take's own mark: it gives back only while its units are the last ones, nothing having
    /// moved them.)
    pub fn name_reservation(&self, state: &mut State, now: u64, cost: u64, open: u64) -> u64 {
        let mark = self.name_take(state, now);
        match self {
            Algo::Funnel(f) => f.reservation_mark(mark, now, cost, open),
            _ => mark,
        }
    }

    /// Returns `units` of a named take whose mark is `mark` ([`Self::name_take`]), exactly:
    /// only what still counts of them (docs/algorithms.md, "Returns"). For concurrency, a
    /// release of `units`.
    pub fn give_back_named(&self, state: &mut State, now: u64, units: u64, mark: u64) {
        *state = match self {
            Algo::Funnel(f) => State::Funnel(f.return_units(funnel_state(state), now, units, mark)),
            Algo::TokenBucket(b) => {
                State::TokenBucket(b.return_units(bucket(state), now, units, mark))
            }
            Algo::FixedWindow(w) => {
                State::FixedWindow(w.return_units(window(state), now, units, mark))
            }
            Algo::SlidingWindow(w) => {
                State::SlidingWindow(w.return_units(counters(state), now, units, mark))
            }
            Algo::SlidingLog(l) => {
                let mut log = take_log(state);
                l.return_units(&mut log, now, units, mark);
                State::SlidingLog(log)
            }
            Algo::Concurrency(_) => {
                self.give_back(state, now, units);
                return;
            }
        };
    }

    /// What is left at `now`.
    pub fn remaining(&self, state: &State, now: u64) -> u64 {
        match self {
            Algo::Funnel(f) => f.remaining(tat(f, state, now), now),
            Algo::TokenBucket(b) => b.remaining(bucket(state), now),
            Algo::FixedWindow(w) => w.remaining(window(state), now),
            Algo::SlidingWindow(w) => w.remaining(counters(state), now),
            Algo::SlidingLog(l) => l.remaining(log(state), now),
            Algo::Concurrency(c) => c.remaining(holds(state), now),
        }
    }

    /// The reset reported for an admitted hit: until the full quota is back (for a fixed
    /// window, as envoyproxy/ratelimit reports it: to the end of the window).
    pub fn reset_after(&self, state: &State, now: u64) -> u64 {
        match self {
            Algo::Funnel(f) => f.until_empty(tat(f, state, now), now),
            Algo::TokenBucket(b) => b.until_full(bucket(state), now),
            Algo::FixedWindow(w) => w.until_window_end(now),
            Algo::SlidingWindow(w) => w.until_fresh(counters(state), now),
            Algo::SlidingLog(l) => l.until_fresh(log(state), now),
            Algo::Concurrency(c) => c.until_free(holds(state), now),
        }
    }

    /// Until `cost` would be admitted (at least 1 when it is denied now).
    pub fn until_admitted(&self, state: &State, now: u64, cost: u64) -> u64 {
        match self {
            Algo::Funnel(f) => f.until_admitted_state(funnel_state(state), now, cost),
            Algo::TokenBucket(b) => b.until_admitted(bucket(state), now, cost),
            Algo::FixedWindow(w) => w.until_admitted(window(state), now, cost),
            Algo::SlidingWindow(w) => w.until_admitted(counters(state), now, cost),
            Algo::SlidingLog(l) => l.until_admitted(log(state), now, cost),
            Algo::Concurrency(c) => c.until_admitted(holds(state), now, cost),
        }
    }

    /// When `state` becomes fresh (holds no information any more), or `None` when it already
    /// is at `now`. Backends drop a state then: Redis gives its key this expiry.
    pub fn fresh_at(&self, state: &State, now: u64) -> Option<u64> {
        let wait = match self {
            Algo::Funnel(f) => f.until_empty(tat(f, state, now), now),
            Algo::TokenBucket(b) => b.until_full(bucket(state), now),
            Algo::FixedWindow(w) => w.until_fresh(window(state), now),
            Algo::SlidingWindow(w) => w.until_fresh(counters(state), now),
            Algo::SlidingLog(l) => l.until_fresh(log(state), now),
            Algo::Concurrency(c) => c.until_fresh(holds(state), now),
        };
        (wait > 0).then(|| now.saturating_add(wait))
    }
}

fn funnel_state(state: &State) -> Tat {
    match state {
        State::Funnel(s) => *s,
        _ => funnel::FRESH_STATE,
    }
}

/// The funnel's `tat` at `now` under `f` (a state taken under another quota, converted).
fn tat(f: &Funnel, state: &State, now: u64) -> u64 {
    f.tat_of(funnel_state(state), now)
}

fn bucket(state: &State) -> Bucket {
    match state {
        State::TokenBucket(b) => *b,
        _ => token_bucket::FULL,
    }
}

fn window(state: &State) -> Window {
    match state {
        State::FixedWindow(w) => *w,
        _ => fixed_window::EMPTY,
    }
}

fn counters(state: &State) -> Counters {
    match state {
        State::SlidingWindow(c) => *c,
        _ => sliding_window::EMPTY,
    }
}

static EMPTY_LOG: Log = Log::EMPTY;

fn log(state: &State) -> &Log {
    match state {
        State::SlidingLog(l) => l,
        _ => &EMPTY_LOG,
    }
}

/// The log of `state`, taken out of it (an empty log if it holds something else).
fn take_log(state: &mut State) -> Box<Log> {
    match std::mem::take(state) {
        State::SlidingLog(l) => l,
        _ => Box::default(),
    }
}

static EMPTY_HOLDS: Holds = Holds::EMPTY;

fn holds(state: &State) -> &Holds {
    match state {
        State::Concurrency(h) => h,
        _ => &EMPTY_HOLDS,
    }
}

/// The holds of `state`, taken out of it (none if it holds something else).
fn take_holds(state: &mut State) -> Box<Holds> {
    match std::mem::take(state) {
        State::Concurrency(h) => h,
        _ => Box::default(),
    }
}
