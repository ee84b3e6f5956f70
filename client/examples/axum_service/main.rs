//! An axum service limited per tenant by sluice: each tenant (header `x-tenant`) may call
//! `GET /work` `SLUICE_CAPACITY` times per `SLUICE_PERIOD_MS` (all at once when fresh: the
//! burst is the capacity); over that it gets `429` with `Retry-After`.
//!
//! ```text
//! sluice serve &
//! SLUICE_URL=http://127.0.0.1:8081 cargo run -p sluice-client --example axum_service
//! curl -i -H 'x-tenant: acme' http://127.0.0.1:3000/work
//! ```
//!
//! `SLUICE_FAIL=open|closed` chooses what happens when sluice does not answer within
//! `SLUICE_TIMEOUT_MS` (default closed: 503).

mod service;

use std::time::Duration;

use service::{app, limit};
use sluice_client::{Client, FailPolicy};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = env_or("SLUICE_URL", "http://127.0.0.1:8081");
    let listen = env_or("LISTEN", "127.0.0.1:3000");
    let capacity: u32 = env_or("SLUICE_CAPACITY", "5").parse()?;
    let period = Duration::from_millis(env_or("SLUICE_PERIOD_MS", "60000").parse()?);
    let timeout = Duration::from_millis(env_or("SLUICE_TIMEOUT_MS", "200").parse()?);
    let policy = match env_or("SLUICE_FAIL", "closed").as_str() {
        "open" => FailPolicy::Open,
        _ => FailPolicy::Closed,
    };
    let client = Client::builder(url)
        .timeout(timeout)
        .fail_policy(policy)
        .connect_lazy()?;
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app(client, limit(capacity, period)))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
