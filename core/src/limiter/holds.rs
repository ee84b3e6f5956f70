//! Holds with ids (the Throttle API's AcquireHold, ReleaseHold, ExtendHold): one operation on
//! one concurrency key, decided atomically by the backend on the key's concurrency state (the
//! same records as `algorithm: concurrency`, see [`super::concurrency`] and docs/holds.md).

use std::sync::Arc;

/// What to do with the key's holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOp {
    /// Take `count` slots under a new id, when they fit.
    Acquire { count: u64 },
    /// Free the live hold `id`.
    Release { id: u64 },
    /// Push the live hold `id`'s expiry to now + the lease.
    Extend { id: u64 },
}

/// One operation on a key of `slots` slots whose holds are leased for `lease_nanos`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRequest {
    /// The state key.
    pub key: Arc<[u8]>,
    pub slots: u32,
    pub lease_nanos: u64,
    pub op: HoldOp,
}

/// The result of a [`HoldRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldOutcome {
    /// Acquire: taken; release and extend: the hold was live (and is now freed or extended).
    pub done: bool,
    /// Acquire, when taken: the hold's id (the backend's record id).
    pub id: u64,
    /// Slots held on the key after the operation.
    pub held: u64,
    /// Acquire, when not taken: nanoseconds until enough holds expire for the count.
    pub wait_nanos: u64,
}
