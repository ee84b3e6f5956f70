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

use super::mapper::Mapper;
use super::prometheus;
use super::stats::RatelimitStats;
use crate::reload::ActiveRules;

/// Serves the series on `path`, named by `mapper`, until `stop`.
pub async fn metrics(
    listener: TcpListener,
    path: String,
    stats: Arc<RatelimitStats>,
    mapper: Arc<Mapper>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let router = Router::new()
        .route(
            &path,
            get(
                |State((stats, mapper)): State<(Arc<RatelimitStats>, Arc<Mapper>)>| async move {
                    (
                        [(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)],
                        prometheus::render(&stats, &mapper),
                    )
                        .into_response()
                },
            ),
        )
        .with_state((stats, mapper));
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
            get(|State(d): State<Debug>| async move { d.rules.rlconfig() }),
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
    for (name, n) in stats.counters() {
        out.push_str(&format!("{name}: {n}\n"));
    }
    out.push_str(&format!(
        "sluice.statsd.dropped_lines: {}\n",
        stats.statsd_dropped()
    ));
    out
}
