//! Listing the keys in Redis for `/counters`: `SCAN` with `MATCH <prefix><key prefix>*` and a
//! `COUNT`, never `KEYS` (which blocks Redis for the whole keyspace), then each listed key's
//! state read as a check-only request (cost 0, through the same script as every request, so
//! nothing is written and the answer is the one a request would get).
//!
//! The cursor is Redis's own `SCAN` cursor: a key present during the whole walk is listed at
//! least once (Redis may return a key twice across pages, the caller removes nothing). A page
//! runs `SCAN` until it has about `count` keys or the walk ends, at most
//! [`MAX_SCANS_PER_PAGE`] times. Redis Cluster is not walked (each master would need its own
//! walk): the request is refused with a clear error.

use std::time::Duration;

use redis::RedisResult;

use super::RedisLimiter;
use super::global::Read;
use crate::config::model::Algorithm;
use crate::limiter::counters::{
    BackendStatus, CounterEntry, CounterPage, CounterQuery, KeyState, Resolved,
};
use crate::limiter::{Batch, Hit, LimitParams, LimiterError, Role};

/// `SCAN` calls one page may make (with a selective pattern most return nothing).
const MAX_SCANS_PER_PAGE: usize = 64;

/// The least time one admin read may wait for Redis.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(1);

/// One page of the keys under the prefix.
pub(super) async fn page(
    limiter: &RedisLimiter,
    query: &CounterQuery<'_>,
) -> Result<CounterPage, LimiterError> {
    if limiter.commit.shared().connector.is_cluster() {
        return Err(refused("/counters cannot walk a Redis Cluster"));
    }
    let mut cursor: u64 = match query.cursor.filter(|c| !c.is_empty()) {
        Some(text) => text
            .parse()
            .map_err(|_| refused(&format!("invalid cursor {text:?}")))?,
        None => 0,
    };
    let pattern = pattern(limiter.prefix(), query.prefix);
    let count = query.count.max(1);
    let mut keys = Vec::new();
    for _ in 0..MAX_SCANS_PER_PAGE {
        let (next, found) = scan(limiter, cursor, &pattern, count).await?;
        keys.extend(found);
        cursor = next;
        if cursor == 0 || keys.len() >= count {
            break;
        }
    }
    let entries = read(limiter, keys, query).await?;
    let next = (cursor != 0).then(|| cursor.to_string());
    Ok(CounterPage { entries, next })
}

/// The entries of listed keys (Redis prefix included): resolved, and read when known.
async fn read(
    limiter: &RedisLimiter,
    keys: Vec<Vec<u8>>,
    query: &CounterQuery<'_>,
) -> Result<Vec<CounterEntry>, LimiterError> {
    let prefix = limiter.prefix();
    let mut entries = Vec::with_capacity(keys.len());
    let mut hits = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for full in keys {
        let Some(key) = full.strip_prefix(prefix) else {
            continue;
        };
        // A penalty box is listed as the key it belongs to (once, with its state).
        let key = key
            .strip_suffix(BLOCK_SUFFIX)
            .or_else(|| key.strip_suffix(SHARE_SUFFIX))
            .unwrap_or(key);
        if !seen.insert(key.to_vec()) {
            continue;
        }
        match (query.resolve)(key) {
            Resolved::Skip => {}
            Resolved::Unknown => entries.push(CounterEntry {
                key: key.to_vec(),
                limit: None,
                state: None,
            }),
            Resolved::Limit(limit) => {
                hits.push(check_only(key, limit, hits.len()));
                entries.push(CounterEntry {
                    key: key.to_vec(),
                    limit: Some(limit),
                    state: None,
                });
            }
        }
    }
    if hits.is_empty() {
        return Ok(entries);
    }
    let batch = Batch { hits };
    let outcome = limiter.read_split(&batch, Read::Check).await?;
    let boxed: Vec<&[u8]> = entries
        .iter()
        .filter(|e| e.limit.is_some_and(|l| l.block_nanos > 0))
        .map(|e| e.key.as_slice())
        .collect();
    let mut blocked = blocks(limiter, &boxed).await?.into_iter();
    let mut states = outcome.hits.into_iter();
    for entry in entries.iter_mut().filter(|e| e.limit.is_some()) {
        let boxed = entry.limit.is_some_and(|l| l.block_nanos > 0);
        let until = if boxed {
            blocked.next().flatten()
        } else {
            None
        };
        entry.state = states.next().map(|h| KeyState {
            admitted: h.admitted,
            remaining: h.remaining,
            reset_nanos: h.reset_nanos,
            oldest_hold_nanos: None,
            blocked_nanos: until,
            leased: Some(
                limiter
                    .leases
                    .held_units(&entry.key, limiter.clock.now_nanos()),
            )
            .filter(|&n| n > 0),
            share: None,
        });
    }
    if limiter.has_global() {
        for entry in entries.iter_mut() {
            if entry.limit.is_some_and(|l| l.global)
                && let Some(state) = entry.state.as_mut()
            {
                state.share = limiter.shares_of(&[&entry.key]).await?.pop().flatten();
            }
        }
    }
    for entry in &mut entries {
        let held = match (entry.limit, entry.state) {
            (Some(l), Some(s)) => {
                l.algorithm == Algorithm::Concurrency && s.remaining < u64::from(l.quota)
            }
            _ => false,
        };
        if held && let Some(state) = entry.state.as_mut() {
            state.oldest_hold_nanos = oldest_hold(limiter, &entry.key).await?;
        }
    }
    // A key that expired between SCAN and the read reads as fresh: it is no longer held.
    entries.retain(|e| match (e.limit, e.state) {
        (Some(limit), Some(state)) => !is_fresh(&limit, &state),
        _ => true,
    });
    Ok(entries)
}

/// The suffix of a penalty box's key (`BLOCK_SUFFIX` in the script's prelude).
const BLOCK_SUFFIX: &[u8] = b":block";

/// The suffix of a global key's pool in the region's Redis (`lua/share.lua`): listed as the
/// key, whose state is read from home.
const SHARE_SUFFIX: &[u8] = b":share";

/// Per key (without the Redis prefix), the time left in its penalty box, if it is in one:
/// one `PTTL` per key, pipelined (milliseconds: the box's key expires when the box ends).
pub(super) async fn blocks(
    limiter: &RedisLimiter,
    keys: &[&[u8]],
) -> Result<Vec<Option<u64>>, LimiterError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    // In a Cluster, each box lives on its key's master: not read (none shown).
    if limiter.commit.shared().connector.is_cluster() {
        return Ok(vec![None; keys.len()]);
    }
    let mut pipe = redis::pipe();
    for key in keys {
        let mut name = limiter.prefix().to_vec();
        name.extend_from_slice(key);
        name.extend_from_slice(BLOCK_SUFFIX);
        pipe.cmd("PTTL").arg(name);
    }
    let connector = &limiter.commit.shared().connector;
    let call = async {
        let reply: RedisResult<Vec<i64>> = match connector.get(0).await {
            Ok(mut c) => pipe.query_async(&mut c).await,
            Err(e) => Err(e),
        };
        reply.map_err(super::limiter_error)
    };
    let wait = limiter.timeout.max(ADMIN_TIMEOUT);
    let ttls = tokio::time::timeout(wait, call)
        .await
        .map_err(|_| super::unavailable(&format!("PTTL: no answer within {wait:?}")))??;
    let left = |ms: i64| {
        u64::try_from(ms)
            .ok()
            .filter(|&ms| ms > 0)
            .map(|ms| ms * 1_000_000)
    };
    Ok(ttls.into_iter().map(left).collect())
}

/// A cost-0 hit on `key`, one descriptor group of its own.
fn check_only(key: &[u8], limit: LimitParams, group: usize) -> Hit {
    Hit {
        key: key.into(),
        limit,
        cost: 0,
        refund: false,
        group,
        role: Role::Enforced,
        hold: None,
    }
}

/// The oldest live admitted hold of a `concurrency` key (its sorted set, see
/// `lua/concurrency.lua`): nanoseconds until it expires, by Redis's clock.
const OLDEST_HOLD: &str = "local t = redis.call('TIME') \
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
    local m = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now), '+inf', 'WITHSCORES') \
    for i = 1, #m, 2 do \
      if string.sub(m[i], 1, 2) == 'a:' then return tonumber(m[i + 1]) - now end \
    end \
    return -1";

async fn oldest_hold(limiter: &RedisLimiter, key: &[u8]) -> Result<Option<u64>, LimiterError> {
    let mut full = limiter.prefix().to_vec();
    full.extend_from_slice(key);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(OLDEST_HOLD).arg(1).arg(full);
    let connector = &limiter.commit.shared().connector;
    let call = async {
        let reply: RedisResult<i64> = match connector.get(0).await {
            Ok(mut c) => cmd.query_async(&mut c).await,
            Err(e) => Err(e),
        };
        reply.map_err(super::limiter_error)
    };
    let wait = limiter.timeout.max(ADMIN_TIMEOUT);
    let micros = tokio::time::timeout(wait, call)
        .await
        .map_err(|_| super::unavailable(&format!("EVAL: no answer within {wait:?}")))??;
    Ok(u64::try_from(micros).ok().map(|m| m.saturating_mul(1000)))
}

/// Whether a read state is the fresh one: a full quota, nothing to wait for.
fn is_fresh(limit: &LimitParams, state: &KeyState) -> bool {
    state.admitted
        && state.reset_nanos == 0
        && state.remaining >= u64::from(limit.burst.max(limit.quota))
}

async fn scan(
    limiter: &RedisLimiter,
    cursor: u64,
    pattern: &[u8],
    count: usize,
) -> Result<(u64, Vec<Vec<u8>>), LimiterError> {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count);
    let connector = &limiter.commit.shared().connector;
    if connector.is_cluster() {
        return Err(refused("/counters cannot walk a Redis Cluster"));
    }
    let call = async {
        let reply: RedisResult<(u64, Vec<Vec<u8>>)> = match connector.get(0).await {
            Ok(mut c) => cmd.query_async(&mut c).await,
            Err(e) => Err(e),
        };
        reply.map_err(super::limiter_error)
    };
    let wait = limiter.timeout.max(ADMIN_TIMEOUT);
    tokio::time::timeout(wait, call)
        .await
        .map_err(|_| super::unavailable(&format!("SCAN: no answer within {wait:?}")))?
}

/// `<redis prefix><key prefix>*`, glob characters escaped.
fn pattern(redis_prefix: &[u8], key_prefix: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(redis_prefix.len() + key_prefix.len() + 8);
    for &b in redis_prefix.iter().chain(key_prefix) {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'*');
    out
}

/// What the Redis backend says of its health.
pub(super) fn status(limiter: &RedisLimiter) -> BackendStatus {
    BackendStatus {
        reachable: Some(limiter.health()),
        breaker_open: Some(limiter.breakers.any_open()),
        deny_cache: Some(limiter.deny.len()),
        keys_held: Some(limiter.held()),
    }
}

fn refused(message: &str) -> LimiterError {
    LimiterError {
        backend: "redis",
        message: message.to_owned(),
        transient: false,
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(pattern(b"sluice:", b"{api|"), b"sluice:{api|*");
        assert_eq!(pattern(b"p*", b"{a?[b]\\"), b"p\\*{a\\?\\[b\\]\\\\*");
    }
}
