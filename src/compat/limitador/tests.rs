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
    // Its HTTP API answers every caller, as limitador's does.
    assert_eq!(get(&s, "ADMIN__OPEN_DECISIONS"), Some("true"));
    assert!(!s.validate);
    let closed = run(
        &["limits.yaml"],
        &[("SLUICE_ADMIN__OPEN_DECISIONS", "false")],
    )
    .unwrap();
    assert_eq!(get(&closed, "ADMIN__OPEN_DECISIONS"), None);
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
    assert_eq!(get(&s, "REDIS__LEASES"), Some("on"));
    assert!(s.translation.ignored.is_empty());
}

#[test]
fn redis_cached_and_its_flags_are_leases() {
    let args = [
        "l.yaml",
        "redis_cached",
        "redis://r",
        "--flush-period",
        "250",
        "--response-timeout",
        "350",
        "--batch-size",
        "10",
        "--max-cached",
        "5000",
    ];
    let s = run(&args, &[]).unwrap();
    assert_eq!(get(&s, "LIMITER__BACKEND"), Some("redis"));
    assert_eq!(get(&s, "REDIS__LEASES"), Some("on"));
    assert_eq!(get(&s, "REDIS__LEASE_VALIDITY_MS"), Some("250"));
    assert_eq!(get(&s, "REDIS__LEASE_HORIZON_MS"), Some("20"));
    assert_eq!(get(&s, "REDIS__TIMEOUT_MS"), Some("350"));
    let ignored: Vec<&str> = s
        .translation
        .ignored
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(ignored, ["--batch-size", "--max-cached"]);
    // limitador's default flush period, a second, is the longest a lease may be held.
    let long = [
        "l.yaml",
        "redis_cached",
        "redis://r",
        "--flush-period",
        "5000",
    ];
    let s = run(&long, &[]).unwrap();
    assert_eq!(get(&s, "REDIS__LEASE_VALIDITY_MS"), Some("1000"));
    assert_eq!(s.translation.ignored[0].0, "--flush-period");
    let bad = [
        "l.yaml",
        "redis_cached",
        "redis://r",
        "--flush-period",
        "soon",
    ];
    assert_eq!(refused(&bad, &[]), "--flush-period");
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
    assert_eq!(
        refused(&["l.yaml", "-H", "DRAFT_VERSION_99"], &[]),
        "--rate-limit-headers"
    );
    assert_eq!(refused(&["l.yaml", "-b", "my-host"], &[]), "ENVOY_RLS_HOST");
    assert!(matches!(
        run(&["l.yaml", "--no-such"], &[]),
        Err(CliError::Usage(_))
    ));
    assert!(matches!(run(&["--help"], &[]), Err(CliError::Info(_))));
}

#[test]
fn cel_metric_labels_and_the_tracing_endpoint_map_onto_settings() {
    let args = [
        "l.yaml",
        "-L",
        "/etc/labels.yaml",
        "--metric-labels-default",
        "{'tier': descriptors[0].tier}",
    ];
    let s = run(&args, &[]).unwrap();
    let file = get(&s, "METRICS__LIMITADOR_LABELS_FILE");
    assert_eq!(file, Some("/etc/labels.yaml"));
    let default = get(&s, "METRICS__LIMITADOR_LABELS_DEFAULT");
    assert_eq!(default, Some("{'tier': descriptors[0].tier}"));
    for (flag, var, want) in [
        (Some("rpc://jaeger:4317"), None, "http://jaeger:4317"),
        (None, Some("collector:4317"), "http://collector:4317"),
        (
            Some("https://c:4317"),
            Some("http://env:1"),
            "https://c:4317",
        ),
    ] {
        let mut args = vec!["l.yaml"];
        args.extend(flag.iter().flat_map(|f| ["--tracing-endpoint", *f]));
        let env: Vec<(&str, &str)> = var.iter().map(|v| ("TRACING_ENDPOINT", *v)).collect();
        let s = run(&args, &env).unwrap();
        if cfg!(feature = "otel") {
            assert_eq!(
                get(&s, "LOG__OTLP_ENDPOINT"),
                Some(want),
                "{flag:?} {var:?}"
            );
            assert_eq!(get(&s, "LOG__OTLP_PROTOCOL"), Some("grpc"));
            assert_eq!(get(&s, "LOG__OTLP_SERVICE_NAME"), Some("limitador"));
        } else {
            assert_eq!(get(&s, "LOG__OTLP_ENDPOINT"), None);
            assert_eq!(s.translation.ignored[0].0, "--tracing-endpoint");
        }
    }
    // Empty is off, as there.
    let s = run(&["l.yaml", "--tracing-endpoint", ""], &[]).unwrap();
    assert_eq!(get(&s, "LOG__OTLP_ENDPOINT"), None);
    assert!(s.translation.ignored.is_empty());
}

#[test]
fn switch_variables_are_on_with_1_as_limitador_reads_them() {
    let env = [
        ("REDIS_URL", "redis://r:6379"),
        ("REDIS_LOCAL_CACHE_ENABLED", "1"),
        ("LIMIT_NAME_IN_PROMETHEUS_LABELS", "1"),
    ];
    let s = run(&["l.yaml"], &env).unwrap();
    assert_eq!(get(&s, "LIMITER__BACKEND"), Some("redis"));
    assert_eq!(get(&s, "REDIS__LEASES"), Some("on"));
    assert_eq!(get(&s, "METRICS__LIMITADOR_LIMIT_NAME_LABEL"), Some("true"));
    assert!(
        s.translation.ignored.is_empty(),
        "{:?}",
        s.translation.ignored
    );
    let flushing = [
        ("REDIS_URL", "redis://r:6379"),
        ("REDIS_LOCAL_CACHE_ENABLED", "true"),
        ("REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS", "100"),
    ];
    let s = run(&["l.yaml"], &flushing).unwrap();
    assert_eq!(get(&s, "REDIS__LEASE_VALIDITY_MS"), Some("100"));
    let off = [("LIMIT_NAME_IN_PROMETHEUS_LABELS", "0")];
    let s = run(&["l.yaml"], &off).unwrap();
    assert_eq!(get(&s, "METRICS__LIMITADOR_LIMIT_NAME_LABEL"), None);
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
    assert_eq!(got.server.grpc_listen.tcp().map(|a| a.port()), Some(8081));
    let s = run(&["l.yaml", "memory", "-c", "9"], &[]).unwrap();
    assert_eq!(settings(&s, &HashMap::new()).unwrap().memory.max_keys, 9);
}
