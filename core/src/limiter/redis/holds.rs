//! Holds with ids on Redis: one `EVALSHA` (`EVAL` when Redis lacks the script) of a script
//! made of the prelude, `concurrency.lua` and `holds.lua`, on the key's concurrency sorted set
//! (the state `algorithm: concurrency` keeps): atomic, one call per operation, on the path of a
//! batch's call (in a Cluster: to the key's slot's master, following redirections). It skips the
//! deny cache (a release or an extension is never answered from it) and the breaker; a
//! failure is an error (`UNAVAILABLE` to a Throttle caller), whatever `on_error` says: a hold
//! answered by a fallback would name no record.

use std::sync::LazyLock;

use redis::RedisResult;
use tokio::time::Instant;

use super::RedisLimiter;
use crate::limiter::LimiterError;
use crate::limiter::holds::{HoldOp, HoldOutcome, HoldRequest};

const PRELUDE: &str = include_str!("lua/prelude.lua");
const CONCURRENCY: &str = include_str!("lua/concurrency.lua");
const HOLDS: &str = include_str!("lua/holds.lua");
/// The prelude, its line that marks the algorithms of a batch call (see `MAKERS` in
/// `prelude.lua`) replaced: here always concurrency.
fn prelude() -> String {
    PRELUDE.replacen(super::script::SCRIPT_MAKERS, "MAKERS.c = true", 1)
}

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{}{CONCURRENCY}{HOLDS}", prelude())));

impl RedisLimiter {
    pub(super) async fn hold_op(&self, request: &HoldRequest) -> Result<HoldOutcome, LimiterError> {
        self.within_timeout(|deadline| self.hold_call(request, deadline))
            .await
    }

    async fn hold_call(
        &self,
        request: &HoldRequest,
        deadline: Instant,
    ) -> RedisResult<HoldOutcome> {
        let prefix = self.prefix();
        let key = [prefix, &request.key[..]].concat();
        let (op, arg) = match request.op {
            HoldOp::Acquire { count } => ("a", count),
            HoldOp::Release { id } => ("r", id),
            HoldOp::Extend { id } => ("e", id),
        };
        let now = if self.script_clock {
            (self.clock.now_nanos() / 1_000).to_string()
        } else {
            String::new()
        };
        let mut invocation = SCRIPT.key(key);
        invocation
            .arg(now)
            .arg(op)
            .arg(request.slots)
            .arg(request.lease_nanos.div_ceil(1_000).max(1))
            .arg(arg);
        let reply = self.keyed(&request.key, &invocation, deadline).await?;
        let numbers: Vec<u64> = redis::from_redis_value(reply)?;
        let at = |i: usize| numbers.get(i).copied().unwrap_or(0);
        if numbers.len() != 4 {
            return Err(redis::RedisError::from(std::io::Error::other(
                "the holds script answered an unexpected reply",
            )));
        }
        Ok(HoldOutcome {
            done: at(0) == 1,
            id: at(1),
            held: at(2),
            wait_nanos: at(3).saturating_mul(1_000),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_prelude_marks_concurrency_instead_of_a_batchs_algorithms() {
        let prelude = super::prelude();
        assert!(!prelude.contains(super::super::script::SCRIPT_MAKERS));
        assert!(prelude.contains("MAKERS.c = true"));
    }
}
