//! Watching files for changes, for whatever sluice reloads from files (the rules, the TLS
//! certificates): a change sends a [`ReloadTrigger`], and [`debounced`] turns a burst of
//! them into one reload.
//!
//! Watched: every directory given, recursively; for a file, its parent directory (not the
//! file), because editors and Kubernetes replace files rather than write them: a ConfigMap
//! mount updates by swapping its `..data` symlink, which is an event in the mount directory,
//! never on the file the path names. Events that only read (open, close without writing) are
//! ignored, as sluice itself reads the files when it reloads. Log lines name what is watched.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Asks for a reload. Cheap to clone; triggers that come before the reload make one.
#[derive(Debug, Clone)]
pub struct ReloadTrigger(mpsc::Sender<()>);

impl ReloadTrigger {
    /// A trigger and the receiving end that the watching task takes.
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

/// A running watcher; dropping it stops its thread.
pub(crate) struct FileWatcher {
    _inner: RecommendedWatcher,
}

impl FileWatcher {
    /// Watches every path (a directory recursively, a file through its parent) and sends to
    /// `trigger` on each change; `what` names the files in its log lines (`rules`, `TLS
    /// certificates`). `None` (logged) when the system refuses a watcher, in which case only
    /// explicit triggers (SIGHUP) reload.
    pub(crate) fn start(
        what: &'static str,
        paths: &[PathBuf],
        trigger: ReloadTrigger,
    ) -> Option<FileWatcher> {
        if paths.is_empty() {
            return None;
        }
        let handler = move |event: notify::Result<notify::Event>| match event {
            Ok(e) if !is_read_only(&e.kind) => trigger.reload(),
            Ok(_) => {}
            Err(e) => tracing::warn!(watched = what, error = %e, "file watcher error"),
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(watched = what, error = %e, "cannot watch the files; reload with SIGHUP");
                return None;
            }
        };
        for (dir, mode) in targets(paths) {
            if let Err(e) = watcher.watch(&dir, mode) {
                tracing::warn!(watched = what, dir = %dir.display(), error = %e, "cannot watch; reload with SIGHUP");
            }
        }
        Some(FileWatcher { _inner: watcher })
    }
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
