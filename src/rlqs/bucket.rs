//! From a bucket id (an unordered map) to what the rules say about it.
//!
//! A bucket matches the rule path whose keys are exactly the bucket's keys, taken in the rule
//! tree's order: at each level, the keys the level has rules for are tried in declaration
//! order, and a key is taken when the bucket's value for it matches a rule there (exact
//! value, then wildcards, then the key-only rule, as in RLS). The first complete path that
//! ends on a rule with a `rate_limit` wins. Then it is planned as RLS would plan a one-entry
//! descriptor: state keys, `unlimited`, `shadow_mode`.

use std::sync::Arc;

use crate::config::model::{Charge, LimitRule, Policy};
use crate::limiter::{Hit, LimitParams, Role};
use crate::rules::naming::segment;
use crate::rules::{Domain, Entry, Match, Rule, key};

/// A bucket id: its entries sorted by key (a map has no order; this is its identity).
pub(crate) type BucketKey = Vec<(String, String)>;

/// Most tree nodes one match may visit (a bucket with many keys at a level with many keys
/// could otherwise try every order).
const MAX_STEPS: usize = 4096;

/// What the rules say about one bucket.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// No rule with a limit: the bucket gets no assignment.
    Unmatched,
    /// `unlimited`: always allowed, nothing charged.
    Unlimited { rule: String },
    /// Limits; in shadow mode they are charged and counted, never enforced.
    Limited(Arc<Limited>),
}

/// A matched bucket's limits.
#[derive(Debug)]
pub struct Limited {
    /// The `rule` label of the metrics.
    pub rule: String,
    /// One hit per limit, cost 0, charged always (reports are usage that already happened).
    pub hits: Vec<Hit>,
    pub shadow: bool,
    /// The limit whose rate is lowest: it sets the shares.
    pub governing: LimitParams,
}

impl Target {
    /// The rule label, when matched.
    pub(crate) fn rule(&self) -> Option<&str> {
        match self {
            Target::Unmatched => None,
            Target::Unlimited { rule } => Some(rule),
            Target::Limited(l) => Some(&l.rule),
        }
    }
}

/// What the rules of `domain` (none: unknown domain) say about `bucket`; `shadow` is the
/// global shadow mode.
pub(crate) fn resolve(domain: Option<&Domain>, bucket: &BucketKey, shadow: bool) -> Target {
    let Some(domain) = domain else {
        return Target::Unmatched;
    };
    let Some(entries) = order(domain, bucket) else {
        return Target::Unmatched;
    };
    let Some(m) = domain.find(&entries) else {
        return Target::Unmatched;
    };
    let rule = label(&m);
    match &m.rule().policy {
        Policy::None => Target::Unmatched,
        Policy::Unlimited { .. } => Target::Unlimited { rule },
        Policy::Limited(limits) => {
            let part = key::descriptor_part(domain.name(), &entries, Some(&m));
            let shadow = shadow || m.rule().shadow_mode;
            match limited(rule, limits, &part, shadow) {
                Some(l) => Target::Limited(Arc::new(l)),
                None => Target::Unmatched,
            }
        }
    }
}

/// `None` for no limits (a valid rule never has none).
fn limited(rule: String, limits: &[LimitRule], part: &str, shadow: bool) -> Option<Limited> {
    let role = if shadow { Role::Shadow } else { Role::Enforced };
    let hits: Vec<Hit> = limits
        .iter()
        .map(|l| {
            let mut limit = LimitParams::from_rule(l);
            limit.charge = Charge::Always;
            Hit {
                key: key::state_key(part, limit.algorithm, limit.period_nanos),
                limit,
                cost: 0,
                refund: false,
                group: 0,
                role,
                hold: None,
            }
        })
        .collect();
    let governing = hits.iter().map(|h| h.limit).min_by_key(rate_of)?;
    Some(Limited {
        rule,
        hits,
        shadow,
        governing,
    })
}

/// A limit's rate in nano-requests per second.
pub(crate) fn rate_of(l: &LimitParams) -> u64 {
    super::share::limit_rate(l.quota, period_secs(l))
}

/// A limit's period in whole seconds (rules only make whole seconds; at least 1).
pub fn period_secs(l: &LimitParams) -> u64 {
    (l.period_nanos / 1_000_000_000).max(1)
}

/// The `rule` label: the path's segments (`key`, `key_value`, `key_pattern`), never a
/// request value, so the label set stays bounded by the rules.
fn label(m: &Match<'_>) -> String {
    let segments: Vec<String> = m.path().iter().map(|r| segment(r)).collect();
    segments.join(".")
}

/// The bucket's entries in the order of a rule path that ends on a limit, if there is one.
fn order(domain: &Domain, bucket: &BucketKey) -> Option<Vec<Entry>> {
    let mut path = Vec::with_capacity(bucket.len());
    let mut used = vec![false; bucket.len()];
    let mut steps = 0;
    walk(
        domain,
        domain.rules(),
        bucket,
        &mut used,
        &mut path,
        &mut steps,
    )
    .then_some(path)
}

/// Depth first: at this level, each key with rules here (declaration order) that the bucket
/// has and whose value matches one of them.
fn walk(
    domain: &Domain,
    level: &[Rule],
    bucket: &BucketKey,
    used: &mut [bool],
    path: &mut Vec<Entry>,
    steps: &mut usize,
) -> bool {
    let mut tried: Vec<&str> = Vec::new();
    for rule in level {
        if tried.contains(&rule.key.as_str()) {
            continue;
        }
        tried.push(&rule.key);
        let Some(i) = bucket.iter().position(|(k, _)| *k == rule.key) else {
            continue;
        };
        if used[i] {
            continue;
        }
        *steps += 1;
        if *steps > MAX_STEPS {
            return false;
        }
        path.push(Entry::new(&bucket[i].0, &bucket[i].1));
        let Some(m) = domain.find(path) else {
            path.pop();
            continue;
        };
        used[i] = true;
        let last = m.rule();
        if path.len() == bucket.len() {
            if !matches!(last.policy, Policy::None) {
                return true;
            }
        } else if walk(domain, last.children(), bucket, used, path, steps) {
            return true;
        }
        used[i] = false;
        path.pop();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rules_file::from_sources;
    use crate::rules::RuleSet;
    use std::path::PathBuf;

    fn rules(yaml: &str) -> RuleSet {
        let model = from_sources(&[(PathBuf::from("r.yaml"), yaml.to_owned())]).unwrap();
        RuleSet::compile(model)
    }

    fn bucket(pairs: &[(&str, &str)]) -> BucketKey {
        let mut b: BucketKey = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        b.sort();
        b
    }

    const RULES: &str = "
domain: d
descriptors:
  - key: tenant
    value: gold
    descriptors:
      - key: route
        rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: route
        value: /free*
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: name
    value: open
    rate_limit: {unlimited: true}
  - key: name
    value: quiet
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: name
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 1000}
";

    fn resolve_in(set: &RuleSet, pairs: &[(&str, &str)]) -> Target {
        resolve(set.domain("d"), &bucket(pairs), false)
    }

    #[test]
    fn keys_are_taken_in_the_tree_order_whatever_the_map_order() {
        let set = rules(RULES);
        let Target::Limited(l) = resolve_in(&set, &[("route", "/x"), ("tenant", "gold")]) else {
            panic!("gold tenant matches");
        };
        assert_eq!(l.rule, "tenant_gold.route");
        assert_eq!(&*l.hits[0].key, b"{d|tenant=gold|route=/x}:funnel:1");
        assert_eq!(l.hits[0].limit.charge, Charge::Always);
    }

    #[test]
    fn values_follow_rls_matching() {
        let set = rules(RULES);
        let Target::Limited(l) = resolve_in(&set, &[("tenant", "t1"), ("route", "/free/a")]) else {
            panic!("wildcard route matches");
        };
        assert_eq!(l.rule, "tenant.route_/free*");
        // Not a free route under a non-gold tenant: no rule; nor keys that are not all used.
        assert!(matches!(
            resolve_in(&set, &[("tenant", "t1"), ("route", "/paid")]),
            Target::Unmatched
        ));
        assert!(matches!(
            resolve_in(&set, &[("tenant", "gold")]),
            Target::Unmatched
        ));
        assert!(matches!(
            resolve_in(&set, &[("tenant", "gold"), ("route", "/x"), ("extra", "1")]),
            Target::Unmatched
        ));
    }

    #[test]
    fn unlimited_shadow_and_several_limits() {
        let set = rules(RULES);
        assert!(matches!(
            resolve_in(&set, &[("name", "open")]),
            Target::Unlimited { .. }
        ));
        let Target::Limited(quiet) = resolve_in(&set, &[("name", "quiet")]) else {
            panic!("shadow rule matches");
        };
        assert!(quiet.shadow);
        assert_eq!(quiet.hits[0].role, Role::Shadow);
        let Target::Limited(both) = resolve_in(&set, &[("name", "x")]) else {
            panic!("key-only rule matches");
        };
        assert_eq!(both.hits.len(), 2);
        assert_eq!(
            both.governing.quota, 1000,
            "the daily limit has the lower rate"
        );
        assert!(matches!(
            resolve(set.domain("other"), &bucket(&[("name", "x")]), false),
            Target::Unmatched
        ));
    }
}
