//! The arrows inside the server crate, checked like the core's (`core/src/layers.rs`, whose
//! check this includes). Read a row as "this module may name these": the services sit over
//! `wire` and `transport`, operations (`metrics`, `admin`, `compat`) over the services'
//! observer traits and `reload`, and `app` (the composition root) over everything. The core's
//! modules (`config`, `rules`, `limiter`, `engine`) are below every row and left out; the
//! `testing` helpers are above every row.

#[path = "../core/src/layers/check.rs"]
mod check;

use std::path::Path;

use check::{Table, wrong_arrows};

const ALLOWED: &Table = &[
    ("proto", &[]),
    ("runtime", &[]),
    ("signal", &[]),
    ("watcher", &[]),
    ("telemetry", &[]),
    ("health", &[]),
    ("memcache_srv", &[]),
    ("reload", &["watcher"]),
    ("tls", &["reload", "watcher"]),
    ("transport", &["tls"]),
    ("wire", &["proto"]),
    ("grpc", &["wire", "transport", "telemetry", "proto"]),
    ("kuadrant", &["grpc", "wire", "transport", "proto"]),
    ("throttle", &["transport", "telemetry", "proto"]),
    ("rlqs", &["proto"]),
    ("xds", &["health", "reload", "proto"]),
    ("metrics", &["reload", "rlqs", "throttle"]),
    ("admin", &["health", "metrics", "reload", "wire"]),
    ("compat", &["metrics", "reload", "testing"]),
    (
        "bench",
        &["wire", "transport", "runtime", "signal", "proto"],
    ),
    (
        "app",
        &[
            "admin",
            "compat",
            "grpc",
            "health",
            "kuadrant",
            "memcache_srv",
            "metrics",
            "proto",
            "reload",
            "rlqs",
            "throttle",
            "tls",
            "transport",
            "xds",
            "wire",
        ],
    ),
];

#[test]
fn every_module_names_only_the_modules_below_it() {
    let wrong = wrong_arrows(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), ALLOWED);
    assert!(
        wrong.is_empty(),
        "arrows against the layering:\n{}",
        wrong.join("\n")
    );
}
