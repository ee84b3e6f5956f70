//! Limits and hits for tests that drive a [`Limiter`] directly, without rules or gRPC: build
//! one with these and change a field with struct update syntax, e.g.
//! `Hit { group: 1, ..hit("k", limit(Algorithm::Funnel, 10, SECOND), 1) }`.

use futures_util::FutureExt as _;

use crate::config::model::{Algorithm, Charge};
use crate::limiter::{Batch, BatchOutcome, Hit, LimitParams, Limiter, Role};

/// `quota` per `period_nanos` with `algorithm`: a burst of `quota`, costs charged when
/// admitted, no borrowing.
pub fn limit(algorithm: Algorithm, quota: u32, period_nanos: u64) -> LimitParams {
    LimitParams {
        algorithm,
        quota,
        period_nanos,
        burst: quota,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

/// A hit of `cost` on state key `key` (a copy of its bytes) under `limit`: enforced, not a
/// refund, in descriptor 0.
pub fn hit(key: impl AsRef<[u8]>, limit: LimitParams, cost: u64) -> Hit {
    Hit {
        key: key.as_ref().into(),
        limit,
        cost,
        refund: false,
        group: 0,
        role: Role::Enforced,
        hold: None,
    }
}

/// Checks `hits` as one batch on a backend that answers at once (the memory backend).
///
/// # Panics
/// When the backend's future is not ready at once, or the backend fails: this is test code.
pub fn check_now(limiter: &(impl Limiter + ?Sized), hits: Vec<Hit>) -> BatchOutcome {
    let batch = Batch { hits };
    let result = limiter.check(&batch).now_or_never();
    result.expect("a ready future").expect("no backend error")
}

/// A memory limiter that holds every call until the test releases it, counting the calls that
/// entered and the most held at once: for tests of what happens while requests are in flight.
pub struct Gate {
    inner: crate::limiter::MemoryLimiter,
    entered: std::sync::atomic::AtomicUsize,
    in_flight: std::sync::atomic::AtomicUsize,
    most_in_flight: std::sync::atomic::AtomicUsize,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
}

impl Gate {
    /// A gate over a memory limiter of `capacity` keys, closed.
    pub fn new(capacity: usize) -> Gate {
        Gate {
            inner: crate::limiter::MemoryLimiter::new(capacity),
            entered: Default::default(),
            in_flight: Default::default(),
            most_in_flight: Default::default(),
            arrived: tokio::sync::Notify::new(),
            release: tokio::sync::Semaphore::new(0),
        }
    }

    /// Lets `calls` held (or future) calls through.
    pub fn release(&self, calls: usize) {
        self.release.add_permits(calls);
    }

    /// Waits until `calls` calls have entered the gate in all.
    pub async fn entered(&self, calls: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            let arrived = self.arrived.notified();
            if self.entered.load(SeqCst) >= calls {
                return;
            }
            arrived.await;
        }
    }

    /// How many calls entered so far.
    pub fn entered_count(&self) -> usize {
        self.entered.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The most calls held at once so far.
    pub fn most_in_flight(&self) -> usize {
        self.most_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Limiter for Gate {
    fn check<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> crate::limiter::BoxFuture<'a, Result<BatchOutcome, crate::limiter::LimiterError>> {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            self.entered.fetch_add(1, SeqCst);
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most_in_flight.fetch_max(now, SeqCst);
            self.arrived.notify_waiters();
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
            self.in_flight.fetch_sub(1, SeqCst);
            self.inner.check(batch).await
        })
    }

    fn name(&self) -> &'static str {
        "gate"
    }
}
