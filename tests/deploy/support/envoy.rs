//! Envoy for the deploy tests: the process itself is `sluice::testing::envoy`'s; here,
//! `envoy --mode validate` and config templating.

use std::path::Path;
use std::process::Command;

pub(crate) use sluice::testing::envoy::{ADMIN, EnvoyProcess, INSTALL, binary};

/// `envoy --mode validate -c FILE`: panics with Envoy's message if the file is not valid.
pub(crate) fn validate(config: &Path) {
    let out = Command::new(binary())
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(config)
        .output()
        .unwrap_or_else(|e| panic!("cannot run envoy ({e}); install it: {INSTALL}"));
    assert!(
        out.status.success(),
        "envoy --mode validate -c {} failed:\n{}{}",
        config.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Replaces `from` by `to` in `text`, which must hold `from` exactly once.
pub(crate) fn replace_once(text: &str, from: &str, to: &str) -> String {
    let found = text.matches(from).count();
    assert_eq!(found, 1, "expected `{from}` exactly once in the template");
    text.replacen(from, to, 1)
}
