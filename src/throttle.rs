//! `sluice.v1.Throttle`: redis-cell's `CL.THROTTLE` as gRPC, for services that carry their own
//! limits. The handler only converts: [`params`] checks a request and plans its keys, one
//! [`Batch`] goes to the limiter (either backend, all or nothing), and the outcome becomes
//! CL.THROTTLE's five numbers per key, in milliseconds. docs/throttle.md has the semantics.
//!
//! Each key that may be denied takes two hits: the hit that takes its quantity, and a
//! check-only companion (cost 0, shadow: it never denies) whose report is read from the
//! committed state. A denied key's own report says when it would be admitted; the companion
//! says what it holds now (`remaining`, `reset_after`), as CL.THROTTLE reports both.
//!
//! Each call is a debug-level `throttle` span, which joins the caller's trace (`traceparent`
//! or B3 in the metadata) with the `otel` feature, as RLS requests do.

pub mod key;
pub mod params;
pub mod reserve;

use std::sync::Arc;

use tracing::Instrument as _;

use crate::config::settings::InputSettings;
use crate::limiter::holds::{HoldOp, HoldOutcome, HoldRequest};
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, Limiter, LimiterError, Role};
use crate::proto::sluice::v1::{self as pb, throttle_server};
use crate::telemetry::propagation::join_caller_trace;
use params::KeyPlan;

pub use pb::throttle_server::ThrottleServer;

/// How a Throttle call ended, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ThrottleResult {
    Allowed,
    Limited,
    Invalid,
    Unavailable,
}

impl ThrottleResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ThrottleResult::Allowed => "allowed",
            ThrottleResult::Limited => "limited",
            ThrottleResult::Invalid => "invalid",
            ThrottleResult::Unavailable => "unavailable",
        }
    }
}

/// Receives the result of every call with the caller's `name` (metrics).
pub(crate) trait ThrottleObserver: Send + Sync + 'static {
    fn throttled(&self, name: &str, result: ThrottleResult);
}

impl ThrottleObserver for () {
    fn throttled(&self, _: &str, _: ThrottleResult) {}
}

/// The `sluice.v1.Throttle` implementation.
#[derive(Clone)]
pub(crate) struct Throttler {
    limiter: Arc<dyn Limiter>,
    input: InputSettings,
    observer: Arc<dyn ThrottleObserver>,
}

impl Throttler {
    pub(crate) fn new(limiter: Arc<dyn Limiter>, input: InputSettings) -> Throttler {
        Throttler {
            limiter,
            input,
            observer: Arc::new(()),
        }
    }

    pub(crate) fn with_observer(mut self, observer: Arc<dyn ThrottleObserver>) -> Throttler {
        self.observer = observer;
        self
    }

    /// The tonic service; a request over `input.max_request_bytes` is refused unread, with
    /// `RESOURCE_EXHAUSTED` naming the setting (as RLS does).
    pub(crate) fn into_service(self) -> ThrottleService {
        let max = self.input.max_request_bytes;
        ThrottleService::new(
            ThrottleServer::new(self).max_decoding_message_size(max),
            max,
        )
    }

    /// Decides one request, in a debug-level `throttle` span (the caller's `name`, the
    /// number of `keys`, the `result`), as `should_rate_limit` is for RLS.
    pub(crate) async fn throttle(
        &self,
        request: &pb::ThrottleRequest,
    ) -> Result<pb::ThrottleResponse, tonic::Status> {
        let span = tracing::debug_span!(
            "throttle",
            name = %request.name,
            keys = request.keys.len(),
            result = tracing::field::Empty,
        );
        let answer = self.decide(request).instrument(span.clone()).await;
        let result = match &answer {
            Ok(r) if r.limited => ThrottleResult::Limited,
            Ok(_) => ThrottleResult::Allowed,
            Err(s) if s.code() == tonic::Code::InvalidArgument => ThrottleResult::Invalid,
            Err(_) => ThrottleResult::Unavailable,
        };
        span.record("result", result.as_str());
        self.observer.throttled(&request.name, result);
        answer
    }

    async fn decide(
        &self,
        request: &pb::ThrottleRequest,
    ) -> Result<pb::ThrottleResponse, tonic::Status> {
        let keys = params::plan(request, &self.input).map_err(tonic::Status::invalid_argument)?;
        let (batch, first_hit) = batch_of(&keys);
        let outcome = self
            .limiter
            .check(&batch)
            .await
            .map_err(|e| unavailable(&e))?;
        if outcome.hits.len() != batch.hits.len() {
            return Err(tonic::Status::internal(format!(
                "the {} backend answered {} hits for a batch of {}",
                self.limiter.name(),
                outcome.hits.len(),
                batch.hits.len()
            )));
        }
        Ok(answer(&keys, &first_hit, &outcome))
    }
}

/// Holds with ids (docs/holds.md): each call is one atomic operation on the key's holds.
/// The id a caller sees is the backend's record id plus 1, so that 0 (a field not set) never
/// names a hold.
impl Throttler {
    /// `AcquireHold`: takes `count` slots under a new id, or nothing.
    pub(crate) async fn acquire_hold(
        &self,
        request: &pb::AcquireHoldRequest,
    ) -> Result<pb::AcquireHoldResponse, tonic::Status> {
        let answer = async {
            let key = params::hold_key(
                acquire_key(request.id.as_ref()),
                request.slots,
                request.lease_ms,
                &request.name,
                &self.input,
            )
            .map_err(tonic::Status::invalid_argument)?;
            let count = request.count.max(1);
            if count > key.slots {
                return Err(tonic::Status::invalid_argument(format!(
                    "count: {count}, more than the key's {} slots: never acquired",
                    key.slots
                )));
            }
            let outcome = self
                .hold(
                    key,
                    HoldOp::Acquire {
                        count: u64::from(count),
                    },
                )
                .await?;
            Ok(pb::AcquireHoldResponse {
                acquired: outcome.done,
                hold_id: if outcome.done {
                    outcome.id.saturating_add(1)
                } else {
                    0
                },
                held: outcome.held,
                retry_after_ms: if outcome.done {
                    -1
                } else {
                    i64::try_from(ms_up(outcome.wait_nanos).max(1)).unwrap_or(i64::MAX)
                },
            })
        }
        .await;
        let result = match &answer {
            Ok(r) if !r.acquired => Ok(ThrottleResult::Limited),
            Ok(_) => Ok(ThrottleResult::Allowed),
            Err(s) => Err(s.code()),
        };
        self.observe(&request.name, result);
        answer
    }

    /// `ReleaseHold` (`extend: false`) or `ExtendHold` (`extend: true`) of one hold.
    pub(crate) async fn touch_hold(
        &self,
        request: &pb::HoldRequest,
        extend: bool,
    ) -> Result<pb::HoldResponse, tonic::Status> {
        let answer = async {
            let key = params::hold_key(
                hold_key(request.id.as_ref()),
                request.slots,
                request.lease_ms,
                &request.name,
                &self.input,
            )
            .map_err(tonic::Status::invalid_argument)?;
            let Some(id) = request.hold_id.checked_sub(1) else {
                return Err(tonic::Status::invalid_argument(
                    "hold_id: give the id AcquireHold returned (never 0)",
                ));
            };
            let op = if extend {
                HoldOp::Extend { id }
            } else {
                HoldOp::Release { id }
            };
            let outcome = self.hold(key, op).await?;
            Ok(pb::HoldResponse {
                found: outcome.done,
                held: outcome.held,
            })
        }
        .await;
        let result = match &answer {
            Ok(_) => Ok(ThrottleResult::Allowed),
            Err(s) => Err(s.code()),
        };
        self.observe(&request.name, result);
        answer
    }

    async fn hold(&self, key: params::HoldKey, op: HoldOp) -> Result<HoldOutcome, tonic::Status> {
        let request = HoldRequest {
            key: key.key,
            slots: key.slots,
            lease_nanos: key.lease_nanos,
            op,
        };
        self.limiter
            .hold(&request)
            .await
            .map_err(|e| unavailable(&e))
    }

    fn observe(&self, name: &str, result: Result<ThrottleResult, tonic::Code>) {
        let result = match result {
            Ok(r) => r,
            Err(tonic::Code::InvalidArgument) => ThrottleResult::Invalid,
            Err(_) => ThrottleResult::Unavailable,
        };
        self.observer.throttled(name, result);
    }
}

/// An AcquireHold request's key bytes (empty when not set).
fn acquire_key(id: Option<&pb::acquire_hold_request::Id>) -> &[u8] {
    match id {
        Some(pb::acquire_hold_request::Id::Key(k)) => k.as_bytes(),
        Some(pb::acquire_hold_request::Id::KeyBytes(b)) => b,
        None => &[],
    }
}

/// A ReleaseHold or ExtendHold request's key bytes (empty when not set).
fn hold_key(id: Option<&pb::hold_request::Id>) -> &[u8] {
    match id {
        Some(pb::hold_request::Id::Key(k)) => k.as_bytes(),
        Some(pb::hold_request::Id::KeyBytes(b)) => b,
        None => &[],
    }
}

/// The Throttle service as served: tonic's `OUT_OF_RANGE` for a message over its decoding
/// limit becomes `RESOURCE_EXHAUSTED` (see [`crate::transport::SizeLimited`]).
pub(crate) type ThrottleService = crate::transport::SizeLimited<ThrottleServer<Throttler>>;

/// A backend failure is `UNAVAILABLE` (the caller's fail policy decides), as for RLS.
fn unavailable(e: &LimiterError) -> tonic::Status {
    tonic::Status::unavailable(e.to_string())
}

/// The batch of a request, and the index of each key's first hit in it.
fn batch_of(keys: &[KeyPlan]) -> (Batch, Vec<usize>) {
    let mut hits = Vec::with_capacity(keys.len() * 2);
    let mut first = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        first.push(hits.len());
        hits.push(Hit {
            key: k.key.clone(),
            limit: k.limit,
            cost: k.cost,
            refund: k.refund,
            group: 2 * i,
            role: Role::Enforced,
            hold: None,
        });
        if k.may_deny() {
            hits.push(Hit {
                key: k.key.clone(),
                limit: k.limit,
                cost: 0,
                refund: false,
                group: 2 * i + 1,
                role: Role::Shadow,
                hold: None,
            });
        }
    }
    (Batch { hits }, first)
}

fn answer(keys: &[KeyPlan], first_hit: &[usize], outcome: &BatchOutcome) -> pb::ThrottleResponse {
    let none = HitOutcome {
        admitted: true,
        remaining: 0,
        reset_nanos: 0,
        from_local_cache: false,
    };
    let hit = |i: usize| outcome.hits.get(i).copied().unwrap_or(none);
    let results: Vec<pb::ThrottleResult> = keys
        .iter()
        .zip(first_hit)
        .map(|(k, &i)| {
            let companion = if k.may_deny() { hit(i + 1) } else { hit(i) };
            result_of(k, hit(i), companion)
        })
        .collect();
    let limited = results.iter().any(|r| r.limited);
    let never = results.iter().any(|r| r.limited && r.retry_after_ms < 0);
    let retry_after_ms = if !limited || never {
        -1
    } else {
        results.iter().map(|r| r.retry_after_ms).max().unwrap_or(-1)
    };
    pb::ThrottleResponse {
        limited,
        results,
        retry_after_ms,
    }
}

/// One key's answer from its hit and (when denied) its companion's.
fn result_of(k: &KeyPlan, own: HitOutcome, companion: HitOutcome) -> pb::ThrottleResult {
    if own.admitted {
        return pb::ThrottleResult {
            limited: false,
            limit: k.capacity,
            remaining: own.remaining,
            retry_after_ms: -1,
            reset_after_ms: ms_up(own.reset_nanos),
        };
    }
    let retry_after_ms = if k.never() {
        -1
    } else {
        i64::try_from(ms_up(own.reset_nanos)).unwrap_or(i64::MAX)
    };
    pb::ThrottleResult {
        limited: true,
        limit: k.capacity,
        remaining: companion.remaining,
        retry_after_ms,
        reset_after_ms: ms_up(companion.reset_nanos),
    }
}

/// Nanoseconds in whole milliseconds, rounded up (waiting that long is always enough).
fn ms_up(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000)
}

#[tonic::async_trait]
impl throttle_server::Throttle for Throttler {
    async fn throttle(
        &self,
        request: tonic::Request<pb::ThrottleRequest>,
    ) -> Result<tonic::Response<pb::ThrottleResponse>, tonic::Status> {
        let work = Throttler::throttle(self, request.get_ref());
        join_caller_trace(request.metadata(), work)
            .await
            .map(tonic::Response::new)
    }

    async fn acquire_hold(
        &self,
        request: tonic::Request<pb::AcquireHoldRequest>,
    ) -> Result<tonic::Response<pb::AcquireHoldResponse>, tonic::Status> {
        let work = Throttler::acquire_hold(self, request.get_ref());
        join_caller_trace(request.metadata(), work)
            .await
            .map(tonic::Response::new)
    }

    async fn release_hold(
        &self,
        request: tonic::Request<pb::HoldRequest>,
    ) -> Result<tonic::Response<pb::HoldResponse>, tonic::Status> {
        let work = Throttler::touch_hold(self, request.get_ref(), false);
        join_caller_trace(request.metadata(), work)
            .await
            .map(tonic::Response::new)
    }

    async fn extend_hold(
        &self,
        request: tonic::Request<pb::HoldRequest>,
    ) -> Result<tonic::Response<pb::HoldResponse>, tonic::Status> {
        let work = Throttler::touch_hold(self, request.get_ref(), true);
        join_caller_trace(request.metadata(), work)
            .await
            .map(tonic::Response::new)
    }

    async fn reserve(
        &self,
        request: tonic::Request<pb::ReserveRequest>,
    ) -> Result<tonic::Response<pb::ReserveResponse>, tonic::Status> {
        let work = Throttler::reserve(self, request.get_ref());
        join_caller_trace(request.metadata(), work)
            .await
            .map(tonic::Response::new)
    }

    async fn commit(
        &self,
        request: tonic::Request<pb::CommitRequest>,
    ) -> Result<tonic::Response<pb::CommitResponse>, tonic::Status> {
        let work = Throttler::commit(self, request.get_ref());
        join_caller_trace(request.metadata(), work)
            .await
            .map(tonic::Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{ManualClock, MemoryLimiter};
    use crate::proto::sluice::v1::throttle_key::Id;

    const SEC: u64 = 1_000_000_000;

    fn request(quantity: i64) -> pb::ThrottleRequest {
        pb::ThrottleRequest {
            keys: vec![pb::ThrottleKey {
                id: Some(Id::Key("user123".to_owned())),
                max_burst: 15,
                count: 30,
                period_ms: 60_000,
                quantity: Some(quantity),
                ..Default::default()
            }],
            name: "email".to_owned(),
        }
    }

    fn numbers(r: &pb::ThrottleResponse) -> (bool, u64, u64, i64, u64) {
        let k = &r.results[0];
        (
            k.limited,
            k.limit,
            k.remaining,
            k.retry_after_ms,
            k.reset_after_ms,
        )
    }

    #[tokio::test]
    async fn the_readme_example_of_cl_throttle() {
        let clock = ManualClock::at(SEC);
        let limiter = Arc::new(MemoryLimiter::with_clock(1000, clock.clone()));
        let t = Throttler::new(limiter, InputSettings::default());
        let first = t.throttle(&request(1)).await.expect("answer");
        assert_eq!(numbers(&first), (false, 16, 15, -1, 2000));
        let rest = t.throttle(&request(15)).await.expect("answer");
        assert_eq!(numbers(&rest), (false, 16, 0, -1, 32_000));
        let over = t.throttle(&request(1)).await.expect("answer");
        assert_eq!(numbers(&over), (true, 16, 0, 2000, 32_000));
        assert_eq!(over.retry_after_ms, 2000);
        clock.advance(2 * SEC);
        let again = t.throttle(&request(1)).await.expect("answer");
        assert_eq!(numbers(&again), (false, 16, 0, -1, 32_000));
    }
}
