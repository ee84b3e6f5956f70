//! What the admin page and the limit gauges follow per rule, kept in the compiled rule
//! ([`crate::rules::Rule::live`]) so that the request path only adds to a few atomics:
//! cost seen, denied and near the limit, and the busiest key's share of its capacity.
//!
//! Gauges (set at scrape time from the active rules, so a reload replaces them):
//!
//! | gauge | labels | value |
//! |---|---|---|
//! | `sluice_rule_limit` | `domain`, `rule`, `limit` | the limit's `requests_per_unit` |
//! | `sluice_rule_period_seconds` | `domain`, `rule`, `limit` | its period (unit x `unit_multiplier`) |
//! | `sluice_rule_capacity_used_ratio` | `domain`, `rule` | the highest share of capacity in use seen at decision time since the previous scrape, over every key of the rule: `(capacity - remaining) / capacity` of the limit reported (the denying one, else the one with least left); 1 when denied; 0 when no request came |
//! | `sluice_rule_holds` | `domain`, `rule` | rules whose one limit is `concurrency`: the most holds in flight of any key of the rule seen at decision time since the previous scrape (the slots when denied); with no decision since, the holds of the key decided last (holds that expire unseen are not noticed) |
//!
//! `rule` is the rule's path, as in the per-rule counters but always without request values
//! (`detailed_metric` rules too); `limit` is `<algorithm>:<period seconds>`, the end of the
//! state key, so two limits of one rule never share it. Client overrides match no rule and
//! are not followed here.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config::model::{Algorithm, Policy};
use crate::engine::DescriptorReport;
use crate::rules::naming::segment;
use crate::rules::{Rule, RuleSet};

/// Shares are kept in millionths.
const PPM: u64 = 1_000_000;

/// Tells one app's [`LiveRules`] from another's (tests run several on one rule set).
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// The counts of one compiled rule.
#[derive(Debug, Default)]
pub struct LiveRule {
    owner: u64,
    /// Cost of every descriptor the rule limited.
    pub hits: AtomicU64,
    /// Cost it denied.
    pub denied: AtomicU64,
    /// Cost admitted past the near-limit ratio.
    pub near: AtomicU64,
    /// The busiest key's share of capacity in use since the last scrape, in millionths.
    peak_ppm: AtomicU32,
    /// A `concurrency` rule's most holds of any key since the last scrape.
    peak_holds: AtomicU64,
    /// The same since the admin page last read it.
    page_holds: AtomicU64,
    /// The holds of the key decided last.
    last_holds: AtomicU64,
}

impl LiveRule {
    /// A `concurrency` rule's most holds of any key decided since the previous call (the
    /// admin page's view; the gauge keeps its own); with none decided since, the holds of the
    /// key decided last.
    pub(crate) fn take_holds(&self) -> u64 {
        self.read_holds(&self.page_holds)
    }

    fn read_holds(&self, peak: &AtomicU64) -> u64 {
        match peak.swap(0, Ordering::Relaxed) {
            0 => self.last_holds.load(Ordering::Relaxed),
            most => most,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    domain: String,
    rule: String,
    limit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

/// Every rule's live counts (in the rules) and the gauges made of them.
pub struct LiveRules {
    owner: u64,
    limit: Family<LimitLabels, Gauge>,
    period: Family<LimitLabels, Gauge>,
    used: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    holds: Family<RuleLabels, Gauge>,
}

impl LiveRules {
    pub(super) fn new(registry: &mut Registry) -> LiveRules {
        let live = LiveRules {
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            limit: Family::default(),
            period: Family::default(),
            used: Family::default(),
            holds: Family::default(),
        };
        register!(
            registry,
            "rule_limit", "Configured requests_per_unit of each limit", live.limit;
            "rule_period_seconds", "Configured period of each limit", live.period;
            "rule_capacity_used_ratio", "Highest share of capacity in use of any key of the rule since the last scrape", live.used;
            "rule_holds", "Most holds in flight of any key of a concurrency rule since the last scrape", live.holds;
        );
        live
    }

    /// Adds a decided descriptor (the request path: a few relaxed atomics).
    pub(super) fn record(&self, r: &DescriptorReport<'_>, near: u64) {
        let Some(rule) = r.matched.map(|m| m.rule()) else {
            return;
        };
        let Some(live) = self.of(rule) else {
            return;
        };
        live.hits.fetch_add(r.cost, Ordering::Relaxed);
        if r.over {
            live.denied.fetch_add(r.cost, Ordering::Relaxed);
        } else if near > 0 {
            live.near.fetch_add(near, Ordering::Relaxed);
        }
        live.peak_ppm.fetch_max(used_ppm(r), Ordering::Relaxed);
        if holds_only(rule) {
            let held = if r.over {
                r.capacity
            } else {
                r.capacity.saturating_sub(r.remaining)
            };
            live.peak_holds.fetch_max(held, Ordering::Relaxed);
            live.page_holds.fetch_max(held, Ordering::Relaxed);
            live.last_holds.store(held, Ordering::Relaxed);
        }
    }

    /// This app's counts of a rule, made on first use.
    pub fn of<'r>(&self, rule: &'r Rule) -> Option<&'r LiveRule> {
        let owner = self.owner;
        let live = rule.live.get_or_init(|| LiveRule {
            owner,
            ..LiveRule::default()
        })?;
        (live.owner == owner).then_some(live)
    }

    /// Sets the gauges from the active rules: limits and periods, and each rule's busiest
    /// share since the last call (then starts over).
    pub(super) fn refresh(&self, rules: &RuleSet) {
        self.limit.clear();
        self.period.clear();
        self.used.clear();
        self.holds.clear();
        for domain in rules.domains() {
            each_rule(domain.rules(), "", &mut |path, rule| {
                self.gauges(domain.name(), path, rule);
            });
        }
    }

    fn gauges(&self, domain: &str, path: &str, rule: &Rule) {
        let Policy::Limited(limits) = &rule.policy else {
            return;
        };
        for limit in limits {
            let labels = LimitLabels {
                domain: domain.to_owned(),
                rule: path.to_owned(),
                limit: format!(
                    "{}:{}",
                    limit.algorithm.as_str(),
                    limit.period_nanos() / 1_000_000_000
                ),
            };
            self.limit
                .get_or_create(&labels)
                .set(i64::from(limit.requests_per_unit));
            let seconds = limit.period_nanos() / 1_000_000_000;
            self.period
                .get_or_create(&labels)
                .set(i64::try_from(seconds).unwrap_or(i64::MAX));
        }
        let peak = self
            .of(rule)
            .map_or(0, |l| l.peak_ppm.swap(0, Ordering::Relaxed));
        let labels = RuleLabels {
            domain: domain.to_owned(),
            rule: path.to_owned(),
        };
        if holds_only(rule) {
            let held = self.of(rule).map_or(0, |l| l.read_holds(&l.peak_holds));
            let held = i64::try_from(held).unwrap_or(i64::MAX);
            self.holds.get_or_create(&labels).set(held);
        }
        // Metrics only: a float is fine here.
        self.used
            .get_or_create(&labels)
            .set(f64::from(peak) / PPM as f64);
    }
}

/// Whether the rule's one limit is `concurrency` (its reports are then about holds).
pub(crate) fn holds_only(rule: &Rule) -> bool {
    matches!(&rule.policy, Policy::Limited(l) if l.len() == 1 && l.first().is_some_and(|x| x.algorithm == Algorithm::Concurrency))
}

/// The share of capacity in use after this descriptor, in millionths (1 when denied or when
/// the capacity is 0).
fn used_ppm(r: &DescriptorReport<'_>) -> u32 {
    if r.over || r.capacity == 0 {
        return PPM as u32;
    }
    let used = r.capacity.saturating_sub(r.remaining);
    let ppm = u128::from(used) * u128::from(PPM) / u128::from(r.capacity);
    u32::try_from(ppm.min(u128::from(PPM))).unwrap_or(PPM as u32)
}

/// Calls `f` with every rule of a tree and its path (`a.b_c`), parents first.
pub(crate) fn each_rule(rules: &[Rule], prefix: &str, f: &mut dyn FnMut(&str, &Rule)) {
    for rule in rules {
        let path = if prefix.is_empty() {
            segment(rule)
        } else {
            format!("{prefix}.{}", segment(rule))
        };
        f(&path, rule);
        each_rule(rule.children(), &path, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Entry;

    fn report(capacity: u64, remaining: u64, over: bool) -> u32 {
        let entries = [Entry::new("k", "v")];
        used_ppm(&DescriptorReport {
            over,
            capacity,
            remaining,
            ..DescriptorReport::denied("d", &entries)
        })
    }

    #[test]
    fn shares_of_capacity() {
        assert_eq!(report(10, 10, false), 0);
        assert_eq!(report(10, 2, false), 800_000);
        assert_eq!(report(10, 0, false), 1_000_000);
        assert_eq!(report(10, 5, true), 1_000_000);
        assert_eq!(report(0, 0, false), 1_000_000);
        assert_eq!(report(3, 1, false), 666_666);
    }
}
