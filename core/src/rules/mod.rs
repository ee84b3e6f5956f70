//! The compiled descriptor trees, one per domain, and matching.
//!
//! Matching walks a request descriptor's entries level by level: at each level an exact
//! `key`+`value` wins, then wildcard values of that key in declaration order, then the
//! key-only rule; a rule applies only when the walk ends exactly on the last entry; there is
//! no backtracking. Everything is indexed at load time ([`RuleSet::compile`]), so matching
//! costs a few hash lookups per entry plus the wildcard patterns of the requested key.
//!
//! [`key`] turns a match into the text keys the limiters keep their state under.

pub mod explain;
pub mod key;
pub mod limitador;
pub mod naming;
mod tree;
mod wildcard;

#[cfg(test)]
mod tests;

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use ahash::RandomState;

use crate::config::model::{
    Algorithm, DescriptorRule, DomainRules, LimitDefaults, Location, Policy, RulesModel, ValueMatch,
};
use tree::Level;

/// One entry of a request descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

impl Entry {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// Every domain's compiled tree. Immutable; swapped whole on reload.
///
/// Two sets are equal when the models they were compiled from are (by value, every field).
#[derive(Debug, Default)]
pub struct RuleSet {
    /// In the model's order.
    domains: Vec<Domain>,
    by_name: HashMap<Box<str>, usize, RandomState>,
    default_algorithm: Algorithm,
    /// The limitador-format namespaces.
    namespaces: limitador::Namespaces,
    /// The validated model this set was compiled from.
    source: RulesModel,
}

impl PartialEq for RuleSet {
    fn eq(&self, other: &RuleSet) -> bool {
        self.source == other.source
    }
}

impl Eq for RuleSet {}

impl RuleSet {
    /// Compiles a validated model. Domain names are unique in a valid model; were one repeated,
    /// its first definition would be kept.
    pub fn compile(model: RulesModel) -> RuleSet {
        let mut set = RuleSet {
            default_algorithm: model.default_algorithm,
            namespaces: limitador::Namespaces::compile(&model.namespaces),
            source: model.clone(),
            ..RuleSet::default()
        };
        for domain in model.domains {
            set.insert(Domain::compile(domain));
        }
        set
    }

    /// The domain named exactly `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        let &index = self.by_name.get(name)?;
        self.domains.get(index)
    }

    /// Every domain, in the order of the model.
    pub fn domains(&self) -> std::slice::Iter<'_, Domain> {
        self.domains.iter()
    }

    /// The limitador-format namespaces (none unless such a limits file was loaded).
    pub fn namespaces(&self) -> &limitador::Namespaces {
        &self.namespaces
    }

    /// The algorithm of a client's limit override (`limits.default_algorithm`).
    pub fn default_algorithm(&self) -> Algorithm {
        self.default_algorithm
    }

    /// The number of domains (limitador namespaces not counted).
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// No domain and no limitador namespace.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty() && self.namespaces.is_empty()
    }

    fn insert(&mut self, domain: Domain) {
        if self.by_name.contains_key(domain.name()) {
            return;
        }
        self.by_name
            .insert(domain.name().into(), self.domains.len());
        self.domains.push(domain);
    }
}

/// One domain's compiled tree.
#[derive(Debug)]
pub struct Domain {
    name: String,
    root: Level,
    location: Location,
    defaults: LimitDefaults,
}

impl Domain {
    fn compile(rules: DomainRules) -> Domain {
        Domain {
            name: rules.domain,
            root: Level::compile(rules.descriptors),
            location: rules.location,
            defaults: rules.defaults,
        }
    }

    /// The defaults its limits were loaded with, which a client's limit override takes.
    pub fn defaults(&self) -> LimitDefaults {
        self.defaults
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the domain was defined.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The top-level rules, in declaration order (for dumps).
    pub fn rules(&self) -> &[Rule] {
        self.root.rules()
    }

    /// The rule a descriptor's entries end on, if any.
    ///
    /// Each entry must match a rule of the level reached so far, and the walk must end exactly
    /// on the last entry: no rule for zero entries, none for a request shorter or longer than
    /// the path it follows, and no retry of other rules when a deeper level does not match.
    ///
    /// ```
    /// use sluice_core::config::model::RulesModel;
    /// use sluice_core::rules::{Entry, RuleSet};
    /// # use sluice_core::config::model::*;
    /// # fn rule(key: &str, value: ValueMatch, children: Vec<DescriptorRule>) -> DescriptorRule {
    /// #     let location = Location { file: std::sync::Arc::new("r.yaml".into()), line: 1 };
    /// #     DescriptorRule { key: key.into(), value, policy: Policy::None, shadow_mode: false,
    /// #         quota_mode: false, detailed_metric: false, value_to_metric: false,
    /// #         share_threshold: false, metadata: None, children, location }
    /// # }
    /// # let location = Location { file: std::sync::Arc::new("r.yaml".into()), line: 1 };
    /// // domain: api
    /// // descriptors:
    /// //   - key: path
    /// //     value: /login
    /// //     descriptors:
    /// //       - key: remote_address
    /// let user = rule("remote_address", ValueMatch::Any, vec![]);
    /// let login = rule("path", ValueMatch::Exact("/login".into()), vec![user]);
    /// let model = RulesModel {
    ///     domains: vec![DomainRules { domain: "api".into(), descriptors: vec![login], location, defaults: Default::default() }],
    ///     ..RulesModel::default()
    /// };
    /// let rules = RuleSet::compile(model);
    /// let api = rules.domain("api").unwrap();
    ///
    /// let found = api
    ///     .find(&[Entry::new("path", "/login"), Entry::new("remote_address", "10.0.0.1")])
    ///     .unwrap();
    /// assert_eq!(found.rule().key, "remote_address");
    /// assert_eq!(found.path().len(), 2);
    ///
    /// // Too short, too long, or not matching: nothing applies.
    /// assert!(api.find(&[Entry::new("path", "/login")]).is_some()); // the pass-through node
    /// assert!(api.find(&[Entry::new("path", "/other")]).is_none());
    /// assert!(api.find(&[]).is_none());
    /// ```
    ///
    /// A rule whose limit declares `hold_id: K` also matches when one more entry, the last,
    /// has the key `K`: that entry names the request's hold ([`Match::hold`]) and is no level
    /// of the walk (it takes precedence over a child rule of key `K`).
    pub fn find(&self, entries: &[Entry]) -> Option<Match<'_>> {
        let (first, rest) = entries.split_first()?;
        let mut rule = self.root.find(&first.key, &first.value)?;
        let mut path = MatchPath::new(rule);
        for (i, entry) in rest.iter().enumerate() {
            if i + 1 == rest.len() && rule.hold_id.as_deref() == Some(entry.key.as_str()) {
                return Some(Match {
                    path,
                    last: rule,
                    hold: true,
                });
            }
            rule = rule.children.find(&entry.key, &entry.value)?;
            path.push(rule);
        }
        Some(Match {
            path,
            last: rule,
            hold: false,
        })
    }
}

/// One compiled descriptor rule.
#[derive(Debug)]
pub struct Rule {
    pub key: String,
    pub value: ValueMatch,
    pub policy: Policy,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    pub location: Location,
    /// The entry key naming a request's hold, when one of its limits declares `hold_id`.
    pub hold_id: Option<String>,
    /// What an observer derives from this rule once, kept for the life of the compiled rule
    /// set (the metrics keep the rule's counters here: see [`RuleSlot`]).
    pub slot: RuleSlot,
    /// A second slot, for what the admin page follows per rule (`metrics::live`).
    pub live: RuleSlot,
    children: Level,
}

impl Rule {
    fn compile(rule: DescriptorRule) -> Rule {
        let hold_id = match &rule.policy {
            Policy::Limited(limits) => limits.iter().find_map(|l| l.hold_id.clone()),
            _ => None,
        };
        Rule {
            hold_id,
            key: rule.key,
            value: rule.value,
            policy: rule.policy,
            shadow_mode: rule.shadow_mode,
            quota_mode: rule.quota_mode,
            detailed_metric: rule.detailed_metric,
            value_to_metric: rule.value_to_metric,
            share_threshold: rule.share_threshold,
            metadata: rule.metadata.map(Arc::new),
            location: rule.location,
            slot: RuleSlot::default(),
            live: RuleSlot::default(),
            children: Level::compile(rule.children),
        }
    }

    /// The rules one level below, in declaration order (for dumps).
    pub fn children(&self) -> &[Rule] {
        self.children.rules()
    }

    /// The wildcard pattern whose matches share one state, when `share_threshold` is set.
    pub(crate) fn shared_pattern(&self) -> Option<&str> {
        match &self.value {
            ValueMatch::Wildcard(pattern) if self.share_threshold => Some(pattern),
            _ => None,
        }
    }
}

/// The result of a successful walk: the rules matched at each level, the last one applying.
///
/// A match is never empty: it only exists for a walk of at least one entry.
#[derive(Debug, Clone)]
pub struct Match<'a> {
    path: MatchPath<'a>,
    last: &'a Rule,
    /// The request's last entry names its hold (the rule's `hold_id`), and is no level.
    hold: bool,
}

/// The rules of a walk: inline up to [`MatchPath::INLINE`] levels, on the heap beyond
/// (deeper trees are rare), so that matching allocates nothing.
#[derive(Debug, Clone)]
struct MatchPath<'a> {
    inline: [&'a Rule; MatchPath::INLINE],
    len: usize,
    /// The whole path once it is longer than `inline`.
    heap: Vec<&'a Rule>,
}

impl<'a> MatchPath<'a> {
    const INLINE: usize = 4;

    fn new(first: &'a Rule) -> MatchPath<'a> {
        MatchPath {
            inline: [first; MatchPath::INLINE],
            len: 1,
            heap: Vec::new(),
        }
    }

    fn push(&mut self, rule: &'a Rule) {
        if self.len < MatchPath::INLINE {
            self.inline[self.len] = rule;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline);
            }
            self.heap.push(rule);
        }
        self.len += 1;
    }

    fn as_slice(&self) -> &[&'a Rule] {
        if self.len <= MatchPath::INLINE {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

impl<'a> Match<'a> {
    /// The rule that applies (the one at the last level).
    pub fn rule(&self) -> &'a Rule {
        self.last
    }

    /// The rule matched at each level, one per request entry (but the hold's, see
    /// [`Match::hold`]).
    pub fn path(&self) -> &[&'a Rule] {
        self.path.as_slice()
    }

    /// Whether the request's last entry names its hold (the rule's `hold_id`): then it is
    /// no level of [`Match::path`], and no part of the state key.
    pub fn hold(&self) -> bool {
        self.hold
    }
}

/// A value derived from one compiled rule by whoever observes requests, built on first use and
/// kept until the rule set is replaced (a reload compiles new rules with empty slots, so
/// nothing derived from old rules outlives them). One observer type per process uses it.
#[derive(Default)]
pub struct RuleSlot(OnceLock<Arc<dyn Any + Send + Sync>>);

impl RuleSlot {
    /// The value kept here, built by `make` the first time; `None` when the slot holds a
    /// value of another type.
    pub fn get_or_init<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.0
            .get_or_init(|| Arc::new(make()) as Arc<dyn Any + Send + Sync>)
            .downcast_ref()
    }
}

impl std::fmt::Debug for RuleSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "RuleSlot(set)"
        } else {
            "RuleSlot(empty)"
        })
    }
}
