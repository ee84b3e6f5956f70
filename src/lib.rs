//! sluice: a rate-limit service for Envoy's Rate Limit Service v3.
//!
//! # Layout
//!
//! Dependencies point one way, and a test (`src/layers.rs`) checks each module's row:
//! `main (CLI) -> app -> { transport, grpc, admin } -> wire -> engine -> { rules, limiter } -> config model`.
//! The decision (`config`, `rules`, `limiter`, `engine`) is the `sluice-core` crate (`core/`),
//! re-exported here under the same names, so no arrow can point back up into this crate.
//! `metrics`, `reload` and `health` are the operations side that `app` wires in; `runtime`,
//! `signal` and `telemetry` are what the binary starts with.
//!
//! | module | owns |
//! |---|---|
//! | [`proto`] | the generated wire types, from the `sluice-proto` crate (`proto/`) that the client shares |
//! | [`config`] | settings, and the rules files: parse, check, validate into a model |
//! | [`rules`] | the compiled descriptor tree per domain, matching, state keys |
//! | [`limiter`] | the algorithms as pure functions, the `Limiter` trait and its backends |
//! | [`engine`] | one request in domain types: match, one limiter call, statuses |
//! | [`wire`] | protobuf <-> domain types both ways, one wire request through the engine (`wire::decide`), the proto3-JSON codec of `/json` |
//! | [`grpc`] | the tonic service over `wire`, the one error -> `Status` mapping |
//! | [`admin`] | the admin HTTP server: health, readiness, metrics, rules dump, `/json`, `/why`, `/counters` and their reset, the live page `/ui`, the admin token; `sluice why`'s client |
//! | [`metrics`] | the Prometheus registry, fed through the engine's observer seam; the limit gauges, top denied keys and rate history the admin page shows |
//! | [`reload`] | the active rules: reloads on file changes and triggers, versions |
//! | [`rlqs`] | the Rate Limit Quota Service: usage reports in, fair-share assignments out |
//! | [`kuadrant`] | `kuadrant.service.ratelimit.v1`: limitador's `CheckRateLimit` and `Report` |
//! | [`throttle`] | `sluice.v1.Throttle`: CL.THROTTLE as gRPC, holds with ids and reservations, straight to the limiter |
//! | [`health`] | readiness: rules loaded, backend ready, not draining |
//! | [`transport`] | the gRPC port below tonic's routes: accept loop, HTTP/2 driver, `grpc-timeout`, the size limit, TLS handshakes, connection limits |
//! | [`tls`] | TLS and mTLS on the gRPC port: certificates reloaded from files |
//! | [`watcher`] | watching files for changes (the rules, the certificates), debounced |
//! | [`telemetry`] | logs to stderr, and spans over OTLP joining the caller's trace (feature `otel`) |
//! | [`app`] | serving: listeners, tasks, the ordered drain; `app::server`, the composition root: the whole service from its settings (xDS, envoyproxy/ratelimit's listeners), bound after the first rules |
//! | [`runtime`] | the tokio runtime shared by `serve` and the no-op server |
//! | [`signal`] | SIGTERM/SIGINT (shutdown) and SIGHUP (reload), for the binary |
//! | [`compat`] | drop-in for envoyproxy/ratelimit: its environment, stat names, debug port |
//! | [`xds`] | rules over xDS: the ADS client for envoyproxy/ratelimit's `RateLimitConfig` |
//! | [`bench`] | `sluice bench`: a load generator for any RLS server, and a no-op server |
//! | `testing` | test helpers (feature `test-util`): a real server on loopback ports, on a manual clock |
//!
//! The binary (`src/main.rs`) adds `cli`: the subcommands and flags (clap), turned into the
//! top layer of the settings, and the signals; everything it serves comes from `app::server`.

#![forbid(unsafe_code)]

pub use sluice_core::{config, engine, limiter, rules};

pub mod admin;
pub mod app;
pub mod bench;
pub mod compat;
pub mod grpc;
pub mod health;
pub mod kuadrant;
#[cfg(test)]
mod layers;
mod memcache_srv;
pub mod metrics;
pub mod proto;
pub mod reload;
pub mod rlqs;
pub mod runtime;
pub mod signal;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod throttle;
pub mod tls;
pub mod transport;
pub mod watcher;
pub mod wire;
pub mod xds;
