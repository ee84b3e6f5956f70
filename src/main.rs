//! The `sluice` command: `serve`, `check`, `bench`.
//!
//! Settings and rules are loaded and validated before any port is bound; a bad setting or rule
//! exits with code 64 (EX_USAGE).

#![forbid(unsafe_code)]

mod cli;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;
use cli::{CheckArgs, Cli, Command, ServeArgs};
use sluice::config::rules::{self, LoadOptions};
use sluice::config::settings::{Overrides, Settings};
use sluice::rules::RuleSet;
use sluice::xds::XdsClient;
use tokio_util::sync::CancellationToken;

/// The binary's allocator: jemalloc (the default feature `jemalloc`). Against glibc's malloc it
/// cut sluice's CPU per request on the Redis path by 10-19% (glibc consolidated its free lists
/// at each call's large buffers); the memory backend's bytes per key stayed the same within a
/// flood's noise, and the process starts 2-3 MiB larger (docs/BENCHMARKS.md).
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    if let Some(code) = as_limitador() {
        return code;
    }
    if let Some(code) = as_ratelimit() {
        return code;
    }
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
            if set.limitador_limits == 0 {
                println!("ok: {} domain(s)", set.domains);
            } else {
                let limits = set.limitador_limits;
                println!("ok: {} domain(s), {limits} limitador limit(s)", set.domains);
            }
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
    /// Limits of limitador-format files.
    limitador_limits: usize,
    set: RuleSet,
}

fn load_rules(
    paths: &[std::path::PathBuf],
    options: LoadOptions,
) -> Result<Loaded, rules::RuleErrors> {
    let model = sluice::reload::load(paths, options)?;
    Ok(Loaded {
        domains: model.domains.len(),
        limitador_limits: model.namespaces.len(),
        set: RuleSet::compile(model),
    })
}

/// Started as `limitador-server` (argv[0]'s file name) or with `--limitador-cli`: takes
/// limitador's command line and environment (see `sluice::compat::limitador`).
fn as_limitador() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let named = args
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .is_some_and(|name| name == "limitador-server");
    if !named && !args.iter().any(|a| a == "--limitador-cli") {
        return None;
    }
    let env = std::env::vars().collect();
    let start = match sluice::compat::limitador::translate(&args, &env) {
        Ok(s) => s,
        Err(sluice::compat::limitador::CliError::Info(text)) => {
            print!("{text}");
            return Some(ExitCode::SUCCESS);
        }
        Err(e) => {
            eprintln!("sluice (as limitador-server): {e}");
            return Some(ExitCode::from(EX_USAGE));
        }
    };
    let settings = match sluice::compat::limitador::settings(&start, &env) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice (as limitador-server): {e}");
            return Some(ExitCode::from(EX_USAGE));
        }
    };
    if start.validate {
        return Some(validate_limits(&settings));
    }
    Some(serve_with(settings, &start.translation.ignored))
}

/// `--validate`: the limits file is valid (exit 0) or its errors are printed (exit 1).
fn validate_limits(settings: &Settings) -> ExitCode {
    match load_rules(&settings.rules.paths, (&settings.limits).into()) {
        Ok(set) => {
            let limits = set.limitador_limits;
            println!("ok: {limits} limitador limit(s), {} domain(s)", set.domains);
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{} error(s)", errors.0.len());
            ExitCode::FAILURE
        }
    }
}

/// Started as `ratelimit` (argv[0]'s file name) or with `--ratelimit-env`: serves with
/// envoyproxy/ratelimit's environment (see `sluice::compat::env`), other arguments ignored.
fn as_ratelimit() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let argv0 = args.next()?;
    let named = std::path::Path::new(&argv0)
        .file_name()
        .is_some_and(|name| name == "ratelimit");
    if !named && !args.any(|a| a == "--ratelimit-env") {
        return None;
    }
    let env = std::env::vars().collect();
    let (settings, translation) = match sluice::compat::env::settings(&env) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice (as ratelimit): {e}");
            return Some(ExitCode::from(EX_USAGE));
        }
    };
    Some(serve_with(settings, &translation.ignored))
}

fn serve(args: ServeArgs) -> ExitCode {
    let settings = match settings(args.config.as_deref(), &args.overrides()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    serve_with(settings, &[])
}

/// Serves with `settings`; `ignored` are envoyproxy/ratelimit variables read and ignored
/// (logged once).
fn serve_with(settings: Settings, ignored: &[(String, String)]) -> ExitCode {
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
    for (name, why) in ignored {
        tracing::info!("envoyproxy/ratelimit setting ignored: {name}={why}");
    }
    let mapper = match sluice::compat::mapper::Mapper::for_settings(&settings.ratelimit_metrics) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            tracing::error!("ratelimit_metrics.mapper_file: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let loaded = match initial_rules(&settings) {
        Ok(l) => l,
        Err(errors) => {
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            return ExitCode::from(EX_USAGE);
        }
    };
    tracing::info!(domains = loaded.domains, "rules loaded");
    let mut app = match sluice::app::App::build(&settings, loaded.set) {
        Ok(app) => app,
        Err(e) => {
            tracing::error!("{e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let xds = match xds_client(&settings, &mut app) {
        Ok(xds) => xds,
        Err(e) => {
            tracing::error!("{e:#}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let done = runtime.block_on(run(app, &settings, xds, mapper));
    telemetry.shutdown();
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The rules at start: from files, or none yet when they come over xDS.
fn initial_rules(settings: &Settings) -> Result<Loaded, rules::RuleErrors> {
    if settings.xds.enabled() {
        let empty = rules::from_sources_with(&[], (&settings.limits).into())?;
        return Ok(Loaded {
            domains: 0,
            limitador_limits: 0,
            set: RuleSet::compile(empty),
        });
    }
    load_rules(&settings.rules.paths, (&settings.limits).into())
}

/// The xDS rules client, when rules come over xDS; the app's rules follow it from now on.
fn xds_client(
    settings: &Settings,
    app: &mut sluice::app::App,
) -> anyhow::Result<Option<(XdsClient, tonic::transport::Endpoint)>> {
    if !settings.xds.enabled() {
        return Ok(None);
    }
    let metrics = app.metrics();
    let client = XdsClient::new(
        &settings.xds,
        app.active_rules(),
        (&settings.limits).into(),
        Box::new(move |outcome| metrics.reloaded(outcome)),
    );
    let endpoint = client.endpoint()?;
    app.set_rules_source(client.state());
    Ok(Some((client, endpoint)))
}

async fn run(
    app: sluice::app::App,
    settings: &Settings,
    xds: Option<(XdsClient, tonic::transport::Endpoint)>,
    mapper: Arc<sluice::compat::mapper::Mapper>,
) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    if let Some((client, endpoint)) = xds {
        let state = client.state();
        tokio::spawn(client.run(endpoint, stop.clone()));
        if !settings.xds.start_without_rules {
            tracing::info!(server = %settings.xds.server, "waiting for the first rules over xDS");
            tokio::select! {
                () = state.first_rules() => {}
                () = sluice::signal::shutdown() => return Ok(()),
            }
        }
    }
    let listeners = sluice::app::Listeners {
        grpc: bind(settings.server.grpc_listen).await?,
        admin: Some(bind(settings.server.admin_listen).await?),
    };
    drop_in_listeners(&app, settings, &stop, mapper).await?;
    let reload = app.reload_trigger();
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

/// envoyproxy/ratelimit's stats (statsd, Prometheus series under its names) and debug port,
/// when asked for; they stop with `stop`.
async fn drop_in_listeners(
    app: &sluice::app::App,
    settings: &Settings,
    stop: &CancellationToken,
    mapper: Arc<sluice::compat::mapper::Mapper>,
) -> anyhow::Result<()> {
    use sluice::compat::{serve, stats::RatelimitStats, statsd};
    let wanted = settings.statsd.enabled()
        || settings.ratelimit_metrics.listen.is_some()
        || settings.debug.listen.is_some();
    let stats = wanted.then(|| {
        let stats = Arc::new(RatelimitStats::new(
            settings.metrics.near_limit_ratio,
            settings.metrics.max_value_label_sets,
        ));
        app.metrics().count_ratelimit_stats(stats.clone());
        stats
    });
    if let Some(stats) = &stats
        && settings.statsd.enabled()
    {
        let sink = statsd::run(stats.clone(), settings.statsd.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = sink.await {
                tracing::error!("statsd sink stopped: {e}");
            }
        });
    }
    if let (Some(stats), Some(addr)) = (&stats, settings.ratelimit_metrics.listen) {
        let listener = bind(addr).await?;
        tracing::info!(%addr, path = %settings.ratelimit_metrics.path, "serving envoyproxy/ratelimit's metric names");
        let serving = serve::metrics(
            listener,
            settings.ratelimit_metrics.path.clone(),
            stats.clone(),
            mapper.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!("metrics listener stopped: {e}");
            }
        });
    }
    if let Some(addr) = settings.debug.listen {
        let listener = bind(addr).await?;
        tracing::info!(%addr, "serving the debug endpoints");
        let serving = serve::debug(listener, app.active_rules(), stats, stop.clone());
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!("debug listener stopped: {e}");
            }
        });
    }
    Ok(())
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}
