//! A call encoded: the KEYS, the limits and the requests as the script reads them.

use super::*;

/// ARGV fields per distinct limit.
pub(super) const LIMIT_FIELDS: usize = 7;

/// Bytes of a request's header in the binary ARGV (mode `B`, hit count `I4`).
const REQUEST_BYTES: usize = 5;

/// Bytes per hit in the binary ARGV (slot `I4`, limit `I4`, cost `d`, group `I4`, role `B`).
const HIT_BYTES: usize = 21;

/// Bytes a hit naming its hold (role flag [`ROLE_HOLD`]) adds after its 21: the id, `d`.
const HOLD_BYTES: usize = 8;

/// The role byte's flag of a hit followed by its hold's id.
const ROLE_HOLD: u8 = 16;

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
    /// All or nothing, like `Request`, reported the same, but nothing is written (admin
    /// `/why`).
    Dry,
    /// A replica's lease on the request's one hit's key (its cost: the units wanted): give
    /// back what is left of its old lease, take a new one (`Leases` in `prelude.lua`).
    Lease(LeaseArgs),
}

/// What a lease request carries beside its hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseArgs {
    /// Units of the replica's current lease on the key to give back.
    pub give: u64,
    /// The cost of the request asking: the lease is a whole number of it (none when not even
    /// one can be leased).
    pub least: u64,
    /// The most the new lease may be valid, in microseconds.
    pub validity_micros: u64,
    /// The replica's id (below 2^53), its field in the key's lease records.
    pub replica: u64,
    /// Redis's time (Unix microseconds) after which the request does nothing at all (0:
    /// none): a region's request to the home Redis that arrives after its caller gave up on
    /// it (held in a partition) must neither give back units of a newer share under the same
    /// id nor take a share no one will spend.
    pub deadline_micros: u64,
}

/// Bytes a lease request adds after its hit (`LEASE_FORMAT` in `prelude.lua`).
const LEASE_BYTES: usize = 40;

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
    pub(super) cmd: Cmd,
    pub(super) via: Via,
    /// The number of hits of each request, in order.
    pub(super) hits: Vec<usize>,
    /// Whether each request is a lease request (its reply comes first, see the prelude).
    pub(super) leases: Vec<bool>,
    pub(super) unit: Unit,
}

/// One hit as the binary ARGV carries it: slot, limit, cost, group, role (for tests).
#[cfg(test)]
pub(super) type EncodedHit = (u32, u32, f64, u32, u8);

impl Call {
    /// Its requests, read back from the binary ARGV: per request its mode byte and its hits.
    #[cfg(test)]
    pub(super) fn requests(&self) -> Vec<(u8, Vec<EncodedHit>)> {
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
                    if hit.4 & ROLE_HOLD != 0 {
                        at += HOLD_BYTES;
                    }
                    hit
                })
                .collect();
            if mode == 3 {
                at += LEASE_BYTES;
            }
            out.push((mode, hits));
        }
        out
    }

    /// Its KEYS and ARGV as sent, bytes (for a script that runs this one inside itself:
    /// reservations, `redis/reserve.rs`).
    pub(crate) fn keys_and_args_raw(&self) -> (Vec<&[u8]>, Vec<&[u8]>) {
        let mut args = self.cmd.args_iter().skip(2).filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b),
            _ => None,
        });
        let count = args
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .unwrap_or(0);
        let keys = args.by_ref().take(count).collect();
        (keys, args.collect())
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
/// are in `unit`, in the form `via`. `now_micros` overrides Redis `TIME` (tests only);
/// `clock_nanos`, the limiter's clock, gives the calendar windows sent with their limits.
pub fn encode(
    parts: &[Part<'_>],
    prefix: &[u8],
    unit: Unit,
    (now_micros, clock_nanos): (Option<u64>, u64),
    via: Via,
) -> Call {
    let count: usize = parts.iter().map(|p| p.hits.len()).sum();
    let all = || parts.iter().flat_map(|p| p.hits.iter());
    let (keys, slot_of) = distinct(all().map(|h| &*h.key), count);
    let (limits, limit_of) = distinct(
        all().map(|h| script_limit(&h.limit, unit, clock_nanos)),
        count,
    );
    let aux = auxiliary(parts);
    let key_bytes: usize = keys.iter().map(|k| prefix.len() + k.len()).sum::<usize>()
        + aux
            .iter()
            .map(|(k, suffix)| prefix.len() + k.len() + suffix.len())
            .sum::<usize>();
    let blob_bytes = REQUEST_BYTES * parts.len() + HIT_BYTES * count + LEASE_BYTES;
    let mut cmd = Cmd::with_capacity(
        6 + keys.len() + aux.len() + LIMIT_FIELDS * limits.len(),
        80 + key_bytes + 40 * limits.len() + blob_bytes,
    );
    match via {
        Via::Function => cmd.arg("FCALL").arg(LIBRARY.name.as_str()),
        Via::Script => cmd.arg("EVALSHA").arg(SHA.as_str()),
    };
    cmd.arg(keys.len() + aux.len());
    // Writing into the command's own buffer cannot fail.
    for key in &keys {
        let mut arg = cmd.writer_for_next_arg();
        let _ = arg.write_all(prefix).and_then(|()| arg.write_all(key));
    }
    for (key, suffix) in &aux {
        let mut arg = cmd.writer_for_next_arg();
        let _ = arg
            .write_all(prefix)
            .and_then(|()| arg.write_all(key))
            .and_then(|()| arg.write_all(suffix));
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
        head[0] = match part.mode {
            Mode::Request => 0,
            Mode::Independent => 1,
            Mode::Dry => 2,
            Mode::Lease(_) => 3,
        };
        head[1..].copy_from_slice(&index(part.hits.len()).to_le_bytes());
        let _ = blob.write_all(&head);
        for (hit, (slot, limit)) in part.hits.iter().zip(indices.by_ref()) {
            let _ = blob.write_all(&encode_hit(hit, slot + 1, limit + 1));
            if let Some(id) = hit.hold {
                // Exact: a hold's id is below 2^53 (concurrency::BY_ID).
                #[allow(clippy::cast_precision_loss)]
                let id = id.get().min(MAX_EXACT) as f64;
                let _ = blob.write_all(&id.to_le_bytes());
            }
        }
        if let Mode::Lease(args) = part.mode {
            let _ = blob.write_all(&lease_bytes(args));
        }
    }
    drop(blob);
    Call {
        cmd,
        via,
        hits: parts.iter().map(|p| p.hits.len()).collect(),
        leases: parts
            .iter()
            .map(|p| matches!(p.mode, Mode::Lease(_)))
            .collect(),
        unit,
    }
}

/// The suffix of a key's lease records (`LEASE_SUFFIX` in `prelude.lua`).
pub(crate) const LEASE_SUFFIX: &[u8] = b":lease";
/// The suffix of a key's penalty box (`BLOCK_SUFFIX` in `prelude.lua`).
const BLOCK_SUFFIX: &[u8] = b":block";

/// The keys besides the state keys that the script may touch for `parts`, each a state key and
/// its suffix, once: a leased key's records, and the penalty box of a key whose limit has one.
/// They follow the state keys in KEYS, so that Redis checks them where the call goes: in a
/// Cluster whose slot is moving, a key the script touches without having named it fails the
/// script there (a "non local key"), where a named one sends the whole call on (`ASK`,
/// `TRYAGAIN`) before anything runs.
fn auxiliary<'a>(parts: &[Part<'a>]) -> Vec<(&'a [u8], &'static [u8])> {
    let mut aux: Vec<(&[u8], &[u8])> = Vec::new();
    for part in parts {
        for hit in part.hits {
            let leased = matches!(part.mode, Mode::Lease(_)).then_some(LEASE_SUFFIX);
            let boxed = (hit.limit.block_nanos > 0).then_some(BLOCK_SUFFIX);
            for suffix in [leased, boxed].into_iter().flatten() {
                let key: (&[u8], &[u8]) = (&hit.key, suffix);
                if !aux.contains(&key) {
                    aux.push(key);
                }
            }
        }
    }
    aux
}

/// A lease request's bytes after its hit: give, least, validity, replica, deadline, each a
/// double
/// (exact: at most 2^53 - 1).
#[allow(clippy::cast_precision_loss)]
fn lease_bytes(args: LeaseArgs) -> [u8; LEASE_BYTES] {
    let mut out = [0; LEASE_BYTES];
    let fields = [
        args.give,
        args.least,
        args.validity_micros,
        args.replica,
        args.deadline_micros,
    ];
    for (chunk, field) in out.chunks_exact_mut(8).zip(fields) {
        chunk.copy_from_slice(&(field.min(MAX_EXACT) as f64).to_le_bytes());
    }
    out
}

/// The encoded size of a call's arguments for `hits`, roughly (for bounding a batch; a lease
/// request adds [`LEASE_BYTES`], within the rough 40 a hit is counted for).
pub fn encoded_size(hits: &[Hit], prefix: &[u8]) -> usize {
    hits.iter()
        .map(|h| {
            let hold = if h.hold.is_some() { HOLD_BYTES } else { 0 };
            prefix.len() + h.key.len() + HIT_BYTES + hold + 40
        })
        .sum::<usize>()
        + REQUEST_BYTES
}

/// A limit as the script takes it: period in microseconds, flags (1 borrow, 2 always), its
/// penalty box in microseconds (0: none), and for calendar windows the previous window's
/// start, the current window's start and end, and the next one's end, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ScriptLimit {
    code: &'static str,
    quota: u32,
    period_micros: u64,
    burst: u32,
    flags: u8,
    block_micros: u64,
    window: Option<[u64; 4]>,
}

fn script_limit(l: &LimitParams, unit: Unit, clock_nanos: u64) -> ScriptLimit {
    let micros = |n: u64| match unit {
        Unit::Nanos => n.div_ceil(1_000).max(1),
        Unit::Micros => n,
    };
    ScriptLimit {
        code: algorithm_code(l.algorithm),
        quota: l.quota,
        period_micros: micros(l.period_nanos).min(MAX_EXACT),
        burst: l.burst,
        flags: u8::from(l.borrow) + 2 * u8::from(l.charge == Charge::Always),
        block_micros: if l.block_nanos == 0 {
            0
        } else {
            micros(l.block_nanos).min(MAX_EXACT)
        },
        window: l
            .calendar
            .map(|c| c.around(clock_nanos).map(|b| (b / 1_000).min(MAX_EXACT))),
    }
}

fn push_limit(cmd: &mut Cmd, l: &ScriptLimit) {
    cmd.arg(l.code)
        .arg(l.quota)
        .arg(l.period_micros)
        .arg(l.burst)
        .arg(l.flags)
        .arg(l.block_micros);
    match l.window {
        Some([previous, start, end, next]) => cmd.arg(format!("{previous},{start},{end},{next}")),
        None => cmd.arg(""),
    };
}

/// A hit's 21 bytes in the binary ARGV (see `HIT_FORMAT` in `prelude.lua`); a hit naming its
/// hold has [`ROLE_HOLD`] in its role byte, and its id follows (written by [`encode`]).
fn encode_hit(hit: &Hit, slot: usize, limit: usize) -> [u8; HIT_BYTES] {
    let role = match hit.role {
        Role::Enforced => 0,
        Role::Shadow => 1,
        Role::Quota => 2,
        Role::QuotaShadow => 3,
    } + if hit.refund { 8 } else { 0 }
        + if hit.hold.is_some() { ROLE_HOLD } else { 0 };
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
pub(super) fn distinct<T: Copy + Eq + Hash>(
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
        Algorithm::Concurrency => "c",
    }
}

/// `prefix` then `key`.
pub fn prefixed(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + key.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(key);
    out
}
