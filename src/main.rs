//! The `sluice` command: `serve`, `check`, `bench`, `why`.
//!
//! Settings and rules are loaded and validated before any port is bound; a bad setting or rule
//! exits with code 64 (EX_USAGE).

#![forbid(unsafe_code)]

mod cli;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser as _;
use cli::{CheckArgs, Cli, Command, ServeArgs, WhyArgs};
use sluice::app::server::{Server, StartError};
use sluice::config::rules_file::{self, LoadOptions};
use sluice::config::settings::{Overrides, Settings};

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
        Command::Why(args) => why(&args),
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
    match load_rules(&settings.rules.paths, LoadOptions::from(&settings)) {
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

/// Asks the admin server `POST /why` and prints the answer: exit 0 when it answered, 1 when
/// it refused or could not be reached (the reason on standard error), 64 on bad arguments.
fn why(args: &WhyArgs) -> ExitCode {
    let body = match sluice::admin::ask::body(&args.domain, &args.entries) {
        Ok(body) => body,
        Err(e) => {
            eprintln!("sluice why: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    match sluice::admin::ask::why(&args.admin, args.token.as_deref(), &body, args.json) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice why: {e}");
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
}

fn load_rules(
    paths: &[std::path::PathBuf],
    options: LoadOptions,
) -> Result<Loaded, rules_file::RuleErrors> {
    let model = sluice::reload::load(paths, options)?;
    Ok(Loaded {
        domains: model.domains.len(),
        limitador_limits: model.namespaces.len(),
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
    match load_rules(&settings.rules.paths, LoadOptions::from(settings)) {
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
    let server = match Server::build(settings) {
        Ok(server) => server,
        Err(StartError(errors)) => {
            for e in &errors {
                tracing::error!("{e}");
            }
            return ExitCode::from(EX_USAGE);
        }
    };
    let done = runtime.block_on(run(server));
    telemetry.shutdown();
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until SIGTERM or SIGINT, reloading the rules on SIGHUP.
async fn run(server: Server) -> anyhow::Result<()> {
    let Some(bound) = server.bind(sluice::signal::shutdown()).await? else {
        return Ok(());
    };
    let reload = bound.reload_trigger();
    let hangups = async {
        sluice::signal::on_hangups(|| reload.reload()).await;
        std::future::pending::<()>().await;
    };
    tokio::select! {
        done = bound.run(sluice::signal::shutdown()) => done,
        () = hangups => Ok(()),
    }
}
