//! Group commit: many requests, one script call.
//!
//! Each lane (one connection of `redis.connections`; in a Cluster, one per master, each master
//! with lanes of its own) has at most one script call in flight.
//! A request picks a lane (in turn). When the lane is idle, the request leads: it queues, and
//! under a gathering poll (`crate::limiter::gathering`: its gRPC connection's task polling
//! the streams decoded from one read) it yields once, so that the requests polled in the same
//! pass queue behind it; then it sends one call for everything queued, from its own task. One
//! request alone thus goes at once (after one more round of that poll), with no hand-off to
//! another task; no timer waits for a batch. While a call is in flight, the requests that
//! arrive queue; when it returns, the lane's task sends the next call, carrying all of them
//! (up to [`MAX_REQUESTS`] requests and about [`MAX_BYTES`] of arguments; it hands that call
//! to the connection before it answers the requests of the call that returned), and so on
//! until the queue is empty. The script decides them one after the other in arrival order,
//! each exactly as if alone. In a Cluster, the queued requests are split by slot (each call's
//! keys must share one) and the calls of one turn go out together. A lease's renewal ("give
//! back the old lease, take a new one", `super::lease`) is one request of a call like any
//! other, so renewals on many keys share calls with each other and with the requests.
//!
//! In a Cluster, a call follows the Cluster's redirections and transient errors within the
//! time-out (`super::redirect`), whole: every request of it goes where the slot is. A call that
//! fails (time-out, lost connection, error reply) fails every request it carried, each with the
//! same error, and tells its node's breaker whether the node answered; each request then gets
//! its own `on_error` answer from the limiter. A request whose caller stopped waiting (its time-out passed while it queued)
//! is dropped before it is sent.
//!
//! # The bounds
//!
//! A Lua call runs alone in Redis: nothing else is served until it returns. Redis spends about
//! 6-12 µs of Lua per one-descriptor request (docs/BENCHMARKS.md), so a batch of 64 holds
//! Redis for well under a millisecond, a fraction of the default 100 ms time-out and of a
//! p99 at 64 in flight, and 64 requests in flight spread over the lanes make batches far
//! smaller than that. 64 KiB of arguments (about 600 one-descriptor or 60 ten-descriptor
//! requests) keeps a call within a few TCP segments' worth of a socket buffer; only requests
//! with many descriptors reach it before the count.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::join_all;
use parking_lot::Mutex;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::connection::Connector;
use super::redirect;
use super::script::{self, Functions, Mode, Part, Unit};
use super::topology::Node;
use crate::limiter::Hit;

/// The most requests one call carries.
pub(super) const MAX_REQUESTS: usize = 64;

/// About the most bytes of arguments one call carries (a single larger request goes alone).
pub(super) const MAX_BYTES: usize = 64 * 1024;

/// What every lane's task needs.
pub(super) struct Shared {
    pub connector: Connector,
    pub functions: Functions,
    pub prefix: Vec<u8>,
    /// How long one call may take.
    pub timeout: Duration,
    /// `redis.wait_replicas`: what to wait for after each call.
    pub wait: Option<super::replication::Wait>,
    /// Cluster redirections and transient errors followed (`MOVED`, `ASK`, `TRYAGAIN`,
    /// `CLUSTERDOWN`, ...): attempts after the first.
    pub redirects: redirect::Followed,
    /// The nodes' breakers: each call tells its node's whether the node answered.
    pub breakers: Arc<super::breaker::Breakers>,
}

/// What a request's call came to: its outcome, or a lease request's reply.
pub(super) struct Answer {
    pub result: RedisResult<script::Decided>,
}

/// One request, queued for a call.
struct Job {
    hits: Vec<Hit>,
    mode: Mode,
    unit: Unit,
    now_micros: Option<u64>,
    /// The limiter's clock when it was submitted (calendar windows are computed from it).
    clock_nanos: u64,
    /// The Cluster slot of its keys (one call per slot).
    slot: Option<u16>,
    size: usize,
    reply: oneshot::Sender<Answer>,
}

impl Job {
    /// Whether `other` can share this job's call.
    fn joins(&self, other: &Job) -> bool {
        self.slot == other.slot && self.now_micros == other.now_micros && self.unit == other.unit
    }
}

/// One connection's queue.
#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
    /// Tells the lane's task that requests queued behind a call that has returned.
    wake: Notify,
}

#[derive(Default)]
struct LaneState {
    /// A call is in flight (or about to be sent) on this lane.
    busy: bool,
    queue: VecDeque<Job>,
}

impl Lane {
    /// The next call's jobs, at most the bounds; none (and the lane idle) when nothing queued.
    fn next_jobs(&self) -> Vec<Job> {
        let mut state = self.state.lock();
        let mut jobs = Vec::new();
        let mut bytes = 0;
        while jobs.len() < MAX_REQUESTS {
            let Some(job) = state.queue.pop_front() else {
                break;
            };
            if job.reply.is_closed() {
                continue;
            }
            if !jobs.is_empty() && bytes + job.size > MAX_BYTES {
                state.queue.push_front(job);
                break;
            }
            bytes += job.size;
            jobs.push(job);
        }
        if jobs.is_empty() {
            state.busy = false;
        }
        jobs
    }
}

/// Held by a request sending its own call on an idle lane: when it is done (or its caller
/// stops waiting), the lane goes idle, or its task sends what queued meanwhile.
struct Leading<'a>(&'a Lane);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        if state.queue.is_empty() {
            state.busy = false;
        } else {
            drop(state);
            self.0.wake.notify_one();
        }
    }
}

/// Ready at its second poll: the first asks for another one at once (in a connection's task,
/// another round of its poll, after the streams already ready).
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The lanes, per node; their tasks start on first use (they need the runtime).
pub(super) struct GroupCommit {
    shared: Arc<Shared>,
    /// Per node its own lanes (`None`: the deployment's one node, or a Cluster slot whose
    /// master is not known yet), so that a node slow to answer or gone holds up no call to
    /// another: at most [`MAX_NODES`] sets, then the others share `None`'s. Read without a
    /// lock; replaced whole when a node is added.
    nodes: ArcSwap<HashMap<Option<Node>, Arc<Lanes>>>,
    /// Held while adding a node.
    adding: Mutex<()>,
    next: AtomicUsize,
}

/// The most nodes with lanes of their own.
pub(super) const MAX_NODES: usize = 1024;

/// A node's lanes and their tasks, stopped when dropped.
struct Lanes {
    lanes: Vec<Arc<Lane>>,
    tasks: Vec<AbortHandle>,
}

impl Lanes {
    fn start(shared: &Arc<Shared>) -> Lanes {
        let lanes: Vec<Arc<Lane>> = (0..shared.connector.lanes().max(1))
            .map(|_| Arc::new(Lane::default()))
            .collect();
        let tasks = lanes
            .iter()
            .enumerate()
            .map(|(index, lane)| tokio::spawn(drive(shared.clone(), index, lane.clone())))
            .map(|task| task.abort_handle())
            .collect();
        Lanes { lanes, tasks }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// One request for [`GroupCommit::submit`].
pub(super) struct Request {
    pub hits: Vec<Hit>,
    pub mode: Mode,
    pub unit: Unit,
    pub now_micros: Option<u64>,
    /// The limiter's clock, in nanoseconds (calendar windows are computed from it).
    pub clock_nanos: u64,
    pub slot: Option<u16>,
    /// The node it is for, when known (it picks the lanes).
    pub node: Option<Node>,
}

impl GroupCommit {
    pub(super) fn new(shared: Shared) -> GroupCommit {
        GroupCommit {
            shared: Arc::new(shared),
            nodes: ArcSwap::default(),
            adding: Mutex::new(()),
            next: AtomicUsize::new(0),
        }
    }

    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// `node`'s lanes, started now if it has none yet.
    fn lanes(&self, node: Option<Node>) -> Arc<Lanes> {
        if let Some(lanes) = self.nodes.load().get(&node) {
            return lanes.clone();
        }
        let _adding = self.adding.lock();
        let nodes = self.nodes.load_full();
        let key = if nodes.len() >= MAX_NODES { None } else { node };
        if let Some(lanes) = nodes.get(&key) {
            return lanes.clone();
        }
        let lanes = Arc::new(Lanes::start(&self.shared));
        let mut more = (*nodes).clone();
        more.insert(key, lanes.clone());
        self.nodes.store(Arc::new(more));
        lanes
    }

    /// Decides `request` in the next call of a lane of its node, as if alone.
    pub(super) async fn submit(&self, request: Request) -> Answer {
        let lanes = self.lanes(request.node);
        let index = self.next.fetch_add(1, Ordering::Relaxed) % lanes.lanes.len().max(1);
        let Some(lane) = lanes.lanes.get(index) else {
            return Answer {
                result: Err(dropped("no lane to send it on")),
            };
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            size: script::encoded_size(&request.hits, &self.shared.prefix),
            hits: request.hits,
            mode: request.mode,
            unit: request.unit,
            now_micros: request.now_micros,
            clock_nanos: request.clock_nanos,
            slot: request.slot,
            reply,
        };
        let lead = {
            let mut state = lane.state.lock();
            state.queue.push_back(job);
            !std::mem::replace(&mut state.busy, true)
        };
        if lead {
            let _leading = Leading(lane);
            // Under a gathering poll (a connection's task polling its streams), the requests
            // polled in the same pass (the others decoded from the same read of the
            // connection) queue behind this one before it sends: its call carries them all.
            // One more round of that poll, not a timer: alone, it goes at once. Elsewhere
            // (a stream on a task of its own) it sends at once.
            if crate::limiter::gathering::gathering() {
                YieldOnce(false).await;
            }
            let jobs = lane.next_jobs();
            // Boxed: a call's future (encoding, sending, retrying by script) is about 4 KiB,
            // which would otherwise be part of every request's future, and be copied with it
            // each time that future moves, though most requests never lead a call.
            Box::pin(join_all(
                split(jobs)
                    .into_iter()
                    .map(|jobs| call(&self.shared, index, jobs)),
            ))
            .await;
        }
        answer.await.unwrap_or_else(|_| Answer {
            result: Err(dropped("the call carrying it was dropped")),
        })
    }
}

fn dropped(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("redis request not decided: {what}"),
    ))
}

/// A lane's task: woken when requests queued behind a call, it sends them, as few calls as
/// their slots allow, until none is left. When a turn's calls return, the next turn (what
/// queued meanwhile) is handed to the connection before the returned requests are answered,
/// so that Redis works on the next calls while sluice decodes and answers the last ones.
async fn drive(shared: Arc<Shared>, index: usize, lane: Arc<Lane>) {
    loop {
        lane.wake.notified().await;
        let mut returned: Vec<Exchanged> = Vec::new();
        loop {
            let jobs = lane.next_jobs();
            if jobs.is_empty() {
                answer_all(returned);
                break;
            }
            let turn = join_all(
                split(jobs)
                    .into_iter()
                    .map(|jobs| exchange(&shared, index, jobs)),
            );
            let mut turn = std::pin::pin!(turn);
            // One poll encodes the turn's calls and hands them to their connections.
            let first = std::future::poll_fn(|cx| Poll::Ready(turn.as_mut().poll(cx))).await;
            answer_all(std::mem::take(&mut returned));
            returned = match first {
                Poll::Ready(done) => done,
                Poll::Pending => turn.await,
            };
        }
    }
}

/// A turn's jobs, grouped into as few calls as their slots allow.
fn split(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut calls: Vec<Vec<Job>> = Vec::new();
    for job in jobs {
        match calls
            .iter_mut()
            .find(|c| c.first().is_some_and(|j| j.joins(&job)))
        {
            Some(call) => call.push(job),
            None => calls.push(vec![job]),
        }
    }
    calls
}

/// A call that returned: its jobs, the call, and Redis's reply (or the failure).
struct Exchanged {
    jobs: Vec<Job>,
    call: Option<script::Call>,
    reply: RedisResult<Value>,
}

/// One script call for `jobs` (all of one slot, clock and unit); answers each.
async fn call(shared: &Shared, lane: usize, jobs: Vec<Job>) {
    answer(exchange(shared, lane, jobs).await);
}

/// Sends one script call for `jobs` (all of one slot, clock and unit) and waits for its reply.
async fn exchange(shared: &Shared, lane: usize, jobs: Vec<Job>) -> Exchanged {
    let Some(head) = jobs.first() else {
        return Exchanged {
            jobs,
            call: None,
            reply: Ok(Value::Nil),
        };
    };
    let parts: Vec<Part<'_>> = jobs
        .iter()
        .map(|j| Part {
            hits: &j.hits,
            mode: j.mode,
        })
        .collect();
    let via = shared.functions.via();
    let call = script::encode(
        &parts,
        &shared.prefix,
        head.unit,
        (head.now_micros, head.clock_nanos),
        via,
    );
    let slot = head.slot;
    drop(parts);
    let mut node = None;
    let deadline = Instant::now() + shared.timeout;
    let sent = send(shared, lane, slot, &call, deadline, &mut node);
    let reply = match tokio::time::timeout(shared.timeout, sent).await {
        Ok(result) => result,
        Err(_) => {
            shared.connector.timed_out(lane);
            // The attempt in flight was dropped before it could tell its node's breaker; a
            // time-out that fired late was this process's stall, not the node's.
            if let Some(node) = &node
                && !super::breaker::stalled(deadline)
            {
                shared.breakers.record(node, false);
            }
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:?}", shared.timeout),
            )))
        }
    };
    Exchanged {
        jobs,
        call: Some(call),
        reply,
    }
}

fn answer_all(returned: Vec<Exchanged>) {
    for exchanged in returned {
        answer(exchanged);
    }
}

/// Gives each job of a returned call its outcome, or the call's failure.
fn answer(exchanged: Exchanged) {
    let Exchanged { jobs, call, reply } = exchanged;
    let Some(call) = call else { return };
    let give = |job: Job, result| {
        let _ = job.reply.send(Answer { result });
    };
    match reply.and_then(|reply| script::decode_all(reply, &call)) {
        Ok(outcomes) => {
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                give(job, Ok(outcome));
            }
        }
        Err(e) => {
            for job in jobs {
                give(job, Err(e.clone()));
            }
        }
    }
}

/// Sends `call` (of `slot`, in a Cluster) and waits for its reply, following the Cluster until
/// `deadline`; `at` is the node it last went to. Every command that names a key goes this way:
/// a batch's script call, a hold's, a reset's `DEL`.
pub(super) async fn send<E: redirect::Exchange>(
    shared: &Shared,
    lane: usize,
    slot: Option<u16>,
    call: &E,
    deadline: Instant,
    at: &mut Option<Node>,
) -> RedisResult<Value> {
    if let (Some(topology), Some(slot)) = (shared.connector.topology(), slot) {
        return redirect::send(shared, topology, lane, slot, call, deadline, at).await;
    }
    *at = shared.connector.node(None);
    let reply = match shared.connector.get(lane).await {
        Ok(mut conn) => call.exchange(&mut conn, shared).await,
        Err(e) => Err(e),
    };
    // Sentinel: the master it connected to.
    *at = shared.connector.node(None);
    if let Some(node) = at.as_ref() {
        shared.breakers.answer(node, &reply);
    }
    reply.inspect_err(|e| shared.connector.failed(lane, e))
}
