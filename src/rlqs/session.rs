//! One stream: the buckets its data plane reports, what each was last told, and the timer
//! work (lifting a blanket deny once the shared quota refills, rebalancing when members come
//! and go, abandoning buckets whose rule went away, forgetting buckets no longer reported).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::Rlqs;
use super::bucket::{self, BucketKey, Limited, Target};
use super::share::{self, TokenBucketSpec};
use super::wire::{self, Assignment, Usage};
use crate::config::model::Algorithm;
use crate::limiter::{Batch, BatchOutcome, Hit};
use crate::proto::envoy::service::rate_limit_quota::v3 as pb;
use crate::rules::RuleSet;
use pb::rate_limit_quota_response::BucketAction;

/// A bucket this stream holds.
struct Held {
    serial: u64,
    target: Target,
    /// What it was last told.
    sent: Option<Assignment>,
    last_report: Instant,
    /// Under a blanket deny until the shared state is out of debt, checked at this time.
    deny_until: Option<Instant>,
    /// The registry generation its share was computed at.
    generation: u64,
    demand: Option<u64>,
}

/// One stream's state. Dropping it gives back everything it held.
pub(super) struct Session {
    ctx: Arc<Rlqs>,
    id: u64,
    domain: Option<String>,
    rules: Arc<RuleSet>,
    buckets: HashMap<BucketKey, Held>,
    next_serial: u64,
}

impl Session {
    pub(super) fn new(ctx: Arc<Rlqs>, id: u64) -> Session {
        let rules = ctx.rules.load_full();
        Session {
            ctx,
            id,
            domain: None,
            rules,
            buckets: HashMap::new(),
            next_serial: 0,
        }
    }

    /// Handles one usage report: the actions to send back, if any.
    pub(super) async fn report(
        &mut self,
        report: pb::RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, Status> {
        let bounds = *self.ctx.engine.input_limits();
        let domain = wire::domain(&report, self.domain.as_deref(), &bounds)?;
        let usages = wire::usages(&report, &bounds)?;
        self.domain = Some(domain);
        let mut actions = self.refresh_rules();
        let now = Instant::now();
        for usage in usages {
            if let Some(action) = self.usage(usage, now).await {
                actions.push(action);
            }
        }
        Ok(actions)
    }

    async fn usage(&mut self, usage: Usage, now: Instant) -> Option<BucketAction> {
        let first = !self.buckets.contains_key(&usage.key);
        if first && !self.take(&usage.key, now) {
            return None;
        }
        let domain = self.domain.clone().unwrap_or_default();
        let held = self.buckets.get_mut(&usage.key)?;
        held.last_report = now;
        if let Some(rule) = held.target.rule() {
            self.ctx
                .observer
                .reported(&domain, rule, usage.allowed, usage.denied);
        }
        let limited = match &held.target {
            Target::Unmatched => return None,
            Target::Unlimited { .. } => return Some(self.send(&usage.key, Assignment::AllowAll)),
            Target::Limited(l) => l.clone(),
        };
        if let Some(d) = share::demand(
            usage.allowed.saturating_add(usage.denied),
            usage.elapsed_secs,
        ) {
            held.demand = Some(d);
        }
        let charged = charge(&limited, &usage, first);
        let outcome = match self.ctx.engine.check_batch(&charged).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "rlqs: usage not charged; the bucket keeps its assignment");
                return None;
            }
        };
        if limited.shadow {
            return Some(self.send(&usage.key, Assignment::AllowAll));
        }
        if outcome.hits.iter().any(|h| !h.admitted) {
            return self.deny(&usage.key, &limited, now).await;
        }
        self.assign(&usage.key, &limited, false).await
    }

    /// Starts holding `key` if the rules give it an assignment and the bounds allow.
    fn take(&mut self, key: &BucketKey, now: Instant) -> bool {
        let domain = self
            .rules
            .domain(self.domain.as_deref().unwrap_or_default());
        let target = bucket::resolve(domain, key, self.ctx.engine.shadow_mode());
        if matches!(target, Target::Unmatched) {
            return false;
        }
        let s = &self.ctx.settings;
        let total = self.ctx.buckets.fetch_add(1, Ordering::Relaxed);
        if self.buckets.len() >= s.max_buckets_per_stream || total >= s.max_buckets {
            self.ctx.buckets.fetch_sub(1, Ordering::Relaxed);
            self.ctx.observer.refused("bucket");
            return false;
        }
        self.ctx.observer.buckets(1);
        let serial = self.next_serial;
        self.next_serial += 1;
        self.buckets.insert(
            key.clone(),
            Held {
                serial,
                target,
                sent: None,
                last_report: now,
                deny_until: None,
                generation: 0,
                demand: None,
            },
        );
        true
    }

    /// A blanket deny until the shared state is out of debt.
    async fn deny(
        &mut self,
        key: &BucketKey,
        limited: &Limited,
        now: Instant,
    ) -> Option<BucketAction> {
        let wait = match self.peek(limited).await {
            Some(o) => o
                .hits
                .iter()
                .filter(|h| !h.admitted)
                .map(|h| h.reset_nanos)
                .max()
                .unwrap_or(0),
            None => 1_000_000_000,
        };
        let held = self.buckets.get_mut(key)?;
        // Checked again then, and at least every second (another replica's or the clock's
        // view may differ from this estimate).
        let wait = wait.clamp(1_000_000, 1_000_000_000);
        held.deny_until = Some(now + Duration::from_nanos(wait));
        // Sent even when unchanged: that extends its time to live.
        Some(self.send(key, Assignment::DenyAll))
    }

    /// A token bucket of this member's share; the current one again when it still fits
    /// (so Envoy keeps its bucket instead of starting a full one).
    async fn assign(
        &mut self,
        key: &BucketKey,
        limited: &Limited,
        force: bool,
    ) -> Option<BucketAction> {
        let total = bucket::rate_of(&limited.governing);
        let state = governing_key(limited);
        let (id, held) = (self.id, self.buckets.get_mut(key)?);
        held.deny_until = None;
        let (rate, generation) =
            self.ctx
                .registry
                .share(&state, (id, held.serial), held.demand, total);
        held.generation = generation;
        if let (false, Some(Assignment::TokenBucket(cur))) = (force, held.sent)
            && keeps(&cur, rate)
        {
            return Some(self.send(key, Assignment::TokenBucket(cur)));
        }
        let previous = held.sent;
        let left = match self.peek(limited).await {
            Some(o) => o.hits.iter().map(|h| h.remaining).min().unwrap_or(0),
            None => 0,
        };
        let left = left.min(u64::from(limited.governing.burst));
        let assignment = match share::token_bucket(rate, total, left) {
            None => Assignment::DenyAll,
            Some(tb) => Assignment::TokenBucket(distinct(tb, previous)),
        };
        Some(self.send(key, assignment))
    }

    /// The state of the limits now, consuming nothing (`None` when the backend fails).
    async fn peek(&self, limited: &Limited) -> Option<BatchOutcome> {
        let batch = Batch {
            hits: limited.hits.clone(),
        };
        self.ctx.engine.check_batch(&batch).await.ok()
    }

    fn send(&mut self, key: &BucketKey, assignment: Assignment) -> BucketAction {
        if let Some(held) = self.buckets.get_mut(key) {
            held.sent = Some(assignment);
        }
        self.ctx.observer.assigned(assignment.kind());
        wire::assign(key, assignment, self.ctx.settings.assignment_ttl_secs)
    }

    /// The timer: rules changes, stale buckets, denials to lift, members that came or went.
    pub(super) async fn tick(&mut self) -> Vec<BucketAction> {
        let mut actions = self.refresh_rules();
        let now = Instant::now();
        self.forget_stale(now);
        let due: Vec<(BucketKey, Arc<Limited>, bool)> = self
            .buckets
            .iter()
            .filter_map(|(key, held)| {
                let Target::Limited(l) = &held.target else {
                    return None;
                };
                if l.shadow {
                    return None;
                }
                if let Some(until) = held.deny_until {
                    return (until <= now).then(|| (key.clone(), l.clone(), true));
                }
                let moved = matches!(held.sent, Some(Assignment::TokenBucket(_)))
                    && self.ctx.registry.generation(&governing_key(l)) != held.generation;
                moved.then(|| (key.clone(), l.clone(), false))
            })
            .collect();
        for (key, limited, denied) in due {
            let action = if denied {
                self.lift(&key, &limited, now).await
            } else {
                self.rebalance(&key, &limited).await
            };
            actions.extend(action);
        }
        actions
    }

    /// After a deny: a token bucket once the shared state is out of debt, else a later check.
    async fn lift(
        &mut self,
        key: &BucketKey,
        limited: &Limited,
        now: Instant,
    ) -> Option<BucketAction> {
        let out_of_debt = self
            .peek(limited)
            .await
            .is_some_and(|o| o.hits.iter().all(|h| h.admitted));
        if out_of_debt {
            // Only what changes is pushed (a zero quota stays denied: nothing new to say).
            let before = self.buckets.get(key)?.sent;
            let action = self.assign(key, limited, true).await;
            return (self.buckets.get(key)?.sent != before)
                .then_some(action)
                .flatten();
        }
        let held = self.buckets.get_mut(key)?;
        held.deny_until = Some(now + Duration::from_millis(500));
        None
    }

    /// Members came or went on the shared state: a new token bucket if the share moved.
    async fn rebalance(&mut self, key: &BucketKey, limited: &Limited) -> Option<BucketAction> {
        let before = self.buckets.get(key)?.sent;
        let action = self.assign(key, limited, false).await;
        let after = self.buckets.get(key)?.sent;
        (before != after).then_some(action).flatten()
    }

    /// Forgets the buckets not reported for the assignment's time to live.
    fn forget_stale(&mut self, now: Instant) {
        let ttl = Duration::from_secs(self.ctx.settings.assignment_ttl_secs);
        let stale: Vec<BucketKey> = self
            .buckets
            .iter()
            .filter(|(_, h)| now.duration_since(h.last_report) > ttl)
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            self.drop_bucket(&key);
        }
    }

    /// On a rules change: buckets re-resolved; those no longer matching are abandoned.
    fn refresh_rules(&mut self) -> Vec<BucketAction> {
        let current = self.ctx.rules.load_full();
        if Arc::ptr_eq(&current, &self.rules) {
            return Vec::new();
        }
        self.rules = current;
        let domain = self.domain.clone().unwrap_or_default();
        let shadow = self.ctx.engine.shadow_mode();
        let keys: Vec<BucketKey> = self.buckets.keys().cloned().collect();
        let mut actions = Vec::new();
        for key in keys {
            let target = bucket::resolve(self.rules.domain(&domain), &key, shadow);
            if matches!(target, Target::Unmatched) {
                self.drop_bucket(&key);
                self.ctx.observer.assigned("abandon");
                actions.push(wire::abandon(&key));
                continue;
            }
            self.leave(&key);
            if let Some(held) = self.buckets.get_mut(&key) {
                held.target = target;
                held.sent = None;
                held.deny_until = None;
            }
        }
        actions
    }

    fn drop_bucket(&mut self, key: &BucketKey) {
        self.leave(key);
        if self.buckets.remove(key).is_some() {
            self.ctx.buckets.fetch_sub(1, Ordering::Relaxed);
            self.ctx.observer.buckets(-1);
        }
    }

    /// Leaves the registry for `key` (its share goes to the others).
    fn leave(&self, key: &BucketKey) {
        if let Some(held) = self.buckets.get(key)
            && let Target::Limited(l) = &held.target
        {
            self.ctx
                .registry
                .leave(&governing_key(l), (self.id, held.serial));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let keys: Vec<BucketKey> = self.buckets.keys().cloned().collect();
        for key in keys {
            self.drop_bucket(&key);
        }
    }
}

/// The state key whose members share a rate: the governing limit's.
fn governing_key(l: &Limited) -> Arc<[u8]> {
    l.hits
        .iter()
        .find(|h| h.limit == l.governing)
        .or(l.hits.first())
        .map(|h| h.key.clone())
        .unwrap_or_else(|| Arc::from(&b""[..]))
}

/// The batch that charges a report: each limit's cost is what was allowed, checked with room
/// for the time the report covers (it is charged at once, though it happened over
/// `elapsed`). A bucket's first report on a stream is charged at most that room (what a
/// reconnecting data plane admitted meanwhile was under its fallback, not a share).
fn charge(limited: &Limited, usage: &Usage, first: bool) -> Batch {
    let hits = limited
        .hits
        .iter()
        .map(|h| {
            let room = share::report_allowance(bucket::rate_of(&h.limit), usage.elapsed_secs);
            let mut hit: Hit = h.clone();
            hit.cost = usage.allowed;
            if first {
                hit.cost = hit.cost.min(room.saturating_add(u64::from(h.limit.burst)));
            }
            let room = u32::try_from(room).unwrap_or(u32::MAX);
            match h.limit.algorithm {
                Algorithm::Funnel | Algorithm::TokenBucket => {
                    hit.limit.burst = hit.limit.burst.saturating_add(room);
                }
                Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                    hit.limit.quota = hit.limit.quota.saturating_add(room);
                }
                // Its quota is its memory: each report is checked as one instant.
                // Concurrency: holds are not usage; each report is one instant too.
                Algorithm::SlidingLog | Algorithm::Concurrency => {}
            }
            hit
        })
        .collect();
    Batch { hits }
}

/// Whether the current token bucket still fits a share of `rate`: never above it, and not
/// more than a fifth below (small rises are not worth a new, full bucket).
fn keeps(cur: &TokenBucketSpec, rate: u64) -> bool {
    let cur_rate = u128::from(cur.tokens_per_fill) * u128::from(share::NANOS)
        / u128::from(cur.fill_interval_secs.max(1));
    let rate = u128::from(rate);
    cur_rate <= rate && cur_rate * 5 / 4 > rate
}

/// Envoy tells token buckets apart by capacity, tokens per fill, and the sub-second part of
/// the interval only: a new bucket that differs from the previous one in whole seconds only
/// gets one token less per fill (still within its share) so that Envoy applies it.
fn distinct(tb: TokenBucketSpec, previous: Option<Assignment>) -> TokenBucketSpec {
    match previous {
        Some(Assignment::TokenBucket(p))
            if p.max_tokens == tb.max_tokens
                && p.tokens_per_fill == tb.tokens_per_fill
                && p.fill_interval_secs != tb.fill_interval_secs =>
        {
            if tb.tokens_per_fill > 1 {
                TokenBucketSpec {
                    tokens_per_fill: tb.tokens_per_fill - 1,
                    ..tb
                }
            } else {
                TokenBucketSpec {
                    max_tokens: tb.max_tokens.saturating_add(1),
                    ..tb
                }
            }
        }
        _ => tb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb(max: u32, fill: u32, secs: u64) -> TokenBucketSpec {
        TokenBucketSpec {
            max_tokens: max,
            tokens_per_fill: fill,
            fill_interval_secs: secs,
        }
    }

    #[test]
    fn a_bucket_is_kept_while_it_fits_the_share() {
        let cur = tb(10, 10, 1);
        assert!(keeps(&cur, 10 * share::NANOS));
        assert!(keeps(&cur, 12 * share::NANOS));
        assert!(
            !keeps(&cur, 25 * share::NANOS / 2),
            "a rise of a fourth is worth a new bucket"
        );
        assert!(!keeps(&cur, 9 * share::NANOS), "never above the share");
    }

    #[test]
    fn buckets_envoy_would_confuse_are_made_distinct() {
        let prev = Some(Assignment::TokenBucket(tb(5, 100, 10)));
        assert_eq!(distinct(tb(5, 100, 20), prev), tb(5, 99, 20));
        assert_eq!(distinct(tb(5, 100, 10), prev), tb(5, 100, 10));
        let one = Some(Assignment::TokenBucket(tb(5, 1, 10)));
        assert_eq!(distinct(tb(5, 1, 20), one), tb(6, 1, 20));
    }
}
