//! A real `memcached` for tests, on a loopback port, killed on drop.
//!
//! memcached cannot be given port 0 and report the port it got, so the port is one the
//! kernel handed out, held for it ([`HeldPort`]) while it lives; the start is then
//! confirmed: the server on that port must answer `stats` with the pid of the process started
//! here (a process that lost the port to another exits, and one that answers with another pid
//! is not ours). Either way the start is tried again on a fresh port.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::process::HeldPort;

/// A running `memcached`.
pub struct MemcachedServer {
    pub port: u16,
    /// Where this module's own commands go: `port`, or with TLS a plain-text listener.
    plain: u16,
    child: Child,
    _held: (HeldPort, Option<HeldPort>),
}

/// How many ports a start tries before it gives up.
const ATTEMPTS: usize = 20;

impl MemcachedServer {
    /// A server on a loopback port from the kernel (no UDP), with the default memory.
    pub fn start() -> MemcachedServer {
        MemcachedServer::start_with(None)
    }

    /// A server speaking only TLS on `port` with the certificate chain and key of these PEM
    /// files (memcached's `-Z`), and plain text on another loopback port for this module's
    /// own commands (`keys`, `get`).
    pub fn start_tls(chain: &std::path::Path, key: &std::path::Path) -> MemcachedServer {
        MemcachedServer::start_with(Some((chain, key)))
    }

    fn start_with(tls: Option<(&std::path::Path, &std::path::Path)>) -> MemcachedServer {
        let program = program();
        for _ in 0..ATTEMPTS {
            let held = HeldPort::new();
            let port = held.port();
            let mut held_plain = None;
            let mut args: Vec<String> = vec!["-U".into(), "0".into(), "-u".into(), "root".into()];
            let plain = match tls {
                None => {
                    args.extend([
                        "-l".into(),
                        "127.0.0.1".into(),
                        "-p".into(),
                        port.to_string(),
                    ]);
                    port
                }
                Some((chain, key)) => {
                    let other = HeldPort::new();
                    let plain = other.port();
                    held_plain = Some(other);
                    args.extend([
                        "-Z".into(),
                        "-o".into(),
                        format!(
                            "ssl_chain_cert={},ssl_key={}",
                            chain.display(),
                            key.display()
                        ),
                        "-l".into(),
                        format!("127.0.0.1:{port}"),
                        "-l".into(),
                        format!("notls:127.0.0.1:{plain}"),
                    ]);
                    plain
                }
            };
            let child = Command::new(&program)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {} ({e}); {INSTALL}", program.display()));
            let mut server = MemcachedServer {
                port,
                plain,
                child,
                _held: (held, held_plain),
            };
            if server.confirm() {
                return server;
            }
        }
        panic!("memcached did not start on any of {ATTEMPTS} ports from the kernel");
    }

    /// Waits up to 10 s until the server on the port is this process; `false` when the
    /// process exited (the port was taken) or another one answers there.
    fn confirm(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = self.child.id().to_string();
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            if let Some(stats) = self.command("stats") {
                let ours = stats
                    .iter()
                    .any(|l| l.strip_prefix("STAT pid ") == Some(pid.as_str()));
                return ours || self.stop_and(false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("memcached on port {} never answered", self.port);
    }

    fn stop_and(&mut self, value: bool) -> bool {
        let _ = self.child.kill();
        let _ = self.child.wait();
        value
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The value of `key`, if it is there.
    pub fn get(&self, key: &str) -> Option<String> {
        let lines = self.command(&format!("get {key}"))?;
        let at = lines.iter().position(|l| l.starts_with("VALUE "))?;
        lines.get(at + 1).cloned()
    }

    /// Every key the server holds (`lru_crawler metadump all`), percent-encoded as
    /// memcached lists them.
    pub fn keys(&self) -> Vec<String> {
        let lines = self.command("lru_crawler metadump all").unwrap_or_default();
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("key="))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect()
    }

    /// Sends one command whose answer ends with `END` (`stats`, `get`, `lru_crawler
    /// metadump`) and reads it; `None` when nothing answers.
    fn command(&self, line: &str) -> Option<Vec<String>> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.plain)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        stream.write_all(format!("{line}\r\n").as_bytes()).ok()?;
        let mut reader = BufReader::new(stream);
        let mut lines = Vec::new();
        loop {
            let mut text = String::new();
            if reader.read_line(&mut text).ok()? == 0 {
                return Some(lines);
            }
            let text = text.trim_end().to_owned();
            let last = text == "END" || text.ends_with("ERROR");
            lines.push(text);
            if last {
                return Some(lines);
            }
        }
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const INSTALL: &str = "install it: apt-get install -y memcached";

/// `memcached` on the PATH, else Debian's.
fn program() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("memcached"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("/usr/bin/memcached"))
}
