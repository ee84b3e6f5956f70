//! The reply read back: per request, its verdict and per hit its outcome.

use super::*;

/// The reply's marker of a denied hit (then its wait).
const REPLY_DENIED: i64 = -1;

/// The reply's marker of an admitted hit with the remaining and reset of the admitted hit
/// before it (the same key and limit).
const REPLY_SAME: i64 = -2;

/// Bytes per number of the script's reply (a little-endian double).
const REPLY_NUMBER_BYTES: usize = 8;

/// What the script answered to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    Batch(BatchOutcome),
    Lease(LeaseReply),
}

/// The answer to a lease request, times in microseconds by Redis's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// Redis's now.
    pub now: u64,
    /// Units of the old lease given back.
    pub returned: u64,
    /// The new lease's units (0: none) and expiry (exclusive).
    pub units: u64,
    pub expires: u64,
    /// What the key holds after the call, every leased unit counted, and its reset.
    pub remaining: u64,
    pub reset: u64,
}

fn bad(what: &str) -> RedisError {
    RedisError::from((ErrorKind::Parse, "unexpected script reply", what.to_owned()))
}

/// Decodes the script's reply to `call`, which carries no lease request: one outcome per
/// request, resets in the call's unit.
pub fn decode(reply: Value, call: &Call) -> Result<Vec<BatchOutcome>, RedisError> {
    decode_all(reply, call)?
        .into_iter()
        .map(|decided| match decided {
            Decided::Batch(outcome) => Ok(outcome),
            Decided::Lease(_) => Err(bad("a lease reply")),
        })
        .collect()
}

/// Decodes the script's reply to `call` (its short form, packed: see the top of
/// `prelude.lua`): one answer per request, in the call's order (the lease requests' replies
/// come first in the reply), resets in the call's unit.
pub fn decode_all(reply: Value, call: &Call) -> Result<Vec<Decided>, RedisError> {
    let Value::BulkString(bytes) = reply else {
        return Err(bad("not a string"));
    };
    let (numbers, rest) = bytes.as_chunks::<REPLY_NUMBER_BYTES>();
    if !rest.is_empty() {
        return Err(bad("not a whole number of numbers"));
    }
    let mut items = numbers.iter().map(|b| {
        let number = f64::from_le_bytes(*b);
        // Exact: an integral double of at most 2^53 - 1 in size converts without loss.
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        if number.fract() == 0.0 && number.abs() <= MAX_EXACT as f64 {
            Ok(number as i64)
        } else {
            Err(bad("not an integer"))
        }
    });
    let mut next = || items.next().unwrap_or_else(|| Err(bad("short reply")));
    let scale: u64 = match call.unit {
        Unit::Nanos => 1_000,
        Unit::Micros => 1,
    };
    let time = |n: i64| {
        u64::try_from(n)
            .map(|n| n.saturating_mul(scale))
            .map_err(|_| bad("negative time"))
    };
    let mut leases = Vec::new();
    for _ in call.leases.iter().filter(|l| **l) {
        let mut field =
            || next().and_then(|n| u64::try_from(n).map_err(|_| bad("a negative lease field")));
        leases.push(LeaseReply {
            now: field()?,
            returned: field()?,
            units: field()?,
            expires: field()?,
            remaining: field()?,
            reset: field()?,
        });
    }
    let mut leases = leases.into_iter();
    let mut outcomes = Vec::with_capacity(call.hits.len());
    for (&count, &lease) in call.hits.iter().zip(&call.leases) {
        if lease {
            let reply = leases.next().ok_or_else(|| bad("a missing lease reply"))?;
            outcomes.push(Decided::Lease(reply));
            continue;
        }
        let admitted = next()? == 1;
        let mut hits = Vec::with_capacity(count);
        let mut last = None;
        for _ in 0..count {
            let hit = match next()? {
                REPLY_DENIED => HitOutcome {
                    admitted: false,
                    remaining: 0,
                    reset_nanos: time(next()?)?,
                    from_local_cache: false,
                },
                REPLY_SAME => last.ok_or_else(|| bad("a repeat with no admitted hit before"))?,
                remaining => {
                    let remaining =
                        u64::try_from(remaining).map_err(|_| bad("negative remaining"))?;
                    let hit = HitOutcome {
                        admitted: true,
                        remaining,
                        reset_nanos: time(next()?)?,
                        from_local_cache: false,
                    };
                    last = Some(hit);
                    hit
                }
            };
            hits.push(hit);
        }
        outcomes.push(Decided::Batch(BatchOutcome { hits, admitted }));
    }
    if items.next().is_some() || outcomes.is_empty() {
        return Err(bad(&format!(
            "more items than {} hits in {} requests",
            call.hits.iter().sum::<usize>(),
            call.hits.len()
        )));
    }
    Ok(outcomes)
}
