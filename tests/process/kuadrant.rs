//! `kuadrant.service.ratelimit.v1.RateLimitService` on the real binary, through Python stubs
//! that grpcio-tools generates from the repository's copy of the proto: `CheckRateLimit` reads
//! without counting, `Report` always counts, and `ShouldRateLimit` sees what was reported, as
//! limitador does, over limitador's example limits file.

use std::path::Path;
use std::process::Command;

use sluice::testing::process::SluiceProcess;

/// limitador-server/examples/limits.yaml.
const LIMITS: &str = include_str!("../fixtures/limitador/limits.yaml");

const PYTHON_CLIENT: &str = r#"
import json, sys
import grpc
from kuadrant.service.ratelimit.v1 import rls_pb2_grpc as kuadrant_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

channel = grpc.insecure_channel(sys.argv[1])
kuadrant = kuadrant_grpc.RateLimitServiceStub(channel)
envoy = rls_pb2_grpc.RateLimitServiceStub(channel)
calls = {"check": kuadrant.CheckRateLimit, "report": kuadrant.Report, "should": envoy.ShouldRateLimit}
out = []
for method, domain, user, hits in json.loads(sys.argv[2]):
    entries = [ratelimit_pb2.RateLimitDescriptor.Entry(key="req.method", value="POST")]
    if user:
        entries.append(ratelimit_pb2.RateLimitDescriptor.Entry(key="user_id", value=user))
    request = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits,
        descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=entries)])
    r = calls[method](request)
    out.append(rls_pb2.RateLimitResponse.Code.Name(r.overall_code))
print(json.dumps(out))
"#;

/// (method, domain, user_id, hits_addend) and limitador's answer.
const STEPS: &[(&str, &str, &str, u32, &str)] = &[
    ("check", "test_namespace", "alice", 1, "OK"),
    ("check", "test_namespace", "alice", 9, "OK"),
    ("report", "test_namespace", "alice", 4, "OK"),
    ("check", "test_namespace", "alice", 1, "OK"),
    ("report", "test_namespace", "alice", 2, "OK"),
    ("check", "test_namespace", "alice", 1, "OVER_LIMIT"),
    ("should", "test_namespace", "alice", 1, "OVER_LIMIT"),
    ("check", "test_namespace", "bob", 1, "OK"),
    ("report", "test_namespace", "bob", 0, "OK"),
    ("should", "test_namespace", "bob", 0, "OK"),
    ("should", "test_namespace", "bob", 3, "OK"),
    ("check", "test_namespace", "bob", 1, "OVER_LIMIT"),
    ("check", "", "bob", 1, "UNKNOWN"),
    ("report", "", "bob", 1, "UNKNOWN"),
    ("check", "elsewhere", "bob", 1, "OK"),
];

const PROTOS: &[&str] = &[
    "kuadrant/service/ratelimit/v1/rls.proto",
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
];

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
    mark_packages(out);
}

/// Regular packages, so that no installed `envoy` package shadows the generated one.
fn mark_packages(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read the stubs").flatten() {
        if entry.path().is_dir() {
            std::fs::write(entry.path().join("__init__.py"), "").expect("write __init__.py");
            mark_packages(&entry.path());
        }
    }
}

#[test]
fn check_reads_report_counts_as_limitador_does() {
    let python = python();
    let dir = tempfile::tempdir().expect("a temporary directory");
    generate_stubs(&python, dir.path());
    let script = dir.path().join("client.py");
    std::fs::write(&script, PYTHON_CLIENT).expect("write the script");
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).expect("write the limits");
    let sluice = SluiceProcess::start(
        env!("CARGO_BIN_EXE_sluice"),
        &limits,
        &["--backend", "memory"],
        &[],
    );
    // sluice's fixed windows end on multiples of their length: stay clear of a minute's end.
    while unix_secs() % 60 >= 55 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let steps: Vec<serde_json::Value> = STEPS
        .iter()
        .map(|(m, d, u, h, _)| serde_json::json!([m, d, u, h]))
        .collect();
    let output = Command::new(&python)
        .arg(&script)
        .arg(format!("127.0.0.1:{}", sluice.port))
        .arg(serde_json::Value::from(steps).to_string())
        .env("PYTHONPATH", dir.path())
        .output()
        .expect("run the Python client");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got: Vec<String> = serde_json::from_slice(&output.stdout).expect("JSON");
    let want: Vec<&str> = STEPS.iter().map(|s| s.4).collect();
    for (i, (g, s)) in got.iter().zip(STEPS).enumerate() {
        assert_eq!(g, s.4, "step {i}: {s:?}");
    }
    assert_eq!(got.len(), want.len());
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
