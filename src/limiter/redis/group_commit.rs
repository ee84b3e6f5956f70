//! Group commit: many requests, one script call.
//!
//! Each lane (one connection of `redis.connections`) has one task that sends its calls, one at
//! a time. A request joins a lane's queue (lanes in turn); when the lane's task is idle it
//! takes the request at once (one request alone pays no delay: no timer waits for a batch);
//! while a call is in flight, the requests that arrive queue, and the next call carries all of
//! them (up to [`MAX_REQUESTS`] requests and about [`MAX_BYTES`] of arguments). The script
//! decides them one after the other in arrival order, each exactly as if alone. In a Cluster,
//! the queued requests are split by slot (each call's keys must share one) and the calls of one
//! turn go out together.
//!
//! A call that fails (time-out, lost connection, error reply) fails every request it carried,
//! each with the same error; each request then gets its own `on_error` answer from the
//! limiter. A request whose caller stopped waiting (its time-out passed while it queued) is
//! dropped before it is sent.
//!
//! # The bounds
//!
//! A Lua call runs alone in Redis: nothing else is served until it returns. Redis spends about
//! 6-12 µs of Lua per one-descriptor request (docs/BENCHMARKS.md), so a batch of 64 holds
//! Redis for well under a millisecond, a fraction of the default 100 ms time-out and of a
//! p99 at 64 in flight, and 64 requests in flight spread over the lanes make batches far
//! smaller than that. 64 KiB of arguments (about 700 one-descriptor or 70 ten-descriptor
//! requests) keeps a call within a few TCP segments' worth of a socket buffer; only requests
//! with many descriptors reach it before the count.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use super::connection::Connector;
use super::script::{self, Functions, Mode, Part, Unit};
use crate::limiter::{BatchOutcome, Hit};

/// The most requests one call carries.
pub const MAX_REQUESTS: usize = 64;

/// About the most bytes of arguments one call carries (a single larger request goes alone).
pub const MAX_BYTES: usize = 64 * 1024;

/// What every lane's task needs.
pub struct Shared {
    pub connector: Connector,
    pub functions: Functions,
    pub prefix: Vec<u8>,
    /// How long one call may take.
    pub timeout: Duration,
}

/// One request, queued for a call.
struct Job {
    hits: Vec<Hit>,
    mode: Mode,
    unit: Unit,
    now_micros: Option<u64>,
    /// The Cluster slot of its keys (one call per slot).
    slot: Option<Slot>,
    size: usize,
    reply: oneshot::Sender<RedisResult<BatchOutcome>>,
}

impl Job {
    /// Whether `other` can share this job's call.
    fn joins(&self, other: &Job) -> bool {
        self.slot == other.slot && self.now_micros == other.now_micros && self.unit == other.unit
    }
}

/// The lanes, started on first use (they need the runtime).
pub struct GroupCommit {
    shared: Arc<Shared>,
    lanes: OnceLock<Vec<mpsc::UnboundedSender<Job>>>,
    tasks: OnceLock<Vec<AbortHandle>>,
    next: AtomicUsize,
}

/// One request for [`GroupCommit::submit`].
pub struct Request {
    pub hits: Vec<Hit>,
    pub mode: Mode,
    pub unit: Unit,
    pub now_micros: Option<u64>,
    pub slot: Option<Slot>,
}

impl GroupCommit {
    pub fn new(shared: Shared) -> GroupCommit {
        GroupCommit {
            shared: Arc::new(shared),
            lanes: OnceLock::new(),
            tasks: OnceLock::new(),
            next: AtomicUsize::new(0),
        }
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Decides `request` in the next call of a lane, as if alone.
    pub async fn submit(&self, request: Request) -> RedisResult<BatchOutcome> {
        let lanes = self.lanes.get_or_init(|| self.start());
        let lane = self.next.fetch_add(1, Ordering::Relaxed) % lanes.len().max(1);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            size: script::encoded_size(&request.hits, &self.shared.prefix),
            hits: request.hits,
            mode: request.mode,
            unit: request.unit,
            now_micros: request.now_micros,
            slot: request.slot,
            reply,
        };
        let sent = lanes.get(lane).map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            return Err(dropped("no lane to send it on"));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(dropped("the call carrying it was dropped")))
    }

    fn start(&self) -> Vec<mpsc::UnboundedSender<Job>> {
        let (senders, tasks): (Vec<_>, Vec<_>) = (0..self.shared.connector.lanes())
            .map(|lane| {
                let (tx, rx) = mpsc::unbounded_channel();
                let task = tokio::spawn(drive(self.shared.clone(), lane, rx));
                (tx, task.abort_handle())
            })
            .unzip();
        let _ = self.tasks.set(tasks);
        senders
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        for task in self.tasks.get().into_iter().flatten() {
            task.abort();
        }
    }
}

fn dropped(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("redis request not decided: {what}"),
    ))
}

/// A lane's task: one call at a time, carrying every request queued meanwhile.
async fn drive(shared: Arc<Shared>, lane: usize, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        if first.reply.is_closed() {
            continue;
        }
        let mut bytes = first.size;
        let mut jobs = vec![first];
        while jobs.len() < MAX_REQUESTS {
            let Ok(job) = queue.try_recv() else { break };
            if job.reply.is_closed() {
                continue;
            }
            if bytes + job.size > MAX_BYTES {
                carried = Some(job);
                break;
            }
            bytes += job.size;
            jobs.push(job);
        }
        run(&shared, lane, jobs).await;
    }
}

/// One turn of a lane: the jobs as few calls as their slots allow, sent together.
async fn run(shared: &Shared, lane: usize, jobs: Vec<Job>) {
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
    join_all(calls.into_iter().map(|jobs| call(shared, lane, jobs))).await;
}

/// One script call for `jobs` (all of one slot, clock and unit); answers each.
async fn call(shared: &Shared, lane: usize, jobs: Vec<Job>) {
    let Some(head) = jobs.first() else { return };
    let parts: Vec<Part<'_>> = jobs
        .iter()
        .map(|j| Part {
            hits: &j.hits,
            mode: j.mode,
        })
        .collect();
    let via = shared.functions.via();
    let call = script::encode(&parts, &shared.prefix, head.unit, head.now_micros, via);
    let result = match tokio::time::timeout(shared.timeout, send(shared, lane, &call)).await {
        Ok(result) => result,
        Err(_) => {
            shared.connector.timed_out(lane);
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:?}", shared.timeout),
            )))
        }
    };
    match result.and_then(|reply| script::decode(reply, &call)) {
        Ok(outcomes) => {
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                let _ = job.reply.send(Ok(outcome));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

async fn send(shared: &Shared, lane: usize, call: &script::Call) -> RedisResult<Value> {
    let reply = match shared.connector.get(lane).await {
        Ok(mut conn) => script::invoke(&mut conn, call, &shared.functions).await,
        Err(e) => Err(e),
    };
    reply.inspect_err(|e| shared.connector.failed(lane, e))
}
