//! Helpers of the Redis tests: the two backends of the `scenario!` suite, and load across
//! replicas.

#[macro_use]
pub(crate) mod backends;
pub(crate) mod limiters;
pub(crate) mod load;
pub(crate) mod rng;
