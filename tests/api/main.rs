//! The service in process, through its own interfaces: gRPC on loopback with the `envoy-types`
//! client (the request semantics of docs/semantics.md, input limits, garbage, TLS, the response
//! headers), the admin server, metrics, reload and the lifecycle; the memory backend through
//! the `Limiter` trait; the rules loader's errors; and the Rate Limit Quota Service in process
//! (`rlqs`: assignments, the quota it shares with RLS, rebalancing, malformed reports, drain,
//! reflection). (Request tracing and the RLQS bounds under stress are in tests/serial/; RLQS
//! through Envoy in tests/deploy/.) Every server here is the memory backend on a manual clock
//! (`sluice::testing::TestServer`, `sluice::testing::rlqs::Server`) or a real `sluice` child
//! process; nothing needs Redis or Envoy.

mod support;

mod admin;
mod algorithms_edge;
mod garbage;
mod input_limits;
mod lifecycle;
mod limitador_metrics;
mod limitador_reload;
mod memory_limiter;
mod metrics;
mod reload;
mod response_headers;
mod rlqs;
mod rules_validation;
mod semantics;
mod tls;
mod transport;
