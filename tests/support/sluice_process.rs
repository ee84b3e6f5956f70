//! The real `sluice` binary as a child process on a free loopback port, killed when dropped.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// A running `sluice serve`.
pub struct SluiceProcess {
    pub port: u16,
    pub admin_port: u16,
    child: Child,
}

impl SluiceProcess {
    /// `sluice serve --backend redis` on a free port with `rules` and `redis_url`, plus `env`
    /// (`SLUICE_*` settings); returns once its gRPC port accepts connections.
    pub fn start(
        binary: &str,
        rules: &Path,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> SluiceProcess {
        let port = crate::redis_support::free_port();
        let admin_port = crate::redis_support::free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(binary)
            .args(["serve", "--backend", "redis", "--redis-url", redis_url])
            .arg("--rules")
            .arg(rules)
            .args(["--grpc-listen", &listen])
            .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
            .envs(env.iter().copied())
            .env("SLUICE_LOG__LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the sluice binary");
        let process = SluiceProcess {
            port,
            admin_port,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sluice did not listen on {listen}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        process
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id (for signals and `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("the sluice process's status")
    }

    /// The admin HTTP address.
    pub fn admin(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.admin_port))
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
