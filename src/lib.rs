//! sluice: a rate-limit service for Envoy's Rate Limit Service v3.
//!
//! # Layout
//!
//! Dependencies point one way:
//! `main (CLI) -> app -> grpc -> engine -> { rules, limiter } -> config model`.
//!
//! | module | owns |
//! |---|---|
//! | [`proto`] | the generated wire types (the only place they are included) |
//! | [`config`] | settings, and the rules files: parse, check, validate into a model |
//! | [`rules`] | the compiled descriptor tree per domain, matching, state keys |
//! | [`limiter`] | the algorithms as pure functions, the `Limiter` trait and its backends |
//! | [`engine`] | one request in domain types: match, one limiter call, statuses |
//! | [`grpc`] | the tonic service: protobuf <-> domain, the one error -> `Status` mapping |
//! | [`app`] | serving: listeners, tasks, shutdown |

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod engine;
pub mod grpc;
pub mod limiter;
pub mod proto;
pub mod rules;
pub mod signal;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
