//! limitador's HTTP API on the real binary's admin port: status codes as limitador answers
//! them, and every JSON body validated (Python `jsonschema` from .venv) against the response
//! shapes of limitador's OpenAPI spec (tests/fixtures/limitador/http_schemas.json).

use std::process::Command;

use sluice::testing::http::{get, request};
use sluice::testing::process::{SluiceProcess, loopback};

const LIMITS: &str = r#"
- namespace: ns
  max_value: 3
  seconds: 3600
  name: per_user
  conditions: ["descriptors[0]['req.method'] == 'POST'"]
  variables: ["descriptors[0]['user_id']"]
"#;

const VALIDATE: &str = r#"
import json, sys
import jsonschema
schemas = json.load(open(sys.argv[1]))
for name, body in json.loads(sys.argv[2]):
    jsonschema.validate(json.loads(body), schemas[name])
print("ok")
"#;

fn body(namespace: &str, user: &str, delta: u64) -> String {
    serde_json::json!({
        "namespace": namespace,
        "values": {"req.method": "POST", "user_id": user},
        "delta": delta
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitadors_endpoints_answer_with_its_codes_and_shapes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).expect("write the limits");
    let sluice = SluiceProcess::start(
        env!("CARGO_BIN_EXE_sluice"),
        &limits,
        &["--backend", "memory"],
        &[],
    );
    let admin = loopback(sluice.admin_port);
    let post = |path: &'static str, b: String| async move {
        let headers = [("content-type", "application/json")];
        request(admin, "POST", path, &headers, &b).await
    };
    let mut bodies = Vec::new();
    // (path, body, status) in order: check counts nothing, check_and_report all or nothing,
    // report always.
    let steps: Vec<(&str, String, u16)> = vec![
        ("/check", body("ns", "a", 3), 200),
        ("/check", body("ns", "a", 4), 429),
        ("/check_and_report", body("ns", "a", 2), 200),
        ("/check_and_report", body("ns", "a", 2), 429),
        ("/report", body("ns", "a", 5), 200),
        ("/check", body("ns", "a", 1), 429),
        ("/check_and_report", body("ns", "b", 1), 200),
        ("/check", body("elsewhere", "a", 9), 200),
    ];
    for (i, (path, b, want)) in steps.into_iter().enumerate() {
        let answer = post(path, b).await;
        assert_eq!(answer.status, want, "step {i}: {path}: {}", answer.body);
        bodies.push((path.trim_start_matches('/').to_owned(), answer.body));
    }
    let bad = post("/check", "{\"namespace\": 5}".to_owned()).await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body.starts_with("invalid CheckAndReportInfo"),
        "{}",
        bad.body
    );
    let listed = get(admin, "/limits/ns").await;
    assert_eq!(listed.status, 200);
    let parsed: serde_json::Value = serde_json::from_str(&listed.body).expect("JSON");
    assert_eq!(parsed[0]["name"], "per_user");
    assert_eq!(parsed[0]["variables"][0], "descriptors[0]['user_id']");
    bodies.push(("limits".to_owned(), listed.body));
    let empty = get(admin, "/limits/none").await;
    assert_eq!((empty.status, empty.body.as_str()), (200, "[]"));
    let status = get(admin, "/status").await;
    assert_eq!(status.status, 200);
    bodies.push(("status".to_owned(), status.body));

    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    let schemas = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/limitador/http_schemas.json"
    );
    let out = Command::new(python)
        .args(["-c", VALIDATE, schemas])
        .arg(serde_json::to_string(&bodies).expect("JSON"))
        .output()
        .unwrap_or_else(|e| panic!("run {python} ({e}); run: .venv/bin/pip install jsonschema"));
    assert!(
        out.status.success(),
        "schema validation failed (needs .venv/bin/pip install jsonschema):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
