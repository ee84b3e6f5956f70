//! Per-rule counters and their labels.
//!
//! Every descriptor that a limit applied to counts, with labels `domain` and `rule`:
//!
//! | counter | adds the descriptor's cost when |
//! |---|---|
//! | `sluice_rule_hits_total` | always |
//! | `sluice_rule_within_limit_total` | its limits admitted it |
//! | `sluice_rule_near_limit_total` | admitted, for the part of the cost above `near_limit_ratio` of the capacity |
//! | `sluice_rule_over_limit_total` | its limits denied it (shadow or not) |
//! | `sluice_rule_shadow_mode_total` | denied, but shadow mode (the rule's or the global) let it through |
//!
//! `rule` is the rule's path (named by `rules::naming`), one segment per level joined by `.`: `key` for a key-only rule,
//! `key_value` for a value, `key_pattern` for a wildcard (`user.route_/reports/*`). A rule
//! with `detailed_metric` uses the request's values at every level (`user_alice.route_/x`),
//! and a level with `value_to_metric` uses the request's value there. `share_threshold`
//! levels always keep their pattern. A limit override sent by the client matches no rule:
//! it is always labelled with the request's `key_value` segments (`client_c42`), with no
//! `detailed_metric` asked for, so its label carries request values.
//!
//! Cardinality: labels without request values are bounded by the rules. Label sets built
//! from request values (`detailed_metric`, `value_to_metric`, overrides) are capped by
//! `metrics.max_value_label_sets` (default 10000) over the process's life; past the cap, new
//! ones count under `rule="__other__"` of their domain. Domains are always configured ones.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::MetricsOptions;
use crate::engine::DescriptorReport;
use crate::rules::Match;
use crate::rules::naming::{rule_label, value_segments};

/// The `rule` label of label sets past the cap.
pub const OTHER: &str = "__other__";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RuleLabels {
    pub(super) domain: String,
    pub(super) rule: String,
}

/// The five per-rule counters, in the order of [`RuleCounters::families`].
#[derive(Debug, Clone, Copy)]
enum Kind {
    Hits = 0,
    Within = 1,
    Near = 2,
    Over = 3,
    Shadow = 4,
}

const FAMILIES: [(&str, &str); 5] = [
    (
        "rule_hits",
        "Cost of every request descriptor a rule limited",
    ),
    ("rule_within_limit", "Cost admitted by the rule"),
    (
        "rule_near_limit",
        "Cost admitted above the near-limit ratio",
    ),
    ("rule_over_limit", "Cost the rule denied"),
    (
        "rule_shadow_mode",
        "Cost denied but let through by shadow mode",
    ),
];

/// Tells one [`RuleCounters`] from another, so that a rule set observed by two of them (tests
/// build several apps) never counts into the other's cache.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

pub(super) struct RuleCounters {
    families: [Family<RuleLabels, Counter>; 5],
    owner: u64,
    near_ratio: f64,
    max_value_sets: usize,
    value_sets: AtomicUsize,
}

/// The counters of a rule whose labels hold no request value, kept in the rule's slot: the
/// labels are built and looked up once per compiled rule, not per request.
struct Cached {
    owner: u64,
    labels: RuleLabels,
    counters: [OnceLock<Counter>; 5],
}

impl RuleCounters {
    pub(super) fn new(options: MetricsOptions, registry: &mut Registry) -> RuleCounters {
        let c = RuleCounters {
            families: Default::default(),
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            near_ratio: options.near_limit_ratio,
            max_value_sets: options.max_value_label_sets,
            value_sets: AtomicUsize::new(0),
        };
        for ((name, help), family) in FAMILIES.into_iter().zip(&c.families) {
            registry.register(name, help, family.clone());
        }
        c
    }

    pub(super) fn record(&self, r: &DescriptorReport<'_>) {
        if let Some(cached) = r.matched.and_then(|m| self.cached(r.domain, m)) {
            let counter = |kind: Kind| {
                cached.counters[kind as usize]
                    .get_or_init(|| self.family(kind).get_or_create(&cached.labels).clone())
            };
            return self.tally(r, |kind, n| {
                counter(kind).inc_by(n);
            });
        }
        let labels = self.labels(r);
        self.tally(r, |kind, n| {
            self.family(kind).get_or_create(&labels).inc_by(n);
        });
    }

    fn family(&self, kind: Kind) -> &Family<RuleLabels, Counter> {
        &self.families[kind as usize]
    }

    /// The counters cached for the matched rule, unless its labels hold request values.
    fn cached<'m>(&self, domain: &str, m: &Match<'m>) -> Option<&'m Cached> {
        let cached = m.rule().slot.get_or_init(|| {
            let (rule, from_values) = rule_label(m, &[]);
            (!from_values).then(|| Cached {
                owner: self.owner,
                labels: RuleLabels {
                    domain: domain.to_owned(),
                    rule,
                },
                counters: Default::default(),
            })
        })?;
        cached.as_ref().filter(|c| c.owner == self.owner)
    }

    /// Adds what a report counts: its cost to hits, then to within or over (and shadow), and
    /// the part of it past the near-limit ratio to near.
    fn tally(&self, r: &DescriptorReport<'_>, mut add: impl FnMut(Kind, u64)) {
        let cost = r.cost;
        add(Kind::Hits, cost);
        if r.over {
            add(Kind::Over, cost);
            if r.shadow {
                add(Kind::Shadow, cost);
            }
            return;
        }
        add(Kind::Within, cost);
        let near = self.near_part(r);
        if near > 0 {
            add(Kind::Near, near);
        }
    }

    /// The part of the cost that used capacity beyond `near_ratio` of it.
    pub(super) fn near_part(&self, r: &DescriptorReport<'_>) -> u64 {
        r.near_part(self.near_ratio)
    }

    fn labels(&self, r: &DescriptorReport<'_>) -> RuleLabels {
        let (rule, from_values) = match r.matched {
            Some(m) => rule_label(m, r.entries),
            None => (value_segments(r.entries), true),
        };
        let mut labels = RuleLabels {
            domain: r.domain.to_owned(),
            rule,
        };
        if from_values && self.family(Kind::Hits).get(&labels).is_none() {
            let taken = self.value_sets.fetch_add(1, Ordering::Relaxed);
            if taken >= self.max_value_sets {
                self.value_sets.fetch_sub(1, Ordering::Relaxed);
                labels.rule = OTHER.to_owned();
            }
        }
        labels
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use arc_swap::ArcSwap;
    use futures_util::FutureExt as _;

    use crate::config::rules_file::from_sources;
    use crate::engine::{Descriptor, Engine, Options, Request};
    use crate::limiter::MemoryLimiter;
    use crate::metrics::{Metrics, MetricsOptions};
    use crate::rules::{Entry, RuleSet};

    fn rule_set(rules: &str) -> RuleSet {
        let model = from_sources(&[(PathBuf::from("r.yaml"), rules.to_owned())])
            .unwrap_or_else(|e| panic!("{e}"));
        RuleSet::compile(model)
    }

    /// Asks `engine` once for one descriptor `key=value` in domain `d`; the answer must be `Ok`.
    pub(crate) fn ask(engine: &Engine, key: &str, value: &str) {
        let request = Request {
            domain: "d".to_owned(),
            descriptors: vec![Descriptor {
                entries: vec![Entry::new(key, value)],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let answer = engine.should_rate_limit(&request).now_or_never();
        assert!(matches!(answer, Some(Ok(_))), "{answer:?}");
    }

    fn hits(metrics: &Metrics, rule: &str) -> Option<String> {
        let text = metrics.encode().expect("encodes");
        let prefix = format!("sluice_rule_hits_total{{domain=\"d\",rule=\"{rule}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    const RULES: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
";

    #[test]
    fn cached_counters_belong_to_their_metrics_and_rule_set() {
        let rules = Arc::new(ArcSwap::from_pointee(rule_set(RULES)));
        let engine = |m: &Arc<Metrics>| {
            Engine::new(
                rules.clone(),
                Arc::new(MemoryLimiter::new(1000)),
                Options::default(),
            )
            .with_observer(m.clone())
        };
        let (a, b) = (
            Metrics::new(MetricsOptions::default()),
            Metrics::new(MetricsOptions::default()),
        );
        let (on_a, on_b) = (engine(&a), engine(&b));
        for _ in 0..3 {
            ask(&on_a, "user", "alice");
        }
        ask(&on_b, "user", "bob");
        // The rule's slot holds a's counters; b, observing the same rules, counts its own.
        assert_eq!(hits(&a, "user").as_deref(), Some("3"));
        assert_eq!(hits(&b, "user").as_deref(), Some("1"));
        // A rule labelled with request values is never cached.
        ask(&on_a, "route", "/x");
        ask(&on_a, "route", "/y");
        assert_eq!(hits(&a, "route_/x").as_deref(), Some("1"));
        assert_eq!(hits(&a, "route_/y").as_deref(), Some("1"));
        // A reload compiles new rules with empty slots: a rule renamed by it gets its new
        // label at once, and the old label keeps what it counted.
        rules.store(Arc::new(rule_set(
            &RULES.replace("key: user", "key: member"),
        )));
        ask(&on_a, "member", "alice");
        assert_eq!(hits(&a, "member").as_deref(), Some("1"));
        assert_eq!(hits(&a, "user").as_deref(), Some("3"));
    }
}
