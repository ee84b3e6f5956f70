//! The admin HTTP server (HTTP/1.1, default `127.0.0.1:8080`).
//!
//! | endpoint | answers |
//! |---|---|
//! | `GET /` | this list |
//! | `GET /healthz` | liveness: 200 `OK` while the process serves at all |
//! | `GET /readyz` | readiness: 200 `ready`, or 503 `not ready: <reason>` (draining, no rules, backend) |
//! | `GET /healthcheck` | the same as `/readyz` (envoyproxy/ratelimit's name for it) |
//! | `GET /metrics` | every metric, OpenMetrics text format |
//! | `GET /rlconfig` | the active rules, one line per limit, with their version and load time |
//! | `GET /counters` | the live state of keys, filtered and paginated (see `counters.rs`) |
//! | `GET /counters/top` | the keys denied most per domain, last minute or hour |
//! | `GET /counters/{namespace}` | limitador's: a namespace's counters (`limitador.rs`, with its other endpoints) |
//! | `GET /ui` | a live page for people; `GET /ui/data` is what it polls |
//! | `POST /why` | the `/json` request in, for each descriptor: the rule it matched or why none did, each limit's state and verdict, the answer `/json` would give now, its denials in the last minute and hour; nothing is charged (see `why.rs`) |
//! | `POST /counters/reset` | the `/json` request (or `{"rule": "<name as in /rlconfig>"}`) in: forgets the state of every limit it matches (every key of the rule), for every replica |
//! | `POST /json` | a proto3-JSON `RateLimitRequest` in, the JSON `RateLimitResponse` out: 200 OK, 429 over the limit; 400 bad JSON or invalid request; 413 body over `input.max_request_bytes`; 503 backend unavailable |
//!
//! `/why`, `/counters*` and `/ui*`, and the decision endpoints `/json`, `/check`, `/report`
//! and `/check_and_report` (unless `admin.open_decisions`), need `admin.token` when one is
//! set, and are refused without one unless the port listens on loopback (see `access.rs`);
//! `/metrics` needs the token with `admin.token_metrics`.
//!
//! The server keeps answering while the service drains (so that probes see `/readyz` fail)
//! and stops once the gRPC server has.

pub mod access;
pub mod ask;
mod counters;
mod limitador;
mod ui;
mod why;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::future::IntoFuture as _;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, EngineError};
use crate::health::Readiness;
use crate::limiter::Limiter;
use crate::metrics::{self, Metrics};
use crate::reload::ActiveRules;
use crate::wire;

/// What the endpoints read.
#[derive(Clone)]
pub struct Admin {
    pub engine: Arc<Engine>,
    pub rules: Arc<ActiveRules>,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    /// The limiter backend, for its metrics (keys held, events).
    pub backend: Arc<dyn Limiter>,
    /// Who may read the guarded endpoints.
    pub access: access::Access,
}

const INDEX: &str = "\
/            this list
/healthz     liveness
/readyz      readiness (rules loaded, backend ready, not draining)
/healthcheck the same as /readyz
/metrics     Prometheus metrics
/rlconfig    the active rules
/json        POST a JSON RateLimitRequest, get the RateLimitResponse
/why         POST a JSON RateLimitRequest, get why it is (or is not) limited; charges nothing
/counters/reset POST a JSON RateLimitRequest, or a rule by name: forget its keys' state
/counters    the live state of keys (?domain= &rule= &prefix= &count= &cursor= &format=text)
/counters/top the keys denied most (?domain= &window=minute|hour &n=)
/ui          a live page
/check /report /check_and_report /limits/{namespace} /counters/{namespace} /status   limitador's HTTP API
";

/// The routes.
pub fn router(admin: Admin) -> Router {
    let max_body = admin.engine.input_limits().max_request_bytes;
    let guard = middleware::from_fn_with_state(admin.access.clone(), access::guard);
    // The decision endpoints: the limiter's door, as the gRPC port is (`access::DECISIONS`).
    let decisions = Router::new()
        .route("/json", post(json).layer(DefaultBodyLimit::max(max_body)))
        // limitador's HTTP API (docs/limitador-compat.md).
        .route("/check", post(limitador::check))
        .route("/report", post(limitador::report))
        .route("/check_and_report", post(limitador::check_and_report));
    let decisions = if admin.access.open_decisions {
        decisions
    } else {
        decisions.layer(guard.clone())
    };
    let guarded = Router::new()
        .route(
            "/why",
            post(why::why).layer(DefaultBodyLimit::max(max_body)),
        )
        .route(
            "/counters/reset",
            post(why::reset).layer(DefaultBodyLimit::max(max_body)),
        )
        .route("/counters", get(counters::counters))
        .route("/counters/top", get(counters::top))
        // limitador's; it reveals keys.
        .route("/counters/{namespace}", get(limitador::counters))
        .route("/ui", get(ui::page))
        .route("/ui/data", get(ui::data));
    let metrics_route = Router::new().route("/metrics", get(metrics));
    let metrics_route = if admin.access.metrics {
        metrics_route.layer(guard.clone())
    } else {
        metrics_route
    };
    Router::new()
        .route("/", get(|| async { INDEX }))
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(readyz))
        .route("/rlconfig", get(rlconfig))
        // limitador's; they reveal the limits (as /rlconfig does) and the rules' version.
        .route("/limits/{namespace}", get(limitador::limits))
        .route("/status", get(limitador::status))
        .merge(decisions)
        .merge(guarded.layer(guard))
        .merge(metrics_route)
        .with_state(admin)
}

/// Serves `admin` on `listener` until `stop`, then finishes the requests in flight.
pub async fn serve(
    listener: TcpListener,
    admin: Admin,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let sampling = sample(admin.clone(), stop.clone());
    let serving =
        axum::serve(listener, router(admin)).with_graceful_shutdown(stop.cancelled_owned());
    let (served, ()) = tokio::join!(serving.into_future(), sampling);
    served
}

/// Samples every rule's rates for the page until `stop`.
async fn sample(admin: Admin, stop: CancellationToken) {
    let mut every = tokio::time::interval(metrics::history::EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => admin.metrics.sample(&admin.rules.load_full()),
        }
    }
}

async fn readyz(State(a): State<Admin>) -> Response {
    let down = nodes_down(&a.backend.nodes());
    match a.readiness.check() {
        Ok(()) => format!("ready\n{down}").into_response(),
        Err(reason) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n{down}"),
        ),
    }
}

/// The line of `/readyz` naming the backend's nodes whose circuit breaker is open (empty
/// when none is): in a Cluster, the service stays ready while another master answers.
fn nodes_down(nodes: &[(String, bool)]) -> String {
    let down: Vec<&str> = (nodes.iter())
        .filter(|(_, open)| *open)
        .map(|(node, _)| node.as_str())
        .collect();
    if down.is_empty() {
        return String::new();
    }
    format!("nodes down (circuit breaker open): {}\n", down.join(", "))
}

async fn metrics(State(a): State<Admin>) -> Response {
    let backend = metrics::BackendReport {
        keys_held: a.backend.held(),
        events: a.backend.events(),
        nodes: a.backend.nodes(),
    };
    a.metrics.refresh_rules(&a.rules.load_full());
    a.metrics
        .refresh(&a.rules.status(), Some((a.backend.name(), &backend)));
    match a.metrics.encode() {
        Ok(body) => match a.metrics.limitador() {
            // limitador's names beside sluice's, in the text format they need.
            Some(l) => {
                let mut text = metrics::limitador::openmetrics_to_text(&body);
                text.push_str(&l.render(&a.backend.status()));
                let content_type = metrics::limitador::CONTENT_TYPE;
                ([(header::CONTENT_TYPE, content_type)], text).into_response()
            }
            None => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response(),
        },
        Err(_) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode metrics\n".into(),
        ),
    }
}

async fn rlconfig(State(a): State<Admin>) -> String {
    a.rules.rlconfig()
}

async fn json(State(a): State<Admin>, body: Bytes) -> Response {
    let request = match wire::json::request(&body) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}\n")),
    };
    match wire::decide(&a.engine, request).await {
        Ok(answer) => {
            let status = if wire::over_limit(&answer) {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let body = wire::json::response(&answer).to_string();
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(EngineError::InvalidArgument(m)) => {
            text(StatusCode::BAD_REQUEST, format!("invalid request: {m}\n"))
        }
        Err(EngineError::Backend(e)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}
