//! A Redis Cluster as sluice sees it: which master serves each slot, and connections to each
//! master, one per lane, made on first use.
//!
//! The slot map comes from `CLUSTER SLOTS`, asked of a few known nodes at once (the first
//! answer wins, so a dead or hung node delays nothing; the next refresh asks the next ones).
//! It is refreshed when a call finds it stale (a `MOVED`, a node that cannot be reached,
//! `CLUSTERDOWN`) or a master's breaker refuses a request, at most once per
//! [`REFRESH_EVERY`], by a task of its own: a refresh never holds up calls to other nodes,
//! which go on with the map they have. A call to a node needs only that node: connecting to
//! one that is down fails that call alone.
//!
//! The map and the connections are bounded by the Cluster's size: nodes that are neither in
//! the map nor seeds lose their connections at each refresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::select_ok;
use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo as _,
    RedisConnectionInfo, RedisError, RedisResult, Value,
};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::connection::{Timeouts, Tls};
use super::slots::{SLOTS, SlotMap, parse_slots, split};

/// A node's address, `host:port`, as the Cluster gives it.
pub(super) type Node = Arc<str>;

/// The least time between two refreshes of the slot map.
pub(super) const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The nodes a refresh (or a probe) asks at once; the next one asks the next ones.
pub(super) const FANOUT: usize = 5;

/// A lane's connection to one node.
#[derive(Default)]
struct Lane {
    cached: Mutex<Option<MultiplexedConnection>>,
    /// Held while connecting, so that one call connects and the others wait for it.
    connecting: tokio::sync::Mutex<()>,
}

/// The Cluster: its slot map, its nodes' connections, and the task that refreshes the map.
pub(crate) struct Topology {
    inner: Arc<Inner>,
    refresher: OnceLock<AbortHandle>,
}

struct Inner {
    seeds: Vec<Node>,
    /// How to reach a node: credentials and TLS; the address is replaced per node.
    template: ConnectionInfo,
    config: AsyncConnectionConfig,
    lanes: usize,
    map: ArcSwap<SlotMap>,
    nodes: Mutex<HashMap<Node, Arc<[Lane]>>>,
    /// Asks the refresher for a refresh.
    stale: Notify,
    /// Counts the refreshes tried, for those waiting for the next one.
    refreshed: watch::Sender<u64>,
    /// Turns of [`Inner::some`], so that each asks other nodes.
    turn: AtomicUsize,
}

impl Topology {
    /// The Cluster whose seed nodes are `hosts`; no I/O until the first call.
    pub(crate) fn new(
        hosts: &[(String, u16)],
        user: Option<&str>,
        password: Option<&str>,
        tls: Option<&Tls>,
        timeouts: Timeouts,
        lanes: usize,
    ) -> RedisResult<Topology> {
        let (host, port) = hosts
            .first()
            .cloned()
            .ok_or_else(|| RedisError::from((redis::ErrorKind::InvalidClientConfig, "no seed")))?;
        let mut redis = RedisConnectionInfo::default();
        if let Some(user) = user {
            redis = redis.set_username(user);
        }
        if let Some(password) = password {
            redis = redis.set_password(password);
        }
        let addr = match tls {
            Some(_) => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
            None => ConnectionAddr::Tcp(host, port),
        };
        let info = addr.into_connection_info()?.set_redis_settings(redis);
        let mut template = match tls.and_then(Tls::certificates) {
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone())?
                .get_connection_info()
                .clone(),
            None => info,
        };
        if tls.is_some_and(Tls::skips_hostname_verification) {
            let mut addr = template.addr().clone();
            addr.set_danger_accept_invalid_hostnames(true);
            template = template.set_addr(addr);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        let inner = Inner {
            seeds: hosts
                .iter()
                .map(|(h, p)| format!("{h}:{p}").into())
                .collect(),
            template,
            config,
            lanes: lanes.max(1),
            map: ArcSwap::default(),
            nodes: Mutex::default(),
            stale: Notify::new(),
            refreshed: watch::Sender::new(0),
            turn: AtomicUsize::new(0),
        };
        Ok(Topology {
            inner: Arc::new(inner),
            refresher: OnceLock::new(),
        })
    }

    /// The master that serves `slot` by the current map, if known.
    pub(crate) fn owner_now(&self, slot: u16) -> Option<Node> {
        self.inner.map.load().owner(slot).cloned()
    }

    /// The master that serves `slot`; when the map does not say, asks for a refresh and waits
    /// for it (the caller bounds the wait).
    pub(crate) async fn owner(&self, slot: u16) -> RedisResult<Node> {
        if let Some(node) = self.owner_now(slot) {
            return Ok(node);
        }
        let mut refreshed = self.inner.refreshed.subscribe();
        refreshed.mark_unchanged();
        self.stale();
        let _ = refreshed.changed().await;
        self.owner_now(slot).ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Io,
                "no Cluster node is known to serve the slot",
                format!("slot {slot}"),
            ))
        })
    }

    /// The masters of the current map.
    pub(crate) fn masters(&self) -> Vec<Node> {
        self.inner.map.load().masters().to_vec()
    }

    /// Asks for the slot map to be refreshed (at most once per [`REFRESH_EVERY`]).
    pub(crate) fn stale(&self) {
        self.refresher
            .get_or_init(|| tokio::spawn(refresher(self.inner.clone())).abort_handle());
        self.inner.stale.notify_one();
    }

    /// Lane `lane`'s connection to `node`: the cached one, or a new one. An error means that
    /// nothing was sent.
    pub(crate) async fn conn(
        &self,
        node: &Node,
        lane: usize,
    ) -> RedisResult<MultiplexedConnection> {
        self.inner.conn(node, lane).await
    }

    /// Forgets lane `lane`'s connection to `node` (it failed; the next call connects again).
    pub(crate) fn forget(&self, node: &Node, lane: usize) {
        self.inner.forget(node, lane);
    }

    /// `PING` to a few known nodes at once (asking for the slot map first when there is none):
    /// `Ok` when one answers.
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        if self.inner.map.load().masters().is_empty() {
            self.stale();
        }
        let inner = &self.inner;
        let pings = inner.some().into_iter().map(|node| {
            Box::pin(async move {
                let mut conn = inner.conn(&node, 0).await?;
                let pong: RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
                pong.inspect_err(|_| inner.forget(&node, 0))
            })
        });
        first_ok(pings).await.map(drop)
    }

    /// A subscriber's connection to some node (the masters of the map, then the seeds): a
    /// Cluster delivers every `PUBLISH` to the subscribers of all its nodes.
    pub(crate) async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        let mut last = None;
        for node in self.inner.candidates() {
            let subscriber = match self.inner.client(&node) {
                Ok(client) => client.get_async_pubsub().await,
                Err(e) => Err(e),
            };
            match subscriber {
                Ok(pubsub) => return Ok(pubsub),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| RedisError::from((redis::ErrorKind::Io, "no Cluster node"))))
    }

    /// A connection to some node (the masters of the map, then the seeds).
    pub(crate) async fn any(&self, lane: usize) -> RedisResult<MultiplexedConnection> {
        let mut last = None;
        for node in self.inner.candidates() {
            match self.conn(&node, lane).await {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| RedisError::from((redis::ErrorKind::Io, "no Cluster node"))))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Some(task) = self.refresher.get() {
            task.abort();
        }
    }
}

impl Inner {
    async fn conn(&self, node: &Node, lane: usize) -> RedisResult<MultiplexedConnection> {
        let lanes = self
            .nodes
            .lock()
            .entry(node.clone())
            .or_insert_with(|| (0..self.lanes).map(|_| Lane::default()).collect())
            .clone();
        let Some(lane) = lanes.get(lane % self.lanes) else {
            return Err(RedisError::from((redis::ErrorKind::Io, "no lane")));
        };
        if let Some(conn) = lane.cached.lock().clone() {
            return Ok(conn);
        }
        let _guard = lane.connecting.lock().await;
        if let Some(conn) = lane.cached.lock().clone() {
            return Ok(conn);
        }
        let conn = self
            .client(node)?
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *lane.cached.lock() = Some(conn.clone());
        Ok(conn)
    }

    fn client(&self, node: &str) -> RedisResult<redis::Client> {
        let (host, port) = split(node)?;
        let addr = match self.template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        redis::Client::open(self.template.clone().set_addr(addr))
    }

    /// The masters of the map, then the seeds not among them.
    fn candidates(&self) -> Vec<Node> {
        let map = self.map.load();
        let mut nodes = map.masters().to_vec();
        for seed in &self.seeds {
            if !nodes.contains(seed) {
                nodes.push(seed.clone());
            }
        }
        nodes
    }

    /// [`FANOUT`] of the candidates, from where the last turn stopped.
    fn some(&self) -> Vec<Node> {
        let all = self.candidates();
        let start = self.turn.fetch_add(FANOUT, Ordering::Relaxed);
        let count = all.len().min(FANOUT);
        (0..count)
            .filter_map(|i| all.get((start + i) % all.len()).cloned())
            .collect()
    }

    /// Asks [`FANOUT`] candidates for `CLUSTER SLOTS` at once; the first answer becomes the
    /// map.
    async fn refresh(&self) -> RedisResult<()> {
        let asks = self.some().into_iter().map(|node| {
            Box::pin(async move {
                let mut conn = self.conn(&node, 0).await?;
                let reply: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
                    .inspect_err(|_| self.forget(&node, 0))?;
                parse_slots(&reply, &node)
            })
        });
        let map = first_ok(asks).await?;
        let keep: Vec<Node> = map.masters().iter().chain(&self.seeds).cloned().collect();
        self.nodes.lock().retain(|node, _| keep.contains(node));
        let old = self.map.swap(Arc::new(map));
        log_change(&old, &self.map.load());
        Ok(())
    }

    fn forget(&self, node: &Node, lane: usize) {
        let lanes = self.nodes.lock().get(node).cloned();
        if let Some(lane) = lanes.as_deref().and_then(|l| l.get(lane % self.lanes)) {
            *lane.cached.lock() = None;
        }
    }
}

/// Logs (at info) a refresh that changed the map: the slots whose master changed, the
/// masters now, and those that are masters no more. The first map is logged too.
fn log_change(old: &SlotMap, new: &SlotMap) {
    let moved = (0..SLOTS).filter(|&s| old.owner(s) != new.owner(s)).count();
    if moved == 0 {
        return;
    }
    let gone: Vec<&Node> = (old.masters().iter())
        .filter(|m| !new.masters().contains(m))
        .collect();
    tracing::info!(
        slots_changed = moved,
        masters = ?new.masters(),
        gone = ?gone,
        "redis cluster: slot map refreshed"
    );
}

/// The first of `futures` to succeed, or the last failure.
async fn first_ok<T, F>(futures: impl Iterator<Item = F>) -> RedisResult<T>
where
    F: Future<Output = RedisResult<T>> + Unpin,
{
    let futures: Vec<F> = futures.collect();
    if futures.is_empty() {
        return Err(RedisError::from((redis::ErrorKind::Io, "no Cluster node")));
    }
    select_ok(futures).await.map(|(value, _)| value)
}

/// Refreshes the map when asked, at most once per [`REFRESH_EVERY`] (requests meanwhile make
/// one more refresh), until the topology is dropped.
async fn refresher(inner: Arc<Inner>) {
    loop {
        inner.stale.notified().await;
        let started = Instant::now();
        if let Err(e) = inner.refresh().await {
            tracing::debug!(error = %e, "redis cluster: slot map not refreshed");
        }
        inner.refreshed.send_modify(|n| *n += 1);
        tokio::time::sleep_until(started + REFRESH_EVERY).await;
    }
}
