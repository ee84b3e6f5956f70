//! The variables read for their value only: never honoured, each with why that is safe.

/// Variables read for their value only, never honoured, with why ignoring them is safe.
pub(super) const IGNORED: &[(&str, &str)] = &[
    ("GRPC_MAX_CONNECTION_AGE", "connections are not aged out"),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are not aged out",
    ),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "not a setting of envoyproxy/ratelimit either (client certificates are checked with GRPC_CLIENT_TLS_CACERT)",
    ),
    (
        "REDIS_POOL_SIZE",
        "sluice multiplexes its Redis connections",
    ),
    ("REDIS_PIPELINE_WINDOW", "sluice batches Redis calls itself"),
    ("REDIS_PIPELINE_LIMIT", "sluice batches Redis calls itself"),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "sluice batches Redis calls itself",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "sluice multiplexes its Redis connections",
    ),
    (
        "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
        "sluice multiplexes its Redis connections",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "readiness always follows Redis (redis.on_error=error)",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "sluice starts at once and connects in the background",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "sluice starts at once and connects in the background",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "sluice starts at once and connects in the background",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "sluice's keys expire when their state is spent",
    ),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "readiness always waits for rules",
    ),
    ("RUNTIME_IGNOREDOTFILES", "dot-files are always ignored"),
    (
        "RUNTIME_WATCH_ROOT",
        "the rules directory is always watched, symlink swaps included",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "one backoff (XDS_CLIENT_BACKOFF_*) covers reconnections",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "the backoff always has jitter",
    ),
    ("XDS_CLIENT_BACKOFF_JITTER", "the backoff always has jitter"),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "response time is in seconds",
    ),
    (
        "REDIS_PERSECOND_POOL_SIZE",
        "sluice multiplexes its Redis connections",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "sluice batches Redis calls itself",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "sluice batches Redis calls itself",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "sluice batches Redis calls itself",
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        "sluice multiplexes its Redis connections",
    ),
    (
        "REDIS_PERSECOND_TIMEOUT",
        "the per-second Redis connects within REDIS_TIMEOUT, as the main one",
    ),
];
