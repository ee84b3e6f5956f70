//! Helpers of the deployment tests: a real Envoy, YAML documents, an upstream stub, the real
//! `sluice` behind them (also as envoyproxy/ratelimit, with a management server), and
//! certificates for TLS.

use std::path::{Path, PathBuf};

use sluice::testing::process::SluiceProcess;

pub(crate) mod ads;
pub(crate) mod certs;
pub(crate) mod envoy;
pub(crate) mod ratelimit;
pub(crate) mod upstream;
pub(crate) mod yaml;

/// The real `sluice serve --rules <rules>` plus `args`, once `/readyz` answers 200.
pub(crate) async fn start_sluice(rules: &Path, args: &[&str]) -> SluiceProcess {
    SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), rules, args, &[])
        .ready()
        .await
}

/// A file of the shipped Envoy configs, `deploy/envoy/<name>`.
pub(crate) fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/envoy")
        .join(name)
}

/// `sluice check --rules <path>`, which must pass; its standard output.
pub(crate) fn sluice_check(path: &Path) -> String {
    let out = sluice::testing::process::sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--rules"])
        .arg(path)
        .output()
        .expect("run sluice check");
    assert!(
        out.status.success(),
        "sluice check {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}
