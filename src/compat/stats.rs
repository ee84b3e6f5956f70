//! envoyproxy/ratelimit's stats, counted under its names: per rule
//! `ratelimit.service.rate_limit.<domain>.<rule>.{total_hits,over_limit,near_limit,within_limit,shadow_mode,over_limit_with_local_cache}`,
//! per unknown domain `ratelimit.service.rate_limit.<domain>.domain_not_found`, and the
//! service's `ratelimit.service.config_load_{success,error}`,
//! `ratelimit.service.call.should_rate_limit.{redis_error,service_error}`,
//! `ratelimit.service.global_shadow_mode`,
//! `ratelimit_server.ShouldRateLimit.{total_requests,response_time}`.
//!
//! `<domain>.<rule>` is the stats key: the domain and sluice's `rule` label (the same path
//! segments as envoyproxy/ratelimit's stats key: `key`, `key_value`, `key_pattern`, request
//! values for `detailed_metric`/`value_to_metric`, `key_value` segments for overrides), with
//! its sanitizing: `:` and `|` become `_`, and so do the dots of anything shaped like an IPv4
//! address. The counts are sluice's (the same as `sluice_rule_*_total`). Keys built from
//! request values are capped by `metrics.max_value_label_sets`, as sluice's own labels: past
//! the cap they count under `<domain>.__other__`. Unknown domains, sent by clients, are
//! capped the same way: past `metrics.max_value_label_sets` distinct ones, their
//! `domain_not_found` counts under `__other__.domain_not_found`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use parking_lot::{Mutex, RwLock};

use super::mapper::{DEFAULT_BUCKETS, Observer as Shape};
use super::summary::Window;

use crate::engine::{DescriptorReport, Observer, RequestResult};
use crate::metrics::per_rule::OTHER;
use crate::reload::Reloaded;
use crate::rules::naming::{rule_label, value_segments};

/// The per-rule stats, in this order.
pub(crate) const RULE_STATS: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "over_limit_with_local_cache",
];

const HITS: usize = 0;
const OVER: usize = 1;
const NEAR: usize = 2;
const WITHIN: usize = 3;
const SHADOW: usize = 4;
const LOCAL_CACHE: usize = 5;

/// The service-level counters, in this order, with their statsd names.
pub(crate) const SERVICE_STATS: [&str; 6] = [
    "ratelimit.service.config_load_success",
    "ratelimit.service.config_load_error",
    "ratelimit.service.call.should_rate_limit.redis_error",
    "ratelimit.service.call.should_rate_limit.service_error",
    "ratelimit_server.ShouldRateLimit.total_requests",
    "ratelimit.service.global_shadow_mode",
];

const LOAD_SUCCESS: usize = 0;
const LOAD_ERROR: usize = 1;
const REDIS_ERROR: usize = 2;
const SERVICE_ERROR: usize = 3;
const TOTAL_REQUESTS: usize = 4;
const GLOBAL_SHADOW: usize = 5;

/// The name of the response-time timer.
pub(crate) const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// The stats key of the unknown domains past the cap.
const OTHER_DOMAINS: &str = OTHER;

/// At most this many response times are kept between two statsd flushes.
const MAX_SAMPLES: usize = 1000;

/// The counters of one stats key.
#[derive(Debug, Default)]
pub(crate) struct RuleStat {
    pub counts: [AtomicU64; 6],
}

/// The response time as the mapping renders it, and the samples not yet sent to statsd.
#[derive(Debug)]
pub(crate) struct Latency {
    shape: Recorder,
    sum_seconds: f64,
    count: u64,
    samples: Vec<Duration>,
}

#[derive(Debug)]
enum Recorder {
    /// A histogram: its upper bounds (seconds), and the count per bound then +Inf (not
    /// cumulative).
    Buckets { bounds: Vec<f64>, counts: Vec<u64> },
    /// A summary: its quantiles, over a window.
    Window {
        quantiles: Vec<f64>,
        window: Box<Window>,
    },
}

impl Latency {
    fn new(shape: &Shape) -> Latency {
        let shape = match shape {
            Shape::Histogram { buckets } => Recorder::Buckets {
                bounds: buckets.clone(),
                counts: vec![0; buckets.len() + 1],
            },
            Shape::Summary {
                quantiles,
                max_age,
                age_buckets,
            } => Recorder::Window {
                quantiles: quantiles.clone(),
                window: Box::new(Window::new(*max_age, *age_buckets, Instant::now())),
            },
        };
        Latency {
            shape,
            sum_seconds: 0.0,
            count: 0,
            samples: Vec::new(),
        }
    }
}

/// The response time, read for rendering.
#[derive(Debug, Clone, PartialEq)]
pub enum LatencyView {
    /// Upper bounds (seconds, then +Inf) with their cumulative counts.
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
        count: u64,
    },
    /// Quantiles with their values over the window (seconds; `NaN` when it is empty).
    Summary {
        quantiles: Vec<(f64, f64)>,
        sum: f64,
        count: u64,
    },
}

/// Every stat, counted as requests are decided.
#[derive(Debug)]
pub struct RatelimitStats {
    near_ratio: f64,
    max_value_keys: usize,
    value_keys: AtomicUsize,
    rules: RwLock<HashMap<String, Arc<RuleStat>>>,
    /// `domain_not_found` per domain as the client sent it (sanitized when read).
    unknown_domains: RwLock<HashMap<String, AtomicU64>>,
    service: [AtomicU64; 6],
    latency: Mutex<Latency>,
    /// statsd lines dropped because the TCP buffer was full.
    statsd_dropped: AtomicU64,
}

impl RatelimitStats {
    /// Stats with sluice's near-limit ratio and cap on keys built from request values.
    pub fn new(near_ratio: f64, max_value_keys: usize) -> RatelimitStats {
        RatelimitStats {
            near_ratio,
            max_value_keys,
            value_keys: AtomicUsize::new(0),
            rules: RwLock::new(HashMap::new()),
            unknown_domains: RwLock::new(HashMap::new()),
            service: Default::default(),
            latency: Mutex::new(Latency::new(&Shape::Histogram {
                buckets: DEFAULT_BUCKETS.to_vec(),
            })),
            statsd_dropped: AtomicU64::new(0),
        }
    }

    /// Counts a rules load (files or xDS).
    pub fn reloaded(&self, outcome: &Reloaded) {
        let i = match outcome {
            Reloaded::Failed(_) => LOAD_ERROR,
            Reloaded::Updated { .. } | Reloaded::Unchanged => LOAD_SUCCESS,
        };
        self.service[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Every stats key and its counters, sorted by key.
    pub fn rules(&self) -> Vec<(String, [u64; 6])> {
        let rules = self.rules.read();
        let mut all: Vec<(String, [u64; 6])> = rules
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    s.counts.each_ref().map(|c| c.load(Ordering::Relaxed)),
                )
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The service counters, in the order of [`SERVICE_STATS`].
    pub fn service(&self) -> [u64; 6] {
        self.service.each_ref().map(|c| c.load(Ordering::Relaxed))
    }

    /// `domain_not_found` per sanitized domain (`__other__` past the cap), sorted.
    pub(crate) fn unknown_domains(&self) -> Vec<(String, u64)> {
        let mut merged: HashMap<String, u64> = HashMap::new();
        for (domain, n) in self.unknown_domains.read().iter() {
            let key = if domain == OTHER_DOMAINS {
                domain.clone()
            } else {
                sanitize(domain)
            };
            *merged.entry(key).or_default() += n.load(Ordering::Relaxed);
        }
        let mut all: Vec<(String, u64)> = merged.into_iter().collect();
        all.sort();
        all
    }

    /// Every counter under its statsd name, with its total: the rules' stats (all six, once
    /// the stats key exists), `domain_not_found` per unknown domain, the service's.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (key, counts) in self.rules() {
            for (stat, n) in RULE_STATS.iter().zip(counts) {
                out.push((format!("ratelimit.service.rate_limit.{key}.{stat}"), n));
            }
        }
        for (domain, n) in self.unknown_domains() {
            out.push((
                format!("ratelimit.service.rate_limit.{domain}.domain_not_found"),
                n,
            ));
        }
        for (name, n) in SERVICE_STATS.iter().zip(self.service()) {
            out.push(((*name).to_owned(), n));
        }
        out
    }

    /// Counts statsd lines that could not be sent (TCP buffer full).
    pub(crate) fn count_statsd_dropped(&self, lines: u64) {
        self.statsd_dropped.fetch_add(lines, Ordering::Relaxed);
    }

    /// statsd lines dropped so far.
    pub(crate) fn statsd_dropped(&self) -> u64 {
        self.statsd_dropped.load(Ordering::Relaxed)
    }

    /// Renders the response time as `shape` from now on (the mapping's type for it, set at
    /// start): what was counted before is dropped.
    pub fn observe_as(&self, shape: &Shape) {
        let mut l = self.latency.lock();
        let samples = std::mem::take(&mut l.samples);
        *l = Latency::new(shape);
        l.samples = samples;
    }

    /// The response time, as a histogram or a summary.
    pub fn latency(&self) -> LatencyView {
        let l = self.latency.lock();
        let (sum, count) = (l.sum_seconds, l.count);
        match &l.shape {
            Recorder::Window { quantiles, window } => {
                let values = window.quantiles(quantiles, Instant::now());
                LatencyView::Summary {
                    quantiles: quantiles.iter().copied().zip(values).collect(),
                    sum,
                    count,
                }
            }
            Recorder::Buckets { bounds, counts } => {
                let mut cumulative = 0;
                let buckets = counts
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        cumulative += n;
                        (bounds.get(i).copied().unwrap_or(f64::INFINITY), cumulative)
                    })
                    .collect();
                LatencyView::Histogram {
                    buckets,
                    sum,
                    count,
                }
            }
        }
    }

    /// The response times observed since the last call (at most [`MAX_SAMPLES`]).
    pub(crate) fn take_samples(&self) -> Vec<Duration> {
        std::mem::take(&mut self.latency.lock().samples)
    }

    fn stat(&self, key: String, from_values: bool, domain: &str) -> Arc<RuleStat> {
        if let Some(s) = self.rules.read().get(&key) {
            return s.clone();
        }
        let mut rules = self.rules.write();
        if let Some(s) = rules.get(&key) {
            return s.clone();
        }
        let key = if from_values
            && self.value_keys.fetch_add(1, Ordering::Relaxed) >= self.max_value_keys
        {
            self.value_keys.fetch_sub(1, Ordering::Relaxed);
            format!("{}.{OTHER}", sanitize(domain))
        } else {
            key
        };
        rules.entry(key).or_default().clone()
    }
}

impl Observer for RatelimitStats {
    /// Counts the descriptors of a request for a domain the rules do not have (no
    /// allocation once the domain was seen).
    fn unknown_domain(&self, domain: &str, descriptors: usize) {
        let n = descriptors as u64;
        if let Some(c) = self.unknown_domains.read().get(domain) {
            c.fetch_add(n, Ordering::Relaxed);
            return;
        }
        let mut domains = self.unknown_domains.write();
        // One slot is kept for the overflow key.
        let key = if domains.contains_key(domain)
            || domains.len() < self.max_value_keys + usize::from(domains.contains_key(OTHER))
        {
            domain
        } else {
            OTHER_DOMAINS
        };
        domains
            .entry(key.to_owned())
            .or_default()
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a request let through by the global shadow mode.
    fn global_shadow(&self) {
        self.service[GLOBAL_SHADOW].fetch_add(1, Ordering::Relaxed);
    }

    fn descriptor(&self, r: &DescriptorReport<'_>) {
        let (rule, from_values) = match r.matched {
            Some(m) => rule_label(m, r.entries),
            None => (value_segments(r.entries), true),
        };
        let key = sanitize(&format!("{}.{rule}", r.domain));
        let stat = self.stat(key, from_values, r.domain);
        let add = |i: usize, n: u64| {
            stat.counts[i].fetch_add(n, Ordering::Relaxed);
        };
        add(HITS, r.cost);
        if r.over {
            add(OVER, r.cost);
            if r.local_cache {
                add(LOCAL_CACHE, r.cost);
            }
            // As envoyproxy/ratelimit: only a rule in shadow mode counts here, not the
            // global shadow mode (which counts `global_shadow_mode` per request).
            if r.rule_shadow {
                add(SHADOW, r.cost);
            }
            return;
        }
        add(WITHIN, r.cost);
        let near = r.near_part(self.near_ratio);
        if near > 0 {
            add(NEAR, near);
        }
    }

    fn request(&self, result: RequestResult<'_>, elapsed: Duration) {
        self.service[TOTAL_REQUESTS].fetch_add(1, Ordering::Relaxed);
        match result {
            RequestResult::Invalid => {
                self.service[SERVICE_ERROR].fetch_add(1, Ordering::Relaxed);
            }
            RequestResult::Unavailable(_) => {
                self.service[REDIS_ERROR].fetch_add(1, Ordering::Relaxed);
            }
            RequestResult::Ok | RequestResult::OverLimit => {}
        }
        let seconds = elapsed.as_secs_f64();
        let mut l = self.latency.lock();
        match &mut l.shape {
            Recorder::Window { window, .. } => window.record(elapsed, Instant::now()),
            Recorder::Buckets { bounds, counts } => {
                let bucket = bounds
                    .iter()
                    .position(|le| seconds <= *le)
                    .unwrap_or(bounds.len());
                if let Some(n) = counts.get_mut(bucket) {
                    *n += 1;
                }
            }
        }
        l.sum_seconds += seconds;
        l.count += 1;
        if l.samples.len() < MAX_SAMPLES {
            l.samples.push(elapsed);
        }
    }
}

/// A stats key as envoyproxy/ratelimit writes it: `:` and `|` as `_`, and the dots of
/// anything shaped like an IPv4 address (four groups of 1 to 3 digits) as `_`.
pub(crate) fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(end) => {
                for b in &mut out[i..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes: still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The end of an IPv4-shaped run starting at `start` (leftmost, greedy digits as a regex
/// `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` would take them).
fn ipv4_at(s: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    for group in 0..4 {
        if group > 0 {
            if s.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let digits = s[i.min(s.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        i += digits;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use arc_swap::ArcSwap;

    use super::*;
    use crate::config::rules_file::from_sources;
    use futures_util::FutureExt as _;

    use crate::engine::{Descriptor, Engine, Options, Request};
    use crate::limiter::MemoryLimiter;
    use crate::metrics::per_rule::tests::ask;
    use crate::rules::{Entry, RuleSet};

    #[test]
    fn keys_from_request_values_are_capped_as_sluices_labels() {
        let rules = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  \
                     - key: ip\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 9}\n";
        let model = from_sources(&[(PathBuf::from("r.yaml"), rules.to_owned())]).unwrap();
        let stats = Arc::new(RatelimitStats::new(0.5, 2));
        let engine = Engine::new(
            Arc::new(ArcSwap::from_pointee(RuleSet::compile(model))),
            Arc::new(MemoryLimiter::new(1000)),
            Options::default(),
        )
        .with_observer(stats.clone());
        for _ in 0..3 {
            ask(&engine, "user", "alice");
        }
        for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"] {
            ask(&engine, "ip", ip);
        }
        let rules: HashMap<String, [u64; 6]> = stats.rules().into_iter().collect();
        // total_hits, over_limit, near_limit, within_limit, shadow_mode, local cache
        assert_eq!(rules["d.user"], [3, 1, 1, 2, 0, 0]);
        assert_eq!(rules["d.ip_10_0_0_1"], [1, 0, 0, 1, 0, 0]);
        assert_eq!(rules["d.ip_10_0_0_2"], [1, 0, 0, 1, 0, 0]);
        assert_eq!(rules["d.__other__"], [2, 0, 0, 2, 0, 0]);
        assert_eq!(rules.len(), 4);
        assert_eq!(stats.service()[4], 7, "total_requests");
    }

    fn one_rule(stats: &Arc<RatelimitStats>, shadow_mode: bool) -> Engine {
        let rules = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        let model = from_sources(&[(PathBuf::from("r.yaml"), rules.to_owned())]).unwrap();
        Engine::new(
            Arc::new(ArcSwap::from_pointee(RuleSet::compile(model))),
            Arc::new(MemoryLimiter::new(1000)),
            Options {
                shadow_mode,
                ..Options::default()
            },
        )
        .with_observer(stats.clone())
    }

    fn request(domain: &str, descriptors: usize) -> Request {
        Request {
            domain: domain.to_owned(),
            descriptors: vec![
                Descriptor {
                    entries: vec![Entry::new("user", "a")],
                    ..Default::default()
                };
                descriptors
            ],
            hits_addend: 0,
        }
    }

    fn counter(stats: &RatelimitStats, name: &str) -> Option<u64> {
        stats
            .counters()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    #[test]
    fn unknown_domains_count_per_descriptor_capped_and_sanitized() {
        let stats = Arc::new(RatelimitStats::new(0.8, 2));
        let engine = one_rule(&stats, false);
        for (domain, descriptors) in [("a:1", 2), ("b", 1), ("a:1", 1), ("c", 3), ("e", 1)] {
            let answer = engine
                .should_rate_limit(&request(domain, descriptors))
                .now_or_never();
            assert!(matches!(answer, Some(Ok(_))));
        }
        let not_found = |d: &str| {
            counter(
                &stats,
                &format!("ratelimit.service.rate_limit.{d}.domain_not_found"),
            )
        };
        assert_eq!(not_found("a_1"), Some(3), "{:?}", stats.counters());
        assert_eq!(not_found("b"), Some(1));
        assert_eq!(
            not_found("__other__"),
            Some(4),
            "c and e, past the cap of 2"
        );
        assert_eq!(not_found("c"), None);
        // A known domain is not counted.
        let answer = engine.should_rate_limit(&request("d", 1)).now_or_never();
        assert!(matches!(answer, Some(Ok(_))));
        assert_eq!(stats.unknown_domains().len(), 3);
    }

    #[test]
    fn global_shadow_mode_counts_requests_it_let_through() {
        let stats = Arc::new(RatelimitStats::new(0.8, 10));
        let engine = one_rule(&stats, true);
        for _ in 0..3 {
            let answer = engine.should_rate_limit(&request("d", 1)).now_or_never();
            assert!(matches!(answer, Some(Ok(r)) if r.overall_code == crate::engine::Code::Ok));
        }
        assert_eq!(
            counter(&stats, "ratelimit.service.global_shadow_mode"),
            Some(2),
            "the first request was within the limit"
        );
        let rules: HashMap<String, [u64; 6]> = stats.rules().into_iter().collect();
        assert_eq!(
            rules["d.user"],
            [3, 2, 1, 1, 0, 0],
            "over the limit, not the rule's shadow_mode"
        );
        let off = Arc::new(RatelimitStats::new(0.8, 10));
        let plain = one_rule(&off, false);
        for _ in 0..3 {
            let _ = plain.should_rate_limit(&request("d", 1)).now_or_never();
        }
        assert_eq!(
            counter(&off, "ratelimit.service.global_shadow_mode"),
            Some(0)
        );
    }

    #[test]
    fn a_local_cache_denial_counts_in_over_limit_too() {
        let stats = RatelimitStats::new(0.8, 10);
        let entries = [Entry::new("user", "a")];
        let mut report = DescriptorReport {
            cost: 2,
            local_cache: true,
            ..DescriptorReport::denied("d", &entries)
        };
        stats.descriptor(&report);
        report.local_cache = false;
        stats.descriptor(&report);
        let rules: HashMap<String, [u64; 6]> = stats.rules().into_iter().collect();
        assert_eq!(rules["d.user_a"], [4, 4, 0, 0, 0, 2]);
    }

    #[test]
    fn sanitizing_matches_envoyproxy_ratelimit() {
        assert_eq!(
            sanitize("d.remote_address_10.0.0.1"),
            "d.remote_address_10_0_0_1"
        );
        assert_eq!(
            sanitize("eg.masked_remote_address_0.0.0.0/0"),
            "eg.masked_remote_address_0_0_0_0/0"
        );
        assert_eq!(sanitize("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(sanitize("d.version_1.2.3"), "d.version_1.2.3");
        assert_eq!(sanitize("d.x_1234.5.6.7"), "d.x_1234_5_6_7");
        assert_eq!(sanitize("d.k_é.1.2.3.4"), "d.k_é.1_2_3_4");
    }
}
