//! A limitador limits file: a YAML sequence of limits, each with `namespace`, `max_value`,
//! `seconds`, `conditions`, `variables` and optionally `name` and `id`, plus sluice's
//! `algorithm` extension. Expressions are compiled here, so a bad one is an error at its line.

use std::num::NonZeroU32;

use saphyr::{MarkedYaml, YamlData};

use super::scalar::{string, uint};
use super::tree::{Ctx, Field, Fields, describe, index, line, mapping};
use crate::config::limitador::NamespaceLimit;
use crate::config::limitador::cel::Expr;
use crate::config::model::{Algorithm, SLIDING_LOG_MAX_QUOTA, Unit};

/// The keys of one limit: limitador's, then sluice's extension.
const LIMIT_KEYS: &[&str] = &[
    "namespace",
    "max_value",
    "seconds",
    "conditions",
    "variables",
    "name",
    "id",
    "algorithm",
];

/// The longest window: 100 years of 365 days.
const MAX_SECONDS: u64 = 100 * Unit::Year.seconds();

/// Whether a document is a limitador limits file rather than a ratelimit domain: a sequence at
/// the top that is empty or whose first item is a mapping with one of limitador's own keys
/// (`namespace`, `max_value`, `seconds`). Any other sequence stays "expected a mapping".
pub(super) fn is_limits_file(doc: &MarkedYaml<'_>) -> bool {
    let YamlData::Sequence(items) = &doc.data else {
        return false;
    };
    let Some(first) = items.first() else {
        return true;
    };
    let YamlData::Mapping(map) = &first.data else {
        return false;
    };
    map.keys().any(|k| {
        matches!(&k.data, YamlData::Value(saphyr::Scalar::String(s))
            if matches!(s.as_ref(), "namespace" | "max_value" | "seconds"))
    })
}

/// Every limit of one sequence document that is valid; the others are reported.
pub(super) fn limits<'a>(doc: &'a MarkedYaml<'a>, ctx: &mut Ctx<'_>) -> Vec<NamespaceLimit> {
    let YamlData::Sequence(items) = &doc.data else {
        return Vec::new();
    };
    let parsed: Vec<NamespaceLimit> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| limit(item, &index("", i), ctx))
        .collect();
    parsed
}

/// One limit mapping at `path`.
fn limit<'a>(node: &'a MarkedYaml<'a>, path: &str, ctx: &mut Ctx<'_>) -> Option<NamespaceLimit> {
    let at = line(node);
    let fields = mapping(node, path, at, LIMIT_KEYS, ctx)?;
    let namespace = required(&fields, "namespace", ctx).and_then(|f| non_empty(f, ctx));
    let max_value = required(&fields, "max_value", ctx).and_then(|f| uint(f, ctx));
    let seconds = required(&fields, "seconds", ctx).and_then(|f| seconds(f, ctx));
    let conditions = expressions(fields.get_raw("conditions"), ctx);
    let variables = expressions(fields.get_raw("variables"), ctx);
    let name = optional(&fields, "name", ctx)?;
    let id = optional(&fields, "id", ctx)?;
    let algorithm = algorithm(&fields, max_value, ctx)?;
    Some(NamespaceLimit {
        namespace: namespace?,
        id,
        name,
        max_value: max_value?,
        seconds: seconds?,
        conditions: conditions?,
        variables: variables?,
        algorithm,
        location: ctx.location(at),
    })
}

/// A key every limit must have (null counts as missing).
fn required<'f, 'a>(fields: &'f Fields<'a>, key: &str, ctx: &mut Ctx<'_>) -> Option<&'f Field<'a>> {
    let field = fields.get(key);
    if field.is_none() {
        ctx.error(fields.line, &fields.path, format!("missing {key}"));
    }
    field
}

fn non_empty(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<String> {
    let text = string(f, ctx)?;
    if text.is_empty() {
        ctx.error(f.line, &f.path, "must not be empty");
        return None;
    }
    Some(text)
}

/// An optional string; `Some(None)` when absent, null or empty, `None` when invalid.
fn optional(fields: &Fields<'_>, key: &str, ctx: &mut Ctx<'_>) -> Option<Option<String>> {
    match fields.get(key) {
        None => Some(None),
        Some(f) => string(f, ctx).map(|s| (!s.is_empty()).then_some(s)),
    }
}

/// `seconds`: from 1 to 100 years.
fn seconds(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<NonZeroU32> {
    let n = uint(f, ctx)?;
    let Some(n) = NonZeroU32::new(n) else {
        ctx.error(f.line, &f.path, "must be at least 1");
        return None;
    };
    if u64::from(n.get()) > MAX_SECONDS {
        let message = format!("a window of {n} seconds is longer than 100 years");
        ctx.error(f.line, &f.path, message);
        return None;
    }
    Some(n)
}

/// `conditions` or `variables`: a list of CEL expressions (absent or null is none), each
/// compiled; sorted and without repeats, as limitador keeps them.
fn expressions(field: Option<&Field<'_>>, ctx: &mut Ctx<'_>) -> Option<Vec<Expr>> {
    let Some(f) = field else {
        return Some(Vec::new());
    };
    let items = match &f.node.data {
        YamlData::Sequence(items) => items.as_slice(),
        _ if super::tree::is_null(f.node) => &[],
        _ => {
            let message = format!("expected a sequence, got {}", describe(f.node, ctx));
            ctx.error(f.line, &f.path, message);
            return None;
        }
    };
    let mut ok = true;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = Field {
            line: line(item),
            path: index(&f.path, i),
            node: item,
        };
        match string(&field, ctx).map(|s| Expr::compile(&s)) {
            Some(Ok(expr)) => out.push(expr),
            Some(Err(message)) => {
                ctx.error(field.line, &field.path, message);
                ok = false;
            }
            None => ok = false,
        }
    }
    out.sort_by(|a, b| a.source().cmp(b.source()));
    out.dedup();
    ok.then_some(out)
}

/// sluice's `algorithm` extension: `fixed_window` (limitador's behaviour) when absent.
fn algorithm(fields: &Fields<'_>, max_value: Option<u32>, ctx: &mut Ctx<'_>) -> Option<Algorithm> {
    let Some(f) = fields.get("algorithm") else {
        return Some(Algorithm::FixedWindow);
    };
    let name = string(f, ctx)?;
    let Some(algorithm) = Algorithm::parse(&name) else {
        let message = format!(
            "unknown algorithm '{name}' (expected {})",
            Algorithm::names()
        );
        ctx.error(f.line, &f.path, message);
        return None;
    };
    if algorithm == Algorithm::SlidingLog && max_value.is_some_and(|m| m > SLIDING_LOG_MAX_QUOTA) {
        let message = format!(
            "sliding_log keeps one entry per admitted request: max_value must be at most \
             {SLIDING_LOG_MAX_QUOTA} with it"
        );
        ctx.error(f.line, &f.path, message);
        return None;
    }
    Some(algorithm)
}

/// Reports a limit that is the same limit as an earlier one (same namespace, window,
/// conditions and variables, or the same id): limitador would keep only one of them.
pub(super) fn check_unique(all: &[NamespaceLimit], new: &[NamespaceLimit], ctx: &mut Ctx<'_>) {
    for (i, limit) in new.iter().enumerate() {
        let earlier = all.iter().chain(&new[..i]).find(|other| {
            other.same_limit(limit)
                || (limit.id.is_some()
                    && other.namespace == limit.namespace
                    && other.id == limit.id)
        });
        if let Some(first) = earlier {
            let message = format!(
                "the same limit as the one at {} (same namespace, seconds, conditions and \
                 variables, or the same id): limitador would keep only one of them",
                first.location
            );
            ctx.error(limit.location.line, "", message);
        }
    }
}
