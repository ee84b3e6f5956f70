//! The real `sluice` binary as an operator runs it: the CLI (`check`, `serve`, exit codes,
//! signals), the ordered drain, chaos under load (SIGHUP reloads, a Redis restarted under
//! it), `sluice bench`, grpcurl against the server's reflection, and the README's settings
//! table against the settings types.

mod bench_cli;
mod chaos;
mod cli;
mod drain;
mod grpcurl;
mod readme;
