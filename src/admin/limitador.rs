//! limitador's HTTP API on the admin port, over the limitador-format namespaces:
//!
//! | route | answer |
//! |---|---|
//! | `POST /check` | 200 (`null`) when `delta` fits in every applicable limit, else 429; nothing counted |
//! | `POST /report` | counts `delta` on every applicable limit; 200 (`null`) |
//! | `POST /check_and_report` | 200 and counted, or 429 and nothing counted (all or nothing) |
//! | `GET /limits/{namespace}` | the namespace's limits, as limitador lists them |
//! | `GET /status` | 200 and the active rules' version |
//!
//! A body is limitador's `CheckAndReportInfo` (`namespace`, `values`: one descriptor's entries,
//! `delta`); one that cannot be read is a 400 naming why; a backend failure is a 500.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::Admin;
use crate::config::limitador::cel::Expr;
use crate::engine::limitador::Counting;
use crate::engine::{Code, Descriptor, Request};
use crate::rules::Entry;

/// limitador's `CheckAndReportInfo`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckAndReportInfo {
    namespace: String,
    values: BTreeMap<String, String>,
    delta: u64,
    /// `none` or `DraftVersion03`: read, but no headers are answered here.
    #[serde(default)]
    #[allow(dead_code)]
    response_headers: Option<String>,
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

pub async fn check(State(a): State<Admin>, body: Bytes) -> Response {
    decide(&a, body, Counting::CheckOnly).await
}

pub async fn report(State(a): State<Admin>, body: Bytes) -> Response {
    decide(&a, body, Counting::CountOnly).await
}

pub async fn check_and_report(State(a): State<Admin>, body: Bytes) -> Response {
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
    match a.engine.decide_limitador(&request, counting).await {
        Ok(answer) if answer.code == Code::OverLimit => {
            json(StatusCode::TOO_MANY_REQUESTS, "null".to_owned())
        }
        Ok(_) => json(StatusCode::OK, "null".to_owned()),
        Err(crate::engine::EngineError::InvalidArgument(m)) => {
            (StatusCode::BAD_REQUEST, m).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "limitador API: backend failure");
            json(StatusCode::INTERNAL_SERVER_ERROR, "null".to_owned())
        }
    }
}

pub async fn limits(State(a): State<Admin>, Path(namespace): Path<String>) -> Response {
    let rules = a.rules.load_full();
    let sources = |exprs: &[Expr]| exprs.iter().map(|e| e.source().to_owned()).collect();
    let views: Vec<LimitView> = rules
        .namespaces()
        .get(&namespace)
        .map(|ns| {
            ns.limits()
                .iter()
                .map(|c| {
                    let l = &c.limit;
                    LimitView {
                        id: l.id.clone(),
                        namespace: l.namespace.clone(),
                        max_value: u64::from(l.max_value),
                        seconds: u64::from(l.seconds.get()),
                        name: l.name.clone(),
                        conditions: sources(&l.conditions),
                        variables: sources(&l.variables),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    json(
        StatusCode::OK,
        serde_json::to_string(&views).unwrap_or_default(),
    )
}

pub async fn status(State(a): State<Admin>) -> Response {
    let version = a.rules.status().version;
    json(
        StatusCode::OK,
        serde_json::json!({ "config_version": version }).to_string(),
    )
}

fn json(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
