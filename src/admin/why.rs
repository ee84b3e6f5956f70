//! `POST /why` (explain a request, charging nothing) and `POST /counters/reset` (forget the
//! state of a request's keys, or of every key of one rule). Both take the proto3-JSON
//! `RateLimitRequest` of `/json`; the reset also takes `{"rule": "<name>"}`, the rule named
//! as `/rlconfig` names it (`<domain>.<segment>...`). docs/operating.md shows the answers.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::counters::{Filter, json_response, resolve};
use super::{Admin, text};
use crate::config::model::{Algorithm, LimitRule};
use crate::engine::{DescriptorWhy, EngineError, Explanation, LimitWhy, Matched};
use crate::limiter::counters::CounterQuery;
use crate::limiter::{HitOutcome, LimiterError, Role, StateKey};
use crate::metrics::top::Window;
use crate::rules::key;

/// The most keys one rule reset forgets (its walk stops there and says so).
const MAX_RULE_KEYS: usize = 100_000;
/// Keys asked per page while walking a rule's keys.
const PAGE: usize = 1000;

/// `POST /why`.
pub(super) async fn why(State(a): State<Admin>, body: Bytes) -> Response {
    let request = match engine_request(&body) {
        Ok(r) => r,
        Err(response) => return *response,
    };
    let why = match a.engine.explain(&request).await {
        Ok(why) => why,
        Err(e) => return engine_error(&e),
    };
    // The penalty boxes of the limits that have one, read without changing anything.
    let boxed: Vec<&[u8]> = why
        .descriptors
        .iter()
        .flat_map(|d| &d.limits)
        .filter(|l| l.rule.block_nanos > 0)
        .map(|l| &l.key[..])
        .collect();
    let blocked = match a.engine.limiter().blocked(&boxed).await {
        Ok(left) => boxed
            .iter()
            .zip(left)
            .map(|(k, b)| (k.to_vec(), b))
            .collect(),
        Err(e) => return engine_error(&EngineError::Backend(e)),
    };
    // This region's share of each global limit.
    let global: Vec<&[u8]> = why
        .descriptors
        .iter()
        .flat_map(|d| &d.limits)
        .filter(|l| l.rule.global)
        .map(|l| &l.key[..])
        .collect();
    let shares: Shares = match a.engine.limiter().shares(&global).await {
        Ok(found) => global
            .iter()
            .zip(found)
            .filter_map(|(k, s)| Some((k.to_vec(), s?)))
            .collect(),
        Err(e) => return engine_error(&EngineError::Backend(e)),
    };
    let mut answer = why_json(&a, &request.domain, &why, &blocked);
    add_shares(&mut answer, &shares);
    json_response(&answer)
}

/// Per global state key, this region's share.
type Shares = std::collections::HashMap<Vec<u8>, crate::limiter::counters::ShareView>;

/// Adds `region_share` (and `scope: global`) to each global limit's `state` in a `/why`
/// answer: its `remaining` and `reset_seconds` are the home Redis's.
fn add_shares(answer: &mut Value, shares: &Shares) {
    if shares.is_empty() {
        return;
    }
    let Some(descriptors) = answer.get_mut("descriptors").and_then(Value::as_array_mut) else {
        return;
    };
    for d in descriptors {
        let Some(limits) = d.get_mut("limits").and_then(Value::as_array_mut) else {
            continue;
        };
        for l in limits {
            let key = l
                .get("key")
                .and_then(Value::as_str)
                .map(|k| k.as_bytes().to_vec());
            if let Some(share) = key.and_then(|k| shares.get(&k)) {
                l["scope"] = json!("global");
                l["state"]["region_share"] = super::counters::share_json(share);
            }
        }
    }
}

/// Per state key with a penalty box, the nanoseconds left in it (`None`: not in one).
type Blocked = std::collections::HashMap<Vec<u8>, Option<u64>>;

/// The request of `/json`'s proto3-JSON body, in the engine's terms; a 400 when it is not one.
fn engine_request(body: &Bytes) -> Result<crate::engine::Request, Box<Response>> {
    let request = crate::wire::json::request(body).map_err(|e| {
        Box::new(text(
            StatusCode::BAD_REQUEST,
            format!("invalid JSON: {e}\n"),
        ))
    })?;
    crate::wire::from_proto(request).map_err(|e| Box::new(engine_error(&e)))
}

/// The answer of `/why`.
fn why_json(a: &Admin, domain: &str, why: &Explanation, blocked: &Blocked) -> Value {
    let proto = crate::wire::to_proto(why.response.clone());
    let descriptors: Vec<Value> = why
        .descriptors
        .iter()
        .map(|d| descriptor_json(a, domain, d, blocked))
        .collect();
    json!({
        "domain": domain,
        "domain_known": why.domain_known,
        "backend": a.engine.backend_name(),
        "charged": false,
        "overall_code": if why.response.overall_code == crate::engine::Code::Ok { "OK" } else { "OVER_LIMIT" },
        "response": crate::wire::json::response(&proto),
        "descriptors": descriptors,
    })
}

fn descriptor_json(a: &Admin, domain: &str, d: &DescriptorWhy, blocked: &Blocked) -> Value {
    let entries: Vec<Value> = d
        .entries
        .iter()
        .map(|e| json!({ "key": e.key, "value": e.value }))
        .collect();
    let matched = match &d.matched {
        Matched::UnknownDomain => json!({
            "code": "unknown_domain",
            "reason": format!("the rules have no domain {domain:?}"),
            "rule": null,
        }),
        Matched::Override => json!({
            "code": "override",
            "reason": "the descriptor carries its own limit (a client override), used instead of the rules",
            "rule": null,
        }),
        Matched::Walked { code, reason, rule } => json!({
            "code": code,
            "reason": reason,
            "rule": rule.as_ref().map(|r| json!({
                "name": r.name,
                "location": r.location,
                "shadow_mode": r.shadow_mode,
                "quota_mode": r.quota_mode,
                "unlimited": r.unlimited,
            })),
        }),
    };
    let limits: Vec<Value> = d
        .limits
        .iter()
        .map(|l| {
            let blocked = blocked.get(&l.key[..]).copied().flatten();
            limit_json(
                l,
                d.client_override.is_some() && matches!(d.matched, Matched::Override),
                blocked,
            )
        })
        .collect();
    let top = a.metrics.top_denied();
    let denied = |w| {
        let (count, bound) = top.denied(domain, &d.entries, w);
        json!({ "cost": count, "error_bound": bound })
    };
    json!({
        "entries": entries,
        "match": matched,
        "override": d.client_override.map(|o| json!({
            "requests_per_unit": o.requests_per_unit,
            "unit": o.unit.as_str(),
        })),
        "applies": d.applies,
        "mode": d.role.map(role_str),
        "shadow": d.role.is_some_and(Role::is_shadow) || a.engine.shadow_mode(),
        "cost": d.cost,
        "refund": d.refund,
        "limits": limits,
        "denied": {
            "scope": "replica",
            "last_minute": denied(Window::Minute),
            "last_hour": denied(Window::Hour),
        },
    })
}

fn limit_json(l: &LimitWhy, from_override: bool, blocked: Option<u64>) -> Value {
    let r = &l.rule;
    let mut state = state_json(&l.now, r);
    if r.block_nanos > 0 {
        state["blocked_seconds"] = json!(blocked.map(|n| n as f64 / 1e9));
    }
    json!({
        "name": r.name,
        "algorithm": r.algorithm.as_str(),
        "requests_per_unit": r.requests_per_unit,
        "unit": r.unit.as_str(),
        "unit_multiplier": r.unit_multiplier.get(),
        "period_seconds": r.period_nanos() as f64 / 1e9,
        "burst": r.burst,
        "charge": r.charge.as_str(),
        "borrow": r.borrow,
        "override": from_override,
        "key": String::from_utf8_lossy(&l.key),
        "block_for_seconds": (r.block_nanos > 0).then(|| r.block_nanos as f64 / 1e9),
        "state": state,
        "verdict": verdict_json(&l.verdict),
    })
}

/// A key's state now (what a check-only request sees). An object, so that what other limits
/// keep (a penalty box's end, concurrency holds) can join it.
/// For a concurrency limit, `holds` is the slots held now (its slots less what is left).
fn state_json(now: &HitOutcome, rule: &LimitRule) -> Value {
    let reset = now.reset_nanos as f64 / 1e9;
    let mut state = json!({
        "remaining": now.remaining,
        "reset_seconds": reset,
        "in_debt": !now.admitted,
        "debt_seconds": if now.admitted { 0.0 } else { reset },
    });
    if rule.algorithm == Algorithm::Concurrency {
        state["holds"] = json!(u64::from(rule.requests_per_unit).saturating_sub(now.remaining));
    }
    state
}

fn verdict_json(v: &HitOutcome) -> Value {
    json!({
        "admitted": v.admitted,
        "remaining": v.remaining,
        "reset_seconds": v.reset_nanos as f64 / 1e9,
    })
}

fn role_str(role: Role) -> &'static str {
    match role {
        Role::Enforced => "enforced",
        Role::Shadow => "shadow",
        Role::Quota => "quota",
        Role::QuotaShadow => "quota_shadow",
    }
}

/// The rule form of a reset.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleReset {
    rule: String,
}

/// `POST /counters/reset`.
pub(super) async fn reset(State(a): State<Admin>, body: Bytes) -> Response {
    let is_rule = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.as_object().map(|o| o.contains_key("rule")))
        .unwrap_or(false);
    let (form, what, keys) = if is_rule {
        let asked: RuleReset = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}\n")),
        };
        match rule_keys(&a, &asked.rule).await {
            Ok(keys) => ("rule", asked.rule, keys),
            Err(response) => return response,
        }
    } else {
        let request = match engine_request(&body) {
            Ok(r) => r,
            Err(response) => return *response,
        };
        match a.engine.state_keys(&request) {
            Ok(keys) => ("key", request.domain.clone(), keys),
            Err(e) => return engine_error(&e),
        }
    };
    let held = match a.engine.limiter().reset(&keys).await {
        Ok(held) => held,
        Err(e) => return limiter_error(&e),
    };
    let names: Vec<String> = keys
        .iter()
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .collect();
    tracing::info!(
        form,
        what = %what,
        keys = ?names,
        held,
        backend = a.engine.backend_name(),
        "counters reset"
    );
    a.metrics.reset(form, held);
    json_response(&json!({
        "form": form,
        "reset": names,
        "held": held,
        "backend": a.engine.backend_name(),
    }))
}

/// Every key the backend holds of the rule `name` (`<domain>.<path>`).
async fn rule_keys(a: &Admin, name: &str) -> Result<Vec<StateKey>, Response> {
    let rules = a.rules.load_full();
    let found = rules.domains().find_map(|d| {
        let path = name.strip_prefix(d.name())?.strip_prefix('.')?;
        Some((d.name().to_owned(), path.to_owned()))
    });
    let Some((domain, path)) = found.filter(|(d, p)| rule_exists(&rules, d, p)) else {
        return Err(text(
            StatusCode::BAD_REQUEST,
            format!("no rule with limits named {name:?} (names as in /rlconfig)\n"),
        ));
    };
    let filter = Arc::new(Filter {
        domain: Some(domain.clone()),
        rule: Some(path),
    });
    let mut prefix = String::from("{");
    key::escape_into(&mut prefix, &domain);
    let resolve = {
        let (rules, filter) = (rules.clone(), filter.clone());
        move |key: &[u8]| resolve(&rules, &filter, key)
    };
    let mut keys = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = CounterQuery {
            prefix: prefix.as_bytes(),
            cursor: cursor.as_deref(),
            count: PAGE,
            resolve: &resolve,
        };
        let page = a
            .engine
            .limiter()
            .counters(&query)
            .await
            .map_err(|e| limiter_error(&e))?;
        for entry in page.entries {
            let Some(limit) = entry.limit else { continue };
            if seen.insert(entry.key.clone()) {
                keys.push((Arc::from(entry.key), limit.algorithm));
            }
        }
        cursor = page.next;
        if cursor.is_none() || keys.len() >= MAX_RULE_KEYS {
            return Ok(keys);
        }
    }
}

/// Whether `domain` has a rule at `path` (segments joined by `.`) with limits.
fn rule_exists(rules: &crate::rules::RuleSet, domain: &str, path: &str) -> bool {
    fn walk(rules: &[crate::rules::Rule], prefix: &str, path: &str) -> bool {
        rules.iter().any(|r| {
            let here = if prefix.is_empty() {
                crate::rules::naming::segment(r)
            } else {
                format!("{prefix}.{}", crate::rules::naming::segment(r))
            };
            let limited = matches!(r.policy, crate::config::model::Policy::Limited(_));
            (here == path && limited) || walk(r.children(), &here, path)
        })
    }
    rules
        .domain(domain)
        .is_some_and(|d| walk(d.rules(), "", path))
}

fn engine_error(e: &EngineError) -> Response {
    match e {
        EngineError::InvalidArgument(m) => {
            text(StatusCode::BAD_REQUEST, format!("invalid request: {m}\n"))
        }
        EngineError::Backend(e) => limiter_error(e),
    }
}

fn limiter_error(e: &LimiterError) -> Response {
    if e.transient {
        text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"))
    } else {
        text(StatusCode::BAD_REQUEST, format!("{e}\n"))
    }
}
