//! The service of the example (also served by the tests of the real binary, in
//! tests/serial/throttle_client.rs): `GET /work` behind the layer, limited per tenant.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use sluice_client::{Client, Limit, Throttle, ThrottleLayer};

/// The service: `GET /work` behind the layer.
pub(crate) fn app(client: Client, limit: Limit) -> Router {
    let layer = ThrottleLayer::new(client, move |req: &axum::http::Request<Body>| {
        let tenant = req
            .headers()
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("anonymous");
        Some(Throttle::key(format!("work:{tenant}"), limit).name("axum_example"))
    });
    Router::new()
        .route("/work", get(|| async { "done\n" }))
        .layer(layer)
}

/// A capacity of `capacity` per `period`: bursts of all of it, refilled evenly.
pub(crate) fn limit(capacity: u32, period: Duration) -> Limit {
    Limit::per(capacity, period).max_burst(capacity.saturating_sub(1))
}
