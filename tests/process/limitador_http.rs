//! limitador's HTTP API and metrics on the real binary started as `limitador-server` (a
//! symlink), over memory and over a real redis-server: status codes and headers as limitador
//! answers them, every JSON body (and every request body sent) validated (Python `jsonschema`
//! from .venv) against limitador's own OpenAPI spec
//! (tests/fixtures/limitador/http_server_spec.json, unmodified), `/counters/{namespace}`
//! behind the admin token, and limitador's metric names, labels and values after known
//! traffic over its HTTP API, `ShouldRateLimit` and Kuadrant's `CheckRateLimit` and `Report`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use serde_json::{Value, json};
use sluice::proto::kuadrant::service::ratelimit::v1::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rate_limit_response::Code;
use sluice::testing::grpc::{RateLimitRequest, connect_within, desc, req};
use sluice::testing::http::{self, Answer, request};
use sluice::testing::process::{Served, limitador_server, loopback, serving};
use sluice::testing::redis::RedisServer;

const LIMITS: &str = r#"
- namespace: ns
  max_value: 3
  seconds: 3600
  name: per_user
  conditions: ["descriptors[0]['req.method'] == 'POST'"]
  variables: ["descriptors[0]['user_id']"]
- namespace: anon
  max_value: 1
  seconds: 3600
  variables: ["descriptors[0]['user_id']"]
"#;

const TOKEN: &str = "s3cret-token";

/// Validates `[method, path template, status, response body, request body or null]` records
/// against the spec's operations, and checks that every operation of the spec but
/// `DELETE /limits/{namespace}` (which limitador no longer serves) was exercised.
const VALIDATE: &str = r#"
import json, sys
import jsonschema
spec = json.load(open(sys.argv[1]))
defs = spec["definitions"]
def check(schema, value, what):
    try:
        jsonschema.Draft4Validator({"definitions": defs, "allOf": [schema]}).validate(value)
    except jsonschema.ValidationError as e:
        sys.exit(f"{what}: {e.message}")
seen = set()
for method, path, status, body, sent in json.loads(sys.argv[2]):
    op = spec["paths"][path][method.lower()]
    seen.add((path, method.lower()))
    what = f"{method} {path} {status}"
    response = op["responses"].get(str(status))
    if response is None:
        sys.exit(f"{what}: status not in the spec")
    if "schema" in response:
        check(response["schema"], json.loads(body), what)
    if sent is not None:
        [param] = [p for p in op.get("parameters", []) if p["in"] == "body"]
        check(param["schema"], json.loads(sent), what + " (request)")
every = {(p, m) for p, ops in spec["paths"].items() for m in ops}
missing = every - seen - {("/limits/{namespace}", "delete")}
if missing:
    sys.exit(f"not exercised: {sorted(missing)}")
print("ok")
"#;

/// `limitador-server` (a symlink to sluice) with limitador's flags, killed when dropped.
struct Limitador {
    process: Served,
    rls: u16,
    http: u16,
}

impl Limitador {
    async fn start(dir: &Path, storage: &[&str]) -> Limitador {
        let file = dir.join("limits.yaml");
        std::fs::write(&file, LIMITS).expect("write the limits");
        let mut child = limitador_server(env!("CARGO_BIN_EXE_sluice"), dir)
            .env("SLUICE_ADMIN__TOKEN", TOKEN)
            .arg("--limit-name-in-labels")
            .arg(&file)
            .args(storage)
            .spawn()
            .expect("start limitador-server");
        let [rls, http_addr] = serving(&mut child, ["gRPC", "admin HTTP"]);
        let (rls, http_port) = (rls.port(), http_addr.port());
        let started = Limitador {
            process: Served(child),
            rls,
            http: http_port,
        };
        http::until_ok(loopback(http_port), "/healthcheck", "limitador-server").await;
        started
    }
}

fn body(namespace: &str, user: &str, delta: u64) -> Value {
    json!({
        "namespace": namespace,
        "values": {"req.method": "POST", "user_id": user},
        "delta": delta
    })
}

/// sluice's fixed windows end on multiples of their length: keep clear of an hour's end.
async fn clear_of_hour_end() {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let left = 3600 - secs % 3600;
    if left < 30 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// What the test sent and got, for the schema check.
#[derive(Default)]
struct Record(Vec<Value>);

impl Record {
    fn add(&mut self, method: &str, path: &str, answer: &Answer, sent: Option<&Value>) {
        let sent = sent.map(Value::to_string);
        self.0
            .push(json!([method, path, answer.status, answer.body, sent]));
    }

    fn validate(&self) {
        let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
        let spec = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/limitador/http_server_spec.json"
        );
        let out = Command::new(python)
            .args(["-c", VALIDATE, spec])
            .arg(Value::Array(self.0.clone()).to_string())
            .output()
            .unwrap_or_else(|e| {
                panic!("run {python} ({e}); run: .venv/bin/pip install jsonschema")
            });
        assert!(
            out.status.success(),
            "validation against limitador's spec failed (needs .venv/bin/pip install jsonschema):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The value of the sample written exactly `series` (name and labels) in a text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Every sample's name is declared by the `# TYPE` line before it (histograms: its
/// `_bucket`, `_sum`, `_count`), as the Prometheus text format 0.0.4 wants; no `# EOF`.
fn assert_text_format(text: &str) {
    let mut declared: Option<(String, String)> = None;
    for line in text.lines() {
        assert_ne!(line, "# EOF", "an OpenMetrics end in the 0.0.4 format");
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "untyped"].contains(&kind),
                "{line}"
            );
            declared = Some((name.to_owned(), kind.to_owned()));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let (family, kind) = declared
            .as_ref()
            .unwrap_or_else(|| panic!("undeclared: {line}"));
        let ok = name == family
            || (kind == "histogram"
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(family.as_str())));
        assert!(ok, "{line} under # TYPE {family} {kind}");
    }
}

/// A request built with Envoy's own types, as the Kuadrant service's message (the same wire).
fn kuadrant_request(r: RateLimitRequest) -> sluice::proto::RateLimitRequest {
    prost::Message::decode(prost::Message::encode_to_vec(&r).as_slice()).expect("the same message")
}

/// The whole scenario against a started `limitador-server`.
async fn scenario(l: &Limitador) {
    clear_of_hour_end().await;
    let http = loopback(l.http);
    let mut record = Record::default();
    let post = |path: &'static str, b: Value| async move {
        let headers = [("content-type", "application/json")];
        (
            request(http, "POST", path, &headers, &b.to_string()).await,
            b,
        )
    };
    // (path, body, status): check counts nothing, check_and_report all or nothing, report
    // always. Only check_and_report counts in limitador's metrics.
    let mut with_headers = body("ns", "b", 1);
    with_headers["response_headers"] = json!("DraftVersion03");
    let steps: Vec<(&str, Value, u16)> = vec![
        ("/check", body("ns", "a", 3), 200),
        ("/check", body("ns", "a", 4), 429),
        ("/check_and_report", body("ns", "a", 2), 200),
        ("/check_and_report", body("ns", "a", 2), 429),
        ("/report", body("ns", "a", 5), 200),
        ("/check", body("ns", "a", 1), 429),
        ("/check_and_report", with_headers, 200),
        ("/check", body("elsewhere", "a", 9), 200),
        ("/check_and_report", body("anon", "x", 1), 200),
        ("/check_and_report", body("anon", "x", 1), 429),
    ];
    for (i, (path, b, want)) in steps.into_iter().enumerate() {
        let (answer, sent) = post(path, b).await;
        assert_eq!(answer.status, want, "step {i}: {path}: {}", answer.body);
        if i == 6 {
            let limit = answer.header("x-ratelimit-limit");
            assert_eq!(limit, Some("3, 3;w=3600;name=\"per_user\""), "{answer:?}");
            assert_eq!(answer.header("x-ratelimit-remaining"), Some("2"));
            let reset: u64 = answer
                .header("x-ratelimit-reset")
                .and_then(|r| r.parse().ok())
                .expect("X-RateLimit-Reset");
            assert!((1..=3600).contains(&reset), "{reset}");
        } else {
            assert_eq!(answer.header("x-ratelimit-limit"), None, "step {i}");
        }
        record.add("POST", path, &answer, Some(&sent));
    }
    let (bad, _) = post("/check", json!({"namespace": 5})).await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body.starts_with("invalid CheckAndReportInfo"),
        "{}",
        bad.body
    );
    let mut odd = body("ns", "a", 1);
    odd["response_headers"] = json!("DRAFT_VERSION_03");
    let (bad, _) = post("/check_and_report", odd).await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("DraftVersion03"), "{}", bad.body);

    // gRPC: ShouldRateLimit (hits_addend 0 counts 1), then Kuadrant's CheckRateLimit and
    // Report.
    let mut rls = connect_within(
        &format!("http://127.0.0.1:{}", l.rls),
        Duration::from_secs(10),
    )
    .await;
    let post_of = |user: &str| desc(&[("req.method", "POST"), ("user_id", user)]);
    let answer = rls
        .should_rate_limit(req("ns", vec![post_of("c")]))
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", l.rls))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut kuadrant = RateLimitServiceClient::new(channel);
    let over = kuadrant
        .check_rate_limit(kuadrant_request(req("ns", vec![post_of("a")])))
        .await
        .expect("CheckRateLimit")
        .into_inner();
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let mut report = req("ns", vec![post_of("c")]);
    report.hits_addend = 2;
    kuadrant
        .report(kuadrant_request(report))
        .await
        .expect("Report");
    let ok = kuadrant
        .check_rate_limit(kuadrant_request(req("ns", vec![post_of("d")])))
        .await
        .expect("CheckRateLimit")
        .into_inner();
    assert_eq!(ok.overall_code, Code::Ok as i32);

    // /limits, /status, /counters.
    let listed = http::get(http, "/limits/ns").await;
    assert_eq!(listed.status, 200);
    let parsed: Value = serde_json::from_str(&listed.body).expect("JSON");
    assert_eq!(parsed[0]["name"], "per_user");
    assert_eq!(parsed[0]["variables"][0], "descriptors[0]['user_id']");
    record.add("GET", "/limits/{namespace}", &listed, None);
    let empty = http::get(http, "/limits/none").await;
    assert_eq!((empty.status, empty.body.as_str()), (200, "[]"));
    record.add("GET", "/limits/{namespace}", &empty, None);
    let status = http::get(http, "/status").await;
    assert_eq!(status.status, 200);
    record.add("GET", "/status", &status, None);
    let deleted = request(http, "DELETE", "/limits/ns", &[], "").await;
    assert_eq!(deleted.status, 405, "limits come from the file");

    let unauthorized = http::get(http, "/counters/ns").await;
    assert_eq!(unauthorized.status, 401, "{}", unauthorized.body);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let counters = http::get_with(http, "/counters/ns", &auth).await;
    assert_eq!(counters.status, 200, "{}", counters.body);
    record.add("GET", "/counters/{namespace}", &counters, None);
    let mut listed: Vec<Value> = serde_json::from_str(&counters.body).expect("JSON");
    listed.sort_by_key(|c| c["set_variables"].to_string());
    let var = "descriptors[0]['user_id']";
    let users: Vec<(&str, u64)> = listed
        .iter()
        .map(|c| {
            assert_eq!(c["limit"]["name"], "per_user", "{c}");
            assert_eq!(c["limit"]["max_value"], 3);
            assert_eq!(c["limit"]["seconds"], 3600);
            assert_eq!(c["limit"]["namespace"], "ns");
            let expires = c["expires_in_seconds"]
                .as_u64()
                .expect("expires_in_seconds");
            assert!(expires <= 3600, "{c}");
            let user = c["set_variables"][var].as_str().expect("the variable");
            (user, c["remaining"].as_u64().expect("remaining"))
        })
        .collect();
    // a: 2 + 5 reported; b: 1; c: 1 + 2 reported; d was only checked.
    assert_eq!(users, [("a", 0), ("b", 2), ("c", 0)], "{}", counters.body);
    let anon = http::get_with(http, "/counters/anon", &auth).await;
    let anon_list: Vec<Value> = serde_json::from_str(&anon.body).expect("JSON");
    assert_eq!(anon_list.len(), 1, "{}", anon.body);
    assert_eq!(anon_list[0]["set_variables"][var], "x");
    assert!(anon_list[0]["limit"].get("name").is_none(), "{}", anon.body);
    record.add("GET", "/counters/{namespace}", &anon, None);
    let none = http::get_with(http, "/counters/none", &auth).await;
    assert_eq!((none.status, none.body.as_str()), (200, "[]"));
    record.validate();

    // limitador's metrics, beside sluice's, in the 0.0.4 text format.
    let scraped = http::get(http, "/metrics").await;
    assert_eq!(scraped.status, 200);
    assert_eq!(
        scraped.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = &scraped.body;
    assert_text_format(text);
    let want = [
        ("limitador_up", 1.0),
        ("datastore_partitioned", 0.0),
        ("authorized_calls{limitador_namespace=\"ns\"}", 4.0),
        ("authorized_calls{limitador_namespace=\"anon\"}", 1.0),
        ("authorized_hits{limitador_namespace=\"ns\"}", 6.0),
        ("authorized_hits{limitador_namespace=\"anon\"}", 1.0),
        (
            "limited_calls{limitador_namespace=\"ns\",limit_name=\"per_user\"}",
            2.0,
        ),
        (
            "limited_calls{limitador_namespace=\"anon\",limit_name=\"\"}",
            1.0,
        ),
        // check_and_report a, a, b, x, x; ShouldRateLimit c; CheckRateLimit a, d; Report c.
        ("datastore_latency_count", 9.0),
        ("counter_latency_count", 9.0),
        ("datastore_latency_bucket{le=\"+Inf\"}", 9.0),
        // sluice's own, with their usual series names.
        ("sluice_requests_total{result=\"ok\"}", 1.0),
    ];
    for (series, value) in want {
        assert_eq!(sample(text, series), Some(value), "{series} in:\n{text}");
    }
    assert!(text.contains("# TYPE authorized_calls counter\n"), "{text}");
    assert!(text.contains("# TYPE limitador_up gauge\n"), "{text}");
    assert!(
        text.contains("# TYPE datastore_latency histogram\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE sluice_requests_total counter\n"),
        "{text}"
    );
    let sum = sample(text, "datastore_latency_sum").expect("datastore_latency_sum");
    assert!(sum > 0.0 && sum < 9.0, "seconds: {sum}");
    assert!(
        !text.contains("elsewhere"),
        "/check is not counted, as in limitador"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitador_server_http_api_and_metrics_over_memory() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let l = Limitador::start(dir.path(), &["memory"]).await;
    tokio::time::timeout(Duration::from_secs(60), scenario(&l))
        .await
        .expect("the scenario took over 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitador_server_http_api_and_metrics_over_redis_and_partition() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let l = Limitador::start(dir.path(), &["redis", &redis.url()]).await;
    tokio::time::timeout(Duration::from_secs(60), scenario(&l))
        .await
        .expect("the scenario took over 60 s");
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(
        keys.iter().any(|k| k.contains("{ns|limit=")),
        "the counters live in Redis: {keys:?}"
    );

    // Redis gone: calls fail (500), and datastore_partitioned says so.
    redis.kill();
    let http = loopback(l.http);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let failed = http::post(http, "/check_and_report", &body("ns", "e", 1).to_string()).await;
        let text = http::get(http, "/metrics").await.body;
        if sample(&text, "datastore_partitioned") == Some(1.0) {
            assert_eq!(failed.status, 500, "{}", failed.body);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "datastore_partitioned did not turn 1 within 20 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(l.process);
}
