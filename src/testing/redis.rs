//! Real `redis-server` processes for tests: each on a free loopback port, in its own temporary
//! directory, persistence off, killed when dropped. A missing `redis-server` FAILS the test
//! with the command that installs it; nothing is skipped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::process::free_port;
use crate::config::settings::RedisSettings;

/// How to get the programs these tests need.
pub const INSTALL: &str =
    "command -v redis-server || (apt-get update && apt-get install -y redis-server)";

/// A running `redis-server`, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// A configuration file given first (Sentinel needs one it can rewrite).
    config: Option<PathBuf>,
}

fn program(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| panic!("{name} is not installed; run: {INSTALL}"))
}

impl RedisServer {
    /// A standalone server on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A standalone server on a given port.
    pub fn start_on(port: u16) -> RedisServer {
        Self::start_port(port, &[])
    }

    /// A server on a free port with extra arguments (e.g. `--replicaof`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_port(free_port(), extra)
    }

    fn start_port(port: u16, extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            config: None,
        };
        server.spawn();
        server
    }

    /// A Sentinel on a free port watching `master` on `master_port` with `quorum`, quick to
    /// declare it down (500 ms).
    pub fn sentinel(master: &str, master_port: u16, quorum: u32) -> RedisServer {
        Self::sentinel_with(master, master_port, quorum, &[])
    }

    /// The same with `extra` arguments (e.g. a TLS port).
    pub fn sentinel_with(
        master: &str,
        master_port: u16,
        quorum: u32,
        extra: &[String],
    ) -> RedisServer {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let config = dir.path().join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\n\
             sentinel monitor {master} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {master} 500\n\
             sentinel failover-timeout {master} 3000\n"
        );
        std::fs::write(&config, text).expect("write sentinel.conf");
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra: [&["--sentinel".to_owned()], extra].concat(),
            config: Some(config),
        };
        server.spawn();
        server
    }

    /// A Cluster node on a free port (its bus on another free port), not yet in a cluster,
    /// with `extra` arguments.
    fn cluster_node(extra: &[String]) -> RedisServer {
        let bus = free_port().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend(extra.iter().map(String::as_str));
        Self::start_with(&args)
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new(program("redis-server"));
        if let Some(config) = &self.config {
            command.arg(config);
        }
        let child = command
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({e}); run: {INSTALL}"));
        self.child = Some(child);
        wait_for_ping(self.port);
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (SIGSTOP) without closing anything: it accepts connections and
    /// commands and answers none of them, as a hung Redis does, until [`Self::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT); it then runs what it was sent meanwhile.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, name: &str) {
        let child = self.child.as_ref().expect("a running redis-server");
        let status = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .expect("run kill (procps)");
        assert!(status.success(), "kill {name} redis-server");
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Limiter settings for this server: the defaults, with its URL and a time-out long
    /// enough that a loaded test machine never turns a behaviour test into a latency test
    /// (the fault tests set their own short one).
    pub fn settings(&self) -> RedisSettings {
        RedisSettings {
            url: self.url(),
            timeout_ms: 5_000,
            connect_timeout_ms: 5_000,
            ..RedisSettings::default()
        }
    }

    /// A plain connection for the test's own commands.
    fn conn(&self) -> ::redis::Connection {
        ::redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis-server")
    }

    /// Runs one command.
    pub fn cmd<T: ::redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = ::redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn()).expect("a test redis command")
    }

    /// `calls` per command from `INFO commandstats` (e.g. `"fcall"`).
    pub fn command_calls(&self) -> HashMap<String, u64> {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(':')?;
                let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    }

    pub fn calls(&self, command: &str) -> u64 {
        self.command_calls().get(command).copied().unwrap_or(0)
    }

    /// Calls of the limiter's code in any form: `fcall` (the function library), `evalsha`
    /// and `eval` (the script).
    pub fn script_calls(&self) -> u64 {
        let calls = self.command_calls();
        ["fcall", "evalsha", "eval"]
            .iter()
            .map(|c| calls.get(*c).copied().unwrap_or(0))
            .sum()
    }

    /// Resets `INFO commandstats`.
    pub fn reset_stats(&self) {
        let _: () = self.cmd(&["CONFIG", "RESETSTAT"]);
    }

    /// Starts watching every command the server runs (`MONITOR`), from now on.
    pub fn monitor(&self) -> Monitor {
        let mut conn = self.conn();
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("a read time-out");
        let _: () = ::redis::cmd("MONITOR")
            .query(&mut conn)
            .expect("MONITOR on the test redis-server");
        Monitor {
            conn,
            server: self.url(),
        }
    }
}

/// A `MONITOR` connection to a test server.
pub struct Monitor {
    conn: ::redis::Connection,
    server: String,
}

/// What a test sends to mark the end of what it watches.
const MONITOR_END: &str = "sluice-test-monitor-end";

impl Monitor {
    /// The names (lower case) of the commands clients sent since the monitor started, in
    /// order. Commands a script runs are not client commands: MONITOR marks them `[0 lua]`,
    /// and they are left out. Ends at a marker sent now, so every command sent before this
    /// call is in.
    pub fn client_commands(mut self) -> Vec<String> {
        let _: String = ::redis::Client::open(self.server.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| ::redis::cmd("ECHO").arg(MONITOR_END).query(&mut c))
            .expect("ECHO the end marker");
        let mut commands = Vec::new();
        loop {
            let line: String = self
                .conn
                .recv_response()
                .and_then(|v| Ok(::redis::from_redis_value(v)?))
                .expect("a MONITOR line within 5 s");
            // `<time> [<db> <client address, or lua>] "<command>" "<arg>" …`
            let (source, command) = line
                .split_once("] ")
                .unwrap_or_else(|| panic!("a MONITOR line: {line}"));
            if command.contains(MONITOR_END) {
                return commands;
            }
            if !source.ends_with(" lua") {
                let name = command.split('"').nth(1).unwrap_or(command);
                commands.push(name.to_ascii_lowercase());
            }
        }
    }
}

/// Waits up to 10 s for `PING` to answer on `port`.
fn wait_for_ping(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = format!("redis://127.0.0.1:{port}");
    loop {
        let pong = ::redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| ::redis::cmd("PING").query::<String>(&mut c));
        if pong.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server on port {port} did not answer PING"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits up to `within` for `ready` to hold, polling every 50 ms.
pub fn wait_until(within: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A 3-master Redis Cluster (no replicas) built with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_with(Vec::new)
    }

    /// The same, each node started with the arguments `extra` gives it (e.g. a TLS port).
    pub fn start_with(mut extra: impl FnMut() -> Vec<String>) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::cluster_node(&extra()))
            .collect();
        let mut create = Command::new(program("redis-cli"));
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(n.addr());
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); run: {INSTALL}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {out:?}"
        );
        for n in &nodes {
            wait_until(Duration::from_secs(20), "cluster_state:ok", || {
                n.cmd::<String>(&["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            });
        }
        RedisCluster { nodes }
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Calls of the limiter's code (see [`RedisServer::script_calls`]) summed over the nodes.
    pub fn script_calls(&self) -> u64 {
        self.nodes.iter().map(RedisServer::script_calls).sum()
    }
}
