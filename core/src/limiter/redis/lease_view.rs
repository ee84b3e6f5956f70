//! What `/counters` and `/why` show of a leased key (`redis.leases = "on"`): every replica's
//! lease records in Redis (the key's `:lease` hash, "Leases" in `lua/prelude.lua`), their
//! times counted from Redis's now, and this replica's own lease. One small script call per
//! key, read only; in a Cluster, on the key's master.

use std::time::Duration;

use tokio::time::Instant;

use super::{RedisLimiter, limiter_error};
use crate::limiter::counters::{LeaseRecord, LeaseView};
use crate::limiter::{LimitParams, LimiterError, lease};

/// The suffix of a key's lease records (`LEASE_SUFFIX` in the script's prelude).
pub(super) const LEASE_SUFFIX: &[u8] = b":lease";

/// The least time one admin read may wait for Redis.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The script's now (ARGV[1], microseconds, when given: the manual clock of tests; else
/// Redis TIME) and every field and value of the records' hash.
const READ: &str = "local now = tonumber(ARGV[1]) \
    if not now then local t = redis.call('TIME') now = tonumber(t[1]) * 1000000 + tonumber(t[2]) end \
    return {now, redis.call('HGETALL', KEYS[1])}";

impl RedisLimiter {
    /// Per key, its lease records and this replica's lease; `None` for a limit never leased
    /// or with leases off.
    pub(super) async fn lease_views(
        &self,
        keys: &[(&[u8], LimitParams)],
    ) -> Result<Vec<Option<LeaseView>>, LimiterError> {
        let mut out = Vec::with_capacity(keys.len());
        for (key, limit) in keys {
            if self.leases.on() && lease::leasable(limit) {
                out.push(Some(self.lease_view(key).await?));
            } else {
                out.push(None);
            }
        }
        Ok(out)
    }

    async fn lease_view(&self, key: &[u8]) -> Result<LeaseView, LimiterError> {
        let records = [self.prefix(), key, LEASE_SUFFIX].concat();
        let now = self
            .script_clock
            .then(|| (self.clock.now_nanos() / 1_000).to_string());
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(READ)
            .arg(1)
            .arg(records)
            .arg(now.unwrap_or_default());
        let deadline = Instant::now() + self.timeout.max(ADMIN_TIMEOUT);
        let reply = tokio::time::timeout_at(deadline, self.keyed(key, &cmd, deadline))
            .await
            .map_err(|_| super::unavailable("no answer from Redis to a lease read in time"))?
            .map_err(limiter_error)?;
        // The records hold the key's state as stored, packed: bytes, not text.
        let (now, fields): (u64, Vec<Vec<u8>>) =
            redis::from_redis_value(reply).map_err(|e| limiter_error(e.into()))?;
        let records = fields
            .chunks_exact(2)
            .filter_map(|pair| record(&pair[0], &pair[1], now))
            .collect();
        Ok(LeaseView {
            records,
            here: self.leases.held(key, self.clock.now_nanos()),
        })
    }
}

/// One record, `units:expires:returnable:mark:state` (microseconds; the state packed), with
/// its times from `now`; `None` when malformed.
fn record(replica: &[u8], value: &[u8], now: u64) -> Option<LeaseRecord> {
    let mut fields = value
        .splitn(4, |b| *b == b':')
        .map(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok());
    let (units, expires, returnable) = (fields.next()??, fields.next()??, fields.next()??);
    let from_now = |t: u64| t.saturating_sub(now).saturating_mul(1_000);
    Some(LeaseRecord {
        replica: String::from_utf8_lossy(replica).into_owned(),
        units,
        expires_nanos: from_now(expires),
        returnable_nanos: from_now(returnable),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_its_units_and_times_from_now() {
        assert_eq!(
            record(b"7", b"10:1500:9000:12:\x01\0\0\0\0\0\0:\0:", 1_000),
            Some(LeaseRecord {
                replica: "7".to_owned(),
                units: 10,
                expires_nanos: 500_000,
                returnable_nanos: 8_000_000,
            })
        );
        assert_eq!(
            record(b"7", b"10:500:900:1:", 1_000).map(|r| r.expires_nanos),
            Some(0)
        );
        assert_eq!(record(b"7", b"ten:1:2:3:", 0), None);
        assert_eq!(record(b"7", b"1:2", 0), None);
    }
}
