//! Gathering polls: a poll that goes over many requests in one pass, and polls again at once
//! (in the same pass of its task) a request that asks for it. The gRPC port's connection task
//! polls its streams so. Under such a poll, a request that would send a Redis call alone may
//! first let the requests polled with it queue behind it, so that one call carries them all
//! (`redis/group_commit.rs`); anywhere else, asking to be polled again costs a trip through
//! tokio's queues (and, at one request in flight, a wake-up of another worker), so a request
//! there sends at once. The flag lives here, in the lowest layer that reads it; the layers
//! above only set it ([`gather`], [`gathered`]). The contract is on
//! [`Limiter::check`](super::Limiter::check).

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;

thread_local! {
    static GATHERING: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current poll is a gathering one.
pub fn gathering() -> bool {
    GATHERING.with(Cell::get)
}

/// Runs `poll` as a gathering poll: the caller polls again, in the same pass, whatever wakes
/// itself under it.
pub fn gather<R>(poll: impl FnOnce() -> R) -> R {
    /// Puts the flag back as it was, even if `poll` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GATHERING.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GATHERING.with(|g| g.replace(true)));
    poll()
}

/// `future`, polled as a gathering poll: for a future that itself polls many requests in one
/// pass (a `join_all` of them), as a connection's task does.
pub async fn gathered<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    std::future::poll_fn(|cx| gather(|| future.as_mut().poll(cx))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_set_only_inside_and_restored_after_a_panic() {
        assert!(!gathering());
        assert!(gather(gathering));
        assert!(gather(|| gather(gathering)), "nested");
        assert!(!gathering(), "restored");
        let panicked = std::panic::catch_unwind(|| gather(|| panic!("a stream panics")));
        assert!(panicked.is_err());
        assert!(!gathering(), "restored after a panic");
    }

    #[tokio::test]
    async fn a_gathered_future_is_polled_gathering() {
        assert!(!gathering());
        let inside = gathered(std::future::poll_fn(
            |_| std::task::Poll::Ready(gathering()),
        ))
        .await;
        assert!(inside);
        assert!(!gathering());
    }
}
