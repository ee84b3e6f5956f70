//! limitador-format namespaces, compiled: which of a namespace's limits apply to a request,
//! and the key of each one's counter (see [`crate::config::limitador`]).

use std::collections::HashMap;

use ahash::RandomState;

use super::{Entry, key};
use crate::config::limitador::NamespaceLimit;
use crate::config::limitador::cel::{self, Expr};
use crate::config::model::LimitRule;

type CelContext<'a, 'v> = ::cel::Context<'a, 'v>;

/// Every namespace of the loaded limitador files, compiled.
#[derive(Debug, Default)]
pub struct Namespaces {
    by_name: HashMap<Box<str>, Namespace, RandomState>,
}

impl Namespaces {
    /// Groups validated limits by namespace, in file order.
    pub fn compile(limits: &[NamespaceLimit]) -> Namespaces {
        let mut by_name: HashMap<Box<str>, Namespace, RandomState> = HashMap::default();
        for limit in limits {
            let ns = by_name
                .entry(limit.namespace.as_str().into())
                .or_insert_with(|| Namespace {
                    name: limit.namespace.clone(),
                    limits: Vec::new(),
                });
            ns.limits.push(Compiled::new(limit.clone()));
        }
        Namespaces { by_name }
    }

    pub fn get(&self, name: &str) -> Option<&Namespace> {
        self.by_name.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Every namespace, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Namespace> {
        let mut all: Vec<&Namespace> = self.by_name.values().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all.into_iter()
    }
}

/// One namespace and its limits.
#[derive(Debug)]
pub struct Namespace {
    name: String,
    limits: Vec<Compiled>,
}

/// A limit with what is derived from it once.
#[derive(Debug)]
pub struct Compiled {
    pub limit: NamespaceLimit,
    pub rule: LimitRule,
    key_id: String,
    /// Whether an expression reads `limit` (else it is not bound).
    binds_limit: bool,
}

impl Compiled {
    /// The limit's identity in its counters' keys (the `limit=` level): `id:ID`, or a hash.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    fn new(limit: NamespaceLimit) -> Compiled {
        let binds_limit = limit
            .conditions
            .iter()
            .chain(&limit.variables)
            .any(Expr::reads_limit);
        Compiled {
            rule: limit.rule(),
            key_id: limit.key_id(),
            binds_limit,
            limit,
        }
    }
}

/// A limit that applies to a request, with the descriptor part of its counter's key.
#[derive(Debug)]
pub struct Applied<'a> {
    pub limit: &'a Compiled,
    pub key_part: String,
    /// The variables' values, in the limit's (sorted) order.
    pub values: Vec<String>,
}

impl Namespace {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limits, in file order.
    pub fn limits(&self) -> &[Compiled] {
        &self.limits
    }

    /// The limits that apply to a request with these descriptors, in file order.
    pub fn applicable(&self, descriptors: &[&[Entry]]) -> Vec<Applied<'_>> {
        let ctx = cel::request_context(
            descriptors
                .iter()
                .map(|d| d.iter().map(|e| (e.key.as_str(), e.value.as_str()))),
        );
        let mut out = Vec::new();
        for limit in &self.limits {
            let applied = if limit.binds_limit {
                let mut inner = ctx.new_inner_scope();
                let l = &limit.limit;
                let value = cel::limit_value(l.name.as_deref(), l.id.as_deref());
                inner.add_variable_from_value("limit", value);
                self.apply(limit, &inner)
            } else {
                self.apply(limit, &ctx)
            };
            out.extend(applied);
        }
        out
    }

    fn apply<'a>(&self, limit: &'a Compiled, ctx: &CelContext<'_, '_>) -> Option<Applied<'a>> {
        if !limit.limit.conditions.iter().all(|c| c.holds(ctx)) {
            return None;
        }
        let values: Vec<String> = limit
            .limit
            .variables
            .iter()
            .map(|v| v.value(ctx))
            .collect::<Option<_>>()?;
        let mut entries = Vec::with_capacity(values.len() + 1);
        entries.push(Entry::new("limit", limit.key_id.as_str()));
        for (v, value) in limit.limit.variables.iter().zip(&values) {
            entries.push(Entry::new(v.source(), value.as_str()));
        }
        Some(Applied {
            limit,
            key_part: key::descriptor_part(&self.name, &entries, None),
            values,
        })
    }
}
