//! Who may call the admin endpoints that reveal or change limiter state: `/why`,
//! `/counters*` (the reset included), `/ui*`, limitador's `/counters/{namespace}`, and the
//! decision endpoints `/json`, `/check`, `/report` and `/check_and_report` (unless
//! `admin.open_decisions`), and `/metrics` with `admin.token_metrics`.
//!
//! - With a token (`admin.token` or `admin.token_file`), a request passes with
//!   `Authorization: Bearer <token>`; the page itself (`GET /ui`) also with `?token=<token>`,
//!   which its script then moves to the tab's `sessionStorage` and takes out of the address bar
//!   (every later call uses the header). Anything else gets `401` and a body that is the same
//!   whatever was asked and whatever was wrong (for `/ui`: a small form asking for the token).
//!   Tokens are compared in constant time (in their contents).
//! - Without a token, these endpoints answer only when the admin port listens on a loopback
//!   address (`127.0.0.0/8`, `::1`): there only processes on the same host reach them. On any
//!   other address (`0.0.0.0` in a container) they answer `403`, with a body that names the
//!   settings that open them. Secure by default: a port opened to the network without a token
//!   never lets anyone reset or read every key.
//!
//! Health, readiness, `/rlconfig`, limitador's `/limits/{namespace}` and `/status`, and
//! `/metrics` (without `admin.token_metrics`) are always open.

use std::net::SocketAddr;
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
    /// The decision endpoints (`/json`, `/check`, `/report`, `/check_and_report`) answer
    /// everyone, as the gRPC port does (`admin.open_decisions`).
    pub open_decisions: bool,
    /// Where the admin port listens; none (not known yet): not on loopback.
    listen: Option<SocketAddr>,
}

/// The page answered to a `GET /ui` without a valid token: asks for it, reveals nothing.
const LOGIN: &str = include_str!("ui/login.html");

/// The decision endpoints: the limiter's own door, the same as the gRPC port's.
pub const DECISIONS: [&str; 4] = ["/json", "/check", "/report", "/check_and_report"];

impl Access {
    /// `token`: none guards the endpoints by the admin port's address alone (see
    /// [`Access::listening_on`]).
    pub fn new(token: Option<String>, metrics: bool, open_decisions: bool) -> Access {
        Access {
            token: token.map(Arc::from),
            metrics,
            open_decisions,
            listen: None,
        }
    }

    /// The same, for an admin port listening on `addr`.
    #[must_use]
    pub fn listening_on(mut self, addr: SocketAddr) -> Access {
        self.listen = Some(addr);
        self
    }

    /// Whether a token is required.
    pub fn guarded(&self) -> bool {
        self.token.is_some()
    }

    /// Whether the admin port listens on a loopback address only.
    pub fn loopback(&self) -> bool {
        self.listen
            .is_some_and(|a| a.ip().to_canonical().is_loopback())
    }

    /// Without a token and beyond loopback, the guarded endpoints are refused: what to log
    /// at start, if so.
    pub fn refusal_notice(&self) -> Option<String> {
        if self.token.is_some() || self.loopback() {
            return None;
        }
        let listen = self.listen.map(|a| a.to_string()).unwrap_or_default();
        let decisions = if self.open_decisions {
            "; the decision endpoints stay open (admin.open_decisions)"
        } else {
            ", and the decision endpoints /json, /check, /report and /check_and_report"
        };
        Some(format!(
            "admin port on {listen} without admin.token: /why, /counters*, /ui{decisions} \
             answer 403 (set admin.token_file or admin.token, see docs/security.md)"
        ))
    }

    /// Whether `request` carries the token, or, without one, the port is loopback's.
    fn allows(&self, request: &Request) -> bool {
        let Some(token) = &self.token else {
            return self.loopback();
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

    /// The `403` body: what was refused, why, and the settings that open it.
    fn forbidden(&self, path: &str) -> String {
        let listen = self
            .listen
            .map_or_else(|| "an address".to_owned(), |a| a.to_string());
        let mut text = format!(
            "403 forbidden: {path} reveals or changes limiter state, and the admin port listens \
             on {listen}, beyond loopback, with no admin token.\n\
             To call it: set admin.token_file (SLUICE_ADMIN__TOKEN_FILE, a file holding the \
             token) or admin.token (SLUICE_ADMIN__TOKEN), and send \
             `Authorization: Bearer <token>`; or listen on loopback only \
             (server.admin_listen = \"127.0.0.1:8080\").\n"
        );
        if DECISIONS.contains(&path) {
            text.push_str(
                "The decision endpoints (/json, /check, /report, /check_and_report) can also \
                 be opened to every caller, as the gRPC port is, with admin.open_decisions = \
                 true (SLUICE_ADMIN__OPEN_DECISIONS).\n",
            );
        }
        text.push_str("See docs/security.md.\n");
        text
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

/// The middleware: passes the request on, or answers 401 (a token is set, and the request
/// does not carry it) or 403 (no token, and the port is not loopback's).
pub async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    if access.allows(&request) {
        return next.run(request).await;
    }
    if access.token.is_none() {
        let body = access.forbidden(request.uri().path());
        let mut response = (StatusCode::FORBIDDEN, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return response;
    }
    let page = request.uri().path() == "/ui";
    let (content_type, body) = if page {
        ("text/html; charset=utf-8", LOGIN)
    } else {
        (
            "text/plain; charset=utf-8",
            "401 unauthorized: this endpoint needs the admin token (admin.token or \
             admin.token_file): send `Authorization: Bearer <token>`\n",
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

    fn at(addr: &str) -> SocketAddr {
        addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"))
    }

    #[test]
    fn without_a_token_only_a_loopback_port_is_open() {
        for open in [
            "127.0.0.1:8080",
            "127.0.0.2:8080",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
        ] {
            let a = Access::new(None, false, false).listening_on(at(open));
            assert!(a.loopback(), "{open}");
            assert!(a.allows(&request("/counters", None)), "{open}");
            assert_eq!(a.refusal_notice(), None);
        }
        for closed in ["0.0.0.0:8080", "[::]:8080", "10.0.0.5:8080"] {
            let a = Access::new(None, false, false).listening_on(at(closed));
            assert!(!a.loopback(), "{closed}");
            assert!(!a.allows(&request("/counters", None)), "{closed}");
            assert!(
                !a.allows(&request("/counters", Some("Bearer x"))),
                "{closed}"
            );
            let notice = a.refusal_notice().unwrap_or_default();
            assert!(
                notice.contains(closed) && notice.contains("admin.token_file"),
                "{notice}"
            );
        }
        // Not told where it listens: closed.
        assert!(!Access::default().allows(&request("/counters", None)));
        let body = Access::default()
            .listening_on(at("0.0.0.0:8080"))
            .forbidden("/json");
        for fix in [
            "admin.token_file",
            "admin.token ",
            "127.0.0.1:8080",
            "admin.open_decisions",
        ] {
            assert!(body.contains(fix), "{fix}: {body}");
        }
    }

    #[test]
    fn the_token_in_a_header_or_in_the_page_query() {
        let a = Access::new(Some("t0k en".into()), false, false);
        assert!(!a.allows(&request("/counters", None)));
        assert!(!a.allows(&request("/counters", Some("Bearer t0k"))));
        assert!(!a.allows(&request("/counters", Some("Basic t0k en"))));
        assert!(a.allows(&request("/counters", Some("Bearer t0k en"))));
        assert!(a.allows(&request("/ui?token=t0k%20en", None)));
        assert!(a.allows(&request("/ui?x=1&token=t0k+en", None)));
        assert!(!a.allows(&request("/ui/data?token=t0k%20en", None)));
        assert!(!a.allows(&request("/counters?token=t0k%20en", None)));
        // A token is needed on loopback too.
        let local = a.listening_on(at("127.0.0.1:8080"));
        assert!(!local.allows(&request("/counters", None)));
        assert!(local.allows(&request("/counters", Some("Bearer t0k en"))));
    }
}
