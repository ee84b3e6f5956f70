//! Helpers of the Redis tests: the two backends of the `scenario!` suite, and load across
//! replicas.

#[macro_use]
pub mod backends;
pub mod limiters;
pub mod load;
pub mod rng;
