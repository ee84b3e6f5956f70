//! The in-process backend: a sharded map of funnel states, bounded in size.

use super::{Batch, BatchOutcome, BoxFuture, Clock, Limiter, LimiterError, MonotonicClock};

/// Limiter state in this process's memory.
pub struct MemoryLimiter<C: Clock = MonotonicClock> {
    clock: C,
    max_keys: usize,
}

impl MemoryLimiter<MonotonicClock> {
    /// A limiter holding at most `max_keys` states, on the monotonic clock.
    pub fn new(max_keys: usize) -> Self {
        Self::with_clock(max_keys, MonotonicClock::new())
    }
}

impl<C: Clock> MemoryLimiter<C> {
    pub fn with_clock(max_keys: usize, clock: C) -> Self {
        MemoryLimiter { clock, max_keys }
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        let _ = (&self.clock, self.max_keys);
        todo!("memory backend")
    }

    /// Drops drained entries; returns how many.
    pub fn sweep(&self) -> usize {
        todo!("memory backend")
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<C: Clock> Limiter for MemoryLimiter<C> {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        let _ = batch;
        todo!("memory backend")
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
