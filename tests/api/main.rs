//! The service in process, through its own interfaces: gRPC on loopback with the `envoy-types`
//! client (the request semantics of DESIGN.md §4, input limits, garbage, TLS, the response
//! headers), the admin server, metrics, reload and the lifecycle; the memory backend through
//! the `Limiter` trait; and the rules loader's errors. (Request tracing is in tests/serial/.) Every server here is
//! the memory backend on a manual clock (`sluice::testing::TestServer`) or a real `sluice`
//! child process; nothing needs Redis or Envoy.

mod support;

mod admin;
mod algorithms_edge;
mod garbage;
mod input_limits;
mod lifecycle;
mod memory_limiter;
mod metrics;
mod reload;
mod response_headers;
mod rlqs;
mod rules_validation;
mod semantics;
mod tls;
