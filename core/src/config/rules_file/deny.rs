//! A limit's `on_deny: {body, content_type, headers}`: the 429 Envoy sends when the limit
//! denies a request, checked at load (sizes bounded, header names tokens, no line breaks).

use std::sync::Arc;

use serde_json::Value;

use super::scalar::{json_map, string};
use super::tree::{Ctx, Fields, mapping};
use crate::config::model::OnDeny;

/// The keys of `on_deny`.
const KEYS: &[&str] = &["body", "content_type", "headers"];

/// Headers Envoy sets or frames itself, which a rule must not set.
const RESERVED: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// The limit's `on_deny`, if any; `None` when it is invalid (the errors are recorded).
pub(super) fn on_deny(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<Option<Arc<OnDeny>>> {
    let Some(f) = fields.get("on_deny") else {
        return Some(None);
    };
    let own = mapping(f.node, &f.path, f.line, KEYS, ctx)?;
    let body = match own.get("body") {
        None => Some(String::new()),
        Some(b) => string(b, ctx).filter(|v| within(v, OnDeny::MAX_BODY, b.line, &b.path, ctx)),
    };
    let content_type = match own.get("content_type") {
        None => Some(None),
        Some(c) => string(c, ctx)
            .filter(|v| value_fits(v, c.line, &c.path, ctx))
            .map(Some),
    };
    let headers = match own.get("headers") {
        None => Some(Vec::new()),
        Some(h) => headers(h, ctx),
    };
    Some(Some(Arc::new(OnDeny {
        body: body?,
        content_type: content_type?,
        headers: headers?,
    })))
}

/// `headers: {name: value, ...}`: names are HTTP tokens, not `content-type` (its own key) nor
/// a framing header; values are strings without line breaks.
fn headers(f: &super::tree::Field<'_>, ctx: &mut Ctx<'_>) -> Option<Vec<(String, String)>> {
    let map = json_map(f, ctx)?;
    if map.len() > OnDeny::MAX_HEADERS {
        let message = format!("at most {} headers", OnDeny::MAX_HEADERS);
        ctx.error(f.line, &f.path, message);
        return None;
    }
    let mut out = Vec::with_capacity(map.len());
    let mut ok = true;
    for (name, value) in map {
        let path = format!("{}.{name}", f.path);
        let lower = name.to_ascii_lowercase();
        let value = match value {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                ctx.error(f.line, &path, "expected a string");
                ok = false;
                continue;
            }
        };
        if !is_token(&name) {
            ctx.error(f.line, &path, "not a valid header name");
            ok = false;
        } else if lower == "content-type" {
            ctx.error(f.line, &path, "set content_type instead");
            ok = false;
        } else if RESERVED.contains(&lower.as_str()) || lower.starts_with(':') {
            ctx.error(f.line, &path, "a header Envoy sets itself");
            ok = false;
        } else if value_fits(&value, f.line, &path, ctx) {
            out.push((lower, value));
            continue;
        } else {
            ok = false;
        }
    }
    ok.then_some(out)
}

/// A header value: at most [`OnDeny::MAX_HEADER_VALUE`] bytes, no line break or NUL.
fn value_fits(value: &str, line: usize, path: &str, ctx: &mut Ctx<'_>) -> bool {
    if !within(value, OnDeny::MAX_HEADER_VALUE, line, path, ctx) {
        return false;
    }
    if value.contains(['\r', '\n', '\0']) {
        ctx.error(line, path, "a header value cannot hold a line break or NUL");
        return false;
    }
    true
}

/// Whether `text` is at most `max` bytes; an error at `line` and `path` when not.
fn within(text: &str, max: usize, line: usize, path: &str, ctx: &mut Ctx<'_>) -> bool {
    let ok = text.len() <= max;
    if !ok {
        ctx.error(line, path, format!("at most {max} bytes"));
    }
    ok
}

/// An HTTP token (RFC 9110): the characters a header name may hold.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
