//! Reservations (`Reserve`, `Commit`): an estimate charged to a key's limit now under an id,
//! settled later to the amount used (docs/holds.md, "Reservations"). The handler checks the
//! request as a Throttle key of the same fields (the same state), and each call is one atomic
//! operation of the backend on the key's state and its open reservations.

use crate::limiter::reserve::{ReserveOp, ReserveOutcome, ReserveRequest, records_key};
use crate::limiter::{Hit, HitOutcome, Role};
use crate::proto::sluice::v1::{self as pb, throttle_key::Id};

use super::params::{self, KeyPlan};
use super::{ThrottleResult, Throttler, answer, batch_of, ms_up, unavailable};

/// The longest a reservation stays open: a day.
pub(crate) const MAX_TTL_MS: u64 = 86_400_000;

const NANOS_PER_MS: u64 = 1_000_000;

/// A reservation's key, limit and quantity, as a Throttle key names them.
struct Named<'a> {
    id: Option<Id>,
    max_burst: u32,
    count: u32,
    period_ms: u64,
    algorithm: i32,
    name: &'a str,
}

impl Named<'_> {
    /// The key planned for `quantity` (named `field` in errors), as a Throttle call would.
    fn plan(&self, quantity: u64, field: &str, throttler: &Throttler) -> Result<KeyPlan, String> {
        let quantity = i64::try_from(quantity)
            .map_err(|_| format!("{field}: {quantity}, more than {}", i64::MAX))?;
        let request = pb::ThrottleRequest {
            keys: vec![pb::ThrottleKey {
                id: self.id.clone(),
                max_burst: self.max_burst,
                count: self.count,
                period_ms: self.period_ms,
                quantity: Some(quantity),
                refund: false,
                algorithm: self.algorithm,
            }],
            name: self.name.to_owned(),
        };
        let mut keys = params::plan(&request, &throttler.input).map_err(|e| {
            let e = e.strip_prefix("keys[0].").unwrap_or(&e);
            e.replacen("quantity", field, 1)
        })?;
        keys.pop().ok_or_else(|| "no key planned".to_owned())
    }
}

fn reserve_id(id: Option<&pb::reserve_request::Id>) -> Option<Id> {
    match id {
        Some(pb::reserve_request::Id::Key(k)) => Some(Id::Key(k.clone())),
        Some(pb::reserve_request::Id::KeyBytes(b)) => Some(Id::KeyBytes(b.clone())),
        None => None,
    }
}

fn commit_id(id: Option<&pb::commit_request::Id>) -> Option<Id> {
    match id {
        Some(pb::commit_request::Id::Key(k)) => Some(Id::Key(k.clone())),
        Some(pb::commit_request::Id::KeyBytes(b)) => Some(Id::KeyBytes(b.clone())),
        None => None,
    }
}

fn invalid(message: impl Into<String>) -> tonic::Status {
    tonic::Status::invalid_argument(message)
}

/// The ttl in nanoseconds, checked.
fn ttl_nanos(ttl_ms: u64) -> Result<u64, String> {
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(format!(
            "ttl_ms must be from 1 to {MAX_TTL_MS} (a day), got {ttl_ms}"
        ));
    }
    Ok(ttl_ms * NANOS_PER_MS)
}

/// The hit naming a planned key and its limit (its cost is the backend's to set).
fn template(key: &KeyPlan) -> Hit {
    Hit {
        key: key.key.clone(),
        limit: key.limit,
        cost: 0,
        refund: false,
        hold: None,
        group: 0,
        role: Role::Enforced,
    }
}

impl Throttler {
    /// `Reserve`: charges `amount` now under a new id, or nothing.
    pub(crate) async fn reserve(
        &self,
        request: &pb::ReserveRequest,
    ) -> Result<pb::ReserveResponse, tonic::Status> {
        let answer = self.reserve_inner(request).await;
        let result = match &answer {
            Ok(r) if !r.admitted => Ok(ThrottleResult::Limited),
            Ok(_) => Ok(ThrottleResult::Allowed),
            Err(s) => Err(s.code()),
        };
        self.observe(&request.name, result);
        answer
    }

    async fn reserve_inner(
        &self,
        request: &pb::ReserveRequest,
    ) -> Result<pb::ReserveResponse, tonic::Status> {
        let named = Named {
            id: reserve_id(request.id.as_ref()),
            max_burst: request.max_burst,
            count: request.count,
            period_ms: request.period_ms,
            algorithm: request.algorithm,
            name: &request.name,
        };
        if request.amount == 0 {
            return Err(invalid("amount must be at least 1"));
        }
        let key = named
            .plan(request.amount, "amount", self)
            .map_err(invalid)?;
        if key.never() {
            return Err(invalid(format!(
                "amount: {}, more than the key's limit {}: never admitted",
                request.amount, key.capacity
            )));
        }
        let ttl_nanos = ttl_nanos(request.ttl_ms).map_err(invalid)?;
        let keys = [key];
        let (batch, first) = batch_of(&keys);
        let hits = batch.hits.len();
        let op = ReserveRequest {
            records: records_key(&keys[0].key),
            ttl_nanos,
            op: ReserveOp::Reserve {
                batch,
                amount: request.amount,
            },
        };
        let outcome = self.run(&op).await?;
        let Some(decided) = outcome.outcome.filter(|o| o.hits.len() == hits) else {
            return Err(tonic::Status::resource_exhausted(format!(
                "{} reservations are open on the key, the most it keeps: commit some first",
                outcome.open
            )));
        };
        let result = answer(&keys, &first, &decided)
            .results
            .pop()
            .unwrap_or_default();
        Ok(pb::ReserveResponse {
            admitted: outcome.done,
            reservation_id: if outcome.done {
                outcome.id.saturating_add(1)
            } else {
                0
            },
            limit: result.limit,
            remaining: result.remaining,
            retry_after_ms: result.retry_after_ms,
            reset_after_ms: result.reset_after_ms,
            open: outcome.open,
        })
    }

    /// `Commit`: settles a reservation to `actual`.
    pub(crate) async fn commit(
        &self,
        request: &pb::CommitRequest,
    ) -> Result<pb::CommitResponse, tonic::Status> {
        let answer = self.commit_inner(request).await;
        let result = match &answer {
            Ok(_) => Ok(ThrottleResult::Allowed),
            Err(s) => Err(s.code()),
        };
        self.observe(&request.name, result);
        answer
    }

    async fn commit_inner(
        &self,
        request: &pb::CommitRequest,
    ) -> Result<pb::CommitResponse, tonic::Status> {
        let named = Named {
            id: commit_id(request.id.as_ref()),
            max_burst: request.max_burst,
            count: request.count,
            period_ms: request.period_ms,
            algorithm: request.algorithm,
            name: &request.name,
        };
        let key = named
            .plan(request.actual, "actual", self)
            .map_err(invalid)?;
        let Some(id) = request.reservation_id.checked_sub(1) else {
            return Err(invalid(
                "reservation_id: give the id Reserve returned (never 0)",
            ));
        };
        let op = ReserveRequest {
            records: records_key(&key.key),
            ttl_nanos: 1,
            op: ReserveOp::Commit {
                id,
                actual: request.actual,
                hit: template(&key),
            },
        };
        let outcome = self.run(&op).await?;
        Ok(settled(&outcome, request.actual))
    }

    async fn run(&self, op: &ReserveRequest) -> Result<ReserveOutcome, tonic::Status> {
        self.limiter.reserve(op).await.map_err(|e| unavailable(&e))
    }
}

/// A commit's answer from the backend's: the settling hit, then the check after it.
fn settled(outcome: &ReserveOutcome, actual: u64) -> pb::CommitResponse {
    let none = HitOutcome {
        admitted: true,
        remaining: 0,
        reset_nanos: 0,
        from_local_cache: false,
    };
    let after = outcome
        .outcome
        .as_ref()
        .and_then(|o| o.hits.get(1).copied())
        .unwrap_or(none);
    let (estimate, done) = (outcome.estimate, outcome.done);
    pb::CommitResponse {
        settled: done,
        estimate: if done { estimate } else { 0 },
        charged: if done {
            actual.saturating_sub(estimate)
        } else {
            0
        },
        given_back: if done {
            estimate.saturating_sub(actual)
        } else {
            0
        },
        owed: !after.admitted,
        remaining: if after.admitted { after.remaining } else { 0 },
        reset_after_ms: if after.admitted {
            ms_up(after.reset_nanos)
        } else {
            0
        },
        retry_after_ms: if after.admitted {
            -1
        } else {
            i64::try_from(ms_up(after.reset_nanos)).unwrap_or(i64::MAX)
        },
    }
}
