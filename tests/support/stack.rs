//! The other processes of an Envoy test, on loopback ports: an upstream stub and the real
//! `sluice` binary, each stopped when dropped.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::http_client;

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// An HTTP server answering 200 `upstream` to everything, stopped when dropped. A request
/// carrying `x-reply-tokens: N` gets `x-tokens-used: N` back (an LLM server reporting usage).
pub struct Upstream {
    pub port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream stub");
        let port = listener.local_addr().expect("its address").port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
            let mut answer = axum::http::HeaderMap::new();
            if let Some(tokens) = headers.get("x-reply-tokens") {
                answer.insert("x-tokens-used", tokens.clone());
            }
            (answer, "upstream")
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Upstream { port, _stop: stop }
    }
}

/// The real `sluice serve` on free loopback ports, killed when dropped.
pub struct Sluice {
    pub grpc_port: u16,
    pub admin_port: u16,
    child: Option<Child>,
}

impl Sluice {
    /// `sluice serve --rules <rules>` plus `extra` arguments (e.g. the backend); returns once
    /// `/readyz` answers 200. No `SLUICE_*` or `RUST_LOG` from the test's environment.
    pub async fn start(rules: &Path, extra: &[String]) -> Sluice {
        let (grpc_port, admin_port) = (free_port(), free_port());
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command.env_remove("RUST_LOG");
        for (k, _) in std::env::vars() {
            if k.starts_with("SLUICE_") {
                command.env_remove(k);
            }
        }
        let child = command
            .arg("serve")
            .arg("--rules")
            .arg(rules)
            .args(["--grpc-listen", &loopback(grpc_port).to_string()])
            .args(["--admin-listen", &loopback(admin_port).to_string()])
            .args(extra)
            .env("SLUICE_LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the sluice binary");
        let sluice = Sluice {
            grpc_port,
            admin_port,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http_client::try_get(loopback(admin_port), "/readyz", &[]).await;
            if ready.is_some_and(|a| a.status == 200) {
                return sluice;
            }
            assert!(Instant::now() < deadline, "sluice did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills it (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        self.stop();
    }
}
