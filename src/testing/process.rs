//! Processes for tests: the real `sluice` binary as a replica on loopback ports it asked the
//! kernel for, any other child process killed when dropped, ports from the kernel held for
//! children that cannot bind port 0 ([`HeldPort`]), and `/proc` readings (Linux).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A loopback port the kernel handed out (bind `127.0.0.1:0`), held for a child that cannot
/// bind port 0 and report the port it got (redis-server, valkey-server, sentinels, a Cluster
/// node's bus, memcached): the socket stays bound, with `SO_REUSEADDR`, and never listens.
/// While it is held, the kernel hands the port to no one else (neither another `bind` to
/// port 0 nor an outgoing connection), a connection to it is refused (a server that is down),
/// and a child that sets `SO_REUSEADDR` itself, as those servers do, can bind and listen on
/// it: so a child started on it, or restarted on it later, does not race anyone for it. Hold
/// it as long as the child may (re)start on the port; dropping it closes the socket. A start
/// that fails to bind it all the same (`Address already in use`) is tried again on a fresh
/// one by the starters in [`super::redis`] and [`super::memcached`].
///
/// This is the only way the tests pick a port for a child: every other server binds port 0
/// and reports its address (tests/process/ports.rs keeps it so).
#[derive(Debug)]
pub struct HeldPort {
    _socket: tokio::net::TcpSocket,
    port: u16,
}

impl HeldPort {
    /// A fresh port from the kernel, held.
    pub fn new() -> HeldPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket.bind(loopback(0)).expect("bind 127.0.0.1:0");
        let port = socket.local_addr().expect("the bound address").port();
        HeldPort {
            _socket: socket,
            port,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }
}

impl Default for HeldPort {
    fn default() -> Self {
        Self::new()
    }
}

/// How many fresh ports a starter tries when a child could not bind the one it was given.
pub const PORT_ATTEMPTS: usize = 5;

/// Whether a child's output says it lost the port it was given.
pub fn lost_port(output: &str) -> bool {
    output.contains("Address already in use") || output.contains("EADDRINUSE")
}

/// Waits up to 20 s until something accepts connections on `port` of 127.0.0.1.
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(loopback(port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// This build as `limitador-server`, ready for the caller's flags, limits file and storage:
/// `binary` (the test's `env!("CARGO_BIN_EXE_sluice")`) linked into `dir` under that name, on
/// 127.0.0.1 with both ports from the kernel (`-b 127.0.0.1 -p 0 -B 127.0.0.1 -P 0`, read back
/// from its `-vv` log by [`serving`] as `gRPC` and `admin HTTP`), its environment cleared, its
/// standard output dropped and its standard error piped.
pub fn limitador_server(binary: &str, dir: &Path) -> Command {
    let link = dir.join("limitador-server");
    if !link.exists() {
        std::os::unix::fs::symlink(binary, &link).expect("link this build as limitador-server");
    }
    let mut command = Command::new(&link);
    command
        .env_clear()
        .args([
            "-b",
            "127.0.0.1",
            "-p",
            "0",
            "-B",
            "127.0.0.1",
            "-P",
            "0",
            "-vv",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Follows the log (standard error, piped, at `info` or finer) of a starting `sluice` told to
/// listen for gRPC on port 0, until it says where it serves gRPC: that address. Fails with the
/// log so far when the process exits first (a port it was given was taken, a bad setting) or
/// says nothing of it within 20 s. The rest of the log goes on to this process's standard
/// error. A port the child binds itself cannot be taken between choosing and binding it.
pub fn serving_grpc(child: &mut Child) -> SocketAddr {
    let [grpc] = serving(child, ["gRPC"]);
    grpc
}

/// The same for each of `whats` (`"gRPC"`, `"admin HTTP"`, `"the debug endpoints"`,
/// `"envoyproxy/ratelimit's metric names"`, in any order in the log): the addresses, in the
/// order of `whats`.
pub fn serving<const N: usize>(child: &mut Child, whats: [&str; N]) -> [SocketAddr; N] {
    serving_log(child, whats).0
}

/// The same, with the log: what it said so far and the lines to come, for a test that reads
/// them (until then, and once it is dropped, they go to this process's standard error).
pub fn serving_log<const N: usize>(child: &mut Child, whats: [&str; N]) -> ([SocketAddr; N], Log) {
    use std::io::BufRead as _;
    let stderr = child
        .stderr
        .take()
        .expect("the child's standard error, piped");
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Err(unsent) = lines.send(line) {
                eprintln!("{}", unsent.0);
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = Vec::new();
    let mut found: [Option<SocketAddr>; N] = [None; N];
    loop {
        if let Some(all) = found.iter().copied().collect::<Option<Vec<_>>>() {
            let addrs = std::array::from_fn(|i| all[i]);
            return (
                addrs,
                Log {
                    said: log,
                    rest: seen,
                },
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match seen.recv_timeout(left) {
            Ok(line) => {
                for (what, addr) in whats.iter().zip(found.iter_mut()) {
                    let marker = format!("serving {what}");
                    if let Some(logged) = line
                        .split_once(&marker)
                        .and_then(|(_, rest)| logged_addr(rest))
                    {
                        *addr = Some(logged);
                    }
                }
                eprintln!("{line}");
                log.push(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!(
                "sluice exited ({:?}) before serving {whats:?}; its log:\n{}",
                child.wait().ok(),
                log.join("\n")
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                "sluice did not serve {whats:?} within 20 s; its log:\n{}",
                log.join("\n")
            ),
        }
    }
}

/// The standard error of a child that [`serving_log`] followed.
pub struct Log {
    /// The lines until it served.
    said: Vec<String>,
    rest: std::sync::mpsc::Receiver<String>,
}

impl Log {
    /// Every line, until the child closes its standard error (it exited): call it once the
    /// child has been stopped.
    pub fn until_closed(self) -> String {
        let mut lines = self.said;
        lines.extend(self.rest.iter());
        lines.join("\n")
    }
}

/// Waits up to 20 s until the log file `log` of a starting `sluice` (at `info` or finer) says
/// where it serves `what` (`"gRPC"`, `"admin HTTP"`): that address. For a child told to listen
/// on port 0 (see [`serving_grpc`] for why), whose standard error goes to a file.
pub fn logged_listener(log: &Path, what: &str) -> SocketAddr {
    let marker = format!("serving {what}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text.lines().find_map(|l| {
            l.split_once(&marker)
                .and_then(|(_, rest)| logged_addr(rest))
        });
        if let Some(addr) = found {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "sluice did not serve {what} within 20 s; its log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first socket address in a log line's text (`addr=127.0.0.1:4000`, `addr=Some(...)`, colours or
/// not).
fn logged_addr(text: &str) -> Option<SocketAddr> {
    text.split(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .find_map(|word| word.parse().ok())
}

/// The `sluice` binary at `path`, with no `SLUICE_*` or `RUST_LOG` from the test's environment.
pub fn sluice_command(path: &str) -> Command {
    let mut cmd = Command::new(path);
    cmd.env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("SLUICE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `cmd` to its end, its output piped, killing it (and failing) if it has not exited
/// `within`: a `serve` that should refuse to start must not hang the test.
pub fn exit_within(cmd: &mut Command, within: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the sluice binary");
    let start = Instant::now();
    while child.try_wait().expect("the child's status").is_none() {
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {within:?}: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("the child's output")
}

/// Runs `cmd` to its end; it must succeed (else the test fails with its standard error,
/// naming `what`). Its output.
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A child process, killed if the test ends before stopping it.
pub struct Served(pub Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The log filter of a started `sluice`: warnings, and the lines that say where it serves
/// (gRPC and admin HTTP from the lifecycle; envoyproxy/ratelimit's metric names and debug
/// port from the server).
pub const LISTENERS_LOG: &str = "warn,sluice::app::lifecycle=info,sluice::app::server=info";

/// A running `sluice serve` on loopback ports it bound itself (gRPC and admin: port 0, the
/// addresses read from its log), killed when dropped.
pub struct SluiceProcess {
    pub port: u16,
    pub admin_port: u16,
    child: Option<Child>,
}

impl SluiceProcess {
    /// `<binary> serve --rules <rules>` plus `args`, with `env` (`SLUICE_*` settings) and
    /// warnings only in its log (and the lines naming its listeners, [`LISTENERS_LOG`]);
    /// returns once it serves gRPC and admin HTTP, on ports it asked the kernel for.
    pub fn start(binary: &str, rules: &Path, args: &[&str], env: &[(&str, &str)]) -> SluiceProcess {
        let any = loopback(0).to_string();
        let mut child = sluice_command(binary)
            .arg("serve")
            .arg("--rules")
            .arg(rules)
            .args(["--grpc-listen", &any])
            .args(["--admin-listen", &any])
            .args(args)
            .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
            // The suites' leases switch (`testing::redis::LEASES_SWITCH`); the test's own
            // environment, after it, may set leases itself.
            .envs(super::redis::test_leases().then_some(("SLUICE_REDIS__LEASES", "on")))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the sluice binary");
        let [grpc, admin] = serving(&mut child, ["gRPC", "admin HTTP"]);
        SluiceProcess {
            port: grpc.port(),
            admin_port: admin.port(),
            child: Some(child),
        }
    }

    /// The same over the Redis backend at `redis_url`.
    pub fn over_redis(
        binary: &str,
        rules: &Path,
        redis_url: &str,
        env: &[(&str, &str)],
    ) -> SluiceProcess {
        let args = ["--backend", "redis", "--redis-url", redis_url];
        Self::start(binary, rules, &args, env)
    }

    /// Waits up to 20 s until `/readyz` answers 200.
    pub async fn ready(self) -> SluiceProcess {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = super::http::try_get(self.admin(), "/readyz").await;
            if ready.is_some_and(|a| a.status == 200) {
                return self;
            }
            assert!(Instant::now() < deadline, "sluice did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:<port>`, for gRPC clients.
    pub fn url(&self) -> String {
        format!("http://{}", loopback(self.port))
    }

    /// The admin HTTP address.
    pub fn admin(&self) -> SocketAddr {
        loopback(self.admin_port)
    }

    /// The process id (for signals and `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running sluice").id()
    }

    /// Whether the process has exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("a sluice process not stopped");
        child.try_wait().expect("the sluice process's status")
    }

    /// Kills it (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Resident set size of process `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss(pid: u32) -> u64 {
    status_field(pid, "VmRSS:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no VmRSS for process {pid}"))
}

/// Resident set size of this process in bytes.
pub fn own_rss() -> u64 {
    rss(std::process::id())
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    status_field(pid, "State:").is_some_and(|s| !s.starts_with('Z'))
}

fn status_field(pid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_owned())
}
