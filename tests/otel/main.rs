//! With the `otel` feature: sluice's spans at OTLP collectors (fake ones, served here on
//! loopback ports), and the caller's trace joined. Run with
//! `cargo test --features otel,test-util --test otel`.
//!
//! | module | what |
//! | --- | --- |
//! | `export` | request spans over OTLP/gRPC and OTLP/HTTP, service names, the sampling ratio |
//! | `https` | an `https://` collector over both protocols: the CA file or the standard variables, a client certificate, another CA's certificate refused, bad files refused at the start; `limitador-server` and `ratelimit` too |
//! | `propagation` | `traceparent` and B3 from a direct gRPC call make sluice's span a child |
//! | `envoy` | a real Envoy 1.40's spans and sluice's under one trace id at one collector |
//!
//! A missing `redis-server` or Envoy fails its test with the command that installs it.

#![cfg(feature = "otel")]

mod envoy;
mod export;
mod https;
mod propagation;
mod support;
