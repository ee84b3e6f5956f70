//! Shared by the benchmarks: short criterion settings, a seeded generator, batch builders.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use sluice_core::config::model::{Algorithm, Charge};
use sluice_core::limiter::{Batch, Hit, LimitParams, Role};
pub(crate) use sluice_core::rng::Rng;

/// Criterion with a modest time budget (the whole suite runs in a few minutes).
pub(crate) fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .without_plots()
}

/// The seeded generator of `sluice bench`: every run draws the same sequence.
pub(crate) fn rng() -> Rng {
    Rng::new(0x5EED)
}

/// A limit that (practically) always admits: every hit stores a state.
pub(crate) fn wide_limit() -> LimitParams {
    LimitParams {
        algorithm: Algorithm::Funnel,
        quota: 1_000_000_000,
        period_nanos: 3_600_000_000_000,
        burst: 1_000_000_000,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

/// A state key shaped like the engine's: `{bench|user=user-<n>}:funnel:3600`.
pub(crate) fn key(n: u64) -> Arc<[u8]> {
    format!("{{bench|user=user-{n}}}:funnel:3600")
        .into_bytes()
        .into()
}

/// A batch of one hit on key `n`.
pub(crate) fn batch(n: u64) -> Batch {
    Batch {
        hits: vec![Hit {
            key: key(n),
            limit: wide_limit(),
            cost: 1,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        }],
    }
}
