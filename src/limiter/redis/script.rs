//! The limiter script: encoding a batch into its KEYS and ARGV, calling it by SHA (EVAL with
//! the source when the server answers NOSCRIPT, which also caches it there), and decoding its
//! reply. Generic over the connection, so any `ConnectionLike` works.
//!
//! The script is one Lua chunk made of the files of `lua/`: `prelude.lua` (the KEYS/ARGV
//! contract, at its top, and integer helpers), one file per algorithm, and `main.lua`. One
//! script serves every algorithm, so a request is one call whatever the mix of its limits.
//!
//! A call is encoded straight into the command's one buffer: each distinct key and each
//! distinct limit once, then a few integers per hit (written with `itoa` by the `redis` crate,
//! no intermediate strings). Time in the script is in microseconds; with [`Unit::Nanos`] the
//! periods are converted as they are written and the reply's resets as they are read.

use std::collections::HashMap;
use std::hash::Hash;
use std::io::Write as _;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisWrite as _, ServerErrorKind, Value};

use crate::config::model::{Algorithm, Charge};
use crate::limiter::{BatchOutcome, Hit, HitOutcome, LimitParams, Role};

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

/// ARGV fields per distinct limit.
const LIMIT_FIELDS: usize = 5;

/// ARGV fields per hit.
const HIT_FIELDS: usize = 5;

/// The largest integer the script handles exactly (2^53 - 1); larger inputs are clamped.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

/// Above this many items, distinct keys and limits are found with a hash map, not a scan.
const LINEAR_SCAN_MAX: usize = 16;

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

/// The time unit of a batch's periods and of its outcome's resets (the script's is always
/// microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// The limiters' nanoseconds: periods are rounded up to the microsecond (at least 1),
    /// resets scaled back.
    Nanos,
    /// Already microseconds (the differential tests, which drive the script's clock).
    Micros,
}

/// One script call, encoded once: `EVALSHA <sha> <numkeys> KEYS... ARGV...`, ready to send.
#[derive(Debug, Clone)]
pub struct Call {
    cmd: Cmd,
    hits: usize,
    unit: Unit,
}

impl Call {
    /// Its KEYS and ARGV, as text (for tests and debugging).
    pub fn keys_and_args(&self) -> (Vec<String>, Vec<String>) {
        let mut args = self.cmd.args_iter().skip(2).map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        });
        let count = args.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let keys = args.by_ref().take(count).collect();
        (keys, args.collect())
    }
}

/// Builds the call for `hits`, whose periods are in `unit`. `now_micros` overrides Redis
/// `TIME` (tests only).
pub fn encode(
    hits: &[Hit],
    prefix: &[u8],
    mode: Mode,
    unit: Unit,
    now_micros: Option<u64>,
) -> Call {
    let (keys, slot_of) = distinct(hits.iter().map(|h| &*h.key));
    let (limits, limit_of) = distinct(hits.iter().map(|h| script_limit(&h.limit, unit)));
    let key_bytes: usize = keys.iter().map(|k| prefix.len() + k.len()).sum();
    let mut cmd = Cmd::with_capacity(
        7 + keys.len() + LIMIT_FIELDS * limits.len() + HIT_FIELDS * hits.len(),
        80 + key_bytes + 40 * limits.len() + 32 * hits.len(),
    );
    cmd.arg("EVALSHA").arg(SHA.as_str()).arg(keys.len());
    for key in &keys {
        let mut arg = cmd.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = arg.write_all(prefix).and_then(|()| arg.write_all(key));
    }
    match now_micros {
        Some(n) => cmd.arg(n.min(MAX_EXACT)),
        None => cmd.arg(""),
    };
    cmd.arg(match mode {
        Mode::Request => "request",
        Mode::Independent => "independent",
    });
    cmd.arg(limits.len());
    for limit in &limits {
        push_limit(&mut cmd, limit);
    }
    cmd.arg(hits.len());
    for ((hit, slot), limit) in hits.iter().zip(slot_of).zip(limit_of) {
        push_hit(&mut cmd, hit, slot + 1, limit + 1);
    }
    Call {
        cmd,
        hits: hits.len(),
        unit,
    }
}

/// A limit as the script takes it: period in microseconds, flags (1 borrow, 2 always).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ScriptLimit {
    code: &'static str,
    quota: u32,
    period_micros: u64,
    burst: u32,
    flags: u8,
}

fn script_limit(l: &LimitParams, unit: Unit) -> ScriptLimit {
    let period_micros = match unit {
        Unit::Nanos => l.period_nanos.div_ceil(1_000).max(1),
        Unit::Micros => l.period_nanos,
    };
    ScriptLimit {
        code: algorithm_code(l.algorithm),
        quota: l.quota,
        period_micros: period_micros.min(MAX_EXACT),
        burst: l.burst,
        flags: u8::from(l.borrow) + 2 * u8::from(l.charge == Charge::Always),
    }
}

fn push_limit(cmd: &mut Cmd, l: &ScriptLimit) {
    cmd.arg(l.code)
        .arg(l.quota)
        .arg(l.period_micros)
        .arg(l.burst)
        .arg(l.flags);
}

fn push_hit(cmd: &mut Cmd, hit: &Hit, slot: usize, limit: usize) {
    let role = match (hit.role, hit.refund) {
        (Role::Enforced, false) => "e",
        (Role::Shadow, false) => "s",
        (Role::Quota, false) => "q",
        (Role::Enforced, true) => "E",
        (Role::Shadow, true) => "S",
        (Role::Quota, true) => "Q",
    };
    cmd.arg(slot)
        .arg(limit)
        .arg(hit.cost.min(MAX_EXACT))
        .arg(hit.group)
        .arg(role);
}

/// The distinct items, in order of first appearance, and the index of each item among them.
fn distinct<T: Copy + Eq + Hash>(items: impl ExactSizeIterator<Item = T>) -> (Vec<T>, Vec<usize>) {
    let mut found = Vec::new();
    let mut index = Vec::with_capacity(items.len());
    if items.len() <= LINEAR_SCAN_MAX {
        for item in items {
            let at = found.iter().position(|f| *f == item).unwrap_or_else(|| {
                found.push(item);
                found.len() - 1
            });
            index.push(at);
        }
    } else {
        let mut seen = HashMap::with_capacity(items.len());
        for item in items {
            let next = found.len();
            let at = *seen.entry(item).or_insert(next);
            if at == next {
                found.push(item);
            }
            index.push(at);
        }
    }
    (found, index)
}

/// The script's code for an algorithm (a limit's ARGV field +0).
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
    match send(conn, &call.cmd).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            send(conn, &with_source(&call.cmd)).await
        }
        other => other,
    }
}

/// The EVAL form of an EVALSHA command: the same keys and arguments after the source.
fn with_source(evalsha: &Cmd) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(SOURCE);
    for arg in evalsha.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
    cmd
}

/// Sends one command; an error reply becomes an error.
async fn send<C: ConnectionLike + Send>(conn: &mut C, cmd: &Cmd) -> redis::RedisResult<Value> {
    match conn.req_packed_command(cmd).await? {
        error @ Value::ServerError(_) => error.extract_error(),
        reply => Ok(reply),
    }
}

/// Decodes the script's reply to `call`, resets in the call's unit.
pub fn decode(reply: Value, call: &Call) -> Result<BatchOutcome, RedisError> {
    let bad = |what: &str| {
        RedisError::from((ErrorKind::Parse, "unexpected script reply", what.to_owned()))
    };
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    let Some((head, per_hit)) = items.split_first() else {
        return Err(bad("empty reply"));
    };
    if per_hit.len() != 3 * call.hits {
        return Err(bad(&format!(
            "{} items for {} hits",
            items.len(),
            call.hits
        )));
    }
    let int = |v: &Value| match v {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad("negative integer")),
        _ => Err(bad("not an integer")),
    };
    let scale = match call.unit {
        Unit::Nanos => 1_000,
        Unit::Micros => 1,
    };
    let mut hits = Vec::with_capacity(call.hits);
    for hit in per_hit.chunks_exact(3) {
        if let [admitted, remaining, reset] = hit {
            hits.push(HitOutcome {
                admitted: int(admitted)? == 1,
                remaining: int(remaining)?,
                reset_nanos: int(reset)?.saturating_mul(scale),
            });
        }
    }
    Ok(BatchOutcome {
        hits,
        admitted: int(head)? == 1,
    })
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
    fn keys_and_limits_are_sent_once_and_hits_point_at_them() {
        let mut other = hit("b", 1);
        other.limit.quota = 7;
        other.refund = true;
        other.role = Role::Shadow;
        let call = encode(
            &[hit("a", 0), other, hit("a", 2)],
            b"p:",
            Mode::Request,
            Unit::Micros,
            None,
        );
        let (keys, args) = call.keys_and_args();
        assert_eq!(keys, ["p:a", "p:b"]);
        let limits = [
            "f",
            "3",
            "1500000001",
            "4",
            "3",
            "f",
            "7",
            "1500000001",
            "4",
            "3",
        ];
        assert_eq!(args[..3], ["", "request", "2"]);
        assert_eq!(args[3..3 + 2 * LIMIT_FIELDS], limits);
        let hits = &args[3 + 2 * LIMIT_FIELDS..];
        assert_eq!(hits[0], "3");
        assert_eq!(
            hits[1..].chunks(HIT_FIELDS).collect::<Vec<_>>(),
            [
                ["1", "1", "9007199254740991", "0", "q"],
                ["2", "2", "9007199254740991", "1", "S"],
                ["1", "1", "9007199254740991", "2", "q"],
            ]
        );
    }

    #[test]
    fn many_hits_find_their_keys_and_limits_by_hashing() {
        let hits: Vec<Hit> = (0..40).map(|i| hit(["a", "b", "c"][i % 3], i)).collect();
        let (keys, slots) = distinct(hits.iter().map(|h| &*h.key));
        assert_eq!(keys, [b"a".as_slice(), b"b", b"c"]);
        let want: Vec<usize> = (0..40).map(|i| i % 3).collect();
        assert_eq!(slots, want);
    }

    #[test]
    fn nanos_round_periods_up_and_scale_resets() {
        let call = encode(&[hit("a", 0)], b"", Mode::Independent, Unit::Nanos, Some(9));
        let (_, args) = call.keys_and_args();
        assert_eq!(args[..5], ["9", "independent", "1", "f", "3"]);
        assert_eq!(args[5], "1500001");
        let reply = Value::Array([1, 1, 2, 7].map(Value::Int).to_vec());
        let o = decode(reply, &call).unwrap();
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
        let call = encode(&[hit("a", 0)], b"p:", Mode::Request, Unit::Nanos, None);
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
        let call = encode(&[hit("a", 0)], b"", Mode::Request, Unit::Micros, None);
        let ints = |v: &[i64]| Value::Array(v.iter().copied().map(Value::Int).collect());
        let o = decode(ints(&[1, 1, 2, 3]), &call).unwrap();
        assert!(o.admitted);
        assert_eq!(
            o.hits[0],
            HitOutcome {
                admitted: true,
                remaining: 2,
                reset_nanos: 3
            }
        );
        assert!(decode(ints(&[1]), &call).is_err());
        assert!(decode(Value::Nil, &call).is_err());
        assert!(decode(ints(&[-1, 1, 2, 3]), &call).is_err());
        assert!(decode(ints(&[]), &call).is_err());
    }
}
