//! `sluice.v1.Throttle` on the real binary: redis-cell's `CL.THROTTLE` semantics on a table of
//! cases (fresh key, burst spent, check-only, refund, quantity above the burst, all or
//! nothing) with the memory backend and with a real `redis-server`; the same table through
//! Python stubs that grpcio-tools generates from proto/ (plus an RLS call); invalid
//! parameters named; reflection, health and metrics list the service.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice::testing::http;
use sluice::testing::process::{SluiceProcess, run_ok};
use sluice::testing::redis::RedisServer;
use sluice_client::pb::sluice::v1::throttle_client::ThrottleClient;
use sluice_client::pb::sluice::v1::{ThrottleKey, ThrottleRequest, ThrottleResponse, throttle_key};
use tokio::time::Instant;

const RULES: &str = "domain: py\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

/// The sluice binary serving [`RULES`] on ports from the kernel (the rules file kept while it runs),
/// killed on drop.
struct Sluice {
    process: SluiceProcess,
    _dir: tempfile::TempDir,
}

impl Sluice {
    fn start(backend_args: &[&str]) -> Sluice {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, RULES).expect("write the rules");
        let process = SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), &rules, backend_args, &[]);
        Sluice { process, _dir: dir }
    }

    async fn client(&self) -> ThrottleClient<tonic::transport::Channel> {
        ThrottleClient::connect(self.process.url())
            .await
            .expect("connect to sluice")
    }
}

/// One step of the table: a call on `key` (CL.THROTTLE key 15 30 60 quantity: a limit of 16,
/// one unit every 2 s) and redis-cell's answer, times in milliseconds.
struct Step {
    key: &'static str,
    quantity: i64,
    refund: bool,
    /// limited, limit, remaining, retry_after_ms (-1: allowed or never), reset_after_ms.
    expect: (bool, u64, u64, i64, u64),
}

const fn step(key: &'static str, quantity: i64, expect: (bool, u64, u64, i64, u64)) -> Step {
    Step {
        key,
        quantity,
        refund: false,
        expect,
    }
}

/// redis-cell's documented behaviour, step by step (each key starts fresh):
/// `CL.THROTTLE k 15 30 60 q` answers `[limited, 16, remaining, retry_after s, reset_after s]`.
const TABLE: &[Step] = &[
    // A fresh key: 16 at once, each unit takes 2 s to leak out.
    step("fresh", 1, (false, 16, 15, -1, 2_000)),
    // Check-only on a fresh key: full, nothing taken.
    step("check", 0, (false, 16, 16, -1, 0)),
    // Burst spent: all 16, then one more waits one interval.
    step("spent", 16, (false, 16, 0, -1, 32_000)),
    step("spent", 1, (true, 16, 0, 2_000, 32_000)),
    // Check-only on a spent key: allowed, nothing left.
    step("spent", 0, (false, 16, 0, -1, 32_000)),
    // A refund gives 4 units back (negative quantity)...
    step("spent", -4, (false, 16, 4, -1, 24_000)),
    // ... and the refund flag does the same.
    Step {
        key: "spent",
        quantity: 2,
        refund: true,
        expect: (false, 16, 6, -1, 20_000),
    },
    // More than remains: limited, retry when enough has leaked (2 more units: 4 s).
    step("spent", 8, (true, 16, 6, 4_000, 20_000)),
    // More than the burst: limited, and waiting never helps (-1); the key is untouched.
    step("above", 17, (true, 16, 16, -1, 0)),
    step("above", 16, (false, 16, 0, -1, 32_000)),
];

fn key_request(key: &str, quantity: i64, refund: bool) -> ThrottleKey {
    ThrottleKey {
        id: Some(throttle_key::Id::Key(key.to_owned())),
        max_burst: 15,
        count: 30,
        period_ms: 60_000,
        quantity: Some(quantity),
        refund,
        algorithm: 0,
    }
}

fn numbers(r: &ThrottleResponse, i: usize) -> (bool, u64, u64, i64, u64) {
    let k = &r.results[i];
    (
        k.limited,
        k.limit,
        k.remaining,
        k.retry_after_ms,
        k.reset_after_ms,
    )
}

/// Times are measured in real time: an answer's times may be short of the table's by the
/// milliseconds that passed since the key's first call (never longer).
fn assert_matches(
    what: &str,
    got: (bool, u64, u64, i64, u64),
    want: (bool, u64, u64, i64, u64),
    slack_ms: u64,
) {
    assert_eq!(
        (got.0, got.1, got.2),
        (want.0, want.1, want.2),
        "{what}: {got:?} vs {want:?}"
    );
    let close = |g: u64, w: u64| g <= w && g + slack_ms + 1 >= w;
    let retry_ok = if want.3 < 0 {
        got.3 == want.3
    } else {
        got.3 >= 0 && close(got.3 as u64, want.3 as u64)
    };
    assert!(
        retry_ok && close(got.4, want.4),
        "{what}: {got:?} vs {want:?} (slack {slack_ms} ms)"
    );
}

/// Runs the table with keys under `prefix`.
async fn run_table(sluice: &Sluice, prefix: &str) {
    let mut client = sluice.client().await;
    let mut first_call = std::collections::HashMap::new();
    for (i, s) in TABLE.iter().enumerate() {
        let key = format!("{prefix}{}", s.key);
        let started = *first_call.entry(key.clone()).or_insert_with(Instant::now);
        let request = ThrottleRequest {
            keys: vec![key_request(&key, s.quantity, s.refund)],
            name: "table".to_owned(),
        };
        let answer = client
            .throttle(request)
            .await
            .expect("an answer")
            .into_inner();
        let slack = started.elapsed().as_millis() as u64;
        let call = (answer.limited, 16, 0, answer.retry_after_ms, 0);
        assert_matches(
            &format!("step {i}: the call"),
            call,
            (s.expect.0, 16, 0, s.expect.3, 0),
            slack,
        );
        assert_matches(
            &format!("step {i} ({key})"),
            numbers(&answer, 0),
            s.expect,
            slack,
        );
    }
}

/// Several keys: one limited key denies the call, and nothing is taken from the others.
async fn all_or_nothing(sluice: &Sluice, prefix: &str) {
    let mut client = sluice.client().await;
    let (free, full) = (format!("{prefix}free"), format!("{prefix}full"));
    let spend = ThrottleRequest {
        keys: vec![key_request(&full, 16, false)],
        name: String::new(),
    };
    assert!(
        !client
            .throttle(spend)
            .await
            .expect("answer")
            .get_ref()
            .limited
    );
    let both = ThrottleRequest {
        keys: vec![key_request(&free, 3, false), key_request(&full, 1, false)],
        name: String::new(),
    };
    let answer = client.throttle(both).await.expect("answer").into_inner();
    assert!(answer.limited);
    assert_matches(
        "free key, not taken",
        numbers(&answer, 0),
        (false, 16, 16, -1, 0),
        0,
    );
    assert!(answer.results[1].limited);
    let check = ThrottleRequest {
        keys: vec![key_request(&free, 0, false)],
        name: String::new(),
    };
    let after = client.throttle(check).await.expect("answer").into_inner();
    assert_eq!(
        after.results[0].remaining, 16,
        "nothing was taken from {free}"
    );
    // A text key and a byte key with the same bytes are one key.
    let bytes = ThrottleRequest {
        keys: vec![ThrottleKey {
            id: Some(throttle_key::Id::KeyBytes(full.clone().into_bytes())),
            ..key_request("", 0, false)
        }],
        name: String::new(),
    };
    let same = client.throttle(bytes).await.expect("answer").into_inner();
    assert_eq!(same.results[0].remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cell_semantics_on_the_memory_backend() {
    let sluice = Sluice::start(&["--backend", "memory"]);
    run_table(&sluice, "mem-").await;
    all_or_nothing(&sluice, "mem-").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cell_semantics_on_the_redis_backend() {
    let redis = RedisServer::start();
    let url = redis.url();
    let sluice = Sluice::start(&["--backend", "redis", "--redis-url", &url]);
    run_table(&sluice, "redis-").await;
    all_or_nothing(&sluice, "redis-").await;
    // The state is in Redis, under its own keyspace apart from RLS's `{domain|...}` keys.
    let keys = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "--scan",
            "--pattern",
            "*throttle:*",
        ])
        .output()
        .expect("redis-cli");
    let keys = String::from_utf8_lossy(&keys.stdout);
    assert!(
        keys.contains("throttle:{redis-spent}:funnel:60000ms"),
        "{keys}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_parameters_are_named() {
    let sluice = Sluice::start(&["--backend", "memory"]);
    let mut client = sluice.client().await;
    type Change = fn(&mut ThrottleKey);
    let cases: [(Change, &str); 5] = [
        (|k| k.count = 0, "keys[0].count must be at least 1"),
        (|k| k.period_ms = 0, "keys[0].period_ms must be at least 1"),
        (|k| k.period_ms = u64::MAX, "keys[0].period_ms: "),
        (|k| k.quantity = Some(i64::MAX), "keys[0].quantity: "),
        (|k| k.id = None, "keys[0].key: "),
    ];
    for (change, message) in cases {
        let mut key = key_request("bad", 1, false);
        change(&mut key);
        let request = ThrottleRequest {
            keys: vec![key],
            name: String::new(),
        };
        let status = client.throttle(request).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{message}");
        assert!(
            status.message().starts_with(message),
            "{}",
            status.message()
        );
    }
    let many = ThrottleRequest {
        keys: vec![key_request("k", 1, false); 65],
        name: String::new(),
    };
    let status = client.throttle(many).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("input.max_descriptors = 64"),
        "{}",
        status.message()
    );
    // Over input.max_request_bytes (1 MiB): refused unread, as RLS refuses it.
    let huge = ThrottleRequest {
        keys: vec![ThrottleKey {
            id: Some(throttle_key::Id::KeyBytes(vec![b'x'; 1024 * 1024 + 1])),
            ..key_request("", 1, false)
        }],
        name: String::new(),
    };
    let status = client.throttle(huge).await.expect_err("refused");
    assert_eq!(
        status.code(),
        tonic::Code::ResourceExhausted,
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("input.max_request_bytes"),
        "{}",
        status.message()
    );
}

/// `.venv/bin/python` with grpcio and grpcio-tools, or a failure naming the setup command.
fn python() -> String {
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    let ok = Command::new(python)
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "grpcio and grpcio-tools are missing from .venv; run: python3 -m venv .venv && \
         .venv/bin/pip install grpcio==1.85.1 grpcio-tools==1.85.1 (tests/run does it)"
    );
    python.to_owned()
}

const PYTHON_CLIENT: &str = r#"
import json, sys
import grpc
from sluice.v1 import throttle_pb2, throttle_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

channel = grpc.insecure_channel(sys.argv[1])
throttle = throttle_pb2_grpc.ThrottleStub(channel)
out = {"throttle": [], "rls": []}
for step in json.loads(sys.argv[2]):
    key = throttle_pb2.ThrottleKey(key=step["key"], max_burst=15, count=30, period_ms=60000,
                                   quantity=step["quantity"], refund=step["refund"])
    r = throttle.Throttle(throttle_pb2.ThrottleRequest(keys=[key], name="python"))
    k = r.results[0]
    out["throttle"].append([r.limited, r.retry_after_ms, k.limited, k.limit, k.remaining,
                            k.retry_after_ms, k.reset_after_ms])
limit = dict(key="py-reserve", max_burst=99, count=100, period_ms=3600000)
r = throttle.Reserve(throttle_pb2.ReserveRequest(amount=40, ttl_ms=60000, **limit))
c = throttle.Commit(throttle_pb2.CommitRequest(reservation_id=r.reservation_id, actual=25, **limit))
again = throttle.Commit(throttle_pb2.CommitRequest(reservation_id=r.reservation_id, **limit))
out["reserve"] = [r.admitted, r.remaining, c.settled, c.given_back, c.remaining, again.settled]
rls = rls_pb2_grpc.RateLimitServiceStub(channel)
entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="py")
request = rls_pb2.RateLimitRequest(domain="py",
                                   descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])
for _ in range(3):
    r = rls.ShouldRateLimit(request)
    out["rls"].append(rls_pb2.RateLimitResponse.Code.Name(r.overall_code))
print(json.dumps(out))
"#;

const PROTOS: &[&str] = &[
    "sluice/v1/throttle.proto",
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
];

/// Generates the Python stubs of the repository's protos into `out`.
fn generate_stubs(python: &str, out: &Path) {
    let proto = concat!(env!("CARGO_MANIFEST_DIR"), "/proto");
    let status = Command::new(python)
        .args(["-m", "grpc_tools.protoc", "-I", proto])
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .args(PROTOS)
        .status()
        .expect("run grpc_tools.protoc");
    assert!(status.success(), "grpc_tools.protoc failed");
    // Regular packages, so that no installed `envoy` package shadows the generated one.
    mark_packages(out);
}

fn mark_packages(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read the stubs").flatten() {
        if entry.path().is_dir() {
            std::fs::write(entry.path().join("__init__.py"), "").expect("write __init__.py");
            mark_packages(&entry.path());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stubs_generated_from_the_protos_get_the_same_answers() {
    let python = python();
    let stubs = tempfile::tempdir().expect("a temporary directory");
    generate_stubs(&python, stubs.path());
    let script = stubs.path().join("client.py");
    std::fs::write(&script, PYTHON_CLIENT).expect("write the script");
    let sluice = Sluice::start(&["--backend", "memory"]);
    let steps: Vec<serde_json::Value> = TABLE
        .iter()
        .map(|s| serde_json::json!({"key": format!("py-{}", s.key), "quantity": s.quantity, "refund": s.refund}))
        .collect();
    let started = Instant::now();
    let output = Command::new(&python)
        .arg(&script)
        .arg(format!("127.0.0.1:{}", sluice.process.port))
        .arg(serde_json::Value::from(steps).to_string())
        .env("PYTHONPATH", stubs.path())
        .output()
        .expect("run the Python client");
    let slack = started.elapsed().as_millis() as u64;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let rows = out["throttle"].as_array().expect("throttle answers");
    assert_eq!(rows.len(), TABLE.len());
    for (i, (row, s)) in rows.iter().zip(TABLE).enumerate() {
        let n = |j: usize| row[j].as_i64().unwrap_or_else(|| panic!("row {i}: {row}"));
        let b = |j: usize| row[j].as_bool().unwrap_or_else(|| panic!("row {i}: {row}"));
        assert_eq!(b(0), s.expect.0, "step {i}: {row}");
        let call = (b(0), 16, 0, n(1), 0);
        assert_matches(
            &format!("python step {i}: the call"),
            call,
            (s.expect.0, 16, 0, s.expect.3, 0),
            slack,
        );
        let got = (b(2), n(3) as u64, n(4) as u64, n(5), n(6) as u64);
        assert_matches(&format!("python step {i}"), got, s.expect, slack);
    }
    assert_eq!(out["rls"], serde_json::json!(["OK", "OK", "OVER_LIMIT"]));
    // A reservation of 40 settled to 25 gives 15 back; a second commit settles nothing.
    assert_eq!(
        out["reserve"],
        serde_json::json!([true, 60, true, 15, 75, false])
    );
}

/// grpcurl (see [`crate::grpcurl::grpcurl`]) with `args`; its output.
fn grpcurl(args: &[&str]) -> String {
    let output = run_ok(
        Command::new(crate::grpcurl::grpcurl()).args(args),
        "grpcurl",
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_health_and_metrics_know_the_service() {
    let sluice = Sluice::start(&["--backend", "memory"]);
    let addr = format!("127.0.0.1:{}", sluice.process.port);
    let services = grpcurl(&["-plaintext", &addr, "list"]);
    assert!(services.contains("sluice.v1.Throttle"), "{services}");
    let methods = grpcurl(&["-plaintext", &addr, "describe", "sluice.v1.Throttle"]);
    assert!(methods.contains("rpc Throttle"), "{methods}");
    assert!(
        methods.contains("rpc Reserve") && methods.contains("rpc Commit"),
        "{methods}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let health = grpcurl(&[
            "-plaintext",
            "-d",
            r#"{"service":"sluice.v1.Throttle"}"#,
            &addr,
            "grpc.health.v1.Health/Check",
        ]);
        if health.contains("\"SERVING\"") {
            break;
        }
        assert!(Instant::now() < deadline, "{health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let call =
        r#"{"keys":[{"key":"m","max_burst":0,"count":1,"period_ms":60000}],"name":"mailer"}"#;
    let first = grpcurl(&[
        "-plaintext",
        "-d",
        call,
        &addr,
        "sluice.v1.Throttle/Throttle",
    ]);
    assert!(!first.contains("\"limited\": true"), "{first}");
    let second = grpcurl(&[
        "-plaintext",
        "-d",
        call,
        &addr,
        "sluice.v1.Throttle/Throttle",
    ]);
    assert!(second.contains("\"limited\": true"), "{second}");
    let metrics = http::get(sluice.process.admin(), "/metrics").await.body;
    assert!(
        metrics.contains(r#"sluice_throttle_requests_total{name="mailer",result="allowed"} 1"#)
            && metrics
                .contains(r#"sluice_throttle_requests_total{name="mailer",result="limited"} 1"#),
        "{metrics}"
    );
}
