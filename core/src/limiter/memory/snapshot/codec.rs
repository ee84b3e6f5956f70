//! Each kind of state as bytes, and back: one pair of functions per algorithm, so that a
//! change to one algorithm's state changes one place here (and the format's version).
//!
//! Numbers are little-endian. Times are converted as they are written and read ([`Shift`]):
//! a time *of* an event (a funnel's `tat`, a bucket's anchor, a log's entries, a hold's or a
//! reservation's expiry, a penalty box's end) moves with the clock; a window's start does not
//! (it names an epoch-aligned window, and so does the time its state becomes fresh: the
//! window's end), so a day's count stays with its day.

use std::collections::VecDeque;

use crate::limiter::algorithm::State;
use crate::limiter::concurrency::{Holds, Record};
use crate::limiter::fixed_window::Window;
use crate::limiter::funnel::Tat;
use crate::limiter::reserve::{Record as Reservation, Records};
use crate::limiter::sliding_log::Log;
use crate::limiter::sliding_window::Counters;
use crate::limiter::token_bucket::Bucket;

/// What is added to a time to carry it from one clock to another (from the limiter's clock to
/// the wall clock when writing, and back when reading), saturating at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shift(pub(super) i128);

impl Shift {
    /// The shift from a clock reading `from` to one reading `to` at the same instant.
    pub(super) fn between(from: u64, to: u64) -> Shift {
        Shift(i128::from(to) - i128::from(from))
    }

    pub(super) fn apply(self, t: u64) -> u64 {
        let moved = i128::from(t).saturating_add(self.0);
        u64::try_from(moved.clamp(0, i128::from(u64::MAX))).unwrap_or(u64::MAX)
    }
}

/// A state's tag in the file.
pub(super) mod tag {
    pub(in super::super) const FUNNEL: u8 = 1;
    pub(in super::super) const TOKEN_BUCKET: u8 = 2;
    pub(in super::super) const FIXED_WINDOW: u8 = 3;
    pub(in super::super) const SLIDING_WINDOW: u8 = 4;
    pub(in super::super) const SLIDING_LOG: u8 = 5;
    pub(in super::super) const CONCURRENCY: u8 = 6;
    pub(in super::super) const BLOCKED: u8 = 7;
}

/// The tag of a stored state (`None` for [`State::Fresh`], never stored), and whether its
/// times are aligned to the epoch (kept as they are) rather than times of events (shifted).
pub(super) fn tag_of(state: &State) -> Option<(u8, bool)> {
    Some(match state {
        State::Fresh => return None,
        State::Funnel(_) => (tag::FUNNEL, false),
        State::TokenBucket(_) => (tag::TOKEN_BUCKET, false),
        State::FixedWindow(_) => (tag::FIXED_WINDOW, true),
        State::SlidingWindow(_) => (tag::SLIDING_WINDOW, true),
        State::SlidingLog(_) => (tag::SLIDING_LOG, false),
        State::Concurrency(_) => (tag::CONCURRENCY, false),
        State::Blocked(_) => (tag::BLOCKED, false),
    })
}

/// Whether the states of `tag` keep epoch-aligned times.
pub(super) fn aligned(tag: u8) -> bool {
    matches!(tag, tag::FIXED_WINDOW | tag::SLIDING_WINDOW)
}

/// Appends a state's fields (its tag is written by the caller).
pub(super) fn put_state(out: &mut Vec<u8>, state: &State, shift: Shift) {
    match state {
        State::Fresh => {}
        State::Funnel(tat) => put_tat(out, tat, shift),
        State::TokenBucket(b) => put_bucket(out, b, shift),
        State::FixedWindow(w) => put_window(out, w),
        State::SlidingWindow(c) => put_counters(out, c),
        State::SlidingLog(log) => put_log(out, log, shift),
        State::Concurrency(holds) => put_holds(out, holds, shift),
        State::Blocked(until) => put_u64(out, shift.apply(*until)),
    }
}

/// Reads the fields of a state of `tag`.
pub(super) fn get_state(r: &mut Reader<'_>, tag: u8, shift: Shift) -> Result<State, Bad> {
    Ok(match tag {
        tag::FUNNEL => State::Funnel(get_tat(r, shift)?),
        tag::TOKEN_BUCKET => State::TokenBucket(get_bucket(r, shift)?),
        tag::FIXED_WINDOW => State::FixedWindow(get_window(r)?),
        tag::SLIDING_WINDOW => State::SlidingWindow(get_counters(r)?),
        tag::SLIDING_LOG => State::SlidingLog(Box::new(get_log(r, shift)?)),
        tag::CONCURRENCY => State::Concurrency(Box::new(get_holds(r, shift)?)),
        tag::BLOCKED => State::Blocked(shift.apply(r.u64()?)),
        other => return Err(r.bad(format!("unknown state tag {other}"))),
    })
}

// funnel: `tat` (a time), the quota it was taken under, the refundable units.
fn put_tat(out: &mut Vec<u8>, t: &Tat, shift: Shift) {
    put_u64(out, shift.apply(t.tat));
    put_u64(out, u64::from(t.quota));
    put_u64(out, u64::from(t.refundable));
}

fn get_tat(r: &mut Reader<'_>, shift: Shift) -> Result<Tat, Bad> {
    let tat = shift.apply(r.u64()?);
    let quota = u32::try_from(r.u64()?).map_err(|_| r.bad("a funnel's quota above 2^32".into()))?;
    let refundable = u32::try_from(r.u64()?).unwrap_or(u32::MAX);
    Ok(Tat {
        tat,
        quota,
        refundable,
    })
}

// token_bucket: `used`, then `anchor` (a time), the refundable units.
fn put_bucket(out: &mut Vec<u8>, b: &Bucket, shift: Shift) {
    put_u64(out, b.used);
    put_u64(out, shift.apply(b.anchor));
    put_u64(out, b.refundable);
}

fn get_bucket(r: &mut Reader<'_>, shift: Shift) -> Result<Bucket, Bad> {
    Ok(Bucket {
        used: r.u64()?,
        anchor: shift.apply(r.u64()?),
        refundable: r.u64()?,
    })
}

// fixed_window: `start` (aligned), `count`, the refundable units.
fn put_window(out: &mut Vec<u8>, w: &Window) {
    put_u64(out, w.start);
    put_u64(out, w.count);
    put_u64(out, w.refundable);
}

fn get_window(r: &mut Reader<'_>) -> Result<Window, Bad> {
    Ok(Window {
        start: r.u64()?,
        count: r.u64()?,
        refundable: r.u64()?,
    })
}

// sliding_window: `start` (aligned), `current`, `previous`.
fn put_counters(out: &mut Vec<u8>, c: &Counters) {
    put_u64(out, c.start);
    put_u64(out, c.current);
    put_u64(out, c.previous);
    put_u64(out, c.refundable);
}

fn get_counters(r: &mut Reader<'_>) -> Result<Counters, Bad> {
    Ok(Counters {
        start: r.u64()?,
        current: r.u64()?,
        previous: r.u64()?,
        refundable: r.u64()?,
    })
}

// sliding_log: the number of entries, then each `(time, cost)`, oldest first.
fn put_log(out: &mut Vec<u8>, log: &Log, shift: Shift) {
    put_len(out, log.len());
    for (time, cost) in log.entries() {
        put_u64(out, shift.apply(time));
        put_u64(out, cost);
    }
}

fn get_log(r: &mut Reader<'_>, shift: Shift) -> Result<Log, Bad> {
    let n = r.len(16)?;
    let mut entries = VecDeque::with_capacity(n);
    for _ in 0..n {
        entries.push_back((shift.apply(r.u64()?), r.u64()?));
    }
    Log::from_entries(entries).ok_or_else(|| r.bad("a log's times do not increase".into()))
}

// concurrency: the next id, then the admitted holds and the pending denials, each as a
// count of records `(id, expiry (a time), count)` in expiry order.
fn put_holds(out: &mut Vec<u8>, holds: &Holds, shift: Shift) {
    put_u64(out, holds.next_id());
    let lists: [Vec<Record>; 2] = [holds.admitted().collect(), holds.denied().collect()];
    for records in lists {
        put_len(out, records.len());
        for rec in records {
            put_u64(out, rec.id);
            put_u64(out, shift.apply(rec.expiry));
            put_u64(out, rec.count);
        }
    }
}

fn get_holds(r: &mut Reader<'_>, shift: Shift) -> Result<Holds, Bad> {
    let next_id = r.u64()?;
    let mut lists = [VecDeque::new(), VecDeque::new()];
    for list in &mut lists {
        let n = r.len(24)?;
        list.reserve(n);
        for _ in 0..n {
            list.push_back(Record {
                id: r.u64()?,
                expiry: shift.apply(r.u64()?),
                count: r.u64()?,
            });
        }
    }
    let [admitted, denied] = lists;
    Holds::from_records(admitted, denied, next_id)
        .ok_or_else(|| r.bad("holds out of expiry order".into()))
}

// A key's open reservations: whether their marks are aligned to the epoch (1: a window's
// start, kept as it is; 0: a time, shifted), the next id, then each `(id, amount, expiry (a
// time), mark)`.
pub(super) fn put_records(out: &mut Vec<u8>, records: &Records, shift: Shift, aligned: bool) {
    out.push(u8::from(aligned));
    put_u64(out, records.next_id);
    put_len(out, records.open.len());
    let marks = if aligned { Shift(0) } else { shift };
    for rec in &records.open {
        put_u64(out, rec.id);
        put_u64(out, rec.amount);
        put_u64(out, shift.apply(rec.expiry));
        put_u64(out, marks.apply(rec.mark));
    }
}

pub(super) fn get_records(r: &mut Reader<'_>, shift: Shift) -> Result<Records, Bad> {
    let marks = match r.u8()? {
        0 => shift,
        1 => Shift(0),
        other => return Err(r.bad(format!("reservations' mark kind {other}"))),
    };
    let next_id = r.u64()?;
    let n = r.len(32)?;
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        open.push(Reservation {
            id: r.u64()?,
            amount: r.u64()?,
            expiry: shift.apply(r.u64()?),
            mark: marks.apply(r.u64()?),
        });
    }
    Ok(Records { next_id, open })
}

pub(super) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A length or count, as a u32 (keys and lists are far below 4 Gi).
pub(super) fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

/// Why bytes do not decode: what, at which byte of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Bad {
    pub(super) at: usize,
    pub(super) what: String,
}

/// Reads a snapshot's bytes in order, never past their end.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `bytes`, whose first byte is byte `at` of the file.
    pub(super) fn new(bytes: &'a [u8], at: usize) -> Reader<'a> {
        Reader { bytes, at }
    }

    pub(super) fn bad(&self, what: String) -> Bad {
        Bad { at: self.at, what }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if n > self.bytes.len() {
            return Err(self.bad(format!("{n} bytes wanted, {} left", self.bytes.len())));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        self.at += n;
        Ok(head)
    }

    pub(super) fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.take(1)?.first().copied().unwrap_or_default())
    }

    pub(super) fn u16(&mut self) -> Result<u16, Bad> {
        let mut b = [0; 2];
        b.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(b))
    }

    pub(super) fn u32(&mut self) -> Result<u32, Bad> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    pub(super) fn u64(&mut self) -> Result<u64, Bad> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    /// A count of items of at least `item` bytes each: refused when the bytes left cannot
    /// hold that many (so a bad count never makes a large allocation).
    pub(super) fn len(&mut self, item: usize) -> Result<usize, Bad> {
        let n = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
        if n.saturating_mul(item) > self.bytes.len() {
            return Err(self.bad(format!("a count of {n} is more than the bytes left hold")));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_saturate_at_both_ends() {
        assert_eq!(Shift(5).apply(10), 15);
        assert_eq!(Shift(-20).apply(10), 0);
        assert_eq!(Shift(1).apply(u64::MAX), u64::MAX);
        assert_eq!(Shift::between(100, 250).apply(120), 270);
    }

    #[test]
    fn every_kind_of_state_reads_back_as_written() {
        let mut holds = Holds::default();
        let c = crate::limiter::concurrency::Concurrency::new(5, 100);
        c.take(&mut holds, 10, 2);
        c.deny(&mut holds, 20, 1);
        let mut log = Log::default();
        let l = crate::limiter::sliding_log::SlidingLog::new(10, 100);
        l.consume(&mut log, 10, 1);
        l.consume(&mut log, 30, 2);
        let states = [
            State::Funnel(Tat {
                tat: 500,
                quota: 10,
                refundable: 3,
            }),
            State::TokenBucket(Bucket {
                used: 3,
                anchor: 40,
                refundable: 2,
            }),
            State::FixedWindow(Window {
                start: 0,
                count: 4,
                refundable: 1,
            }),
            State::SlidingWindow(Counters {
                start: 0,
                current: 2,
                previous: 7,
                refundable: 2,
            }),
            State::SlidingLog(Box::new(log)),
            State::Concurrency(Box::new(holds)),
            State::Blocked(90),
        ];
        for state in states {
            let (tag, _) = tag_of(&state).expect("a stored state");
            let mut out = Vec::new();
            put_state(&mut out, &state, Shift(0));
            let mut r = Reader::new(&out, 0);
            assert_eq!(get_state(&mut r, tag, Shift(0)), Ok(state));
            assert!(r.is_empty());
        }
    }

    #[test]
    fn a_count_larger_than_the_bytes_left_is_refused_before_allocating() {
        let mut out = Vec::new();
        put_len(&mut out, 1_000_000);
        let mut r = Reader::new(&out, 40);
        assert!(get_log(&mut r, Shift(0)).is_err_and(|b| b.at == 44));
    }
}
