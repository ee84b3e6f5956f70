//! Time for the limiters, as nanoseconds since a clock's own origin.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of monotonic time in nanoseconds. Never goes backwards.
pub trait Clock: Send + Sync + 'static {
    fn now_nanos(&self) -> u64;
}

/// The process's monotonic clock (tokio's, so `tokio::time::pause()` controls it in tests).
/// Its origin is one second before its creation, so that a real instant is never 0
/// (0 is the fresh state of a funnel).
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    origin: tokio::time::Instant,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        let now = tokio::time::Instant::now();
        let origin = now
            .checked_sub(std::time::Duration::from_secs(1))
            .unwrap_or(now);
        MonotonicClock { origin }
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
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to; for tests. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `nanos`.
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
