//! How a rule is named where people read it (metrics labels, `/rlconfig`, `/counters`, the
//! live page): its path, one segment per level joined by `.`. A level's segment is `key` for a
//! key-only rule, `key_value` for a value and `key_pattern` for a wildcard; a rule with
//! `detailed_metric` (or a level with `value_to_metric`) takes the request's values there, and
//! a client's limit override is named by the request's `key_value` segments.

use super::{Entry, Match, Rule};
use crate::config::model::ValueMatch;

/// The `rule` label of a client's limit override: the request's `key_value` segments.
pub fn value_segments(entries: &[Entry]) -> String {
    let segments = entries.iter().map(|e| format!("{}_{}", e.key, e.value));
    segments.collect::<Vec<_>>().join(".")
}

/// The `rule` label of a match, and whether it holds request values (taken from `entries`,
/// one per level; with no entries, only whether it would).
pub fn rule_label(m: &Match<'_>, entries: &[Entry]) -> (String, bool) {
    let detailed = m.rule().detailed_metric;
    let mut from_values = false;
    let mut segments = Vec::with_capacity(m.path().len());
    for (level, rule) in m.path().iter().enumerate() {
        if rule.share_threshold || !(detailed || rule.value_to_metric) {
            segments.push(segment(rule));
        } else {
            from_values = true;
            let value = entries.get(level).map_or("", |e| e.value.as_str());
            segments.push(format!("{}_{}", rule.key, value));
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
