//! What starts a rules reload: a change under a rules path (watched by [`crate::watcher`]),
//! or an explicit trigger (SIGHUP). Triggers are debounced: a reload starts once no new
//! trigger came for the debounce time, so a burst of events (a swap is several) gives one
//! reload.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ActiveRules, Reloaded};
pub use crate::watcher::ReloadTrigger;
use crate::watcher::{FileWatcher, debounced};

/// How [`watch`] behaves.
pub struct WatchOptions {
    /// Watch the rules paths for changes (otherwise only triggers reload).
    pub files: bool,
    pub debounce: Duration,
    /// Called after every reload (metrics).
    pub report: Box<dyn Fn(&Reloaded) + Send + Sync>,
}

/// Reloads `rules` on every (debounced) trigger until `stop`.
pub async fn watch(
    rules: Arc<ActiveRules>,
    trigger: ReloadTrigger,
    mut requests: mpsc::Receiver<()>,
    options: WatchOptions,
    stop: CancellationToken,
) -> Result<(), tokio::task::JoinError> {
    // Owned here: dropping it (when this task ends) stops its thread.
    let _watcher = if options.files {
        FileWatcher::start("rules", rules.paths(), trigger)
    } else {
        None
    };
    while debounced(&mut requests, options.debounce, &stop).await {
        let active = rules.clone();
        let outcome = tokio::task::spawn_blocking(move || active.reload()).await?;
        log(&outcome, &rules);
        (options.report)(&outcome);
    }
    Ok(())
}

fn log(outcome: &Reloaded, rules: &ActiveRules) {
    match outcome {
        Reloaded::Updated { version } => {
            let domains = rules.load_full().len();
            tracing::info!(version, domains, "rules reloaded");
        }
        Reloaded::Unchanged => tracing::debug!("rules reloaded: unchanged"),
        Reloaded::Failed(errors) => {
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            tracing::warn!(
                errors = errors.0.len(),
                "rules reload failed; the last good rules stay active"
            );
        }
    }
}
