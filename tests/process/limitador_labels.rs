//! limitador's CEL metric labels on the real binary started as `limitador-server`:
//! `-L/--custom-metric-labels FILE` and `--metric-labels-default EXPR` label
//! `authorized_calls`, `authorized_hits` and `limited_calls` with values read from the
//! request's descriptors, under the cap of `metrics.max_value_label_sets`; an entry of the
//! labels file sluice cannot use is left out and logged naming file and line, a file that is
//! not a map of strings stops the start (exit 64); `--tracing-endpoint` is taken.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sluice::testing::http::{self, request};
use sluice::testing::process::{Served, limitador_server, loopback, serving, serving_log};

const LIMITS: &str = r#"
- namespace: ns
  max_value: 2
  seconds: 3600
  variables: ["descriptors[0]['user_id']"]
"#;

const LABELS: &str = "user: descriptors[0]['user_id']\nmethod: descriptors[0]['req.method']\n";

/// `limitador-server` with `args` before its limits file in `dir`.
fn command(dir: &Path, args: &[&str]) -> Command {
    let file = dir.join("limits.yaml");
    std::fs::write(&file, LIMITS).expect("write the limits");
    let mut command = limitador_server(env!("CARGO_BIN_EXE_sluice"), dir);
    command
        .env("SLUICE_METRICS__MAX_VALUE_LABEL_SETS", "2")
        .args(args)
        .arg(&file);
    command
}

async fn post(http: u16, user: &str) -> u16 {
    let body = json!({
        "namespace": "ns",
        "values": {"req.method": "POST", "user_id": user},
        "delta": 1
    });
    let body = body.to_string();
    request(loopback(http), "POST", "/check_and_report", &[], &body)
        .await
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_labels_label_limitadors_series_under_the_cap() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let labels = dir.path().join("labels.yaml");
    std::fs::write(&labels, LABELS).unwrap();
    let mut child = command(dir.path(), &[])
        .args(["-L", &labels.display().to_string()])
        .args(["--metric-labels-default", "{'app': 'shop', 'user': 'anon'}"])
        .args(["--tracing-endpoint", "rpc://127.0.0.1:1"])
        .spawn()
        .expect("start limitador-server");
    let [_, http_addr] = serving(&mut child, ["gRPC", "admin HTTP"]);
    let http_port = http_addr.port();
    let _served = Served(child);
    http::until_ok(loopback(http_port), "/healthcheck", "limitador-server").await;
    // Keep clear of the hour's end (sluice's windows are aligned on the epoch).
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if 3600 - secs % 3600 < 20 {
        tokio::time::sleep(Duration::from_secs(3600 - secs % 3600 + 1)).await;
    }
    let mut statuses = Vec::new();
    for user in ["alice", "alice", "alice", "bob", "carol"] {
        statuses.push(post(http_port, user).await);
    }
    assert_eq!(statuses, [200, 200, 429, 200, 200]);

    let text = http::get(loopback(http_port), "/metrics").await.body;
    let set = |user: &str| {
        format!("limitador_namespace=\"ns\",app=\"shop\",method=\"POST\",user=\"{user}\"")
    };
    for line in [
        format!("authorized_calls{{{}}} 2", set("alice")),
        format!("authorized_hits{{{}}} 2", set("alice")),
        format!("limited_calls{{{}}} 1", set("alice")),
        format!("authorized_calls{{{}}} 1", set("bob")),
        // A third label set is past the cap of 2: counted without its labels.
        "authorized_calls{limitador_namespace=\"__other__\"} 1".to_owned(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    assert!(!text.contains("carol"), "{text}");
}

/// As limitador: an entry of the labels file sluice cannot use is left out, said at start
/// naming the file and line, and the others label the series; a file that is not a map of
/// strings, or a default expression that does not compile, stops the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_labels_entry_is_left_out_and_a_bad_file_stops_the_start() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let labels = dir.path().join("labels.yaml");
    std::fs::write(
        &labels,
        "user: descriptors[0]['user_id']\nlimitador_namespace: x\nmethod: 'descriptors[0].'\n",
    )
    .unwrap();
    let mut child = command(dir.path(), &["-L", &labels.display().to_string()])
        .spawn()
        .expect("start limitador-server");
    let ([_, http_addr], log) = serving_log(&mut child, ["gRPC", "admin HTTP"]);
    let served = Served(child);
    http::until_ok(http_addr, "/healthcheck", "limitador-server").await;
    assert_eq!(post(http_addr.port(), "alice").await, 200);
    let text = http::get(http_addr, "/metrics").await.body;
    let line = "authorized_calls{limitador_namespace=\"ns\",user=\"alice\"} 1";
    assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    drop(served);
    let log = log.until_closed();
    for says in [
        format!(
            "{}:2: 'limitador_namespace': not a label name",
            labels.display()
        ),
        format!("{}:3: method: invalid CEL expression", labels.display()),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("ERROR") && l.contains(&says) && l.contains("left out")),
            "{says} in:\n{log}"
        );
    }

    std::fs::write(&labels, "user: [descriptors]\n").unwrap();
    let out = command(dir.path(), &["-L", &labels.display().to_string()])
        .output()
        .expect("run limitador-server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    let says = format!("{}:1: user: expected a CEL expression", labels.display());
    assert!(err.contains(&says), "{err}");
    // And a default expression that does not compile.
    let out = command(dir.path(), &["--metric-labels-default", "{'a': "])
        .output()
        .expect("run limitador-server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("metrics.limitador_labels_default: invalid CEL expression"),
        "{err}"
    );
}
