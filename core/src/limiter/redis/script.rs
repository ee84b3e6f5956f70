//! The limiter script: encoding a batch into its KEYS and ARGV, calling it, and decoding its
//! reply. Generic over the connection, so any `ConnectionLike` works.
//!
//! The script is one Lua chunk made of the files of `lua/`: `prelude.lua` (the KEYS/ARGV
//! contract, at its top, integer helpers and the helpers the algorithms share), one file per
//! algorithm, and `main.lua`. One script serves every algorithm, so a request is one call
//! whatever the mix of its limits.
//!
//! It reaches Redis in one of two forms, each call one command:
//!
//! - **A script** ([`SOURCE`], the default): `EVALSHA`, and on `NOSCRIPT` the same call as
//!   `EVAL` (which caches it).
//! - **A function library** (`redis.functions = true`, Redis 7 and later): the same files
//!   loaded once with `FUNCTION LOAD` ([`LIBRARY`]) and called with `FCALL`. The library's
//!   helpers and every algorithm's functions are made once, when it loads, instead of on
//!   every call, which makes a call cheaper for Redis. On `Function not found` (a Redis
//!   restarted without persistence, `FUNCTION FLUSH`, a Cluster node that joined later) the
//!   library is loaded again and the call sent once more. A limiter whose Redis refuses
//!   functions (before 7.0, or an ACL without `FUNCTION` or
//!   `FCALL`) goes back to the script, and keeps to it from then on ([`Functions`]).
//!
//! A call is encoded straight into the command's one buffer: each distinct key and each
//! distinct limit once (the limits as decimal fields), then every request in one binary
//! argument, 21 bytes per hit, which the script reads with `struct.unpack` (no string or
//! number parsing per hit). The reply is read in its short form (a repeated outcome is one
//! item). Time in the script is in microseconds; with [`Unit::Nanos`] the periods are
//! converted as they are written and the reply's resets as they are read.

use std::collections::HashMap;
use std::hash::Hash;
use std::io::Write as _;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisWrite as _, ServerErrorKind, Value};

use crate::config::model::{Algorithm, Charge};
use crate::limiter::{BatchOutcome, Hit, HitOutcome, LimitParams, Role};

const PRELUDE: &str = include_str!("lua/prelude.lua");
const ALGORITHMS: [&str; 5] = [
    include_str!("lua/funnel.lua"),
    include_str!("lua/token_bucket.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
];
const MAIN: &str = include_str!("lua/main.lua");
const LIBRARY_TAIL: &str = include_str!("lua/library.lua");

/// The prelude's line that marks, per call, the algorithms a request uses (see `MAKERS` in
/// `prelude.lua`); the library marks them all instead, and makes each once.
const SCRIPT_MAKERS: &str =
    "for l = 1, tonumber(ARGV[2]) or 0 do MAKERS[ARGV[5 * l - 2]] = true end";
const LIBRARY_MAKERS: &str =
    "MAKERS.f, MAKERS.b, MAKERS.w, MAKERS.s, MAKERS.l = true, true, true, true, true";

/// The Lua source of the script form, with its KEYS/ARGV contract at the top.
pub static SOURCE: LazyLock<String> = LazyLock::new(|| {
    [PRELUDE]
        .into_iter()
        .chain(ALGORITHMS)
        .chain([MAIN])
        .collect()
});

static SHA: LazyLock<String> = LazyLock::new(|| redis::Script::new(&SOURCE).get_hash().to_owned());

/// The function library: its name (also its one function's name) and its source.
#[derive(Debug)]
pub struct Library {
    pub name: String,
    pub source: String,
}

/// The library form. Its name holds a hash of its code, so that two versions of sluice
/// sharing a Redis (a rolling upgrade) each call their own.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let prelude = PRELUDE.replacen(SCRIPT_MAKERS, LIBRARY_MAKERS, 1);
    let body: String = [prelude.as_str()]
        .into_iter()
        .chain(ALGORITHMS)
        .chain([LIBRARY_TAIL])
        .collect();
    let hash = redis::Script::new(&format!("{body}{MAIN}"))
        .get_hash()
        .to_owned();
    let name = format!("sluice_{}", &hash[..16]);
    let source = format!(
        "#!lua name={name}\n{body}\nredis.register_function('{name}', function(KEYS, ARGV)\n\
         {MAIN}\nend)\n"
    );
    Library { name, source }
});

/// The form a call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `FCALL` of the library's function.
    Function,
    /// `EVALSHA` of the script.
    Script,
}

/// Whether a limiter's calls go to the function library (when `redis.functions` is on, until
/// its Redis refuses functions) or to the script.
#[derive(Debug)]
pub struct Functions {
    on: AtomicBool,
}

impl Functions {
    pub fn new(enabled: bool) -> Functions {
        Functions {
            on: AtomicBool::new(enabled),
        }
    }

    /// The form of the next call.
    pub fn via(&self) -> Via {
        if self.on.load(Ordering::Relaxed) {
            Via::Function
        } else {
            Via::Script
        }
    }

    /// Redis refused functions: calls go to the script from now on.
    fn refused(&self, why: &RedisError) {
        if self.on.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                error = %why,
                "redis refuses functions: calling the limiter script with EVALSHA instead"
            );
        }
    }
}

/// ARGV fields per distinct limit.
const LIMIT_FIELDS: usize = 5;

/// Bytes of a request's header in the binary ARGV (mode `B`, hit count `I4`).
const REQUEST_BYTES: usize = 5;

/// Bytes per hit in the binary ARGV (slot `I4`, limit `I4`, cost `d`, group `I4`, role `B`).
const HIT_BYTES: usize = 21;

/// The largest integer the script handles exactly (2^53 - 1); larger inputs are clamped.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

/// Above this many items, distinct keys and limits are found with a hash map, not a scan.
const LINEAR_SCAN_MAX: usize = 16;

/// How the script plans one request's hits (its mode field).
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

/// One request of a call: its hits, and how the script plans them.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    pub hits: &'a [Hit],
    pub mode: Mode,
}

/// One call, encoded once: `FCALL <name>` or `EVALSHA <sha>`, then `<numkeys> KEYS... ARGV...`,
/// ready to send. It carries a batch of requests (group commit), each decided as if alone.
#[derive(Debug, Clone)]
pub struct Call {
    cmd: Cmd,
    via: Via,
    /// The number of hits of each request, in order.
    hits: Vec<usize>,
    unit: Unit,
}

/// One hit as the binary ARGV carries it: slot, limit, cost, group, role (for tests).
#[cfg(test)]
type EncodedHit = (u32, u32, f64, u32, u8);

impl Call {
    /// Its requests, read back from the binary ARGV: per request its mode byte and its hits.
    #[cfg(test)]
    fn requests(&self) -> Vec<(u8, Vec<EncodedHit>)> {
        let Some(redis::Arg::Simple(blob)) = self.cmd.args_iter().last() else {
            return Vec::new();
        };
        let u32_at = |at: usize| u32::from_le_bytes(blob[at..at + 4].try_into().unwrap());
        let mut out = Vec::new();
        let mut at = 0;
        while at < blob.len() {
            let (mode, count) = (blob[at], u32_at(at + 1));
            at += REQUEST_BYTES;
            let hits = (0..count)
                .map(|_| {
                    let cost = f64::from_le_bytes(blob[at + 8..at + 16].try_into().unwrap());
                    let hit = (
                        u32_at(at),
                        u32_at(at + 4),
                        cost,
                        u32_at(at + 16),
                        blob[at + 20],
                    );
                    at += HIT_BYTES;
                    hit
                })
                .collect();
            out.push((mode, hits));
        }
        out
    }

    /// Its KEYS and ARGV, as text (for tests and debugging; the last ARGV, the requests, is
    /// binary).
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

/// Builds the call for `parts` (one or more requests, decided in this order), whose periods
/// are in `unit`, in the form `via`. `now_micros` overrides Redis `TIME` (tests only).
pub fn encode(
    parts: &[Part<'_>],
    prefix: &[u8],
    unit: Unit,
    now_micros: Option<u64>,
    via: Via,
) -> Call {
    let count: usize = parts.iter().map(|p| p.hits.len()).sum();
    let all = || parts.iter().flat_map(|p| p.hits.iter());
    let (keys, slot_of) = distinct(all().map(|h| &*h.key), count);
    let (limits, limit_of) = distinct(all().map(|h| script_limit(&h.limit, unit)), count);
    let key_bytes: usize = keys.iter().map(|k| prefix.len() + k.len()).sum();
    let blob_bytes = REQUEST_BYTES * parts.len() + HIT_BYTES * count;
    let mut cmd = Cmd::with_capacity(
        6 + keys.len() + LIMIT_FIELDS * limits.len(),
        80 + key_bytes + 40 * limits.len() + blob_bytes,
    );
    match via {
        Via::Function => cmd.arg("FCALL").arg(LIBRARY.name.as_str()),
        Via::Script => cmd.arg("EVALSHA").arg(SHA.as_str()),
    };
    cmd.arg(keys.len());
    for key in &keys {
        let mut arg = cmd.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = arg.write_all(prefix).and_then(|()| arg.write_all(key));
    }
    match now_micros {
        Some(n) => cmd.arg(n.min(MAX_EXACT)),
        None => cmd.arg(""),
    };
    cmd.arg(limits.len());
    for limit in &limits {
        push_limit(&mut cmd, limit);
    }
    cmd.arg(parts.len());
    // The requests, one binary argument written in place (writing into the command's own
    // buffer cannot fail).
    let mut blob = cmd.writer_for_next_arg();
    let mut indices = slot_of.into_iter().zip(limit_of);
    for part in parts {
        let mut head = [0; REQUEST_BYTES];
        head[0] = u8::from(part.mode == Mode::Independent);
        head[1..].copy_from_slice(&index(part.hits.len()).to_le_bytes());
        let _ = blob.write_all(&head);
        for (hit, (slot, limit)) in part.hits.iter().zip(indices.by_ref()) {
            let _ = blob.write_all(&encode_hit(hit, slot + 1, limit + 1));
        }
    }
    drop(blob);
    Call {
        cmd,
        via,
        hits: parts.iter().map(|p| p.hits.len()).collect(),
        unit,
    }
}

/// The encoded size of a call's arguments for `hits`, roughly (for bounding a batch).
pub fn encoded_size(hits: &[Hit], prefix: &[u8]) -> usize {
    hits.iter()
        .map(|h| prefix.len() + h.key.len() + HIT_BYTES + 40)
        .sum::<usize>()
        + REQUEST_BYTES
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

/// A hit's 21 bytes in the binary ARGV (see `HIT_FORMAT` in `prelude.lua`).
fn encode_hit(hit: &Hit, slot: usize, limit: usize) -> [u8; HIT_BYTES] {
    let role = match hit.role {
        Role::Enforced => 0,
        Role::Shadow => 1,
        Role::Quota => 2,
        Role::QuotaShadow => 3,
    } + if hit.refund { 8 } else { 0 };
    let mut out = [0; HIT_BYTES];
    out[0..4].copy_from_slice(&index(slot).to_le_bytes());
    out[4..8].copy_from_slice(&index(limit).to_le_bytes());
    // Exact: at most 2^53 - 1.
    #[allow(clippy::cast_precision_loss)]
    let cost = hit.cost.min(MAX_EXACT) as f64;
    out[8..16].copy_from_slice(&cost.to_le_bytes());
    out[16..20].copy_from_slice(&index(hit.group).to_le_bytes());
    out[20] = role;
    out
}

/// A count or index as the binary ARGV's `I4` (a call never holds 2^32 keys, limits, hits or
/// descriptors; saturated rather than wrapped, so a larger one is refused by the script).
fn index(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The distinct items (`len` of them in all), in order of first appearance, and the index of
/// each item among them.
fn distinct<T: Copy + Eq + Hash>(
    items: impl Iterator<Item = T>,
    len: usize,
) -> (Vec<T>, Vec<usize>) {
    let mut found = Vec::new();
    let mut index = Vec::with_capacity(len);
    if len <= LINEAR_SCAN_MAX {
        for item in items {
            let at = found.iter().position(|f| *f == item).unwrap_or_else(|| {
                found.push(item);
                found.len() - 1
            });
            index.push(at);
        }
    } else {
        let mut seen = HashMap::with_capacity_and_hasher(len, ahash::RandomState::new());
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

/// Runs a call. By function: `FCALL`; on `Function not found`, `FUNCTION LOAD` and `FCALL`
/// again; when Redis refuses functions, the call goes to the script and so do the limiter's
/// next ones (`functions`). By script: `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL`.
pub async fn invoke<C: ConnectionLike + Send>(
    conn: &mut C,
    call: &Call,
    functions: &Functions,
) -> redis::RedisResult<Value> {
    if call.via == Via::Script {
        return by_script(conn, &call.cmd).await;
    }
    match send(conn, &call.cmd).await {
        Err(e) if function_missing(&e) => match send(conn, &load_library()).await {
            Ok(_) => match send(conn, &call.cmd).await {
                // Still missing: loaded, but not on this call's node (a Cluster changing
                // under us). The script answers this once.
                Err(e) if function_missing(&e) => {}
                other => return other,
            },
            Err(e) if load_refused(&e) => functions.refused(&e),
            Err(e) => return Err(e),
        },
        Err(e) if command_refused(&e) => functions.refused(&e),
        other => return other,
    }
    by_script(conn, &with_head(&call.cmd, "EVALSHA", &SHA)).await
}

/// `EVALSHA`, and on `NOSCRIPT` the same call as `EVAL` (which caches the script).
async fn by_script<C: ConnectionLike + Send>(
    conn: &mut C,
    evalsha: &Cmd,
) -> redis::RedisResult<Value> {
    match send(conn, evalsha).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            send(conn, &with_head(evalsha, "EVAL", &SOURCE)).await
        }
        other => other,
    }
}

/// `FUNCTION LOAD REPLACE` of the library (on every master of a Cluster).
fn load_library() -> Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(LIBRARY.source.as_str());
    cmd
}

/// The answer to an `FCALL` of a function the server does not have.
fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("Function not found"))
}

/// The answer to a command this server does not know or does not let this user run (an
/// `FCALL` to a Redis before 7.0, or an ACL without it).
fn command_refused(e: &RedisError) -> bool {
    const UNKNOWN: &str = "unknown command";
    e.code() == Some("NOPERM")
        || (e.code() == Some("ERR")
            && e.detail()
                .and_then(|d| d.get(..UNKNOWN.len()))
                .is_some_and(|d| d.eq_ignore_ascii_case(UNKNOWN)))
}

/// A failed `FUNCTION LOAD` that loading again would not fix: the command refused
/// (`NOPERM`, or `ERR unknown command`), or the library refused (any other `ERR`). Not a
/// time-out, a lost connection, or a busy, loading or read-only server.
fn load_refused(e: &RedisError) -> bool {
    matches!(e.code(), Some("ERR" | "NOPERM"))
}

/// The same keys and arguments as `cmd`, after another command name and first argument
/// (`EVALSHA <sha>` or `EVAL <source>` in place of `FCALL <name>` or `EVALSHA <sha>`).
fn with_head(cmd: &Cmd, name: &str, first: &str) -> Cmd {
    let mut out = redis::cmd(name);
    out.arg(first);
    for arg in cmd.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            out.arg(bytes);
        }
    }
    out
}

/// Sends one command; an error reply becomes an error.
async fn send<C: ConnectionLike + Send>(conn: &mut C, cmd: &Cmd) -> redis::RedisResult<Value> {
    match conn.req_packed_command(cmd).await? {
        error @ Value::ServerError(_) => error.extract_error(),
        reply => Ok(reply),
    }
}

/// The reply's marker of a denied hit (then its wait).
const REPLY_DENIED: i64 = -1;

/// The reply's marker of an admitted hit with the remaining and reset of the admitted hit
/// before it (the same key and limit).
const REPLY_SAME: i64 = -2;

/// Bytes per number of the script's reply (a little-endian double).
const REPLY_NUMBER_BYTES: usize = 8;

/// Decodes the script's reply to `call` (its short form, packed: see the top of
/// `prelude.lua`): one outcome per request, resets in the call's unit.
pub fn decode(reply: Value, call: &Call) -> Result<Vec<BatchOutcome>, RedisError> {
    let bad = |what: &str| {
        RedisError::from((ErrorKind::Parse, "unexpected script reply", what.to_owned()))
    };
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
    let mut outcomes = Vec::with_capacity(call.hits.len());
    for &count in &call.hits {
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
        outcomes.push(BatchOutcome { hits, admitted });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitParams;

    /// A reply as the script packs it.
    #[allow(clippy::cast_precision_loss)]
    fn packed(numbers: &[i64]) -> Value {
        Value::BulkString(
            numbers
                .iter()
                .flat_map(|&n| (n as f64).to_le_bytes())
                .collect(),
        )
    }

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
        let hits = [hit("a", 0), other, hit("a", 2)];
        let call = encode(
            &one(&hits, Mode::Request),
            b"p:",
            Unit::Micros,
            None,
            Via::Script,
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
        assert_eq!(args[..2], ["", "2"]);
        assert_eq!(args[2..2 + 2 * LIMIT_FIELDS], limits);
        assert_eq!(args[2 + 2 * LIMIT_FIELDS], "1", "one request");
        assert_eq!(args.len(), 4 + 2 * LIMIT_FIELDS, "then one binary argument");
        let q = 9_007_199_254_740_991.0;
        assert_eq!(
            call.requests(),
            [(
                0,
                vec![(1, 1, q, 0, 2), (2, 2, q, 1, 1 + 8), (1, 1, q, 2, 2)]
            )]
        );
    }

    #[test]
    fn many_hits_find_their_keys_and_limits_by_hashing() {
        let hits: Vec<Hit> = (0..40).map(|i| hit(["a", "b", "c"][i % 3], i)).collect();
        let (keys, slots) = distinct(hits.iter().map(|h| &*h.key), hits.len());
        assert_eq!(keys, [b"a".as_slice(), b"b", b"c"]);
        let want: Vec<usize> = (0..40).map(|i| i % 3).collect();
        assert_eq!(slots, want);
    }

    #[test]
    fn nanos_round_periods_up_and_scale_resets() {
        let hits = [hit("a", 0)];
        let call = encode(
            &one(&hits, Mode::Independent),
            b"",
            Unit::Nanos,
            Some(9),
            Via::Function,
        );
        let (_, args) = call.keys_and_args();
        assert_eq!(args[..4], ["9", "1", "f", "3"]);
        assert_eq!(args[4], "1500001");
        assert_eq!(args[7], "1");
        assert_eq!(call.requests()[0].0, 1, "independent");
        let o = decode(packed(&[1, 2, 7]), &call).unwrap();
        assert_eq!(o[0].hits[0].reset_nanos, 7_000);
    }

    #[test]
    fn a_batch_sends_keys_and_limits_once_and_each_request_after_the_other() {
        let first = [hit("a", 0), hit("b", 1)];
        let second = [hit("b", 0)];
        let parts = [
            Part {
                hits: &first,
                mode: Mode::Request,
            },
            Part {
                hits: &second,
                mode: Mode::Independent,
            },
        ];
        let call = encode(&parts, b"", Unit::Micros, None, Via::Script);
        let (keys, args) = call.keys_and_args();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(args[2 + LIMIT_FIELDS], "2");
        let q = 9_007_199_254_740_991.0;
        assert_eq!(
            call.requests(),
            [
                (0, vec![(1, 1, q, 0, 2), (2, 1, q, 1, 2)]),
                (1, vec![(2, 1, q, 0, 2)]),
            ]
        );
        let out = decode(packed(&[0, 5, 6, -1, 9, 1, 2, 3]), &call).unwrap();
        assert_eq!(out.len(), 2);
        assert!(!out[0].admitted && out[1].admitted);
        assert_eq!(out[0].hits[1].reset_nanos, 9);
        assert_eq!(out[1].hits[0].remaining, 2);
        assert!(decode(packed(&[0, 5, 6, -1, 9, 1]), &call).is_err());
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

    fn one(hits: &[Hit], mode: Mode) -> [Part<'_>; 1] {
        [Part { hits, mode }]
    }

    fn call_via(via: Via) -> Call {
        let hits = [hit("a", 0)];
        encode(&one(&hits, Mode::Request), b"p:", Unit::Nanos, None, via)
    }

    fn mock(replies: &[&'static [u8]]) -> Mock {
        Mock {
            replies: replies.to_vec(),
            sent: Vec::new(),
        }
    }

    #[tokio::test]
    async fn noscript_is_answered_by_sending_the_source_once() {
        let call = call_via(Via::Script);
        let functions = Functions::new(false);
        let mut conn = mock(&[
            b"-NOSCRIPT No matching script.\r\n",
            b"*1\r\n:1\r\n",
            b"*1\r\n:0\r\n",
        ]);
        let first = invoke(&mut conn, &call, &functions).await.unwrap();
        assert_eq!(first, Value::Array(vec![Value::Int(1)]));
        let second = invoke(&mut conn, &call, &functions).await.unwrap();
        assert_eq!(second, Value::Array(vec![Value::Int(0)]));
        assert_eq!(conn.sent, ["EVALSHA", "EVAL", "EVALSHA"]);
        let mut failing = mock(&[b"-ERR boom\r\n"]);
        assert!(invoke(&mut failing, &call, &functions).await.is_err());
        assert_eq!(failing.sent, ["EVALSHA"], "other errors are not retried");
    }

    #[tokio::test]
    async fn a_missing_function_is_loaded_and_called_again() {
        let functions = Functions::new(true);
        let call = call_via(functions.via());
        let mut conn = mock(&[
            b"-ERR Function not found\r\n",
            b"+sluice_x\r\n",
            b"*1\r\n:1\r\n",
            b"*1\r\n:0\r\n",
        ]);
        let first = invoke(&mut conn, &call, &functions).await.unwrap();
        assert_eq!(first, Value::Array(vec![Value::Int(1)]));
        invoke(&mut conn, &call, &functions).await.unwrap();
        assert_eq!(conn.sent, ["FCALL", "FUNCTION", "FCALL", "FCALL"]);
        assert_eq!(functions.via(), Via::Function);
        // Other errors are the call's answer: not retried, functions kept.
        for reply in [
            &b"-ERR sluice: malformed hit 1\r\n"[..],
            b"-BUSY Redis is busy running a script.\r\n",
            b"-LOADING Redis is loading the dataset in memory\r\n",
        ] {
            let mut failing = mock(&[reply]);
            assert!(invoke(&mut failing, &call, &functions).await.is_err());
            assert_eq!(failing.sent, ["FCALL"]);
            assert_eq!(functions.via(), Via::Function);
        }
    }

    #[tokio::test]
    async fn a_redis_refusing_functions_gets_the_script_from_then_on() {
        let refusals: [&[&'static [u8]]; 4] = [
            // Before Redis 7.0.
            &[b"-ERR unknown command `FCALL`, with args beginning with: \r\n"],
            // An ACL without FCALL.
            &[b"-NOPERM User u has no permissions to run the 'fcall' command\r\n"],
            // An ACL without FUNCTION LOAD.
            &[
                b"-ERR Function not found\r\n",
                b"-NOPERM User u has no permissions to run the 'function|load' command\r\n",
            ],
            // A library the server will not load.
            &[
                b"-ERR Function not found\r\n",
                b"-ERR Error registering functions\r\n",
            ],
        ];
        for replies in refusals {
            let functions = Functions::new(true);
            let call = call_via(functions.via());
            let mut all = replies.to_vec();
            all.extend([&b"-NOSCRIPT No matching script.\r\n"[..], b"*1\r\n:1\r\n"]);
            let mut conn = mock(&all);
            let reply = invoke(&mut conn, &call, &functions).await.unwrap();
            assert_eq!(reply, Value::Array(vec![Value::Int(1)]));
            let mut want = vec!["FCALL"];
            if replies.len() == 2 {
                want.push("FUNCTION");
            }
            want.extend(["EVALSHA", "EVAL"]);
            assert_eq!(conn.sent, want);
            assert_eq!(functions.via(), Via::Script);
            let next = call_via(functions.via());
            let mut conn = mock(&[b"*1\r\n:0\r\n"]);
            invoke(&mut conn, &next, &functions).await.unwrap();
            assert_eq!(conn.sent, ["EVALSHA"]);
        }
    }

    #[tokio::test]
    async fn a_read_only_server_while_loading_is_an_error_not_a_refusal() {
        let functions = Functions::new(true);
        let call = call_via(functions.via());
        let mut conn = mock(&[
            b"-ERR Function not found\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
        ]);
        assert!(invoke(&mut conn, &call, &functions).await.is_err());
        assert_eq!(conn.sent, ["FCALL", "FUNCTION"]);
        assert_eq!(functions.via(), Via::Function);
    }

    #[test]
    fn the_library_is_the_script_with_every_algorithm_made_once() {
        assert_eq!(SOURCE.matches(SCRIPT_MAKERS).count(), 1);
        let lib = &LIBRARY.source;
        assert!(!lib.contains(SCRIPT_MAKERS));
        assert_eq!(lib.matches(LIBRARY_MAKERS).count(), 1);
        assert!(lib.starts_with(&format!("#!lua name={}\n", LIBRARY.name)));
        assert!(lib.contains(&format!(
            "redis.register_function('{}', function(KEYS, ARGV)",
            LIBRARY.name
        )));
        assert!(lib.contains(MAIN) && lib.contains(LIBRARY_TAIL));
        assert!(LIBRARY.name.starts_with("sluice_") && LIBRARY.name.len() == 23);
        let head = |via| {
            let call = call_via(via);
            let mut args = call.cmd.args_iter().take(2).map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            });
            (args.next().unwrap(), args.next().unwrap())
        };
        assert_eq!(head(Via::Function), ("FCALL".into(), LIBRARY.name.clone()));
        assert_eq!(head(Via::Script), ("EVALSHA".into(), SHA.clone()));
    }

    #[test]
    fn a_repeat_in_the_reply_is_the_admitted_hit_before_it() {
        let hits = [hit("a", 0), hit("a", 1), hit("a", 2), hit("a", 3)];
        let call = encode(
            &one(&hits, Mode::Request),
            b"",
            Unit::Nanos,
            None,
            Via::Script,
        );
        let o = decode(packed(&[0, 4, 5, -1, 7, -2, -2]), &call).unwrap();
        let admitted = HitOutcome {
            admitted: true,
            remaining: 4,
            reset_nanos: 5_000,
            from_local_cache: false,
        };
        let denied = HitOutcome {
            admitted: false,
            remaining: 0,
            reset_nanos: 7_000,
            from_local_cache: false,
        };
        assert_eq!(o[0].hits, [admitted, denied, admitted, admitted]);
    }

    #[test]
    fn decode_checks_the_shape() {
        let hits = [hit("a", 0)];
        let call = encode(
            &one(&hits, Mode::Request),
            b"",
            Unit::Micros,
            None,
            Via::Script,
        );
        let o = decode(packed(&[1, 2, 3]), &call).unwrap();
        assert!(o[0].admitted);
        assert_eq!(
            o[0].hits[0],
            HitOutcome {
                admitted: true,
                remaining: 2,
                reset_nanos: 3,
                from_local_cache: false,
            }
        );
        assert!(decode(packed(&[1]), &call).is_err(), "short");
        assert!(decode(packed(&[1, 2, 3, 4]), &call).is_err(), "long");
        assert!(decode(Value::Nil, &call).is_err());
        assert!(
            decode(packed(&[1, -3, 3]), &call).is_err(),
            "negative remaining"
        );
        assert!(
            decode(packed(&[1, -1, -3]), &call).is_err(),
            "negative wait"
        );
        assert!(
            decode(packed(&[1, -2]), &call).is_err(),
            "a repeat of nothing"
        );
        assert!(decode(packed(&[]), &call).is_err());
        let array = Value::Array([1, 2, 3].map(Value::Int).to_vec());
        assert!(decode(array, &call).is_err(), "an array");
        let mut ragged = packed(&[1, 2, 3]);
        if let Value::BulkString(bytes) = &mut ragged {
            bytes.pop();
        }
        assert!(decode(ragged, &call).is_err(), "a partial number");
        let mut fraction = 1.5f64.to_le_bytes().to_vec();
        fraction.extend(2f64.to_le_bytes());
        fraction.extend(3f64.to_le_bytes());
        assert!(
            decode(Value::BulkString(fraction), &call).is_err(),
            "not an integer"
        );
    }
}
