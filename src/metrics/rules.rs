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
//! `rule` is the rule's path, one segment per level joined by `.`: `key` for a key-only rule,
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

use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::MetricsOptions;
use crate::config::model::ValueMatch;
use crate::engine::DescriptorReport;
use crate::rules::Rule;

/// The `rule` label of label sets past the cap.
pub const OTHER: &str = "__other__";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RuleLabels {
    domain: String,
    rule: String,
}

pub(super) struct RuleCounters {
    hits: Family<RuleLabels, Counter>,
    within: Family<RuleLabels, Counter>,
    near: Family<RuleLabels, Counter>,
    over: Family<RuleLabels, Counter>,
    shadow: Family<RuleLabels, Counter>,
    near_ratio: f64,
    max_value_sets: usize,
    value_sets: AtomicUsize,
}

impl RuleCounters {
    pub(super) fn new(options: MetricsOptions, registry: &mut Registry) -> RuleCounters {
        let c = RuleCounters {
            hits: Family::default(),
            within: Family::default(),
            near: Family::default(),
            over: Family::default(),
            shadow: Family::default(),
            near_ratio: options.near_limit_ratio,
            max_value_sets: options.max_value_label_sets,
            value_sets: AtomicUsize::new(0),
        };
        let families = [
            (
                "rule_hits",
                "Cost of every request descriptor a rule limited",
                &c.hits,
            ),
            ("rule_within_limit", "Cost admitted by the rule", &c.within),
            (
                "rule_near_limit",
                "Cost admitted above the near-limit ratio",
                &c.near,
            ),
            ("rule_over_limit", "Cost the rule denied", &c.over),
            (
                "rule_shadow_mode",
                "Cost denied but let through by shadow mode",
                &c.shadow,
            ),
        ];
        for (name, help, family) in families {
            registry.register(name, help, family.clone());
        }
        c
    }

    pub(super) fn record(&self, r: &DescriptorReport<'_>) {
        let labels = self.labels(r);
        let cost = r.cost;
        self.hits.get_or_create(&labels).inc_by(cost);
        if r.over {
            self.over.get_or_create(&labels).inc_by(cost);
            if r.shadow {
                self.shadow.get_or_create(&labels).inc_by(cost);
            }
            return;
        }
        self.within.get_or_create(&labels).inc_by(cost);
        let near = if r.refund { 0 } else { self.near_part(r) };
        if near > 0 {
            self.near.get_or_create(&labels).inc_by(near);
        }
    }

    /// The part of the cost that used capacity beyond `near_ratio` of it.
    fn near_part(&self, r: &DescriptorReport<'_>) -> u64 {
        // Metrics only: a float threshold is fine here (decisions never use floats).
        let threshold = (r.capacity as f64 * self.near_ratio).floor() as u64;
        let used_after = r.capacity.saturating_sub(r.remaining);
        let used_before = used_after.saturating_sub(r.cost);
        if used_after <= threshold {
            0
        } else {
            used_after - used_before.max(threshold)
        }
    }

    fn labels(&self, r: &DescriptorReport<'_>) -> RuleLabels {
        let (rule, from_values) = rule_label(r);
        let mut labels = RuleLabels {
            domain: r.domain.to_owned(),
            rule,
        };
        if from_values && self.hits.get(&labels).is_none() {
            let taken = self.value_sets.fetch_add(1, Ordering::Relaxed);
            if taken >= self.max_value_sets {
                self.value_sets.fetch_sub(1, Ordering::Relaxed);
                labels.rule = OTHER.to_owned();
            }
        }
        labels
    }
}

/// The `rule` label of a report, and whether it holds request values.
fn rule_label(r: &DescriptorReport<'_>) -> (String, bool) {
    let Some(m) = r.matched else {
        let segments = r.entries.iter().map(|e| format!("{}_{}", e.key, e.value));
        return (segments.collect::<Vec<_>>().join("."), true);
    };
    let detailed = m.rule().detailed_metric;
    let mut from_values = false;
    let mut segments = Vec::with_capacity(m.path().len());
    for (rule, entry) in m.path().iter().zip(r.entries) {
        if rule.share_threshold || !(detailed || rule.value_to_metric) {
            segments.push(segment(rule));
        } else {
            from_values = true;
            segments.push(format!("{}_{}", rule.key, entry.value));
        }
    }
    (segments.join("."), from_values)
}

/// A rule's own path segment: `key`, `key_value` or `key_pattern`.
pub fn segment(rule: &Rule) -> String {
    match &rule.value {
        ValueMatch::Any => rule.key.clone(),
        ValueMatch::Exact(v) | ValueMatch::Wildcard(v) => format!("{}_{v}", rule.key),
    }
}
