//! Helpers of the deployment tests: a real Envoy, YAML documents, an upstream stub, the real
//! `sluice` behind them, and certificates for TLS.

use std::path::Path;

use sluice::testing::process::SluiceProcess;

pub mod certs;
pub mod envoy;
pub mod upstream;
pub mod yaml;

/// The real `sluice serve --rules <rules>` plus `args`, once `/readyz` answers 200.
pub async fn start_sluice(rules: &Path, args: &[&str]) -> SluiceProcess {
    SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), rules, args, &[])
        .ready()
        .await
}
