//! The `sluice` command: `serve`, `check`, `bench`.
//!
//! Settings and rules are loaded and validated before any port is bound; a bad setting or rule
//! exits with code 64 (EX_USAGE).

#![forbid(unsafe_code)]

mod cli;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use cli::{CheckArgs, Cli, Command, ServeArgs};
use sluice::config::rules::{self, LoadOptions};
use sluice::config::settings::{Overrides, Settings};
use sluice::rules::RuleSet;
use tokio_util::sync::CancellationToken;

const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check(args) => check(&args),
        Command::Serve(args) => serve(args),
        Command::Bench(args) => match sluice::bench::main(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice bench: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Validates the rules `serve` would load, with the settings it would use: the same file,
/// environment and flags, so `limits.default_algorithm` and `rules.paths` apply alike.
fn check(args: &CheckArgs) -> ExitCode {
    let settings = match settings(args.config.as_deref(), &args.overrides()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match load_rules(&settings.rules.paths, (&settings.limits).into()) {
        Ok(set) => {
            println!("ok: {} domain(s)", set.domains);
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{} error(s)", errors.0.len());
            ExitCode::FAILURE
        }
    }
}

/// Every layer of the settings (file, `SLUICE_*` environment, flags), or exit 64.
fn settings(file: Option<&Path>, flags: &Overrides) -> Result<Settings, ExitCode> {
    let env = std::env::vars().collect();
    Settings::load(file, env, flags).map_err(|e| {
        eprintln!("sluice: {e}");
        ExitCode::from(EX_USAGE)
    })
}

/// The loaded model's domain count, or every error.
struct Loaded {
    domains: usize,
    set: RuleSet,
}

fn load_rules(
    paths: &[std::path::PathBuf],
    options: LoadOptions,
) -> Result<Loaded, rules::RuleErrors> {
    let model = sluice::reload::load(paths, options)?;
    Ok(Loaded {
        domains: model.domains.len(),
        set: RuleSet::compile(model),
    })
}

fn serve(args: ServeArgs) -> ExitCode {
    let settings = match settings(args.config.as_deref(), &args.overrides()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The runtime first: an OTLP exporter lives in it.
    let runtime = match sluice::runtime::build(settings.server.worker_threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _entered = runtime.enter();
    let telemetry = match sluice::telemetry::init(&settings.log) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let loaded = match load_rules(&settings.rules.paths, (&settings.limits).into()) {
        Ok(l) => l,
        Err(errors) => {
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            return ExitCode::from(EX_USAGE);
        }
    };
    tracing::info!(domains = loaded.domains, "rules loaded");
    let app = match sluice::app::App::build(&settings, loaded.set) {
        Ok(app) => app,
        Err(e) => {
            tracing::error!("{e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let done = runtime.block_on(run(app, &settings));
    telemetry.shutdown();
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(app: sluice::app::App, settings: &Settings) -> anyhow::Result<()> {
    let listeners = sluice::app::Listeners {
        grpc: bind(settings.server.grpc_listen).await?,
        admin: Some(bind(settings.server.admin_listen).await?),
    };
    let reload = app.reload_trigger();
    let stop = CancellationToken::new();
    let running = app.run(listeners, stop.clone().cancelled_owned());
    tokio::pin!(running);
    tokio::select! {
        done = &mut running => return done,
        () = sluice::signal::shutdown() => stop.cancel(),
        () = sluice::signal::on_hangups(|| reload.reload()) => {}
    }
    let grace =
        Duration::from_secs(settings.server.shutdown_grace_secs + settings.server.drain_delay_secs);
    match tokio::time::timeout(grace, running).await {
        Ok(done) => done,
        Err(_) => {
            tracing::warn!(?grace, "grace period over with requests still in flight");
            Ok(())
        }
    }
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}
