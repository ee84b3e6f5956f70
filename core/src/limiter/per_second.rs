//! Per-second limits in a store of their own (`redis.per_second_url`, envoyproxy/ratelimit's
//! `REDIS_PERSECOND`): a limiter that sends each hit by its limit's period to one of two
//! limiters, and keeps a request that spans both all or nothing.
//!
//! A hit goes to the per-second limiter when its limit's period is exactly one second (no
//! calendar) and it is not a `concurrency` limit (holds stay with the main store, where the
//! Throttle API's holds and reservations are kept); every other hit goes to the main one.
//!
//! A request whose hits all go to one side is that side's ordinary call: the same answer,
//! the same round trip as without the split. A request with hits on both sides:
//!
//! 1. both sides decide their hits at once, each descriptor's part there consuming when all
//!    of its hits there admit, whatever the rest of the request does (the hits are sent in
//!    shadow mode, which decides each descriptor on its own and never denies);
//! 2. the request is then planned whole ([`plan::plan`]) from every hit's verdict;
//! 3. what a side took but must not have (the request is denied, or the descriptor's other
//!    part was denied on the other side) is given back there by one more call; those hits
//!    report the state after the give-back.
//!
//! Between steps 1 and 3 other requests can see the tentative consumption: a request that
//! ends up denied may, for one round trip, make another look fuller than it is. That errs on
//! the side of denying, never of admitting more than a limit. A `concurrency` hold taken
//! by a request that ends up denied is kept until its release, as in a Redis Cluster
//! (docs/holds.md). If one side fails, what the other took is given back and the request
//! fails.

use std::sync::Arc;

use futures_util::future::join;

use super::counters::{BackendStatus, CounterPage, CounterQuery};
use super::holds::{HoldOutcome, HoldRequest};
use super::reserve::{ReserveOutcome, ReserveRequest};
use super::{
    Batch, BatchOutcome, BoxFuture, Hit, HitOutcome, LimitParams, Limiter, LimiterError, Role,
    StateKey, plan,
};
use crate::config::model::{Algorithm, Charge};

/// One second, in the limiters' nanoseconds.
const SECOND: u64 = 1_000_000_000;

/// A limiter over two: per-second limits on one, everything else on the other.
pub struct PerSecond {
    main: Arc<dyn Limiter>,
    second: Arc<dyn Limiter>,
}

/// Which limiter a hit goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Main,
    Second,
}

/// The outcome of a hit whose side failed.
const UNKNOWN: HitOutcome = HitOutcome {
    admitted: false,
    remaining: 0,
    reset_nanos: 0,
    from_local_cache: false,
};

impl PerSecond {
    /// Per-second limits on `second`, the rest on `main`.
    pub fn new(main: Arc<dyn Limiter>, second: Arc<dyn Limiter>) -> PerSecond {
        PerSecond { main, second }
    }

    /// Whether a limit lives in the per-second store.
    pub fn is_per_second(limit: &LimitParams) -> bool {
        limit.period_nanos == SECOND
            && limit.calendar.is_none()
            && limit.algorithm != Algorithm::Concurrency
            // A global limit is counted at home through the main side's regions, whatever
            // its unit.
            && !limit.global
    }

    fn side_of(hit: &Hit) -> Side {
        if Self::is_per_second(&hit.limit) {
            Side::Second
        } else {
            Side::Main
        }
    }

    fn limiter(&self, side: Side) -> &dyn Limiter {
        match side {
            Side::Main => self.main.as_ref(),
            Side::Second => self.second.as_ref(),
        }
    }

    /// The one side every hit of `batch` goes to, if there is one.
    fn only_side(batch: &Batch) -> Option<Side> {
        let first = batch.hits.first().map_or(Side::Main, Self::side_of);
        batch
            .hits
            .iter()
            .all(|h| Self::side_of(h) == first)
            .then_some(first)
    }

    async fn decide(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        if let Some(side) = Self::only_side(batch) {
            return self.limiter(side).check(batch).await;
        }
        let split = Split::of(batch);
        let (main, second) = join(
            self.main.check(&split.main.batch),
            self.second.check(&split.second.batch),
        )
        .await;
        let mut outcome = BatchOutcome {
            hits: vec![UNKNOWN; batch.hits.len()],
            admitted: false,
        };
        let mut failed = None;
        let mut applied = vec![false; batch.hits.len()];
        for (part, result) in [(&split.main, main), (&split.second, second)] {
            match result {
                Ok(o) => part.scatter(&o, &mut outcome, Some(&mut applied)),
                Err(e) => failed = Some(e),
            }
        }
        let verdicts: Vec<bool> = outcome.hits.iter().map(|h| h.admitted).collect();
        let planned = plan::plan(&batch.hits, &verdicts);
        outcome.admitted = planned.admitted && failed.is_none();
        let undo: Vec<bool> = batch
            .hits
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let keep = failed.is_none() && planned.consume.get(i) == Some(&true);
                applied.get(i) == Some(&true)
                    && !keep
                    && h.limit.algorithm != Algorithm::Concurrency
            })
            .collect();
        self.give_back(batch, &undo, &mut outcome).await?;
        match failed {
            Some(e) => Err(e),
            None => Ok(outcome),
        }
    }

    /// Gives back on each side the hits `undo` marks; they report the state after it.
    async fn give_back(
        &self,
        batch: &Batch,
        undo: &[bool],
        outcome: &mut BatchOutcome,
    ) -> Result<(), LimiterError> {
        let main = Part::of(batch, Side::Main, Some(undo), true);
        let second = Part::of(batch, Side::Second, Some(undo), true);
        let (m, s) = join(
            self.check_part(Side::Main, &main),
            self.check_part(Side::Second, &second),
        )
        .await;
        for (part, result) in [(&main, m), (&second, s)] {
            let mut given = result?;
            for hit in &mut given.hits {
                // Reported as part of a denied request: admitted by its own limit, nothing taken.
                hit.admitted = true;
            }
            part.scatter(&given, outcome, None);
        }
        Ok(())
    }

    /// `part` on `side`, or nothing when it has no hits.
    async fn check_part(&self, side: Side, part: &Part) -> Result<BatchOutcome, LimiterError> {
        if part.batch.hits.is_empty() {
            return Ok(BatchOutcome {
                hits: Vec::new(),
                admitted: true,
            });
        }
        self.limiter(side).check(&part.batch).await
    }

    async fn dry(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        if let Some(side) = Self::only_side(batch) {
            return self.limiter(side).dry_run(batch).await;
        }
        let split = Split::of(batch);
        let (main, second) = join(
            self.main.dry_run(&split.main.batch),
            self.second.dry_run(&split.second.batch),
        )
        .await;
        let mut outcome = BatchOutcome {
            hits: vec![UNKNOWN; batch.hits.len()],
            admitted: false,
        };
        split.main.scatter(&main?, &mut outcome, None);
        split.second.scatter(&second?, &mut outcome, None);
        let verdicts: Vec<bool> = outcome.hits.iter().map(|h| h.admitted).collect();
        outcome.admitted = plan::plan(&batch.hits, &verdicts).admitted;
        Ok(outcome)
    }

    async fn reset_keys(&self, keys: &[StateKey]) -> Result<usize, LimiterError> {
        let (main, second) = join(self.main.reset(keys), self.second.reset(keys)).await;
        Ok(main? + second?)
    }

    /// The main store's keys, then the per-second store's: a cursor is `m:` or `s:` and the
    /// side's own cursor.
    async fn page(&self, query: &CounterQuery<'_>) -> Result<CounterPage, LimiterError> {
        let (side, inner) = match query.cursor {
            Some(c) if c.starts_with("s:") => (Side::Second, c.get(2..)),
            Some(c) => (Side::Main, c.get(2..)),
            None => (Side::Main, None),
        };
        let inner = inner.filter(|c| !c.is_empty());
        let sub = CounterQuery {
            cursor: inner,
            ..*query
        };
        let mut page = self.limiter(side).counters(&sub).await?;
        page.next = match (side, page.next.take()) {
            (Side::Main, Some(next)) => Some(format!("m:{next}")),
            (Side::Main, None) => Some("s:".to_owned()),
            (Side::Second, Some(next)) => Some(format!("s:{next}")),
            (Side::Second, None) => None,
        };
        Ok(page)
    }

    async fn blocks(&self, keys: &[&[u8]]) -> Result<Vec<Option<u64>>, LimiterError> {
        let (main, second) = join(self.main.blocked(keys), self.second.blocked(keys)).await;
        Ok(main?
            .into_iter()
            .zip(second?)
            .map(|(a, b)| a.max(b))
            .collect())
    }

    async fn probe_both(&self) {
        let (main, second) = (self.main.probe(), self.second.probe());
        match (main, second) {
            (Some(m), Some(s)) => drop(join(m, s).await),
            (Some(m), None) => m.await,
            (None, Some(s)) => s.await,
            (None, None) => {}
        }
    }

    async fn listen_both(&self) {
        let (main, second) = (self.main.listen(), self.second.listen());
        match (main, second) {
            (Some(m), Some(s)) => drop(join(m, s).await),
            (Some(m), None) => m.await,
            (None, Some(s)) => s.await,
            (None, None) => {}
        }
    }
}

/// A request cut in two: the hits of each side, as sent there.
struct Split {
    main: Part,
    second: Part,
}

impl Split {
    fn of(batch: &Batch) -> Split {
        Split {
            main: Part::of(batch, Side::Main, None, false),
            second: Part::of(batch, Side::Second, None, false),
        }
    }
}

/// The hits of one side: each in shadow mode (decided per descriptor, never denying the
/// part), and where it came from in the request.
struct Part {
    batch: Batch,
    indices: Vec<usize>,
}

impl Part {
    /// The hits of `side` (only those `only` marks, when given), in shadow mode; flipped
    /// from take to give back (and back) when `give_back`.
    fn of(batch: &Batch, side: Side, only: Option<&[bool]>, give_back: bool) -> Part {
        let mut part = Part {
            batch: Batch::default(),
            indices: Vec::new(),
        };
        for (i, hit) in batch.hits.iter().enumerate() {
            let marked = only.is_none_or(|o| o.get(i) == Some(&true));
            if PerSecond::side_of(hit) != side || !marked {
                continue;
            }
            part.indices.push(i);
            part.batch.hits.push(Hit {
                role: Role::Shadow,
                refund: hit.refund != give_back,
                ..hit.clone()
            });
        }
        part
    }

    /// Puts this part's outcomes in their places in `outcome`; with `applied`, marks the
    /// hits whose cost the side took (or gave back).
    fn scatter(
        &self,
        part: &BatchOutcome,
        outcome: &mut BatchOutcome,
        applied: Option<&mut Vec<bool>>,
    ) {
        for (&i, hit) in self.indices.iter().zip(&part.hits) {
            if let Some(slot) = outcome.hits.get_mut(i) {
                *slot = *hit;
            }
        }
        let Some(applied) = applied else {
            return;
        };
        let verdicts: Vec<bool> = part.hits.iter().map(|h| h.admitted).collect();
        let planned = plan::plan(&self.batch.hits, &verdicts);
        for ((&i, hit), consumed) in self
            .indices
            .iter()
            .zip(&self.batch.hits)
            .zip(planned.consume)
        {
            let took = consumed && hit.cost > 0 && hit.limit.charge != Charge::Always;
            if let Some(slot) = applied.get_mut(i) {
                *slot = took;
            }
        }
    }
}

impl Limiter for PerSecond {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(self.decide(batch))
    }

    fn name(&self) -> &'static str {
        self.main.name()
    }

    fn hold<'a>(
        &'a self,
        request: &'a HoldRequest,
    ) -> BoxFuture<'a, Result<HoldOutcome, LimiterError>> {
        self.main.hold(request)
    }

    fn reserve<'a>(
        &'a self,
        request: &'a ReserveRequest,
    ) -> BoxFuture<'a, Result<ReserveOutcome, LimiterError>> {
        self.main.reserve(request)
    }

    fn dry_run<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(self.dry(batch))
    }

    fn reset<'a>(&'a self, keys: &'a [StateKey]) -> BoxFuture<'a, Result<usize, LimiterError>> {
        Box::pin(self.reset_keys(keys))
    }

    fn listen(&self) -> Option<BoxFuture<'_, ()>> {
        Some(Box::pin(self.listen_both()))
    }

    fn sweep(&self) -> usize {
        self.main.sweep() + self.second.sweep()
    }

    fn held(&self) -> usize {
        self.main.held() + self.second.held()
    }

    fn probe(&self) -> Option<BoxFuture<'_, ()>> {
        Some(Box::pin(self.probe_both()))
    }

    fn ready(&self) -> Result<(), String> {
        self.main.ready()?;
        self.second
            .ready()
            .map_err(|e| format!("per-second store: {e}"))
    }

    /// Both stores' events, summed by name.
    fn events(&self) -> Vec<(&'static str, u64)> {
        let mut events = self.main.events();
        for (name, n) in self.second.events() {
            match events.iter_mut().find(|(e, _)| *e == name) {
                Some((_, total)) => *total += n,
                None => events.push((name, n)),
            }
        }
        events
    }

    fn counters<'a>(
        &'a self,
        query: &'a CounterQuery<'a>,
    ) -> BoxFuture<'a, Result<CounterPage, LimiterError>> {
        Box::pin(self.page(query))
    }

    fn blocked<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<u64>>, LimiterError>> {
        Box::pin(self.blocks(keys))
    }

    /// Global limits live on the main side (`is_per_second`).
    fn shares<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
    ) -> BoxFuture<'a, Result<Vec<Option<crate::limiter::counters::ShareView>>, LimiterError>> {
        self.main.shares(keys)
    }

    /// Each key's from the side its limit lives on.
    fn leases<'a>(
        &'a self,
        keys: &'a [(&'a [u8], LimitParams)],
    ) -> BoxFuture<'a, Result<Vec<Option<crate::limiter::counters::LeaseView>>, LimiterError>> {
        Box::pin(async move {
            let (second, main): (Vec<_>, Vec<_>) =
                keys.iter().partition(|(_, l)| Self::is_per_second(l));
            let (main, second) = join(self.main.leases(&main), self.second.leases(&second)).await;
            let (mut main, mut second) = (main?.into_iter(), second?.into_iter());
            Ok(keys
                .iter()
                .map(|(_, l)| {
                    let side = if Self::is_per_second(l) {
                        &mut second
                    } else {
                        &mut main
                    };
                    side.next().flatten()
                })
                .collect())
        })
    }

    /// The main store's, with the per-second store's unreachability when only it fails.
    fn status(&self) -> BackendStatus {
        let mut status = self.main.status();
        let second = self.second.status();
        if let (Some(Ok(())), Some(Err(e))) = (&status.reachable, &second.reachable) {
            status.reachable = Some(Err(format!("per-second store: {e}")));
        }
        status.deny_cache = match (status.deny_cache, second.deny_cache) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        status.keys_held = match (status.keys_held, second.keys_held) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        status.breaker_open = match (status.breaker_open, second.breaker_open) {
            (Some(a), Some(b)) => Some(a || b),
            (a, b) => a.or(b),
        };
        status
    }
}

impl std::fmt::Debug for PerSecond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerSecond").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{ManualClock, MemoryLimiter};

    const MINUTE: u64 = 60 * SECOND;

    fn window(key: &str, group: usize, quota: u32, period_nanos: u64) -> Hit {
        let mut hit = crate::limiter::funnel_hit(
            key,
            group,
            Role::Enforced,
            Charge::Admitted,
            quota,
            period_nanos,
        );
        hit.limit.algorithm = Algorithm::FixedWindow;
        hit
    }

    type Memory = Arc<MemoryLimiter<ManualClock>>;

    fn limiters() -> (PerSecond, Memory, Memory) {
        let clock = ManualClock::at(1_000 * SECOND);
        let main = Arc::new(MemoryLimiter::with_clock(100, clock.clone()));
        let second = Arc::new(MemoryLimiter::with_clock(100, clock));
        (PerSecond::new(main.clone(), second.clone()), main, second)
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map(|rt| rt.block_on(f))
            .unwrap_or_else(|e| panic!("runtime: {e}"))
    }

    #[test]
    fn per_second_limits_go_to_their_own_store() {
        let (both, main, second) = limiters();
        let batch = Batch {
            hits: vec![window("s", 0, 2, SECOND), window("m", 0, 3, MINUTE)],
        };
        let outcome = block_on(both.check(&batch)).unwrap();
        assert!(outcome.admitted);
        assert_eq!(outcome.hits[0].remaining, 1);
        assert_eq!(outcome.hits[1].remaining, 2);
        assert_eq!((main.len(), second.len()), (1, 1));
    }

    /// A global limit of a second is counted on the main side, whose regions count it at
    /// home: never in the per-second store.
    #[test]
    fn a_global_limit_of_a_second_stays_on_the_main_side() {
        let (both, main, second) = limiters();
        let mut global = window("g", 0, 2, SECOND);
        global.limit.global = true;
        let outcome = block_on(both.check(&Batch { hits: vec![global] })).unwrap();
        assert!(outcome.admitted);
        assert_eq!((main.len(), second.len()), (1, 0));
    }

    /// A descriptor whose per-minute limit is spent: its per-second take is given back, so
    /// the per-second limit still admits twice afterwards.
    #[test]
    fn a_denial_on_one_side_gives_back_the_other() {
        let (both, _, second) = limiters();
        let spend = Batch {
            hits: vec![window("m", 0, 1, MINUTE)],
        };
        assert!(block_on(both.check(&spend)).unwrap().admitted);
        let batch = Batch {
            hits: vec![window("s", 0, 2, SECOND), window("m", 0, 1, MINUTE)],
        };
        let denied = block_on(both.check(&batch)).unwrap();
        assert!(!denied.admitted);
        assert!(denied.hits[0].admitted && !denied.hits[1].admitted);
        assert_eq!(
            denied.hits[0].remaining, 2,
            "nothing kept on the per-second side"
        );
        let alone = Batch {
            hits: vec![window("s", 0, 2, SECOND)],
        };
        for left in [1, 0] {
            let o = block_on(second.check(&alone)).unwrap();
            assert!(o.admitted);
            assert_eq!(o.hits[0].remaining, left);
        }
    }

    /// Another descriptor's denial on the per-second side undoes this one's per-minute take.
    #[test]
    fn an_enforced_denial_across_descriptors_undoes_the_admitted_one() {
        let (both, main, _) = limiters();
        let batch = Batch {
            hits: vec![window("m", 0, 5, MINUTE), window("s", 1, 0, SECOND)],
        };
        let denied = block_on(both.check(&batch)).unwrap();
        assert!(!denied.admitted);
        assert_eq!(denied.hits[0].remaining, 5);
        let m = Batch {
            hits: vec![window("m", 0, 5, MINUTE)],
        };
        assert_eq!(block_on(main.check(&m)).unwrap().hits[0].remaining, 4);
    }

    /// A store that always fails.
    struct Down;

    impl Limiter for Down {
        fn check<'a>(
            &'a self,
            _batch: &'a Batch,
        ) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
            Box::pin(std::future::ready(Err(LimiterError {
                backend: "redis",
                message: "down".to_owned(),
                transient: true,
                source: None,
            })))
        }

        fn name(&self) -> &'static str {
            "redis"
        }
    }

    /// The per-second store fails: the request fails, and what the main store took is
    /// given back.
    #[test]
    fn a_failed_side_fails_the_request_and_the_other_gives_back() {
        let clock = ManualClock::at(1_000 * SECOND);
        let main = Arc::new(MemoryLimiter::with_clock(100, clock));
        let both = PerSecond::new(main.clone(), Arc::new(Down));
        let batch = Batch {
            hits: vec![window("m", 0, 3, MINUTE), window("s", 0, 2, SECOND)],
        };
        let err = block_on(both.check(&batch)).unwrap_err();
        assert!(err.transient && err.message == "down", "{err}");
        let m = Batch {
            hits: vec![window("m", 0, 3, MINUTE)],
        };
        assert_eq!(block_on(main.check(&m)).unwrap().hits[0].remaining, 2);
        let only_main = block_on(both.check(&m)).unwrap();
        assert_eq!(
            only_main.hits[0].remaining, 1,
            "one store alone: its own call"
        );
    }
}
