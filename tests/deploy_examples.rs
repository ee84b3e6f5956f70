//! The rules examples in `deploy/examples/`: each passes `sluice check`, they load together,
//! and the real `sluice` serving them answers as their comments say (through `POST /json`).

#[allow(dead_code)]
#[path = "common/http.rs"]
mod admin_http;
#[path = "support/http_client.rs"]
mod http_client;
#[path = "support/stack.rs"]
mod stack;

use std::path::{Path, PathBuf};
use std::process::Command;

use stack::{Sluice, loopback};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples")
}

fn check(path: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--rules"])
        .arg(path)
        .output()
        .expect("run sluice check");
    assert!(
        out.status.success(),
        "sluice check {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn every_example_passes_sluice_check_alone_and_together() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples())
        .expect("deploy/examples")
        .map(|e| e.expect("an entry").path())
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "daily-quota.yaml",
            "llm-tokens.yaml",
            "per-client-ip.yaml",
            "per-user-route.yaml"
        ]
    );
    for file in &files {
        assert_eq!(check(file).trim(), "ok: 1 domain(s)", "{}", file.display());
        // Each example says which Envoy actions produce its descriptors.
        let text = std::fs::read_to_string(file).expect("read");
        let domain = text
            .lines()
            .find_map(|l| l.strip_prefix("domain: "))
            .expect("a domain");
        assert!(
            text.contains(&format!("domain \"{domain}\"")),
            "{}",
            file.display()
        );
    }
    assert_eq!(check(&examples()).trim(), "ok: 4 domain(s)");
}

/// One descriptor of `(key, value)` entries with an optional cost, through `POST /json`:
/// (HTTP status, the response JSON).
async fn ask(
    sluice: &Sluice,
    domain: &str,
    entries: &[(&str, &str)],
    hits: Option<u64>,
) -> (u16, serde_json::Value) {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    let mut descriptor = serde_json::json!({ "entries": entries });
    if let Some(hits) = hits {
        descriptor["hits_addend"] = serde_json::json!(hits);
    }
    let body = serde_json::json!({"domain": domain, "descriptors": [descriptor]});
    let answer = admin_http::post(loopback(sluice.admin_port), "/json", &body.to_string()).await;
    let json = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", answer.body));
    (answer.status, json)
}

fn remaining(json: &serde_json::Value) -> u64 {
    json["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

fn limit_name(json: &serde_json::Value) -> &str {
    json["statuses"][0]["currentLimit"]["name"]
        .as_str()
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_behave_as_described() {
    let sluice = Sluice::start(&examples(), &[]).await;

    // Per client IP: the probe's address is exempt, others have 40 at once, then wait.
    let (status, exempt) = ask(&sluice, "per_ip", &[("remote_address", "10.0.0.5")], None).await;
    assert_eq!((status, remaining(&exempt)), (200, u64::from(u32::MAX)));
    for _ in 0..40 {
        let (status, _) = ask(&sluice, "per_ip", &[("remote_address", "10.0.0.9")], None).await;
        assert_eq!(status, 200);
    }
    let (status, _) = ask(&sluice, "per_ip", &[("remote_address", "10.0.0.9")], None).await;
    assert_eq!(status, 429);

    // Per user and route: exports by wildcard, each path its own funnel.
    let export = [("user", "u1"), ("route", "/exports/2024.csv")];
    let (status, json) = ask(&sluice, "per_user", &export, None).await;
    assert_eq!(
        (status, limit_name(&json), remaining(&json)),
        (200, "exports", 9)
    );
    let other = [("user", "u1"), ("route", "/exports/2025.csv")];
    assert_eq!(
        remaining(&ask(&sluice, "per_user", &other, None).await.1),
        9
    );

    // Daily quota beside per second: the per-second limit (burst 20) has least left and
    // denies the 21st at once; a check only (cost 0) is not over, nothing is in debt.
    for _ in 0..20 {
        assert_eq!(
            ask(&sluice, "quota", &[("api_key", "k1")], None).await.0,
            200
        );
    }
    let (status, json) = ask(&sluice, "quota", &[("api_key", "k1")], None).await;
    assert_eq!((status, limit_name(&json)), (429, "per_second"));
    let (status, json) = ask(&sluice, "quota", &[("api_key", "k1")], Some(0)).await;
    assert_eq!(status, 200, "a check only is not over: {json}");

    // LLM tokens: check (0), report 150k tokens (over the 100k per minute, charged anyway),
    // and the next check is denied: the user is in debt.
    let llm = [("user", "alice"), ("model", "large")];
    assert_eq!(ask(&sluice, "llm", &llm, Some(0)).await.0, 200);
    let (status, json) = ask(&sluice, "llm", &llm, Some(150_000)).await;
    assert_eq!(status, 429, "{json}");
    let (status, json) = ask(&sluice, "llm", &llm, Some(0)).await;
    assert_eq!(status, 429, "in debt, a check is over: {json}");
    assert_eq!(limit_name(&json), "large_tokens_per_minute");
    // Another user is not affected.
    assert_eq!(
        ask(
            &sluice,
            "llm",
            &[("user", "bob"), ("model", "large")],
            Some(0)
        )
        .await
        .0,
        200
    );
}
