//! The command line of the `sluice` binary: its subcommands and flags (clap), and how the
//! flags become the top layer of the settings ([`Overrides`]). Part of the binary, not of the
//! library: settings and rules know nothing of clap.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use sluice::config::settings::{Backend, ListenAddr, LogFormat, Overrides};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A rate-limit service for Envoy (RLS v3)"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve ShouldRateLimit over gRPC.
    Serve(ServeArgs),
    /// Validate rules files with the settings `serve` would use; print every error with file
    /// and line; exit 1 if any.
    Check(CheckArgs),
    /// Load any Envoy RLS v3 server and report throughput and latency; or run a no-op server.
    Bench(Box<sluice::bench::BenchArgs>),
    /// Ask a running sluice why a descriptor is (or is not) limited (admin `POST /why`;
    /// nothing is charged).
    Why(WhyArgs),
}

#[derive(clap::Args)]
pub(crate) struct WhyArgs {
    /// The admin server: `http://host:port` or `host:port`.
    #[arg(long, value_name = "URL")]
    pub admin: String,
    #[arg(long)]
    pub domain: String,
    /// The admin token (`admin.token`), when the server has one.
    #[arg(long, env = "SLUICE_ADMIN__TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the JSON answer as it came.
    #[arg(long)]
    pub json: bool,
    /// The descriptor's entries, in order.
    #[arg(value_name = "KEY=VALUE", required = true)]
    pub entries: Vec<String>,
}

#[derive(clap::Args)]
pub(crate) struct CheckArgs {
    /// A rules file or directory (repeatable); none = the settings' `rules.paths`, else the
    /// embedded demo rules.
    #[arg(long = "rules", value_name = "PATH")]
    pub rules: Vec<PathBuf>,
    /// A settings file (TOML or YAML), read as `serve` reads it (with the `SLUICE_*`
    /// environment over it): `limits.default_algorithm` and `rules.paths` apply.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl CheckArgs {
    /// The settings layer of the flags: the rules paths.
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            rules: self.rules.clone(),
            ..Overrides::default()
        }
    }
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// A rules file or directory (repeatable); none = the embedded demo rules.
    #[arg(long = "rules", value_name = "PATH")]
    pub rules: Vec<PathBuf>,
    /// A settings file (TOML or YAML).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Redis URL for `--backend redis` (redis://, rediss://, redis+sentinel://, redis+cluster://).
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
    /// Where the gRPC server listens: `ip:port`, or a Unix socket, `unix:/path`.
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<ListenAddr>,
    /// Where the admin HTTP server (health, metrics, rules dump, /json) listens.
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormatArg>,
}

impl ServeArgs {
    /// The settings layer of the flags.
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            rules: self.rules.clone(),
            backend: self.backend.map(Backend::from),
            redis_url: self.redis_url.clone(),
            grpc_listen: self.grpc_listen.clone(),
            log_format: self.log_format.map(LogFormat::from),
            admin_listen: self.admin_listen,
        }
    }
}

/// `--backend`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackendArg {
    Memory,
    Redis,
    Memcache,
}

impl From<BackendArg> for Backend {
    fn from(arg: BackendArg) -> Backend {
        match arg {
            BackendArg::Memory => Backend::Memory,
            BackendArg::Redis => Backend::Redis,
            BackendArg::Memcache => Backend::Memcache,
        }
    }
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(arg: LogFormatArg) -> LogFormat {
        match arg {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}
