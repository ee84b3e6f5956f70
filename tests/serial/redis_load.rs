//! Callers asking a Redis limiter in a loop while Redis changes under them (a Cluster
//! resharding or failing over, a Sentinel failover), their answers tallied per class of keys.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice::limiter::{Batch, BatchOutcome, Limiter, LimiterError, RedisLimiter};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the callers of one class of keys got.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub admitted: u64,
    pub denied: u64,
    /// When each failed request was sent, and its error.
    pub errors: Vec<(Instant, String)>,
    /// When each failed request was answered, in the order of `errors`.
    pub error_ends: Vec<Instant>,
    /// When each request was sent and answered (Redis's answer or an error).
    pub answers: Vec<(Instant, Instant)>,
}

impl Tally {
    fn print(&self, class: &str) {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, e) in &self.errors {
            *kinds.entry(e.as_str()).or_default() += 1;
        }
        eprintln!(
            "{class}: admitted {}, denied {}, errors {} {kinds:?}",
            self.admitted,
            self.denied,
            self.errors.len()
        );
    }
}

/// Callers asking the limiter in a loop until stopped, their answers tallied per class.
pub(crate) struct Load {
    tallies: Arc<Mutex<BTreeMap<&'static str, Tally>>>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
    start: Instant,
}

impl Load {
    pub(crate) fn new() -> Load {
        Load {
            tallies: Arc::default(),
            stop: CancellationToken::new(),
            tasks: tokio::task::JoinSet::new(),
            start: Instant::now(),
        }
    }

    /// `callers` callers of `class`; caller `i` sends `batches[i % len]`.
    pub(crate) fn add(
        &mut self,
        limiter: &Arc<RedisLimiter>,
        class: &'static str,
        callers: usize,
        batches: &[Batch],
    ) {
        for i in 0..callers {
            let batch = batches[i % batches.len()].clone();
            let (limiter, tallies, stop) =
                (limiter.clone(), self.tallies.clone(), self.stop.clone());
            self.tasks.spawn(async move {
                while !stop.is_cancelled() {
                    let sent = Instant::now();
                    let result = limiter.check(&batch).await;
                    record(&mut tallies.lock(), class, sent, result);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
        }
    }

    /// Stops the callers; every class's tally, and how long the load ran.
    pub(crate) async fn finish(mut self) -> (BTreeMap<&'static str, Tally>, Duration) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        let elapsed = self.start.elapsed();
        let tallies = std::mem::take(&mut *self.tallies.lock());
        for (class, tally) in &tallies {
            tally.print(class);
        }
        (tallies, elapsed)
    }
}

fn record(
    tallies: &mut BTreeMap<&'static str, Tally>,
    class: &'static str,
    sent: Instant,
    result: Result<BatchOutcome, LimiterError>,
) {
    let tally = tallies.entry(class).or_default();
    tally.answers.push((sent, Instant::now()));
    match result {
        Ok(o) if o.admitted => tally.admitted += 1,
        Ok(_) => tally.denied += 1,
        Err(e) => {
            tally.errors.push((sent, e.message));
            tally.error_ends.push(Instant::now());
        }
    }
}

/// The first few errors, for a message.
pub(crate) fn first(errors: &[(Instant, String)]) -> Vec<&str> {
    errors.iter().take(5).map(|(_, e)| e.as_str()).collect()
}

pub(crate) fn no_redirection_surfaced(tallies: &BTreeMap<&'static str, Tally>) {
    for (class, tally) in tallies {
        for (_, e) in &tally.errors {
            let upper = e.to_ascii_uppercase();
            assert!(
                !upper.contains("MOVED") && !upper.contains("ASK"),
                "{class}: a redirection reached the caller: {e}"
            );
        }
    }
}
