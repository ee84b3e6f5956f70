//! limitador-server's command line and environment onto sluice's settings: what `sluice` does
//! when started as `limitador-server` (argv[0]) or with `--limitador-cli`.
//!
//! [`translate`] is a pure function of the arguments and the environment: the `SLUICE_*`
//! settings they mean (with limitador's defaults: gRPC on 0.0.0.0:8081, HTTP on 0.0.0.0:8080,
//! the memory storage), whether to only validate the limits file, and the flags read but
//! without effect (each logged once at start, with why); or the first flag or variable sluice
//! cannot honour, which stops the start with exit 64, naming it. The full table is
//! docs/limitador-compat.md.

use std::collections::HashMap;

use clap::{Arg, ArgAction, ArgMatches, Command, value_parser};

use super::env::{Translation, Unsupported};
use crate::config::settings::{Overrides, Settings};

/// What limitador's command line asks for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Start {
    pub translation: Translation,
    /// `--validate`: check the limits file and exit.
    pub validate: bool,
}

/// Why the command line gives no start.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `--help` or `--version`: print this and exit 0.
    #[error("{0}")]
    Info(String),
    /// A flag clap refuses (unknown, missing LIMITS_FILE, a bad value).
    #[error("{0}")]
    Usage(String),
    #[error("limitador setting not supported: {0}")]
    Unsupported(#[from] Unsupported),
}

/// The snapshot file `disk PATH` keeps in the directory PATH.
pub const DISK_SNAPSHOT: &str = "sluice-counters.snapshot";

fn command() -> Command {
    let arg = |id: &'static str| Arg::new(id).action(ArgAction::Set);
    let flag = |id: &'static str| Arg::new(id).action(ArgAction::SetTrue);
    Command::new("limitador-server")
        .about("sluice, started with limitador-server's command line")
        .version(env!("CARGO_PKG_VERSION"))
        .disable_help_subcommand(true)
        .subcommand_required(false)
        .arg(arg("LIMITS_FILE").index(1))
        .arg(arg("ip").short('b').long("rls-ip"))
        .arg(
            arg("port")
                .short('p')
                .long("rls-port")
                .value_parser(value_parser!(u16)),
        )
        .arg(arg("http_ip").short('B').long("http-ip"))
        .arg(
            arg("http_port")
                .short('P')
                .long("http-port")
                .value_parser(value_parser!(u16)),
        )
        .arg(
            flag("limit_name_in_labels")
                .short('l')
                .long("limit-name-in-labels"),
        )
        .arg(
            arg("custom_metric_labels")
                .short('L')
                .long("custom-metric-labels"),
        )
        .arg(arg("metric_labels_default").long("metric-labels-default"))
        .arg(arg("tracing_endpoint").long("tracing-endpoint"))
        .arg(Arg::new("v").short('v').action(ArgAction::Count))
        .arg(flag("structured_logs").long("structured-logs"))
        .arg(flag("validate").long("validate"))
        .arg(
            arg("rate_limit_headers")
                .short('H')
                .long("rate-limit-headers"),
        )
        .arg(flag("grpc_reflection_service").long("grpc-reflection-service"))
        .arg(flag("limitador_cli").long("limitador-cli").hide(true))
        .subcommand(
            Command::new("memory").arg(
                arg("CACHE_SIZE")
                    .short('c')
                    .long("cache")
                    .value_parser(value_parser!(u64)),
            ),
        )
        .subcommand(
            Command::new("disk")
                .arg(arg("PATH").index(1))
                .arg(arg("OPTIMIZE").long("optimize")),
        )
        .subcommand(Command::new("redis").arg(arg("URL").index(1)))
        .subcommand(
            Command::new("redis_cached")
                .arg(arg("URL").index(1))
                .arg(arg("batch").long("batch-size"))
                .arg(arg("flush").long("flush-period"))
                .arg(arg("max").long("max-cached"))
                .arg(arg("timeout").long("response-timeout")),
        )
        .subcommand(
            Command::new("distributed")
                .arg(arg("NAME").index(1))
                .arg(arg("LISTEN_ADDRESS").index(2))
                .arg(Arg::new("PEER_URLS").index(3).num_args(0..))
                .arg(arg("CACHE_SIZE").short('c').long("cache")),
        )
}

/// Reads limitador's arguments (`args` with argv[0] first) and environment.
pub fn translate(args: &[String], env: &HashMap<String, String>) -> Result<Start, CliError> {
    let matches = command()
        .try_get_matches_from(args)
        .map_err(|e| match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                CliError::Info(e.to_string())
            }
            _ => CliError::Usage(e.to_string()),
        })?;
    let mut r = Reader {
        m: &matches,
        env,
        out: Translation::default(),
    };
    r.limits_file()?;
    r.listeners()?;
    r.storage()?;
    r.behaviour()?;
    r.out.ignored.sort();
    Ok(Start {
        translation: r.out,
        validate: matches.get_flag("validate"),
    })
}

/// The settings limitador's command line means, over the `SLUICE_*` variables of `env` (which
/// set what limitador's flags leave alone).
pub fn settings(start: &Start, env: &HashMap<String, String>) -> Result<Settings, String> {
    let mut layered = env.clone();
    layered.extend(start.translation.settings.iter().cloned());
    Settings::load_over(HashMap::new(), None, layered, &Overrides::default())
        .map_err(|e| e.to_string())
}

struct Reader<'a> {
    m: &'a ArgMatches,
    env: &'a HashMap<String, String>,
    out: Translation,
}

impl Reader<'_> {
    fn env(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A switch variable: on when `1`, as limitador reads it (`true` too).
    fn enabled(&self, name: &str) -> bool {
        matches!(self.env(name), Some("1" | "true"))
    }

    /// A flag's value, else its variable's.
    fn value(&self, id: &str, var: &str) -> Option<String> {
        let flag = self.m.try_get_one::<String>(id).ok().flatten().cloned();
        flag.or_else(|| self.env(var).map(str::to_owned))
    }

    fn set(&mut self, key: &str, value: impl Into<String>) {
        self.out
            .settings
            .push((format!("SLUICE_{key}"), value.into()));
    }

    fn ignore(&mut self, name: &str, why: &str) {
        self.out.ignored.push((name.to_owned(), why.to_owned()));
    }

    fn limits_file(&mut self) -> Result<(), Unsupported> {
        let Some(file) = self.value("LIMITS_FILE", "LIMITS_FILE") else {
            return Err(unsupported(
                "LIMITS_FILE",
                "",
                "the limits file is required",
            ));
        };
        self.set("RULES__PATHS", file);
        Ok(())
    }

    fn listeners(&mut self) -> Result<(), Unsupported> {
        for (ip, port, ip_var, port_var, dp, key) in [
            (
                "ip",
                "port",
                "ENVOY_RLS_HOST",
                "ENVOY_RLS_PORT",
                8081,
                "SERVER__GRPC_LISTEN",
            ),
            (
                "http_ip",
                "http_port",
                "HTTP_API_HOST",
                "HTTP_API_PORT",
                8080,
                "SERVER__ADMIN_LISTEN",
            ),
        ] {
            let host = self
                .value(ip, ip_var)
                .unwrap_or_else(|| "0.0.0.0".to_owned());
            let addr: std::net::IpAddr = match host.as_str() {
                "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
                h => h
                    .parse()
                    .map_err(|_| unsupported(ip_var, h, "sluice listens on an IP address"))?,
            };
            let port = match self.m.get_one::<u16>(port) {
                Some(p) => *p,
                None => match self.env(port_var) {
                    Some(p) => p
                        .parse()
                        .map_err(|_| unsupported(port_var, p, "expected a port number"))?,
                    None => dp,
                },
            };
            self.set(key, std::net::SocketAddr::new(addr, port).to_string());
        }
        // limitador answers its HTTP API (`/check`, `/report`, `/check_and_report`) to anyone;
        // its users' callers rely on that (docs/security.md#the-drop-ins). Left to
        // SLUICE_ADMIN__OPEN_DECISIONS when set.
        if self.env("SLUICE_ADMIN__OPEN_DECISIONS").is_none() {
            self.set("ADMIN__OPEN_DECISIONS", "true");
        }
        Ok(())
    }

    fn storage(&mut self) -> Result<(), Unsupported> {
        match self.m.subcommand() {
            Some(("memory", sub)) => {
                self.set("LIMITER__BACKEND", "memory");
                if let Some(size) = sub.get_one::<u64>("CACHE_SIZE") {
                    self.set("MEMORY__MAX_KEYS", size.to_string());
                }
            }
            Some(("redis", sub)) => self.redis(sub.get_one::<String>("URL").cloned(), "redis")?,
            Some(("redis_cached", sub)) => {
                self.redis(sub.get_one::<String>("URL").cloned(), "redis_cached")?;
                let flag = |id: &str| sub.get_one::<String>(id).cloned();
                self.leases(
                    [
                        ("--flush-period", flag("flush")),
                        ("--response-timeout", flag("timeout")),
                    ],
                    [
                        ("--batch-size", flag("batch")),
                        ("--max-cached", flag("max")),
                    ],
                )?;
            }
            Some(("disk", sub)) => self.disk(sub)?,
            Some(("distributed", _)) => {
                return Err(unsupported(
                    "distributed",
                    "",
                    "limitador's CRDT counters replicated between its own peers have no sluice \
                     counterpart (each replica deciding from its own memory would multiply every \
                     limit by their number): share counters through Redis (redis URL, or \
                     redis_cached URL for leases)",
                ));
            }
            _ => match self.env("REDIS_URL").map(str::to_owned) {
                Some(url) => {
                    self.set("LIMITER__BACKEND", "redis");
                    self.set("REDIS__URL", url);
                    if self.enabled("REDIS_LOCAL_CACHE_ENABLED") {
                        let var = |name: &str| self.env(name).map(str::to_owned);
                        let flush = var("REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS");
                        let batch = var("REDIS_LOCAL_CACHE_BATCH_SIZE");
                        self.leases(
                            [
                                ("REDIS_LOCAL_CACHE_FLUSHING_PERIOD_MS", flush),
                                ("--response-timeout", None),
                            ],
                            [
                                ("REDIS_LOCAL_CACHE_BATCH_SIZE", batch),
                                ("--max-cached", None),
                            ],
                        )?;
                    }
                }
                None => self.set("LIMITER__BACKEND", "memory"),
            },
        }
        Ok(())
    }

    /// `disk PATH`: the memory backend, its state kept in a snapshot file in the directory
    /// PATH (where limitador keeps its RocksDB database), written every
    /// `limiter.persist_interval_ms` and at shutdown.
    fn disk(&mut self, sub: &ArgMatches) -> Result<(), Unsupported> {
        let path = sub.get_one::<String>("PATH").cloned();
        let Some(dir) = path.or_else(|| self.env("DISK_PATH").map(str::to_owned)) else {
            return Err(unsupported("disk", "", "needs a PATH (or DISK_PATH)"));
        };
        self.set("LIMITER__BACKEND", "memory");
        let file = std::path::Path::new(&dir).join(DISK_SNAPSHOT);
        self.set("LIMITER__PERSIST", file.display().to_string());
        let optimize = sub.get_one::<String>("OPTIMIZE").cloned();
        if let Some(v) = optimize.or_else(|| self.env("DISK_OPTIMIZE").map(str::to_owned)) {
            if v != "throughput" && v != "disk" {
                return Err(unsupported("--optimize", &v, "expected throughput or disk"));
            }
            let why = "the state is one snapshot file, written whole: nothing to tune";
            self.ignore("--optimize", why);
        }
        Ok(())
    }

    /// `redis_cached` (or `REDIS_LOCAL_CACHE_ENABLED`): limitador's local counters, which may
    /// go over a limit, become sluice's leases (`redis.leases = on`), which never do
    /// (docs/redis.md, "Leases"). The flush period bounds how long a replica holds units
    /// (`redis.lease_validity_ms`, 1 to 1000 ms), the response time-out is `redis.timeout_ms`;
    /// the batch size and the cache's size have no counterpart (a lease is one script call
    /// per busy key, and only busy keys are leased) and are logged.
    fn leases(
        &mut self,
        [(flush_name, flush), (timeout_name, timeout)]: [(&str, Option<String>); 2],
        unused: [(&str, Option<String>); 2],
    ) -> Result<(), Unsupported> {
        self.set("REDIS__LEASES", "on");
        let ms = |name: &str, v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| unsupported(name, v, "expected milliseconds"))
        };
        if let Some(v) = flush {
            let validity = ms(flush_name, &v)?.clamp(1, 1_000);
            self.set("REDIS__LEASE_VALIDITY_MS", validity.to_string());
            self.set("REDIS__LEASE_HORIZON_MS", validity.min(20).to_string());
            if validity.to_string() != v.trim() {
                let why = format!("{v}: a lease is held {validity} ms at most (1 to 1000)");
                self.ignore(flush_name, &why);
            }
        }
        if let Some(v) = timeout {
            let timeout = ms(timeout_name, &v)?.max(1);
            self.set("REDIS__TIMEOUT_MS", timeout.to_string());
        }
        for (name, value) in unused {
            if let Some(v) = value {
                let why = format!(
                    "{v}: sluice leases busy keys one script call each; nothing to batch or bound"
                );
                self.ignore(name, &why);
            }
        }
        Ok(())
    }

    fn redis(&mut self, url: Option<String>, storage: &str) -> Result<(), Unsupported> {
        let url = url.or_else(|| self.env("REDIS_URL").map(str::to_owned));
        let Some(url) = url else {
            return Err(unsupported(storage, "", "needs a Redis URL (or REDIS_URL)"));
        };
        self.set("LIMITER__BACKEND", "redis");
        self.set("REDIS__URL", url);
        Ok(())
    }

    fn behaviour(&mut self) -> Result<(), Unsupported> {
        let headers = self.value("rate_limit_headers", "RATE_LIMIT_HEADERS");
        match headers.as_deref().unwrap_or("NONE") {
            "NONE" => {}
            "DRAFT_VERSION_03" => {
                self.set("RESPONSE__HEADERS", "true");
                self.set("RESPONSE__LIMIT_HEADER", "X-RateLimit-Limit");
                self.set("RESPONSE__REMAINING_HEADER", "X-RateLimit-Remaining");
                self.set("RESPONSE__RESET_HEADER", "X-RateLimit-Reset");
            }
            other => {
                let why = "expected NONE or DRAFT_VERSION_03";
                return Err(unsupported("--rate-limit-headers", other, why));
            }
        }
        let level = match self.m.get_count("v") {
            0 => "error",
            1 => "warn",
            2 => "info",
            3 => "info,sluice=debug",
            _ => "info,sluice=trace",
        };
        self.set("LOG__LEVEL", level);
        if self.m.get_flag("structured_logs") {
            self.set("LOG__FORMAT", "json");
        }
        if let Some(file) = self.m.get_one::<String>("custom_metric_labels").cloned() {
            self.set("METRICS__LIMITADOR_LABELS_FILE", file);
        }
        if let Some(expr) = self.m.get_one::<String>("metric_labels_default").cloned() {
            self.set("METRICS__LIMITADOR_LABELS_DEFAULT", expr);
        }
        self.tracing();
        let in_labels = self.m.get_flag("limit_name_in_labels")
            || self.enabled("LIMIT_NAME_IN_PROMETHEUS_LABELS");
        self.set("METRICS__LIMITADOR", "true");
        if in_labels {
            self.set("METRICS__LIMITADOR_LIMIT_NAME_LABEL", "true");
        }
        if self.m.get_flag("grpc_reflection_service") {
            self.ignore(
                "--grpc-reflection-service",
                "sluice always serves reflection",
            );
        }
        Ok(())
    }
}

impl Reader<'_> {
    /// `--tracing-endpoint` (or `TRACING_ENDPOINT`): spans over OTLP/gRPC to that collector,
    /// under limitador's service name. Empty: no tracing, as there. `rpc://` (limitador's
    /// examples) and no scheme are plain-text `http://`.
    fn tracing(&mut self) {
        let endpoint = self.value("tracing_endpoint", "TRACING_ENDPOINT");
        let Some(endpoint) = endpoint.filter(|e| !e.trim().is_empty()) else {
            return;
        };
        if !cfg!(feature = "otel") {
            let why = format!(
                "{endpoint}: no spans are exported, as this sluice is built without the `otel` \
                 feature"
            );
            self.ignore("--tracing-endpoint", &why);
            return;
        }
        let endpoint = match endpoint.split_once("://") {
            Some(("rpc", rest)) => format!("http://{rest}"),
            Some(_) => endpoint,
            None => format!("http://{endpoint}"),
        };
        self.set("LOG__OTLP_ENDPOINT", endpoint);
        self.set("LOG__OTLP_PROTOCOL", "grpc");
        self.set("LOG__OTLP_SERVICE_NAME", "limitador");
    }
}

fn unsupported(name: &str, value: &str, why: &str) -> Unsupported {
    Unsupported {
        name: name.to_owned(),
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

#[cfg(test)]
mod tests;
