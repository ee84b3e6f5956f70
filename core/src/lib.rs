//! sluice-core: the decision, with no protocol, HTTP, file-watching or metrics library.
//!
//! # Layout
//!
//! Dependencies point one way, and a test (`src/layers.rs`) checks them:
//! `engine -> { rules, limiter } -> config`; `pem` and `rng` stand beside them and use none.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | settings, and the rules files: parse, check, validate into a model |
//! | [`rules`] | the compiled descriptor tree per domain, matching, state keys |
//! | [`limiter`] | the algorithms as pure functions, the `Limiter` trait and its backends (memory, Redis, Memcached; per-second limits routed to a Redis of their own) |
//! | [`engine`] | one request in domain types: match, one limiter call, statuses |
//! | [`pem`] | PEM files (a CA, a certificate and key) read and checked before use |
//! | [`rng`] | a small seeded generator for load generation and benchmarks |
//!
//! The `sluice` crate re-exports these modules under the same names and adds everything that
//! speaks a protocol or runs a task: the gRPC port and services, the admin HTTP server,
//! metrics, xDS, reload and the binary.

#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod limiter;
pub mod pem;
pub mod rng;
pub mod rules;

#[cfg(test)]
mod layers;
