//! The limiter script: encoding a batch into its KEYS and ARGV, calling it by SHA (EVAL with
//! the source when the server answers NOSCRIPT, which also caches it there), and decoding its
//! reply. Generic over the connection, so any `ConnectionLike` works.
//!
//! The script is one Lua chunk made of the files of `lua/`: `prelude.lua` (the KEYS/ARGV
//! contract, at its top, and integer helpers), one file per algorithm, and `main.lua`. One
//! script serves every algorithm, so a request is one call whatever the mix of its limits.
//!
//! Time in the script is in microseconds. [`Micros`] converts a batch's periods from
//! nanoseconds and the outcome's reset times back.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::config::model::{Algorithm, Charge};
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, Role};

/// The Lua source, with its KEYS/ARGV contract at the top.
pub const SOURCE: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/funnel.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/main.lua"),
);

/// Fields per hit in ARGV.
const FIELDS: usize = 11;

/// The largest integer the script handles exactly (2^53 - 1); larger inputs are clamped.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

static SHA: LazyLock<String> = LazyLock::new(|| redis::Script::new(SOURCE).get_hash().to_owned());

/// How one script call plans its hits (ARGV[2]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// All or nothing over every hit of the call.
    Request,
    /// Each descriptor group consumes when all its hits admit (one slot group of a Cluster
    /// request; the caller plans the request and refunds).
    Independent,
}

/// One script call: its keys (prefixed) and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub keys: Vec<Vec<u8>>,
    pub args: Vec<String>,
}

/// Builds the call for `hits`, whose limits' periods are already in microseconds.
/// `now_micros` overrides Redis `TIME` (tests only).
pub fn encode(hits: &[Hit], prefix: &[u8], mode: Mode, now_micros: Option<u64>) -> Call {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut args = Vec::with_capacity(3 + FIELDS * hits.len());
    args.push(now_micros.map_or_else(String::new, |n| n.min(MAX_EXACT).to_string()));
    args.push(
        match mode {
            Mode::Request => "request",
            Mode::Independent => "independent",
        }
        .to_owned(),
    );
    args.push(hits.len().to_string());
    for hit in hits {
        let key = prefixed(prefix, &hit.key);
        let slot = match keys.iter().position(|k| *k == key) {
            Some(found) => found + 1,
            None => {
                keys.push(key);
                keys.len()
            }
        };
        push_hit(&mut args, slot, hit);
    }
    Call { keys, args }
}

fn push_hit(args: &mut Vec<String>, slot: usize, hit: &Hit) {
    let flag = |b: bool| if b { "1" } else { "0" }.to_owned();
    let l = &hit.limit;
    args.push(slot.to_string());
    args.push(algorithm_code(l.algorithm).to_owned());
    args.push(l.quota.to_string());
    args.push(l.period_nanos.min(MAX_EXACT).to_string());
    args.push(l.burst.to_string());
    args.push(flag(l.borrow));
    args.push(flag(l.charge == Charge::Always));
    args.push(hit.cost.min(MAX_EXACT).to_string());
    args.push(flag(hit.refund));
    args.push(hit.group.to_string());
    args.push(
        match hit.role {
            Role::Enforced => "e",
            Role::Shadow => "s",
            Role::Quota => "q",
        }
        .to_owned(),
    );
}

/// The script's code for an algorithm (ARGV field +1 of a hit).
fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Funnel => "f",
        Algorithm::TokenBucket => "b",
        Algorithm::FixedWindow => "w",
        Algorithm::SlidingWindow => "s",
        Algorithm::SlidingLog => "l",
    }
}

/// `prefix` then `key`.
pub fn prefixed(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + key.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(key);
    out
}

/// Runs a call: EVALSHA, and on NOSCRIPT the same call as EVAL (which caches the script).
pub async fn invoke<C: ConnectionLike + Send>(
    conn: &mut C,
    call: &Call,
) -> redis::RedisResult<Value> {
    match run(conn, "EVALSHA", &SHA, call).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            run(conn, "EVAL", SOURCE, call).await
        }
        other => other,
    }
}

async fn run<C: ConnectionLike + Send>(
    conn: &mut C,
    command: &str,
    script: &str,
    call: &Call,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(command);
    cmd.arg(script)
        .arg(call.keys.len())
        .arg(&call.keys)
        .arg(&call.args);
    cmd.query_async(conn).await
}

/// Decodes the script's reply for `hits` hits (times stay in the script's microseconds).
pub fn decode(reply: Value, hits: usize) -> Result<BatchOutcome, RedisError> {
    let bad = |what: &str| {
        RedisError::from((ErrorKind::Parse, "unexpected script reply", what.to_owned()))
    };
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    if items.len() != 1 + 3 * hits {
        return Err(bad(&format!("{} items for {hits} hits", items.len())));
    }
    let int = |v: &Value| match v {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad("negative integer")),
        _ => Err(bad("not an integer")),
    };
    let mut it = items.iter();
    let admitted = it.next().map(int).transpose()?.is_some_and(|n| n == 1);
    let mut out = Vec::with_capacity(hits);
    for _ in 0..hits {
        let (Some(a), Some(r), Some(t)) = (it.next(), it.next(), it.next()) else {
            return Err(bad("short reply"));
        };
        out.push(HitOutcome {
            admitted: int(a)? == 1,
            remaining: int(r)?,
            reset_nanos: int(t)?,
        });
    }
    Ok(BatchOutcome {
        hits: out,
        admitted,
    })
}

/// Conversions between the limiters' nanoseconds and the script's microseconds.
pub struct Micros;

impl Micros {
    /// The batch with every period in microseconds (rounded up, at least 1).
    pub fn batch(batch: &Batch) -> Batch {
        let mut out = batch.clone();
        for hit in &mut out.hits {
            hit.limit.period_nanos = hit.limit.period_nanos.div_ceil(1_000).max(1);
        }
        out
    }

    /// The outcome with reset times back in nanoseconds.
    pub fn outcome(mut outcome: BatchOutcome) -> BatchOutcome {
        for hit in &mut outcome.hits {
            hit.reset_nanos = hit.reset_nanos.saturating_mul(1_000);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitParams;

    fn hit(key: &str, group: usize) -> Hit {
        Hit {
            key: key.as_bytes().into(),
            limit: LimitParams {
                algorithm: Algorithm::Funnel,
                quota: 3,
                period_nanos: 1_500_000_001,
                burst: 4,
                charge: Charge::Always,
                borrow: true,
            },
            cost: u64::MAX,
            refund: false,
            group,
            role: Role::Quota,
        }
    }

    #[test]
    fn keys_are_distinct_prefixed_and_hits_point_at_them() {
        let call = encode(
            &[hit("a", 0), hit("b", 1), hit("a", 2)],
            b"p:",
            Mode::Request,
            None,
        );
        assert_eq!(call.keys, [b"p:a".to_vec(), b"p:b".to_vec()]);
        assert_eq!(&call.args[..3], ["", "request", "3"]);
        let slots: Vec<&str> = call.args[3..]
            .chunks(FIELDS)
            .map(|h| h[0].as_str())
            .collect();
        assert_eq!(slots, ["1", "2", "1"]);
        assert_eq!(
            call.args[3..3 + FIELDS],
            [
                "1",
                "f",
                "3",
                "1500000001",
                "4",
                "1",
                "1",
                "9007199254740991",
                "0",
                "0",
                "q"
            ]
        );
    }

    #[test]
    fn micros_round_periods_up_and_scale_resets() {
        let b = Micros::batch(&Batch {
            hits: vec![hit("a", 0)],
        });
        assert_eq!(b.hits[0].limit.period_nanos, 1_500_001);
        let o = Micros::outcome(BatchOutcome {
            hits: vec![HitOutcome {
                admitted: true,
                remaining: 2,
                reset_nanos: 7,
            }],
            admitted: true,
        });
        assert_eq!(o.hits[0].reset_nanos, 7_000);
    }

    /// A connection answering from a script, recording the command names it was sent.
    struct Mock {
        replies: Vec<&'static [u8]>,
        sent: Vec<String>,
    }

    impl ConnectionLike for Mock {
        fn req_packed_command<'a>(
            &'a mut self,
            cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, Value> {
            let name = cmd.args_iter().next().map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            });
            self.sent.push(name.unwrap_or_default());
            let reply = if self.replies.is_empty() {
                &b"-ERR no more\r\n"[..]
            } else {
                self.replies.remove(0)
            };
            Box::pin(async move { redis::parse_redis_value(reply) })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a redis::Pipeline,
            _: usize,
            _: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async { Ok(Vec::new()) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[tokio::test]
    async fn noscript_is_answered_by_sending_the_source_once() {
        let call = encode(&[hit("a", 0)], b"p:", Mode::Request, None);
        let mut conn = Mock {
            replies: vec![
                b"-NOSCRIPT No matching script.\r\n",
                b"*1\r\n:1\r\n",
                b"*1\r\n:0\r\n",
            ],
            sent: Vec::new(),
        };
        let first = invoke(&mut conn, &call).await.unwrap();
        assert_eq!(first, Value::Array(vec![Value::Int(1)]));
        let second = invoke(&mut conn, &call).await.unwrap();
        assert_eq!(second, Value::Array(vec![Value::Int(0)]));
        assert_eq!(conn.sent, ["EVALSHA", "EVAL", "EVALSHA"]);
        let mut failing = Mock {
            replies: vec![b"-ERR boom\r\n"],
            sent: Vec::new(),
        };
        assert!(invoke(&mut failing, &call).await.is_err());
        assert_eq!(failing.sent, ["EVALSHA"], "other errors are not retried");
    }

    #[test]
    fn decode_checks_the_shape() {
        let ok = Value::Array(vec![
            Value::Int(1),
            Value::Int(1),
            Value::Int(2),
            Value::Int(3),
        ]);
        let o = decode(ok, 1).unwrap();
        assert!(o.admitted);
        assert_eq!(
            o.hits[0],
            HitOutcome {
                admitted: true,
                remaining: 2,
                reset_nanos: 3
            }
        );
        assert!(decode(Value::Array(vec![Value::Int(1)]), 1).is_err());
        assert!(decode(Value::Nil, 0).is_err());
        assert!(decode(Value::Array(vec![Value::Int(-1)]), 0).is_err());
    }
}
