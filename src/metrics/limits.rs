//! The configured limit of every rule, as gauges read at scrape time:
//! `sluice_rule_limit{domain,rule}` (requests per period) and
//! `sluice_rule_period_seconds{domain,rule}` (the period: unit x multiplier), the
//! denominator of "how close to the limit are we". `rule` is the per-rule counters' label.
//! A rule with several limits shows the one with the shortest period; unlimited and
//! pass-through rules have none. Rebuilt only when the active rules change.

use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::rules::{RuleLabels, segment};
use crate::config::model::Policy;
use crate::rules::{Rule, RuleSet};

pub(super) struct RuleLimits {
    limit: Family<RuleLabels, Gauge>,
    period: Family<RuleLabels, Gauge>,
    /// The rule set the gauges show (by address), so an unchanged set is not walked again.
    shown: Mutex<Option<Arc<RuleSet>>>,
}

impl RuleLimits {
    pub(super) fn new(registry: &mut Registry) -> RuleLimits {
        let l = RuleLimits {
            limit: Family::default(),
            period: Family::default(),
            shown: Mutex::new(None),
        };
        registry.register(
            "rule_limit",
            "Requests per period of each rule's limit (the shortest period when several)",
            l.limit.clone(),
        );
        registry.register(
            "rule_period_seconds",
            "Period of each rule's limit in seconds (unit x unit_multiplier)",
            l.period.clone(),
        );
        l
    }

    pub(super) fn refresh(&self, rules: &Arc<RuleSet>) {
        let mut shown = self.shown.lock();
        if shown.as_ref().is_some_and(|s| Arc::ptr_eq(s, rules)) {
            return;
        }
        self.limit.clear();
        self.period.clear();
        for domain in rules.domains() {
            self.walk(domain.name(), domain.rules(), "");
        }
        *shown = Some(rules.clone());
    }

    fn walk(&self, domain: &str, rules: &[Rule], prefix: &str) {
        for rule in rules {
            let path = if prefix.is_empty() {
                segment(rule)
            } else {
                format!("{prefix}.{}", segment(rule))
            };
            if let Policy::Limited(limits) = &rule.policy
                && let Some(l) = limits.iter().min_by_key(|l| l.period_nanos())
            {
                let labels = RuleLabels {
                    domain: domain.to_owned(),
                    rule: path.clone(),
                };
                self.limit
                    .get_or_create(&labels)
                    .set(i64::from(l.requests_per_unit));
                let seconds = l.period_nanos() / 1_000_000_000;
                self.period
                    .get_or_create(&labels)
                    .set(i64::try_from(seconds).unwrap_or(i64::MAX));
            }
            self.walk(domain, rule.children(), &path);
        }
    }
}
