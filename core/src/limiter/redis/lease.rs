//! Leases on Redis (`redis.leases = "on"`): this replica's table of leases, and the request
//! that returns a key's old lease and takes a new one (a lease request of the script's batch:
//! "Leases" in `lua/prelude.lua`, the Lua in `lua/main.lua`), by the rules of
//! `crate::limiter::lease`.
//!
//! # One request
//!
//! A request whose every hit may be leased (funnel, token bucket, fixed window (calendar
//! windows included) or sliding window, counted when admitted, no `borrow`, no `block_for`,
//! enforced, a cost, no refund, no hold) is first counted in the heat table
//! (`lease::Heat`, without a lock): when some key of it is quiet there, it goes to Redis at
//! once. Otherwise it counts its demand per key in the lease table. When every hit's key holds
//! a valid lease with units enough, it is decided here: admitted, the units spent, no Redis
//! call. Otherwise, for each busy key whose lease is missing, spent or expired, and which no
//! other request is renewing, one lease request gives back what is left of the old lease and
//! takes a new one; the renewals go to group commit together, as requests of its next calls
//! (with each other and with other requests: no call of their own). A request that finds a
//! key's renewal under way waits for its answer instead (at most `timeout_ms`). Then the
//! request is tried here once more, and else it goes to Redis as every request does (Redis
//! counts the leased units as spent, so its answer stays exact; a denial is cached by the deny
//! cache as usual).
//!
//! Times: a lease's expiry is Redis's; here it ends earlier, at the local time the call was
//! sent plus the lease's length by Redis's clock, so it is never spent after Redis counts it
//! spent.
//!
//! # Dropped
//!
//! Every lease of this replica is dropped (lost: its units count as spent in Redis until
//! they expire) on a reset (the resets channel), when the connection fails, and a key's when
//! its limit's parameters change (a reload).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures_util::future::join_all;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::RedisLimiter;
use super::script::{self, Decided, LeaseArgs, LeaseReply, Mode, Unit};
use crate::limiter::counters::HeldLease;
use crate::limiter::lease::{self, Demand, Heat, Sizing};
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, LimitParams, Role};

/// The most keys whose demand is followed; beyond, new keys are not leased until a sweep.
const MAX_KEYS: usize = 10_000;

/// This replica's leases and the demand seen per key.
pub(super) struct Leases {
    on: bool,
    sizing: Sizing,
    /// This replica's id in the keys' lease records (below 2^53: the script reads it as a
    /// double).
    id: u64,
    table: Mutex<HashMap<Arc<[u8]>, Entry, ahash::RandomState>>,
    /// The first look at a request's keys, before the table: most keys of most deployments
    /// are never busy, and their requests go to Redis without taking the table's lock.
    heat: Heat,
    hasher: ahash::RandomState,
    /// A lease was stored since the last [`Leases::clear`] (written under the table's lock):
    /// without one, a clear (every failed call does one) skips the scan of the table.
    holding: AtomicBool,
    pub(super) counts: Counts,
}

/// Running totals, for metrics (the backend's events).
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Leases taken.
    pub taken: AtomicU64,
    /// Units given back to Redis.
    pub returned: AtomicU64,
    /// Units not spent and not given back (expired, or dropped).
    pub lost: AtomicU64,
    /// Requests decided from leases.
    pub decided: AtomicU64,
}

struct Entry {
    params: LimitParams,
    demand: Demand,
    held: Option<Held>,
    /// A request is renewing the lease: requests the lease cannot pay wait for the answer
    /// (the sender is dropped when it comes, which wakes them) rather than go to Redis.
    renewing: Option<watch::Sender<()>>,
    /// Last seen (local nanoseconds).
    seen: u64,
}

/// A lease held: its units, how many are left, until when (local time), and when the key's
/// reset comes as Redis reported it at the grant.
#[derive(Debug, Clone, Copy)]
struct Held {
    units: u64,
    left: u64,
    until: u64,
    /// Local time at which the key's reset (as Redis reported it) comes.
    reset_at: u64,
}

/// A lease to renew: the key, its limit, the units wanted (at least the cost of the request
/// asking: a smaller lease would not pay for it), and what to give back.
pub(super) struct Renewal {
    key: Arc<[u8]>,
    limit: LimitParams,
    least: u64,
    want: u64,
    give: u64,
}

/// One lease call's arguments: the lessee, the key (without the prefix) and its limit, the
/// units given back, the units wanted, the most the lease may be valid (nanoseconds).
pub(super) struct LeaseCall<'a> {
    /// The lessee's field in the key's lease records (below 2^53).
    pub id: u64,
    pub key: &'a [u8],
    pub limit: &'a LimitParams,
    pub give: u64,
    /// The lease is a whole number of this (none when not even one fits).
    pub least: u64,
    pub want: u64,
    pub validity: u64,
    /// A deadline (Unix microseconds) after which the script does nothing: a region's call to
    /// home that arrives late (held in a partition) neither returns nor takes anything.
    pub deadline: Option<u64>,
}

/// What a request's hits ask of the table: its answer, the renewals to make and the
/// renewals under way to wait for before trying again, or Redis.
enum Spend {
    Done(BatchOutcome),
    Renew(Vec<Renewal>, Vec<watch::Receiver<()>>),
    Direct,
}

impl Leases {
    pub(super) fn new(on: bool, sizing: Sizing) -> Leases {
        let id = ahash::RandomState::new().hash_one(std::process::id());
        Leases {
            on,
            sizing,
            id: id & script::MAX_EXACT,
            table: Mutex::new(HashMap::default()),
            heat: Heat::default(),
            hasher: ahash::RandomState::new(),
            holding: AtomicBool::new(false),
            counts: Counts::default(),
        }
    }

    /// Whether a request may be decided from leases at all.
    fn eligible(&self, batch: &Batch) -> bool {
        self.on
            && !batch.hits.is_empty()
            && batch.hits.iter().all(|h| {
                lease::leasable(&h.limit)
                    && h.cost > 0
                    && !h.refund
                    && h.hold.is_none()
                    && h.role == Role::Enforced
            })
    }

    /// Counts the request's hits in the heat table; whether every key may be busy (only then
    /// can the request be decided from leases, or its keys' leases be worth renewing).
    fn warm(&self, batch: &Batch, now: u64) -> bool {
        batch
            .hits
            .iter()
            .map(|h| {
                let hash = self.hasher.hash_one(&*h.key);
                self.heat.warm(hash, now, h.cost, &self.sizing)
            })
            .fold(true, |all, warm| all & warm)
    }

    /// Decides the request from the leases when they hold enough; otherwise the leases to
    /// renew first (none: go to Redis). The first try (`first`) counts the request's demand
    /// and may ask for renewals; the try after the renewals does neither.
    fn spend(&self, batch: &Batch, now: u64, first: bool) -> Spend {
        let costs = per_key(&batch.hits);
        let mut table = self.table.lock();
        let mut enough = true;
        // Some key is busy or being renewed: only then may a renewal or a wait follow.
        let mut engaged = false;
        for (key, limit, cost) in &costs {
            if table.len() >= MAX_KEYS && !table.contains_key(key) {
                return Spend::Direct;
            }
            let entry = table.entry(key.clone()).or_insert_with(|| Entry {
                params: *limit,
                demand: Demand::new(now),
                held: None,
                renewing: None,
                seen: now,
            });
            if entry.params != *limit {
                // A reload changed the limit: what was leased under the old one is lost.
                self.lose(entry.held.take());
                entry.params = *limit;
                entry.demand = Demand::new(now);
            }
            entry.seen = now;
            if first {
                entry.demand.observe(now, *cost);
            }
            enough &= entry.held.is_some_and(|h| now < h.until && h.left >= *cost);
            engaged = engaged || entry.renewing.is_some() || entry.demand.busy(now, &self.sizing);
        }
        if enough {
            return Spend::Done(self.take(&mut table, &costs, batch, now));
        }
        if !first || !engaged {
            // No key to renew or wait for (keys far below `lease_min_rate`): no second pass.
            return Spend::Direct;
        }
        let mut renewals = Vec::new();
        let mut waits = Vec::new();
        for (key, limit, cost) in &costs {
            match self.renewal(&mut table, key, limit, *cost, now) {
                Some(Ok(renewal)) => renewals.push(renewal),
                Some(Err(wait)) => waits.push(wait),
                None => {}
            }
        }
        if renewals.is_empty() && waits.is_empty() {
            Spend::Direct
        } else {
            Spend::Renew(renewals, waits)
        }
    }

    /// Spends `costs` from their leases (each holds enough) and answers the request.
    fn take(
        &self,
        table: &mut HashMap<Arc<[u8]>, Entry, ahash::RandomState>,
        costs: &[(Arc<[u8]>, LimitParams, u64)],
        batch: &Batch,
        now: u64,
    ) -> BatchOutcome {
        for (key, _, cost) in costs {
            if let Some(held) = table.get_mut(key).and_then(|e| e.held.as_mut()) {
                held.left -= cost;
            }
        }
        let hits = batch
            .hits
            .iter()
            .map(|hit| {
                let held = table.get(&hit.key).and_then(|e| e.held);
                HitOutcome {
                    admitted: true,
                    // What this replica can still admit for sure: a lower bound.
                    remaining: held.map_or(0, |h| h.left),
                    reset_nanos: held.map_or(0, |h| h.reset_at.saturating_sub(now)),
                    from_local_cache: false,
                }
            })
            .collect();
        self.counts.decided.fetch_add(1, Ordering::Relaxed);
        BatchOutcome {
            hits,
            admitted: true,
        }
    }

    /// The renewal of `key`'s lease, when the key is busy, its lease cannot pay `cost`, and no
    /// other request renews it; the old lease is taken out (given back by the renewal). When
    /// another request renews it, that renewal to wait for (`Err`).
    fn renewal(
        &self,
        table: &mut HashMap<Arc<[u8]>, Entry, ahash::RandomState>,
        key: &Arc<[u8]>,
        limit: &LimitParams,
        cost: u64,
        now: u64,
    ) -> Option<Result<Renewal, watch::Receiver<()>>> {
        let entry = table.get_mut(key)?;
        if entry.held.is_some_and(|h| now < h.until && h.left >= cost) {
            return None;
        }
        if let Some(under_way) = &entry.renewing {
            let busy = entry.demand.busy(now, &self.sizing);
            return busy.then(|| Err(under_way.subscribe()));
        }
        let want = entry.demand.want(now, limit, &self.sizing);
        if !entry.demand.busy(now, &self.sizing) || want < cost.max(2) {
            return None;
        }
        // What is left goes back: Redis takes what may still come back (a window's units
        // until the window ends) and the rest is lost.
        let give = match entry.held.take() {
            Some(h) => {
                entry.demand.ended(h.units, h.left, now < h.until);
                h.left
            }
            None => 0,
        };
        entry.renewing = Some(watch::Sender::new(()));
        Some(Ok(Renewal {
            key: key.clone(),
            limit: *limit,
            least: cost,
            want: entry.demand.want(now, limit, &self.sizing).max(want),
            give,
        }))
    }

    /// A renewal's answer: the new lease (if any) goes into the table, and the requests
    /// waiting for it wake.
    fn renewed(&self, renewal: &Renewal, reply: Option<(Held, u64)>) {
        let mut table = self.table.lock();
        let Some(entry) = table.get_mut(&renewal.key) else {
            return;
        };
        entry.renewing = None;
        match reply {
            Some((held, returned)) => {
                self.counts.returned.fetch_add(returned, Ordering::Relaxed);
                self.counts
                    .lost
                    .fetch_add(renewal.give - returned, Ordering::Relaxed);
                if held.units > 0 && entry.params == renewal.limit {
                    self.counts.taken.fetch_add(1, Ordering::Relaxed);
                    entry.held = Some(held);
                    self.holding.store(true, Ordering::Relaxed);
                }
            }
            None => {
                self.counts.lost.fetch_add(renewal.give, Ordering::Relaxed);
            }
        }
    }

    fn lose(&self, held: Option<Held>) {
        if let Some(h) = held {
            self.counts.lost.fetch_add(h.left, Ordering::Relaxed);
        }
    }

    /// Drops every lease (a reset, a failed connection): their units are lost.
    pub(super) fn clear(&self) {
        if !self.on {
            return;
        }
        let mut table = self.table.lock();
        if !self.holding.swap(false, Ordering::Relaxed) {
            return;
        }
        for entry in table.values_mut() {
            self.lose(entry.held.take());
        }
    }

    /// Forgets keys not seen for a second whose lease has ended; how many.
    pub(super) fn sweep(&self, now: u64) -> usize {
        if !self.on {
            return 0;
        }
        let mut table = self.table.lock();
        let before = table.len();
        table.retain(|_, e| {
            let idle = now.saturating_sub(e.seen) > 1_000_000_000;
            let done = e.held.is_none_or(|h| now >= h.until);
            if idle && done && e.renewing.is_none() {
                self.lose(e.held.take());
                return false;
            }
            true
        });
        before - table.len()
    }

    /// Units of `key` on lease here now (for `/counters` and `/why`).
    pub(super) fn held_units(&self, key: &[u8], now: u64) -> u64 {
        self.held(key, now).map_or(0, |h| h.left)
    }

    /// This replica's lease on `key` now, if it holds one still valid.
    pub(super) fn held(&self, key: &[u8], now: u64) -> Option<HeldLease> {
        if !self.on {
            return None;
        }
        let table = self.table.lock();
        let h = table.get(key)?.held.filter(|h| now < h.until)?;
        Some(HeldLease {
            units: h.units,
            left: h.left,
            expires_nanos: h.until - now,
        })
    }

    /// Whether leases are on.
    pub(super) fn on(&self) -> bool {
        self.on
    }

    pub(super) fn len(&self) -> usize {
        if !self.on {
            return 0;
        }
        self.table.lock().len()
    }
}

/// A request's renewals; those not done when it is dropped (its caller stopped waiting) are
/// ended as failed, so that their keys can be renewed again.
struct Pending<'a> {
    leases: &'a Leases,
    renewals: Vec<Renewal>,
    done: usize,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        for renewal in self.renewals.iter().skip(self.done) {
            self.leases.renewed(renewal, None);
        }
    }
}

/// The hits' keys, each once, with its limit and the sum of its costs.
fn per_key(hits: &[Hit]) -> Vec<(Arc<[u8]>, LimitParams, u64)> {
    let mut out: Vec<(Arc<[u8]>, LimitParams, u64)> = Vec::with_capacity(hits.len());
    for hit in hits {
        match out
            .iter_mut()
            .find(|(k, l, _)| *k == hit.key && *l == hit.limit)
        {
            Some((_, _, cost)) => *cost = cost.saturating_add(hit.cost),
            None => out.push((hit.key.clone(), hit.limit, hit.cost)),
        }
    }
    out
}

impl RedisLimiter {
    /// The request decided from this replica's leases, renewing them first when its keys are
    /// busy; `None`: ask Redis.
    pub(super) async fn leased(&self, batch: &Batch) -> Option<BatchOutcome> {
        if !self.leases.eligible(batch) {
            return None;
        }
        let now = self.clock.now_nanos();
        if !self.leases.warm(batch, now) {
            return None;
        }
        let (renewals, waits) = match self.leases.spend(batch, now, true) {
            Spend::Done(outcome) => return Some(outcome),
            Spend::Direct => return None,
            Spend::Renew(renewals, waits) => (renewals, waits),
        };
        let mut pending = Pending {
            leases: &self.leases,
            renewals,
            done: 0,
        };
        // Every renewal at once, each one request of group commit, polled together as a
        // gathering poll (`crate::limiter::gathering`): those on one lane share one call.
        let renewing = join_all(pending.renewals.iter().map(|r| self.renew(r)));
        let replies = crate::limiter::gathering::gathered(renewing).await;
        if replies.iter().any(Option::is_none) {
            // Redis failed: what this replica leased may be gone with it.
            self.leases.clear();
        }
        for (renewal, reply) in pending.renewals.iter().zip(replies) {
            self.leases.renewed(renewal, reply);
        }
        pending.done = pending.renewals.len();
        drop(pending);
        // Renewals other requests make: their answers (or failures) end the wait; the renewal
        // is bounded by the time-out, and so is the wait, in case.
        let deadline = Instant::now() + self.timeout;
        for mut wait in waits {
            let _ = tokio::time::timeout_at(deadline, wait.changed()).await;
        }
        match self.leases.spend(batch, self.clock.now_nanos(), false) {
            Spend::Done(outcome) => Some(outcome),
            Spend::Direct | Spend::Renew(..) => None,
        }
    }

    /// One request of group commit: give back the old lease's units, take a new lease; the
    /// new lease (its times local) and the units given back.
    async fn renew(&self, renewal: &Renewal) -> Option<(Held, u64)> {
        let sent = self.clock.now_nanos();
        let validity = lease::validity(&renewal.limit, &self.leases.sizing);
        let call = LeaseCall {
            id: self.leases.id,
            key: &renewal.key,
            limit: &renewal.limit,
            give: renewal.give,
            least: renewal.least,
            want: renewal.want,
            validity,
            deadline: None,
        };
        let reply = match self
            .lease_call(call, sent, Instant::now() + self.timeout)
            .await
        {
            Ok(reply) => reply,
            Err(e) => {
                tracing::debug!(error = %e, "redis: lease call failed");
                return None;
            }
        };
        let held = Held {
            units: reply.units,
            left: reply.units,
            until: sent.saturating_add(
                reply
                    .expires
                    .saturating_sub(reply.now)
                    .saturating_mul(1_000),
            ),
            reset_at: sent.saturating_add(reply.reset.saturating_mul(1_000)),
        };
        Some((held, reply.returned))
    }

    /// One lease request of group commit, answered by `deadline`. A replica's leases ask it
    /// under the replica's id; a region's shares of a global limit (`global`) on the home
    /// Redis, under the region's.
    pub(super) async fn lease_call(
        &self,
        lease: LeaseCall<'_>,
        sent: u64,
        deadline: Instant,
    ) -> Result<LeaseReply, redis::RedisError> {
        let hit = Hit {
            key: Arc::from(lease.key),
            limit: *lease.limit,
            cost: lease.want,
            refund: false,
            group: 0,
            role: Role::Enforced,
            hold: None,
        };
        let call = super::Call {
            mode: Mode::Lease(LeaseArgs {
                give: lease.give,
                least: lease.least,
                validity_micros: lease.validity.div_ceil(1_000).max(1),
                replica: lease.id,
                deadline_micros: lease.deadline.unwrap_or(0),
            }),
            unit: Unit::Nanos,
            now_micros: self.script_clock.then_some(sent / 1_000),
            clock_nanos: sent,
            deadline,
        };
        match self.submit_any(vec![hit], call).await? {
            Decided::Lease(reply) => Ok(reply),
            Decided::Batch(_) => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "sluice: a request's reply to a lease",
            ))),
        }
    }
}
