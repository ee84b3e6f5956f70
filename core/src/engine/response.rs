//! Assembling the answer: per-descriptor statuses, the overall code, headers and metadata.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::plan::{Applies, DescriptorPlan, Planned};
use super::{Options, Request};
use crate::config::model::{LimitRule, OnDeny, Unit};
use crate::limiter::{BatchOutcome, HitOutcome, Role};

/// A verdict. "Unknown" only answers an empty domain while limitador-format namespaces are
/// loaded, as limitador does (Envoy lets such an answer through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
    Unknown,
}

/// The limit a status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: Option<String>,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    pub code: Code,
    /// None when no limit applied (or an unlimited rule).
    pub current_limit: Option<CurrentLimit>,
    /// Left after this request; 0 when over; `u32::MAX` for an unlimited rule.
    pub limit_remaining: u32,
    /// Whole seconds, rounded up: when OK, until the full quota is back; when over, until
    /// this request would be admitted (at least 1).
    pub duration_until_reset: Option<u64>,
}

/// The answer for a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub overall_code: Code,
    /// One per request descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    pub response_headers: Vec<(String, String)>,
    pub dynamic_metadata: Option<Map<String, Value>>,
    /// The body Envoy answers a denied request with (`on_deny` of the limit that denied it).
    pub raw_body: Option<String>,
}

const NANOS_PER_SEC: u64 = 1_000_000_000;

pub(super) fn assemble(
    request: &Request,
    planned: &Planned<'_>,
    outcome: &BatchOutcome,
    options: &Options,
) -> Response {
    let reported: Vec<(DescriptorStatus, Option<Role>)> = planned
        .descriptors
        .iter()
        .map(|d| status(d, &outcome.hits))
        .collect();
    let overall_code = if outcome.admitted || options.shadow_mode {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let mut response_headers = headers(&reported, overall_code, options);
    let dynamic_metadata = metadata(request, planned, &reported, options);
    let denial = (overall_code == Code::OverLimit)
        .then(|| custom_denial(planned, &outcome.hits))
        .flatten();
    let raw_body = denial.map(|d| {
        let own = d.all_headers().map(|(k, v)| (k.to_owned(), v.to_owned()));
        response_headers.extend(own);
        d.body.clone()
    });
    Response {
        overall_code,
        statuses: reported.into_iter().map(|(s, _)| s).collect(),
        response_headers,
        dynamic_metadata,
        raw_body,
    }
}

/// The `on_deny` of a denied request: the first descriptor, in request order, that is not in
/// shadow mode and one of whose limits denied it and has one.
fn custom_denial<'p>(planned: &'p Planned<'_>, hits: &[HitOutcome]) -> Option<&'p OnDeny> {
    planned.descriptors.iter().find_map(|d| {
        let Applies::Limits { limits, role } = &d.applies else {
            return None;
        };
        if role.is_shadow() {
            return None;
        }
        limits.iter().find_map(|(rule, i)| {
            let denied = hits.get(*i).is_some_and(|o| !o.admitted);
            denied.then_some(rule.on_deny.as_deref()).flatten()
        })
    })
}

fn status(d: &DescriptorPlan<'_>, hits: &[HitOutcome]) -> (DescriptorStatus, Option<Role>) {
    match &d.applies {
        Applies::Nothing => (plain(0), None),
        Applies::Unlimited => (plain(u32::MAX), None),
        Applies::Limits { limits, role } => {
            let Some((rule, chosen)) = chosen(limits, hits) else {
                return (plain(0), None);
            };
            let over = !chosen.admitted;
            let status = DescriptorStatus {
                code: if over && !role.is_shadow() {
                    Code::OverLimit
                } else {
                    Code::Ok
                },
                current_limit: Some(CurrentLimit {
                    requests_per_unit: rule.requests_per_unit,
                    unit: rule.unit,
                    name: rule.name.clone(),
                }),
                limit_remaining: if over {
                    0
                } else {
                    u32::try_from(chosen.remaining).unwrap_or(u32::MAX)
                },
                duration_until_reset: Some(reset_secs(chosen.reset_nanos, over)),
            };
            (status, Some(*role))
        }
    }
}

/// The limit a descriptor reports: the denying one that waits longest, else the one with
/// least remaining.
pub(super) fn chosen<'p, 'r>(
    limits: &'p [(Cow<'r, LimitRule>, usize)],
    hits: &'p [HitOutcome],
) -> Option<(&'p Cow<'r, LimitRule>, &'p HitOutcome)> {
    let outcomes = limits
        .iter()
        .filter_map(|(rule, i)| Some((rule, hits.get(*i)?)));
    let denied = outcomes.clone().filter(|(_, o)| !o.admitted);
    denied
        .max_by_key(|(_, o)| o.reset_nanos)
        .or_else(|| outcomes.min_by_key(|(_, o)| o.remaining))
}

fn plain(limit_remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok,
        current_limit: None,
        limit_remaining,
        duration_until_reset: None,
    }
}

fn reset_secs(nanos: u64, over: bool) -> u64 {
    let secs = nanos.div_ceil(NANOS_PER_SEC);
    if over { secs.max(1) } else { secs }
}

/// `RateLimit-*` headers from the status with the least remaining, unless an enforced
/// descriptor is over the limit (then the last such one), and `Retry-After` when over.
fn headers(
    reported: &[(DescriptorStatus, Option<Role>)],
    overall: Code,
    options: &Options,
) -> Vec<(String, String)> {
    let Some(names) = &options.headers else {
        return Vec::new();
    };
    let limited = reported.iter().filter(|(s, _)| s.current_limit.is_some());
    let over = limited
        .clone()
        .rfind(|(s, r)| s.code == Code::OverLimit && *r != Some(Role::Quota));
    let Some((chosen, _)) = over.or_else(|| limited.min_by_key(|(s, _)| s.limit_remaining)) else {
        return Vec::new();
    };
    let Some(limit) = &chosen.current_limit else {
        return Vec::new();
    };
    let reset = chosen.duration_until_reset.unwrap_or(0);
    let mut out = vec![
        (names.limit.clone(), limit.requests_per_unit.to_string()),
        (names.remaining.clone(), chosen.limit_remaining.to_string()),
        (names.reset.clone(), reset.to_string()),
    ];
    if names.retry_after && overall == Code::OverLimit {
        out.push(("Retry-After".to_owned(), reset.max(1).to_string()));
    }
    out
}

/// The rules' `metadata` of every descriptor that is not over the limit (merged, first writer
/// wins), and, when asked, an echo of the request.
fn metadata(
    request: &Request,
    planned: &Planned<'_>,
    reported: &[(DescriptorStatus, Option<Role>)],
    options: &Options,
) -> Option<Map<String, Value>> {
    let mut merged = Map::new();
    for (d, (s, _)) in planned.descriptors.iter().zip(reported) {
        if let (Some(m), Code::Ok) = (d.metadata, s.code) {
            merge(&mut merged, m);
        }
    }
    let mut out = if options.echo_metadata {
        echo(request, reported)
    } else {
        Map::new()
    };
    if !merged.is_empty() {
        out.insert("metadata".to_owned(), Value::Object(merged));
    }
    (!out.is_empty()).then_some(out)
}

fn merge(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(Value::Object(a)), Value::Object(b)) => merge(a, b),
            (Some(_), _) => {}
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The request, each descriptor with its own verdict: `code` (`OK` or `OVER_LIMIT`) and, when
/// the limit reported for it has a name, `limitName`, so that a gateway can tell which quota
/// is spent.
fn echo(request: &Request, reported: &[(DescriptorStatus, Option<Role>)]) -> Map<String, Value> {
    let descriptors = request
        .descriptors
        .iter()
        .zip(reported)
        .map(|(d, (status, _))| {
            let mut m = Map::new();
            let entries = d
                .entries
                .iter()
                .map(|e| Value::String(format!("{}={}", e.key, e.value)))
                .collect();
            m.insert("entries".to_owned(), Value::Array(entries));
            if let Some(l) = d.limit {
                let text = format!("{}/{}", l.requests_per_unit, l.unit.as_str());
                m.insert("limit".to_owned(), Value::String(text));
            }
            if let Some(h) = d.hits_addend {
                m.insert("hitsAddend".to_owned(), Value::from(h));
            }
            let code = match status.code {
                Code::Ok => "OK",
                Code::OverLimit => "OVER_LIMIT",
                Code::Unknown => "UNKNOWN",
            };
            m.insert("code".to_owned(), Value::String(code.to_owned()));
            if let Some(name) = status.current_limit.as_ref().and_then(|l| l.name.as_ref()) {
                m.insert("limitName".to_owned(), Value::String(name.clone()));
            }
            Value::Object(m)
        })
        .collect();
    let mut out = Map::new();
    out.insert("domain".to_owned(), Value::String(request.domain.clone()));
    out.insert("descriptors".to_owned(), Value::Array(descriptors));
    if request.hits_addend != 0 {
        out.insert("hitsAddend".to_owned(), Value::from(request.hits_addend));
    }
    out
}
