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
