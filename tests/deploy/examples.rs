//! The rules examples in `deploy/examples/`: each passes `sluice check`, they load together,
//! and the real `sluice` serving them answers as their comments say (through `POST /json`).

use std::path::{Path, PathBuf};

use crate::support::{sluice_check, start_sluice};
use sluice::testing::process::{SluiceProcess, loopback};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples")
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
        assert_eq!(
            sluice_check(file).trim(),
            "ok: 1 domain(s)",
            "{}",
            file.display()
        );
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
    assert_eq!(sluice_check(&examples()).trim(), "ok: 4 domain(s)");
}

/// One descriptor of `(key, value)` entries with an optional cost, through `POST /json`:
/// (HTTP status, the response JSON).
async fn ask(
    sluice: &SluiceProcess,
    domain: &str,
    entries: &[(&str, &str)],
    hits: Option<u64>,
) -> (u16, serde_json::Value) {
    ask_all(sluice, domain, &[entries], hits).await
}

/// Several descriptors in one request, each with the optional cost.
async fn ask_all(
    sluice: &SluiceProcess,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits: Option<u64>,
) -> (u16, serde_json::Value) {
    let descriptors: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<serde_json::Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            let mut descriptor = serde_json::json!({ "entries": entries });
            if let Some(hits) = hits {
                descriptor["hits_addend"] = serde_json::json!(hits);
            }
            descriptor
        })
        .collect();
    let body = serde_json::json!({"domain": domain, "descriptors": descriptors});
    let answer =
        sluice::testing::http::post(loopback(sluice.admin_port), "/json", &body.to_string()).await;
    let json = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", answer.body));
    (answer.status, json)
}

fn remaining(json: &serde_json::Value) -> u64 {
    json["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
}

/// The first status's reset, in whole seconds (proto3 JSON writes `"300s"`).
fn reset_secs(json: &serde_json::Value) -> u64 {
    let text = json["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap_or_else(|| panic!("a reset: {json}"));
    let secs = text.strip_suffix('s').and_then(|n| n.parse().ok());
    secs.unwrap_or_else(|| panic!("a reset in whole seconds: {text}"))
}

/// Every status's code.
fn codes(json: &serde_json::Value) -> Vec<&str> {
    let statuses = json["statuses"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    statuses
        .iter()
        .map(|s| s["code"].as_str().unwrap_or(""))
        .collect()
}

fn limit_name(json: &serde_json::Value) -> &str {
    json["statuses"][0]["currentLimit"]["name"]
        .as_str()
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_behave_as_described() {
    let sluice = start_sluice(&examples(), &[]).await;
    per_client_ip(&sluice).await;
    per_user_route(&sluice).await;
    daily_quota(&sluice).await;
    llm_tokens(&sluice).await;
}

/// The probe's address is exempt, others have 40 at once, then wait; each /24 has a ceiling.
async fn per_client_ip(sluice: &SluiceProcess) {
    let (status, exempt) = ask(sluice, "per_ip", &[("remote_address", "10.0.0.5")], None).await;
    assert_eq!((status, remaining(&exempt)), (200, u64::from(u32::MAX)));
    // Costs rather than single requests, so that a slow machine leaking a few units between
    // requests changes nothing: 40 more take 2 s to leak.
    let address = [("remote_address", "10.0.0.9")];
    assert_eq!(ask(sluice, "per_ip", &address, Some(40)).await.0, 200);
    assert_eq!(ask(sluice, "per_ip", &address, Some(40)).await.0, 429);
    // Five addresses of one network take 40 each, all the network holds; a sixth address,
    // fresh on its own, is denied by the network's limit; another network is not.
    let network = [("masked_remote_address", "10.0.1.0/24")];
    for n in 1..=6 {
        let address = format!("10.0.1.{n}");
        let both: [&[(&str, &str)]; 2] = [&[("remote_address", &address)], &network];
        let (status, json) = ask_all(sluice, "per_ip", &both, Some(40)).await;
        let expected = if n <= 5 {
            (200, vec!["OK", "OK"])
        } else {
            (429, vec!["OK", "OVER_LIMIT"])
        };
        assert_eq!((status, codes(&json)), expected, "{json}");
    }
    let other = [("masked_remote_address", "10.0.2.0/24")];
    assert_eq!(ask(sluice, "per_ip", &other, Some(40)).await.0, 200);
}

/// Exports by wildcard, each path its own funnel; search with its burst; the catch-all.
async fn per_user_route(sluice: &SluiceProcess) {
    let export = [("user", "u1"), ("route", "/exports/2024.csv")];
    let (status, json) = ask(sluice, "per_user", &export, None).await;
    assert_eq!(
        (status, limit_name(&json), remaining(&json)),
        (200, "exports", 9)
    );
    let other = [("user", "u1"), ("route", "/exports/2025.csv")];
    assert_eq!(remaining(&ask(sluice, "per_user", &other, None).await.1), 9);
    // Search: a burst of 10 at once (more than the 5 per second), then it waits (1 s for 5).
    let search = [("user", "u1"), ("route", "/search")];
    let (status, json) = ask(sluice, "per_user", &search, Some(10)).await;
    assert_eq!((status, limit_name(&json)), (200, "search"), "{json}");
    let (status, json) = ask(sluice, "per_user", &search, Some(5)).await;
    assert_eq!((status, limit_name(&json)), (429, "search"), "{json}");
    // Any other route: 600 per 5 minutes, so 600 at once take 300 s to drain, per route.
    let orders = [("user", "u1"), ("route", "/orders")];
    let (status, json) = ask(sluice, "per_user", &orders, Some(600)).await;
    assert_eq!(
        (status, remaining(&json), reset_secs(&json)),
        (200, 0, 300),
        "{json}"
    );
    assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 600);
    assert_eq!(ask(sluice, "per_user", &orders, Some(1)).await.0, 429);
    let order = [("user", "u1"), ("route", "/orders/7")];
    assert_eq!(
        remaining(&ask(sluice, "per_user", &order, None).await.1),
        599
    );
}

/// Both limits must admit, a denied request consumes neither, and the partner key has more.
async fn daily_quota(sluice: &SluiceProcess) {
    // The per-second limit (burst 20) has least left and denies 20 more at once (they take
    // 2 s to leak); a check only (cost 0) is not over, nothing is in debt.
    let k1 = [("api_key", "k1")];
    assert_eq!(ask(sluice, "quota", &k1, Some(20)).await.0, 200);
    let (status, json) = ask(sluice, "quota", &k1, Some(20)).await;
    assert_eq!((status, limit_name(&json)), (429, "per_second"), "{json}");
    let (status, json) = ask(sluice, "quota", &k1, Some(0)).await;
    assert_eq!(status, 200, "a check only is not over: {json}");
    // The denied 20 did not consume per_day. A descriptor reports the denying limit that
    // waits longest, so per_day shows up only when it denies too: with 20 taken, a cost of
    // 9,980 fits per_day exactly (per_second alone denies it), 9,981 does not.
    let (status, json) = ask(sluice, "quota", &k1, Some(9_980)).await;
    assert_eq!((status, limit_name(&json)), (429, "per_second"), "{json}");
    let (status, json) = ask(sluice, "quota", &k1, Some(9_981)).await;
    assert_eq!((status, limit_name(&json)), (429, "per_day"), "{json}");
    // The partner key has its own, bigger limits: 100 at once, where others get 20.
    let partner = [("api_key", "partner-7f3a")];
    let (status, json) = ask(sluice, "quota", &partner, Some(100)).await;
    assert_eq!(
        (status, limit_name(&json)),
        (200, "partner_per_second"),
        "{json}"
    );
    assert_eq!(
        ask(sluice, "quota", &[("api_key", "k3")], Some(100))
            .await
            .0,
        429
    );
}

/// Check (0), report 150k tokens (over the 100k per minute, charged anyway), and the next
/// check is denied: the user is in debt.
async fn llm_tokens(sluice: &SluiceProcess) {
    let llm = [("user", "alice"), ("model", "large")];
    assert_eq!(ask(sluice, "llm", &llm, Some(0)).await.0, 200);
    let (status, json) = ask(sluice, "llm", &llm, Some(150_000)).await;
    assert_eq!(status, 429, "{json}");
    let (status, json) = ask(sluice, "llm", &llm, Some(0)).await;
    assert_eq!(status, 429, "in debt, a check is over: {json}");
    assert_eq!(limit_name(&json), "large_tokens_per_minute");
    // Another user is not affected.
    let bob = [("user", "bob"), ("model", "large")];
    assert_eq!(ask(sluice, "llm", &bob, Some(0)).await.0, 200);
}
