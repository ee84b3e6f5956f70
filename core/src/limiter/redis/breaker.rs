//! Circuit breakers, one per node: after `failures` consecutive calls to a node that it did
//! not answer (a time-out, a refused or lost connection: [`unanswered`]), calls to it are
//! refused at once for `cooldown`; then one call at a time is let through as a probe (at most
//! one per `cooldown`), and the first answer closes the breaker again. A node's trouble never
//! refuses a call to another node: in a Cluster, losing a master refuses only the calls for
//! its slots.
//!
//! A reply is an answer, whatever it says: `CLUSTERDOWN`, `TRYAGAIN`, `LOADING`, `MASTERDOWN`,
//! `READONLY` or a script's error come from a live node, so they never open its breaker, and
//! they close it when it is open (the node serves again: no cooldown stands in the way).
//! A request whose time-out passed while it waited (queued, or in a call) counts against the
//! node it waited for, unless that node sent an error reply within the time-out: the request
//! then waited behind calls that the node answered and that were tried again. Nor does a
//! time-out whose timer fired more than [`STALLED`] late: this process was not running then
//! (the machine stalled), which says nothing of the node.
//!
//! A probe that never finishes (its request was cancelled) cannot wedge the breaker: the next
//! probe is simply allowed one `cooldown` later.
//!
//! Only nodes with failures are remembered (a success forgets the node), at most
//! [`MAX_NODES`] of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::time::Instant;

use super::topology::Node;

/// The most nodes with failures remembered at once (a Cluster has at most about 1000 nodes).
pub(super) const MAX_NODES: usize = 1024;

/// How late a time-out's timer may fire and still count against the node: later than this,
/// this process was not running (the machine stalled), and its time-out says nothing of the
/// node. Uncounted, it still fails its requests; it just opens no breaker on a node that was
/// answering (which would fail that node's keys for a cooldown more).
pub(super) const STALLED: Duration = Duration::from_millis(100);

/// Whether a time-out due at `deadline`, firing now, came so late that this process, not the
/// node, was stalled ([`STALLED`]).
pub(super) fn stalled(deadline: Instant) -> bool {
    let late = Instant::now().saturating_duration_since(deadline);
    if late > STALLED {
        tracing::debug!(
            ?late,
            "redis: a time-out fired late (this process stalled): not the node's failure"
        );
        return true;
    }
    false
}

/// A breaker per node.
#[derive(Debug)]
pub(super) struct Breakers {
    failures: u32,
    cooldown: Duration,
    nodes: Mutex<HashMap<Node, Breaker>>,
    /// Some node has failures (`nodes` is not empty): while none has, nothing is locked.
    failing: AtomicBool,
    /// Nodes that sent an error reply lately, and when (at most [`MAX_NODES`]).
    replied: Mutex<HashMap<Node, Instant>>,
    /// `replied` is not empty: while it is, nothing is locked.
    replying: AtomicBool,
}

impl Breakers {
    /// Breakers that open after `failures` consecutive failures (0 = never open).
    pub(super) fn new(failures: u32, cooldown: Duration) -> Breakers {
        Breakers {
            failures,
            cooldown,
            nodes: Mutex::new(HashMap::new()),
            failing: AtomicBool::new(false),
            replied: Mutex::new(HashMap::new()),
            replying: AtomicBool::new(false),
        }
    }

    /// Whether a call to `node` may be made now (a probe, when open and cooled down).
    pub(super) fn allow(&self, node: &str) -> bool {
        !self.failing.load(Ordering::Acquire)
            || self.nodes.lock().get(node).is_none_or(Breaker::allow)
    }

    /// Records how a call to `node` went: answered (a value or an error reply), or not
    /// ([`unanswered`]); other failures (the call was never made) say nothing of the node.
    pub(super) fn answer<T>(&self, node: &Node, result: &RedisResult<T>) {
        match result {
            Err(e) if unanswered(e) => self.record(node, false),
            Err(e) if !replied(e) => {}
            Err(_) => {
                self.note_reply(node);
                self.record(node, true);
            }
            Ok(_) => self.record(node, true),
        }
    }

    /// A request's time-out passed before its call to `node` answered (`within`: the
    /// time-out): a failure of `node`, unless `node` sent an error reply within that time
    /// (the request queued behind calls that the node answered, and that were tried again).
    pub(super) fn timed_out(&self, node: &Node, within: Duration) {
        if self.replying.load(Ordering::Acquire) {
            let since = Instant::now().checked_sub(within);
            let lately = self.replied.lock().get(node).copied();
            if lately.is_some_and(|at| since.is_none_or(|since| at >= since)) {
                return;
            }
        }
        self.record(node, false);
    }

    /// Remembers that `node` sent an error reply now (forgetting replies older than a minute).
    fn note_reply(&self, node: &Node) {
        let now = Instant::now();
        let mut replied = self.replied.lock();
        if let Some(minute_ago) = now.checked_sub(Duration::from_secs(60)) {
            replied.retain(|_, at| *at >= minute_ago);
        }
        if replied.len() < MAX_NODES || replied.contains_key(node) {
            replied.insert(node.clone(), now);
        }
        self.replying.store(!replied.is_empty(), Ordering::Release);
    }

    /// Records the result of a call to `node`.
    pub(super) fn record(&self, node: &Node, ok: bool) {
        if ok && !self.failing.load(Ordering::Acquire) {
            return;
        }
        let mut nodes = self.nodes.lock();
        if ok {
            if let Some(breaker) = nodes.remove(node)
                && breaker.is_open()
            {
                tracing::info!(%node, "redis node back: circuit breaker closed");
            }
            self.failing.store(!nodes.is_empty(), Ordering::Release);
            return;
        }
        if !nodes.contains_key(node) && nodes.len() >= MAX_NODES {
            nodes.retain(|_, b| b.is_open());
            if nodes.len() >= MAX_NODES {
                self.failing.store(true, Ordering::Release);
                return;
            }
        }
        nodes
            .entry(node.clone())
            .or_insert_with(|| Breaker::new(self.failures, self.cooldown))
            .record(false, node);
        self.failing.store(true, Ordering::Release);
    }

    /// Whether no node has failures (then every call is allowed).
    pub(super) fn quiet(&self) -> bool {
        !self.failing.load(Ordering::Acquire)
    }

    /// Whether calls to some node are being refused.
    pub(super) fn any_open(&self) -> bool {
        self.failing.load(Ordering::Acquire) && self.nodes.lock().values().any(Breaker::is_open)
    }

    /// The nodes whose breaker is open, sorted.
    pub(super) fn open(&self) -> Vec<Node> {
        if !self.failing.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut open: Vec<Node> = (self.nodes.lock().iter())
            .filter(|(_, b)| b.is_open())
            .map(|(n, _)| n.clone())
            .collect();
        open.sort();
        open
    }
}

/// Whether `e` says that the node did not answer: a time-out, a refused, failed or lost
/// connection. Never a reply from the node.
pub(super) fn unanswered(e: &RedisError) -> bool {
    !replied(e)
        && (e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error())
}

/// Whether `e` is a reply from the node (an error reply, of a kind known or not).
fn replied(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

/// The breaker's state.
#[derive(Debug)]
pub(super) struct Breaker {
    failures: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go through; this many consecutive failures so far.
    Closed(u32),
    /// Calls are refused until this instant; then one probe goes through.
    Open(Instant),
}

impl Breaker {
    /// A breaker that opens after `failures` consecutive failures (0 = never opens).
    pub(super) fn new(failures: u32, cooldown: Duration) -> Breaker {
        Breaker {
            failures,
            cooldown,
            state: Mutex::new(State::Closed(0)),
        }
    }

    /// Whether a call may be made now (a probe, when open and cooled down).
    pub(super) fn allow(&self) -> bool {
        let mut state = self.state.lock();
        match *state {
            State::Closed(_) => true,
            State::Open(until) => {
                let now = Instant::now();
                if now < until {
                    return false;
                }
                *state = State::Open(now + self.cooldown);
                true
            }
        }
    }

    /// Records the result of a call to `node` (named in the log when it opens).
    pub(super) fn record(&self, ok: bool, node: &str) {
        let mut state = self.state.lock();
        *state = match (*state, ok) {
            (_, true) => State::Closed(0),
            (State::Open(_), false) => State::Open(Instant::now() + self.cooldown),
            (State::Closed(n), false) => {
                let n = n.saturating_add(1);
                if self.failures > 0 && n >= self.failures {
                    tracing::warn!(
                        %node,
                        failures = n,
                        cooldown = ?self.cooldown,
                        "redis node lost: circuit breaker open"
                    );
                    State::Open(Instant::now() + self.cooldown)
                } else {
                    State::Closed(n)
                }
            }
        };
    }

    /// Whether calls are currently being refused.
    pub(super) fn is_open(&self) -> bool {
        matches!(*self.state.lock(), State::Open(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_time_out_that_fires_late_is_a_stall_of_this_process() {
        let due = Instant::now();
        tokio::time::advance(STALLED / 2).await;
        assert!(!stalled(due), "on time, or nearly: the node's");
        tokio::time::advance(STALLED).await;
        assert!(stalled(due), "late by more than STALLED: this process's");
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_failures_probes_after_cooldown_and_closes_on_success() {
        let b = Breaker::new(2, Duration::from_millis(100));
        assert!(b.allow());
        b.record(false, "n");
        assert!(b.allow());
        b.record(false, "n");
        assert!(b.is_open());
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.allow(), "one probe");
        assert!(!b.allow(), "only one");
        b.record(false, "n");
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.allow());
        b.record(true, "n");
        assert!(!b.is_open());
        assert!(b.allow() && b.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn one_node_open_refuses_only_that_node() {
        let b = Breakers::new(2, Duration::from_millis(100));
        let (down, up): (Node, Node) = ("10.0.0.1:7000".into(), "10.0.0.2:7000".into());
        b.record(&down, false);
        b.record(&up, false);
        b.record(&down, false);
        assert!(b.any_open());
        assert!(!b.allow(&down));
        assert!(b.allow(&up), "one failure of another node refuses nothing");
        assert!(b.allow("10.0.0.3:7000"), "nor does a node never seen");
        b.record(&up, true);
        assert_eq!(b.nodes.lock().len(), 1, "a success forgets the node");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.allow(&down), "a probe after the cooldown");
        b.record(&down, true);
        assert!(!b.any_open() && b.allow(&down));
        for i in 0..MAX_NODES + 10 {
            b.record(&format!("n{i}:1").into(), false);
        }
        assert!(b.nodes.lock().len() <= MAX_NODES, "bounded");
    }

    fn reply(text: &str) -> RedisError {
        redis::parse_redis_value(text.as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[tokio::test(start_paused = true)]
    async fn replies_never_open_it_and_close_it_at_once() {
        let b = Breakers::new(1, Duration::from_secs(60));
        let node: Node = "10.0.0.1:7000".into();
        for code in [
            "CLUSTERDOWN The cluster is down",
            "TRYAGAIN x",
            "LOADING x",
            "MASTERDOWN x",
            "READONLY x",
            "ERR user_script:1: boom",
            "WEIRD an unknown code",
        ] {
            let e = reply(&format!("-{code}\r\n"));
            assert!(!unanswered(&e), "{code}");
            b.answer(&node, &Err::<(), _>(e));
            assert!(b.allow(&node) && !b.any_open(), "{code}");
        }
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let lost = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        for e in [timeout, refused, lost] {
            assert!(unanswered(&e), "{e}");
        }
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        b.answer(&node, &Err::<(), _>(timeout));
        assert!(!b.allow(&node), "open, and a minute of cooldown");
        assert_eq!(b.open(), std::slice::from_ref(&node));
        b.answer(&node, &Err::<(), _>(reply("-CLUSTERDOWN x\r\n")));
        assert!(
            b.allow(&node) && b.open().is_empty(),
            "a reply closes it at once"
        );
        let config = RedisError::from((ErrorKind::InvalidClientConfig, "never sent"));
        b.answer(&node, &Err::<(), _>(config));
        assert!(b.quiet(), "a call never made says nothing of the node");
    }

    #[tokio::test(start_paused = true)]
    async fn a_time_out_behind_replies_is_not_the_nodes() {
        let b = Breakers::new(1, Duration::from_secs(60));
        let (replying, silent): (Node, Node) = ("10.0.0.1:7000".into(), "10.0.0.2:7000".into());
        b.answer(&replying, &Err::<(), _>(reply("-CLUSTERDOWN x\r\n")));
        tokio::time::advance(Duration::from_millis(50)).await;
        b.timed_out(&replying, Duration::from_millis(100));
        assert!(b.allow(&replying), "it replied within the time-out");
        b.timed_out(&silent, Duration::from_millis(100));
        assert!(!b.allow(&silent), "no reply: a failure");
        tokio::time::advance(Duration::from_millis(100)).await;
        b.timed_out(&replying, Duration::from_millis(100));
        assert!(
            !b.allow(&replying),
            "its last reply is older than the time-out"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_probe_does_not_wedge_it_and_zero_never_opens() {
        let b = Breaker::new(1, Duration::from_millis(50));
        b.record(false, "n");
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(b.allow());
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(b.allow(), "the next probe comes one cooldown later");
        let never = Breaker::new(0, Duration::from_millis(50));
        for _ in 0..10 {
            never.record(false, "n");
        }
        assert!(never.allow());
    }
}
