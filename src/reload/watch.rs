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
    let watcher = if options.files {
        FileWatcher::start("rules", rules.paths(), trigger)
    } else {
        None
    };
    // A change made between the first load and the watch's start raised no event: one look
    // now, silent when nothing changed (a slow start, on a busy node, is exactly when a
    // ConfigMap swap may land in that gap).
    if watcher.is_some() {
        let active = rules.clone();
        let outcome = tokio::task::spawn_blocking(move || active.reload()).await?;
        if !matches!(outcome, Reloaded::Unchanged) {
            log(&outcome, &rules);
            (options.report)(&outcome);
        }
    }
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use parking_lot::Mutex;

    use super::*;
    use crate::config::rules_file::LoadOptions;
    use crate::reload::load;
    use crate::rules::RuleSet;

    const V1: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    const V2: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n";

    /// Rules loaded from `dir/r.yaml` holding `text`, as a server's first load does.
    fn loaded(dir: &Path, text: &str) -> Arc<ActiveRules> {
        let file = dir.join("r.yaml");
        std::fs::write(&file, text).unwrap();
        let model = load(std::slice::from_ref(&file), LoadOptions::default()).unwrap();
        let set = RuleSet::compile(model);
        Arc::new(ActiveRules::new(set, vec![file], LoadOptions::default()))
    }

    /// Runs [`watch`] on `rules` with no trigger until the rules reach `version` (or 2 s
    /// pass); the outcomes it reported.
    async fn watched(rules: &Arc<ActiveRules>, version: u64) -> Vec<&'static str> {
        let (trigger, requests) = ReloadTrigger::channel();
        let reported = Arc::new(Mutex::new(Vec::new()));
        let report = reported.clone();
        let options = WatchOptions {
            files: true,
            debounce: Duration::from_millis(10),
            report: Box::new(move |outcome: &Reloaded| report.lock().push(outcome.label())),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(watch(
            rules.clone(),
            trigger,
            requests,
            options,
            stop.clone(),
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while rules.status().version < version && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Time for a reload to be reported after the swap, or for one that should not come.
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        task.await.unwrap().unwrap();
        reported.lock().clone()
    }

    #[tokio::test]
    async fn a_change_between_the_first_load_and_the_watch_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let rules = loaded(dir.path(), V1);
        // Changed after the first load, before the watch starts: no event will tell.
        std::fs::write(dir.path().join("r.yaml"), V2).unwrap();
        assert_eq!(watched(&rules, 2).await, ["success"]);
        assert_eq!(rules.status().version, 2);
    }

    #[tokio::test]
    async fn an_unchanged_start_reloads_nothing_and_reports_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let rules = loaded(dir.path(), V1);
        assert!(watched(&rules, 2).await.is_empty());
        assert_eq!(rules.status().version, 1);
    }
}
