//! Helpers of the api tests: waiting, for something that happens in the background (a reload, a
//! certificate swap) without a fixed sleep; and the invalid rules fixtures with their errors.

pub mod invalid_rules;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `check` every 20 ms until it holds; fails, naming `what`, after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
