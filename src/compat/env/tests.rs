use std::path::PathBuf;

use super::*;
use crate::config::settings::{Backend, LogFormat, OtlpProtocol, StatsdProtocol};
use crate::testing::ratelimit_env::{ENVOY_GATEWAY, ENVOY_GATEWAY_REDIS_TLS, ISTIO};

use crate::testing::env_map as env;

#[test]
fn envoy_gateway_env_gives_xds_tls_redis_and_its_prometheus_port() {
    let (s, t) = settings(&env(ENVOY_GATEWAY)).unwrap();
    assert_eq!(s.server.grpc_listen.to_string(), "0.0.0.0:8081");
    assert_eq!(s.server.admin_listen.to_string(), "0.0.0.0:8080");
    // `/json` answers every caller, as envoyproxy/ratelimit's does.
    assert!(s.admin.open_decisions);
    assert_eq!(
        s.debug.listen.map(|a| a.to_string()).as_deref(),
        Some("0.0.0.0:6070")
    );
    assert_eq!(s.log.level, "info");
    assert!(s.rules.paths.is_empty());
    assert_eq!(s.xds.server, "envoy-gateway:18001");
    assert_eq!(s.xds.node_id, "envoy-ratelimit");
    assert!(s.xds.tls && s.xds.start_without_rules);
    assert_eq!(s.xds.ca_file, Some(PathBuf::from("/certs/ca.crt")));
    assert_eq!(s.xds.cert_file, Some(PathBuf::from("/certs/tls.crt")));
    assert_eq!(s.xds.key_file, Some(PathBuf::from("/certs/tls.key")));
    assert_eq!(s.tls.cert_file, Some(PathBuf::from("/certs/tls.crt")));
    assert_eq!(s.tls.key_file, Some(PathBuf::from("/certs/tls.key")));
    assert_eq!(s.tls.client_ca_file, None);
    assert_eq!(s.limiter.backend, Backend::Redis);
    assert_eq!(s.redis.url, "redis://redis.redis.svc:6379");
    assert!(!s.statsd.enabled());
    assert_eq!(
        s.ratelimit_metrics.listen.map(|a| a.to_string()).as_deref(),
        Some("0.0.0.0:19001")
    );
    assert_eq!(s.ratelimit_metrics.path, "/metrics");
    assert_eq!(
        s.ratelimit_metrics.mapper_file,
        Some(PathBuf::from("/etc/statsd-exporter/conf.yaml"))
    );
    let ignored: Vec<&str> = t.ignored.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        ignored,
        [
            "GRPC_SERVER_TLS_CA_CERT",
            "RUNTIME_IGNOREDOTFILES",
            "RUNTIME_WATCH_ROOT"
        ]
    );
}

#[test]
fn envoy_gateways_redis_tls_files_become_the_redis_tls_settings() {
    let mut e = env(ENVOY_GATEWAY);
    e.extend(env(ENVOY_GATEWAY_REDIS_TLS));
    let (s, t) = settings(&e).unwrap();
    assert_eq!(s.redis.url, "rediss://redis.redis.svc:6379");
    assert_eq!(s.redis.tls_ca_file, None, "the system's roots");
    let cert = Some(PathBuf::from("/redis-certs/tls.crt"));
    assert_eq!(s.redis.tls_cert_file, cert);
    let key = Some(PathBuf::from("/redis-certs/tls.key"));
    assert_eq!(s.redis.tls_key_file, key);
    assert!(!s.redis.tls_skip_hostname_verification);
    assert!(t.ignored.iter().all(|(n, _)| !n.starts_with("REDIS_TLS")));

    e.insert("REDIS_TLS_CACERT".into(), "/redis-certs/ca.crt".into());
    e.insert("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION".into(), "true".into());
    let (s, _) = settings(&e).unwrap();
    let ca = Some(PathBuf::from("/redis-certs/ca.crt"));
    assert_eq!(s.redis.tls_ca_file, ca);
    assert!(s.redis.tls_skip_hostname_verification);

    e.insert("REDIS_TYPE".into(), "sentinel".into());
    e.insert("REDIS_URL".into(), "mymaster,s1:26379".into());
    let (s, _) = settings(&e).unwrap();
    assert_eq!(s.redis.url, "rediss+sentinel://s1:26379/mymaster");
    assert!(s.redis.tls_skip_hostname_verification, "with Sentinel too");
}

#[test]
fn redis_tls_files_are_ignored_without_redis_tls_or_half_a_pair() {
    let files = [
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "r:1"),
        ("REDIS_TLS_CACERT", "/ca"),
        ("REDIS_TLS_CLIENT_CERT", "/c"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ];
    let (s, t) = settings(&env(&files)).unwrap();
    assert_eq!(s.redis.url, "redis://r:1");
    assert!(!s.redis.has_tls_settings());
    let ignored: Vec<&str> = t.ignored.iter().map(|(n, _)| n.as_str()).collect();
    let all = [
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    ];
    assert_eq!(ignored, all);

    let (s, t) = settings(&env(&[
        files[0],
        files[1],
        files[2],
        files[3],
        ("REDIS_TLS", "1"),
    ]))
    .unwrap();
    assert_eq!(s.redis.tls_ca_file, Some(PathBuf::from("/ca")));
    assert_eq!(s.redis.tls_cert_file, None, "a certificate without its key");
    let ignored: Vec<&str> = t.ignored.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(ignored, ["REDIS_TLS_CLIENT_CERT"]);
}

#[test]
fn istio_sample_env_gives_files_and_redis() {
    let (s, t) = settings(&env(ISTIO)).unwrap();
    assert_eq!(s.rules.paths, vec![PathBuf::from("/data/ratelimit/config")]);
    assert!(!s.xds.enabled());
    assert_eq!(s.redis.url, "redis://redis:6379");
    assert_eq!(s.limiter.backend, Backend::Redis);
    assert_eq!(s.log.level, "info,sluice=debug");
    assert_eq!(s.log.format, LogFormat::Text);
    assert!(!s.statsd.enabled());
    assert_eq!(s.ratelimit_metrics.listen, None);
    assert_eq!(s.tls.cert_file, None);
    assert_eq!(t.ignored.len(), 2);
}

#[test]
fn defaults_are_envoyproxy_ratelimits() {
    let (s, _) = settings(&HashMap::new()).unwrap();
    assert_eq!(
        s.rules.paths,
        vec![PathBuf::from("/srv/runtime_data/current/config")]
    );
    assert_eq!(s.redis.url, "unix:///var/run/nutcracker/ratelimit.sock");
    assert_eq!(s.statsd.address, "localhost:8125");
    assert_eq!(
        s.statsd.protocol,
        StatsdProtocol::Tcp,
        "as envoyproxy/ratelimit"
    );
    assert_eq!(s.log.level, "warn");
    let dog = env(&[("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")]);
    assert_eq!(
        settings(&dog).unwrap().0.statsd.protocol,
        StatsdProtocol::Udp
    );
    let (_, t) = settings(&env(&[("PROMETHEUS_MAPPER_YAML", "/m.yaml")])).unwrap();
    assert!(
        t.ignored
            .iter()
            .any(|(n, why)| n == "PROMETHEUS_MAPPER_YAML" && why.contains("USE_PROMETHEUS is off")),
        "{t:?}"
    );
}

/// Variables, the `SLUICE_*` setting they give, and its value.
type Case = (
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
);

#[test]
fn each_setting_maps() {
    let cases: &[Case] = &[
        (
            &[("GRPC_HOST", "127.0.0.1"), ("GRPC_PORT", "9")],
            "SLUICE_SERVER__GRPC_LISTEN",
            "127.0.0.1:9",
        ),
        (
            &[("HOST", "localhost"), ("PORT", "81")],
            "SLUICE_SERVER__ADMIN_LISTEN",
            "127.0.0.1:81",
        ),
        (
            &[("DEBUG_HOST", "::1"), ("DEBUG_PORT", "7")],
            "SLUICE_DEBUG__LISTEN",
            "[::1]:7",
        ),
        (&[("LOG_FORMAT", "json")], "SLUICE_LOG__FORMAT", "json"),
        (&[("LOG_LEVEL", "FATAL")], "SLUICE_LOG__LEVEL", "error"),
        (
            &[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "r:1"),
                ("REDIS_AUTH", "p@ss"),
            ],
            "SLUICE_REDIS__URL",
            "redis://:p%40ss@r:1",
        ),
        (
            &[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "r:1"),
                ("REDIS_AUTH", "u:pw"),
                ("REDIS_TLS", "true"),
            ],
            "SLUICE_REDIS__URL",
            "rediss://u:pw@r:1",
        ),
        (
            &[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ],
            "SLUICE_REDIS__URL",
            "redis+sentinel://s1:26379,s2:26379/mymaster",
        ),
        (
            &[("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "n1:1,n2:2")],
            "SLUICE_REDIS__URL",
            "redis+cluster://n1:1,n2:2",
        ),
        (
            &[("REDIS_TIMEOUT", "1m30s")],
            "SLUICE_REDIS__CONNECT_TIMEOUT_MS",
            "90000",
        ),
        (
            &[("CACHE_KEY_PREFIX", "rl:")],
            "SLUICE_REDIS__PREFIX",
            "rl:",
        ),
        (
            &[("SHADOW_MODE", "true")],
            "SLUICE_RULES__SHADOW_MODE",
            "true",
        ),
        (
            &[("MERGE_DOMAIN_CONFIG", "true")],
            "SLUICE_RULES__MERGE_DOMAINS",
            "true",
        ),
        (
            &[("GRPC_UDS", "/run/rl.sock"), ("GRPC_PORT", "9")],
            "SLUICE_SERVER__GRPC_LISTEN",
            "unix:/run/rl.sock",
        ),
        (
            &[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "m,s1:1"),
                ("REDIS_SENTINEL_AUTH", "pw"),
            ],
            "SLUICE_REDIS__SENTINEL_PASSWORD",
            "pw",
        ),
        (
            &[
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "m,s1:1"),
                ("REDIS_SENTINEL_AUTH", "watcher:p:w"),
            ],
            "SLUICE_REDIS__SENTINEL_USERNAME",
            "watcher",
        ),
        (&[("QUOTA_MODE", "1")], "SLUICE_LIMITS__QUOTA_MODE", "true"),
        (
            &[("RESPONSE_DYNAMIC_METADATA", "true")],
            "SLUICE_RESPONSE__DYNAMIC_METADATA",
            "true",
        ),
        (
            &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
            "SLUICE_RESPONSE__RETRY_AFTER",
            "false",
        ),
        (
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_RESET_HEADER", "X-Reset"),
            ],
            "SLUICE_RESPONSE__RESET_HEADER",
            "X-Reset",
        ),
        (
            &[("NEAR_LIMIT_RATIO", "0.9")],
            "SLUICE_METRICS__NEAR_LIMIT_RATIO",
            "0.9",
        ),
        (
            &[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")],
            "SLUICE_REDIS__DENY_CACHE_SIZE",
            "8192",
        ),
        (
            &[("STATSD_HOST", "sd"), ("STATSD_PORT", "9125")],
            "SLUICE_STATSD__ADDRESS",
            "sd:9125",
        ),
        (&[("EXTRA_TAGS", "a:b")], "SLUICE_STATSD__TAGS", "a:b"),
        (
            &[("STATS_FLUSH_INTERVAL", "1s")],
            "SLUICE_STATSD__FLUSH_INTERVAL_MS",
            "1000",
        ),
        (
            &[("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")],
            "SLUICE_STATSD__DOGSTATSD",
            "true",
        ),
        (
            &[
                ("USE_STATSD", "false"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", "127.0.0.1:9"),
            ],
            "SLUICE_RATELIMIT_METRICS__LISTEN",
            "127.0.0.1:9",
        ),
        (
            &[
                ("USE_STATSD", "false"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_PATH", "/m"),
            ],
            "SLUICE_RATELIMIT_METRICS__PATH",
            "/m",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "c"),
                ("GRPC_SERVER_TLS_KEY", "k"),
                ("GRPC_CLIENT_TLS_CACERT", "ca"),
            ],
            "SLUICE_TLS__CLIENT_CA_FILE",
            "ca",
        ),
        (
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", "c"),
                ("GRPC_SERVER_TLS_KEY", "k"),
                ("GRPC_CLIENT_TLS_CACERT", "ca"),
                ("GRPC_CLIENT_TLS_SAN", "envoy.example.com"),
            ],
            "SLUICE_TLS__CLIENT_SAN",
            "envoy.example.com",
        ),
        (
            &[("CONFIG_TYPE", "GRPC_XDS_SOTW")],
            "SLUICE_XDS__SERVER",
            "localhost:18000",
        ),
        (
            &[("CONFIG_TYPE", "GRPC_XDS_SOTW")],
            "SLUICE_XDS__NODE_ID",
            "default",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_NODE_METADATA", "a=b"),
            ],
            "SLUICE_XDS__NODE_METADATA",
            "a=b",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b"),
            ],
            "SLUICE_XDS__HEADERS",
            "a:b",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "eg"),
            ],
            "SLUICE_XDS__SERVER_NAME",
            "eg",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "250ms"),
            ],
            "SLUICE_XDS__RETRY_INITIAL_MS",
            "250",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m"),
            ],
            "SLUICE_XDS__RETRY_MAX_MS",
            "120000",
        ),
        (
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "100"),
            ],
            "SLUICE_XDS__MAX_MESSAGE_BYTES",
            "100",
        ),
        (
            &[("RUNTIME_APPDIRECTORY", "rules")],
            "SLUICE_RULES__PATHS",
            "/srv/runtime_data/current/rules",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ],
            "SLUICE_LOG__OTLP_ENDPOINT",
            "http://c:4317",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ],
            "SLUICE_LOG__OTLP_PROTOCOL",
            "grpc",
        ),
        // Envoy Gateway's: the protocol left to its default (http), the collector's base URL.
        (
            &[
                ("TRACING_ENABLED", "true"),
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "http://otel-collector.monitoring:4318",
                ),
            ],
            "SLUICE_LOG__OTLP_ENDPOINT",
            "http://otel-collector.monitoring:4318/v1/traces",
        ),
        (
            &[("TRACING_ENABLED", "true")],
            "SLUICE_LOG__OTLP_PROTOCOL",
            "http",
        ),
        (
            &[("TRACING_ENABLED", "true")],
            "SLUICE_LOG__OTLP_ENDPOINT",
            "http://localhost:4318/v1/traces",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_EXPORTER_PROTOCOL", "HTTP"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318/base/"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/custom"),
            ],
            "SLUICE_LOG__OTLP_ENDPOINT",
            "http://t:4318/custom",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318/base/"),
            ],
            "SLUICE_LOG__OTLP_ENDPOINT",
            "http://c:4318/base/v1/traces",
        ),
        (
            &[("TRACING_ENABLED", "true")],
            "SLUICE_LOG__OTLP_SERVICE_NAME",
            "RateLimit",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ],
            "SLUICE_LOG__OTLP_SERVICE_NAME",
            "envoy-ratelimit",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_SERVICE_NAMESPACE", "gateway"),
            ],
            "SLUICE_LOG__OTLP_SERVICE_NAMESPACE",
            "gateway",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ],
            "SLUICE_LOG__OTLP_SERVICE_INSTANCE_ID",
            "pod-1",
        ),
        (
            &[("TRACING_ENABLED", "true")],
            "SLUICE_LOG__OTLP_SAMPLING_RATIO",
            "1",
        ),
        (
            &[
                ("TRACING_ENABLED", "true"),
                ("TRACING_SAMPLING_RATE", "0.25"),
            ],
            "SLUICE_LOG__OTLP_SAMPLING_RATIO",
            "0.25",
        ),
        // As ratelimit's sampler: 1 and above keep all, 0 and below none.
        (
            &[("TRACING_ENABLED", "true"), ("TRACING_SAMPLING_RATE", "5")],
            "SLUICE_LOG__OTLP_SAMPLING_RATIO",
            "1",
        ),
        (
            &[("TRACING_ENABLED", "true"), ("TRACING_SAMPLING_RATE", "-1")],
            "SLUICE_LOG__OTLP_SAMPLING_RATIO",
            "0",
        ),
    ];
    for (vars, key, want) in cases {
        let t = translate(&env(vars)).unwrap_or_else(|e| panic!("{vars:?}: {e}"));
        let got = t
            .settings
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str());
        assert_eq!(got, Some(*want), "{vars:?} -> {key}");
    }
}

#[test]
fn what_sluice_cannot_honour_stops_naming_the_variable() {
    let cases: &[&[(&str, &str)]] = &[
        &[("BACKEND_TYPE", "memcache")],
        &[
            ("BACKEND_TYPE", "memcache"),
            ("MEMCACHE_SRV", "_mc._tcp.x"),
            ("MEMCACHE_HOST_PORT", "m:11211"),
        ],
        &[("BACKEND_TYPE", "memcache"), ("MEMCACHE_SRV", "mc.tcp.x")],
        &[
            ("BACKEND_TYPE", "memcache"),
            ("MEMCACHE_SRV", "_mc._tcp.x"),
            ("MEMCACHE_SRV_REFRESH", "often"),
        ],
        &[
            ("BACKEND_TYPE", "memcached"),
            ("MEMCACHE_HOST_PORT", "m:11211"),
        ],
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "ring"),
        ],
        &[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "maybe")],
        &[("CONFIG_TYPE", "GRPC_XDS_DELTA")],
        &[("USE_PROMETHEUS", "true")],
        &[("HOST", "no-such-host.invalid")],
        &[("SHADOW_MODE", "maybe")],
        &[("REDIS_TIMEOUT", "soon")],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
        ],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SAMPLING_RATE", "half"),
        ],
        &[("TRACING_SAMPLING_RATE", "NaN")],
    ];
    for vars in cases {
        let err = translate(&env(vars)).expect_err(&format!("{vars:?} must stop the start"));
        assert!(
            vars.iter().any(|(name, _)| *name == err.name),
            "{vars:?}: {err}"
        );
    }
    // And a setting the translation gives but sluice refuses stops too.
    let err = settings(&env(&[("NEAR_LIMIT_RATIO", "2")])).unwrap_err();
    assert!(err.to_string().contains("near_limit_ratio"), "{err}");
}

#[test]
fn grpc_uds_merge_and_sentinel_auth_reach_the_settings() {
    let (s, t) = settings(&env(&[
        ("GRPC_UDS", "/run/rl.sock"),
        ("MERGE_DOMAIN_CONFIG", "true"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,s1:26379"),
        ("REDIS_AUTH", "master-pw"),
        ("REDIS_SENTINEL_AUTH", "watcher:p:w"),
    ]))
    .unwrap();
    assert_eq!(s.server.grpc_listen.to_string(), "unix:/run/rl.sock");
    assert!(s.rules.merge_domains);
    assert_eq!(s.redis.url, "redis+sentinel://:master-pw@s1:26379/mymaster");
    assert_eq!(s.redis.sentinel_username.as_deref(), Some("watcher"));
    assert_eq!(s.redis.sentinel_password.as_deref(), Some("p:w"));
    assert!(t.ignored.is_empty(), "{:?}", t.ignored);
    // Not a Sentinel: the sentinels' password is unused, logged without its value.
    let t = translate(&env(&[("REDIS_SENTINEL_AUTH", "secret")])).unwrap();
    assert_eq!(
        t.ignored,
        [(
            "REDIS_SENTINEL_AUTH".to_owned(),
            "<redacted>: only read with REDIS_TYPE=sentinel".to_owned()
        )]
    );
    assert!(!format!("{t:?}").contains("secret"));
    // false is off, as envoyproxy/ratelimit reads it.
    let (s, _) = settings(&env(&[("MERGE_DOMAIN_CONFIG", "false")])).unwrap();
    assert!(!s.rules.merge_domains);
}

#[test]
fn client_san_and_mogrifiers_reach_the_settings() {
    let (s, _) = settings(&env(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "c"),
        ("GRPC_SERVER_TLS_KEY", "k"),
        ("GRPC_CLIENT_TLS_CACERT", "ca"),
        ("GRPC_CLIENT_TLS_SAN", "10.0.0.7"),
    ]))
    .unwrap();
    assert_eq!(s.tls.client_san.as_deref(), Some("10.0.0.7"));
    // No client CA: no client certificate to check, as there.
    let t = translate(&env(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "c"),
        ("GRPC_SERVER_TLS_KEY", "k"),
        ("GRPC_CLIENT_TLS_SAN", "x"),
    ]))
    .unwrap();
    assert_eq!(t.ignored[0].0, "GRPC_CLIENT_TLS_SAN");
    assert!(
        t.settings
            .iter()
            .all(|(k, _)| k != "SLUICE_TLS__CLIENT_SAN")
    );

    let dog = [
        ("USE_STATSD", "false"),
        ("USE_DOG_STATSD", "true"),
        ("USE_DOG_STATSD_MOGRIFIERS", "domain, HITS"),
        ("DOG_STATSD_MOGRIFIER_DOMAIN_PATTERN", r"^a\.(.*)$"),
        ("DOG_STATSD_MOGRIFIER_DOMAIN_NAME", "a"),
        ("DOG_STATSD_MOGRIFIER_DOMAIN_TAGS", "domain:$1"),
        ("DOG_STATSD_MOGRIFIER_HITS_PATTERN", "hits"),
        // HITS's name from the bare NAME, as envconfig falls back to it.
        ("NAME", "h"),
    ];
    let (s, _) = settings(&env(&dog)).unwrap();
    let got: Vec<(&str, &str, &str, &str)> = s
        .statsd
        .mogrifiers
        .iter()
        .map(|m| {
            (
                m.id.as_str(),
                m.pattern.as_str(),
                m.name.as_str(),
                m.tags.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("DOMAIN", r"^a\.(.*)$", "a", "domain:$1"),
            ("HITS", "hits", "h", "")
        ]
    );
    for (name, value, says) in [
        (
            "NAME",
            "",
            "mogrifier HITS needs DOG_STATSD_MOGRIFIER_HITS_NAME",
        ),
        (
            "DOG_STATSD_MOGRIFIER_HITS_PATTERN",
            "(",
            "not a valid pattern",
        ),
        (
            "DOG_STATSD_MOGRIFIER_DOMAIN_TAGS",
            "domain",
            "expected key:value",
        ),
    ] {
        let mut vars = env(&dog);
        vars.insert(name.to_owned(), value.to_owned());
        if value.is_empty() {
            vars.remove(name);
        }
        let e = translate(&vars).unwrap_err();
        assert!(e.why.contains(says), "{name}: {e}");
    }
    // Plain statsd: read for DogStatsD only, so ignored.
    let t = translate(&env(&[("USE_DOG_STATSD_MOGRIFIERS", "A")])).unwrap();
    assert_eq!(t.ignored[0].0, "USE_DOG_STATSD_MOGRIFIERS");
}

#[test]
fn what_can_be_ignored_is_listed_with_why() {
    let t = translate(&env(&[
        ("REDIS_POOL_SIZE", "20"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
        ("TRACING_SAMPLING_RATE", "0.5"),
        ("TRACING_SERVICE_NAME", "rl"),
    ]))
    .unwrap();
    let names: Vec<&str> = t.ignored.iter().map(|(n, _)| n.as_str()).collect();
    // The tracing variables only while TRACING_ENABLED is not true.
    assert_eq!(
        names,
        [
            "EXPIRATION_JITTER_MAX_SECONDS",
            "REDIS_POOL_SIZE",
            "TRACING_SAMPLING_RATE",
            "TRACING_SERVICE_NAME"
        ]
    );
    assert!(t.ignored.iter().all(|(_, why)| why.contains(": ")));
}

#[test]
fn tracing_exports_spans_only_from_a_build_with_otel() {
    let e = env(&[
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
    ]);
    let (s, t) = settings(&e).unwrap();
    let traced = t.ignored.iter().any(|(n, _)| n == "TRACING_ENABLED");
    if cfg!(feature = "otel") {
        let endpoint = s.log.otlp_endpoint.as_deref();
        assert_eq!(endpoint, Some("http://c:4318/v1/traces"));
        assert_eq!(s.log.otlp_protocol, OtlpProtocol::Http);
        assert_eq!(s.log.otlp_service_name, "RateLimit");
        assert_eq!(s.log.otlp_sampling_ratio, 1.0);
        assert!(!traced);
    } else {
        assert_eq!(s.log.otlp_endpoint, None);
        assert!(traced, "{:?}", t.ignored);
    }
}

#[test]
fn set_ratelimit_variables_win_and_sluice_variables_set_the_rest() {
    let mut e = env(ISTIO);
    // The image's own defaults.
    e.insert("SLUICE_SERVER__GRPC_LISTEN".into(), "0.0.0.0:8081".into());
    e.insert("SLUICE_LOG__FORMAT".into(), "json".into());
    e.insert("GRPC_PORT".into(), "9081".into());
    e.insert("SLUICE_REDIS__URL".into(), "redis://other:1".into());
    e.insert("SLUICE_MEMORY__MAX_KEYS".into(), "5".into());
    e.insert("SLUICE_ADMIN__OPEN_DECISIONS".into(), "false".into());
    let (s, _) = settings(&e).unwrap();
    assert!(!s.admin.open_decisions, "the operator closed /json");
    assert_eq!(s.server.grpc_listen.to_string(), "0.0.0.0:9081");
    assert_eq!(s.redis.url, "redis://redis:6379");
    assert_eq!(s.log.format, LogFormat::Json);
    assert_eq!(s.memory.max_keys, 5);
}

#[test]
fn go_durations() {
    for (text, ms) in [
        ("10s", 10_000),
        ("500ms", 500),
        ("1h", 3_600_000),
        ("1m30s", 90_000),
        ("3", 3000),
        ("1.5s", 1500),
    ] {
        assert_eq!(go_duration_ms(text), Some(ms), "{text}");
    }
    assert_eq!(go_duration_ms("10x"), None);
}

#[test]
fn tracing_names_and_sampling_reach_the_settings() {
    let e = env(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_SERVICE_NAMESPACE", "gateway"),
        ("TRACING_SAMPLING_RATE", "0"),
    ]);
    let (s, _) = settings(&e).unwrap();
    if cfg!(feature = "otel") {
        assert_eq!(s.log.otlp_service_name, "RateLimit");
        assert_eq!(s.log.otlp_service_namespace.as_deref(), Some("gateway"));
        assert_eq!(s.log.otlp_service_instance_id, None);
        assert_eq!(s.log.otlp_sampling_ratio, 0.0);
    } else {
        // Without `otel` the tracing settings are dropped: sluice's defaults stay.
        let defaults = crate::config::settings::LogSettings::default();
        assert_eq!(s.log.otlp_service_name, defaults.otlp_service_name);
        assert_eq!(s.log.otlp_service_namespace, None);
        assert_eq!(s.log.otlp_sampling_ratio, 1.0);
    }
    let err = translate(&env(&[("TRACING_SAMPLING_RATE", "half")])).unwrap_err();
    assert_eq!(err.name, "TRACING_SAMPLING_RATE");
    assert!(err.to_string().contains("TRACING_SAMPLING_RATE"), "{err}");
}

#[test]
fn every_cost_counts_in_fixed_windows_unless_told_otherwise() {
    use crate::config::model::{Algorithm, Charge};
    let (s, _) = settings(&HashMap::new()).unwrap();
    assert_eq!(
        s.limits.default_charge,
        Charge::Always,
        "as envoyproxy/ratelimit"
    );
    assert_eq!(s.limits.default_algorithm, Algorithm::FixedWindow);
    let stop = env(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")]);
    assert_eq!(
        settings(&stop).unwrap().0.limits.default_charge,
        Charge::Admitted
    );
    let own = env(&[
        ("SLUICE_LIMITS__DEFAULT_CHARGE", "admitted"),
        ("SLUICE_LIMITS__DEFAULT_ALGORITHM", "funnel"),
    ]);
    let (s, _) = settings(&own).unwrap();
    assert_eq!(s.limits.default_charge, Charge::Admitted);
    assert_eq!(s.limits.default_algorithm, Algorithm::Funnel);
}

#[test]
fn a_settings_file_sets_what_the_environment_leaves_and_the_domains() {
    use crate::config::model::{Algorithm, Charge};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    let text = "[limits]\ndefault_algorithm = \"funnel\"\n\n\
                [limits.domains.\"ai-gateway-quota\"]\ncharge = \"always\"\n\
                algorithm = \"fixed_window\"\n";
    std::fs::write(&file, text).unwrap();
    let path = file.to_string_lossy().into_owned();
    let (s, _) = settings(&env(&[(CONFIG_FILE, path.as_str()), ("GRPC_PORT", "9081")])).unwrap();
    assert_eq!(
        s.limits.default_algorithm,
        Algorithm::Funnel,
        "the file over the defaults"
    );
    assert_eq!(
        s.limits.default_charge,
        Charge::Always,
        "the environment's default"
    );
    assert_eq!(s.server.grpc_listen.tcp().map(|a| a.port()), Some(9081));
    let quota = &s.limits.domains["ai-gateway-quota"];
    assert_eq!(quota.charge, Some(Charge::Always));
    assert_eq!(quota.algorithm, Some(Algorithm::FixedWindow));
    let missing = env(&[(CONFIG_FILE, "/no/such/sluice.toml")]);
    assert!(
        settings(&missing).is_err(),
        "a named file that is missing stops the start"
    );
}

/// `REDIS_PERSECOND=true` and its twins become `redis.per_second_url`; without it they are
/// ignored (listed). `BACKEND_TYPE=memcache` takes `MEMCACHE_HOST_PORT` and
/// `MEMCACHE_MAX_IDLE_CONNS`.
#[test]
fn per_second_redis_and_memcached_map_to_their_settings() {
    let t = translate(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "main:6379"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", "fast:6379"),
        ("REDIS_PERSECOND_AUTH", "u:p w"),
        ("REDIS_PERSECOND_TLS", "true"),
    ]))
    .unwrap();
    let get = |t: &Translation, key: &str| {
        t.settings
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        get(&t, "SLUICE_REDIS__PER_SECOND_URL").as_deref(),
        Some("rediss://u:p%20w@fast:6379")
    );
    assert_eq!(
        get(&t, "SLUICE_REDIS__URL").as_deref(),
        Some("redis://main:6379")
    );
    let off = translate(&env(&[("REDIS_PERSECOND_URL", "fast:6379")])).unwrap();
    assert_eq!(get(&off, "SLUICE_REDIS__PER_SECOND_URL"), None);
    assert!(off.ignored.iter().any(|(k, _)| k == "REDIS_PERSECOND_URL"));
    let mc = translate(&env(&[
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", "a:11211,b:11211"),
        ("MEMCACHE_MAX_IDLE_CONNS", "4"),
        ("CACHE_KEY_PREFIX", "rl_"),
    ]))
    .unwrap();
    assert_eq!(
        get(&mc, "SLUICE_LIMITER__BACKEND").as_deref(),
        Some("memcache")
    );
    assert_eq!(
        get(&mc, "SLUICE_MEMCACHE__SERVERS").as_deref(),
        Some("a:11211,b:11211")
    );
    assert_eq!(
        get(&mc, "SLUICE_MEMCACHE__CONNECTIONS").as_deref(),
        Some("4")
    );
    assert_eq!(get(&mc, "SLUICE_MEMCACHE__PREFIX").as_deref(), Some("rl_"));
    let (s, _) = settings(&env(&[
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_SRV", "_memcache._tcp.mc.ns.svc"),
        ("MEMCACHE_SRV_REFRESH", "30s"),
    ]))
    .unwrap();
    assert_eq!(s.memcache.srv, "_memcache._tcp.mc.ns.svc");
    assert_eq!(s.memcache.srv_refresh_ms, 30_000);
    let t = translate(&env(&[
        ("REDIS_URL", "/run/redis.sock"),
        ("REDIS_AUTH", "u:p w"),
    ]))
    .unwrap();
    assert_eq!(
        get(&t, "SLUICE_REDIS__URL").as_deref(),
        Some("unix:///run/redis.sock?user=u&pass=p%20w")
    );
    let (s, t) = settings(&env(&[
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", "mc:11211"),
        ("MEMCACHE_TLS", "true"),
        ("MEMCACHE_TLS_CACERT", "/ca.crt"),
        ("MEMCACHE_TLS_CLIENT_CERT", "/c.crt"),
        ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ]))
    .unwrap();
    assert!(s.memcache.tls && s.memcache.tls_skip_hostname_verification);
    assert_eq!(s.memcache.tls_ca_file, Some(PathBuf::from("/ca.crt")));
    // Half a client pair: none presented, as there.
    assert_eq!(s.memcache.tls_cert_file, None);
    assert_eq!(t.ignored[0].0, "MEMCACHE_TLS_CLIENT_CERT");
    let t = translate(&env(&[("MEMCACHE_TLS_CACERT", "/ca.crt")])).unwrap();
    assert_eq!(t.ignored[0].0, "MEMCACHE_TLS_CACERT");
}

#[test]
fn skipping_names_without_a_ca_file_is_served_against_the_systems_roots() {
    // envoyproxy/ratelimit checks the chain against the system's roots then; so does sluice
    // (logged at warn when the connection is built).
    let (s, _) = settings(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "r:1"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ]))
    .unwrap();
    assert_eq!(s.redis.url, "rediss://r:1");
    assert!(s.redis.tls_skip_hostname_verification && s.redis.tls_ca_file.is_none());
    let (s, _) = settings(&env(&[
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", "m:11211"),
        ("MEMCACHE_TLS", "true"),
        ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ]))
    .unwrap();
    assert!(s.memcache.tls_skip_hostname_verification && s.memcache.tls_ca_file.is_none());
}

#[test]
fn a_listen_host_name_is_looked_up_once() {
    assert_eq!(
        super::server::resolve("localhost"),
        Some(std::net::IpAddr::from([127, 0, 0, 1]))
    );
    assert_eq!(super::server::resolve("no-such-host.invalid"), None);
}
