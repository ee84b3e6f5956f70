//! limitador's command line and environment, translated: defaults, flags over variables,
//! storages, and what stops the start.

use super::*;

fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Start, CliError> {
    let mut all = vec!["limitador-server".to_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    translate(&all, &env)
}

fn get<'a>(start: &'a Start, key: &str) -> Option<&'a str> {
    let key = format!("SLUICE_{key}");
    start
        .translation
        .settings
        .iter()
        .rev()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.as_str())
}

fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    match run(args, env) {
        Err(CliError::Unsupported(u)) => u.name,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn limitadors_defaults() {
    let s = run(&["limits.yaml"], &[]).unwrap();
    assert_eq!(get(&s, "RULES__PATHS"), Some("limits.yaml"));
    assert_eq!(get(&s, "SERVER__GRPC_LISTEN"), Some("0.0.0.0:8081"));
    assert_eq!(get(&s, "SERVER__ADMIN_LISTEN"), Some("0.0.0.0:8080"));
    assert_eq!(get(&s, "LIMITER__BACKEND"), Some("memory"));
    assert_eq!(get(&s, "RESPONSE__HEADERS"), None);
    assert!(!s.validate);
}

#[test]
fn flags_win_over_variables() {
    let env = [
        ("LIMITS_FILE", "env.yaml"),
        ("ENVOY_RLS_HOST", "127.0.0.1"),
        ("ENVOY_RLS_PORT", "9001"),
        ("HTTP_API_HOST", "127.0.0.1"),
        ("HTTP_API_PORT", "9002"),
        ("RATE_LIMIT_HEADERS", "DRAFT_VERSION_03"),
    ];
    let s = run(&[], &env).unwrap();
    assert_eq!(get(&s, "RULES__PATHS"), Some("env.yaml"));
    assert_eq!(get(&s, "SERVER__GRPC_LISTEN"), Some("127.0.0.1:9001"));
    assert_eq!(get(&s, "SERVER__ADMIN_LISTEN"), Some("127.0.0.1:9002"));
    assert_eq!(get(&s, "RESPONSE__LIMIT_HEADER"), Some("X-RateLimit-Limit"));
    let args = [
        "-b",
        "::1",
        "-p",
        "7001",
        "-B",
        "localhost",
        "-P",
        "7002",
        "flag.yaml",
        "-vvv",
    ];
    let s = run(&args, &env).unwrap();
    assert_eq!(get(&s, "RULES__PATHS"), Some("flag.yaml"));
    assert_eq!(get(&s, "SERVER__GRPC_LISTEN"), Some("[::1]:7001"));
    assert_eq!(get(&s, "SERVER__ADMIN_LISTEN"), Some("127.0.0.1:7002"));
    assert_eq!(get(&s, "LOG__LEVEL"), Some("info,sluice=debug"));
}

#[test]
fn storages() {
    let s = run(&["l.yaml", "redis", "redis://127.0.0.1:6379"], &[]).unwrap();
    assert_eq!(
        (get(&s, "LIMITER__BACKEND"), get(&s, "REDIS__URL")),
        (Some("redis"), Some("redis://127.0.0.1:6379"))
    );
    let s = run(&["l.yaml", "memory", "-c", "500"], &[]).unwrap();
    assert_eq!(
        (get(&s, "LIMITER__BACKEND"), get(&s, "MEMORY__MAX_KEYS")),
        (Some("memory"), Some("500"))
    );
    let s = run(&["l.yaml"], &[("REDIS_URL", "redis://r:1")]).unwrap();
    assert_eq!(get(&s, "REDIS__URL"), Some("redis://r:1"));
    let s = run(&["l.yaml", "redis_cached", "redis://r:2"], &[]).unwrap();
    assert_eq!(get(&s, "REDIS__URL"), Some("redis://r:2"));
    assert_eq!(s.translation.ignored[0].0, "redis_cached");
}

#[test]
fn disk_keeps_the_memory_backend_in_a_snapshot_in_its_directory() {
    let s = run(&["l.yaml", "disk", "/var/lib/limitador"], &[]).unwrap();
    assert_eq!(get(&s, "LIMITER__BACKEND"), Some("memory"));
    let file = format!("/var/lib/limitador/{DISK_SNAPSHOT}");
    assert_eq!(get(&s, "LIMITER__PERSIST"), Some(file.as_str()));
    assert!(s.translation.ignored.is_empty());
    let env = [("DISK_PATH", "/data"), ("DISK_OPTIMIZE", "disk")];
    let s = run(&["l.yaml", "disk"], &env).unwrap();
    let file = format!("/data/{DISK_SNAPSHOT}");
    assert_eq!(get(&s, "LIMITER__PERSIST"), Some(file.as_str()));
    assert_eq!(s.translation.ignored[0].0, "--optimize");
}

#[test]
fn what_sluice_cannot_honour_is_named() {
    assert_eq!(refused(&[], &[]), "LIMITS_FILE");
    assert_eq!(refused(&["l.yaml", "disk"], &[]), "disk");
    let optimize = ["l.yaml", "disk", "/d", "--optimize", "speed"];
    assert_eq!(refused(&optimize, &[]), "--optimize");
    assert_eq!(
        refused(&["l.yaml", "distributed", "a", "b"], &[]),
        "distributed"
    );
    let cached = ["l.yaml", "redis_cached", "redis://r", "--batch-size", "10"];
    assert_eq!(refused(&cached, &[]), "--batch-size");
    assert_eq!(
        refused(&["l.yaml", "-H", "DRAFT_VERSION_99"], &[]),
        "--rate-limit-headers"
    );
    assert_eq!(
        refused(&["l.yaml", "-L", "x"], &[]),
        "--custom-metric-labels"
    );
    assert_eq!(
        refused(&["l.yaml", "--tracing-endpoint", "rpc://x"], &[]),
        "--tracing-endpoint"
    );
    assert_eq!(refused(&["l.yaml", "-b", "my-host"], &[]), "ENVOY_RLS_HOST");
    assert!(matches!(
        run(&["l.yaml", "--no-such"], &[]),
        Err(CliError::Usage(_))
    ));
    assert!(matches!(run(&["--help"], &[]), Err(CliError::Info(_))));
}

#[test]
fn validate_and_the_accepted_no_ops() {
    let s = run(
        &[
            "--validate",
            "l.yaml",
            "--limitador-cli",
            "--grpc-reflection-service",
            "-l",
        ],
        &[],
    )
    .unwrap();
    assert!(s.validate);
    let ignored: Vec<&str> = s
        .translation
        .ignored
        .iter()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(ignored, ["--grpc-reflection-service"]);
    let got = settings(&s, &HashMap::new()).unwrap_or_else(|e| panic!("{e}"));
    assert!(got.metrics.limitador && got.metrics.limitador_limit_name_label);
}

#[test]
fn the_translation_gives_valid_settings() {
    let s = run(
        &[
            "l.yaml",
            "-H",
            "DRAFT_VERSION_03",
            "redis",
            "redis://127.0.0.1:7",
        ],
        &[],
    )
    .unwrap();
    let got = settings(&s, &HashMap::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.redis.url, "redis://127.0.0.1:7");
    assert!(got.response.headers);
    assert!(got.metrics.limitador, "limitador's metric names are served");
    assert!(!got.metrics.limitador_limit_name_label);
    assert_eq!(got.server.grpc_listen.port(), 8081);
    let s = run(&["l.yaml", "memory", "-c", "9"], &[]).unwrap();
    assert_eq!(settings(&s, &HashMap::new()).unwrap().memory.max_keys, 9);
}
