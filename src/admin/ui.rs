//! `GET /ui`: a live page for people, and `GET /ui/data`, the JSON it polls every 2 seconds.
//! The page (HTML, CSS and its small script, all in `ui/`) is built into the binary: no CDN,
//! nothing to build. It shows the rules (tree, limits, algorithm), each limited rule's
//! requests/s, denied/s and near-limit/s over the last minutes (inline SVG charts), the holds
//! in flight of `concurrency` rules (the most of any key since the last poll), the keys
//! denied most in the last minute, the backend's health, the rules version and the last
//! failed reload.

use std::sync::OnceLock;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Admin;
use super::counters::{json_response, top_json};
use crate::config::model::{Policy, ValueMatch};
use crate::metrics::live::{LiveRule, LiveRules};
use crate::metrics::top::Window;
use crate::rules::Rule;

const HTML: &str = include_str!("ui/index.html");
const CSS: &str = include_str!("ui/style.css");
const JS: &str = include_str!("ui/app.js");

/// Keys shown per domain.
const TOP_KEYS: usize = 10;

/// `GET /ui`: the page, its style and script inlined.
pub(super) async fn page() -> Response {
    static PAGE: OnceLock<String> = OnceLock::new();
    let page = PAGE.get_or_init(|| HTML.replace("/*STYLE*/", CSS).replace("/*SCRIPT*/", JS));
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
            ),
        ],
        page.as_str(),
    )
        .into_response()
}

/// `GET /ui/data`: everything the page shows.
pub(super) async fn data(State(a): State<Admin>) -> Response {
    let rules = a.rules.load_full();
    let status = a.rules.status();
    let (times, series) = a.metrics.history().read();
    let domains: Vec<String> = rules.domains().map(|d| d.name().to_owned()).collect();
    let tree: Vec<Value> = rules
        .domains()
        .map(|d| json!({ "domain": d.name(), "rules": d.rules().iter().map(|r| rule(r, a.metrics.live())).collect::<Vec<_>>() }))
        .collect();
    let backend = a.engine.limiter().status();
    let last_error = status.last_failure.and(a.metrics.last_reload_error());
    json_response(&json!({
        "version": status.version,
        "loaded_at": unix(status.loaded_at),
        "last_reload_error": last_error.map(|(at, text)| json!({ "at": unix(at), "errors": text })),
        "backend": {
            "name": a.engine.backend_name(),
            "reachable": backend.reachable.as_ref().map(Result::is_ok),
            "error": backend.reachable.and_then(Result::err),
            "breaker_open": backend.breaker_open,
            "deny_cache": backend.deny_cache,
            "keys_held": backend.keys_held,
        },
        "rules": tree,
        "series": {
            "every_seconds": crate::metrics::history::EVERY.as_secs(),
            "kept": crate::metrics::history::KEPT,
            "times": times,
            "rules": series,
        },
        "top": top_json(&a, &domains, Window::Minute, TOP_KEYS),
    }))
}

/// One rule and its children, for the tree.
fn rule(r: &Rule, live: &LiveRules) -> Value {
    let value = match &r.value {
        ValueMatch::Any => None,
        ValueMatch::Exact(v) | ValueMatch::Wildcard(v) => Some(v.clone()),
    };
    let limits: Vec<Value> = match &r.policy {
        Policy::Limited(limits) => limits
            .iter()
            .map(|l| {
                json!({
                    "requests_per_unit": l.requests_per_unit,
                    "unit": l.unit.as_str(),
                    "unit_multiplier": l.unit_multiplier.get(),
                    "period_seconds": l.period_nanos() / 1_000_000_000,
                    "algorithm": l.algorithm.as_str(),
                    "burst": l.burst,
                    "charge": l.charge.as_str(),
                    "name": l.name,
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    // A `concurrency` rule: the most holds of any of its keys since the page last asked.
    let holds =
        crate::metrics::live::holds_only(r).then(|| live.of(r).map_or(0, LiveRule::take_holds));
    json!({
        "key": r.key,
        "value": value,
        "holds": holds,
        "segment": crate::rules::naming::segment(r),
        "unlimited": matches!(r.policy, Policy::Unlimited { .. }),
        "shadow_mode": r.shadow_mode,
        "limits": limits,
        "children": r.children().iter().map(|c| rule(c, live)).collect::<Vec<_>>(),
    })
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
