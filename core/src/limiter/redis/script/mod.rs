//! The limiter script: encoding a batch into its KEYS and ARGV, calling it, and decoding its
//! reply. Generic over the connection, so any `ConnectionLike` works.
//!
//! The script is one Lua chunk made of the files of `../lua/`: `prelude.lua` (the KEYS/ARGV
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

mod decode;
mod encode;
mod invoke;
#[cfg(test)]
mod tests;

pub use decode::{Decided, LeaseReply, decode, decode_all};
pub(crate) use encode::LEASE_SUFFIX;
pub use encode::{Call, LeaseArgs, MAX_EXACT, Mode, Part, Unit, encode, encoded_size, prefixed};
pub use invoke::invoke;

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const ALGORITHMS: [&str; 6] = [
    include_str!("../lua/funnel.lua"),
    include_str!("../lua/token_bucket.lua"),
    include_str!("../lua/fixed_window.lua"),
    include_str!("../lua/sliding_window.lua"),
    include_str!("../lua/sliding_log.lua"),
    include_str!("../lua/concurrency.lua"),
];
const MAIN: &str = include_str!("../lua/main.lua");
const LIBRARY_TAIL: &str = include_str!("../lua/library.lua");

/// The prelude's line that marks, per call, the algorithms a request uses (see `MAKERS` in
/// `prelude.lua`); the library marks them all instead, and makes each once.
pub(super) const SCRIPT_MAKERS: &str =
    "for l = 1, tonumber(ARGV[2]) or 0 do MAKERS[ARGV[7 * l - 4]] = true end";
const LIBRARY_MAKERS: &str = "MAKERS.f, MAKERS.b, MAKERS.w, MAKERS.s, MAKERS.l, MAKERS.c = true, true, true, true, true, true";

/// The Lua source of the script form, with its KEYS/ARGV contract at the top.
pub(crate) static SOURCE: LazyLock<String> = LazyLock::new(|| {
    [PRELUDE]
        .into_iter()
        .chain(ALGORITHMS)
        .chain([MAIN])
        .collect()
});

/// The script's source with main.lua as the body of a local function
/// `decide_batch(KEYS, ARGV)` that returns its reply, then `tail`, a script that calls it
/// (reservations: `lua/reserve.lua`).
pub(super) fn wrapping(tail: &str) -> String {
    let head: String = [PRELUDE].into_iter().chain(ALGORITHMS).collect();
    format!("{head}local function decide_batch(KEYS, ARGV)\n{MAIN}\nend\n{tail}")
}

/// The prelude and the algorithms, then `tail`: a script of its own beside the batch script
/// (a region's pool of shares: `lua/share.lua`).
pub(super) fn with_algorithms(tail: &str) -> String {
    [PRELUDE]
        .into_iter()
        .chain(ALGORITHMS)
        .chain([tail])
        .collect()
}

static SHA: LazyLock<String> = LazyLock::new(|| redis::Script::new(&SOURCE).get_hash().to_owned());

/// The function library: its name (also its one function's name) and its source.
#[derive(Debug)]
pub(crate) struct Library {
    pub name: String,
    pub source: String,
}

/// The library form. Its name holds a hash of its code, so that two versions of sluice
/// sharing a Redis (a rolling upgrade) each call their own.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
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
