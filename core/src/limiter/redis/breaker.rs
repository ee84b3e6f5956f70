//! A circuit breaker: after `failures` consecutive transient failures, calls are refused at once
//! for `cooldown`; then one call at a time is let through as a probe (at most one per
//! `cooldown`), and the first success closes the breaker again.
//!
//! A probe that never finishes (its request was cancelled) cannot wedge the breaker: the next
//! probe is simply allowed one `cooldown` later.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The breaker's state.
#[derive(Debug)]
pub struct Breaker {
    failures: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go through; this many consecutive failures so far.
    Closed(u32),
    /// Calls are refused until this instant; then one probe goes through.
    Open(Instant),
}

impl Breaker {
    /// A breaker that opens after `failures` consecutive failures (0 = never opens).
    pub fn new(failures: u32, cooldown: Duration) -> Breaker {
        Breaker {
            failures,
            cooldown,
            state: Mutex::new(State::Closed(0)),
        }
    }

    /// Whether a call may be made now (a probe, when open and cooled down).
    pub fn allow(&self) -> bool {
        let mut state = self.state.lock();
        match *state {
            State::Closed(_) => true,
            State::Open(until) => {
                let now = Instant::now();
                if now < until {
                    return false;
                }
                *state = State::Open(now + self.cooldown);
                true
            }
        }
    }

    /// Records a call's result.
    pub fn record(&self, ok: bool) {
        let mut state = self.state.lock();
        *state = match (*state, ok) {
            (_, true) => State::Closed(0),
            (State::Open(_), false) => State::Open(Instant::now() + self.cooldown),
            (State::Closed(n), false) => {
                let n = n.saturating_add(1);
                if self.failures > 0 && n >= self.failures {
                    tracing::warn!(failures = n, cooldown = ?self.cooldown, "redis circuit breaker open");
                    State::Open(Instant::now() + self.cooldown)
                } else {
                    State::Closed(n)
                }
            }
        };
    }

    /// Whether calls are currently being refused.
    pub fn is_open(&self) -> bool {
        matches!(*self.state.lock(), State::Open(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_after_failures_probes_after_cooldown_and_closes_on_success() {
        let b = Breaker::new(2, Duration::from_millis(100));
        assert!(b.allow());
        b.record(false);
        assert!(b.allow());
        b.record(false);
        assert!(b.is_open());
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.allow(), "one probe");
        assert!(!b.allow(), "only one");
        b.record(false);
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.allow());
        b.record(true);
        assert!(!b.is_open());
        assert!(b.allow() && b.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_probe_does_not_wedge_it_and_zero_never_opens() {
        let b = Breaker::new(1, Duration::from_millis(50));
        b.record(false);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(b.allow());
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(b.allow(), "the next probe comes one cooldown later");
        let never = Breaker::new(0, Duration::from_millis(50));
        for _ in 0..10 {
            never.record(false);
        }
        assert!(never.allow());
    }
}
