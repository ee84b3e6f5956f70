//! limitador's HTTP API on the admin port, over the limitador-format namespaces:
//!
//! | route | answer |
//! |---|---|
//! | `POST /check` | 200 (`null`) when `delta` fits in every applicable limit, else 429; nothing counted |
//! | `POST /report` | counts `delta` on every applicable limit; 200 (`null`) |
//! | `POST /check_and_report` | 200 and counted, or 429 and nothing counted (all or nothing) |
//! | `GET /limits/{namespace}` | the namespace's limits, as limitador lists them |
//! | `GET /counters/{namespace}` | the namespace's live counters, as limitador lists them (behind `admin.token`: it reveals keys) |
//! | `GET /status` | 200 and the active rules' version |
//!
//! A body is limitador's `CheckAndReportInfo` (`namespace`, `values`: one descriptor's entries,
//! `delta`, `response_headers`); one that cannot be read is a 400 naming why; a backend
//! failure is a 500. `/check_and_report` with `response_headers: "DraftVersion03"` answers
//! limitador's `X-RateLimit-Limit`, `-Remaining` and `-Reset` headers; it alone is counted by
//! limitador's metrics, as in limitador.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::Admin;
use crate::config::limitador::NamespaceLimit;
use crate::config::limitador::cel::Expr;
use crate::engine::limitador::{Asked, Counting};
use crate::engine::{Code, Descriptor, Request};
use crate::limiter::LimitParams;
use crate::limiter::counters::{CounterQuery, Resolved};
use crate::rules::limitador::{Compiled, Namespace};
use crate::rules::{Entry, key};

/// Most counters `/counters/{namespace}` lists (the first ones the backend lists).
const MAX_COUNTERS: usize = 10_000;

/// limitador's `CheckAndReportInfo`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckAndReportInfo {
    namespace: String,
    values: BTreeMap<String, String>,
    delta: u64,
    /// `none` or `DraftVersion03` (`/check_and_report` then answers the rate-limit headers).
    #[serde(default)]
    response_headers: Option<String>,
}

/// limitador's `Counter`, as `/counters/{namespace}` lists it.
#[derive(Debug, Serialize)]
struct CounterView {
    limit: LimitView,
    set_variables: BTreeMap<String, String>,
    remaining: u64,
    expires_in_seconds: u64,
}

/// limitador's `Limit`, as `/limits/{namespace}` lists it.
#[derive(Debug, Serialize)]
struct LimitView {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    namespace: String,
    max_value: u64,
    seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    conditions: Vec<String>,
    variables: Vec<String>,
}

pub(super) async fn check(State(a): State<Admin>, body: Bytes) -> Response {
    decide(&a, body, Counting::CheckOnly).await
}

pub(super) async fn report(State(a): State<Admin>, body: Bytes) -> Response {
    decide(&a, body, Counting::CountOnly).await
}

pub(super) async fn check_and_report(State(a): State<Admin>, body: Bytes) -> Response {
    decide(&a, body, Counting::CheckAndCount).await
}

async fn decide(a: &Admin, body: Bytes, counting: Counting) -> Response {
    let info: CheckAndReportInfo = match serde_json::from_slice(&body) {
        Ok(info) => info,
        Err(e) => {
            let message = format!("invalid CheckAndReportInfo: {e}");
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    let headers = match info.response_headers.as_deref() {
        None | Some("none") => false,
        Some("DraftVersion03") => true,
        Some(other) => {
            let message = format!(
                "invalid CheckAndReportInfo: response_headers must be \"none\" or \"DraftVersion03\", got {other:?}"
            );
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    // As limitador: only /check_and_report counts in its metrics and answers headers.
    let asked = Asked {
        observe: counting == Counting::CheckAndCount,
        headers: headers && counting == Counting::CheckAndCount,
    };
    let Ok(hits_addend) = u32::try_from(info.delta) else {
        let message = format!("delta must be at most {}, got {}", u32::MAX, info.delta);
        return (StatusCode::BAD_REQUEST, message).into_response();
    };
    let request = Request {
        domain: info.namespace,
        descriptors: vec![Descriptor {
            entries: info
                .values
                .into_iter()
                .map(|(k, v)| Entry::new(k, v))
                .collect(),
            ..Descriptor::default()
        }],
        hits_addend,
    };
    match a
        .engine
        .decide_limitador_as(&request, counting, asked)
        .await
    {
        Ok(answer) => {
            let status = if answer.code == Code::OverLimit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let mut response = json(status, "null".to_owned());
            for (name, value) in answer.headers {
                let (Ok(name), Ok(value)) = (
                    header::HeaderName::try_from(name),
                    header::HeaderValue::try_from(value),
                ) else {
                    continue;
                };
                response.headers_mut().insert(name, value);
            }
            response
        }
        Err(crate::engine::EngineError::InvalidArgument(m)) => {
            (StatusCode::BAD_REQUEST, m).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "limitador API: backend failure");
            json(StatusCode::INTERNAL_SERVER_ERROR, "null".to_owned())
        }
    }
}

pub(super) async fn limits(State(a): State<Admin>, Path(namespace): Path<String>) -> Response {
    let rules = a.rules.load_full();
    let views: Vec<LimitView> = rules
        .namespaces()
        .get(&namespace)
        .map(|ns| ns.limits().iter().map(|c| limit_view(&c.limit)).collect())
        .unwrap_or_default();
    json(
        StatusCode::OK,
        serde_json::to_string(&views).unwrap_or_default(),
    )
}

fn limit_view(l: &NamespaceLimit) -> LimitView {
    let sources = |exprs: &[Expr]| exprs.iter().map(|e| e.source().to_owned()).collect();
    LimitView {
        id: l.id.clone(),
        namespace: l.namespace.clone(),
        max_value: u64::from(l.max_value),
        seconds: u64::from(l.seconds.get()),
        name: l.name.clone(),
        conditions: sources(&l.conditions),
        variables: sources(&l.variables),
    }
}

/// `GET /counters/{namespace}`: every counter of the namespace's active limits that was hit
/// in its current window, with what is left and the whole seconds until it resets (at most
/// [`MAX_COUNTERS`]); `[]` for a namespace without limits. A key of a limit since removed or
/// changed is not listed. 503 when the backend cannot be read.
pub(super) async fn counters(State(a): State<Admin>, Path(namespace): Path<String>) -> Response {
    let rules = a.rules.load_full();
    let Some(ns) = rules.namespaces().get(&namespace) else {
        return json(StatusCode::OK, "[]".to_owned());
    };
    let mut prefix = String::from("{");
    key::escape_into(&mut prefix, &namespace);
    prefix.push_str("|limit=");
    let resolve = |raw: &[u8]| match limit_of(ns, raw) {
        Some((c, _)) => Resolved::Limit(LimitParams::from_rule(&c.rule)),
        None => Resolved::Skip,
    };
    let mut views = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = CounterQuery {
            prefix: prefix.as_bytes(),
            cursor: cursor.as_deref(),
            count: 1000,
            resolve: &resolve,
        };
        let page = match a.engine.limiter().counters(&query).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(error = %e, "limitador API: cannot list counters");
                return json(StatusCode::SERVICE_UNAVAILABLE, "null".to_owned());
            }
        };
        for e in &page.entries {
            let (Some((c, set_variables)), Some(state)) = (limit_of(ns, &e.key), e.state) else {
                continue;
            };
            if state.admitted && state.remaining >= u64::from(c.rule.burst) {
                // Nothing used in the current window: limitador has no such counter.
                continue;
            }
            views.push(CounterView {
                limit: limit_view(&c.limit),
                set_variables,
                remaining: state.remaining,
                expires_in_seconds: state.reset_nanos / 1_000_000_000,
            });
        }
        cursor = page.next;
        if cursor.is_none() || views.len() >= MAX_COUNTERS {
            break;
        }
    }
    views.truncate(MAX_COUNTERS);
    json(
        StatusCode::OK,
        serde_json::to_string(&views).unwrap_or_default(),
    )
}

/// The limit of `ns` a state key counts for, and its variables' values by source.
fn limit_of<'a>(ns: &'a Namespace, raw: &[u8]) -> Option<(&'a Compiled, BTreeMap<String, String>)> {
    let decoded = key::decode(raw).ok()?;
    let (first, rest) = decoded.levels.split_first()?;
    if decoded.domain != ns.name() || first.key != "limit" || first.shared {
        return None;
    }
    let c = ns.limits().iter().find(|c| {
        c.key_id() == first.value
            && c.rule.algorithm == decoded.algorithm
            && c.rule.period_nanos() == decoded.period_nanos
    })?;
    let values = rest
        .iter()
        .map(|l| (l.key.clone(), l.value.clone()))
        .collect();
    Some((c, values))
}

pub(super) async fn status(State(a): State<Admin>) -> Response {
    let version = a.rules.status().version;
    json(
        StatusCode::OK,
        serde_json::json!({ "config_version": version }).to_string(),
    )
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
