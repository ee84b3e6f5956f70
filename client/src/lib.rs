//! The client of sluice: the Envoy RLS call against sluice's rules, and `sluice.v1.Throttle`,
//! redis-cell's `CL.THROTTLE` as gRPC, for services that carry their own limits.
//!
//! - [`Client`]: connect (plain or TLS), [`Client::throttle`], [`Client::acquire`] (wait for
//!   the retry time and try again), [`Client::should_rate_limit`], under a timeout and a
//!   [`FailPolicy`];
//! - [`Throttle`] and [`Limit`], [`RateLimit`]: typed builders of the two requests;
//! - [`Client::acquire_hold`] and [`Client::acquire_hold_within`]: a [`Permit`] on a key's
//!   slots ([`Hold`]), released on drop and extended in the background: a distributed
//!   semaphore;
//! - [`Client::reserve`]: a [`Reservation`] of an estimate on a key's limit, settled to the
//!   amount used by [`Reservation::commit`] (or given back by [`Reservation::cancel`]);
//! - [`ThrottleLayer`]: a `tower` layer for axum or tonic services, answering 429 (HTTP) or
//!   `RESOURCE_EXHAUSTED` (gRPC) with `RateLimit-*` and `Retry-After` headers.
//!
//! This crate depends on no part of the server: the stubs in [`pb`] are the `sluice-proto`
//! crate, generated from the repository's protos and shared with the server.
//!
//! ```no_run
//! use std::time::Duration;
//! use sluice_client::{Client, Limit, Throttle};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder("http://127.0.0.1:8081").connect().await?;
//! // CL.THROTTLE user123 15 30 60 1
//! let verdict = client
//!     .throttle(Throttle::key("user123", Limit::per_minute(30).max_burst(15)))
//!     .await?;
//! let key = &verdict.keys[0];
//! println!("limited {} limit {} remaining {}", verdict.limited, key.limit, key.remaining);
//! // Wait for a turn, at most 5 s.
//! client
//!     .acquire(Throttle::key("smtp", Limit::per_second(10)), Duration::from_secs(5))
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! TLS: give the CA (and for mTLS an identity) with tonic's types, re-exported here:
//!
//! ```no_run
//! use sluice_client::{Certificate, Client, ClientTlsConfig};
//!
//! # fn run(ca_pem: &[u8]) -> Result<(), sluice_client::Error> {
//! let tls = ClientTlsConfig::new()
//!     .ca_certificate(Certificate::from_pem(ca_pem))
//!     .domain_name("sluice.internal");
//! let client = Client::builder("https://sluice.internal:8081").tls(tls).connect_lazy()?;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod client;
mod error;
mod hold;
mod layer;
mod reserve;
mod rls;
mod throttle;

/// The generated wire types and clients (the `sluice-proto` crate).
pub use sluice_proto as pb;

pub use client::{Client, ClientBuilder, DEFAULT_TIMEOUT, FailPolicy};
pub use error::{AcquireError, Error};
pub use hold::{Hold, HoldError, Permit};
pub use layer::{ThrottleLayer, ThrottleService};
pub use reserve::{Reservation, Reserve, ReserveError, Settlement};
pub use rls::{DescriptorVerdict, RateLimit, RlsVerdict};
pub use throttle::{Algorithm, KeyVerdict, Limit, Source, Throttle, Verdict};
pub use tonic::transport::{Certificate, ClientTlsConfig, Identity};
