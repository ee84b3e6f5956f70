//! Reservations on Redis: one `EVALSHA` (`EVAL` when Redis lacks the script) of the batch
//! script with `main.lua` as a function, followed by `reserve.lua`, which keeps the key's
//! open reservations in a hash beside its rate state and runs the reservation's batch on that
//! state: atomic, one call per operation. It skips the breaker and the deny cache's answers
//! (a reservation must reach its records), but tells the deny cache what it did, so that a
//! refund is not hidden by a remembered denial. A failure is an error (`UNAVAILABLE` to a
//! Throttle caller), whatever `on_error` says: a reservation answered by a fallback would name
//! no record.

use std::sync::LazyLock;

use redis::{RedisResult, Value};
use tokio::time::Instant;

use super::RedisLimiter;
use super::script::{self, Mode, Part, Unit, Via};
use crate::limiter::reserve::{
    MAX_OPEN, ReserveOp, ReserveOutcome, ReserveRequest, check_after, settle,
};
use crate::limiter::{Batch, LimiterError};

const RESERVE: &str = include_str!("lua/reserve.lua");

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&script::wrapping(RESERVE)));

impl RedisLimiter {
    pub(super) async fn reserve_op(
        &self,
        request: &ReserveRequest,
    ) -> Result<ReserveOutcome, LimiterError> {
        self.within_timeout(|deadline| self.reserve_call(request, deadline))
            .await
    }

    async fn reserve_call(
        &self,
        request: &ReserveRequest,
        deadline: Instant,
    ) -> RedisResult<ReserveOutcome> {
        let sent = self.clock.now_nanos();
        let (batch, op, first, second) = match &request.op {
            ReserveOp::Reserve { batch, amount } => (
                vec![batch.clone()],
                "r",
                amount.to_string(),
                request.ttl_nanos.div_ceil(1_000).max(1),
            ),
            ReserveOp::Commit { id, actual, hit } => (
                vec![
                    Batch {
                        hits: vec![settle(hit, None, *actual)],
                    },
                    Batch {
                        hits: vec![check_after(hit)],
                    },
                ],
                "c",
                id.to_string(),
                *actual,
            ),
        };
        let prefix = self.prefix();
        let now = (self.script_clock).then_some(sent / 1_000);
        let parts: Vec<Part<'_>> = batch
            .iter()
            .map(|b| Part {
                hits: &b.hits,
                mode: Mode::Request,
            })
            .collect();
        let call = script::encode(&parts, prefix, Unit::Nanos, (now, sent), Via::Script);
        let (keys, args) = call.keys_and_args_raw();
        let mut invocation = SCRIPT.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        invocation.key([prefix, &request.records[..]].concat());
        // The reserved key's lease records: a funnel's commit gives nothing back while a lease
        // on the key is out (reserve.lua says why).
        let leased: &[u8] = batch
            .first()
            .and_then(|b| b.hits.first())
            .map_or(&[], |h| &h.key[..]);
        invocation.key([prefix, leased, script::LEASE_SUFFIX].concat());
        for arg in args {
            invocation.arg(arg);
        }
        invocation.arg(op).arg(first).arg(second).arg(MAX_OPEN);
        let reply = self
            .keyed(request.records.as_ref(), &invocation, deadline)
            .await?;
        let (status, id, estimate, open, batch_reply): (u64, u64, u64, u64, Value) =
            redis::from_redis_value(reply)?;
        let done = status == 1;
        let outcome = match status {
            2 => None,
            _ => {
                let mut outcomes = script::decode(batch_reply, &call)?.into_iter();
                let mut outcome = outcomes.next();
                if let (ReserveOp::Commit { actual, hit, .. }, Some(first)) =
                    (&request.op, &mut outcome)
                {
                    let applied = Batch {
                        hits: vec![settle(hit, done.then_some(estimate), *actual)],
                    };
                    self.deny.learn(&applied, first, sent);
                    first.hits.extend(outcomes.flat_map(|o| o.hits));
                } else if let (Some(first), Some(b)) = (&outcome, batch.first()) {
                    self.deny.learn(b, first, sent);
                }
                outcome
            }
        };
        Ok(ReserveOutcome {
            done,
            id,
            estimate,
            open,
            outcome,
        })
    }
}
