//! Prometheus metrics: one registry per app (no global registry), fed by the engine through
//! its [`Observer`] seam and by the reloads, encoded as text by `/metrics`.
//!
//! Every metric is listed, with its labels, in docs/operating.md ("Metrics"). The per-rule counters
//! and how their label sets are bounded are in [`per_rule`].

/// Registers each `name, help, metric;` in `registry`, with a clone of the metric (the registry
/// holds its own handle to the same values).
macro_rules! register {
    ($registry:expr, $($name:literal, $help:literal, $metric:expr;)+) => {
        $($registry.register($name, $help, $metric.clone());)+
    };
}

pub mod history;
mod latency;
pub mod limitador;
pub mod live;
pub mod per_rule;
pub mod rlqs;
mod throttle;
pub mod top;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::engine::{DescriptorReport, Observer, RequestResult};
use crate::reload::{ConfigStatus, Reloaded};
use crate::rules::RuleSet;
use latency::Latency;
use per_rule::RuleCounters;
use throttle::ThrottleCounters;

/// The content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the metrics are configured with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricsOptions {
    /// A descriptor is near its limit once more than this share of its capacity is used.
    pub near_limit_ratio: f64,
    /// At most this many per-rule label sets built from request values (see [`per_rule`]).
    pub max_value_label_sets: usize,
    /// Serve limitador's metric names too; `Some(true)`: with the `limit_name` label.
    pub limitador: Option<bool>,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            near_limit_ratio: 0.8,
            max_value_label_sets: 10_000,
            limitador: None,
        }
    }
}

/// The `result` label of `sluice_requests_total`; every one exists from the start.
const RESULTS: [&str; 4] = ["ok", "over_limit", "invalid", "unavailable"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendErrorLabels {
    backend: &'static str,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendEventLabels {
    backend: &'static str,
    event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    backend: &'static str,
    node: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FormLabels {
    form: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// What the backend reports at scrape time.
#[derive(Debug, Clone, Default)]
pub struct BackendReport {
    /// States held in process.
    pub keys_held: usize,
    /// Running totals of backend events, `(event, count)`.
    pub events: Vec<(&'static str, u64)>,
    /// The backend's nodes, each with whether its circuit breaker is open.
    pub nodes: Vec<(String, bool)>,
}

/// Every metric of one app.
pub struct Metrics {
    registry: Registry,
    rules: RuleCounters,
    throttle: ThrottleCounters,
    requests: Family<ResultLabels, Counter>,
    /// The counters of `requests`, one per result, in the order of [`RESULTS`].
    by_result: [Counter; RESULTS.len()],
    latency: Latency,
    backend_errors: Family<BackendErrorLabels, Counter>,
    memory_keys: Gauge,
    backend_events: Family<BackendEventLabels, Counter>,
    /// 1 while a node's circuit breaker is open, else 0; only the nodes known now.
    breakers: Family<NodeLabels, Gauge>,
    reloads: Family<OutcomeLabels, Counter>,
    /// Admin `/counters/reset` calls, by form (`key`, `rule`).
    resets: Family<FormLabels, Counter>,
    /// Keys forgotten by those resets (held by the backend when reset), by form.
    reset_keys: Family<FormLabels, Counter>,
    config_version: Gauge,
    config_loaded: Gauge,
    rlqs: rlqs::RlqsMetrics,
    live: live::LiveRules,
    top: top::TopDenied,
    history: history::History,
    /// The errors of the last failed reload, and when.
    last_reload_error: parking_lot::Mutex<Option<(SystemTime, String)>>,
    /// limitador's series, when served ([`limitador`]).
    limitador: Option<Arc<limitador::LimitadorMetrics>>,
}

impl Metrics {
    pub fn new(options: MetricsOptions) -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("sluice");
        let rules = RuleCounters::new(options, &mut registry);
        let rlqs = rlqs::RlqsMetrics::new(&mut registry);
        let throttle = ThrottleCounters::new(options.max_value_label_sets, &mut registry);
        let live = live::LiveRules::new(&mut registry);
        let m = Metrics {
            live,
            top: top::TopDenied::default(),
            history: history::History::default(),
            last_reload_error: parking_lot::Mutex::new(None),
            limitador: options.limitador.map(|with_name| {
                Arc::new(limitador::LimitadorMetrics::new(
                    with_name,
                    options.max_value_label_sets,
                ))
            }),
            rules,
            throttle,
            requests: Family::default(),
            by_result: Default::default(),
            latency: Latency::default(),
            backend_errors: Family::default(),
            memory_keys: Gauge::default(),
            backend_events: Family::default(),
            breakers: Family::default(),
            reloads: Family::default(),
            resets: Family::default(),
            reset_keys: Family::default(),
            config_version: Gauge::default(),
            config_loaded: Gauge::default(),
            rlqs,
            registry: Registry::default(),
        };
        register!(
            registry,
            "requests", "ShouldRateLimit requests by result", m.requests;
            "request_duration_seconds", "Time the engine took to answer ShouldRateLimit", m.latency;
            "backend_errors", "Limiter backend failures by backend and kind", m.backend_errors;
            "memory_keys", "Limiter states held in process (memory backend; Redis: deny cache and local fallback)", m.memory_keys;
            "backend_events", "Backend events by backend and event: Redis deny_cache_hit, breaker_open, failure, fallback, redirect, moved, ask, wait_short, lease_taken, lease_returned (units), lease_lost (units), lease_decided; with redis.global_url: global_share_taken, global_share_returned (units), global_share_lost (units), global_home_failure, global_fallback_admitted, global_fallback_denied, and the wait for home as a cumulative histogram: global_wait_le_1ms ... global_wait_le_500ms, global_wait (all waits), global_wait_micros (their sum)", m.backend_events;
            "backend_breaker_open", "1 while the circuit breaker of a backend node (a Redis server, master or Cluster master) is open, else 0", m.breakers;
            "config_reloads", "Rules reloads by outcome", m.reloads;
            "counter_resets", "Admin /counters/reset calls by form (key, rule)", m.resets;
            "counter_reset_keys", "Keys held by the backend when an admin /counters/reset forgot them, by form", m.reset_keys;
            "config_version", "Version of the active rules", m.config_version;
            "config_loaded_timestamp_seconds", "When the active rules were loaded (Unix time)", m.config_loaded;
        );
        let by_result =
            RESULTS.map(|result| m.requests.get_or_create(&ResultLabels { result }).clone());
        for form in ["key", "rule"] {
            m.resets.get_or_create(&FormLabels { form }).inc_by(0);
            m.reset_keys.get_or_create(&FormLabels { form }).inc_by(0);
        }
        for outcome in ["success", "unchanged", "failure"] {
            m.reloads
                .get_or_create(&OutcomeLabels { outcome })
                .inc_by(0);
        }
        Arc::new(Metrics {
            registry,
            by_result,
            ..m
        })
    }

    /// limitador's series, when they are served (an observer of the engine of their own).
    pub fn limitador(&self) -> Option<&Arc<limitador::LimitadorMetrics>> {
        self.limitador.as_ref()
    }

    /// The Rate Limit Quota Service's metrics.
    pub fn rlqs(&self) -> &rlqs::RlqsMetrics {
        &self.rlqs
    }

    /// Counts an admin reset of `form` (`key` or `rule`) that forgot `held` keys.
    pub fn reset(&self, form: &'static str, held: usize) {
        self.resets.get_or_create(&FormLabels { form }).inc();
        let held = u64::try_from(held).unwrap_or(u64::MAX);
        self.reset_keys
            .get_or_create(&FormLabels { form })
            .inc_by(held);
    }

    /// Counts a reload.
    pub fn reloaded(&self, outcome: &Reloaded) {
        if let Reloaded::Failed(errors) = outcome {
            *self.last_reload_error.lock() = Some((SystemTime::now(), errors.to_string()));
        }
        let outcome = outcome.label();
        self.reloads.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Sets the values read at scrape time: the rules' version, and the backend's size and
    /// event totals (given with the backend's name).
    pub fn refresh(&self, config: &ConfigStatus, backend: Option<(&'static str, &BackendReport)>) {
        self.config_version
            .set(i64::try_from(config.version).unwrap_or(i64::MAX));
        let loaded = config
            .loaded_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.config_loaded
            .set(i64::try_from(loaded.as_secs()).unwrap_or(i64::MAX));
        if let Some((name, report)) = backend {
            self.memory_keys
                .set(i64::try_from(report.keys_held).unwrap_or(i64::MAX));
            for &(event, total) in &report.events {
                let labels = BackendEventLabels {
                    backend: name,
                    event,
                };
                let counter = self.backend_events.get_or_create(&labels);
                counter.inc_by(total.saturating_sub(counter.get()));
            }
            self.breakers.clear();
            for (node, open) in &report.nodes {
                let labels = NodeLabels {
                    backend: name,
                    node: node.clone(),
                };
                self.breakers.get_or_create(&labels).set(i64::from(*open));
            }
        }
    }

    /// Sets the gauges read from the active rules (limits, periods, the busiest key's share
    /// since the last call) and forgets the top denied keys of domains no longer configured.
    pub(crate) fn refresh_rules(&self, rules: &RuleSet) {
        self.live.refresh(rules);
        self.top.retain(|name| rules.domain(name).is_some());
    }

    /// Takes one sample of every rule's rates for the admin page ([`history`]).
    pub fn sample(&self, rules: &RuleSet) {
        self.history.sample(rules, &self.live);
    }

    /// The sampled rates.
    pub fn history(&self) -> &history::History {
        &self.history
    }

    /// What is followed per rule (the admin page reads the holds of `concurrency` rules).
    pub fn live(&self) -> &live::LiveRules {
        &self.live
    }

    /// The keys denied most.
    pub(crate) fn top_denied(&self) -> &top::TopDenied {
        &self.top
    }

    /// When the last failed reload was, and its errors.
    pub fn last_reload_error(&self) -> Option<(SystemTime, String)> {
        self.last_reload_error.lock().clone()
    }

    /// Every metric in the OpenMetrics text format (which Prometheus reads).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl crate::rlqs::RlqsObserver for Metrics {
    fn reported(&self, domain: &str, rule: &str, allowed: u64, denied: u64) {
        self.rlqs.reported(domain, rule, allowed, denied);
    }

    fn streams(&self, delta: i64) {
        self.rlqs.streams(delta);
    }

    fn buckets(&self, delta: i64) {
        self.rlqs.buckets(delta);
    }

    fn assigned(&self, kind: &'static str) {
        self.rlqs.assigned(kind);
    }

    fn refused(&self, kind: &'static str) {
        self.rlqs.refused(kind);
    }
}

impl Observer for Metrics {
    fn descriptor(&self, report: &DescriptorReport<'_>) {
        self.rules.record(report);
        self.live.record(report, self.rules.near_part(report));
        self.top.record(report);
    }

    fn request(&self, result: RequestResult<'_>, elapsed: Duration) {
        let index = match result {
            RequestResult::Ok => 0,
            RequestResult::OverLimit => 1,
            RequestResult::Invalid => 2,
            RequestResult::Unavailable(_) => 3,
        };
        debug_assert_eq!(RESULTS[index], result.as_str());
        self.by_result[index].inc();
        self.latency.observe(elapsed);
        if let RequestResult::Unavailable(e) = result {
            let kind = if e.transient {
                "transient"
            } else {
                "permanent"
            };
            let labels = BackendErrorLabels {
                backend: e.backend,
                kind,
            };
            self.backend_errors.get_or_create(&labels).inc();
        }
    }
}

impl crate::throttle::ThrottleObserver for Metrics {
    fn throttled(&self, name: &str, result: crate::throttle::ThrottleResult) {
        self.throttle.record(name, result);
    }
}
