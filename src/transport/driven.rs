//! Where a connection's streams (its requests) run, and how they are polled with the
//! connection.
//!
//! By default a connection's streams run on the connection's own task, not one task each
//! ([`Streams::OnConnection`]). When a Redis script call answers a batch of requests, the lane
//! wakes the connection's task once; that task finishes every stream the batch answered, then
//! writes their answers in one go. With a task per stream, each answer woke the connection's
//! task on its own, and tokio ran that task at once (its LIFO slot), so most answers left in a
//! write of their own: more system calls here, more wake-ups in the client.
//! docs/BENCHMARKS.md has the figures. The price: one connection's requests share one worker
//! at a time, so a single client connection that sends CPU-heavy requests faster than one
//! core decides them is better served with `server.stream_tasks = true` (a task per stream,
//! spread over every worker).
//!
//! Either way each stream is counted open in the connection's [`Activity`] from its start to
//! its end, for the idle timeout.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::FutureExt as _;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;

use super::Streams;
use super::activity::Activity;

type StreamTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// hyper's executor for one connection's streams: queues them for the connection's task
/// ([`Streams::OnConnection`]) or spawns them ([`Streams::OwnTasks`]).
#[derive(Clone)]
pub(super) struct StreamExecutor {
    streams: Streams,
    shared: Arc<Shared>,
    activity: Arc<Activity>,
}

/// What a connection's task and the wakers it hands out share.
#[derive(Default)]
struct Shared {
    /// Streams hyper started, not yet taken by the connection's task.
    queued: Mutex<Vec<StreamTask>>,
    /// The connection's task's waker.
    task: AtomicWaker,
    /// Set while the connection's task is polling: a wake-up then only asks for another
    /// round (`again`), since the poll under way makes it. Waking the task from inside its
    /// own poll would make tokio queue it again behind the others and rouse an idle worker
    /// to share the work: a cost per request when one request is in flight, and every
    /// answer a stream hands to the connection is such a wake-up.
    polling: AtomicBool,
    again: AtomicBool,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.again.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl StreamExecutor {
    pub(super) fn new(streams: Streams, activity: Arc<Activity>) -> StreamExecutor {
        StreamExecutor {
            streams,
            shared: Arc::default(),
            activity,
        }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let open = self.activity.stream_opened();
        // Counted open until it ends, or is dropped unfinished.
        let stream = async move {
            let _open = open;
            stream.await;
        };
        match self.streams {
            Streams::OwnTasks => {
                tokio::spawn(stream);
            }
            Streams::OnConnection => {
                // A stream that panics ends alone, as a task of its own would: its request is
                // reset, the connection and its other requests go on.
                let stream = AssertUnwindSafe(stream).catch_unwind().map(drop);
                self.shared.queued.lock().push(Box::pin(stream));
                // hyper starts a stream while the connection is polled, so this only asks
                // for the round that takes it.
                Wake::wake_by_ref(&self.shared);
            }
        }
    }
}

/// The most rounds of (connection, streams) one poll of [`Driven`] makes before it yields.
const ROUNDS_PER_POLL: usize = 8;

/// A connection and the streams it started, polled together.
pub(super) struct Driven<C> {
    conn: Pin<Box<C>>,
    exec: StreamExecutor,
    /// The waker the connection and the streams are polled with: [`Shared`]'s.
    waker: Waker,
    streams: FuturesUnordered<StreamTask>,
}

impl<C: Future> Driven<C> {
    pub(super) fn new(conn: C, exec: StreamExecutor) -> Driven<C> {
        let waker = Waker::from(exec.shared.clone());
        Driven {
            conn: Box::pin(conn),
            exec,
            waker,
            streams: FuturesUnordered::new(),
        }
    }

    pub(super) fn connection(self: Pin<&mut Self>) -> Pin<&mut C> {
        self.get_mut().conn.as_mut()
    }

    /// Runs the streams left to their end.
    pub(super) async fn drain(self: Pin<&mut Self>) {
        let this = self.get_mut();
        take_queued(&this.exec.shared, &mut this.streams);
        while this.streams.next().await.is_some() {}
    }

    /// Rounds of (connection, streams) while a round does something, at most
    /// [`ROUNDS_PER_POLL`]; `None`: rounds are left to make.
    fn rounds(&mut self) -> Option<Poll<C::Output>> {
        let Driven {
            conn,
            exec,
            waker,
            streams,
        } = self;
        let shared = &exec.shared;
        let mut inner = Context::from_waker(waker);
        for _ in 0..ROUNDS_PER_POLL {
            shared.again.store(false, Ordering::SeqCst);
            let served = conn.as_mut().poll(&mut inner);
            if served.is_ready() {
                // Streams the connection finished meanwhile hand over nothing more.
                return Some(served);
            }
            let started = take_queued(shared, streams);
            let mut finished = false;
            while let Poll::Ready(Some(())) = streams.poll_next_unpin(&mut inner) {
                finished = true;
            }
            if !started && !finished && !shared.again.load(Ordering::SeqCst) {
                return Some(Poll::Pending);
            }
        }
        None
    }
}

/// Moves the streams queued since the last call into `streams`; true when there were any.
fn take_queued(shared: &Shared, streams: &mut FuturesUnordered<StreamTask>) -> bool {
    let mut queued = shared.queued.lock();
    let any = !queued.is_empty();
    streams.extend(queued.drain(..));
    any
}

impl<C: Future> Future for Driven<C> {
    type Output = C::Output;

    /// One round: the connection (reads requests, starts their streams, writes the answers
    /// waiting), then every stream that can go on (a finished one hands its answer to the
    /// connection). While a round started or finished a stream, or the connection asked to be
    /// polled again, another follows, so the answers finished are written before the task
    /// sleeps.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        this.exec.shared.task.register(cx.waker());
        this.exec.shared.polling.store(true, Ordering::SeqCst);
        // A stream that wakes itself is polled again in the next round of this poll.
        let polled = sluice_core::limiter::gathering::gather(|| this.rounds());
        let shared = &this.exec.shared;
        shared.polling.store(false, Ordering::SeqCst);
        match polled {
            Some(Poll::Ready(served)) => Poll::Ready(served),
            // A wake-up that came after the last round looked: one more poll.
            Some(Poll::Pending) if !shared.again.load(Ordering::SeqCst) => Poll::Pending,
            _ => {
                // Work is left: let the worker's other tasks run, then come back.
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that panics ends alone: the connection's task goes on, and so do the
    /// connection's other streams.
    #[test]
    fn a_panicking_stream_does_not_take_its_connection_down() {
        let exec = StreamExecutor::new(Streams::OnConnection, Activity::new());
        let done = Arc::new(AtomicBool::new(false));
        hyper::rt::Executor::execute(&exec, async { panic!("a stream's bug") });
        let flag = done.clone();
        hyper::rt::Executor::execute(&exec, async move { flag.store(true, Ordering::SeqCst) });
        let mut driven = Box::pin(Driven::new(std::future::pending::<()>(), exec));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(driven.as_mut().poll(&mut cx).is_pending());
        assert!(done.load(Ordering::SeqCst), "the other stream ran");
        assert!(driven.streams.is_empty(), "both streams ended");
    }

    /// A connection's streams are polled gathering, and a stream that wakes itself there is
    /// polled again within the same poll of the connection's task, after the others.
    #[test]
    fn streams_are_polled_gathering_and_a_self_wake_is_another_round() {
        let exec = StreamExecutor::new(Streams::OnConnection, Activity::new());
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let log = order.clone();
        let mut yielded = false;
        hyper::rt::Executor::execute(
            &exec,
            std::future::poll_fn(move |cx| {
                log.lock()
                    .push(("first", sluice_core::limiter::gathering::gathering()));
                if std::mem::replace(&mut yielded, true) {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }),
        );
        let log = order.clone();
        hyper::rt::Executor::execute(&exec, async move {
            log.lock()
                .push(("second", sluice_core::limiter::gathering::gathering()));
        });
        let mut driven = Box::pin(Driven::new(std::future::pending::<()>(), exec));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(driven.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            *order.lock(),
            [("first", true), ("second", true), ("first", true)]
        );
        assert!(driven.streams.is_empty(), "both ended in one poll");
        assert!(
            !sluice_core::limiter::gathering::gathering(),
            "only while the streams are polled"
        );
    }
}
