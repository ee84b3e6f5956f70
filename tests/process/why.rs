//! `sluice why` through the built binary, against a real `sluice serve` with an admin token:
//! a key over its limit, a descriptor no rule takes, the JSON form, a refused token, a bad
//! argument.

use std::process::Output;

use sluice::testing::http;
use sluice::testing::process::{SluiceProcess, sluice_command};

const RULES: &str = "
domain: cli
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";
const TOKEN: &str = "why-t0ken";

fn why(admin: &str, args: &[&str]) -> Output {
    sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["why", "--admin", admin, "--domain", "cli"])
        .args(args)
        .output()
        .expect("run sluice why")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_why_explains_a_denied_key_and_charges_nothing() {
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(rules.path(), RULES).expect("write rules");
    let env = [("SLUICE_ADMIN__TOKEN", TOKEN)];
    let server = SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), rules.path(), &[], &env)
        .ready()
        .await;
    let admin = format!("http://{}", server.admin());
    let auth = format!("Bearer {TOKEN}");
    let body = r#"{"domain":"cli","descriptors":[{"entries":[{"key":"user","value":"al"}]}]}"#;
    let headers = [("authorization", auth.as_str())];
    for expected in [200, 200, 429] {
        let answer = http::request(server.admin(), "POST", "/json", &headers, body).await;
        assert_eq!(answer.status, expected, "{}", answer.body);
    }

    let over = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || why(&admin, &["--token", TOKEN, "user=al"])
    })
    .await
    .expect("ran");
    assert!(over.status.success(), "{}", stderr(&over));
    let text = stdout(&over);
    for needle in [
        "domain cli: OVER_LIMIT now (memory backend; nothing was charged)",
        "descriptor 1: user=al (cost 1)",
        "  rule cli.user (",
        "denied on this replica: 1 in the last minute, 1 in the last hour",
        "limit funnel 2/hour x1 (burst 2, charge admitted): remaining 0",
        "this request: denies, retry in",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }

    // No rule: the reason. The token from the environment, as `serve` takes it.
    let none = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || {
            sluice_command(env!("CARGO_BIN_EXE_sluice"))
                .args(["why", "--admin", &admin, "--domain", "cli", "path=/x"])
                .env("SLUICE_ADMIN__TOKEN", TOKEN)
                .output()
                .expect("run sluice why")
        }
    })
    .await
    .expect("ran");
    assert!(none.status.success(), "{}", stderr(&none));
    assert!(
        stdout(&none).contains("no rule (no_key): no rule at level 0 has the key \"path\""),
        "{}",
        stdout(&none)
    );

    // The JSON form, as /why answers it.
    let json = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || why(&admin, &["--token", TOKEN, "--json", "user=al"])
    })
    .await
    .expect("ran");
    let answer: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(
        answer["descriptors"][0]["limits"][0]["state"]["remaining"],
        0
    );

    // Refused: no token, a wrong one; a bad argument.
    for args in [&["user=al"][..], &["--token", "wrong", "user=al"]] {
        let out = tokio::task::spawn_blocking({
            let admin = admin.clone();
            move || why(&admin, args)
        })
        .await
        .expect("ran");
        assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
        assert!(
            stderr(&out).starts_with("sluice why: 401"),
            "{}",
            stderr(&out)
        );
    }
    let bad = why(&admin, &["--token", TOKEN, "useral"]);
    assert_eq!(bad.status.code(), Some(64));
    assert!(
        stderr(&bad).contains("\"useral\" is not key=value"),
        "{}",
        stderr(&bad)
    );

    // Nothing of this was charged: the key is denied exactly as before, no more.
    let answer = http::request(server.admin(), "POST", "/why", &headers, body).await;
    let after: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(after["descriptors"][0]["denied"]["last_minute"]["cost"], 1);
}

/// Over Redis with leases on: `sluice why` says how many units of a busy key are out on
/// lease, and how many this replica holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_why_shows_a_leased_keys_units_out_on_lease() {
    let redis = sluice::testing::redis::RedisServer::start();
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    let leased = "
domain: cli
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 100000, algorithm: fixed_window}
";
    std::fs::write(rules.path(), leased).expect("write rules");
    let env = [
        ("SLUICE_REDIS__LEASES", "on"),
        ("SLUICE_REDIS__LEASE_MIN_RATE", "1"),
        ("SLUICE_REDIS__LEASE_VALIDITY_MS", "1000"),
        ("SLUICE_REDIS__LEASE_HORIZON_MS", "1000"),
        ("SLUICE_REDIS__TIMEOUT_MS", "5000"),
    ];
    let server = SluiceProcess::over_redis(
        env!("CARGO_BIN_EXE_sluice"),
        rules.path(),
        &redis.url(),
        &env,
    )
    .ready()
    .await;
    let body = r#"{"domain":"cli","descriptors":[{"entries":[{"key":"hot","value":"k"}]}]}"#;
    for _ in 0..100 {
        let answer = http::request(server.admin(), "POST", "/json", &[], body).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let admin = format!("http://{}", server.admin());
    let out = tokio::task::spawn_blocking(move || why(&admin, &["hot=k"]))
        .await
        .expect("ran");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "out on lease by 1 replica record(s) (counted as spent above); this replica holds"
        ),
        "{text}"
    );
}
