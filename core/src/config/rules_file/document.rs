//! One YAML document (a domain) and its descriptor tree: keys, values, flags, metadata, and
//! the uniqueness of `(key, value)` at each level.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use saphyr::{MarkedYaml, YamlData};

use super::limit::{flag, policy};
use super::scalar::{json_map, string};
use super::tree::{Ctx, Field, Fields, describe, index, is_null, line, mapping};
use crate::config::model::{DescriptorRule, DomainRules, ValueMatch};

/// The keys of a document.
const DOCUMENT_KEYS: &[&str] = &["domain", "descriptors"];

/// The keys of a descriptor.
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Checks one document; `None` for an empty document or one without a usable domain name.
/// The descriptors of a domain with errors are partial: callers must look at `ctx.errors`.
pub(super) fn domain<'a>(doc: &'a MarkedYaml<'a>, ctx: &mut Ctx<'_>) -> Option<DomainRules> {
    if is_null(doc) {
        return None;
    }
    let fields = mapping(doc, "", line(doc), DOCUMENT_KEYS, ctx)?;
    let name = domain_name(&fields, ctx);
    ctx.enter_domain(name.as_ref().map_or("", |(n, _)| n.as_str()));
    let descriptors = list(fields.get("descriptors"), ctx);
    let (domain, line) = name?;
    Some(DomainRules {
        domain,
        descriptors,
        location: ctx.location(line),
        defaults: ctx.defaults,
    })
}

/// The non-empty `domain` and the line of its key.
fn domain_name(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<(String, usize)> {
    let Some(f) = fields.get_raw("domain") else {
        ctx.error(fields.line, "", "missing domain");
        return None;
    };
    let name = string(f, ctx)?;
    if name.is_empty() {
        ctx.error(f.line, &f.path, "must not be empty");
        return None;
    }
    Some((name, f.line))
}

/// A `descriptors` list (absent or null is empty), each unique at this level.
fn list(field: Option<&Field<'_>>, ctx: &mut Ctx<'_>) -> Vec<DescriptorRule> {
    let Some(f) = field else {
        return Vec::new();
    };
    let YamlData::Sequence(items) = &f.node.data else {
        let message = format!("expected a sequence, got {}", describe(f.node, ctx));
        ctx.error(f.line, &f.path, message);
        return Vec::new();
    };
    let rules: Vec<(String, DescriptorRule)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            let path = index(&f.path, i);
            descriptor(node, &path, ctx).map(|rule| (path, rule))
        })
        .collect();
    unique(&rules, ctx);
    rules.into_iter().map(|(_, rule)| rule).collect()
}

/// Reports every rule whose `(key, value)` already appeared earlier at the same level.
fn unique(rules: &[(String, DescriptorRule)], ctx: &mut Ctx<'_>) {
    let mut first_lines = HashMap::with_capacity(rules.len());
    for (path, rule) in rules {
        let value = match &rule.value {
            ValueMatch::Any => None,
            ValueMatch::Exact(v) | ValueMatch::Wildcard(v) => Some(v.as_str()),
        };
        match first_lines.entry((rule.key.as_str(), value)) {
            Entry::Vacant(slot) => {
                slot.insert(rule.location.line);
            }
            Entry::Occupied(first) => {
                let message = format!(
                    "duplicate descriptor '{}' (first defined at line {})",
                    composite(rule),
                    first.get()
                );
                ctx.error(rule.location.line, path, message);
            }
        }
    }
}

/// Adds `more` (the top-level descriptors of a later definition of `into`'s domain) to
/// `into`; one whose `(key, value)` `into` already has is an error naming both places.
pub(super) fn merge(into: &mut DomainRules, more: Vec<DescriptorRule>, ctx: &mut Ctx<'_>) {
    for (i, rule) in more.into_iter().enumerate() {
        let same = |r: &&DescriptorRule| r.key == rule.key && r.value == rule.value;
        if let Some(first) = into.descriptors.iter().find(same) {
            let message = format!(
                "duplicate descriptor '{}' of domain '{}' (first defined at {})",
                composite(&rule),
                into.domain,
                first.location
            );
            ctx.error(rule.location.line, &index("descriptors", i), message);
        } else {
            into.descriptors.push(rule);
        }
    }
}

/// `key`, or `key_value` when the rule has a value (the name envoyproxy/ratelimit uses).
fn composite(rule: &DescriptorRule) -> String {
    match &rule.value {
        ValueMatch::Any => rule.key.clone(),
        ValueMatch::Exact(v) | ValueMatch::Wildcard(v) => format!("{}_{v}", rule.key),
    }
}

/// One descriptor; `None` when it has no usable key. Every other problem is reported and the
/// rule is still returned, so duplicates and children are checked too.
fn descriptor<'a>(
    node: &'a MarkedYaml<'a>,
    path: &str,
    ctx: &mut Ctx<'_>,
) -> Option<DescriptorRule> {
    let fields = mapping(node, path, line(node), DESCRIPTOR_KEYS, ctx)?;
    let key = descriptor_key(&fields, ctx);
    let value = value_match(fields.get("value"), ctx);
    let policy = policy(&fields, ctx);
    let [
        shadow_mode,
        quota_mode,
        detailed_metric,
        value_to_metric,
        share_threshold,
    ] = [
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
    ]
    .map(|name| flag(&fields, name, ctx));
    let metadata = fields.get("metadata").and_then(|f| json_map(f, ctx));
    let children = list(fields.get("descriptors"), ctx);
    let (key, line) = key?;
    let mut rule = DescriptorRule {
        key,
        value,
        policy,
        shadow_mode,
        quota_mode,
        detailed_metric,
        value_to_metric,
        share_threshold,
        metadata,
        children,
        location: ctx.location(line),
    };
    rule.share_threshold = share_threshold_ok(&fields, &rule, ctx);
    Some(rule)
}

/// The non-empty `key` and the line it is on.
fn descriptor_key(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<(String, usize)> {
    let Some(f) = fields.get_raw("key") else {
        ctx.error(fields.line, &fields.path, "missing key");
        return None;
    };
    let key = string(f, ctx)?;
    if key.is_empty() {
        ctx.error(f.line, &f.path, "must not be empty");
        return None;
    }
    Some((key, f.line))
}

/// Absent or empty: any value; with `*`: a wildcard; otherwise an exact value.
fn value_match(field: Option<&Field<'_>>, ctx: &mut Ctx<'_>) -> ValueMatch {
    match field.and_then(|f| string(f, ctx)) {
        None => ValueMatch::Any,
        Some(v) if v.is_empty() => ValueMatch::Any,
        Some(v) if v.contains('*') => ValueMatch::Wildcard(v),
        Some(v) => ValueMatch::Exact(v),
    }
}

/// `share_threshold: true` is only meaningful on a wildcard value.
fn share_threshold_ok(fields: &Fields<'_>, rule: &DescriptorRule, ctx: &mut Ctx<'_>) -> bool {
    let wildcard = matches!(rule.value, ValueMatch::Wildcard(_));
    if let Some(f) = fields
        .get("share_threshold")
        .filter(|_| rule.share_threshold && !wildcard)
    {
        let message = format!(
            "share_threshold needs a wildcard value (containing '*'), got '{}'",
            composite(rule)
        );
        ctx.error(f.line, &f.path, message);
    }
    rule.share_threshold && wildcard
}
