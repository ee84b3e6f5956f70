//! Regions (`scope: global`): a global limit's state lives in the home Redis
//! (`redis.global_url`), which lends shares of it to each region; the region spends its shares
//! in its own Redis (`redis.url`), exactly across its replicas (`lua/share.lua`). The rules are
//! `crate::limiter::share`; home's side is the lease script (`lua/lease.lua`), the lessee
//! being `<region>#<slot>`.
//!
//! # One request with a global limit
//!
//! 1. Each global hit spends its cost from the region's pool in one call to the region's Redis
//!    (no call to home). When the pool runs below half of its last share (or cannot pay), that
//!    call also elects this replica, under a lock in the pool, to take the next share from
//!    home: in the background when the request was paid, else at once.
//! 2. A hit the pool cannot pay while another replica renews waits for that renewal about one
//!    home round trip, then asks the pool again. Home had nothing to lend: denied at once
//!    (until the next try, at most [`RETRY_MS`] later). Home unreachable: the region has spent
//!    what it held, and answers by `redis.global_on_error`: `deny`, or `share` (a fixed percent
//!    of the limit per period, counted in the pool: the one way to over-admit).
//! 3. The request's other (local) hits then go the usual way, only if the global ones did not
//!    deny it; units of global hits that end up not consumed (the request denied after all)
//!    go back into the pool.
//!
//! Home counts every share as spent at its expiry; the region stops spending a share before
//! that (its own clock, from before the call). So no interval admits more than the limit,
//! whatever the network does; what a region holds and does not spend is under-admission.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::RedisLimiter;
use super::lease::LeaseCall;
use super::script;
use crate::config::settings::{GlobalOnError, RedisSettings};
use crate::limiter::counters::ShareView;
use crate::limiter::share::{self, Sizing};
use crate::limiter::{Batch, BatchOutcome, Clock, Hit, HitOutcome, LimiterError, plan};

const SHARE: &str = include_str!("lua/share.lua");

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&script::with_algorithms(SHARE)));

/// The least time one call to home may take (connecting included): `redis.timeout_ms` when
/// longer. A cross-region round trip is 70 to 90 ms.
pub(super) const HOME_TIMEOUT_MS: u64 = 500;
/// After home failed or had nothing to lend, the next try comes this much later (so that a
/// healed link is used again well within a second).
pub(super) const RETRY_MS: u64 = 200;
/// A region that spent nothing of a key for this long gives back what it holds of it.
pub(super) const IDLE_MS: u64 = 1_000;
/// The wait histogram's bounds, in microseconds (the last bucket is everything above).
pub(super) const WAIT_BOUNDS_MICROS: [u64; 8] = [
    1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
];

/// The wait histogram's events: at most each of [`WAIT_BOUNDS_MICROS`], then every wait.
const WAIT_EVENTS: [&str; 9] = [
    "global_wait_le_1ms",
    "global_wait_le_5ms",
    "global_wait_le_10ms",
    "global_wait_le_25ms",
    "global_wait_le_50ms",
    "global_wait_le_100ms",
    "global_wait_le_250ms",
    "global_wait_le_500ms",
    "global_wait",
];

/// Renewal tokens: this process's seed and a count.
static TOKENS: AtomicU64 = AtomicU64::new(0);

/// Global keys asked here, with their limit and when (local nanoseconds).
type Seen = HashMap<Arc<[u8]>, (crate::limiter::LimitParams, u64)>;

/// The global side of a Redis limiter.
pub(super) struct Global {
    /// The home Redis (only `lua/lease.lua` is called there).
    home: RedisLimiter,
    /// The region's Redis, for the pool (its own connections, so that renewals can run apart
    /// from the requests).
    pool: RedisLimiter,
    region: String,
    token_seed: u64,
    on_error: GlobalOnError,
    sizing: Sizing,
    clock: Arc<dyn Clock>,
    script_clock: bool,
    /// How long one call to home may take (milliseconds): the larger of `redis.timeout_ms` and
    /// [`HOME_TIMEOUT_MS`]; a renewal's lock in the pool lasts three times that (the call to
    /// home, then the deposit in the pool).
    home_timeout_ms: u64,
    /// Home's round trip as last seen (nanoseconds): how long a request waits for a renewal.
    rtt: AtomicU64,
    pub(super) counts: Counts,
    /// Global keys asked here lately, with their limit and when (local nanoseconds): the
    /// sweep gives back what an idle region holds of them.
    seen: parking_lot::Mutex<Seen>,
    /// The sweep runs (started with the first global request).
    sweeping: std::sync::atomic::AtomicBool,
    /// Renewals under way in this process, per key: a request waits on them.
    renewing: parking_lot::Mutex<HashMap<Arc<[u8]>, Arc<tokio::sync::Notify>>>,
}

/// Running totals, for metrics.
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Shares taken from home.
    pub taken: AtomicU64,
    /// Units given back to home.
    pub returned: AtomicU64,
    /// Units of ending shares home did not take back (expired, or a failed call).
    pub lost: AtomicU64,
    /// Calls to home that failed.
    pub home_failures: AtomicU64,
    /// Hits admitted by `global_on_error = "share"`, and denied because home was unreachable.
    pub fallback_admitted: AtomicU64,
    pub fallback_denied: AtomicU64,
    /// Requests that waited for home: how many per bucket of [`WAIT_BOUNDS_MICROS`] (and one
    /// above), and the total wait in microseconds.
    pub waits: [AtomicU64; 9],
    pub wait_micros: AtomicU64,
}

/// What the pool said to a spend.
#[derive(Debug, Clone, Copy)]
struct Spent {
    now: u64,
    /// 0 denied, 1 from a share, 2 from the fallback.
    verdict: u64,
    left: u64,
    /// The slot this caller renews, if elected.
    slot: Option<u64>,
    give: u64,
    rate: u64,
    /// Another replica renews: worth waiting.
    waiting: bool,
    /// Home had nothing: microseconds until the next try.
    dry: u64,
    down: bool,
    /// Home's reset, on the region's clock (microseconds; 0 unknown).
    reset: u64,
    took: u64,
    /// Home lent less than asked last time.
    short: bool,
}

/// A renewal this caller was elected for.
struct Renewal {
    key: Arc<[u8]>,
    limit: crate::limiter::LimitParams,
    slot: u64,
    give: u64,
    want: u64,
    token: String,
    /// The region's time of the spend that elected it (before the call to home).
    region_now: u64,
}

impl Global {
    /// The global side of `settings`, if `redis.global_url` is set.
    pub(super) fn new(
        settings: &RedisSettings,
        clock: Arc<dyn Clock>,
        script_clock: bool,
    ) -> Result<Option<Global>, LimiterError> {
        let Some(url) = settings.global_url.clone() else {
            return Ok(None);
        };
        let region = settings.region.clone().unwrap_or_default();
        let home_timeout_ms = settings.timeout_ms.max(HOME_TIMEOUT_MS);
        let home_settings = RedisSettings {
            url,
            per_second_url: None,
            global_url: None,
            timeout_ms: home_timeout_ms,
            connect_timeout_ms: settings.connect_timeout_ms.min(home_timeout_ms),
            // Home is asked once per share: no breaker to wait out after a heal.
            breaker_failures: 0,
            leases: crate::config::settings::LeaseMode::Off,
            ..settings.clone()
        };
        let pool_settings = RedisSettings {
            per_second_url: None,
            global_url: None,
            leases: crate::config::settings::LeaseMode::Off,
            ..settings.clone()
        };
        let home = RedisLimiter::build_one(&home_settings, 0, clock.clone(), script_clock)?;
        let pool = RedisLimiter::build_one(&pool_settings, 0, clock.clone(), script_clock)?;
        Ok(Some(Global {
            home,
            pool,
            region,
            home_timeout_ms,
            token_seed: ahash::RandomState::new().hash_one(std::process::id()),
            on_error: settings.global_on_error,
            sizing: Sizing {
                share_nanos: settings.global_share_ms.saturating_mul(1_000_000),
                lease_nanos: settings.global_lease_ms.saturating_mul(1_000_000),
                percent: settings.global_share_percent,
            },
            clock,
            script_clock,
            rtt: AtomicU64::new(100_000_000),
            counts: Counts::default(),
            renewing: parking_lot::Mutex::new(HashMap::new()),
            seen: parking_lot::Mutex::new(HashMap::new()),
            sweeping: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn pool_ttl_ms(&self) -> u64 {
        (self.sizing.lease_nanos / 1_000_000)
            .saturating_mul(2)
            .max(60_000)
    }

    fn now_override(&self) -> String {
        if self.script_clock {
            (self.clock.now_nanos() / 1_000).to_string()
        } else {
            String::new()
        }
    }

    /// The pool's key of a state key (without the prefix): beside it, in its slot.
    fn pool_key(&self, key: &[u8]) -> Vec<u8> {
        [&script::prefixed(self.pool.prefix(), key)[..], b":share"].concat()
    }

    async fn pool_call<T: redis::FromRedisValue>(
        &self,
        key: &[u8],
        args: &[String],
    ) -> Result<T, LimiterError> {
        let mut invocation = SCRIPT.prepare_invoke();
        invocation.key(self.pool_key(key));
        invocation.arg(self.now_override());
        for a in args {
            invocation.arg(a);
        }
        let reply = self
            .pool
            .within_timeout(|deadline| self.pool.keyed(key, &invocation, deadline))
            .await?;
        redis::from_redis_value(reply).map_err(|e| super::limiter_error(e.into()))
    }

    /// Spends `hit`'s cost from the pool (or the fallback); elects this caller to renew when
    /// the pool runs low.
    async fn spend(&self, hit: &Hit) -> Result<(Spent, Option<Renewal>), LimiterError> {
        let fallback = match self.on_error {
            GlobalOnError::Share => share::fallback(&hit.limit, &self.sizing),
            GlobalOnError::Deny => 0,
        };
        let token = format!(
            "{:016x}{:x}",
            self.token_seed,
            TOKENS.fetch_add(1, Ordering::Relaxed)
        );
        let args = [
            "spend".to_owned(),
            hit.cost.to_string(),
            (3 * self.home_timeout_ms).to_string(),
            token.clone(),
            fallback.to_string(),
            (hit.limit.period_nanos / 1_000).max(1).to_string(),
            self.pool_ttl_ms().to_string(),
        ];
        let v: Vec<u64> = self.pool_call(&hit.key, &args).await?;
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        let spent = Spent {
            now: get(0),
            verdict: get(1),
            left: get(2),
            slot: get(3).checked_sub(1),
            give: get(4),
            rate: get(5),
            waiting: get(6) == 1,
            dry: get(7),
            down: get(8) == 1,
            reset: get(9),
            took: get(10),
            short: get(11) == 1,
        };
        let renewal = spent.slot.map(|slot| Renewal {
            key: hit.key.clone(),
            limit: hit.limit,
            slot,
            give: spent.give,
            want: share::want(spent.rate, hit.cost, &self.sizing),
            token,
            region_now: spent.now,
        });
        Ok((spent, renewal))
    }

    /// Takes the next share from home and puts it in the pool (or marks home down); gives the
    /// old share's units back by name in the same call.
    async fn renew(&self, renewal: &Renewal) {
        let validity = share::validity(&renewal.limit, &self.sizing);
        let id = format!("{}#{}", self.region, renewal.slot);
        let started = Instant::now();
        let sent = self.clock.now_nanos();
        // Home does nothing with a call that reaches it after this replica gave up on it.
        let base = if self.script_clock {
            sent / 1_000
        } else {
            wall_micros()
        };
        let give_up = base.saturating_add(self.home_timeout_ms * 1_000);
        let reply = self
            .home
            .within_timeout(|deadline| {
                let call = LeaseCall {
                    id: &id,
                    key: &renewal.key,
                    limit: &renewal.limit,
                    give: renewal.give,
                    want: renewal.want,
                    validity,
                    deadline: Some(give_up),
                };
                self.home.lease_call(call, sent, deadline)
            })
            .await;
        let ttl = self.pool_ttl_ms().to_string();
        let (args, answered) = match reply {
            Ok([home_now, returned, units, expires, remaining, reset]) => {
                let rtt = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.rtt.store(rtt, Ordering::Relaxed);
                let c = &self.counts;
                c.returned.fetch_add(returned, Ordering::Relaxed);
                c.lost
                    .fetch_add(renewal.give.saturating_sub(returned), Ordering::Relaxed);
                if units > 0 {
                    c.taken.fetch_add(1, Ordering::Relaxed);
                }
                let region_now = renewal.region_now;
                let until = share::until(region_now, home_now, expires);
                let reset_at = region_now.saturating_add(reset);
                let dry = if units == 0 && renewal.want > 0 {
                    region_now.saturating_add((RETRY_MS * 1_000).min(reset.max(1)))
                } else {
                    0
                };
                let args = vec![
                    "deposit".to_owned(),
                    renewal.token.clone(),
                    renewal.slot.to_string(),
                    units.to_string(),
                    until.to_string(),
                    remaining.to_string(),
                    reset_at.to_string(),
                    dry.to_string(),
                    ttl,
                    if units < renewal.want { "1" } else { "0" }.to_owned(),
                ];
                (args, true)
            }
            Err(e) => {
                tracing::debug!(error = %e, region = %self.region, "redis: no share from home");
                self.counts.home_failures.fetch_add(1, Ordering::Relaxed);
                self.counts.lost.fetch_add(renewal.give, Ordering::Relaxed);
                let args = vec![
                    "failed".to_owned(),
                    renewal.token.clone(),
                    RETRY_MS.to_string(),
                ];
                (args, false)
            }
        };
        match self.pool_call::<u64>(&renewal.key, &args).await {
            Ok(1) => {}
            // The lock was lost (this replica stalled past it): the share is lost, never
            // spent twice.
            Ok(_) if answered => {
                tracing::debug!("redis: a share came after its renewal's lock: lost");
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "redis: the share's pool did not answer"),
        }
    }

    /// Runs `renewal` with the key marked as renewing here (requests of this process wait on
    /// it rather than on the pool).
    async fn renew_marked(&self, renewal: Renewal) {
        let notify = Arc::new(tokio::sync::Notify::new());
        self.renewing
            .lock()
            .insert(renewal.key.clone(), notify.clone());
        self.renew(&renewal).await;
        self.renewing.lock().remove(&renewal.key);
        notify.notify_waiters();
    }

    /// Waits for a renewal of `key` (this process's, or another replica's) about one home
    /// round trip at most.
    async fn wait_renewal(&self, key: &Arc<[u8]>, budget: Duration) {
        let local = self.renewing.lock().get(key).cloned();
        match local {
            Some(notify) => {
                let _ = tokio::time::timeout(budget, notify.notified()).await;
            }
            None => tokio::time::sleep(budget).await,
        }
    }

    fn record_wait(&self, waited: Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let bucket = WAIT_BOUNDS_MICROS
            .iter()
            .position(|&b| micros <= b)
            .unwrap_or(WAIT_BOUNDS_MICROS.len());
        self.counts.waits[bucket].fetch_add(1, Ordering::Relaxed);
        self.counts.wait_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Gives back what the region holds of keys it no longer spends: every [`IDLE_MS`], each
    /// global key this process asked for in the last minute whose pool spent nothing for
    /// [`IDLE_MS`] returns a slot's units to home (one replica of the region, under the lock).
    /// Ends with the limiter.
    fn sweep(self: &Arc<Self>) {
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(IDLE_MS)).await;
                let Some(me) = weak.upgrade() else {
                    return;
                };
                let now = me.clock.now_nanos();
                let keys: Vec<(Arc<[u8]>, crate::limiter::LimitParams)> = {
                    let mut seen = me.seen.lock();
                    seen.retain(|_, (_, at)| now.saturating_sub(*at) < 60_000_000_000);
                    seen.iter().map(|(k, (l, _))| (k.clone(), *l)).collect()
                };
                for (key, limit) in keys {
                    me.give_back_idle(key, limit).await;
                }
            }
        });
    }

    /// One key's idle give-back, if the pool elects this replica.
    async fn give_back_idle(&self, key: Arc<[u8]>, limit: crate::limiter::LimitParams) {
        let token = format!(
            "{:016x}{:x}",
            self.token_seed,
            TOKENS.fetch_add(1, Ordering::Relaxed)
        );
        let args = [
            "idle".to_owned(),
            (IDLE_MS * 1_000).to_string(),
            (3 * self.home_timeout_ms).to_string(),
            token.clone(),
        ];
        let Ok(v) = self.pool_call::<Vec<u64>>(&key, &args).await else {
            return;
        };
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        let Some(slot) = get(1).checked_sub(1) else {
            return;
        };
        let renewal = Renewal {
            key,
            limit,
            slot,
            give: get(2),
            want: 0,
            token,
            region_now: get(0),
        };
        self.renew(&renewal).await;
    }

    /// One global hit: spent from the pool, renewing and waiting as the module says. Its
    /// outcome, and the `took` of the units spent (0 when none), for a give-back.
    async fn hit(self: &Arc<Self>, hit: &Hit) -> Result<(HitOutcome, u64), LimiterError> {
        {
            let mut seen = self.seen.lock();
            if seen.len() < 10_000 || seen.contains_key(&hit.key) {
                seen.insert(hit.key.clone(), (hit.limit, self.clock.now_nanos()));
            }
        }
        self.sweep();
        let started = Instant::now();
        let rtt = Duration::from_nanos(self.rtt.load(Ordering::Relaxed));
        let budget = (rtt + rtt / 2)
            .max(Duration::from_millis(20))
            .min(Duration::from_millis(self.home_timeout_ms));
        let mut waited = false;
        let mut tries = 0;
        let outcome = loop {
            tries += 1;
            let (spent, renewal) = self.spend(hit).await?;
            let paid = spent.verdict != 0;
            if let Some(renewal) = renewal {
                if paid || tries > 2 || spent.short || spent.down {
                    // Paid, or home is short or down: the request does not wait for it.
                    let me = Arc::clone(self);
                    tokio::spawn(async move { me.renew_marked(renewal).await });
                } else {
                    // Nothing to spend until the share comes: take it now, then ask again.
                    waited = true;
                    self.renew_marked(renewal).await;
                    continue;
                }
            }
            if paid || tries > 2 {
                break spent;
            }
            if spent.waiting && started.elapsed() < budget {
                waited = true;
                self.wait_renewal(&hit.key, budget.saturating_sub(started.elapsed()))
                    .await;
                continue;
            }
            break spent;
        };
        if waited {
            self.record_wait(started.elapsed());
        }
        let now = outcome.now;
        let reset_nanos = outcome.reset.saturating_sub(now).saturating_mul(1_000);
        match outcome.verdict {
            0 => {
                if outcome.down {
                    self.counts.fallback_denied.fetch_add(1, Ordering::Relaxed);
                }
                let retry = if outcome.dry > 0 {
                    outcome.dry.saturating_mul(1_000)
                } else if outcome.down {
                    RETRY_MS * 1_000_000
                } else if outcome.short {
                    u64::try_from(rtt.as_nanos())
                        .unwrap_or(u64::MAX)
                        .max(1_000_000)
                } else if reset_nanos > 0 {
                    reset_nanos
                } else {
                    1_000_000_000
                };
                let denied = HitOutcome {
                    admitted: false,
                    remaining: 0,
                    reset_nanos: retry,
                    from_local_cache: false,
                };
                Ok((denied, 0))
            }
            verdict => {
                if verdict == 2 {
                    self.counts
                        .fallback_admitted
                        .fetch_add(1, Ordering::Relaxed);
                }
                let admitted = HitOutcome {
                    admitted: true,
                    remaining: outcome.left,
                    reset_nanos,
                    from_local_cache: false,
                };
                Ok((admitted, if verdict == 1 { outcome.took } else { 0 }))
            }
        }
    }

    /// Gives back `units` spent from the pool by a request that was then denied.
    async fn unspend(&self, hit: &Hit, units: u64, took: u64) {
        let args = ["unspend".to_owned(), units.to_string(), took.to_string()];
        if let Err(e) = self.pool_call::<u64>(&hit.key, &args).await {
            tracing::debug!(error = %e, "redis: units not given back to the share's pool");
        }
    }

    /// This region's view of a global key, for `/counters` and `/why`: the pool's slots
    /// (units left, until, granted), spent, admitted by the fallback, down since, home's
    /// remaining and reset as of the last renewal.
    pub(super) async fn peek(&self, key: &[u8]) -> Result<Vec<u64>, LimiterError> {
        self.pool_call(key, &["peek".to_owned()]).await
    }

    /// This region's share of `key`, read from its pool.
    pub(super) async fn view(&self, key: &[u8]) -> Result<ShareView, LimiterError> {
        let v = self.peek(key).await?;
        let get = |i: usize| v.get(i).copied().unwrap_or(0);
        let now = get(0);
        let mut view = ShareView {
            spent: get(7),
            fallback: get(8),
            home_down_nanos: (get(9) > 0).then(|| now.saturating_sub(get(9)) * 1_000),
            home_remaining: get(10),
            ..ShareView::default()
        };
        for slot in [1, 4] {
            if get(slot + 1) > now {
                view.held += get(slot);
                view.granted += get(slot + 2);
            }
        }
        Ok(view)
    }

    /// The home Redis's limiter (check-only reads and dry runs of global keys).
    pub(super) fn home(&self) -> &RedisLimiter {
        &self.home
    }

    pub(super) fn events(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counts;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut events = vec![
            ("global_share_taken", load(&c.taken)),
            ("global_share_returned", load(&c.returned)),
            ("global_share_lost", load(&c.lost)),
            ("global_home_failure", load(&c.home_failures)),
            ("global_fallback_admitted", load(&c.fallback_admitted)),
            ("global_fallback_denied", load(&c.fallback_denied)),
        ];
        // The wait for home, as a cumulative histogram: requests that waited at most each
        // bound, all that waited, and their total wait in microseconds.
        let (buckets, micros) = self.waits();
        let mut cumulative = 0;
        for (name, count) in WAIT_EVENTS.iter().zip(buckets) {
            cumulative += count;
            events.push((name, cumulative));
        }
        events.push(("global_wait_micros", micros));
        events
    }

    /// The wait for home: per bucket of [`WAIT_BOUNDS_MICROS`] (not cumulative; the last one
    /// above them), and the total in microseconds.
    pub(super) fn waits(&self) -> ([u64; 9], u64) {
        let mut out = [0; 9];
        for (o, w) in out.iter_mut().zip(&self.counts.waits) {
            *o = w.load(Ordering::Relaxed);
        }
        (out, self.counts.wait_micros.load(Ordering::Relaxed))
    }
}

/// Unix time in microseconds (the deadline of a call to home: the regions' clocks and home's
/// must agree within [`RETRY_MS`], as NTP keeps them).
fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl RedisLimiter {
    /// A request with a global hit: its global hits from the region's pool, then (unless they
    /// denied it) its local hits the usual way; global units not consumed go back.
    pub(super) async fn decide_global(
        &self,
        global: &Arc<Global>,
        batch: &Batch,
    ) -> Result<BatchOutcome, LimiterError> {
        let n = batch.hits.len();
        let mut outcomes: Vec<HitOutcome> = vec![
            HitOutcome {
                admitted: true,
                remaining: 0,
                reset_nanos: 0,
                from_local_cache: false,
            };
            n
        ];
        // Per global hit spent from a share: (index, took).
        let mut taken: Vec<(usize, u64)> = Vec::new();
        let mut local: Vec<usize> = Vec::new();
        for (i, hit) in batch.hits.iter().enumerate() {
            if !hit.limit.global {
                local.push(i);
                continue;
            }
            if hit.refund || hit.cost == 0 {
                // An anonymous refund of a global limit gives nothing back (its units were
                // counted at home when its share was taken); a check without a cost asks
                // the pool whether it holds anything.
                continue;
            }
            match global.hit(hit).await {
                Ok((outcome, took)) => {
                    if outcome.admitted && took > 0 {
                        taken.push((i, took));
                    }
                    outcomes[i] = outcome;
                }
                Err(e) => {
                    // The region's Redis failed: as any request, by `redis.on_error`.
                    self.give_back(global, batch, &taken, &[]).await;
                    return self.fallback(batch, e).await;
                }
            }
        }
        let verdicts: Vec<bool> = outcomes.iter().map(|o| o.admitted).collect();
        let before = plan::plan(&batch.hits, &verdicts);
        let mut verdicts = verdicts;
        if before.admitted && !local.is_empty() {
            let sub = Batch {
                hits: local.iter().map(|&i| batch.hits[i].clone()).collect(),
            };
            match self.decide_local(&sub).await {
                Ok(answer) => {
                    for (&i, o) in local.iter().zip(answer.hits) {
                        outcomes[i] = o;
                        verdicts[i] = o.admitted;
                    }
                }
                Err(e) => {
                    self.give_back(global, batch, &taken, &[]).await;
                    return Err(e);
                }
            }
        }
        let after = plan::plan(&batch.hits, &verdicts);
        self.give_back(global, batch, &taken, &after.consume).await;
        Ok(BatchOutcome {
            hits: outcomes,
            admitted: after.admitted,
        })
    }

    /// Gives back the units of `taken` whose hits are not consumed (`consume` empty: none is).
    async fn give_back(
        &self,
        global: &Arc<Global>,
        batch: &Batch,
        taken: &[(usize, u64)],
        consume: &[bool],
    ) {
        for &(i, took) in taken {
            if consume.get(i).copied().unwrap_or(false) {
                continue;
            }
            let hit = &batch.hits[i];
            global.unspend(hit, hit.cost, took).await;
        }
    }
}

/// Whether a check-only read or a dry run goes to the limiter itself or to home.
#[derive(Clone, Copy)]
pub(super) enum Read {
    Check,
    Dry,
}

impl RedisLimiter {
    /// A check-only read (`Read::Check`, costs 0) or a dry run of `batch`, its global hits
    /// asked of the home Redis (their state lives there), the others of this one.
    pub(super) async fn read_split(
        &self,
        batch: &Batch,
        how: Read,
    ) -> Result<BatchOutcome, LimiterError> {
        let global = self
            .global
            .as_ref()
            .filter(|_| batch.hits.iter().any(|h| h.limit.global));
        let Some(global) = global else {
            return match how {
                Read::Check => self.decide(batch).await,
                Read::Dry => self.dry(batch).await,
            };
        };
        let (far, near): (Vec<usize>, Vec<usize>) =
            (0..batch.hits.len()).partition(|&i| batch.hits[i].limit.global);
        let part = |idx: &[usize]| Batch {
            hits: idx.iter().map(|&i| batch.hits[i].clone()).collect(),
        };
        let home = global.home();
        let (far_out, near_out) = match how {
            Read::Check => (
                home.decide(&part(&far)).await?,
                if near.is_empty() {
                    None
                } else {
                    Some(self.decide(&part(&near)).await?)
                },
            ),
            Read::Dry => (
                home.dry(&part(&far)).await?,
                if near.is_empty() {
                    None
                } else {
                    Some(self.dry(&part(&near)).await?)
                },
            ),
        };
        let mut hits = vec![
            HitOutcome {
                admitted: true,
                remaining: 0,
                reset_nanos: 0,
                from_local_cache: false,
            };
            batch.hits.len()
        ];
        for (&i, h) in far.iter().zip(far_out.hits) {
            hits[i] = h;
        }
        if let Some(near_out) = near_out {
            for (&i, h) in near.iter().zip(near_out.hits) {
                hits[i] = h;
            }
        }
        let verdicts: Vec<bool> = hits.iter().map(|h| h.admitted).collect();
        let admitted = plan::plan(&batch.hits, &verdicts).admitted;
        Ok(BatchOutcome { hits, admitted })
    }

    /// This region's share of each of `keys` (global keys; `None` for the others, or without
    /// `redis.global_url`).
    pub(super) async fn shares_of(
        &self,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<ShareView>>, LimiterError> {
        let Some(global) = &self.global else {
            return Ok(vec![None; keys.len()]);
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(Some(global.view(key).await?));
        }
        Ok(out)
    }

    /// Whether `key`'s limit is global here (a pool read applies).
    pub(super) fn has_global(&self) -> bool {
        self.global.is_some()
    }
}
