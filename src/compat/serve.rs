//! The drop-in listeners: envoyproxy/ratelimit's Prometheus series (`[ratelimit_metrics]`)
//! and its debug port (`[debug]`: `/rlconfig`, `/stats`).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::prometheus;
use super::stats::{RULE_STATS, RatelimitStats, SERVICE_STATS};
use crate::reload::ActiveRules;

/// Serves the series on `path` until `stop`.
pub async fn metrics(
    listener: TcpListener,
    path: String,
    stats: Arc<RatelimitStats>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route(
            &path,
            get(|State(stats): State<Arc<RatelimitStats>>| async move {
                (
                    [(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)],
                    prometheus::render(&stats),
                )
                    .into_response()
            }),
        )
        .with_state(stats);
    axum::serve(listener, router)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

#[derive(Clone)]
struct Debug {
    rules: Arc<ActiveRules>,
    stats: Option<Arc<RatelimitStats>>,
}

const DEBUG_INDEX: &str = "\
/rlconfig: the active rules
/stats: envoyproxy/ratelimit's counters, one `name: value` a line
";

/// Serves the debug endpoints until `stop`.
pub async fn debug(
    listener: TcpListener,
    rules: Arc<ActiveRules>,
    stats: Option<Arc<RatelimitStats>>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/", get(|| async { DEBUG_INDEX }))
        .route(
            "/rlconfig",
            get(|State(d): State<Debug>| async move { crate::admin::rlconfig_text(&d.rules) }),
        )
        .route(
            "/stats",
            get(|State(d): State<Debug>| async move { stats_text(d.stats.as_deref()) }),
        )
        .with_state(Debug { rules, stats });
    axum::serve(listener, router)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
}

fn stats_text(stats: Option<&RatelimitStats>) -> String {
    let Some(stats) = stats else {
        return String::new();
    };
    let mut out = String::new();
    for (name, n) in SERVICE_STATS.iter().zip(stats.service()) {
        out.push_str(&format!("{name}: {n}\n"));
    }
    for (key, counts) in stats.rules() {
        for (stat, n) in RULE_STATS.iter().zip(counts) {
            out.push_str(&format!("ratelimit.service.rate_limit.{key}.{stat}: {n}\n"));
        }
    }
    out
}
