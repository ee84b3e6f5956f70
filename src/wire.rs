//! The wire: protobuf <-> the engine's domain types, and the proto3-JSON codec.
//!
//! Every front end that speaks RLS messages converts here and nowhere else: the gRPC services
//! (`grpc`, `kuadrant`), the admin port's `/json` and `/why`, and `sluice bench`'s request
//! files. Neither half knows about tonic or HTTP: errors stay [`EngineError`]s, and each front
//! end maps them to its own status ([`crate::grpc::status_of`] for gRPC).
//!
//! | module | owns |
//! |---|---|
//! | [`rls`] | `RateLimitRequest` -> [`crate::engine::Request`], [`crate::engine::Response`] -> `RateLimitResponse`, and [`decide`]: one wire request through the engine |
//! | [`json`] | the proto3 JSON mapping of `RateLimitRequest` (in) and `RateLimitResponse` (out) |
//!
//! # Why the JSON codec is written by hand
//!
//! A generator such as `pbjson-build` writes serde impls for every message from the protos,
//! and would give the same proto3 JSON (64-bit integers as strings, enums by name, durations
//! as `"<seconds>s"`). It needs the well-known types (`Struct`, `Duration`) to be its own
//! `pbjson-types` instead of `prost-types`, in the `sluice-proto` crate that the client and
//! tonic's generated services share: every user of `dynamic_metadata` and
//! `duration_until_reset`, the client's included, would change types for a codec only the
//! admin port and the bench use. The hand-written codec covers the four messages `/json`
//! takes and gives in about 150 lines, refuses unknown fields with serde's message, and its
//! tests pin the output against protobuf's JSON printer's conventions.
//!
//! [`EngineError`]: crate::engine::EngineError

pub mod json;
pub mod rls;

pub use rls::{decide, from_proto, over_limit, struct_of, to_proto};
