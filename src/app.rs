//! Serving: builds the engine from settings and rules, runs the gRPC server and the admin
//! HTTP server on listeners it is given, and stops on the shutdown future it is given (never
//! reading signals itself). Reloads come from file changes and from a [`ReloadTrigger`].
//!
//! Shutdown order (see `app/lifecycle.rs`): readiness fails at once (`/readyz` and gRPC health
//! NOT_SERVING), the drain delay passes, the gRPC server stops accepting and finishes the
//! requests in flight, then the admin server and background tasks stop and `run` returns. The
//! caller bounds all of it with a grace period.

mod lifecycle;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use crate::config::settings::{Backend, OnError, Settings};
use crate::engine::{Engine, HeaderNames, Options};
use crate::health::BackendProbe;
use crate::limiter::{Limiter, MemoryLimiter, RedisLimiter};
use crate::metrics::{Metrics, MetricsOptions};
use crate::reload::{ActiveRules, ReloadTrigger};
use crate::rules::RuleSet;
use crate::tls::{ActiveTls, TlsError, TlsFiles};

pub use lifecycle::Listeners;

/// Periodic clean-up of a backend's state.
pub trait Housekeeping: Send + Sync + 'static {
    /// Drops state that is no longer needed; returns how many entries went.
    fn sweep(&self) -> usize;
    /// Entries held.
    fn held(&self) -> usize;
    /// Checks that the backend is reachable (and records it for readiness); `None` when the
    /// backend has nothing to probe.
    fn probe(&self) -> Option<crate::limiter::BoxFuture<'_, ()>> {
        None
    }
    /// Running totals of backend events (`(event, count)`), exported as metrics.
    fn events(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
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

    fn probe(&self) -> Option<crate::limiter::BoxFuture<'_, ()>> {
        Some(Box::pin(RedisLimiter::probe(self)))
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        RedisLimiter::events(self)
    }
}

impl BackendProbe for RedisLimiter {
    fn ready(&self) -> Result<(), String> {
        self.health()
    }
}

/// A built service, ready to run.
pub struct App {
    engine: Arc<Engine>,
    rules: Arc<ActiveRules>,
    metrics: Arc<Metrics>,
    backend_probe: Option<Arc<dyn BackendProbe>>,
    housekeeping: Option<(Arc<dyn Housekeeping>, Duration)>,
    reload_trigger: ReloadTrigger,
    reload_requests: mpsc::Receiver<()>,
    ops: OpsSettings,
    tls: Option<(TlsFiles, ActiveTls)>,
    /// The admin token (`admin.token`; `build` also reads `admin.token_file`).
    access: crate::admin::access::Access,
}

/// The operations settings `run` needs.
#[derive(Debug, Clone, Copy)]
struct OpsSettings {
    drain_delay: Duration,
    watch: bool,
    debounce: Duration,
    /// HTTP/2 streams allowed at once on one gRPC connection.
    max_concurrent_streams: u32,
}

impl App {
    /// Builds the backend and the engine. Fails on settings it cannot honour.
    /// With the Redis backend, no connection is made here: sluice starts while Redis is down.
    pub fn build(settings: &Settings, rules: RuleSet) -> anyhow::Result<App> {
        let (limiter, state, probe): (Arc<dyn Limiter>, Arc<dyn Housekeeping>, _) =
            match settings.limiter.backend {
                Backend::Memory => {
                    let memory = Arc::new(MemoryLimiter::new(settings.memory.max_keys));
                    (memory.clone(), memory, None)
                }
                Backend::Redis => {
                    let redis = RedisLimiter::new(&settings.redis, settings.memory.max_keys)
                        .context("invalid [redis] settings")?;
                    let redis = Arc::new(redis);
                    let probe = readiness_follows_redis(settings.redis.on_error)
                        .then(|| redis.clone() as Arc<dyn BackendProbe>);
                    (redis.clone(), redis, probe)
                }
            };
        let every = Duration::from_secs(settings.memory.sweep_interval_secs.max(1));
        let mut app = App::from_parts(settings, rules, limiter);
        app.housekeeping = Some((state, every));
        app.backend_probe = probe;
        let token = settings.admin.resolve_token().map_err(anyhow::Error::msg)?;
        app.access = crate::admin::access::Access::new(token, settings.admin.token_metrics);
        if let Some(files) = settings.tls.files() {
            app = app.with_tls(files)?;
        }
        Ok(app)
    }

    /// A service over a given limiter, with no housekeeping task. Reloads read
    /// `settings.rules.paths` (none: the embedded demo rules).
    pub fn from_parts(settings: &Settings, rules: RuleSet, limiter: Arc<dyn Limiter>) -> App {
        let rules = Arc::new(ActiveRules::new(
            rules,
            settings.rules.paths.clone(),
            (&settings.limits).into(),
        ));
        let metrics = Metrics::new(MetricsOptions {
            near_limit_ratio: settings.metrics.near_limit_ratio,
            max_value_label_sets: settings.metrics.max_value_label_sets,
        });
        let engine = Engine::new(rules.shared(), limiter, options_of(settings))
            .with_observer(metrics.clone());
        let (reload_trigger, reload_requests) = ReloadTrigger::channel();
        App {
            engine: Arc::new(engine),
            rules,
            metrics,
            backend_probe: None,
            housekeeping: None,
            reload_trigger,
            reload_requests,
            ops: OpsSettings {
                drain_delay: Duration::from_secs(settings.server.drain_delay_secs),
                watch: settings.reload.watch,
                debounce: Duration::from_millis(settings.reload.debounce_ms),
                max_concurrent_streams: settings.input.max_concurrent_streams,
            },
            tls: None,
            access: crate::admin::access::Access::new(
                settings.admin.token.clone(),
                settings.admin.token_metrics,
            ),
        }
    }

    /// Serves gRPC over TLS with these files (loaded now, and again when they change).
    pub fn with_tls(mut self, files: TlsFiles) -> Result<App, TlsError> {
        let config = files.load()?;
        self.tls = Some((files, Arc::new(ArcSwap::new(config))));
        Ok(self)
    }

    /// The engine (for in-process callers and tests).
    pub fn engine(&self) -> Arc<Engine> {
        self.engine.clone()
    }

    /// The active rules, shared with the engine; storing a new set swaps it atomically.
    pub fn rules(&self) -> Arc<ArcSwap<RuleSet>> {
        self.rules.shared()
    }

    /// The app's metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Asks the running app to reload its rules (what SIGHUP does).
    pub fn reload_trigger(&self) -> ReloadTrigger {
        self.reload_trigger.clone()
    }

    /// Makes readiness depend on the backend (without one, the backend is always ready).
    pub fn set_backend_probe(&mut self, probe: Arc<dyn BackendProbe>) {
        self.backend_probe = Some(probe);
    }

    /// Serves until `shutdown` resolves, then drains in order and returns. `listeners` is the
    /// gRPC listener alone, or [`Listeners`] with the admin one.
    pub async fn run(
        self,
        listeners: impl Into<Listeners>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        lifecycle::run(self, listeners.into(), shutdown).await
    }
}

/// Whether readiness waits for Redis. Only with `on_error = "error"`: the other settings
/// answer while Redis is down (`allow`, `deny`, or the local limiter), so a replica that
/// cannot reach Redis still serves, and taking every replica out of the Service at once would
/// hand the decision to the client's failure mode instead.
fn readiness_follows_redis(on_error: OnError) -> bool {
    on_error == OnError::Error
}

fn options_of(settings: &Settings) -> Options {
    let r = &settings.response;
    Options {
        shadow_mode: settings.rules.shadow_mode,
        quota_mode: settings.limits.quota_mode,
        headers: r.headers.then(|| HeaderNames {
            limit: r.limit_header.clone(),
            remaining: r.remaining_header.clone(),
            reset: r.reset_header.clone(),
            retry_after: r.retry_after,
        }),
        echo_metadata: r.dynamic_metadata,
        input: settings.input,
    }
}
