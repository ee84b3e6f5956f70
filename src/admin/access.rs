//! The optional bearer token (`admin.token`) in front of the endpoints that reveal keys or
//! decide or reset: `/json`, `/why`, `/counters*`, `/ui*`, and `/metrics` with
//! `admin.token_metrics`.
//!
//! A request passes with `Authorization: Bearer <token>`; the page itself (`GET /ui`) also
//! with `?token=<token>`, which its script then moves to the tab's `sessionStorage` and takes
//! out of the address bar (every later call uses the header). Anything else gets `401` and a
//! body that is the same whatever was asked and whatever was wrong (for `/ui`: a small form
//! asking for the token). Tokens are compared in constant time (in their contents).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq as _;

/// Who may pass.
#[derive(Debug, Clone, Default)]
pub struct Access {
    token: Option<Arc<str>>,
    /// `/metrics` needs the token too.
    pub metrics: bool,
}

/// The page answered to a `GET /ui` without a valid token: asks for it, reveals nothing.
const LOGIN: &str = include_str!("ui/login.html");

impl Access {
    /// `token`: none leaves every endpoint open.
    pub fn new(token: Option<String>, metrics: bool) -> Access {
        Access {
            token: token.map(Arc::from),
            metrics,
        }
    }

    /// Whether a token is required.
    pub fn guarded(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `request` carries the token (or none is required).
    fn allows(&self, request: &Request) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let query = (request.uri().path() == "/ui")
            .then(|| query_token(request.uri().query().unwrap_or_default()))
            .flatten();
        bearer
            .into_iter()
            .chain(query.as_deref())
            .any(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
    }
}

/// The `token` parameter of a query string, percent-decoded.
fn query_token(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let value = pair.strip_prefix("token=")?;
        percent_decode(value)
    })
}

/// The parameters of a query string, percent-decoded (the last of a repeated name wins;
/// undecodable pairs are left out).
pub(super) fn query_pairs(query: Option<&str>) -> std::collections::HashMap<String, String> {
    let pairs = query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty());
    pairs
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((percent_decode(name)?, percent_decode(value)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// The middleware: passes the request on, or answers 401.
pub async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    if access.allows(&request) {
        return next.run(request).await;
    }
    let page = request.uri().path() == "/ui";
    let (content_type, body) = if page {
        ("text/html; charset=utf-8", LOGIN)
    } else {
        (
            "text/plain; charset=utf-8",
            "401 unauthorized: a bearer token is required\n",
        )
    };
    let mut response = (StatusCode::UNAUTHORIZED, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str, auth: Option<&str>) -> Request {
        let mut r = Request::builder().uri(uri);
        if let Some(a) = auth {
            r = r.header(header::AUTHORIZATION, a);
        }
        r.body(axum::body::Body::empty()).unwrap_or_default()
    }

    #[test]
    fn the_token_in_a_header_or_in_the_page_query() {
        let open = Access::default();
        assert!(open.allows(&request("/counters", None)));
        let a = Access::new(Some("t0k en".into()), false);
        assert!(!a.allows(&request("/counters", None)));
        assert!(!a.allows(&request("/counters", Some("Bearer t0k"))));
        assert!(!a.allows(&request("/counters", Some("Basic t0k en"))));
        assert!(a.allows(&request("/counters", Some("Bearer t0k en"))));
        assert!(a.allows(&request("/ui?token=t0k%20en", None)));
        assert!(a.allows(&request("/ui?x=1&token=t0k+en", None)));
        assert!(!a.allows(&request("/ui/data?token=t0k%20en", None)));
        assert!(!a.allows(&request("/counters?token=t0k%20en", None)));
    }
}
