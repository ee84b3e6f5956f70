//! A script call on a Redis Cluster, following the Cluster wherever it says the slot is, within
//! the call's time-out, and never running the script twice.
//!
//! The call goes to the master of its slot by sluice's map ([`Topology`]). When the answer is
//! an error that means the script did not run on that node, the call goes again:
//!
//! | answer | next attempt |
//! |---|---|
//! | `MOVED <slot> <node>` (the slot has a new master) | at once, to that node; the map is refreshed |
//! | `ASK <slot> <node>` (the slot is migrating, the key is already there) | at once, to that node, after `ASKING` on the same connection (one write, so no other call comes between) |
//! | `TRYAGAIN` (a migration split the call's keys) | after a short pause, to the master, a few times |
//! | `CLUSTERDOWN`, `READONLY`, `MASTERDOWN`, `LOADING` (a failover under way, or a node that is not the slot's master now) | after a pause, to the master by a refreshed map |
//! | no connection could be made (refused, timed out: nothing was sent) | the same |
//!
//! Each attempt tells its node's breaker whether the node answered
//! ([`super::breaker::Breakers::answer`]): every reply in the table is an answer from a live
//! node, so none of them opens a breaker, however long the Cluster refuses; only a connection
//! that could not be made or was lost, or no answer in time, counts against the node.
//!
//! A batch is one slot, so it goes whole: an `ASK` sends every request of it to the target.
//! What is sent is an [`Exchange`]: a batch's script call, and as well every other command that
//! names a key (a hold's script call, a reset's `DEL`), so that they all follow the Cluster the
//! same way. Any other failure is final: a time-out or a connection lost after the call was
//! written may have run the script, so retrying it could decide its requests twice. The pauses
//! grow from [`FIRST_PAUSE`] to [`MAX_PAUSE`] and are never taken past the time-out (leaving
//! room for one more answer); the last error is then the call's, and its requests get their
//! `on_error` answer.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value};
use tokio::time::Instant;

use super::group_commit::Shared;
use super::replication;
use super::script::Call;
use super::topology::{Node, Topology};

/// The first pause before trying again after `TRYAGAIN`, `CLUSTERDOWN` or an unreachable node.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(5);

/// The longest pause between two attempts. It bounds how long a call waiting out a refusal
/// (`CLUSTERDOWN` under full coverage) goes on waiting once the node serves again: a request
/// whose time-out falls in that pause fails though the node serves (at 50 ms, such failures
/// were answered up to about 50 ms after the node said `cluster_state:ok`, plus the machine's
/// scheduling delays).
pub(super) const MAX_PAUSE: Duration = Duration::from_millis(20);

/// Attempts of one call at most, whatever the time-out (a redirection loop between nodes that
/// disagree ends there): at [`MAX_PAUSE`], about 1.2 s of refusals.
pub(super) const MAX_ATTEMPTS: u32 = 64;

/// What one attempt writes on a node's connection (the one of the key's slot, preceded by
/// `ASKING` after an `ASK`), and the reply it reads.
pub(super) trait Exchange: Sync {
    fn exchange<'a, C: ConnectionLike + Send>(
        &'a self,
        conn: &'a mut C,
        shared: &'a Shared,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a;
}

/// A batch's script call, then `WAIT` for the replicas when `redis.wait_replicas` asks.
impl Exchange for Call {
    fn exchange<'a, C: ConnectionLike + Send>(
        &'a self,
        conn: &'a mut C,
        shared: &'a Shared,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        replication::invoke(conn, self, &shared.functions, shared.wait.as_ref())
    }
}

/// Another script's call (`EVALSHA`, `EVAL` when the node lacks it), then `WAIT` for the
/// replicas like a batch's.
impl Exchange for redis::ScriptInvocation<'_> {
    async fn exchange<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        shared: &Shared,
    ) -> RedisResult<Value> {
        let reply = self.invoke_async(conn).await;
        if let (Ok(_), Some(wait)) = (&reply, shared.wait.as_ref()) {
            wait.after(conn).await;
        }
        reply
    }
}

/// One command (of one key's slot).
impl Exchange for Cmd {
    fn exchange<'a, C: ConnectionLike + Send>(
        &'a self,
        conn: &'a mut C,
        _: &'a Shared,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        self.query_async(conn)
    }
}

/// Attempts after a call's first, by why they were made.
#[derive(Debug, Default)]
pub(super) struct Followed {
    /// After a `MOVED`, to the node it named.
    moved: AtomicU64,
    /// After an `ASK`, to the node it named.
    ask: AtomicU64,
    /// Again to the slot's master (`TRYAGAIN`, `CLUSTERDOWN`, ..., or nothing was sent).
    again: AtomicU64,
}

impl Followed {
    fn count(&self, hop: &Hop) {
        let counter = match hop {
            Hop::Moved(_) => &self.moved,
            Hop::Ask(_) => &self.ask,
            Hop::Owner => &self.again,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Every attempt after a call's first.
    pub(super) fn total(&self) -> u64 {
        self.moved() + self.ask() + self.again.load(Ordering::Relaxed)
    }

    /// `MOVED` redirections followed.
    pub(super) fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// `ASK` redirections followed.
    pub(super) fn ask(&self) -> u64 {
        self.ask.load(Ordering::Relaxed)
    }
}

/// Where an attempt goes.
#[derive(Debug, Clone, PartialEq)]
enum Hop {
    /// The slot's master by the map.
    Owner,
    /// The node a `MOVED` named.
    Moved(Node),
    /// The node an `ASK` named, after `ASKING`.
    Ask(Node),
}

/// What a failed attempt allows.
#[derive(Debug, PartialEq)]
enum Next {
    /// The script did not run: go to `Hop`, after a pause when `true`.
    Again(Hop, bool),
    /// It may have run, or trying again would not help.
    Fail,
}

/// Sends `call` (of `slot`) on lane `lane`, following the Cluster until `deadline`. `at` is
/// the node the last attempt went to (the one to blame for a failure).
pub(super) async fn send<E: Exchange>(
    shared: &Shared,
    topology: &Topology,
    lane: usize,
    slot: u16,
    call: &E,
    deadline: Instant,
    at: &mut Option<Node>,
) -> RedisResult<Value> {
    let mut hop = Hop::Owner;
    let mut pause = FIRST_PAUSE;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (sent, result) = attempt(shared, topology, lane, slot, &hop, call, at).await;
        let err = match result {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        if stale(&err, sent) {
            topology.stale();
        }
        let Next::Again(to, wait) = next(&err, sent, at.as_deref()) else {
            return Err(err);
        };
        if attempts >= MAX_ATTEMPTS {
            return Err(err);
        }
        // Two `MOVED` in a row: nodes that disagree (a change under way); not at full speed.
        let moved_again = matches!((&hop, &to), (Hop::Moved(_), Hop::Moved(_)));
        if wait || moved_again {
            // Room for the pause and for the next attempt's answer: a call that ends on a
            // reply is not cut by the time-out (which would count against the node).
            if Instant::now() + pause * 2 >= deadline {
                return Err(err);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
        tracing::debug!(error = %err, ?to, "redis cluster: trying the call again");
        shared.redirects.count(&to);
        hop = to;
    }
}

/// One attempt: whether anything was sent, and the answer.
async fn attempt<E: Exchange>(
    shared: &Shared,
    topology: &Topology,
    lane: usize,
    slot: u16,
    hop: &Hop,
    call: &E,
    at: &mut Option<Node>,
) -> (bool, RedisResult<Value>) {
    let node = match hop {
        Hop::Owner => match topology.owner(slot).await {
            Ok(node) => node,
            Err(e) => return (false, Err(e)),
        },
        Hop::Moved(node) | Hop::Ask(node) => node.clone(),
    };
    *at = Some(node.clone());
    let conn = match topology.conn(&node, lane).await {
        Ok(conn) => conn,
        Err(e) => {
            shared.breakers.answer(&node, &Err::<(), _>(e.clone()));
            return (false, Err(e));
        }
    };
    let result = match hop {
        Hop::Ask(_) => call.exchange(&mut Asking(conn), shared).await,
        _ => call.exchange(&mut { conn }, shared).await,
    };
    shared.breakers.answer(&node, &result);
    if let Err(e) = &result
        && lost(e)
    {
        topology.forget(&node, lane);
    }
    (true, result)
}

/// Whether `e` leaves the connection unusable.
fn lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

/// Whether `err` (`sent`: something was written) says that the slot map is out of date: the
/// slot has moved, the node is unreachable, or a failover is under way.
fn stale(err: &RedisError, sent: bool) -> bool {
    !sent
        || matches!(
            err.kind(),
            redis::ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
            )
        )
}

/// What may follow `err` of an attempt on node `at` (`sent`: something was written).
fn next(err: &RedisError, sent: bool, at: Option<&str>) -> Next {
    if !sent {
        return Next::Again(Hop::Owner, true);
    }
    let redirect = || {
        let (node, _) = err.redirect_node()?;
        Some(redirected(node, at))
    };
    match err.kind() {
        redis::ErrorKind::Server(ServerErrorKind::Moved) => match redirect() {
            Some(node) => Next::Again(Hop::Moved(node), false),
            None => Next::Again(Hop::Owner, true),
        },
        redis::ErrorKind::Server(ServerErrorKind::Ask) => match redirect() {
            Some(node) => Next::Again(Hop::Ask(node), false),
            None => Next::Fail,
        },
        redis::ErrorKind::Server(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        ) => Next::Again(Hop::Owner, true),
        _ => Next::Fail,
    }
}

/// A redirection's node; `:port` (a node that does not know its address) is on `at`'s host.
fn redirected(node: &str, at: Option<&str>) -> Node {
    match (node.strip_prefix(':'), at.and_then(|a| a.rsplit_once(':'))) {
        (Some(port), Some((host, _))) => format!("{host}:{port}").into(),
        _ => node.into(),
    }
}

/// A node's connection on which every command is preceded by `ASKING`, written together.
struct Asking(MultiplexedConnection);

impl ConnectionLike for Asking {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut pipeline = Pipeline::new();
            pipeline.cmd("ASKING").add_command(cmd.clone());
            let mut replies = self.0.req_packed_commands(&pipeline, 1, 1).await?;
            replies
                .pop()
                .ok_or_else(|| RedisError::from((redis::ErrorKind::Parse, "no reply after ASKING")))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut pipeline = Pipeline::new();
            pipeline.cmd("ASKING");
            for c in cmd.cmd_iter() {
                pipeline.add_command(c.clone());
            }
            self.0
                .req_packed_commands(&pipeline, offset + 1, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> RedisError {
        redis::parse_redis_value(text.as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn only_what_did_not_run_goes_again() {
        let at = Some("10.0.0.1:7000");
        let moved = reply("-MOVED 3999 10.0.0.2:7001\r\n");
        assert_eq!(
            next(&moved, true, at),
            Next::Again(Hop::Moved("10.0.0.2:7001".into()), false)
        );
        let ask = reply("-ASK 3999 :7002\r\n");
        assert_eq!(
            next(&ask, true, at),
            Next::Again(Hop::Ask("10.0.0.1:7002".into()), false),
            "a node without its address is on the host that answered"
        );
        for code in [
            "TRYAGAIN x",
            "CLUSTERDOWN The cluster is down",
            "READONLY x",
            "LOADING x",
        ] {
            let e = reply(&format!("-{code}\r\n"));
            assert_eq!(next(&e, true, at), Next::Again(Hop::Owner, true), "{code}");
            let moves = !code.starts_with("TRYAGAIN") && !code.starts_with("LOADING");
            assert_eq!(stale(&e, true), moves, "{code}");
        }
        assert!(stale(&moved, true) && !stale(&ask, true));
        let lost = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(next(&lost, true, at), Next::Fail, "it may have run");
        assert_eq!(
            next(&lost, false, at),
            Next::Again(Hop::Owner, true),
            "nothing was sent"
        );
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(next(&timeout, true, at), Next::Fail);
        let script = reply("-ERR user_script:1: boom\r\n");
        assert_eq!(next(&script, true, at), Next::Fail);
        assert_eq!(next(&reply("-NOSCRIPT x\r\n"), true, at), Next::Fail);
    }
}
