//! Time for the limiters: nanoseconds since the Unix epoch, never going backwards.
//!
//! Two algorithms align their windows to the epoch (`fixed_window`, `sliding_window`: a minute
//! window starts at a whole minute of UTC, a day window at 00:00 UTC), so the memory backend's
//! clock must read wall-clock time; every algorithm also needs it never to go backwards. The
//! production clock, [`MonotonicClock`], gets both by reading the system's wall clock once, when
//! it is made, and adding the monotonic time elapsed since: it reads the Unix time of its
//! creation plus tokio's monotonic clock. It never jumps when the system clock is stepped later
//! (NTP slews both clocks alike; a step, rare on a synchronised host, is only picked up at the
//! next start). Tests control time with [`ManualClock`], or with `tokio::time::pause()`, which
//! the monotonic part follows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// A source of time in nanoseconds since the Unix epoch. Never goes backwards.
pub trait Clock: Send + Sync + 'static {
    fn now_nanos(&self) -> u64;
}

/// The production clock: the wall clock when it was made, plus monotonic time since.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    origin: tokio::time::Instant,
    /// Nanoseconds since the Unix epoch at `origin`.
    unix_at_origin: u64,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        MonotonicClock {
            origin: tokio::time::Instant::now(),
            // Never 0, which is the fresh state of a funnel.
            unix_at_origin: nanos(wall).max(1_000_000_000),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_nanos(&self) -> u64 {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        self.unix_at_origin.saturating_add(nanos(elapsed))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A clock that moves only when told to; for tests. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `nanos` (since the Unix epoch, as far as windows are concerned).
    pub fn at(nanos: u64) -> ManualClock {
        ManualClock {
            now: Arc::new(AtomicU64::new(nanos)),
        }
    }

    pub fn advance(&self, nanos: u64) {
        self.now.fetch_add(nanos, Ordering::SeqCst);
    }

    pub fn set(&self, nanos: u64) {
        self.now.store(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_nanos(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reads_unix_time_and_follows_the_monotonic_clock() {
        let clock = MonotonicClock::new();
        let wall = nanos(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or(Duration::ZERO),
        );
        let first = clock.now_nanos();
        assert!(first.abs_diff(wall) < 5_000_000_000, "{first} vs {wall}");
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(clock.now_nanos() - first, 90_000_000_000);
    }
}
