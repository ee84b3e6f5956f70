//! `sluice check --config FILE`: the real binary validates rules with the settings `serve`
//! would use (settings file, then `SLUICE_*` environment, then flags), so that rules that pass
//! `check` never fail `serve` for a setting `check` did not read.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sluice::testing::process::{Served, sluice_command};

/// Passes with the default algorithm (funnel), fails under `sliding_log`, whose quota is
/// capped at 10,000 (the limit on line 5 names no algorithm).
const BIG_QUOTA: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 20000
";

/// Valid whatever the default algorithm.
const SMALL_QUOTA: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
";

/// The binary, with no `SLUICE_*` variable or `RUST_LOG` of the test's own environment.
fn sluice() -> Command {
    sluice_command(env!("CARGO_BIN_EXE_sluice"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .expect("run the sluice binary")
}

/// stdout and stderr together (check prints errors to stderr, serve logs them there).
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write a test file");
        path
    }
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

const SLIDING_LOG_SETTINGS: &str = "[limits]\ndefault_algorithm = \"sliding_log\"\n";

#[test]
fn check_validates_with_the_settings_file_as_serve_does() {
    let files = Files::new();
    let rules = files.write("rules.yaml", BIG_QUOTA);
    let settings = files.write("sluice.toml", SLIDING_LOG_SETTINGS);

    // Plain check: the default algorithm (funnel) takes the quota.
    let plain = run(sluice().args(["check", "--rules", arg(&rules)]));
    assert!(plain.status.success(), "{}", text(&plain));
    assert!(text(&plain).contains("ok: 1 domain(s)"), "{}", text(&plain));

    // With the settings file, as serve reads it: sliding_log refuses the quota.
    let with_config =
        run(sluice().args(["check", "--config", arg(&settings), "--rules", arg(&rules)]));
    assert_eq!(with_config.status.code(), Some(1), "{}", text(&with_config));
    let error = text(&with_config);
    assert!(error.contains("rules.yaml:6"), "{error}");
    assert!(error.contains("limits.default_algorithm"), "{error}");
    assert!(error.contains("1 error(s)"), "{error}");

    // serve with the same settings refuses the same rules, before binding any port.
    let serve = run(sluice().args(["serve", "--config", arg(&settings), "--rules", arg(&rules)]));
    assert_eq!(serve.status.code(), Some(64), "{}", text(&serve));
    assert!(text(&serve).contains("rules.yaml:6"), "{}", text(&serve));
    assert!(
        text(&serve).contains("limits.default_algorithm"),
        "{}",
        text(&serve)
    );
}

#[test]
fn check_reads_the_sluice_environment_too() {
    let files = Files::new();
    let rules = files.write("rules.yaml", BIG_QUOTA);
    let out = run(sluice()
        .env("SLUICE_LIMITS__DEFAULT_ALGORITHM", "sliding_log")
        .args(["check", "--rules", arg(&rules)]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("rules.yaml:6"), "{}", text(&out));
    // The environment wins over the file, as for serve.
    let settings = files.write("sluice.toml", SLIDING_LOG_SETTINGS);
    let out = run(sluice()
        .env("SLUICE_LIMITS__DEFAULT_ALGORITHM", "funnel")
        .args(["check", "--config", arg(&settings), "--rules", arg(&rules)]));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn check_takes_the_rules_paths_of_the_settings_file_unless_given_rules() {
    let files = Files::new();
    let broken = files.write("broken.yaml", "domain: api\ndescriptors: 5\n");
    let settings = files.write(
        "sluice.toml",
        &format!("[rules]\npaths = [{:?}]\n", arg(&broken)),
    );
    let out = run(sluice().args(["check", "--config", arg(&settings)]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("broken.yaml:2"), "{}", text(&out));
    // --rules wins over rules.paths, as for serve.
    let good = files.write("good.yaml", SMALL_QUOTA);
    let out = run(sluice().args(["check", "--config", arg(&settings), "--rules", arg(&good)]));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn check_refuses_a_bad_settings_file_with_exit_64() {
    let files = Files::new();
    let rules = files.write("rules.yaml", SMALL_QUOTA);
    let settings = files.write("sluice.toml", "[limits]\ndefault_algoritm = \"funnel\"\n");
    let out = run(sluice().args(["check", "--config", arg(&settings), "--rules", arg(&rules)]));
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("default_algoritm"), "{}", text(&out));
    let missing = files.dir.path().join("missing.toml");
    let out = run(sluice().args(["check", "--config", arg(&missing), "--rules", arg(&rules)]));
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
}

#[test]
fn rules_that_check_accepts_with_the_settings_file_are_served_with_it() {
    let files = Files::new();
    let rules = files.write("rules.yaml", SMALL_QUOTA);
    let settings = files.write(
        "sluice.toml",
        &format!(
            "{SLIDING_LOG_SETTINGS}[server]\ngrpc_listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n"
        ),
    );
    let out = run(sluice().args(["check", "--config", arg(&settings), "--rules", arg(&rules)]));
    assert!(out.status.success(), "{}", text(&out));

    let child = sluice()
        .args(["serve", "--config", arg(&settings), "--rules", arg(&rules)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice serve");
    let mut serving = Served(child);
    let logs = serving
        .0
        .stderr
        .take()
        .expect("the child's stderr (its logs)");
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(logs).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut log = Vec::new();
    let started = loop {
        match seen.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains("serving gRPC") => break true,
            Ok(line) => log.push(line),
            Err(_) => break false,
        }
    };
    assert!(started, "serve did not start:\n{}", log.join("\n"));
    assert!(
        serving.0.try_wait().expect("the child's status").is_none(),
        "serve exited:\n{}",
        log.join("\n")
    );
}
