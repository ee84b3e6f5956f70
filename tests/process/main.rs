//! The real `sluice` binary as an operator runs it: the CLI (`check`, `serve`, exit codes,
//! signals), `check --config` reading the settings `serve` would use (`check_config`), chaos
//! under load (SIGHUP reloads, a Redis restarted under it), `sluice bench`, grpcurl against
//! the server's reflection, `sluice.v1.Throttle` (redis-cell's semantics on both backends,
//! Python stubs generated from the protos, invalid parameters, reflection and metrics:
//! `throttle`), Kuadrant's `CheckRateLimit` and `Report` from Python stubs (`kuadrant`), limitador's HTTP API
//! against its own spec and its metric names, as `limitador-server` on memory and Redis
//! (`limitador_http`), `redis_cached` as leases, never over a limit (`limitador_cached`), its
//! CEL metric labels (`limitador_labels`), the admin port refusing
//! state endpoints beyond loopback without a token (`admin_access`), the memory backend's
//! state across restarts (`limiter.persist`, and limitador's `disk PATH`: `persist`),
//! docs/settings.md's table against the settings types, no test source picking a port other
//! than from the kernel (`ports`), and, started as `ratelimit`,
//! per-second limits in a Redis of their own and the Memcached backend shared by two
//! replicas, each answering as one Redis does (`backends`). (The ordered
//! drain and the Rust client's timing tests, which bound times, are in tests/serial/.)

mod admin_access;
mod backends;
mod bench_cli;
mod chaos;
mod check_config;
mod cli;
mod grpcurl;
mod kuadrant;
mod limitador_cached;
mod limitador_http;
mod limitador_labels;
mod persist;
mod ports;
mod readme;
mod throttle;
mod why;
