//! One gRPC connection's life: hyper's HTTP/2 driver polled with its streams ([`Driven`]),
//! and the ways the server ends it:
//!
//! - no whole preface within `server.preface_timeout_ms`: closed at once (nothing was asked,
//!   so nothing is lost);
//! - no stream open for `server.idle_timeout_secs`: a graceful GOAWAY (hyper's: a GOAWAY that
//!   still takes new streams, a PING, then the final GOAWAY once the PING comes back, so a
//!   request sent meanwhile is served), then closed; a client that has not let it close
//!   [`CLOSE_GRACE`] later (it did not answer the PING) is cut off;
//! - the server stops: the same graceful GOAWAY, the requests in flight finish (the caller
//!   bounds that with its grace period); a connection still without its preface is closed at
//!   once.

use std::pin::{Pin, pin};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tonic::service::Routes;

use super::activity::Activity;
use super::driven::{Driven, StreamExecutor};
use super::grpc_timeout::GrpcTimeout;
use super::listen::Peer;
use super::preface::Watched;
use super::{ConnectionLimits, Http2Server};

/// How long after an idle connection's GOAWAY the client has to let it close.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

impl Http2Server {
    /// Serves HTTP/2 on `io` until it closes, the server ends it (see the module doc), or
    /// `stop` changes; then runs the streams it left to their end.
    pub(super) async fn http2<IO>(
        self,
        io: IO,
        peer: Peer,
        routes: Routes,
        mut stop: watch::Receiver<()>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Activity::new();
        let exec = StreamExecutor::new(self.streams, activity.clone());
        let mut builder = hyper::server::conn::http2::Builder::new(exec.clone());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams);
        let service = TowerToHyperService::new(GrpcTimeout(routes));
        let io = TokioIo::new(Watched::new(io, activity.clone()));
        let mut conn = pin!(Driven::new(builder.serve_connection(io, service), exec));
        let mut timer = Timer::new(self.connections);
        let mut stopping = false;
        let served = loop {
            tokio::select! {
                served = &mut conn => break Some(served),
                changed = stop.changed(), if !stopping => {
                    stopping = true;
                    if !activity.prefaced() {
                        tracing::debug!(%peer, "gRPC connection closed without its preface: the server stops");
                        break None;
                    }
                    timer.stop();
                    if changed.is_ok() {
                        conn.as_mut().connection().graceful_shutdown();
                    }
                }
                () = &mut timer.sleep, if timer.armed() => match timer.next(&activity) {
                    Next::Wait => {}
                    Next::GoAway => {
                        tracing::debug!(%peer, "gRPC connection idle: GOAWAY");
                        conn.as_mut().connection().graceful_shutdown();
                    }
                    Next::Close(why) => {
                        tracing::debug!(%peer, "gRPC connection closed: {why}");
                        break None;
                    }
                },
            }
        };
        if let Some(Err(e)) = served {
            tracing::debug!(%peer, error = %e, "gRPC connection ended with an error");
        }
        // The connection is done with: the server's stop no longer waits on this task.
        drop(stop);
        // Streams the connection left (it closed under them) run to their end, as spawned
        // tasks would have: a decision under way is finished, its answer then goes nowhere.
        conn.drain().await;
    }
}

/// Which deadline a connection's timer is set to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The whole preface must be in by then.
    Preface,
    /// Time to look whether the connection has been idle long enough.
    Idle,
    /// The idle GOAWAY was sent: the connection must be closed by then.
    Closing,
    /// No deadline.
    Off,
}

/// What the connection does when its timer fires.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Nothing yet: the timer is set again.
    Wait,
    /// Idle: a graceful GOAWAY.
    GoAway,
    /// Close it now, for this reason.
    Close(&'static str),
}

/// One connection's deadlines: one timer, set to one at a time.
struct Timer {
    limits: ConnectionLimits,
    phase: Phase,
    sleep: Pin<Box<Sleep>>,
    /// When the whole preface must be in (with a preface timeout).
    preface_by: Instant,
}

impl Timer {
    /// Set for a connection that starts now.
    fn new(limits: ConnectionLimits) -> Timer {
        let now = Instant::now();
        let preface_by = now + limits.preface_timeout.unwrap_or_default();
        let mut timer = Timer {
            limits,
            phase: Phase::Off,
            sleep: Box::pin(tokio::time::sleep_until(now)),
            preface_by,
        };
        // The preface's deadline, or the first idle look when that comes first: the idle
        // timeout counts from the start either way.
        let idle_by = limits.idle_timeout.map(|t| now + t);
        match (limits.preface_timeout, idle_by) {
            (Some(_), Some(idle_by)) => timer.set(Phase::Preface, preface_by.min(idle_by)),
            (Some(_), None) => timer.set(Phase::Preface, preface_by),
            (None, Some(idle_by)) => timer.set(Phase::Idle, idle_by),
            (None, None) => {}
        }
        timer
    }

    fn armed(&self) -> bool {
        self.phase != Phase::Off
    }

    fn set(&mut self, phase: Phase, deadline: Instant) {
        self.phase = phase;
        self.sleep.as_mut().reset(deadline);
    }

    /// The server stops: no more deadlines, except an idle GOAWAY's.
    fn stop(&mut self) {
        if self.phase != Phase::Closing {
            self.phase = Phase::Off;
        }
    }

    /// The deadline passed: what to do, and the next deadline set.
    fn next(&mut self, activity: &Activity) -> Next {
        let now = Instant::now();
        match self.phase {
            Phase::Preface if !activity.prefaced() && now < self.preface_by => {
                // An idle look came first; there is nothing to be idle on yet.
                self.set(Phase::Preface, self.preface_by);
                Next::Wait
            }
            Phase::Preface if !activity.prefaced() => {
                self.phase = Phase::Off;
                Next::Close("no HTTP/2 preface within server.preface_timeout_ms")
            }
            Phase::Preface | Phase::Idle => self.idle(activity.idle_since(), now),
            Phase::Closing => {
                self.phase = Phase::Off;
                Next::Close("idle, and the client did not answer the GOAWAY")
            }
            Phase::Off => Next::Wait,
        }
    }

    /// The idle look: a GOAWAY when no stream has been open for the idle timeout; else the
    /// next look set (none without an idle timeout).
    fn idle(&mut self, idle_since: Option<Instant>, now: Instant) -> Next {
        let Some(timeout) = self.limits.idle_timeout else {
            self.phase = Phase::Off;
            return Next::Wait;
        };
        match idle_since {
            // A stream is open: idle at the soonest a whole timeout from now.
            None => self.set(Phase::Idle, now + timeout),
            Some(since) if since + timeout > now => self.set(Phase::Idle, since + timeout),
            Some(_) => {
                self.set(Phase::Closing, now + CLOSE_GRACE);
                return Next::GoAway;
            }
        }
        Next::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(preface: Option<u64>, idle: Option<u64>) -> ConnectionLimits {
        ConnectionLimits {
            preface_timeout: preface.map(Duration::from_secs),
            idle_timeout: idle.map(Duration::from_secs),
            max_connections: None,
        }
    }

    async fn fire(timer: &mut Timer, activity: &Activity) -> Next {
        (&mut timer.sleep).await;
        timer.next(activity)
    }

    #[tokio::test(start_paused = true)]
    async fn no_preface_in_time_is_closed() {
        let start = Instant::now();
        let mut timer = Timer::new(limits(Some(5), Some(300)));
        let activity = Activity::new();
        assert!(matches!(fire(&mut timer, &activity).await, Next::Close(_)));
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        assert!(!timer.armed());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_is_counted_from_the_start_and_from_the_last_stream() {
        let start = Instant::now();
        let mut timer = Timer::new(limits(Some(5), Some(60)));
        let activity = Activity::new();
        activity.set_prefaced();
        assert_eq!(fire(&mut timer, &activity).await, Next::Wait, "prefaced");
        let open = activity.stream_opened();
        assert_eq!(
            fire(&mut timer, &activity).await,
            Next::Wait,
            "a stream is open"
        );
        assert_eq!(Instant::now() - start, Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(30)).await;
        drop(open);
        assert_eq!(
            fire(&mut timer, &activity).await,
            Next::Wait,
            "open until 90 s"
        );
        assert_eq!(Instant::now() - start, Duration::from_secs(120));
        assert_eq!(fire(&mut timer, &activity).await, Next::GoAway);
        assert_eq!(Instant::now() - start, Duration::from_secs(150));
        assert!(matches!(fire(&mut timer, &activity).await, Next::Close(_)));
        assert_eq!(
            Instant::now() - start,
            Duration::from_secs(150) + CLOSE_GRACE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_timeout_shorter_than_the_preface_timeout_counts_from_the_start() {
        let start = Instant::now();
        let mut timer = Timer::new(limits(Some(5), Some(2)));
        let activity = Activity::new();
        assert_eq!(
            fire(&mut timer, &activity).await,
            Next::Wait,
            "no preface yet"
        );
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        activity.set_prefaced();
        assert_eq!(fire(&mut timer, &activity).await, Next::GoAway);
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        let mut timer = Timer::new(limits(Some(5), Some(2)));
        assert_eq!(
            fire(&mut timer, &activity).await,
            Next::GoAway,
            "prefaced at once"
        );
        let mut timer = Timer::new(limits(Some(5), Some(2)));
        let activity = Activity::new();
        assert_eq!(fire(&mut timer, &activity).await, Next::Wait);
        assert!(matches!(fire(&mut timer, &activity).await, Next::Close(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn without_limits_the_timer_is_off() {
        assert!(!Timer::new(limits(None, None)).armed());
        let mut timer = Timer::new(limits(Some(1), None));
        let activity = Activity::new();
        activity.set_prefaced();
        assert_eq!(fire(&mut timer, &activity).await, Next::Wait);
        assert!(!timer.armed());
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_keeps_only_an_idle_goaway_deadline() {
        let mut timer = Timer::new(limits(Some(1), Some(1)));
        timer.stop();
        assert!(!timer.armed());
        let mut timer = Timer::new(limits(None, Some(1)));
        assert_eq!(fire(&mut timer, &Activity::new()).await, Next::GoAway);
        timer.stop();
        assert!(timer.armed());
    }
}
