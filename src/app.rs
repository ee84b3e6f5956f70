//! Serving: builds the engine from settings and rules, runs the gRPC server and the admin
//! HTTP server on listeners it is given, and stops on the shutdown future it is given (never
//! reading signals itself). Reloads come from file changes and from a [`ReloadTrigger`].
//!
//! Shutdown order (see `app/lifecycle.rs`): readiness fails at once (`/readyz` and gRPC health
//! NOT_SERVING), the drain delay passes, the gRPC server stops accepting and finishes the
//! requests in flight, then the admin server and background tasks stop and `run` returns. The
//! caller bounds all of it with a grace period.

mod lifecycle;
mod persist;
pub mod server;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use crate::compat::stats::RatelimitStats;
use crate::config::limitador::labels::MetricLabels;
use crate::config::rules_file::LoadOptions;
use crate::config::settings::{Backend, Settings};
use crate::engine::{Engine, HeaderNames, Observers, Options};
use crate::health::RulesProbe;
use crate::limiter::{Limiter, MemoryLimiter, RedisLimiter};
use crate::metrics::{Metrics, MetricsOptions};
use crate::reload::{ActiveRules, ReloadTrigger, Reloaded};
use crate::rules::RuleSet;
use crate::tls::{ActiveTls, TlsError, TlsFiles};

pub use lifecycle::Listeners;

/// A built service, ready to run.
pub struct App {
    engine: Arc<Engine>,
    rules: Arc<ActiveRules>,
    metrics: Arc<Metrics>,
    /// envoyproxy/ratelimit's stats (statsd, its metric names, the debug port), when asked for.
    ratelimit_stats: Option<Arc<RatelimitStats>>,
    /// The one backend: the engine decides with it; housekeeping, readiness and metrics ask
    /// it through the provided methods of [`Limiter`].
    limiter: Arc<dyn Limiter>,
    /// Where rules come from when not from files (xDS); readiness asks it.
    rules_source: Option<Arc<dyn RulesProbe>>,
    /// How often the backend is swept; none: no housekeeping task (neither the sweep nor the
    /// readiness probe runs).
    housekeeping: Option<Duration>,
    reload_trigger: ReloadTrigger,
    reload_requests: mpsc::Receiver<()>,
    ops: OpsSettings,
    tls: Option<(TlsFiles, ActiveTls)>,
    rlqs: Arc<crate::rlqs::Rlqs>,
    /// The admin token (`admin.token`; `build` also reads `admin.token_file`).
    access: crate::admin::access::Access,
    /// The memory backend's snapshot file (`limiter.persist`), when kept.
    persist: Option<Arc<persist::Persist>>,
    /// The Memcached backend's SRV lookups (`memcache.srv`), when asked for; taken by `run`.
    memcache_srv: Option<crate::memcache_srv::SrvWatch>,
}

/// The operations settings `run` needs.
#[derive(Debug, Clone, Copy)]
struct OpsSettings {
    drain_delay: Duration,
    watch: bool,
    debounce: Duration,
    /// HTTP/2 streams allowed at once on one gRPC connection.
    max_concurrent_streams: u32,
    /// Each gRPC stream on a task of its own (`server.stream_tasks`).
    stream_tasks: bool,
    /// The gRPC port's preface and idle timeouts and connection cap.
    connections: crate::transport::ConnectionLimits,
}

/// The backend of `settings`: memory, Redis (with per-second limits in a Redis of their own
/// when `redis.per_second_url` is set), or Memcached.
/// The kept snapshot of the memory backend's state (`limiter.persist`), when there is one.
type Kept = Option<Arc<persist::Persist>>;

/// The backend `limiter.backend` names, and with `limiter.persist` the memory backend's
/// snapshot keeper (the state read back from the file first).
fn limiter_of(settings: &Settings) -> anyhow::Result<(Arc<dyn Limiter>, Kept)> {
    let max_keys = settings.memory.max_keys;
    let redis = |s: &crate::config::settings::RedisSettings| {
        RedisLimiter::new(s, max_keys).context("invalid [redis] settings")
    };
    Ok(match settings.limiter.backend {
        Backend::Memory => {
            let memory = Arc::new(MemoryLimiter::new(max_keys));
            let kept = settings.limiter.persist.as_ref().map(|path| {
                let every = Duration::from_millis(settings.limiter.persist_interval_ms.max(1));
                Arc::new(persist::Persist::restore(
                    memory.clone(),
                    path.clone(),
                    every,
                ))
            });
            (memory, kept)
        }
        Backend::Redis => match settings.redis.per_second() {
            None => (Arc::new(redis(&settings.redis)?), None),
            Some(second) => (
                Arc::new(crate::limiter::PerSecond::new(
                    Arc::new(redis(&settings.redis)?),
                    Arc::new(redis(&second).context("redis.per_second_url")?),
                )),
                None,
            ),
        },
        Backend::Memcache => (memcache(settings)?.0, None),
    })
}

/// The Memcached backend, and its SRV lookups when `memcache.srv` asks for them.
fn memcache(
    settings: &Settings,
) -> anyhow::Result<(Arc<dyn Limiter>, Option<crate::memcache_srv::SrvWatch>)> {
    let limiter = Arc::new(
        crate::limiter::MemcacheLimiter::new(
            &settings.memcache,
            Arc::new(crate::limiter::MonotonicClock::new()),
        )
        .context("invalid [memcache] settings")?,
    );
    let srv = crate::memcache_srv::SrvWatch::new(&settings.memcache, limiter.clone())?;
    Ok((limiter, srv))
}

impl App {
    /// Builds the backend and the engine. Fails on settings it cannot honour.
    /// With the Redis backend, no connection is made here: sluice starts while Redis is down.
    pub fn build(settings: &Settings, rules: RuleSet) -> anyhow::Result<App> {
        let (limiter, persist, srv) = match settings.limiter.backend {
            Backend::Memcache => {
                let (limiter, srv) = memcache(settings)?;
                (limiter, None, srv)
            }
            _ => {
                let (limiter, persist) = limiter_of(settings)?;
                (limiter, persist, None)
            }
        };
        let mut app = App::from_parts(settings, rules, limiter);
        app.persist = persist;
        app.memcache_srv = srv;
        app.housekeeping = Some(Duration::from_secs(
            settings.memory.sweep_interval_secs.max(1),
        ));
        if let Some(limitador) = app.metrics.limitador() {
            let m = &settings.metrics;
            let (labels, left_out) = MetricLabels::load(
                m.limitador_labels_file.as_deref(),
                m.limitador_labels_default.as_deref(),
            )
            .map_err(anyhow::Error::msg)?;
            for said in left_out {
                tracing::error!("{said}");
            }
            limitador.set_labels(labels);
        }
        let token = settings.admin.resolve_token().map_err(anyhow::Error::msg)?;
        app.access = crate::admin::access::Access::new(
            token,
            settings.admin.token_metrics,
            settings.admin.open_decisions,
        );
        if let Some(files) = TlsFiles::from_settings(&settings.tls) {
            app = app.with_tls(files)?;
        }
        Ok(app)
    }

    /// A service over a given limiter, with no housekeeping task (no periodic sweep or
    /// probe; readiness still asks the limiter). Reloads read `settings.rules.paths` (none:
    /// the embedded demo rules).
    pub fn from_parts(settings: &Settings, rules: RuleSet, limiter: Arc<dyn Limiter>) -> App {
        let rules = Arc::new(ActiveRules::new(
            rules,
            settings.rules.paths.clone(),
            LoadOptions::from(settings),
        ));
        let metrics = Metrics::new(MetricsOptions {
            near_limit_ratio: settings.metrics.near_limit_ratio,
            max_value_label_sets: settings.metrics.max_value_label_sets,
            limitador: settings
                .metrics
                .limitador
                .then_some(settings.metrics.limitador_limit_name_label),
        });
        // envoyproxy/ratelimit's stats, when something will send or serve them.
        let ratelimit_stats = (settings.statsd.enabled()
            || settings.ratelimit_metrics.listen.is_some()
            || settings.debug.listen.is_some())
        .then(|| {
            Arc::new(RatelimitStats::new(
                settings.metrics.near_limit_ratio,
                settings.metrics.max_value_label_sets,
            ))
        });
        let mut observers = Observers::new().with(metrics.clone());
        if let Some(stats) = &ratelimit_stats {
            observers = observers.with(stats.clone());
        }
        if let Some(limitador) = metrics.limitador() {
            observers = observers.with(limitador.clone());
        }
        let engine = Engine::new(rules.shared(), limiter.clone(), options_of(settings))
            .with_observer(Arc::new(observers));
        let (reload_trigger, reload_requests) = ReloadTrigger::channel();
        let engine = Arc::new(engine);
        let rlqs = crate::rlqs::Rlqs::new(
            engine.clone(),
            rules.shared(),
            metrics.clone(),
            settings.rlqs,
        );
        App {
            engine,
            rules,
            metrics,
            ratelimit_stats,
            limiter,
            rules_source: None,
            housekeeping: None,
            reload_trigger,
            reload_requests,
            ops: OpsSettings {
                drain_delay: Duration::from_secs(settings.server.drain_delay_secs),
                watch: settings.reload.watch,
                debounce: Duration::from_millis(settings.reload.debounce_ms),
                max_concurrent_streams: settings.input.max_concurrent_streams,
                stream_tasks: settings.server.stream_tasks,
                connections: (&settings.server).into(),
            },
            tls: None,
            rlqs,
            access: crate::admin::access::Access::new(
                settings.admin.token.clone(),
                settings.admin.token_metrics,
                settings.admin.open_decisions,
            ),
            persist: None,
            memcache_srv: None,
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

    /// The Rate Limit Quota Service (for in-process callers and tests).
    pub fn rlqs(&self) -> Arc<crate::rlqs::Rlqs> {
        self.rlqs.clone()
    }

    /// The app's metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// envoyproxy/ratelimit's stats, counted when statsd, its metric names or the debug port
    /// are asked for.
    pub fn ratelimit_stats(&self) -> Option<Arc<RatelimitStats>> {
        self.ratelimit_stats.clone()
    }

    /// What counts a rules load (from files or xDS): the metrics, and envoyproxy/ratelimit's
    /// stats when counted.
    pub(crate) fn reload_report(&self) -> impl Fn(&Reloaded) + Send + Sync + 'static {
        let (metrics, stats) = (self.metrics.clone(), self.ratelimit_stats.clone());
        move |outcome| {
            metrics.reloaded(outcome);
            if let Some(stats) = &stats {
                stats.reloaded(outcome);
            }
        }
    }

    /// Asks the running app to reload its rules (what SIGHUP does).
    pub fn reload_trigger(&self) -> ReloadTrigger {
        self.reload_trigger.clone()
    }

    /// The active rules and their history (for a rules source other than files).
    pub(crate) fn active_rules(&self) -> Arc<ActiveRules> {
        self.rules.clone()
    }

    /// Rules come from `source` (xDS) from now on: reloads from files stop, and readiness asks
    /// `source` whether rules are loaded.
    pub(crate) fn set_rules_source(&mut self, source: Arc<dyn RulesProbe>) {
        self.rules.set_external();
        self.rules_source = Some(source);
    }

    /// The snapshot file, for a last write when the grace period cuts the drain short.
    pub(crate) fn persist(&self) -> Option<Arc<persist::Persist>> {
        self.persist.clone()
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
