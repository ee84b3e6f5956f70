//! Reading the live state of keys (admin `/counters`): what a backend is asked and answers.
//!
//! A backend lists the keys it holds that start with a prefix, one page at a time, and reads
//! each one's state as a check-only request (cost 0) would see it: what is left and when it
//! resets, without changing anything. Which limit a key belongs to comes from the caller
//! (the rules), through [`CounterQuery::resolve`]; a key it skips is not read at all.

use super::LimitParams;

/// What the caller knows of one key, asked before its state is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// Not wanted (filtered out): leave it out of the page.
    Skip,
    /// Wanted, but no active rule gives its limit (a client's override, or rules since
    /// reloaded): listed without its state.
    Unknown,
    /// Wanted, with these parameters: its state is read with them.
    Limit(LimitParams),
}

/// One page's request.
pub struct CounterQuery<'a> {
    /// Only keys that start with these bytes (a state key's beginning; the Redis prefix is
    /// the backend's business).
    pub prefix: &'a [u8],
    /// Where the previous page stopped (its [`CounterPage::next`]); `None`: from the start.
    pub cursor: Option<&'a str>,
    /// About this many keys per page (the memory backend: at most; Redis: what `SCAN` gives
    /// back for about this `COUNT`).
    pub count: usize,
    /// Tells what each key is; called outside any lock.
    pub resolve: &'a (dyn Fn(&[u8]) -> Resolved + Send + Sync),
}

/// One key and, when its limit is known, its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterEntry {
    /// The state key (without the Redis prefix).
    pub key: Vec<u8>,
    pub limit: Option<LimitParams>,
    pub state: Option<KeyState>,
}

/// A key's state as a check-only request sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyState {
    /// A request of cost 0 would pass (false: the key is in debt, `charge: always` or
    /// `borrow`).
    pub admitted: bool,
    /// What is left.
    pub remaining: u64,
    /// Nanoseconds until the full quota is back (when in debt or blocked: until a request is
    /// admitted).
    pub reset_nanos: u64,
    /// `concurrency`: nanoseconds until the oldest live hold expires (`None`: no hold, or
    /// another algorithm). The holds are the quota less what is left.
    pub oldest_hold_nanos: Option<u64>,
    /// Nanoseconds until the key's penalty box (`block_for`) ends, while it is blocked.
    pub blocked_nanos: Option<u64>,
    /// Redis with `redis.leases`: units of the key on lease on this replica now, beside its
    /// true state in Redis above (which counts them as spent); `None`: none.
    pub leased: Option<u64>,
    /// A global limit (`scope: global`): this region's share of it. The fields above are then
    /// the home Redis's state (which counts every share lent as spent).
    pub share: Option<ShareView>,
}

/// A region's share of a global limit, as its pool in the region's Redis holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShareView {
    /// Units the region may still spend (its valid shares), and what those shares held when
    /// taken.
    pub held: u64,
    pub granted: u64,
    /// Units the region spent from shares, and admitted under `global_on_error = "share"`
    /// while home was unreachable (totals while the pool lives).
    pub spent: u64,
    pub fallback: u64,
    /// Nanoseconds since home stopped answering the region (`None`: it answers).
    pub home_down_nanos: Option<u64>,
    /// What home had left after the region's last share.
    pub home_remaining: u64,
}

/// One page of keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterPage {
    pub entries: Vec<CounterEntry>,
    /// The cursor of the next page; `None` when this was the last. A page may hold fewer
    /// keys than asked (even none) and still have a next one.
    pub next: Option<String>,
}

/// What a backend says of its own health, for people (the admin page).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendStatus {
    /// Whether the remote store answered last time (`None`: nothing remote).
    pub reachable: Option<Result<(), String>>,
    /// Whether the circuit breaker is open (`None`: no breaker).
    pub breaker_open: Option<bool>,
    /// Entries of the local deny cache (`None`: no deny cache).
    pub deny_cache: Option<usize>,
    /// States held in this process.
    pub keys_held: Option<usize>,
}
