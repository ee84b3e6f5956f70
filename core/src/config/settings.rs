//! Service settings, layered: defaults < settings file < `SLUICE_*` environment < CLI flags.
//!
//! Every key of the settings file is also read from the environment as
//! `SLUICE_<SECTION>__<KEY>` (e.g. `SLUICE_SERVER__GRPC_LISTEN=0.0.0.0:8081`,
//! `SLUICE_RULES__PATHS=/etc/sluice/rules,/etc/sluice/extra.yaml`). Unknown keys are errors.
//! The environment is passed in as a map, so tests never touch the process environment.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::model::{Algorithm, Charge};

mod admin;
mod dropin;
mod input;
mod listen;
mod memcache;
mod ops;
mod redis;
mod rlqs;
mod xds;
pub use admin::AdminSettings;
pub use dropin::{
    DebugSettings, Mogrifier, RatelimitMetricsSettings, StatsdProtocol, StatsdSettings,
};
pub use input::InputSettings;
pub use listen::ListenAddr;
pub use memcache::MemcacheSettings;
pub use ops::{MetricsSettings, ReloadSettings, TlsSettings};
use redis::check_userinfo;

/// The names of the settings in `values` that are 0, in order (for the "must be at least 1"
/// checks of the bounded sections).
fn zero_names<'a>(values: impl IntoIterator<Item = (&'a str, u64)>) -> Vec<&'a str> {
    values
        .into_iter()
        .filter(|(_, v)| *v == 0)
        .map(|(name, _)| name)
        .collect()
}
pub use redis::{GlobalOnError, LeaseMode, OnError, RedisSettings, redacted_url};
pub use rlqs::RlqsSettings;
pub use xds::XdsSettings;

/// All settings.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub log: LogSettings,
    pub rules: RulesSettings,
    pub limiter: LimiterSettings,
    pub limits: LimitsSettings,
    pub input: InputSettings,
    pub memory: MemorySettings,
    pub redis: RedisSettings,
    pub memcache: MemcacheSettings,
    pub response: ResponseSettings,
    pub metrics: MetricsSettings,
    pub reload: ReloadSettings,
    pub tls: TlsSettings,
    pub rlqs: RlqsSettings,
    pub xds: XdsSettings,
    pub statsd: StatsdSettings,
    pub ratelimit_metrics: RatelimitMetricsSettings,
    pub debug: DebugSettings,
    pub admin: AdminSettings,
}

/// `[server]`: listeners and shutdown.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Where the gRPC (h2c) server listens: `ip:port`, or a Unix socket, `unix:/path`.
    pub grpc_listen: ListenAddr,
    /// After SIGTERM/SIGINT, how long in-flight requests may take before the process exits.
    pub shutdown_grace_secs: u64,
    /// Where the admin HTTP server (health, metrics, rules dump, `/json`) listens.
    pub admin_listen: SocketAddr,
    /// After SIGTERM/SIGINT, how long to keep serving with readiness failed before the gRPC
    /// server stops accepting (time for load balancers to notice).
    pub drain_delay_secs: u64,
    /// Worker threads of the runtime; 0: one per CPU the process may use.
    pub worker_threads: usize,
    /// Each gRPC stream (request) on a task of its own, spread over the workers, instead of
    /// on its connection's task (src/transport/driven.rs).
    pub stream_tasks: bool,
    /// A gRPC connection that has not sent its whole HTTP/2 preface (the magic and a SETTINGS
    /// frame) this long after it was accepted (over TLS: after its handshake) is closed;
    /// 0: no limit.
    pub preface_timeout_ms: u64,
    /// A gRPC connection with no request open for this long (since it was opened or since its
    /// last request ended) is closed with a GOAWAY; 0: never.
    pub idle_timeout_secs: u64,
    /// gRPC connections open at once; one more is accepted and closed at once, while those
    /// open keep being served. 0: no cap.
    pub max_connections: usize,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            grpc_listen: ListenAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 8081))),
            shutdown_grace_secs: 10,
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            drain_delay_secs: 0,
            worker_threads: 0,
            stream_tasks: false,
            preface_timeout_ms: 5_000,
            idle_timeout_secs: 300,
            max_connections: 10_000,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A `tracing` filter (`info`, `sluice=debug`, ...); `RUST_LOG` wins when set. An
    /// invalid or empty filter stops the start (exit 64). A filter that names no `notify`
    /// target gets `notify=warn` (the file watcher's library) added.
    pub level: String,
    /// Export spans over OTLP to this collector (`http://host:4317` for gRPC,
    /// `http://host:4318` for HTTP, where `/v1/traces` is added to a URL without a path;
    /// `https://` for TLS, see `otlp_ca_file`);
    /// needs the `otel` cargo feature.
    pub otlp_endpoint: Option<String>,
    /// How spans reach `otlp_endpoint`.
    pub otlp_protocol: OtlpProtocol,
    /// With an `https://` endpoint: the CA (PEM) the collector's certificate must chain to;
    /// unset: `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`, else `OTEL_EXPORTER_OTLP_CERTIFICATE`,
    /// else the system's roots.
    pub otlp_ca_file: Option<PathBuf>,
    /// With an `https://` endpoint: the client certificate (PEM) sluice presents, with
    /// `otlp_key_file`; unset: `OTEL_EXPORTER_OTLP_[TRACES_]CLIENT_CERTIFICATE`.
    pub otlp_cert_file: Option<PathBuf>,
    /// The key of `otlp_cert_file`; unset: `OTEL_EXPORTER_OTLP_[TRACES_]CLIENT_KEY`.
    pub otlp_key_file: Option<PathBuf>,
    /// The exported spans' `service.name` resource attribute.
    pub otlp_service_name: String,
    /// The exported spans' `service.namespace` resource attribute; none when unset.
    pub otlp_service_namespace: Option<String>,
    /// The exported spans' `service.instance.id` resource attribute; none when unset.
    pub otlp_service_instance_id: Option<String>,
    /// The share of traces exported, 0.0 to 1.0, chosen by trace id; spans inside a trace
    /// follow its root's choice (each request starts its own trace).
    pub otlp_sampling_ratio: f64,
}

/// The transport of OTLP span export.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    /// OTLP/gRPC (a collector's port 4317).
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, POSTed to the endpoint (a collector's port 4318).
    Http,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            format: LogFormat::Text,
            level: "info".to_owned(),
            otlp_endpoint: None,
            otlp_protocol: OtlpProtocol::Grpc,
            otlp_ca_file: None,
            otlp_cert_file: None,
            otlp_key_file: None,
            otlp_service_name: "sluice".to_owned(),
            otlp_service_namespace: None,
            otlp_service_instance_id: None,
            otlp_sampling_ratio: 1.0,
        }
    }
}

/// `[rules]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RulesSettings {
    /// Rules files or directories; empty = the embedded demo rules.
    pub paths: Vec<PathBuf>,
    /// Global shadow mode: compute everything, but always answer OK overall.
    pub shadow_mode: bool,
    /// A domain defined in several documents or files is one domain: their top-level
    /// descriptors are merged (one defined twice is still an error). Off: a domain defined
    /// twice is an error.
    pub merge_domains: bool,
}

/// Which backend keeps limiter state.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Memory,
    Redis,
    /// Fixed windows only, counted with `INCR` in Memcached (envoyproxy/ratelimit's
    /// `BACKEND_TYPE=memcache`).
    Memcache,
}

/// `[limiter]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimiterSettings {
    pub backend: Backend,
    /// The memory backend's state is written to this file (a snapshot, replaced atomically)
    /// every `persist_interval_ms` and at shutdown, and read back at start; none: not kept.
    pub persist: Option<PathBuf>,
    /// How often the snapshot is written: a crash loses at most this much of the decisions.
    pub persist_interval_ms: u64,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        LimiterSettings {
            backend: Backend::Memory,
            persist: None,
            persist_interval_ms: 1_000,
        }
    }
}

impl LimiterSettings {
    fn check(&self) -> Result<(), String> {
        let Some(path) = &self.persist else {
            return Ok(());
        };
        if self.backend != Backend::Memory {
            return Err(format!(
                "limiter.persist ({}) keeps the memory backend's state: it needs limiter.backend = memory (Redis keeps its own)",
                path.display()
            ));
        }
        if path.as_os_str().is_empty() {
            return Err("limiter.persist must name a file".into());
        }
        if self.persist_interval_ms == 0 {
            return Err("limiter.persist_interval_ms must be at least 1".into());
        }
        Ok(())
    }
}

/// `[limits]`: defaults of the limits in the rules files.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSettings {
    /// The algorithm of a limit without `algorithm` (see docs/algorithms.md).
    pub default_algorithm: Algorithm,
    /// Whether a denied cost is charged, for a limit without `charge` (docs/token-budgets.md).
    pub default_charge: Charge,
    /// Per domain (the key), the defaults of its limits, whatever their source (files or xDS):
    /// `[limits.domains."ai-gateway-quota"]` with `charge` and `algorithm`.
    pub domains: BTreeMap<String, DomainLimits>,
    /// Global quota mode, as envoyproxy/ratelimit's `QUOTA_MODE`: every descriptor with limits
    /// (a rule's, or a client's override) is a quota-mode one, so a request is denied only when
    /// all of them are over the limit; a shadow-mode rule's counts as one that never is.
    pub quota_mode: bool,
}

/// `[limits.domains."D"]`: the defaults of domain D's limits; unset keys take the global ones.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct DomainLimits {
    /// The algorithm of a limit of the domain without `algorithm`.
    pub algorithm: Option<Algorithm>,
    /// Whether a denied cost is charged, for a limit of the domain without `charge`.
    pub charge: Option<Charge>,
    /// `global`: every limit of the domain is counted once across regions (as `scope:
    /// global` on each); `local` (the default): as each limit says.
    pub scope: Option<crate::config::model::Scope>,
}

/// `[memory]`: the in-process backend.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySettings {
    /// At most this many keys are held; see the memory backend for what happens when full.
    pub max_keys: usize,
    /// How often drained entries are swept out.
    pub sweep_interval_secs: u64,
}

impl Default for MemorySettings {
    fn default() -> Self {
        MemorySettings {
            max_keys: 1_000_000,
            sweep_interval_secs: 10,
        }
    }
}

/// `[response]`: optional parts of the answer.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ResponseSettings {
    /// Add `RateLimit-Limit/-Remaining/-Reset` to `response_headers_to_add`.
    pub headers: bool,
    pub limit_header: String,
    pub remaining_header: String,
    pub reset_header: String,
    /// With `headers`, also add `Retry-After` when over the limit.
    pub retry_after: bool,
    /// Echo the request (domain, descriptors, hits) in `dynamic_metadata`.
    pub dynamic_metadata: bool,
}

impl Default for ResponseSettings {
    fn default() -> Self {
        ResponseSettings {
            headers: false,
            limit_header: "RateLimit-Limit".to_owned(),
            remaining_header: "RateLimit-Remaining".to_owned(),
            reset_header: "RateLimit-Reset".to_owned(),
            retry_after: true,
            dynamic_metadata: false,
        }
    }
}

/// Settings given on the command line; `None` leaves the lower layers' value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub rules: Vec<PathBuf>,
    pub backend: Option<Backend>,
    pub redis_url: Option<String>,
    pub grpc_listen: Option<ListenAddr>,
    pub log_format: Option<LogFormat>,
    pub admin_listen: Option<SocketAddr>,
}

/// A settings error, naming the layer it came from when it can.
#[derive(Debug, thiserror::Error)]
#[error("invalid settings: {0}")]
pub struct SettingsError(#[from] config::ConfigError);

impl Settings {
    /// Builds the settings from every layer. `env` is the process environment (or a test map);
    /// only its `SLUICE_*` variables are read.
    pub fn load(
        file: Option<&Path>,
        env: HashMap<String, String>,
        cli: &Overrides,
    ) -> Result<Settings, SettingsError> {
        Settings::load_over(HashMap::new(), file, env, cli)
    }

    /// As [`Settings::load`], over a layer of defaults given as `SLUICE_*` variables (`base`),
    /// which the file, the environment and the flags all override.
    pub fn load_over(
        base: HashMap<String, String>,
        file: Option<&Path>,
        env: HashMap<String, String>,
        cli: &Overrides,
    ) -> Result<Settings, SettingsError> {
        let mut builder = config::Config::builder();
        if !base.is_empty() {
            builder = builder.add_source(env_source(base));
        }
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        builder = builder.add_source(env_source(env));
        builder = apply_overrides(builder, cli)?;
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.check()?;
        Ok(settings)
    }

    /// Checks what deserializing cannot.
    fn check(&self) -> Result<(), config::ConfigError> {
        let ratio = self.metrics.near_limit_ratio;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(config::ConfigError::Message(format!(
                "metrics.near_limit_ratio must be in (0, 1], got {ratio}"
            )));
        }
        let m = &self.metrics;
        if !m.limitador
            && (m.limitador_labels_file.is_some() || m.limitador_labels_default.is_some())
        {
            return Err(config::ConfigError::Message(
                "metrics.limitador_labels_file and metrics.limitador_labels_default label \
                 limitador's series: they need metrics.limitador = true"
                    .to_owned(),
            ));
        }
        let sampling = self.log.otlp_sampling_ratio;
        if !(0.0..=1.0).contains(&sampling) {
            return Err(config::ConfigError::Message(format!(
                "log.otlp_sampling_ratio must be in [0, 1], got {sampling}"
            )));
        }
        if self.log.otlp_service_name.trim().is_empty() {
            return Err(config::ConfigError::Message(
                "log.otlp_service_name must not be empty".into(),
            ));
        }
        self.input.check().map_err(config::ConfigError::Message)?;
        self.rlqs.check().map_err(config::ConfigError::Message)?;
        self.xds
            .check(&self.rules.paths)
            .map_err(config::ConfigError::Message)?;
        self.statsd.check().map_err(config::ConfigError::Message)?;
        self.admin.check().map_err(config::ConfigError::Message)?;
        self.limiter.check().map_err(config::ConfigError::Message)?;
        if self.limiter.backend == Backend::Memcache {
            self.memcache
                .check()
                .map_err(config::ConfigError::Message)?;
            self.fixed_windows_only()
                .map_err(config::ConfigError::Message)?;
        }
        if self.limiter.backend == Backend::Redis {
            check_userinfo(&self.redis.url).map_err(config::ConfigError::Message)?;
            if let Some(url) = &self.redis.per_second_url {
                check_userinfo(url).map_err(config::ConfigError::Message)?;
            }
            self.redis
                .check_tls()
                .map_err(config::ConfigError::Message)?;
            self.redis
                .check_wait()
                .map_err(config::ConfigError::Message)?;
            self.redis
                .check_sentinel()
                .and_then(|()| self.redis.check_leases())
                .and_then(|()| self.redis.check_global())
                .map_err(config::ConfigError::Message)?;
        }
        let tls = &self.tls;
        if tls.cert_file.is_some() != tls.key_file.is_some()
            || (tls.client_ca_file.is_some() && tls.cert_file.is_none())
        {
            return Err(config::ConfigError::Message(
                "tls: cert_file and key_file go together, and client_ca_file needs them".into(),
            ));
        }
        if tls.client_san.is_some() && tls.client_ca_file.is_none() {
            return Err(config::ConfigError::Message(
                "tls.client_san needs tls.client_ca_file (only a verified client certificate has names to check)".into(),
            ));
        }
        Ok(())
    }
}

type Builder = config::ConfigBuilder<config::builder::DefaultState>;

fn apply_overrides(mut b: Builder, cli: &Overrides) -> Result<Builder, config::ConfigError> {
    if !cli.rules.is_empty() {
        let paths: Vec<String> = cli.rules.iter().map(|p| p.display().to_string()).collect();
        b = b.set_override("rules.paths", paths)?;
    }
    if let Some(backend) = cli.backend {
        let name = match backend {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::Memcache => "memcache",
        };
        b = b.set_override("limiter.backend", name)?;
    }
    if let Some(url) = &cli.redis_url {
        b = b.set_override("redis.url", url.as_str())?;
    }
    if let Some(addr) = &cli.grpc_listen {
        b = b.set_override("server.grpc_listen", addr.to_string())?;
    }
    if let Some(addr) = cli.admin_listen {
        b = b.set_override("server.admin_listen", addr.to_string())?;
    }
    if let Some(format) = cli.log_format {
        let name = match format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        b = b.set_override("log.format", name)?;
    }
    Ok(b)
}

impl Settings {
    /// With `limiter.backend = "memcache"`, the default algorithms must be fixed windows:
    /// the limits that name none, and clients' overrides, take them.
    fn fixed_windows_only(&self) -> Result<(), String> {
        let why = "the memcache backend (limiter.backend) keeps fixed windows only";
        if self.limits.default_algorithm != Algorithm::FixedWindow {
            return Err(format!(
                "limits.default_algorithm is {}: {why}; set it to fixed_window",
                self.limits.default_algorithm.as_str()
            ));
        }
        for (domain, d) in &self.limits.domains {
            if let Some(a) = d.algorithm.filter(|a| *a != Algorithm::FixedWindow) {
                return Err(format!(
                    "limits.domains.\"{domain}\".algorithm is {}: {why}",
                    a.as_str()
                ));
            }
        }
        Ok(())
    }
}

/// `SLUICE_<SECTION>__<KEY>` variables of `env` as a settings source.
fn env_source(env: HashMap<String, String>) -> config::Environment {
    config::Environment::with_prefix("SLUICE")
        .prefix_separator("_")
        .separator("__")
        .list_separator(",")
        .with_list_parse_key("rules.paths")
        .try_parsing(true)
        .source(Some(env))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment of `(name, value)` pairs.
    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_wait_for_replicas_must_fit_in_the_request_time_out() {
        let with = |wait: &str| {
            Settings::load(
                None,
                env(&[
                    ("SLUICE_LIMITER__BACKEND", "redis"),
                    ("SLUICE_REDIS__TIMEOUT_MS", "100"),
                    ("SLUICE_REDIS__WAIT_REPLICAS", "1"),
                    ("SLUICE_REDIS__WAIT_TIMEOUT_MS", wait),
                ]),
                &Overrides::default(),
            )
        };
        let message = with("100").expect_err("refused").to_string();
        assert!(
            message.contains("redis.wait_timeout_ms (100) must be below redis.timeout_ms (100)"),
            "{message}"
        );
        let settings = with("60").expect("accepted");
        assert_eq!(
            (settings.redis.wait_replicas, settings.redis.wait_timeout_ms),
            (1, 60)
        );
    }

    #[test]
    fn defaults_without_any_layer() {
        let s = Settings::load(None, HashMap::new(), &Overrides::default()).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.server.grpc_listen.to_string(), "127.0.0.1:8081");
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.toml");
        std::fs::write(
            &file,
            "[server]\ngrpc_listen = \"127.0.0.1:9000\"\n[memory]\nmax_keys = 5\n[log]\nformat = \"json\"\n",
        )
        .unwrap();
        let env = env(&[
            ("SLUICE_MEMORY__MAX_KEYS", "7"),
            ("SLUICE_RULES__PATHS", "a.yaml,b"),
            ("SLUICE_LIMITER__BACKEND", "redis"),
            ("SLUICE_REDIS__ON_ERROR", "local"),
            ("SLUICE_REDIS__URL", "redis://env:1"),
            ("SLUICE_LIMITS__DEFAULT_ALGORITHM", "token_bucket"),
            ("SLUICE_LIMITS__QUOTA_MODE", "true"),
            ("OTHER", "ignored"),
        ]);
        let cli = Overrides {
            backend: Some(Backend::Memory),
            redis_url: Some("redis://cli:2".to_owned()),
            ..Overrides::default()
        };
        let s = Settings::load(Some(&file), env, &cli).unwrap();
        assert_eq!(s.server.grpc_listen.tcp().map(|a| a.port()), Some(9000));
        assert_eq!(s.memory.max_keys, 7);
        assert_eq!(s.log.format, LogFormat::Json);
        assert_eq!(
            s.rules.paths,
            vec![PathBuf::from("a.yaml"), PathBuf::from("b")]
        );
        assert_eq!(s.limiter.backend, Backend::Memory);
        assert_eq!(s.redis.on_error, OnError::Local);
        assert_eq!(s.redis.url, "redis://cli:2");
        assert_eq!(s.limits.default_algorithm, Algorithm::TokenBucket);
        assert!(s.limits.quota_mode);
    }

    #[test]
    fn persistence_is_read_and_checked() {
        let s = Settings::load(
            None,
            env(&[
                ("SLUICE_LIMITER__PERSIST", "/var/lib/sluice/state"),
                ("SLUICE_LIMITER__PERSIST_INTERVAL_MS", "250"),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            s.limiter.persist,
            Some(PathBuf::from("/var/lib/sluice/state"))
        );
        assert_eq!(s.limiter.persist_interval_ms, 250);
        assert_eq!(Settings::default().limiter.persist_interval_ms, 1_000);
        for (pairs, says) in [
            (
                &[
                    ("SLUICE_LIMITER__BACKEND", "redis"),
                    ("SLUICE_LIMITER__PERSIST", "/s"),
                ][..],
                "limiter.persist (/s) keeps the memory backend's state",
            ),
            (
                &[
                    ("SLUICE_LIMITER__PERSIST", "/s"),
                    ("SLUICE_LIMITER__PERSIST_INTERVAL_MS", "0"),
                ],
                "limiter.persist_interval_ms must be at least 1",
            ),
        ] {
            let err = Settings::load(None, env(pairs), &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn stream_tasks_is_off_unless_set() {
        assert!(!Settings::default().server.stream_tasks);
        let s = Settings::load(
            None,
            env(&[("SLUICE_SERVER__STREAM_TASKS", "true")]),
            &Overrides::default(),
        )
        .unwrap();
        assert!(s.server.stream_tasks);
    }

    #[test]
    fn input_bounds_read_from_env_and_zero_is_an_error() {
        let s = Settings::load(
            None,
            env(&[
                ("SLUICE_INPUT__MAX_DESCRIPTORS", "3"),
                ("SLUICE_INPUT__MAX_CONCURRENT_STREAMS", "7"),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.input.max_descriptors, 3);
        assert_eq!(s.input.max_concurrent_streams, 7);
        assert_eq!(s.input.max_entries, InputSettings::default().max_entries);
        for key in [
            "MAX_DESCRIPTORS",
            "MAX_ENTRIES",
            "MAX_DOMAIN_BYTES",
            "MAX_KEY_BYTES",
            "MAX_VALUE_BYTES",
            "MAX_REQUEST_BYTES",
            "MAX_CONCURRENT_STREAMS",
        ] {
            let zero = env(&[(&format!("SLUICE_INPUT__{key}"), "0")]);
            let err = Settings::load(None, zero, &Overrides::default()).unwrap_err();
            let name = format!("input.{} must be at least 1", key.to_lowercase());
            assert!(err.to_string().contains(&name), "{err}");
        }
        let negative = env(&[("SLUICE_INPUT__MAX_ENTRIES", "-1")]);
        assert!(Settings::load(None, negative, &Overrides::default()).is_err());
    }

    #[test]
    fn debug_output_hides_the_redis_password() {
        let mut s = Settings::default();
        for (url, shown) in [
            ("redis://:s3cret@h:1/0", "redis://:<redacted>@h:1/0"),
            ("rediss://u:s3cret@h:1", "rediss://u:<redacted>@h:1"),
            (
                "redis+sentinel://u:s3c@r/et@a:1,b:2/m",
                "redis+sentinel://u:<redacted>@a:1,b:2/m",
            ),
            (
                "redis+cluster://s3cret@a:1",
                "redis+cluster://:<redacted>@a:1",
            ),
            ("redis://h:1", "redis://h:1"),
        ] {
            s.redis.url = url.to_owned();
            let debug = format!("{s:?} {:#?}", s.redis);
            assert!(!debug.contains("s3c"), "{debug}");
            assert!(debug.contains(shown), "{debug}");
        }
    }

    #[test]
    fn a_slash_in_a_sentinel_password_is_refused_without_showing_it() {
        for url in [
            "redis+sentinel://:top/secret@a:1/m",
            "rediss+cluster://u:top/secret@a:1,b:2",
        ] {
            let env = env(&[
                ("SLUICE_LIMITER__BACKEND", "redis"),
                ("SLUICE_REDIS__URL", url),
            ]);
            let err = Settings::load(None, env, &Overrides::default()).unwrap_err();
            let err = err.to_string();
            assert!(err.contains("must not contain '/'"), "{err}");
            assert!(!err.contains("top"), "{err}");
        }
        for url in [
            "redis+sentinel://:secret@a:1,b:2/m",
            "redis+cluster://a:1",
            "redis://:top%2Fsecret@a:1",
        ] {
            let env = env(&[
                ("SLUICE_LIMITER__BACKEND", "redis"),
                ("SLUICE_REDIS__URL", url),
            ]);
            assert!(
                Settings::load(None, env, &Overrides::default()).is_ok(),
                "{url}"
            );
        }
    }

    #[test]
    fn the_global_settings_are_read_and_an_error_names_its_key() {
        let load = |pairs: &[(&str, &str)]| {
            let mut e = env(&[
                ("SLUICE_LIMITER__BACKEND", "redis"),
                ("SLUICE_REDIS__GLOBAL_URL", "redis://home:6379"),
            ]);
            e.extend(env(pairs));
            Settings::load(None, e, &Overrides::default()).map_err(|e| e.to_string())
        };
        let s = load(&[
            ("SLUICE_REDIS__REGION", "eu-west.1"),
            ("SLUICE_REDIS__GLOBAL_ON_ERROR", "share"),
            ("SLUICE_REDIS__GLOBAL_SHARE_PERCENT", "5"),
        ])
        .unwrap();
        assert_eq!(s.redis.global_url.as_deref(), Some("redis://home:6379"));
        assert_eq!(s.redis.region.as_deref(), Some("eu-west.1"));
        assert_eq!(s.redis.global_on_error, GlobalOnError::Share);
        assert_eq!(s.redis.global_share_percent, 5);
        assert_eq!(
            (s.redis.global_share_ms, s.redis.global_lease_ms),
            (2_000, 10_000)
        );
        let region = ("SLUICE_REDIS__REGION", "east");
        for (pairs, says) in [
            (&[][..], "redis.region must name this region"),
            (&[("SLUICE_REDIS__REGION", "a b")], "redis.region"),
            (
                &[region, ("SLUICE_REDIS__GLOBAL_SHARE_PERCENT", "0")],
                "redis.global_share_percent",
            ),
            (
                &[region, ("SLUICE_REDIS__GLOBAL_LEASE_MS", "10")],
                "redis.global_lease_ms",
            ),
            (
                &[region, ("SLUICE_REDIS__GLOBAL_SHARE_MS", "20000")],
                "redis.global_share_ms",
            ),
            (
                &[region, ("SLUICE_REDIS__GLOBAL_ON_ERROR", "allow")],
                "global_on_error",
            ),
        ] {
            let err = load(pairs).unwrap_err();
            assert!(err.contains(says), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn redis_tls_settings_are_checked_against_each_other_and_the_url() {
        let load = |pairs: &[(&str, &str)]| {
            let mut e = env(&[("SLUICE_LIMITER__BACKEND", "redis")]);
            e.extend(env(pairs));
            Settings::load(None, e, &Overrides::default()).map_err(|e| e.to_string())
        };
        let tls = ("SLUICE_REDIS__URL", "rediss://r:1");
        let ca = ("SLUICE_REDIS__TLS_CA_FILE", "/ca.pem");
        let cert = ("SLUICE_REDIS__TLS_CERT_FILE", "/c.pem");
        let key = ("SLUICE_REDIS__TLS_KEY_FILE", "/k.pem");
        let skip = ("SLUICE_REDIS__TLS_SKIP_HOSTNAME_VERIFICATION", "true");
        let s = load(&[tls, ca, cert, key, skip]).unwrap();
        assert_eq!(s.redis.tls_ca_file, Some(PathBuf::from("/ca.pem")));
        assert!(s.redis.tls_skip_hostname_verification);
        let sentinel = ("SLUICE_REDIS__URL", "rediss+sentinel://a:1/m");
        let s = load(&[sentinel, ca, skip]).unwrap();
        assert!(s.redis.tls_skip_hostname_verification, "with Sentinel too");
        let s = load(&[tls, skip]).unwrap();
        assert!(
            s.redis.tls_skip_hostname_verification && s.redis.tls_ca_file.is_none(),
            "without a CA file: the system's roots, names unchecked"
        );
        for (pairs, says) in [
            (&[ca][..], "need a TLS URL"),
            (&[tls, cert], "tls_cert_file and tls_key_file go together"),
            (
                &[("SLUICE_REDIS__SENTINEL_PASSWORD", "s")],
                "redis.sentinel_password needs a Sentinel URL",
            ),
            (
                &[
                    ("SLUICE_REDIS__URL", "redis+sentinel://a:1/m"),
                    ("SLUICE_REDIS__SENTINEL_USERNAME", "u"),
                ],
                "redis.sentinel_username needs redis.sentinel_password",
            ),
        ] {
            let err = load(pairs).unwrap_err();
            assert!(err.contains(says), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let typo = env(&[("SLUICE_SERVER__GRPC_LISTN", "127.0.0.1:1")]);
        assert!(Settings::load(None, typo, &Overrides::default()).is_err());
        let bad = env(&[("SLUICE_SERVER__GRPC_LISTEN", "not an address")]);
        let err = Settings::load(None, bad, &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("grpc_listen"), "{err}");
        let ratio = env(&[("SLUICE_METRICS__NEAR_LIMIT_RATIO", "1.5")]);
        let err = Settings::load(None, ratio, &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("near_limit_ratio"), "{err}");
        for bad in ["1.5", "-0.1", "NaN"] {
            let ratio = env(&[("SLUICE_LOG__OTLP_SAMPLING_RATIO", bad)]);
            let err = Settings::load(None, ratio, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("log.otlp_sampling_ratio"), "{err}");
        }
        let bad = env(&[("SLUICE_LIMITS__DEFAULT_ALGORITHM", "gcra")]);
        let err = Settings::load(None, bad, &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("token_bucket"), "{err}");
    }

    /// The memcache backend keeps fixed windows only: a default algorithm of another kind
    /// stops the start, naming the setting; its servers are checked.
    #[test]
    fn memcache_needs_fixed_window_defaults_and_servers() {
        let load = |pairs: &[(&str, &str)]| {
            let mut all = vec![("SLUICE_LIMITER__BACKEND", "memcache")];
            all.extend_from_slice(pairs);
            Settings::load(None, env(&all), &Overrides::default())
        };
        let err = load(&[]).unwrap_err().to_string();
        assert!(err.contains("limits.default_algorithm is funnel"), "{err}");
        let fixed = ("SLUICE_LIMITS__DEFAULT_ALGORITHM", "fixed_window");
        let s = load(&[fixed, ("SLUICE_MEMCACHE__SERVERS", "a:1,b:2")]).unwrap();
        assert_eq!(s.limiter.backend, Backend::Memcache);
        assert_eq!(s.memcache.server_list(), ["a:1", "b:2"]);
        let err = load(&[fixed, ("SLUICE_MEMCACHE__SERVERS", "a")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("memcache.servers"), "{err}");
        let s = load(&[fixed, ("SLUICE_REDIS__PER_SECOND_URL", "redis://x:1")]).unwrap();
        assert_eq!(
            s.redis.per_second().map(|r| r.url).as_deref(),
            Some("redis://x:1")
        );
    }
}
