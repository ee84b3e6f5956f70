//! What a connection's timers look at (src/transport/connection.rs): whether the client's
//! whole HTTP/2 preface has been read, how many of its streams are open, and since when none
//! is.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::time::Instant;

/// One connection's activity, shared by its IO (the preface), its streams and its task.
#[derive(Debug)]
pub(super) struct Activity {
    prefaced: AtomicBool,
    open: AtomicUsize,
    /// When the last stream ended, or when the connection started when none has. Locked
    /// around a stream's end and around a look at both, so that a look never pairs "none
    /// open" with the instant before the last one.
    idle_since: Mutex<Instant>,
}

/// A stream counted open until this is dropped.
pub(super) struct OpenStream(Arc<Activity>);

impl Activity {
    /// A connection that starts now.
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            prefaced: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    /// The client's whole preface has been read.
    pub(super) fn prefaced(&self) -> bool {
        self.prefaced.load(Ordering::Acquire)
    }

    pub(super) fn set_prefaced(&self) {
        self.prefaced.store(true, Ordering::Release);
    }

    /// Counts a stream open until the guard is dropped.
    pub(super) fn stream_opened(self: &Arc<Self>) -> OpenStream {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenStream(self.clone())
    }

    /// Since when no stream is open; none while one is.
    pub(super) fn idle_since(&self) -> Option<Instant> {
        let since = self.idle_since.lock();
        (self.open.load(Ordering::SeqCst) == 0).then_some(*since)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut since = self.0.idle_since.lock();
        if self.0.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            *since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_from_the_start_and_from_the_last_stream_end() {
        let activity = Activity::new();
        let start = Instant::now();
        assert_eq!(activity.idle_since(), Some(start));
        let first = activity.stream_opened();
        let second = activity.stream_opened();
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        drop(first);
        assert_eq!(activity.idle_since(), None, "one is still open");
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        drop(second);
        assert_eq!(activity.idle_since(), Some(Instant::now()));
        assert!(Instant::now() > start);
    }
}
