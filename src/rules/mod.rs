//! The compiled descriptor trees, one per domain, and matching.
//!
//! Matching walks a request descriptor's entries level by level: at each level an exact
//! `key`+`value` wins, then wildcard values of that key in declaration order, then the
//! key-only rule; a rule applies only when the walk ends exactly on the last entry; there is
//! no backtracking.

pub mod key;
mod wildcard;

use std::sync::Arc;

use crate::config::model::{Location, Policy, RulesModel, ValueMatch};

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
#[derive(Debug, Default)]
pub struct RuleSet {}

impl RuleSet {
    /// Compiles a validated model.
    pub fn compile(model: RulesModel) -> RuleSet {
        let _ = model;
        todo!("rules")
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        let _ = name;
        todo!("rules")
    }
}

/// One domain's compiled tree.
#[derive(Debug)]
pub struct Domain {}

impl Domain {
    pub fn name(&self) -> &str {
        todo!("rules")
    }

    /// The rule a descriptor's entries end on, if any.
    pub fn find(&self, entries: &[Entry]) -> Option<Match<'_>> {
        let _ = entries;
        todo!("rules")
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
}

/// The result of a successful walk: the rules matched at each level, the last one applying.
#[derive(Debug)]
pub struct Match<'a> {
    path: Vec<&'a Rule>,
}

impl<'a> Match<'a> {
    /// The rule that applies (the one at the last level).
    pub fn rule(&self) -> &'a Rule {
        self.path[self.path.len() - 1]
    }

    /// The rule matched at each level, one per request entry.
    pub fn path(&self) -> &[&'a Rule] {
        &self.path
    }
}
