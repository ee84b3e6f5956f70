//! Drop-in for envoyproxy/ratelimit where it runs today (Envoy Gateway, Istio's sample):
//! its stats under its names ([`stats`], sent by [`statsd`], served by [`prometheus`] as
//! [`mapper`] names them), its
//! debug port ([`serve`]), and its environment variables mapped onto sluice's settings
//! ([`env`]). See docs/ratelimit-compat.md.
//!
//! Drop-in for limitador: its command line and environment ([`limitador`]). See
//! docs/limitador-compat.md.

pub mod env;
pub mod limitador;
pub mod mapper;
pub mod prometheus;
pub mod serve;
pub mod stats;
pub mod statsd;
