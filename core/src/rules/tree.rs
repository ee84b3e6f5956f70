//! One level of a compiled descriptor tree: its rules and the index that finds one of them for
//! a request entry.
//!
//! Per key, a level keeps a map from exact values to rules, the wildcard patterns in
//! declaration order and the key-only rule, so a lookup costs two hash lookups plus the
//! wildcard patterns of the requested key, however many rules the level has. Maps are keyed by
//! `Box<str>` and looked up with `&str`: no allocation.

use std::collections::HashMap;

use ahash::RandomState;

use super::Rule;
use super::wildcard::Wildcard;
use crate::config::model::{DescriptorRule, ValueMatch};

/// The rules of one level, in declaration order, and their index.
#[derive(Debug, Default)]
pub(crate) struct Level {
    rules: Vec<Rule>,
    by_key: HashMap<Box<str>, KeyIndex, RandomState>,
}

/// Every rule of one key at one level, as indices into [`Level::rules`].
#[derive(Debug, Default)]
struct KeyIndex {
    exact: HashMap<Box<str>, usize, RandomState>,
    wildcards: Vec<(Wildcard, usize)>,
    any: Option<usize>,
}

impl Level {
    /// Compiles the rules of one level (and, through [`Rule::compile`], the levels below).
    pub(crate) fn compile(descriptors: Vec<DescriptorRule>) -> Level {
        let mut level = Level::default();
        for descriptor in descriptors {
            level.push(Rule::compile(descriptor));
        }
        level
    }

    /// The rules of this level, in declaration order.
    pub(crate) fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule a request entry matches at this level: exact value, else the first matching
    /// wildcard in declaration order, else the key-only rule.
    pub(crate) fn find(&self, key: &str, value: &str) -> Option<&Rule> {
        let index = self.by_key.get(key)?.find(value)?;
        self.rules.get(index)
    }

    /// Whether some rule of this level names `key`.
    pub(crate) fn has_key(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    fn push(&mut self, rule: Rule) {
        let index = self.rules.len();
        self.by_key
            .entry(rule.key.as_str().into())
            .or_default()
            .add(&rule.value, index);
        self.rules.push(rule);
    }
}

impl KeyIndex {
    /// Indexes one rule. Validation makes `(key, value)` unique per level; were it not, the
    /// first declared rule would win, as with wildcards.
    fn add(&mut self, value: &ValueMatch, index: usize) {
        match value {
            ValueMatch::Exact(value) => self.add_exact(value, index),
            ValueMatch::Wildcard(pattern) => {
                // A request value equal to the pattern itself is an exact match of this rule,
                // before any earlier wildcard (as in envoyproxy/ratelimit).
                self.add_exact(pattern, index);
                if let Some(wildcard) = Wildcard::new(pattern) {
                    self.wildcards.push((wildcard, index));
                }
            }
            ValueMatch::Any => {
                self.any.get_or_insert(index);
            }
        }
    }

    fn add_exact(&mut self, value: &str, index: usize) {
        self.exact.entry(value.into()).or_insert(index);
    }

    fn find(&self, value: &str) -> Option<usize> {
        self.exact
            .get(value)
            .copied()
            .or_else(|| self.find_wildcard(value))
            .or(self.any)
    }

    fn find_wildcard(&self, value: &str) -> Option<usize> {
        self.wildcards
            .iter()
            .find(|(wildcard, _)| wildcard.matches(value))
            .map(|&(_, index)| index)
    }
}
