//! `/rlconfig`: the active rules as text, one line per limit, under a header giving the
//! version and load time.
//!
//! ```text
//! # version 2, loaded at 1767225600 (Unix time), 1 domain(s)
//! demo.path_/login: unit=MINUTE unit_multiplier=1 requests_per_unit=5 burst=5 algorithm=funnel charge=admitted borrow=false shadow_mode=false quota_mode=false name=login
//! demo.internal: unlimited shadow_mode=false quota_mode=false
//! ```
//!
//! limitador-format namespaces follow, a line per limit:
//! `test_namespace[1]: max_value=5 seconds=60 algorithm=fixed_window conditions=[...] variables=[...]`.
//!
//! The path is the per-rule metrics label (see [`crate::rules::naming`]); a descriptor with
//! several limits has several lines; pass-through rules (no limit) have none. A failed reload
//! since the active rules were loaded adds a `# last failed reload` header line.

use std::fmt::Write as _;
use std::time::SystemTime;

use super::ConfigStatus;
use crate::config::limitador::cel::Expr;
use crate::config::model::{LimitRule, Policy};
use crate::rules::limitador::Namespace;
use crate::rules::naming::segment;
use crate::rules::{Rule, RuleSet};

/// The whole dump.
pub(super) fn dump(rules: &RuleSet, status: &ConfigStatus) -> String {
    let mut out = format!(
        "# version {}, loaded at {} (Unix time), {} domain(s)\n",
        status.version,
        unix(status.loaded_at),
        rules.len()
    );
    if let Some((at, errors)) = status.last_failure {
        let _ = writeln!(
            out,
            "# last failed reload at {} ({errors} error(s)); these rules stayed active",
            unix(at)
        );
    }
    for domain in rules.domains() {
        walk(domain.rules(), domain.name(), &mut out);
    }
    for ns in rules.namespaces().iter() {
        namespace(ns, &mut out);
    }
    out
}

/// The limits of a limitador-format namespace, one line each:
/// `namespace[i]: max_value=5 seconds=60 algorithm=fixed_window conditions=[...] variables=[...]`.
fn namespace(ns: &Namespace, out: &mut String) {
    for (i, c) in ns.limits().iter().enumerate() {
        let l = &c.limit;
        let list = |exprs: &[Expr]| {
            let sources: Vec<&str> = exprs.iter().map(Expr::source).collect();
            format!("[{}]", sources.join(", "))
        };
        let _ = write!(
            out,
            "{}[{i}]: max_value={} seconds={} algorithm={} conditions={} variables={}",
            ns.name(),
            l.max_value,
            l.seconds,
            l.algorithm.as_str(),
            list(&l.conditions),
            list(&l.variables)
        );
        if let Some(n) = &l.name {
            let _ = write!(out, " name={n}");
        }
        out.push('\n');
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn walk(rules: &[Rule], prefix: &str, out: &mut String) {
    for rule in rules {
        let path = format!("{prefix}.{}", segment(rule));
        let flags = format!(
            "shadow_mode={} quota_mode={}",
            rule.shadow_mode, rule.quota_mode
        );
        match &rule.policy {
            Policy::None => {}
            Policy::Unlimited { name, .. } => {
                let _ = write!(out, "{path}: unlimited {flags}");
                if let Some(n) = name {
                    let _ = write!(out, " name={n}");
                }
                out.push('\n');
            }
            Policy::Limited(limits) => {
                for limit in limits {
                    let _ = writeln!(out, "{path}: {} {flags}{}", params(limit), extra(limit));
                }
            }
        }
        walk(rule.children(), &path, out);
    }
}

fn params(l: &LimitRule) -> String {
    format!(
        "unit={} unit_multiplier={} requests_per_unit={} burst={} algorithm={} charge={} borrow={}",
        l.unit.as_str(),
        l.unit_multiplier,
        l.requests_per_unit,
        l.burst,
        l.algorithm.as_str(),
        l.charge.as_str(),
        l.borrow
    )
}

fn extra(l: &LimitRule) -> String {
    let mut out = String::new();
    if let Some(n) = &l.name {
        let _ = write!(out, " name={n}");
    }
    if !l.replaces.is_empty() {
        let _ = write!(out, " replaces={}", l.replaces.join(","));
    }
    if let Some(d) = &l.on_deny {
        let headers = d
            .all_headers()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
            .join(",");
        let _ = write!(out, " on_deny=body:{}B", d.body.len());
        if !headers.is_empty() {
            let _ = write!(out, ",headers:{headers}");
        }
    }
    if l.block_nanos > 0 {
        let _ = write!(out, " block_for={}ms", l.block_nanos / 1_000_000);
    }
    if let Some(zone) = l.time_zone {
        let _ = write!(out, " time_zone={}", zone.name());
    }
    out
}
