//! The Memcached backend (`limiter.backend = "memcache"`): fixed windows only, as
//! envoyproxy/ratelimit keeps them, shared by every replica that names the same servers.
//!
//! Memcached runs no scripts and has no command over several keys, so a request is decided
//! in two steps (docs/ratelimit-compat.md, "Memcached"):
//!
//! 1. every hit that takes a cost adds it to its window's counter at once (`incr`; on the
//!    window's first hit `add`, with an expiry a second past the window's end; if another
//!    replica's `add` came first, `incr` again) and reads the count after; a check-only or a
//!    give-back hit reads the count (`get`). A hit is admitted when the count before its own
//!    cost, plus that cost, fits the quota ([`super::fixed_window`]);
//! 2. the request is planned whole ([`plan::plan`]); each cost added in step 1 that must not
//!    stay (its request or its descriptor is denied, and it is not `charge: always`) is
//!    taken back (`decr`), and each give-back (`is_negative_hits`) of an admitted request is
//!    applied (`decr`).
//!
//! Between the two steps, other requests see the costs added in step 1: a request that ends
//! up denied may make another one look fuller than it is for one round trip, and be denied.
//! It never makes one admitted beyond a limit: every admitted cost was counted before it was
//! admitted. Time is this replica's clock (Unix time): replicas must keep their clocks in
//! step, as envoyproxy/ratelimit's must.
//!
//! A key lives on one server, chosen by a hash of the key over `memcache.servers` (or the
//! list an SRV lookup gave, handed over by [`MemcacheLimiter::set_servers`]). A failed
//! server fails the requests that need it (gRPC `UNAVAILABLE`, so Envoy's
//! `failure_mode_deny` decides), after what step 1 took on the others is given back.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::future::join_all;

use super::fixed_window::{FixedWindow, Window};
use super::memcache_conn::{self as conn, Failure, Server};
use super::{Batch, BatchOutcome, BoxFuture, Clock, Hit, HitOutcome, Limiter, LimiterError, plan};
use crate::config::model::Algorithm;
use crate::config::settings::MemcacheSettings;

/// Limiter state in Memcached.
pub struct MemcacheLimiter {
    /// The servers in hash order; swapped whole when an SRV lookup changes them (a request
    /// keeps the list it started with).
    servers: ArcSwap<Vec<Arc<Server>>>,
    connections: usize,
    connect: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
    prefix: Vec<u8>,
    timeout: Duration,
    clock: Arc<dyn Clock>,
    health: parking_lot::Mutex<Result<(), String>>,
    failures: std::sync::atomic::AtomicU64,
}

/// One hit as Memcached sees it: its window and the key of that window.
struct Cell {
    window: FixedWindow,
    start: u64,
    key: Vec<u8>,
    server: usize,
    expiry: u64,
}

/// What step 1 learnt of a hit: the count before its own cost, and whether its cost was
/// added.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    before: u64,
    added: bool,
    /// The count memcached returned last for this hit's key.
    last: u64,
}

impl MemcacheLimiter {
    /// A limiter on the servers of `settings`, on `clock` (Unix time); no connection is
    /// made until the first request. With `memcache.srv`, no server until
    /// [`MemcacheLimiter::set_servers`] hands over what the lookup found.
    pub fn new(
        settings: &MemcacheSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<MemcacheLimiter, LimiterError> {
        let connect = Duration::from_millis(settings.connect_timeout_ms.max(1));
        let tls = super::memcache_tls::client_config(settings).map_err(|e| error(&e, false))?;
        let srv = settings.srv_parts().is_some();
        let servers: Vec<Arc<Server>> = if srv {
            Vec::new()
        } else {
            settings
                .server_list()
                .into_iter()
                .map(|addr| {
                    Arc::new(Server::new(
                        addr,
                        settings.connections,
                        connect,
                        tls.clone(),
                    ))
                })
                .collect()
        };
        if servers.is_empty() && !srv {
            return Err(error("memcache.servers names no server", false));
        }
        Ok(MemcacheLimiter {
            servers: ArcSwap::from_pointee(servers),
            connections: settings.connections,
            connect,
            tls,
            prefix: settings.prefix.as_bytes().to_vec(),
            timeout: Duration::from_millis(settings.timeout_ms.max(1)),
            clock,
            health: parking_lot::Mutex::new(Err("not connected to memcached yet".to_owned())),
            failures: Default::default(),
        })
    }

    /// Serves `addrs` (`host:port`, in hash order) from now on; a server already in the list
    /// keeps its connections. Requests under way finish on the list they started with.
    pub fn set_servers(&self, addrs: &[String]) {
        let old = self.servers.load_full();
        if old.iter().map(|s| &s.addr).eq(addrs.iter()) {
            return;
        }
        let new: Vec<Arc<Server>> = addrs
            .iter()
            .map(|addr| match old.iter().find(|s| &s.addr == addr) {
                Some(kept) => kept.clone(),
                None => Arc::new(Server::new(
                    addr.clone(),
                    self.connections,
                    self.connect,
                    self.tls.clone(),
                )),
            })
            .collect();
        tracing::info!(servers = ?addrs, "memcached servers");
        self.servers.store(Arc::new(new));
    }

    /// The servers served now, in hash order.
    pub fn server_addrs(&self) -> Vec<String> {
        self.servers.load().iter().map(|s| s.addr.clone()).collect()
    }

    fn cell(&self, hit: &Hit, now: u64, servers: usize) -> Cell {
        let window = FixedWindow::new(hit.limit.quota, hit.limit.period_nanos)
            .with_calendar(hit.limit.calendar);
        let start = window.window_start(now);
        let key = conn::key(&self.prefix, &hit.key, start / 1_000_000_000);
        let server = conn::server_of(&key, servers);
        Cell {
            window,
            start,
            expiry: conn::expiry(now, window.window_end(now)),
            key,
            server,
        }
    }

    async fn decide(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        if let Some(hit) = batch
            .hits
            .iter()
            .find(|h| h.limit.algorithm != Algorithm::FixedWindow)
        {
            let why = format!(
                "the memcache backend keeps fixed windows only, not {}",
                hit.limit.algorithm.as_str()
            );
            return Err(error(&why, false));
        }
        let servers = self.servers.load_full();
        if servers.is_empty() {
            return Err(error(
                "no memcached server yet: the memcache.srv lookup has not answered",
                true,
            ));
        }
        let now = self.clock.now_nanos();
        let cells: Vec<Cell> = batch
            .hits
            .iter()
            .map(|h| self.cell(h, now, servers.len()))
            .collect();
        let steps = self.two_steps(batch, &cells, now, &servers);
        let result = tokio::time::timeout(self.timeout, steps).await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(error(
                &format!("memcached: no answer within {:?}", self.timeout),
                true,
            )),
        };
        match &result {
            Ok(_) => *self.health.lock() = Ok(()),
            Err(e) => {
                self.failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                *self.health.lock() = Err(e.message.clone());
            }
        }
        result
    }

    async fn two_steps(
        &self,
        batch: &Batch,
        cells: &[Cell],
        now: u64,
        servers: &[Arc<Server>],
    ) -> Result<BatchOutcome, LimiterError> {
        let (mut seen, failed) = self.take(batch, cells, servers).await;
        let verdicts: Vec<bool> = batch
            .hits
            .iter()
            .zip(cells)
            .zip(&seen)
            .map(|((hit, cell), s)| hit.refund || admits(cell, s, now, hit.cost))
            .collect();
        let planned = plan::plan(&batch.hits, &verdicts);
        let admitted = planned.admitted && failed.is_none();
        let settle: Vec<bool> = batch
            .hits
            .iter()
            .zip(&seen)
            .zip(&planned.consume)
            .map(|((hit, s), &consume)| {
                let keep = consume && failed.is_none();
                (s.added && !keep) || (hit.refund && keep && hit.cost > 0)
            })
            .collect();
        let mut after = vec![None; cells.len()];
        let settle_failed = self
            .settle(batch, cells, &settle, &mut after, servers)
            .await;
        if let Some(f) = failed.or(settle_failed) {
            return Err(error(&f.to_string(), true));
        }
        last_counts(cells, &mut seen, &after);
        let hits = batch
            .hits
            .iter()
            .zip(cells)
            .zip(&seen)
            .zip(&verdicts)
            .map(|(((hit, cell), s), &ok)| report(hit, cell, s, ok, now))
            .collect();
        Ok(BatchOutcome { hits, admitted })
    }

    /// Step 1, one connection per server, the servers at once; the first failure, if any.
    async fn take(
        &self,
        batch: &Batch,
        cells: &[Cell],
        servers: &[Arc<Server>],
    ) -> (Vec<Seen>, Option<Failure>) {
        let mut seen = vec![Seen::default(); batch.hits.len()];
        let groups = self.by_server(cells, &vec![true; cells.len()]);
        let calls = groups.iter().map(|(server, indices)| async move {
            let mut out = Vec::with_capacity(indices.len());
            let mut c = match servers.get(*server) {
                Some(s) => s.connection().await?,
                None => return Err(missing()),
            };
            for &i in indices {
                let (Some(hit), Some(cell)) = (batch.hits.get(i), cells.get(i)) else {
                    continue;
                };
                let s = if hit.cost > 0 && !hit.refund {
                    let after = c.take(&cell.key, hit.cost, cell.expiry).await?;
                    Seen {
                        before: after.saturating_sub(hit.cost),
                        added: true,
                        last: after,
                    }
                } else {
                    let count = c.read(&cell.key).await?;
                    Seen {
                        before: count,
                        added: false,
                        last: count,
                    }
                };
                out.push((i, s));
            }
            Ok::<_, Failure>(out)
        });
        let failed = gather(join_all(calls).await, |i, s| {
            if let Some(slot) = seen.get_mut(i) {
                *slot = s;
            }
        });
        (seen, failed)
    }

    /// Step 2: `decr` of each hit `todo` marks; the count each got back.
    async fn settle(
        &self,
        batch: &Batch,
        cells: &[Cell],
        todo: &[bool],
        settled: &mut [Option<u64>],
        servers: &[Arc<Server>],
    ) -> Option<Failure> {
        let groups = self.by_server(cells, todo);
        let calls = groups.iter().map(|(server, indices)| async move {
            let mut out = Vec::with_capacity(indices.len());
            let mut c = match servers.get(*server) {
                Some(s) => s.connection().await?,
                None => return Err(missing()),
            };
            for &i in indices {
                let (Some(hit), Some(cell)) = (batch.hits.get(i), cells.get(i)) else {
                    continue;
                };
                let after = c.give_back(&cell.key, hit.cost).await?.unwrap_or(0);
                out.push((i, after));
            }
            Ok::<_, Failure>(out)
        });
        gather(join_all(calls).await, |i, after| {
            if let Some(slot) = settled.get_mut(i) {
                *slot = Some(after);
            }
        })
    }

    /// The indices marked in `only`, grouped by server, in batch order within each.
    fn by_server(&self, cells: &[Cell], only: &[bool]) -> Vec<(usize, Vec<usize>)> {
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, cell) in cells.iter().enumerate() {
            if only.get(i) != Some(&true) {
                continue;
            }
            match groups.iter_mut().find(|(s, _)| *s == cell.server) {
                Some((_, g)) => g.push(i),
                None => groups.push((cell.server, vec![i])),
            }
        }
        groups
    }

    /// Connects to every server and reads a key that does not exist, within the time-out;
    /// records the result as the health.
    async fn probe_all(&self) {
        let servers = self.servers.load_full();
        if servers.is_empty() {
            *self.health.lock() =
                Err("no memcached server yet: the memcache.srv lookup has not answered".to_owned());
            return;
        }
        let calls = servers.iter().map(|s| async move {
            let mut c = s.connection().await?;
            c.read(b"sluice-probe").await.map(drop)
        });
        let result = tokio::time::timeout(self.timeout, join_all(calls)).await;
        *self.health.lock() = match result {
            Err(_) => Err(format!("memcached: no answer within {:?}", self.timeout)),
            Ok(results) => results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), |f| Err(f.to_string())),
        };
    }
}

/// Sets each hit's `last` to what its key holds after the request: the count of the last
/// command sent on the key (step 1's in batch order, then step 2's in batch order).
fn last_counts(cells: &[Cell], seen: &mut [Seen], after: &[Option<u64>]) {
    let mut last: std::collections::HashMap<&[u8], u64> = std::collections::HashMap::new();
    for (cell, s) in cells.iter().zip(seen.iter()) {
        last.insert(&cell.key, s.last);
    }
    for (cell, a) in cells.iter().zip(after) {
        if let Some(a) = a {
            last.insert(&cell.key, *a);
        }
    }
    for (cell, s) in cells.iter().zip(seen.iter_mut()) {
        if let Some(&count) = last.get(cell.key.as_slice()) {
            s.last = count;
        }
    }
}

/// Whether the hit's cost fits its window, given the count before it.
fn admits(cell: &Cell, seen: &Seen, now: u64, cost: u64) -> bool {
    let window = Window {
        start: cell.start,
        count: seen.before,
        refundable: 0,
    };
    cell.window.admits(window, now, cost)
}

/// The outcome of one hit: admitted, what its key holds now; denied, when it would be
/// admitted (as the memory backend reports them).
fn report(hit: &Hit, cell: &Cell, seen: &Seen, admitted: bool, now: u64) -> HitOutcome {
    if !admitted {
        let window = Window {
            start: cell.start,
            count: seen.before,
            refundable: 0,
        };
        return HitOutcome {
            admitted: false,
            remaining: 0,
            reset_nanos: cell.window.until_admitted(window, now, hit.cost),
            from_local_cache: false,
        };
    }
    let window = Window {
        start: cell.start,
        count: seen.last,
        refundable: 0,
    };
    HitOutcome {
        admitted: true,
        remaining: cell.window.remaining(window, now),
        reset_nanos: cell.window.until_window_end(now),
        from_local_cache: false,
    }
}

fn error(message: &str, transient: bool) -> LimiterError {
    LimiterError {
        backend: "memcache",
        message: message.to_owned(),
        transient,
        source: None,
    }
}

fn missing() -> Failure {
    Failure {
        addr: String::new(),
        message: "no such server".to_owned(),
    }
}

impl Limiter for MemcacheLimiter {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(self.decide(batch))
    }

    fn name(&self) -> &'static str {
        "memcache"
    }

    fn probe(&self) -> Option<BoxFuture<'_, ()>> {
        Some(Box::pin(self.probe_all()))
    }

    fn ready(&self) -> Result<(), String> {
        self.health.lock().clone()
    }

    fn events(&self) -> Vec<(&'static str, u64)> {
        let failures = self.failures.load(std::sync::atomic::Ordering::Relaxed);
        vec![("failure", failures)]
    }

    fn status(&self) -> super::counters::BackendStatus {
        super::counters::BackendStatus {
            reachable: Some(self.health.lock().clone()),
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for MemcacheLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let servers = self.server_addrs();
        f.debug_struct("MemcacheLimiter")
            .field("servers", &servers)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
}

/// Hands each server's `(hit index, value)` answers to `put`; the last server's failure, if
/// any (the answers of the servers that did answer are still handed over).
fn gather<T>(
    results: Vec<Result<Vec<(usize, T)>, Failure>>,
    mut put: impl FnMut(usize, T),
) -> Option<Failure> {
    let mut failed = None;
    for result in results {
        match result {
            Ok(part) => part.into_iter().for_each(|(i, v)| put(i, v)),
            Err(f) => failed = Some(f),
        }
    }
    failed
}
