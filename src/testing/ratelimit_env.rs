//! The environments envoyproxy/ratelimit's deployments give its container, for the tests of
//! sluice's drop-in mode (the unit tests of the mapping and the real binary started as
//! `ratelimit`).

/// Envoy Gateway's rate-limit container env, as its resource.go renders it (default settings,
/// Redis at `redis.redis.svc:6379`).
pub const ENVOY_GATEWAY: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis.svc:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

/// What Envoy Gateway adds to [`ENVOY_GATEWAY`] when its Redis uses TLS with a client
/// certificate (the secret of `backend.redis.tls.certificateRef`, mounted at /redis-certs).
pub const ENVOY_GATEWAY_REDIS_TLS: &[(&str, &str)] = &[
    ("REDIS_TLS", "true"),
    ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
    ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
];

/// Istio's sample (samples/ratelimit/rate-limit-service.yaml), Redis at `redis:6379`.
pub const ISTIO: &[(&str, &str)] = &[
    ("LOG_LEVEL", "debug"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis:6379"),
    ("USE_STATSD", "false"),
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
];
