//! Running an [`App`]: its tasks, and the ordered drain.
//!
//! Every task lives in one `JoinSet` that `run` awaits: the admin server, the rules watcher,
//! the backend housekeeping. The gRPC server runs in `run` itself. On shutdown (or when a
//! task fails):
//!
//! 1. readiness fails at once: `/readyz` answers 503, gRPC health NOT_SERVING;
//! 2. the drain delay passes (`server.drain_delay_secs`) while both servers keep serving;
//! 3. the gRPC server stops accepting and finishes the requests in flight;
//! 4. the admin server and the background tasks stop;
//! 5. with `limiter.persist`, the last snapshot is written; `run` returns.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::App;
use crate::admin::{self, Admin};
use crate::grpc::RateLimiter;
use crate::health::Readiness;
use crate::limiter::Limiter;
use crate::proto::rate_limit_service_server::RateLimitServiceServer;
use crate::reload::{self, WatchOptions};
use crate::tls::{self, ActiveTls};
use crate::transport::{GrpcListener, Http2Server};

/// Names under which gRPC health reports the service.
const HEALTH_NAMES: [&str; 5] = [
    "",
    "envoy.service.ratelimit.v3.RateLimitService",
    "ratelimit",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    "sluice.v1.Throttle",
];

/// The bound listeners `run` serves on.
pub struct Listeners {
    /// TCP (`TcpListener::into`), or a Unix socket.
    pub grpc: GrpcListener,
    /// The admin HTTP server's; none: no admin server.
    pub admin: Option<TcpListener>,
}

impl From<TcpListener> for Listeners {
    /// gRPC alone.
    fn from(grpc: TcpListener) -> Listeners {
        Listeners {
            grpc: grpc.into(),
            admin: None,
        }
    }
}

type Tasks = JoinSet<anyhow::Result<()>>;

pub(super) async fn run(
    mut app: App,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let readiness = Arc::new(
        Readiness::new(app.rules.shared(), app.limiter.clone())
            .with_rules_source(app.rules_source.clone()),
    );
    let engine = app.engine.clone();
    let rlqs = app.rlqs.clone();
    let drain_delay = app.ops.drain_delay;
    let ops = app.ops;
    let server = Http2Server::new(
        ops.max_concurrent_streams,
        ops.stream_tasks,
        ops.connections,
    );
    let stop = CancellationToken::new();
    let failed = CancellationToken::new();
    let grpc_stop = CancellationToken::new();
    let mut tasks = Tasks::new();
    // `ip:port`, or `unix:PATH`.
    let addr = listeners
        .grpc
        .local_addr()
        .map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let throttle =
        crate::throttle::Throttler::new(engine.limiter().clone(), *engine.input_limits())
            .with_observer(app.metrics.clone())
            .into_service();
    let tls = tls_watched(&app, &mut tasks, &failed, &stop);
    if let Some(srv) = app.memcache_srv.take() {
        let looking = srv.run(stop.clone());
        guarded(&mut tasks, &failed, async {
            looking.await;
            Ok::<_, std::convert::Infallible>(())
        });
    }
    let persist = app.persist.clone();
    if let Some(p) = &persist {
        let writing = p.clone().run(stop.clone());
        guarded(&mut tasks, &failed, async {
            writing.await;
            Ok::<_, std::convert::Infallible>(())
        });
    }
    spawn_tasks(&mut tasks, app, listeners.admin, &readiness, &stop, &failed);
    let (health, health_service) = tonic_health::server::health_reporter();
    // Every name is registered before the first connection is served, so an early health
    // check sees NOT_SERVING or SERVING, never "unknown service".
    set_health(&health, serving_status(&readiness)).await;
    let follow = follow_readiness(health.clone(), readiness.clone(), stop.clone());
    guarded(&mut tasks, &failed, async {
        follow.await;
        Ok::<_, std::convert::Infallible>(())
    });
    let (reflection_v1, reflection_v1alpha) = reflection()?;
    let backend = engine.backend_name();
    tracing::info!(%addr, tls = tls.is_some(), backend, "serving gRPC");
    let routes = Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(crate::kuadrant::Kuadrant::new(engine.clone()).into_service())
        .add_service(RateLimiter::new(engine).into_service())
        // RLQS streams end (OK) when the gRPC server stops, so its drain does not wait on them.
        .add_service(rlqs.service(grpc_stop.clone()))
        .add_service(throttle);
    let signal = grpc_stop.clone().cancelled_owned();
    let mut server = std::pin::pin!(server.serve(routes, listeners.grpc, tls, signal));
    let drain = async {
        tokio::select! {
            () = shutdown => {}
            () = failed.cancelled() => {}
        }
        readiness.start_draining();
        set_health(&health, ServingStatus::NotServing).await;
        health
            .set_not_serving::<RateLimitServiceServer<RateLimiter>>()
            .await;
        if !failed.is_cancelled() && !drain_delay.is_zero() {
            tracing::info!(?drain_delay, "not ready; draining");
            tokio::time::sleep(drain_delay).await;
        }
        tracing::info!("stopping gRPC; finishing the requests in flight");
        grpc_stop.cancel();
    };
    tokio::select! {
        () = &mut server => {}
        () = drain => server.await,
    }
    readiness.start_draining();
    stop.cancel();
    let joined = join_all(tasks).await;
    // Every decision has been made: the gRPC server has finished, every task has stopped.
    if let Some(p) = &persist {
        p.write_last().await;
    }
    joined?;
    tracing::info!("stopped");
    Ok(())
}

/// The gRPC port's TLS configuration, when it serves TLS, kept current by a task that
/// watches the certificates.
fn tls_watched(
    app: &App,
    tasks: &mut Tasks,
    failed: &CancellationToken,
    stop: &CancellationToken,
) -> Option<ActiveTls> {
    let (files, active) = app.tls.clone()?;
    let watch = tls::watch(files, active.clone(), app.ops.debounce, stop.clone());
    guarded(tasks, failed, watch);
    Some(active)
}

/// Starts the admin server, the rules watcher and the housekeeping; each task that fails
/// cancels `failed`, which starts the drain.
fn spawn_tasks(
    tasks: &mut Tasks,
    app: App,
    admin_listener: Option<TcpListener>,
    readiness: &Arc<Readiness>,
    stop: &CancellationToken,
    failed: &CancellationToken,
) {
    if let Some(listener) = admin_listener {
        let addr = listener.local_addr().ok();
        tracing::info!(?addr, "serving admin HTTP");
        let mut access = app.access.clone();
        if let Some(addr) = addr {
            access = access.listening_on(addr);
        }
        if let Some(notice) = access.refusal_notice() {
            tracing::warn!("{notice}");
        }
        let admin = Admin {
            engine: app.engine.clone(),
            rules: app.rules.clone(),
            readiness: readiness.clone(),
            metrics: app.metrics.clone(),
            backend: app.limiter.clone(),
            access,
        };
        let serve = admin::serve(listener, admin, stop.clone());
        guarded(tasks, failed, async {
            serve.await.context("admin server failed")
        });
    }
    let options = WatchOptions {
        files: app.ops.watch,
        debounce: app.ops.debounce,
        report: Box::new(app.reload_report()),
    };
    let watch = reload::watch(
        app.rules.clone(),
        app.reload_trigger.clone(),
        app.reload_requests,
        options,
        stop.clone(),
    );
    guarded(tasks, failed, watch);
    if let Some(every) = app.housekeeping {
        let probing = probe(app.limiter.clone(), stop.clone());
        guarded(tasks, failed, async {
            probing.await;
            Ok::<_, std::convert::Infallible>(())
        });
        let listening = listen(app.limiter.clone(), stop.clone());
        guarded(tasks, failed, async {
            listening.await;
            Ok::<_, std::convert::Infallible>(())
        });
        let sweep = housekeeping(app.limiter, every, stop.clone());
        guarded(tasks, failed, async {
            sweep.await;
            Ok::<_, std::convert::Infallible>(())
        });
    }
}

/// Spawns `task` into `tasks`; its failure is logged and cancels `failed`.
fn guarded<E: Into<anyhow::Error>>(
    tasks: &mut Tasks,
    failed: &CancellationToken,
    task: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    let failed = failed.clone();
    tasks.spawn(async move {
        let result = task.await.map_err(Into::into);
        if let Err(e) = &result {
            tracing::error!("{e:#}");
            failed.cancel();
        }
        result
    });
}

/// Waits for every task; the first error, if any.
async fn join_all(mut tasks: Tasks) -> anyhow::Result<()> {
    let mut first = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let result = joined.context("background task panicked").and_then(|r| r);
        if first.is_ok() {
            first = result;
        }
    }
    first
}

/// How often gRPC health is brought in line with readiness (rules, backend).
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// Keeps gRPC health equal to readiness until stopped or draining (the drain sets
/// NOT_SERVING itself, and a change seen here just as draining starts is undone).
async fn follow_readiness(
    health: HealthReporter,
    readiness: Arc<Readiness>,
    stop: CancellationToken,
) {
    let mut shown = None;
    let mut tick = tokio::time::interval(FOLLOW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let status = serving_status(&readiness);
        if shown != Some(status) {
            set_health(&health, status).await;
            shown = Some(status);
        }
        if readiness.is_draining() {
            set_health(&health, ServingStatus::NotServing).await;
            return;
        }
    }
}

/// gRPC health's word for readiness now.
fn serving_status(readiness: &Readiness) -> ServingStatus {
    match readiness.check() {
        Ok(()) => ServingStatus::Serving,
        Err(_) => ServingStatus::NotServing,
    }
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    for name in HEALTH_NAMES {
        health.set_service_status(name, status).await;
    }
}

type Reflection<T> = tonic_reflection::server::v1::ServerReflectionServer<T>;
type ReflectionAlpha<T> = tonic_reflection::server::v1alpha::ServerReflectionServer<T>;

/// Server reflection, v1 and v1alpha (grpcurl speaks the latter).
fn reflection() -> anyhow::Result<(
    Reflection<impl tonic_reflection::server::v1::ServerReflection>,
    ReflectionAlpha<impl tonic_reflection::server::v1alpha::ServerReflection>,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((
        builder().build_v1().context("reflection v1")?,
        builder().build_v1alpha().context("reflection v1alpha")?,
    ))
}

/// How often a backend with something to probe (Redis) is checked for readiness.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Probes the backend at once (which also makes its first connection), then every
/// [`PROBE_EVERY`], until stopped; returns at once for a backend with nothing to probe.
async fn probe(backend: Arc<dyn Limiter>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => match backend.probe() {
                Some(probing) => probing.await,
                None => return,
            },
        }
    }
}

/// Runs what the backend keeps doing in the background (Redis: hearing other replicas'
/// resets) until stopped; returns at once for a backend with nothing to do.
async fn listen(backend: Arc<dyn Limiter>, stop: CancellationToken) {
    if let Some(listening) = backend.listen() {
        tokio::select! {
            _ = stop.cancelled() => {}
            () = listening => {}
        }
    }
}

/// Sweeps backend state every `every` until stopped.
async fn housekeeping(backend: Arc<dyn Limiter>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let dropped = backend.sweep();
                tracing::debug!(dropped, held = backend.held(), "backend sweep");
            }
        }
    }
}
