//! The composition root: everything `sluice serve` runs, built from the settings alone, so that
//! the whole service (xDS rules, envoyproxy/ratelimit's stats, metric names and debug port
//! included) runs in process as the binary runs it.
//!
//! Three steps, each able to fail on its own terms:
//! 1. [`Server::build`]: settings to a service: the rules (from files, or none yet when they
//!    come over xDS), the metric-name mapper, the backend, the xDS client. Its errors are the
//!    user's (exit 64 in the binary), and nothing is bound yet.
//! 2. [`Server::bind`]: waits for the first rules over xDS (unless `xds.start_without_rules`),
//!    then binds every port, so that Envoy meets a closed port rather than a service without
//!    rules. Returns `None` when shutdown comes first.
//! 3. [`Bound::run`]: serves until the shutdown future resolves, then drains in order within
//!    the grace period (`server.shutdown_grace_secs` + `server.drain_delay_secs`).
//!
//! Like [`App`], it never reads signals: the binary hands it its shutdown future and drives
//! reloads through [`Bound::reload_trigger`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{App, Listeners};
use crate::compat::mapper::Mapper;
use crate::compat::{serve, statsd};
use crate::config::rules_file::{self, LoadOptions};
use crate::config::settings::{ListenAddr, Settings};
use crate::reload::ReloadTrigger;
use crate::rules::RuleSet;
use crate::transport::GrpcListener;
use crate::xds::XdsClient;

/// Why the service cannot be built from its settings: one message per problem (every rule
/// error, with file and line), for the log.
#[derive(Debug)]
pub struct StartError(pub Vec<String>);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl std::error::Error for StartError {}

impl StartError {
    fn one(message: impl Into<String>) -> StartError {
        StartError(vec![message.into()])
    }
}

/// A service built from its settings, nothing bound yet.
pub struct Server {
    app: App,
    settings: Settings,
    xds: Option<(XdsClient, tonic::transport::Endpoint)>,
    mapper: Arc<Mapper>,
}

impl Server {
    /// Builds the service `settings` describe: rules from `rules.paths` (none yet when they
    /// come over xDS: the xDS client then feeds them), the metric-name mapper, the backend.
    pub fn build(settings: Settings) -> Result<Server, StartError> {
        let mapper = Mapper::for_settings(&settings.ratelimit_metrics)
            .map(Arc::new)
            .map_err(|e| StartError::one(format!("ratelimit_metrics.mapper_file: {e}")))?;
        statsd::Mogrifiers::new(&settings.statsd).map_err(StartError::one)?;
        let (domains, rules) = initial_rules(&settings)
            .map_err(|errors| StartError(errors.0.iter().map(ToString::to_string).collect()))?;
        tracing::info!(domains, "rules loaded");
        let mut app =
            App::build(&settings, rules).map_err(|e| StartError::one(format!("{e:#}")))?;
        if let Some(stats) = app.ratelimit_stats() {
            // The response time as the mapping types it: a histogram or a summary.
            stats.observe_as(mapper.observer(crate::compat::stats::RESPONSE_TIME));
        }
        let xds = xds_client(&settings, &mut app).map_err(|e| StartError::one(format!("{e:#}")))?;
        Ok(Server {
            app,
            settings,
            xds,
            mapper,
        })
    }

    /// The service inside (its metrics, rules, engine), for callers that look at it.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Starts the xDS client and waits for its first rules (unless
    /// `xds.start_without_rules`), then binds every port the settings name. `None` when
    /// `shutdown` resolved first (nothing was bound).
    pub async fn bind(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<Option<Bound>> {
        let Server {
            app,
            settings,
            xds,
            mapper,
        } = self;
        let stop = CancellationToken::new();
        if let Some((client, endpoint)) = xds {
            let state = client.state();
            tokio::spawn(client.run(endpoint, stop.clone()));
            if !settings.xds.start_without_rules {
                tracing::info!(server = %settings.xds.server, "waiting for the first rules over xDS");
                tokio::select! {
                    () = state.first_rules() => {}
                    () = shutdown => {
                        stop.cancel();
                        return Ok(None);
                    }
                }
            }
        }
        let listeners = Listeners {
            grpc: GrpcListener::bind(&settings.server.grpc_listen)
                .await
                .with_context(|| format!("cannot listen on {}", settings.server.grpc_listen))?,
            admin: Some(bind(settings.server.admin_listen).await?),
        };
        let drop_ins = DropIns::bind(&settings).await?;
        Ok(Some(Bound {
            app,
            settings,
            listeners,
            drop_ins,
            mapper,
            stop,
        }))
    }
}

/// A service with its ports bound, ready to run.
pub struct Bound {
    app: App,
    settings: Settings,
    listeners: Listeners,
    drop_ins: DropIns,
    mapper: Arc<Mapper>,
    /// Stops the xDS client and the drop-in listeners.
    stop: CancellationToken,
}

/// Where each bound port listens (port 0 in the settings: the port the system chose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    /// TCP, or the Unix socket's path.
    pub grpc: ListenAddr,
    pub admin: Option<SocketAddr>,
    /// envoyproxy/ratelimit's metric names (`ratelimit_metrics.listen`).
    pub ratelimit_metrics: Option<SocketAddr>,
    /// The debug port (`debug.listen`).
    pub debug: Option<SocketAddr>,
}

impl Bound {
    /// Where the bound ports listen.
    pub fn addresses(&self) -> anyhow::Result<Addresses> {
        Ok(Addresses {
            grpc: self.listeners.grpc.local_addr()?,
            admin: self
                .listeners
                .admin
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            ratelimit_metrics: self
                .drop_ins
                .metrics
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            debug: self
                .drop_ins
                .debug
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
        })
    }

    /// Asks the service to reload its rules (what SIGHUP does in the binary).
    pub fn reload_trigger(&self) -> ReloadTrigger {
        self.app.reload_trigger()
    }

    /// Serves until `shutdown` resolves, then drains in order; gives up waiting for requests
    /// still in flight after the grace period.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let Bound {
            app,
            settings,
            listeners,
            drop_ins,
            mapper,
            stop,
        } = self;
        drop_ins.serve(&app, &settings, &stop, mapper);
        let persist = app.persist();
        let running = app.run(listeners, stop.clone().cancelled_owned());
        tokio::pin!(running);
        tokio::select! {
            done = &mut running => return done,
            () = shutdown => stop.cancel(),
        }
        let grace = Duration::from_secs(
            settings.server.shutdown_grace_secs + settings.server.drain_delay_secs,
        );
        match tokio::time::timeout(grace, running).await {
            Ok(done) => done,
            Err(_) => {
                tracing::warn!(?grace, "grace period over with requests still in flight");
                if let Some(p) = persist {
                    p.write_last().await;
                }
                Ok(())
            }
        }
    }
}

/// The rules at start, and their domain count: from files, or none yet when they come over
/// xDS.
fn initial_rules(settings: &Settings) -> Result<(usize, RuleSet), rules_file::RuleErrors> {
    let options: LoadOptions = LoadOptions::from(settings);
    let model = if settings.xds.enabled() {
        rules_file::from_sources_with(&[], options)?
    } else {
        crate::reload::load(&settings.rules.paths, options)?
    };
    Ok((model.domains.len(), RuleSet::compile(model)))
}

/// The xDS rules client, when rules come over xDS; the app's rules follow it from now on.
fn xds_client(
    settings: &Settings,
    app: &mut App,
) -> anyhow::Result<Option<(XdsClient, tonic::transport::Endpoint)>> {
    if !settings.xds.enabled() {
        return Ok(None);
    }
    let client = XdsClient::new(
        &settings.xds,
        app.active_rules(),
        LoadOptions::from(settings),
        Box::new(app.reload_report()),
    );
    let endpoint = client.endpoint()?;
    app.set_rules_source(client.state());
    Ok(Some((client, endpoint)))
}

/// envoyproxy/ratelimit's listeners, when asked for: its metric names and its debug port
/// (statsd sends, it listens nowhere).
struct DropIns {
    metrics: Option<TcpListener>,
    debug: Option<TcpListener>,
}

impl DropIns {
    async fn bind(settings: &Settings) -> anyhow::Result<DropIns> {
        let metrics = match settings.ratelimit_metrics.listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let debug = match settings.debug.listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(DropIns { metrics, debug })
    }

    /// envoyproxy/ratelimit's stats (statsd, Prometheus series under its names) and debug
    /// port, when asked for; they stop with `stop`.
    fn serve(self, app: &App, settings: &Settings, stop: &CancellationToken, mapper: Arc<Mapper>) {
        // Counted by the engine since the app was built (`App::ratelimit_stats`).
        let stats = app.ratelimit_stats();
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
        if let (Some(stats), Some(listener)) = (&stats, self.metrics) {
            let path = settings.ratelimit_metrics.path.clone();
            tracing::info!(addr = ?listener.local_addr().ok(), %path, "serving envoyproxy/ratelimit's metric names");
            let serving = serve::metrics(listener, path, stats.clone(), mapper, stop.clone());
            tokio::spawn(async move {
                if let Err(e) = serving.await {
                    tracing::error!("metrics listener stopped: {e}");
                }
            });
        }
        if let Some(listener) = self.debug {
            tracing::info!(addr = ?listener.local_addr().ok(), "serving the debug endpoints");
            let serving = serve::debug(listener, app.active_rules(), stats, stop.clone());
            tokio::spawn(async move {
                if let Err(e) = serving.await {
                    tracing::error!("debug listener stopped: {e}");
                }
            });
        }
    }
}

async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}
