//! The Redis backend over real `redis-server` processes on loopback ports (standalone,
//! Sentinel, Cluster, TLS): the request semantics and every algorithm on both backends (the
//! `scenario!` suite), the Lua script against the memory backend's decisions, round trips,
//! footprint, exactness across `sluice` replicas; the deny cache and group commit against the
//! plain Redis path (`batching`); and the admin's visibility on both backends (`/counters`,
//! `/counters/top`, the limit gauges, `admin.token`: `visibility`); the penalty box
//! (`block_for`) and calendar windows (`time_zone`) on both backends (`penalty`); the Throttle
//! API's holds with ids and its reservations on both backends (`throttle_holds`,
//! `throttle_reserve`); `algorithm: concurrency` with holds named by the request (`hold_id`)
//! on both backends (`concurrency_by_id`); limits with `scope: global`
//! shared by regions through a home Redis (`regions`). A missing `redis-server`
//! fails these tests with the command that installs it. (The fault tests, which bound answer
//! times, are in tests/serial/.)

#[macro_use]
mod support;

mod algorithms;
mod batching;
mod breakers;
mod cluster;
mod concurrency;
mod concurrency_by_id;
mod footprint;
mod late_returns;
mod leases;
mod limitador;
mod penalty;
mod regions;
mod replicas;
mod replication;
mod roundtrips;
mod script;
mod semantics;
mod sentinel;
mod sliding_log;
mod throttle_holds;
mod throttle_reserve;
mod tls;
mod visibility;
mod why;
