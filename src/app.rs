//! Serving: builds the engine from settings and rules, runs the gRPC server on a listener it
//! is given, and stops on the shutdown future it is given (never reading signals itself).
//!
//! Shutdown order: gRPC health turns NOT_SERVING, the server stops accepting and finishes the
//! requests in flight, background tasks stop, `run` returns. The caller bounds all of it with
//! a grace period.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::config::settings::{Backend, Settings};
use crate::engine::{Engine, HeaderNames, Options};
use crate::grpc::RateLimiter;
use crate::limiter::{Limiter, MemoryLimiter, RedisLimiter};
use crate::proto::rate_limit_service_server::RateLimitServiceServer;
use crate::rules::RuleSet;

/// Names under which gRPC health reports the service.
const HEALTH_NAMES: [&str; 2] = ["envoy.service.ratelimit.v3.RateLimitService", "ratelimit"];

/// Periodic clean-up of a backend's state.
pub trait Housekeeping: Send + Sync + 'static {
    /// Drops state that is no longer needed; returns how many entries went.
    fn sweep(&self) -> usize;
    /// Entries held.
    fn held(&self) -> usize;
}

impl<C: crate::limiter::Clock> Housekeeping for MemoryLimiter<C> {
    fn sweep(&self) -> usize {
        MemoryLimiter::sweep(self)
    }

    fn held(&self) -> usize {
        self.len()
    }
}

impl Housekeeping for RedisLimiter {
    fn sweep(&self) -> usize {
        RedisLimiter::sweep(self)
    }

    fn held(&self) -> usize {
        RedisLimiter::held(self)
    }
}

/// A built service, ready to run.
pub struct App {
    engine: Arc<Engine>,
    rules: Arc<ArcSwap<RuleSet>>,
    housekeeping: Option<(Arc<dyn Housekeeping>, Duration)>,
}

impl App {
    /// Builds the backend and the engine. Fails on settings it cannot honour.
    /// With the Redis backend, no connection is made here: sluice starts while Redis is down.
    pub fn build(settings: &Settings, rules: RuleSet) -> anyhow::Result<App> {
        let (limiter, state): (Arc<dyn Limiter>, Arc<dyn Housekeeping>) =
            match settings.limiter.backend {
                Backend::Memory => {
                    let memory = Arc::new(MemoryLimiter::new(settings.memory.max_keys));
                    (memory.clone(), memory)
                }
                Backend::Redis => {
                    let redis = RedisLimiter::new(&settings.redis, settings.memory.max_keys)
                        .context("invalid [redis] settings")?;
                    let redis = Arc::new(redis);
                    (redis.clone(), redis)
                }
            };
        let every = Duration::from_secs(settings.memory.sweep_interval_secs.max(1));
        let mut app = App::from_parts(settings, rules, limiter);
        app.housekeeping = Some((state, every));
        Ok(app)
    }

    /// A service over a given limiter, with no housekeeping task.
    pub fn from_parts(settings: &Settings, rules: RuleSet, limiter: Arc<dyn Limiter>) -> App {
        let rules = Arc::new(ArcSwap::from_pointee(rules));
        let engine = Engine::new(rules.clone(), limiter, options_of(settings));
        App {
            engine: Arc::new(engine),
            rules,
            housekeeping: None,
        }
    }

    /// The engine (for in-process callers and tests).
    pub fn engine(&self) -> Arc<Engine> {
        self.engine.clone()
    }

    /// The active rules, shared with the engine; storing a new set swaps it atomically.
    pub fn rules(&self) -> Arc<ArcSwap<RuleSet>> {
        self.rules.clone()
    }

    /// Serves gRPC on `grpc` until `shutdown` resolves, then drains and returns.
    pub async fn run(
        self,
        grpc: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if let Some((state, every)) = self.housekeeping.clone() {
            tasks.spawn(housekeeping(state, every, stop.clone()));
        }
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in HEALTH_NAMES {
            health
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
        }
        let (reflection_v1, reflection_v1alpha) = reflection()?;
        let addr = grpc.local_addr().ok();
        tracing::info!(?addr, backend = self.engine.backend_name(), "serving gRPC");
        let on_shutdown = async move {
            shutdown.await;
            for name in HEALTH_NAMES {
                health
                    .set_service_status(name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
            health
                .set_not_serving::<RateLimitServiceServer<RateLimiter>>()
                .await;
            tracing::info!("draining in-flight requests");
        };
        let served = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(RateLimiter::new(self.engine.clone()).into_service())
            .serve_with_incoming_shutdown(TcpListenerStream::new(grpc), on_shutdown)
            .await;
        stop.cancel();
        while let Some(joined) = tasks.join_next().await {
            joined.context("background task failed")?;
        }
        served.context("gRPC server failed")?;
        tracing::info!("stopped");
        Ok(())
    }
}

fn options_of(settings: &Settings) -> Options {
    let r = &settings.response;
    Options {
        shadow_mode: settings.rules.shadow_mode,
        headers: r.headers.then(|| HeaderNames {
            limit: r.limit_header.clone(),
            remaining: r.remaining_header.clone(),
            reset: r.reset_header.clone(),
            retry_after: r.retry_after,
        }),
        echo_metadata: r.dynamic_metadata,
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

/// Sweeps backend state every `every` until stopped.
async fn housekeeping(state: Arc<dyn Housekeeping>, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let dropped = state.sweep();
                tracing::debug!(dropped, held = state.held(), "backend sweep");
            }
        }
    }
}
