//! Leases: the grant and return rules, and their sizing, as pure functions (no I/O).
//!
//! A replica that sees a key busy takes a lease of `L` units of it from the shared state in one
//! call, spends the units locally (no shared call per decision) and returns what it did not
//! spend. The shared state counts the leased units as spent at the lease's last moment
//! (`expires - 1`: units may be spent at any time before `expires`), the latest moment they may
//! be spent, so no interval sees more admitted than the algorithm's bound.
//!
//! The rules, through the algorithm's own functions ([`Algo`]), so that the memory algorithms
//! and the Lua mirror (the lease requests of `redis/lua/main.lua`) share them whatever their state formats:
//!
//! - **Expiry.** `expires = min(now + validity, horizon)`, the horizon being where the
//!   algorithm's count starts over: a fixed or sliding window's end (calendar windows
//!   included), a token bucket's next refill step (a full bucket's: one period after `now`,
//!   where a take at `now` would put it); none for the funnel.
//! - **Grant.** At most a quarter of what remains (at least 1). The most `L <= want` such
//!   that the state admits `L` at `last = expires - 1` and, once `L` is taken at `last`, the
//!   state still admits nothing more than its bound at `now` (`admits(taken, now, 0)`). For
//!   the funnel (GCRA) this is the rule `S = max(tat, last)`, admit if `S + L*T - now <= tau`,
//!   then `tat = S + L*T`: every leased unit has a slot no earlier than its spend time. For the
//!   windows the units are counted in the very window they are spent in. A token bucket's are
//!   taken at `now` instead, in the refill step that holds the whole lease: only the step
//!   matters (refills come at its end), and a full bucket's step then starts at the grant, as a
//!   take's would, where taking at `last` would delay every later refill by the lease's length.
//! - **Return.** Unspent units go back by the algorithm's give-back at `now`: a window's units
//!   to the window they were counted in while it lasts (even after the lease expired: they
//!   were never spent), a bucket's to the step. A funnel's go back only while nothing was scheduled after
//!   the lease (its state is as the grant left it): its slots are then the last ones and all
//!   still ahead of now (`tat -= T*u`, which the rule `tat -= T*min(u, (S + L*T - now)/T)`
//!   reduces to); otherwise moving `tat` back would move later units' slots. Units not
//!   returned are lost: under-admission, never over-admission.
//!
//! Sliding logs and concurrency limits are never leased (docs/algorithms.md says why), nor a
//! limit with `charge: always`, `borrow` or `block_for`: their decisions need the shared state.
//!
//! ```
//! use sluice_core::limiter::algorithm::{Algo, State};
//! use sluice_core::limiter::funnel::Funnel;
//! use sluice_core::limiter::lease;
//! const MS: u64 = 1_000_000;
//! // 1,000 a second, burst 100: a lease of at most 10, valid 50 ms, taken fresh at t = 1 s.
//! let algo = Algo::Funnel(Funnel::new(1_000, 1_000 * MS, 100, false));
//! let (lease, state) = lease::grant(&algo, &State::Fresh, 1_000 * MS, 10, 50 * MS).unwrap();
//! assert_eq!((lease.units, lease.expires), (10, 1_050 * MS));
//! // Returning 4 of the 10 before the expiry gives back their 4 slots.
//! let (back, _) = lease::give_back(&algo, &state, &state, 1_020 * MS, &lease, 4);
//! assert_eq!(back, 4);
//! ```

use super::LimitParams;
use super::algorithm::{Algo, State};
use crate::config::model::{Algorithm, Charge};

/// A lease as granted: `units` that may be spent at any time before `expires` (the shared
/// state counts them as spent at `expires - 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub units: u64,
    /// Exclusive: the units may be spent while `now < expires`.
    pub expires: u64,
    /// Exclusive: unspent units may be given back while `now < returnable`: the expiry for a
    /// funnel; the end of the window or refill step the units were counted in for the others
    /// (units never spent may go back to their window even after the lease expired).
    pub returnable: u64,
    /// The grant's mark ([`Algo::name_take`] where the units were counted): what its return by
    /// name needs.
    pub mark: u64,
}

/// Whether a limit may be leased at all: funnel, token bucket, fixed and sliding windows,
/// with a quota, counted only when admitted, without borrowing or a penalty box.
pub fn leasable(limit: &LimitParams) -> bool {
    matches!(
        limit.algorithm,
        Algorithm::Funnel
            | Algorithm::TokenBucket
            | Algorithm::FixedWindow
            | Algorithm::SlidingWindow
    ) && limit.quota > 0
        && limit.charge != Charge::Always
        && !limit.borrow
        && limit.block_nanos == 0
}

/// The latest expiry the algorithm allows a lease taken at `now` on `state`: where its count
/// starts over (a window's end, the bucket's next refill step); `u64::MAX` for the funnel;
/// `None` for an algorithm that is never leased.
pub fn horizon(algo: &Algo, state: &State, now: u64) -> Option<u64> {
    match algo {
        Algo::Funnel(_) => Some(u64::MAX),
        Algo::FixedWindow(w) => Some(w.window_end(now)),
        Algo::SlidingWindow(w) => Some(w.window_end(now)),
        Algo::TokenBucket(b) => Some(b.next_refill(bucket(state), now)),
        Algo::SlidingLog(_) | Algo::Concurrency(_) => None,
    }
}

fn bucket(state: &State) -> super::token_bucket::Bucket {
    match state {
        State::TokenBucket(b) => *b,
        _ => super::token_bucket::FULL,
    }
}

/// When a lease's units are counted: at its last moment, but a token bucket's at the grant
/// (the same refill step, see the module's rules).
fn counted_at(algo: &Algo, now: u64, last: u64) -> u64 {
    match algo {
        Algo::TokenBucket(_) => now,
        _ => last,
    }
}

/// Takes `units` as spent at `last` (see [`counted_at`]) and checks that the result is within
/// the bound both then and at `now`; the state taken when it is.
fn try_take(algo: &Algo, state: &State, now: u64, last: u64, units: u64) -> Option<(State, u64)> {
    let at = counted_at(algo, now, last);
    if !algo.admits(state, at, units) {
        return None;
    }
    let mut taken = state.clone();
    algo.take(&mut taken, at, units);
    // A named take: no anonymous refund gives leased units back.
    let mark = algo.name_take(&mut taken, at);
    algo.admits(&taken, now, 0).then_some((taken, mark))
}

/// The lease of at most `want` units taken at `now` for at most `validity`, and the state
/// with its units counted; `None` when not even one unit can be leased (the caller then asks
/// the shared state directly, which answers exactly).
pub fn grant(
    algo: &Algo,
    state: &State,
    now: u64,
    want: u64,
    validity: u64,
) -> Option<(Lease, State)> {
    grant_between(algo, state, now, (1, want), validity)
}

/// [`grant`] of a whole number of `least` units (what the request that asks for the lease
/// costs: a smaller lease would not pay for it, and requests like it spend a multiple to the
/// last unit, where a remainder would be taken for nothing), at most `want`; `None` when not
/// even `least` can be leased.
pub fn grant_between(
    algo: &Algo,
    state: &State,
    now: u64,
    (least, want): (u64, u64),
    validity: u64,
) -> Option<(Lease, State)> {
    let horizon = horizon(algo, state, now)?;
    let expires = now.saturating_add(validity).min(horizon);
    // At most a quarter of what remains (at least 1), so that one replica does not take the
    // others' share of what is left.
    let want = want.min((algo.remaining(state, now) / 4).max(1));
    let least = least.max(1);
    if expires <= now || want < least {
        return None;
    }
    let last = expires - 1;
    let (mut taken, mut mark) = try_take(algo, state, now, last, least)?;
    // The admitted amount is monotone in L: search the largest multiple of `least` up to
    // `want` (in multiples).
    let (mut low, mut high) = (1, want / least);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        match try_take(algo, state, now, last, mid * least) {
            Some((t, m)) => {
                low = mid;
                taken = t;
                mark = m;
            }
            None => high = mid - 1,
        }
    }
    // Where the units were counted lasts until the horizon as the take left it (a full
    // bucket's step starts at the lease's last moment).
    let returnable = match algo {
        Algo::Funnel(_) => expires,
        _ => self::horizon(algo, &taken, last).unwrap_or(expires),
    };
    Some((
        Lease {
            units: low * least,
            expires,
            returnable,
            mark,
        },
        taken,
    ))
}

/// Gives back `unused` units of `lease` at `now`: all of them while they may still be given back
/// (`lease.returnable`: a funnel's while the lease is valid, a window's or a bucket's while its
/// window or step lasts), none after (they count as spent).
/// A funnel gives back only while its state is still `granted`, as the grant left it: the
/// lease's slots are then the last ones, and giving them back is as if the lease had been
/// smaller. (Once other units were scheduled after them, moving `tat` back would move those
/// units' slots before the moments they may be spent.) The units given back and the state
/// after.
pub fn give_back(
    algo: &Algo,
    state: &State,
    granted: &State,
    now: u64,
    lease: &Lease,
    unused: u64,
) -> (u64, State) {
    let back = unused.min(lease.units);
    let tail = !matches!(algo, Algo::Funnel(_)) || state == granted;
    if now >= lease.returnable || back == 0 || !tail {
        return (0, state.clone());
    }
    let mut after = state.clone();
    algo.give_back_named(&mut after, now, back, lease.mark);
    (back, after)
}

/// How leases are sized (`redis.lease_*` settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// A lease covers about this much of the key's traffic on this replica.
    pub horizon_nanos: u64,
    /// A lease is valid at most this long (what a dead replica can hold back).
    pub validity_nanos: u64,
    /// A lease is at most this share of the limit's burst (percent).
    pub burst_percent: u64,
    /// A key is busy (leased) from this many units a second on this replica.
    pub min_rate: u64,
}

impl Default for Sizing {
    fn default() -> Self {
        Sizing {
            horizon_nanos: 20_000_000,
            validity_nanos: 100_000_000,
            burst_percent: 10,
            min_rate: 200,
        }
    }
}

/// The capacity a limit holds at most: its burst (funnel, bucket), or its quota (windows).
pub fn capacity(limit: &LimitParams) -> u64 {
    match limit.algorithm {
        Algorithm::Funnel | Algorithm::TokenBucket => u64::from(limit.burst),
        _ => u64::from(limit.quota),
    }
}

/// The most units a lease on `limit` may hold: `burst_percent` of its capacity, and what the
/// funnel's validity costs bounded too (a funnel lease jumps to its expiry: keep `rate *
/// validity` within that share of the burst, see docs/redis.md).
pub fn cap(limit: &LimitParams, sizing: &Sizing) -> u64 {
    capacity(limit).saturating_mul(sizing.burst_percent) / 100
}

/// The validity a lease on `limit` gets: at most `sizing.validity_nanos`, and for a funnel
/// short enough that the jump to the expiry wastes at most `burst_percent` of the burst
/// (`rate * validity <= burst * burst_percent / 100`).
pub fn validity(limit: &LimitParams, sizing: &Sizing) -> u64 {
    if limit.algorithm != Algorithm::Funnel || limit.quota == 0 {
        return sizing.validity_nanos;
    }
    let interval = limit.period_nanos.div_ceil(u64::from(limit.quota)).max(1);
    let room = interval.saturating_mul(cap(limit, sizing));
    sizing.validity_nanos.min(room)
}

/// One key's demand on this replica, observed, and the size of its next lease: about
/// `horizon` of its traffic, doubled when a lease ran out early, halved when more than half of
/// one came back, within [`cap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Start of the current observation window, and the units seen in it.
    since: u64,
    seen: u64,
    /// Units a second, as of the last full window.
    rate: u64,
    /// The size multiplier in quarters (4 = 1x), in [1, 32].
    quarters: u64,
}

/// The observation window of [`Demand`].
const OBSERVE_NANOS: u64 = 50_000_000;

impl Demand {
    pub fn new(now: u64) -> Demand {
        Demand {
            since: now,
            seen: 0,
            rate: 0,
            quarters: 4,
        }
    }

    /// Counts `units` asked for at `now`.
    pub fn observe(&mut self, now: u64, units: u64) {
        let elapsed = now.saturating_sub(self.since);
        if elapsed >= OBSERVE_NANOS {
            let per_second = u128::from(self.seen) * 1_000_000_000 / u128::from(elapsed);
            self.rate = u64::try_from(per_second).unwrap_or(u64::MAX);
            self.since = now;
            self.seen = 0;
        }
        self.seen = self.seen.saturating_add(units);
    }

    /// Units a second seen lately (the last full window, or the current one if higher).
    pub fn rate(&self, now: u64) -> u64 {
        let elapsed = now.saturating_sub(self.since).max(1);
        let current = u128::from(self.seen) * 1_000_000_000 / u128::from(elapsed);
        let current = if elapsed >= OBSERVE_NANOS / 5 {
            u64::try_from(current).unwrap_or(u64::MAX)
        } else {
            0
        };
        self.rate.max(current)
    }

    /// Whether the key is busy enough here to lease.
    /// The window under way counts only once it holds a whole window's worth at `min_rate`: a
    /// few hits close together on a quiet key (as among many keys, 10 to a request) do not make
    /// it busy, where each lease taken would cost a call of its own.
    pub fn busy(&self, now: u64, sizing: &Sizing) -> bool {
        let worth = u128::from(sizing.min_rate) * u128::from(OBSERVE_NANOS);
        let filled = u128::from(self.seen) * 1_000_000_000 >= worth;
        self.rate >= sizing.min_rate || (filled && self.rate(now) >= sizing.min_rate)
    }

    /// The size of the next lease on `limit`: 0 when a lease is not worth it (under 2 units).
    /// Never more than this replica spends in the lease's validity (the rest would expire
    /// unspent).
    pub fn want(&self, now: u64, limit: &LimitParams, sizing: &Sizing) -> u64 {
        let rate = u128::from(self.rate(now));
        let base = rate * u128::from(sizing.horizon_nanos) / 1_000_000_000;
        let scaled = base * u128::from(self.quarters) / 4;
        let spendable = rate * u128::from(validity(limit, sizing)) / 1_000_000_000;
        let want = u64::try_from(scaled.min(spendable))
            .unwrap_or(u64::MAX)
            .min(cap(limit, sizing));
        if want < 2 { 0 } else { want }
    }

    /// A lease ended: `unused` of its `units` came back (or were lost), `early` when it ran out
    /// before its expiry.
    pub fn ended(&mut self, units: u64, unused: u64, early: bool) {
        if early {
            self.quarters = (self.quarters * 2).min(32);
        } else if units > 1 && unused.saturating_mul(2) >= units {
            self.quarters = (self.quarters / 2).max(1);
        }
    }
}

/// A first look at keys' demand, without a lock: a fixed table of cells, each key hashed to
/// one, each cell counting the units of the current observation window ([`Demand`]'s, aligned
/// on the clock) and of the one before. Keys that share a cell add up, so a cell never counts
/// less than any of its keys: a key whose cell holds less than `min_rate`'s worth of one window
/// over those two is not busy, and a request with such a key need not look at the lease table
/// (where each look takes its lock). Where no key is busy, requests pass here and go on to
/// Redis; only keys at about `min_rate` or more reach the table.
#[derive(Debug)]
pub struct Heat {
    /// Per cell: the window (32 bits), the previous window's units (16, saturating) and the
    /// current one's (16, saturating).
    cells: Box<[std::sync::atomic::AtomicU64]>,
}

/// The cells of a [`Heat`]: 128 KiB.
const HEAT_CELLS: usize = 1 << 14;

impl Default for Heat {
    fn default() -> Heat {
        Heat {
            cells: (0..HEAT_CELLS)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        }
    }
}

impl Heat {
    /// Counts `units` of the key hashed to `hash` at `now`; whether its cell holds, over this
    /// window and the one before, a window's worth at `sizing.min_rate` (the key may be busy).
    pub fn warm(&self, hash: u64, now: u64, units: u64, sizing: &Sizing) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let cell = &self.cells[(hash as usize) % HEAT_CELLS];
        let window = (now / OBSERVE_NANOS) as u32;
        let add = units.min(0xFFFF);
        let mut old = cell.load(Relaxed);
        let (prev, cur) = loop {
            let (w, prev, cur) = ((old >> 32) as u32, (old >> 16) & 0xFFFF, old & 0xFFFF);
            let (prev, cur) = match window.wrapping_sub(w) {
                0 => (prev, (cur + add).min(0xFFFF)),
                1 => (cur, add),
                _ => (0, add),
            };
            let new = (u64::from(window) << 32) | (prev << 16) | cur;
            match cell.compare_exchange_weak(old, new, Relaxed, Relaxed) {
                Ok(_) => break (prev, cur),
                Err(now_there) => old = now_there,
            }
        };
        let worth = u128::from(sizing.min_rate) * u128::from(OBSERVE_NANOS) / 1_000_000_000;
        u128::from(prev + cur) >= worth.max(1)
    }
}

#[cfg(test)]
mod tests;
