//! `/counters` (the live state of keys) and `/counters/top` (the keys denied most), as JSON
//! or as text for people (`?format=text`, or `Accept: text/plain`).
//!
//! `/counters` parameters: `domain` (exact), `rule` (the rule's path, as in the metrics),
//! `prefix` (the beginning of the state key, e.g. `{api|user=al`), `count` (keys per page,
//! default 100, at most 1000) and `cursor` (the previous page's `next`). A page may hold
//! fewer keys than `count` (filters apply after the backend lists a key) and still have a
//! `next`; the walk is over when `next` is null.
//!
//! `/counters/top` parameters: `domain` (default: every configured domain), `window`
//! (`minute`, the default, or `hour`), `n` (keys per domain, default 10, at most 1000).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Admin, text};
use crate::config::model::{Algorithm, LimitRule, Policy};
use crate::limiter::LimitParams;
use crate::limiter::counters::{CounterEntry, CounterQuery, Resolved};
use crate::metrics::top::Window;
use crate::rules::RuleSet;
use crate::rules::key::{self, Decoded};
use crate::rules::naming::segment;

const DEFAULT_COUNT: usize = 100;
const MAX_COUNT: usize = 1000;

/// What `/counters` was asked.
pub(super) struct Filter {
    pub(super) domain: Option<String>,
    pub(super) rule: Option<String>,
}

/// A key's rule and limit in the active rules.
struct Found {
    path: String,
    limit: LimitRule,
}

/// `GET /counters`.
pub(super) async fn counters(
    State(a): State<Admin>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let q = super::access::query_pairs(q.as_deref());
    let count = match q.get("count").map(|c| c.parse::<usize>()) {
        None => DEFAULT_COUNT,
        Some(Ok(n)) if (1..=MAX_COUNT).contains(&n) => n,
        Some(_) => {
            let m = format!("count must be a number from 1 to {MAX_COUNT}\n");
            return text(StatusCode::BAD_REQUEST, m);
        }
    };
    let filter = Arc::new(Filter {
        domain: q.get("domain").cloned().filter(|d| !d.is_empty()),
        rule: q.get("rule").cloned().filter(|r| !r.is_empty()),
    });
    let prefix = key_prefix(q.get("prefix"), filter.domain.as_deref());
    let rules = a.rules.load_full();
    let resolve = {
        let (rules, filter) = (rules.clone(), filter.clone());
        move |key: &[u8]| resolve(&rules, &filter, key)
    };
    let query = CounterQuery {
        prefix: prefix.as_bytes(),
        cursor: q.get("cursor").map(String::as_str),
        count,
        resolve: &resolve,
    };
    let page = match a.engine.limiter().counters(&query).await {
        Ok(page) => page,
        Err(e) if e.transient => return text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let keys: Vec<Value> = page.entries.iter().map(|e| entry(&rules, e)).collect();
    if wants_text(&q, &headers) {
        return text(StatusCode::OK, counters_text(&keys, page.next.as_deref()));
    }
    json_response(&json!({ "keys": keys, "next": page.next }))
}

/// The state key prefix to list: the one given, else the domain's.
fn key_prefix(prefix: Option<&String>, domain: Option<&str>) -> String {
    match (prefix.filter(|p| !p.is_empty()), domain) {
        (Some(p), _) => p.clone(),
        (None, Some(d)) => {
            let mut out = String::from("{");
            key::escape_into(&mut out, d);
            out
        }
        (None, None) => String::new(),
    }
}

/// What a listed key is, for the backend: skipped by the filters, or its limit.
pub(super) fn resolve(rules: &RuleSet, filter: &Filter, raw: &[u8]) -> Resolved {
    let Ok(decoded) = key::decode(raw) else {
        // Not a state key: listed only when nothing filters by domain or rule.
        let unfiltered = filter.domain.is_none() && filter.rule.is_none();
        return if unfiltered {
            Resolved::Unknown
        } else {
            Resolved::Skip
        };
    };
    if filter.domain.as_ref().is_some_and(|d| *d != decoded.domain) {
        return Resolved::Skip;
    }
    let found = find(rules, &decoded);
    let rule_wanted = match (&filter.rule, &found) {
        (None, _) => true,
        (Some(want), Some(f)) => *want == f.path,
        (Some(_), None) => false,
    };
    match found {
        _ if !rule_wanted => Resolved::Skip,
        Some(f) => Resolved::Limit(LimitParams::from_rule(&f.limit)),
        None => Resolved::Unknown,
    }
}

/// The rule and limit a decoded key belongs to in `rules`.
fn find(rules: &RuleSet, key: &Decoded) -> Option<Found> {
    let domain = rules.domain(&key.domain)?;
    let m = domain.find(&key.entries())?;
    let Policy::Limited(limits) = &m.rule().policy else {
        return None;
    };
    let limit = limits
        .iter()
        .find(|l| l.algorithm == key.algorithm && l.period_nanos() == key.period_nanos)?;
    let path: Vec<String> = m.path().iter().map(|r| segment(r)).collect();
    Some(Found {
        path: path.join("."),
        limit: limit.clone(),
    })
}

/// One key as JSON.
fn entry(rules: &RuleSet, e: &CounterEntry) -> Value {
    let raw = String::from_utf8_lossy(&e.key).into_owned();
    let Ok(decoded) = key::decode(&e.key) else {
        return json!({ "key": raw });
    };
    let found = find(rules, &decoded);
    let mut out = json!({
        "key": raw,
        "domain": decoded.domain,
        "descriptor": decoded.descriptor(),
        "algorithm": decoded.algorithm.as_str(),
        "period_seconds": decoded.period_nanos as f64 / 1e9,
        "rule": found.as_ref().map(|f| f.path.clone()),
    });
    if let (Some(limit), Some(state)) = (e.limit, e.state) {
        out["limit"] = json!(limit.quota);
        out["burst"] = json!(limit.burst);
        out["remaining"] = json!(state.remaining);
        out["reset_seconds"] = json!(state.reset_nanos as f64 / 1e9);
        out["in_debt"] = json!(!state.admitted && state.blocked_nanos.is_none());
        if let Some(blocked) = state.blocked_nanos {
            out["blocked_seconds"] = json!(blocked as f64 / 1e9);
        }
        if let Some(leased) = state.leased {
            out["leased_here"] = json!(leased);
        }
        if let Some(share) = state.share {
            out["scope"] = json!("global");
            out["region_share"] = share_json(&share);
        }
        if limit.algorithm == Algorithm::Concurrency {
            out["holds"] = json!(u64::from(limit.quota).saturating_sub(state.remaining));
            out["oldest_hold_expires_seconds"] =
                json!(state.oldest_hold_nanos.map(|n| n as f64 / 1e9));
        }
    }
    out
}

/// A region's share of a global limit (`/counters`, `/why`); the limit's `remaining` and
/// `reset_seconds` beside it are the home Redis's.
pub(super) fn share_json(s: &crate::limiter::counters::ShareView) -> Value {
    json!({
        "held": s.held,
        "granted": s.granted,
        "spent": s.spent,
        "admitted_by_global_on_error": s.fallback,
        "home_unreachable_seconds": s.home_down_nanos.map(|n| n as f64 / 1e9),
        "home_remaining_after_last_share": s.home_remaining,
    })
}

fn counters_text(keys: &[Value], next: Option<&str>) -> String {
    let mut out = format!("# {} key(s)", keys.len());
    match next {
        Some(c) => {
            let _ = writeln!(out, "; next page: cursor={c}");
        }
        None => out.push('\n'),
    }
    for k in keys {
        let s = |f: &str| k.get(f).map_or_else(|| "-".to_owned(), plain);
        let _ = writeln!(
            out,
            "{}  rule={} algorithm={} limit={}/{}s remaining={} reset={}s",
            s("key"),
            s("rule"),
            s("algorithm"),
            s("limit"),
            s("period_seconds"),
            s("remaining"),
            s("reset_seconds"),
        );
        if let Some(b) = k.get("blocked_seconds") {
            out.pop();
            let _ = writeln!(out, " blocked={}s", plain(b));
        }
        if k.get("holds").is_some() {
            out.pop();
            let _ = writeln!(
                out,
                " holds={} oldest_hold_expires={}s",
                s("holds"),
                s("oldest_hold_expires_seconds")
            );
        }
    }
    out
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// `GET /counters/top`.
pub(super) async fn top(
    State(a): State<Admin>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let q = super::access::query_pairs(q.as_deref());
    let window = match q.get("window").map(|w| Window::parse(w)) {
        None => Window::Minute,
        Some(Some(w)) => w,
        Some(None) => {
            return text(
                StatusCode::BAD_REQUEST,
                "window must be minute or hour\n".into(),
            );
        }
    };
    let n = match q.get("n").map(|n| n.parse::<usize>()) {
        None => 10,
        Some(Ok(n)) if (1..=MAX_COUNT).contains(&n) => n,
        Some(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("n must be a number from 1 to {MAX_COUNT}\n"),
            );
        }
    };
    let domains = top_domains(&a, q.get("domain"));
    let body = top_json(&a, &domains, window, n);
    if wants_text(&q, &headers) {
        return text(StatusCode::OK, top_text(&body));
    }
    json_response(&body)
}

/// The domains asked for: one, or every configured one.
fn top_domains(a: &Admin, domain: Option<&String>) -> Vec<String> {
    match domain.filter(|d| !d.is_empty()) {
        Some(d) => vec![d.clone()],
        None => a
            .rules
            .load_full()
            .domains()
            .map(|d| d.name().to_owned())
            .collect(),
    }
}

/// The top denied keys of `domains` as JSON.
pub(super) fn top_json(a: &Admin, domains: &[String], window: Window, n: usize) -> Value {
    let sketch = a.metrics.top_denied();
    let domains: Vec<Value> = domains
        .iter()
        .map(|d| {
            let top = sketch.top(d, window, n);
            let keys: Vec<Value> = top
                .keys
                .iter()
                .map(|h| json!({ "key": h.key, "rule": h.rule, "denied": h.denied }))
                .collect();
            json!({
                "domain": d,
                "total_denied": top.total,
                "error_bound": top.error_bound,
                "keys": keys,
            })
        })
        .collect();
    let sketch_state = json!({
        "counters_held": sketch.counters_held(),
        "domains": sketch.domains().len(),
        "max_counters_per_domain": crate::metrics::top::TopDenied::max_counters(),
        "dropped": sketch.dropped(),
    });
    json!({ "window": window.as_str(), "domains": domains, "sketch": sketch_state })
}

fn top_text(body: &Value) -> String {
    let mut out = String::new();
    let window = body.get("window").map(plain).unwrap_or_default();
    for d in body
        .get("domains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = |k: &str| d.get(k).map(plain).unwrap_or_default();
        let _ = writeln!(
            out,
            "# {}: last {window}, {} denied, counts within +-{}",
            f("domain"),
            f("total_denied"),
            f("error_bound")
        );
        for k in d
            .get("keys")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let g = |f: &str| k.get(f).map(plain).unwrap_or_default();
            let _ = writeln!(out, "{:>10}  {}  rule={}", g("denied"), g("key"), g("rule"));
        }
    }
    out
}

/// Text when asked with `?format=text` or by an `Accept` preferring `text/plain`.
fn wants_text(q: &HashMap<String, String>, headers: &HeaderMap) -> bool {
    if let Some(f) = q.get("format") {
        return f == "text";
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    accept.is_some_and(|a| a.starts_with("text/plain"))
}

pub(super) fn json_response(body: &Value) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_string(),
    )
        .into_response()
}
