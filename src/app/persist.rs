//! `limiter.persist`: the memory backend's state kept in a file across restarts.
//!
//! - At start ([`Persist::restore`], before any port is bound), the snapshot is read whole and
//!   installed whole. A missing file starts empty; a file that cannot be read or is refused
//!   (corrupt, truncated, another format's version) starts empty too, with one error log line
//!   naming the path and the reason, and a refused file is moved aside to `PATH.refused`.
//! - While serving ([`Persist::run`]), every `limiter.persist_interval_ms` a snapshot is
//!   written: on a blocking thread, which copies the shards one at a time under their own
//!   locks (a decision waits for at most one shard's copy, never for I/O), writes `PATH.tmp`,
//!   syncs it, and renames it over `PATH`. A crash loses at most one interval.
//! - At shutdown ([`Persist::write`], after the gRPC server has finished its requests and the
//!   other tasks have stopped), one last snapshot: a graceful stop loses nothing.
//!
//! Writes never overlap: each holds [`Persist::writing`] on its blocking thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::limiter::MemoryLimiter;

/// The snapshot file of one memory limiter.
pub(crate) struct Persist {
    limiter: Arc<MemoryLimiter>,
    path: PathBuf,
    every: Duration,
    writing: Arc<Mutex<()>>,
}

impl Persist {
    /// Restores `limiter` (holding nothing yet) from `path` as the module doc says, and keeps
    /// it in that file from now on.
    pub(crate) fn restore(limiter: Arc<MemoryLimiter>, path: PathBuf, every: Duration) -> Persist {
        restore_from(&limiter, &path);
        Persist {
            limiter,
            path,
            every,
            writing: Arc::new(Mutex::new(())),
        }
    }

    /// Writes a snapshot every interval until stopped (a failed write is logged, and the next
    /// one tried at the next tick).
    pub(crate) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(e) = self.write().await {
                        tracing::warn!("{e:#}");
                    }
                }
            }
        }
    }

    /// Writes a snapshot now.
    pub(crate) async fn write(&self) -> anyhow::Result<()> {
        let (limiter, path, writing) = (
            self.limiter.clone(),
            self.path.clone(),
            self.writing.clone(),
        );
        let written = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = writing.lock();
            write_file(&limiter, &path)
        })
        .await
        .context("the snapshot writer panicked")?;
        written.with_context(|| format!("cannot write the snapshot {}", self.path.display()))
    }

    /// The last snapshot, at shutdown: logged either way.
    pub(crate) async fn write_last(&self) {
        match self.write().await {
            Ok(()) => tracing::info!(path = %self.path.display(), "limiter state saved"),
            Err(e) => tracing::error!("{e:#}"),
        }
    }
}

/// Nanoseconds since the Unix epoch on the wall clock.
fn wall_nanos() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// Encodes the limiter's state and replaces `path` with it atomically.
fn write_file(limiter: &MemoryLimiter, path: &Path) -> std::io::Result<()> {
    use std::io::Write as _;
    let bytes = limiter.encode_snapshot(wall_nanos());
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = sibling(path, "tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    // The rename itself survives a power cut once the directory is synced (where a directory
    // can be opened; elsewhere the rename is still atomic).
    if let Some(d) = dir.and_then(|d| std::fs::File::open(d).ok()) {
        let _ = d.sync_all();
    }
    tracing::debug!(path = %path.display(), bytes = bytes.len(), "limiter state written");
    Ok(())
}

/// `path` with `.suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    path.with_file_name(name)
}

/// Reads `path` into `limiter`, all of it or nothing, logging what happened.
fn restore_from(limiter: &MemoryLimiter, path: &Path) {
    let shown = path.display();
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %shown, "no limiter snapshot yet; starting empty");
            return;
        }
        Err(e) => {
            tracing::error!(
                "limiter snapshot {shown} refused: cannot read it: {e}; starting empty"
            );
            return;
        }
    };
    match limiter.restore_snapshot(&bytes, wall_nanos()) {
        Ok(r) => {
            let age_secs = wall_nanos().saturating_sub(r.written_at) / 1_000_000_000;
            tracing::info!(
                path = %shown,
                states = r.states,
                reservations = r.reservations,
                expired = r.expired,
                age_secs,
                "limiter state restored"
            );
        }
        Err(e) => {
            let aside = sibling(path, "refused");
            let kept = match std::fs::rename(path, &aside) {
                Ok(()) => format!("kept as {}", aside.display()),
                Err(e) => format!("not moved aside: {e}"),
            };
            tracing::error!("limiter snapshot {shown} refused: {e}; starting empty ({kept})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_add_to_the_file_name() {
        let p = Path::new("/var/lib/sluice/state.bin");
        assert_eq!(
            sibling(p, "tmp"),
            Path::new("/var/lib/sluice/state.bin.tmp")
        );
        assert_eq!(sibling(Path::new("s"), "refused"), Path::new("s.refused"));
    }
}
