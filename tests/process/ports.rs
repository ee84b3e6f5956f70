//! No test picks a port by itself: every server in the tests binds port 0 and reports the
//! address it got (sluice's log, Envoy's admin address file and `/listeners`, a listener's
//! `local_addr`), and a child that cannot (redis-server, valkey-server, sentinels, Cluster
//! buses, memcached) is given a port the kernel handed out and that stays held for it
//! (`sluice::testing::process::HeldPort`). This reads the test sources (tests/ and
//! src/testing/) for the ways a port could be picked otherwise.

use std::path::{Path, PathBuf};

use sluice::testing::process::{HeldPort, loopback};
use sluice::testing::redis::RedisServer;

/// What picking a port by hand looks like in a source: the former picker of free ports, the
/// kernel's ephemeral range (read to choose outside it), and the usual crates and helper
/// names for it. Each is written here in two halves, so that this file does not name them.
const PICKERS: &[(&str, &str)] = &[
    ("free", "_port("),
    ("ip_local_", "port_range"),
    ("port", "picker"),
    ("pick_", "port("),
    ("unused_", "port("),
    ("available_", "port("),
    ("random_", "port("),
    ("find_", "port("),
];

/// The Rust sources under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_test_source_picks_a_port_other_than_from_the_kernel() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("src/testing.rs")];
    sources(&root.join("src/testing"), &mut files);
    sources(&root.join("tests"), &mut files);
    assert!(files.len() > 50, "the test sources: {files:?}");
    let pickers: Vec<String> = PICKERS.iter().map(|(a, b)| format!("{a}{b}")).collect();
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            for picker in &pickers {
                if line.contains(picker.as_str()) {
                    let at = file.strip_prefix(root).unwrap_or(file).display();
                    found.push(format!("{at}:{}: {picker}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "ports picked other than from the kernel (bind port 0 and read the address back, or \
         hold one with sluice::testing::process::HeldPort):\n{}",
        found.join("\n")
    );
}

/// What the tests rely on a [`HeldPort`] for: while held, a connection to it is refused
/// (a server that is down), no bind to port 0 is given it, and a bind to it without
/// `SO_REUSEADDR` fails; yet a server that sets `SO_REUSEADDR` (redis-server here) starts on
/// it, and starts again on it after being killed.
#[test]
fn a_held_port_is_refused_given_to_no_one_else_and_free_for_its_server() {
    use std::net::TcpStream;
    let held = HeldPort::new();
    assert!(TcpStream::connect(held.addr()).is_err(), "nothing listens");
    for _ in 0..2_000 {
        let other = std::net::TcpListener::bind(loopback(0)).expect("bind port 0");
        let got = other.local_addr().expect("its address").port();
        assert_ne!(got, held.port(), "the kernel gave a held port away");
    }
    let plain = tokio::net::TcpSocket::new_v4().expect("a socket");
    let taken = plain.bind(held.addr()).expect_err("a held port is taken");
    assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse, "{taken}");

    let port = held.port();
    let mut redis = RedisServer::start_on(held);
    assert_eq!(redis.port, port);
    assert_eq!(redis.cmd::<String>(&["PING"]), "PONG");
    redis.kill();
    assert!(TcpStream::connect(loopback(port)).is_err(), "down again");
    redis.restart();
    assert_eq!(redis.cmd::<String>(&["PING"]), "PONG");
}
