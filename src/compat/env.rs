//! envoyproxy/ratelimit's environment variables onto sluice's settings: what `sluice` does
//! when started as `ratelimit` (argv[0]) or with `--ratelimit-env`.
//!
//! [`translate`] is a pure function of the environment: it gives the `SLUICE_*` settings the
//! variables mean (with envoyproxy/ratelimit's defaults for those not set, e.g. its ports),
//! the variables it read but can safely ignore (each with why, logged once at start), or the
//! first variable whose behaviour sluice cannot honour (the start stops with exit 64, naming
//! it). [`settings`] layers the result with the real `SLUICE_*` variables: a ratelimit
//! variable that is set wins, a `SLUICE_*` one sets the rest (ratelimit's defaults included).
//! The full table is docs/ratelimit-compat.md.

use std::collections::HashMap;

use crate::config::settings::{Overrides, Settings, SettingsError};

/// What the environment means for sluice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// `SLUICE_*` names and values.
    pub settings: Vec<(String, String)>,
    /// Variables set but ignored, and why.
    pub ignored: Vec<(String, String)>,
}

/// A variable sluice cannot honour, or a value it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value}: {why}")]
pub struct Unsupported {
    pub name: String,
    pub value: String,
    pub why: String,
}

/// Why the start stops.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    #[error("envoyproxy/ratelimit setting not supported: {0}")]
    Unsupported(#[from] Unsupported),
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

/// Variables read for their value only, never honoured, with why ignoring them is safe.
const IGNORED: &[(&str, &str)] = &[
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
    ("MEMCACHE_MAX_IDLE_CONNS", "no Memcached backend"),
    ("MEMCACHE_SRV_REFRESH", "no Memcached backend"),
];

/// Reads the environment of envoyproxy/ratelimit.
pub fn translate(env: &HashMap<String, String>) -> Result<Translation, Unsupported> {
    let mut t = Reader {
        env,
        out: Translation::default(),
    };
    t.listeners()?;
    t.log()?;
    t.tls()?;
    t.rules()?;
    t.backend()?;
    t.behaviour()?;
    t.stats()?;
    t.tracing()?;
    for (name, why) in IGNORED {
        if let Some(v) = env.get(*name) {
            t.out
                .ignored
                .push(((*name).to_owned(), format!("{v}: {why}")));
        }
    }
    t.out.ignored.sort();
    Ok(t.out)
}

/// The settings of the environment. A setting that an envoyproxy/ratelimit variable set
/// gives wins over the same `SLUICE_*` variable (the image's own `SLUICE_SERVER__*` defaults
/// must not undo `GRPC_PORT`); one that only comes from its defaults yields to it, and to a
/// settings file named by [`CONFIG_FILE`] (where `limits.domains` can be set).
pub fn settings(env: &HashMap<String, String>) -> Result<(Settings, Translation), CompatError> {
    let translation = spans_if_built(translate(env)?);
    let defaults = translate(&HashMap::new())?.settings;
    let mut layered = env.clone();
    let file = layered.remove(CONFIG_FILE).map(std::path::PathBuf::from);
    let mut base = HashMap::new();
    for (k, v) in &translation.settings {
        if defaults.iter().any(|(dk, dv)| dk == k && dv == v) {
            base.insert(k.clone(), v.clone());
        } else {
            layered.insert(k.clone(), v.clone());
        }
    }
    let settings = Settings::load_over(base, file.as_deref(), layered, &Overrides::default())?;
    Ok((settings, translation))
}

/// The variable that names a settings file (TOML or YAML) under envoyproxy/ratelimit's
/// environment, read below that environment's own variables.
pub const CONFIG_FILE: &str = "SLUICE_CONFIG_FILE";

/// `translation` without span export when this sluice is built without the `otel` feature:
/// tracing changes no answer, so `TRACING_ENABLED` is then ignored (and logged) rather than
/// stopping a drop-in start.
fn spans_if_built(mut translation: Translation) -> Translation {
    if cfg!(feature = "otel") {
        return translation;
    }
    let before = translation.settings.len();
    translation
        .settings
        .retain(|(k, _)| !k.starts_with("SLUICE_LOG__OTLP_"));
    if translation.settings.len() < before {
        let why = "true: no spans are exported, as this sluice is built without the `otel` feature";
        translation
            .ignored
            .push(("TRACING_ENABLED".to_owned(), why.to_owned()));
        translation.ignored.sort();
    }
    translation
}

struct Reader<'a> {
    env: &'a HashMap<String, String>,
    out: Translation,
}

impl Reader<'_> {
    /// A variable's value, absent when unset or empty.
    fn get(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    fn or<'s>(&'s self, name: &str, default: &'s str) -> &'s str {
        self.get(name).unwrap_or(default)
    }

    fn set(&mut self, key: &str, value: impl Into<String>) {
        self.out
            .settings
            .push((format!("SLUICE_{key}"), value.into()));
    }

    fn unsupported(&self, name: &str, why: &str) -> Unsupported {
        Unsupported {
            name: name.to_owned(),
            value: self.env.get(name).cloned().unwrap_or_default(),
            why: why.to_owned(),
        }
    }

    /// A boolean as Go's strconv.ParseBool reads it; `default` when unset.
    fn flag(&self, name: &str, default: bool) -> Result<bool, Unsupported> {
        match self.get(name) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(_) => Err(self.unsupported(name, "expected true or false")),
        }
    }

    fn duration_ms(&self, name: &str) -> Result<Option<u64>, Unsupported> {
        self.get(name)
            .map(|v| {
                go_duration_ms(v).ok_or_else(|| {
                    self.unsupported(name, "expected a duration such as 10s or 500ms")
                })
            })
            .transpose()
    }

    /// Refuses `name` when it is set (to anything but empty or `false`).
    fn refuse(&self, name: &str, why: &str) -> Result<(), Unsupported> {
        match self.get(name) {
            Some(v) if !matches!(v, "false" | "FALSE" | "False" | "0" | "f" | "F") => {
                Err(self.unsupported(name, why))
            }
            _ => Ok(()),
        }
    }

    fn listeners(&mut self) -> Result<(), Unsupported> {
        self.refuse("GRPC_UDS", "sluice serves gRPC on TCP only")?;
        for (host, port, dh, dp, key) in [
            (
                "GRPC_HOST",
                "GRPC_PORT",
                "0.0.0.0",
                "8081",
                "SERVER__GRPC_LISTEN",
            ),
            ("HOST", "PORT", "0.0.0.0", "8080", "SERVER__ADMIN_LISTEN"),
            (
                "DEBUG_HOST",
                "DEBUG_PORT",
                "0.0.0.0",
                "6070",
                "DEBUG__LISTEN",
            ),
        ] {
            let addr = self.address(host, port, dh, dp)?;
            self.set(key, addr);
        }
        Ok(())
    }

    /// `host` and `port` as a socket address (`localhost` is 127.0.0.1).
    fn address(&self, host: &str, port: &str, dh: &str, dp: &str) -> Result<String, Unsupported> {
        let ip = ip(self.or(host, dh)).ok_or_else(|| {
            self.unsupported(host, "sluice listens on an IP address (or localhost)")
        })?;
        let p: u16 = self
            .or(port, dp)
            .parse()
            .map_err(|_| self.unsupported(port, "expected a port number"))?;
        Ok(std::net::SocketAddr::new(ip, p).to_string())
    }

    fn log(&mut self) -> Result<(), Unsupported> {
        let level = match self.or("LOG_LEVEL", "WARN").to_ascii_lowercase().as_str() {
            // sluice's own debug lines, not those of every library (HTTP/2 frames...).
            "trace" => "info,sluice=trace",
            "debug" => "info,sluice=debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => {
                return Err(self.unsupported(
                    "LOG_LEVEL",
                    "expected trace, debug, info, warn, error, fatal or panic",
                ));
            }
        };
        self.set("LOG__LEVEL", level);
        match self.or("LOG_FORMAT", "text") {
            "text" => self.set("LOG__FORMAT", "text"),
            "json" => self.set("LOG__FORMAT", "json"),
            _ => return Err(self.unsupported("LOG_FORMAT", "expected text or json")),
        }
        Ok(())
    }

    fn tls(&mut self) -> Result<(), Unsupported> {
        if !self.flag("GRPC_SERVER_USE_TLS", false)? {
            return Ok(());
        }
        for (name, key) in [
            ("GRPC_SERVER_TLS_CERT", "TLS__CERT_FILE"),
            ("GRPC_SERVER_TLS_KEY", "TLS__KEY_FILE"),
        ] {
            let Some(v) = self.get(name).map(str::to_owned) else {
                return Err(self.unsupported(name, "GRPC_SERVER_USE_TLS=true needs it"));
            };
            self.set(key, v);
        }
        if let Some(ca) = self.get("GRPC_CLIENT_TLS_CACERT").map(str::to_owned) {
            self.set("TLS__CLIENT_CA_FILE", ca);
        }
        self.refuse(
            "GRPC_CLIENT_TLS_SAN",
            "sluice checks that a client certificate is signed by the CA, not its SAN",
        )
    }

    fn rules(&mut self) -> Result<(), Unsupported> {
        self.refuse(
            "MERGE_DOMAIN_CONFIG",
            "sluice refuses a domain defined twice",
        )?;
        match self.or("CONFIG_TYPE", "FILE").to_ascii_uppercase().as_str() {
            "FILE" => {
                let root = self
                    .or("RUNTIME_ROOT", "/srv/runtime_data/current")
                    .to_owned();
                let sub = self.or("RUNTIME_SUBDIRECTORY", "").to_owned();
                let app = self.or("RUNTIME_APPDIRECTORY", "config").to_owned();
                let mut path = std::path::PathBuf::from(root);
                for part in [sub, app] {
                    if !part.is_empty() {
                        path.push(part);
                    }
                }
                self.set("RULES__PATHS", path.display().to_string());
            }
            "GRPC_XDS_SOTW" => self.xds()?,
            _ => return Err(self.unsupported("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
        }
        Ok(())
    }

    fn xds(&mut self) -> Result<(), Unsupported> {
        let server = self
            .or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")
            .to_owned();
        self.set("XDS__SERVER", server);
        let node = self.or("CONFIG_GRPC_XDS_NODE_ID", "default").to_owned();
        self.set("XDS__NODE_ID", node);
        for (name, key) in [
            ("CONFIG_GRPC_XDS_NODE_METADATA", "XDS__NODE_METADATA"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "XDS__HEADERS"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "XDS__CERT_FILE"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "XDS__KEY_FILE"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "XDS__CA_FILE"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "XDS__SERVER_NAME"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "XDS__MAX_MESSAGE_BYTES"),
        ] {
            if let Some(v) = self.get(name).map(str::to_owned) {
                self.set(key, v);
            }
        }
        if self.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
            self.set("XDS__TLS", "true");
        }
        if self.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)? {
            self.set("XDS__START_WITHOUT_RULES", "true");
        }
        if let Some(ms) = self.duration_ms("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")? {
            self.set("XDS__RETRY_INITIAL_MS", ms.max(1).to_string());
        }
        if let Some(ms) = self.duration_ms("XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
            self.set("XDS__RETRY_MAX_MS", ms.max(1).to_string());
        }
        Ok(())
    }

    fn backend(&mut self) -> Result<(), Unsupported> {
        match self.or("BACKEND_TYPE", "redis") {
            "redis" => {}
            _ => {
                return Err(self.unsupported(
                    "BACKEND_TYPE",
                    "sluice's backends are memory and Redis, not Memcached",
                ));
            }
        }
        for name in ["MEMCACHE_HOST_PORT", "MEMCACHE_SRV", "MEMCACHE_TLS"] {
            self.refuse(name, "no Memcached backend")?;
        }
        self.refuse("REDIS_PERSECOND", "sluice keeps every limit in one Redis")?;
        self.refuse(
            "REDIS_SENTINEL_AUTH",
            "sluice authenticates to the master only, not to the sentinels",
        )?;
        self.set("LIMITER__BACKEND", "redis");
        let url = self.redis_url()?;
        self.set("REDIS__URL", url);
        self.redis_tls()?;
        if let Some(ms) = self.duration_ms("REDIS_TIMEOUT")? {
            self.set("REDIS__CONNECT_TIMEOUT_MS", ms.max(1).to_string());
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(str::to_owned) {
            self.set("REDIS__PREFIX", prefix);
        }
        Ok(())
    }

    /// `REDIS_URL` (+ `REDIS_SOCKET_TYPE`, `REDIS_TYPE`, `REDIS_AUTH`, `REDIS_TLS`) as one URL.
    fn redis_url(&self) -> Result<String, Unsupported> {
        let url = self.or("REDIS_URL", "/var/run/nutcracker/ratelimit.sock");
        let tls = self.flag("REDIS_TLS", false)?;
        let auth = match self.get("REDIS_AUTH") {
            None => String::new(),
            Some(a) => match a.split_once(':') {
                Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
                None => format!(":{}@", encode(a)),
            },
        };
        let s = if tls { "s" } else { "" };
        let kind = self.or("REDIS_TYPE", "SINGLE").to_ascii_lowercase();
        match kind.as_str() {
            "single" => {
                if self
                    .or("REDIS_SOCKET_TYPE", "unix")
                    .eq_ignore_ascii_case("unix")
                {
                    if tls || !auth.is_empty() {
                        return Err(self.unsupported(
                            "REDIS_SOCKET_TYPE",
                            "sluice takes no TLS or password over a Unix socket",
                        ));
                    }
                    return Ok(format!("unix://{url}"));
                }
                Ok(format!("redis{s}://{auth}{url}"))
            }
            "sentinel" => {
                let mut parts = url.split(',');
                let master = parts.next().unwrap_or_default();
                let sentinels: Vec<&str> = parts.collect();
                if master.is_empty() || sentinels.is_empty() {
                    return Err(self.unsupported(
                        "REDIS_URL",
                        "with REDIS_TYPE=sentinel: <master name>,<sentinel1>,...,<sentinelN>",
                    ));
                }
                Ok(format!(
                    "redis{s}+sentinel://{auth}{}/{master}",
                    sentinels.join(",")
                ))
            }
            "cluster" => Ok(format!("redis{s}+cluster://{auth}{url}")),
            _ => Err(self.unsupported("REDIS_TYPE", "expected single, sentinel or cluster")),
        }
    }

    /// The files of `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`,
    /// and `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: read only with `REDIS_TLS=true`, and the
    /// client certificate only with its key, as envoyproxy/ratelimit reads them.
    fn redis_tls(&mut self) -> Result<(), Unsupported> {
        const FILES: [(&str, &str); 3] = [
            ("REDIS_TLS_CACERT", "REDIS__TLS_CA_FILE"),
            ("REDIS_TLS_CLIENT_CERT", "REDIS__TLS_CERT_FILE"),
            ("REDIS_TLS_CLIENT_KEY", "REDIS__TLS_KEY_FILE"),
        ];
        const SKIP: &str = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION";
        let skip = self.flag(SKIP, false)?;
        if !self.flag("REDIS_TLS", false)? {
            for name in FILES.map(|(name, _)| name).into_iter().chain([SKIP]) {
                if let Some(v) = self.get(name).map(str::to_owned) {
                    let why = format!("{v}: REDIS_TLS is off, so Redis is reached without TLS");
                    self.out.ignored.push((name.to_owned(), why));
                }
            }
            return Ok(());
        }
        let has_pair = self.get(FILES[1].0).is_some() && self.get(FILES[2].0).is_some();
        for (i, (name, key)) in FILES.into_iter().enumerate() {
            let Some(v) = self.get(name).map(str::to_owned) else {
                continue;
            };
            if i == 0 || has_pair {
                self.set(key, v);
            } else {
                let why = format!(
                    "{v}: the client certificate and key go together, and one is not set, so \
                     none is presented to Redis"
                );
                self.out.ignored.push((name.to_owned(), why));
            }
        }
        if skip {
            if self.get(FILES[0].0).is_none() {
                return Err(self.unsupported(
                    SKIP,
                    "sluice skips the name check only for certificates signed by the CA of \
                     REDIS_TLS_CACERT (otherwise any certificate a public CA signed, for any \
                     name, would be accepted); set REDIS_TLS_CACERT",
                ));
            }
            if self
                .or("REDIS_TYPE", "SINGLE")
                .eq_ignore_ascii_case("sentinel")
            {
                return Err(self.unsupported(
                    SKIP,
                    "sluice cannot skip the name check with REDIS_TYPE=sentinel",
                ));
            }
            self.set("REDIS__TLS_SKIP_HOSTNAME_VERIFICATION", "true");
        }
        Ok(())
    }

    fn behaviour(&mut self) -> Result<(), Unsupported> {
        // envoyproxy/ratelimit's counting: fixed windows, every cost added even past the
        // limit; STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT keeps denied costs out
        // (docs/token-budgets.md).
        self.set("LIMITS__DEFAULT_ALGORITHM", "fixed_window");
        let charge = if self.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)? {
            "admitted"
        } else {
            "always"
        };
        self.set("LIMITS__DEFAULT_CHARGE", charge);
        for (name, key) in [
            ("SHADOW_MODE", "RULES__SHADOW_MODE"),
            ("QUOTA_MODE", "LIMITS__QUOTA_MODE"),
            ("RESPONSE_DYNAMIC_METADATA", "RESPONSE__DYNAMIC_METADATA"),
        ] {
            if self.flag(name, false)? {
                self.set(key, "true");
            }
        }
        if self.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            self.set("RESPONSE__HEADERS", "true");
            // envoyproxy/ratelimit adds no Retry-After.
            self.set("RESPONSE__RETRY_AFTER", "false");
            for (name, key) in [
                ("LIMIT_LIMIT_HEADER", "RESPONSE__LIMIT_HEADER"),
                ("LIMIT_REMAINING_HEADER", "RESPONSE__REMAINING_HEADER"),
                ("LIMIT_RESET_HEADER", "RESPONSE__RESET_HEADER"),
            ] {
                if let Some(v) = self.get(name).map(str::to_owned) {
                    self.set(key, v);
                }
            }
        }
        if let Some(ratio) = self.get("NEAR_LIMIT_RATIO").map(str::to_owned) {
            self.set("METRICS__NEAR_LIMIT_RATIO", ratio);
        }
        if let Some(bytes) = self.get("LOCAL_CACHE_SIZE_IN_BYTES") {
            let bytes: u64 = bytes.parse().map_err(|_| {
                self.unsupported("LOCAL_CACHE_SIZE_IN_BYTES", "expected a number of bytes")
            })?;
            if bytes > 0 {
                // sluice's deny cache holds entries, not bytes: one per 128 bytes asked for.
                self.set("REDIS__DENY_CACHE_SIZE", (bytes / 128).max(1).to_string());
            }
        }
        Ok(())
    }

    fn stats(&mut self) -> Result<(), Unsupported> {
        if self.flag("DISABLE_STATS", false)? {
            return Ok(());
        }
        let statsd = self.flag("USE_STATSD", true)?;
        let dog = self.flag("USE_DOG_STATSD", false)?;
        let prometheus = self.flag("USE_PROMETHEUS", false)?;
        if [statsd, dog, prometheus].iter().filter(|on| **on).count() > 1 {
            let name = if prometheus {
                "USE_PROMETHEUS"
            } else {
                "USE_DOG_STATSD"
            };
            return Err(self.unsupported(
                name,
                "only one of USE_STATSD (on by default), USE_DOG_STATSD and USE_PROMETHEUS may be on, as in envoyproxy/ratelimit",
            ));
        }
        if statsd || dog {
            self.refuse("USE_DOG_STATSD_MOGRIFIERS", "stat names are not rewritten")?;
            let host = self.or("STATSD_HOST", "localhost").to_owned();
            let port = self.or("STATSD_PORT", "8125").to_owned();
            self.set("STATSD__ADDRESS", format!("{host}:{port}"));
            if dog {
                self.set("STATSD__DOGSTATSD", "true");
            } else {
                // envoyproxy/ratelimit's plain statsd sink speaks TCP; DogStatsD, UDP.
                self.set("STATSD__PROTOCOL", "tcp");
            }
            if let Some(tags) = self.get("EXTRA_TAGS").map(str::to_owned) {
                self.set("STATSD__TAGS", tags);
            }
            if let Some(ms) = self.duration_ms("STATS_FLUSH_INTERVAL")? {
                self.set("STATSD__FLUSH_INTERVAL_MS", ms.max(1).to_string());
            }
        }
        if prometheus {
            let addr = self.or("PROMETHEUS_ADDR", ":9090").to_owned();
            let (host, port) = addr
                .rsplit_once(':')
                .ok_or_else(|| self.unsupported("PROMETHEUS_ADDR", "expected [host]:port"))?;
            let host = if host.is_empty() { "0.0.0.0" } else { host };
            let listen = ip(host)
                .zip(port.parse::<u16>().ok())
                .map(|(ip, port)| std::net::SocketAddr::new(ip, port).to_string())
                .ok_or_else(|| self.unsupported("PROMETHEUS_ADDR", "expected [ip]:port"))?;
            self.set("RATELIMIT_METRICS__LISTEN", listen);
            if let Some(path) = self.get("PROMETHEUS_PATH").map(str::to_owned) {
                self.set("RATELIMIT_METRICS__PATH", path);
            }
            if let Some(file) = self.get("PROMETHEUS_MAPPER_YAML").map(str::to_owned) {
                self.set("RATELIMIT_METRICS__MAPPER_FILE", file);
            }
        } else if let Some(file) = self.env.get("PROMETHEUS_MAPPER_YAML") {
            self.out.ignored.push((
                "PROMETHEUS_MAPPER_YAML".to_owned(),
                format!("{file}: USE_PROMETHEUS is off"),
            ));
        }
        Ok(())
    }

    /// `TRACING_ENABLED`, `TRACING_EXPORTER_PROTOCOL` (http by default) and the collector
    /// as that project's OpenTelemetry exporters read it: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// as given, else `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` added over HTTP), else
    /// the local collector.
    fn tracing(&mut self) -> Result<(), Unsupported> {
        let ratio = self.sampling_rate()?;
        if !self.flag("TRACING_ENABLED", false)? {
            for name in TRACING_NAMES.iter().chain(&["TRACING_SAMPLING_RATE"]) {
                if let Some(v) = self.get(name) {
                    let why = format!("{v}: no spans are exported (TRACING_ENABLED is not true)");
                    self.out.ignored.push(((*name).to_owned(), why));
                }
            }
            return Ok(());
        }
        // ratelimit's default name, so that traces keep the service they were filed under.
        let service = self.or("TRACING_SERVICE_NAME", "RateLimit").to_owned();
        self.set("LOG__OTLP_SERVICE_NAME", service);
        for (name, key) in [
            ("TRACING_SERVICE_NAMESPACE", "LOG__OTLP_SERVICE_NAMESPACE"),
            (
                "TRACING_SERVICE_INSTANCE_ID",
                "LOG__OTLP_SERVICE_INSTANCE_ID",
            ),
        ] {
            if let Some(v) = self.get(name) {
                let v = v.to_owned();
                self.set(key, v);
            }
        }
        self.set("LOG__OTLP_SAMPLING_RATIO", ratio.to_string());
        let protocol = self
            .or("TRACING_EXPORTER_PROTOCOL", "http")
            .to_ascii_lowercase();
        let http = match protocol.as_str() {
            "http" => true,
            "grpc" => false,
            _ => return Err(self.unsupported("TRACING_EXPORTER_PROTOCOL", "expected http or grpc")),
        };
        let endpoint = match (
            self.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            self.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(traces), _) => with_scheme(traces),
            (None, Some(base)) if http => {
                format!("{}/v1/traces", with_scheme(base).trim_end_matches('/'))
            }
            (None, Some(base)) => with_scheme(base),
            (None, None) if http => "http://localhost:4318/v1/traces".to_owned(),
            (None, None) => "http://localhost:4317".to_owned(),
        };
        self.set("LOG__OTLP_ENDPOINT", endpoint);
        self.set("LOG__OTLP_PROTOCOL", if http { "http" } else { "grpc" });
        Ok(())
    }
}

/// The service-naming variables of tracing, listed as ignored when tracing is off.
const TRACING_NAMES: [&str; 3] = [
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
];

impl Reader<'_> {
    /// `TRACING_SAMPLING_RATE` (default 1) as ratelimit applies it: a number, where 1 and
    /// above keep every trace and 0 and below none. Not a number (or NaN) is refused.
    fn sampling_rate(&self) -> Result<f64, Unsupported> {
        let Some(text) = self.get("TRACING_SAMPLING_RATE") else {
            return Ok(1.0);
        };
        match text.trim().parse::<f64>() {
            Ok(rate) if !rate.is_nan() => Ok(rate.clamp(0.0, 1.0)),
            _ => Err(self.unsupported(
                "TRACING_SAMPLING_RATE",
                "expected a number from 0 to 1, such as 0.1",
            )),
        }
    }
}

/// `endpoint` with `http://` in front when it names no scheme (`collector:4318`).
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}

/// An IP address, `[v6]`, or `localhost` (127.0.0.1).
fn ip(host: &str) -> Option<std::net::IpAddr> {
    if host == "localhost" {
        return Some(std::net::IpAddr::from([127, 0, 0, 1]));
    }
    host.trim_matches(|c| c == '[' || c == ']').parse().ok()
}

/// Percent-encodes what is not unreserved in a URL's user info.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Go duration (`300ms`, `10s`, `1m30s`, `2h`; a bare number is seconds) in milliseconds.
fn go_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return secs.checked_mul(1000);
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(digits);
        let n: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let ms = match unit {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 60e3,
            "h" => 3600e3,
            _ => return None,
        };
        total += n * ms;
        rest = tail;
    }
    Some(total.round() as u64)
}

#[cfg(test)]
mod tests;
