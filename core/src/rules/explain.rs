//! Why a descriptor matched the rule it did, or why it matched none: the walk of
//! [`Domain::find`] told step by step, for people (admin `/why`). Off the request path:
//! matching itself never builds any of this.
//!
//! ```
//! use sluice_core::rules::explain::{Walk, explain};
//! use sluice_core::rules::{Entry, RuleSet};
//! # use sluice_core::config::model::*;
//! # fn rule(key: &str, value: ValueMatch, children: Vec<DescriptorRule>) -> DescriptorRule {
//! #     let location = Location { file: std::sync::Arc::new("r.yaml".into()), line: 1 };
//! #     DescriptorRule { key: key.into(), value, policy: Policy::None, shadow_mode: false,
//! #         quota_mode: false, detailed_metric: false, value_to_metric: false,
//! #         share_threshold: false, metadata: None, children, location }
//! # }
//! # let location = Location { file: std::sync::Arc::new("r.yaml".into()), line: 1 };
//! # let user = rule("user", ValueMatch::Any, vec![]);
//! # let login = rule("path", ValueMatch::Exact("/login".into()), vec![user]);
//! # let model = RulesModel {
//! #     domains: vec![DomainRules { domain: "api".into(), descriptors: vec![login], location, defaults: Default::default() }],
//! #     ..RulesModel::default()
//! # };
//! // path=/login, then user=<any> (neither with a limit in this sketch)
//! let rules = RuleSet::compile(model);
//! let api = rules.domain("api").unwrap();
//! let why = explain(api, &[Entry::new("path", "/logout")]);
//! assert!(matches!(why, Walk::NoValue { level: 0, .. }));
//! let why = explain(api, &[Entry::new("path", "/login")]);
//! assert!(matches!(why, Walk::TooShort { .. }));
//! let why = explain(api, &[Entry::new("path", "/login"), Entry::new("user", "al")]);
//! assert!(matches!(why, Walk::NoPolicy { .. }));
//! let why = explain(api, &[Entry::new("user", "al")]);
//! assert_eq!(why.code(), "no_key");
//! ```

use super::{Domain, Entry, Match, Rule, tree::Level};
use crate::config::model::Policy;

/// Where a descriptor's walk through its domain's tree ended.
#[derive(Debug)]
pub enum Walk<'a> {
    /// It ended on a rule with a policy (limits or `unlimited`).
    Matched(Match<'a>),
    /// The descriptor has no entries.
    NoEntries,
    /// At `level` (0-based, one per entry), no rule names the entry's key.
    NoKey { level: usize, key: String },
    /// At `level`, rules name the key, but none takes the entry's value (no exact value,
    /// no wildcard matching, no key-only rule).
    NoValue {
        level: usize,
        key: String,
        value: String,
    },
    /// The descriptor goes on after `level`, whose rule has no rules below it: it is
    /// longer than the tree there (a depth mismatch).
    TooLong { level: usize },
    /// Every entry matched, but the rule it ended on has no policy and has rules below it:
    /// the descriptor is shorter than the limits there (a depth mismatch).
    TooShort { matched: Match<'a> },
    /// Every entry matched, ending on a rule with no policy and nothing below it.
    NoPolicy { matched: Match<'a> },
}

impl Walk<'_> {
    /// A short code for the reason (`matched`, `no_entries`, `no_key`, `no_value`,
    /// `too_long`, `too_short`, `no_policy`).
    pub fn code(&self) -> &'static str {
        match self {
            Walk::Matched(_) => "matched",
            Walk::NoEntries => "no_entries",
            Walk::NoKey { .. } => "no_key",
            Walk::NoValue { .. } => "no_value",
            Walk::TooLong { .. } => "too_long",
            Walk::TooShort { .. } => "too_short",
            Walk::NoPolicy { .. } => "no_policy",
        }
    }

    /// The reason in a sentence (for a match, which rule it is).
    pub fn reason(&self) -> String {
        match self {
            Walk::Matched(m) => format!(
                "every entry matched, ending at level {} on a rule with a policy",
                m.path().len() - 1
            ),
            Walk::NoEntries => "the descriptor has no entries".to_owned(),
            Walk::NoKey { level, key } => {
                format!("no rule at level {level} has the key {key:?}")
            }
            Walk::NoValue { level, key, value } => format!(
                "at level {level}, the rules of key {key:?} take no value {value:?} (no exact \
                 value, wildcard or key-only rule matches it)"
            ),
            Walk::TooLong { level } => format!(
                "depth mismatch: the rule matched at level {level} has no rules below it, but \
                 the descriptor has more entries"
            ),
            Walk::TooShort { matched } => format!(
                "depth mismatch: the descriptor ends at level {}, on a rule with no limit; its \
                 limits are on the rules below it",
                matched.path().len() - 1
            ),
            Walk::NoPolicy { matched } => format!(
                "the rule matched at level {} has no limit and no rules below it",
                matched.path().len() - 1
            ),
        }
    }
}

/// Walks `entries` through `domain` as [`Domain::find`] does, saying where it stopped.
pub fn explain<'a>(domain: &'a Domain, entries: &[Entry]) -> Walk<'a> {
    if entries.is_empty() {
        return Walk::NoEntries;
    }
    let mut level: &'a Level = &domain.root;
    let mut last: Option<&'a Rule> = None;
    for (i, entry) in entries.iter().enumerate() {
        // The last entry naming the request's hold (the rule's `hold_id`) is no level.
        if let Some(rule) = last
            && i + 1 == entries.len()
            && rule.hold_id.as_deref() == Some(entry.key.as_str())
        {
            break;
        }
        if let Some(rule) = last
            && rule.children().is_empty()
        {
            return Walk::TooLong { level: i - 1 };
        }
        match level.find(&entry.key, &entry.value) {
            Some(rule) => {
                last = Some(rule);
                level = &rule.children;
            }
            None if level.has_key(&entry.key) => {
                return Walk::NoValue {
                    level: i,
                    key: entry.key.clone(),
                    value: entry.value.clone(),
                };
            }
            None => {
                return Walk::NoKey {
                    level: i,
                    key: entry.key.clone(),
                };
            }
        }
    }
    let Some(matched) = domain.find(entries) else {
        return Walk::NoEntries;
    };
    match &matched.rule().policy {
        Policy::None if matched.rule().children().is_empty() => Walk::NoPolicy { matched },
        Policy::None => Walk::TooShort { matched },
        _ => Walk::Matched(matched),
    }
}
