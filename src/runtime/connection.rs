//! The gRPC port's HTTP/2 server: the accept loop, one task per connection, and where a
//! connection's streams (its requests) run.
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

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::stream::{FuturesUnordered, Stream, StreamExt as _};
use futures_util::task::AtomicWaker;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::codegen::http::{HeaderMap, Request, Response};
use tonic::service::Routes;

/// Where a connection's streams run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// On the connection's task: the answers a wake-up finishes leave in one write.
    OnConnection,
    /// One task each, spread over the workers.
    OwnTasks,
}

/// The HTTP/2 settings of the gRPC port.
#[derive(Debug, Clone, Copy)]
pub struct Http2Server {
    /// Streams a client may open at once on one connection (advertised in SETTINGS).
    pub max_concurrent_streams: u32,
    pub streams: Streams,
}

impl Http2Server {
    /// Serves `routes` on every connection `incoming` yields until `shutdown` resolves; then
    /// stops accepting (`incoming` is dropped), asks every connection to close (GOAWAY: the
    /// requests in flight finish, no new ones start) and returns once all are closed. An
    /// accept error is logged and skipped.
    pub async fn serve<I, IO, E>(
        self,
        routes: Routes,
        incoming: I,
        shutdown: impl Future<Output = ()>,
    ) where
        I: Stream<Item = Result<IO, E>>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        E: std::fmt::Display,
    {
        let routes = routes.prepare();
        let (stop, stopped) = watch::channel(());
        {
            let mut incoming = pin!(incoming);
            let mut shutdown = pin!(shutdown);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    next = incoming.next() => match next {
                        Some(Ok(io)) => {
                            let serve = self.connection(io, routes.clone(), stopped.clone());
                            tokio::spawn(serve);
                        }
                        Some(Err(e)) => tracing::debug!(error = %e, "accepting a gRPC connection failed"),
                        None => break,
                    },
                }
            }
        }
        drop(stopped);
        // Every connection task holds a receiver: `closed` resolves when the last one ends.
        let _ = stop.send(());
        stop.closed().await;
    }

    /// Serves one connection until it closes, or closes it gracefully once `stop` changes.
    async fn connection<IO>(self, io: IO, routes: Routes, mut stop: watch::Receiver<()>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let exec = StreamExecutor::new(self.streams);
        let mut builder = hyper::server::conn::http2::Builder::new(exec.clone());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams);
        let service = TowerToHyperService::new(GrpcTimeout(routes));
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let mut conn = pin!(Driven::new(conn, exec));
        let mut stopping = false;
        let served = loop {
            tokio::select! {
                served = &mut conn => break served,
                changed = stop.changed(), if !stopping => {
                    stopping = true;
                    if changed.is_ok() {
                        conn.as_mut().connection().graceful_shutdown();
                    }
                }
            }
        };
        if let Err(e) = served {
            tracing::debug!(error = %e, "gRPC connection ended with an error");
        }
        // The connection is closed: the server's stop no longer waits on this task.
        drop(stop);
        // Streams the connection left (it closed under them) run to their end, as spawned
        // tasks would have: a decision under way is finished, its answer then goes nowhere.
        conn.drain().await;
    }
}

type StreamTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// hyper's executor for one connection's streams: queues them for the connection's task
/// ([`Streams::OnConnection`]) or spawns them ([`Streams::OwnTasks`]).
#[derive(Clone)]
struct StreamExecutor {
    streams: Streams,
    shared: Arc<Shared>,
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
    fn new(streams: Streams) -> StreamExecutor {
        StreamExecutor {
            streams,
            shared: Arc::default(),
        }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
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
struct Driven<C> {
    conn: Pin<Box<C>>,
    exec: StreamExecutor,
    /// The waker the connection and the streams are polled with: [`Shared`]'s.
    waker: Waker,
    streams: FuturesUnordered<StreamTask>,
}

impl<C: Future> Driven<C> {
    fn new(conn: C, exec: StreamExecutor) -> Driven<C> {
        let waker = Waker::from(exec.shared.clone());
        Driven {
            conn: Box::pin(conn),
            exec,
            waker,
            streams: FuturesUnordered::new(),
        }
    }

    fn connection(self: Pin<&mut Self>) -> Pin<&mut C> {
        self.get_mut().conn.as_mut()
    }

    /// Runs the streams left to their end.
    async fn drain(self: Pin<&mut Self>) {
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

/// Honours a request's `grpc-timeout`: past it the request is answered `CANCELLED`
/// ("Timeout expired") and its work dropped.
#[derive(Clone)]
struct GrpcTimeout(Routes);

/// What tonic's routes answer a request with.
type Routed = <Routes as Service<Request<hyper::body::Incoming>>>::Future;

impl Service<Request<hyper::body::Incoming>> for GrpcTimeout {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<hyper::body::Incoming>) -> Answer {
        let deadline = grpc_timeout(request.headers()).map(|t| Box::pin(tokio::time::sleep(t)));
        Answer {
            routed: self.0.call(request),
            deadline,
        }
    }
}

/// A request's answer, or `CANCELLED` once its deadline (if any) passed.
struct Answer {
    routed: Routed,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Answer {
    type Output = Result<Response<Body>, std::convert::Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(answered) = Pin::new(&mut this.routed).poll(cx) {
            return Poll::Ready(answered);
        }
        let Some(deadline) = this.deadline.as_mut() else {
            return Poll::Pending;
        };
        deadline
            .as_mut()
            .poll(cx)
            .map(|()| Ok(Status::cancelled("Timeout expired").into_http()))
    }
}

/// The `grpc-timeout` header's duration: at most 8 digits and a unit (H, M, S, m, u, n).
/// Absent or malformed: none.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that panics ends alone: the connection's task goes on, and so do the
    /// connection's other streams.
    #[test]
    fn a_panicking_stream_does_not_take_its_connection_down() {
        let exec = StreamExecutor::new(Streams::OnConnection);
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
        let exec = StreamExecutor::new(Streams::OnConnection);
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let log = order.clone();
        let mut yielded = false;
        hyper::rt::Executor::execute(
            &exec,
            std::future::poll_fn(move |cx| {
                log.lock().push(("first", crate::runtime::gathering()));
                if std::mem::replace(&mut yielded, true) {
                    return Poll::Ready(());
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }),
        );
        let log = order.clone();
        hyper::rt::Executor::execute(&exec, async move {
            log.lock().push(("second", crate::runtime::gathering()));
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
            !crate::runtime::gathering(),
            "only while the streams are polled"
        );
    }

    fn timeout_of(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().expect("header value"));
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout_of("20m"), Some(Duration::from_millis(20)));
        assert_eq!(
            timeout_of("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout_of("5n"), Some(Duration::from_nanos(5)));
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for bad in ["", "m", "123456789m", "-1m", "+1m", "1x", "1.5S", "1 S"] {
            assert_eq!(timeout_of(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
