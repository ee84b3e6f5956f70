//! The real `sluice` binary as an operator runs it: the CLI (`check`, `serve`, exit codes,
//! signals), chaos under load (SIGHUP reloads, a Redis restarted under it), `sluice bench`,
//! grpcurl against the server's reflection, and the README's settings table against the
//! settings types. (The ordered drain, whose tests bound its timings, is in tests/serial/.)

mod bench_cli;
mod chaos;
mod check_config;
mod cli;
mod grpcurl;
mod readme;
mod throttle;
