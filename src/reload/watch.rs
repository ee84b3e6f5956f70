//! What starts a reload: a change under a rules path, or an explicit trigger (SIGHUP).
//!
//! Watched: every rules directory, recursively; for a rules file, its parent directory (not
//! the file), because editors and Kubernetes replace files rather than write them: a
//! ConfigMap mount updates by swapping its `..data` symlink, which is an event in the mount
//! directory, never on the file the rules path names. Events that only read (open, close
//! without writing) are ignored, as sluice itself reads the files when it reloads.
//!
//! Triggers are debounced: a reload starts once no new trigger came for the debounce time, so
//! a burst of events (a swap is several) gives one reload.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ActiveRules, Reloaded};

/// Asks for a reload. Cheap to clone; triggers that come before the reload make one.
#[derive(Debug, Clone)]
pub struct ReloadTrigger(mpsc::Sender<()>);

impl ReloadTrigger {
    /// A trigger and the receiving end that [`watch`] takes.
    pub fn channel() -> (ReloadTrigger, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel(1);
        (ReloadTrigger(tx), rx)
    }

    /// Requests a reload; never blocks.
    pub fn reload(&self) {
        // A full channel already holds a pending request: nothing is lost.
        let _ = self.0.try_send(());
    }
}

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
        start_watcher(rules.paths(), trigger)
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

/// Waits for a request, then until none came for `debounce`: true, time to act; false when
/// `stop` came first.
pub(crate) async fn debounced(
    requests: &mut mpsc::Receiver<()>,
    debounce: Duration,
    stop: &CancellationToken,
) -> bool {
    tokio::select! {
        _ = stop.cancelled() => return false,
        got = requests.recv() => if got.is_none() {
            // Every trigger is gone: nothing can ask again.
            stop.cancelled().await;
            return false;
        },
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = requests.recv() => {}
            () = tokio::time::sleep(debounce) => return true,
        }
    }
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

/// A watcher on every path (a directory recursively, a file through its parent), sending to
/// `trigger`; `None` (logged) when the system refuses one, in which case only explicit
/// triggers reload.
pub(crate) fn start_watcher(
    paths: &[PathBuf],
    trigger: ReloadTrigger,
) -> Option<RecommendedWatcher> {
    if paths.is_empty() {
        return None;
    }
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(e) if !is_read_only(&e.kind) => trigger.reload(),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "rules watcher error"),
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the rules paths; reload with SIGHUP");
            return None;
        }
    };
    for (dir, mode) in targets(paths) {
        if let Err(e) = watcher.watch(&dir, mode) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch; reload with SIGHUP");
        }
    }
    Some(watcher)
}

fn is_read_only(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => true,
        _ => false,
    }
}

/// The directories to watch: a directory recursively, a file's parent on its own.
fn targets(paths: &[PathBuf]) -> Vec<(PathBuf, RecursiveMode)> {
    let unique: BTreeSet<(PathBuf, bool)> = paths
        .iter()
        .map(|p| {
            if p.is_dir() {
                (p.clone(), true)
            } else {
                (parent_of(p), false)
            }
        })
        .collect();
    unique
        .into_iter()
        .map(|(dir, recursive)| {
            let mode = if recursive {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            (dir, mode)
        })
        .collect()
}

fn parent_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
