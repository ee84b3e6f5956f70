//! Snapshots on a manual clock: every algorithm's state (holds, reservations and penalty boxes
//! included) comes back as it was and decides on as it would have; fresh states are not
//! written; times keep their meaning across clocks; a bad file installs nothing.

use std::sync::Arc;

use futures_util::FutureExt;

use super::*;
use crate::config::model::{Algorithm, Charge};
use crate::limiter::holds::{HoldOp, HoldRequest};
use crate::limiter::reserve::{ReserveOp, ReserveRequest, records_key};
use crate::limiter::{Batch, Hit, LimitParams, Limiter, ManualClock, Role};

const SEC: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * SEC;
/// 2026-11-28 12:00 UTC.
const NOON: u64 = 1_795_867_200 * SEC;

fn limit(algorithm: Algorithm, quota: u32, period: u64) -> LimitParams {
    LimitParams {
        algorithm,
        quota,
        period_nanos: period,
        burst: quota,
        charge: Charge::Admitted,
        borrow: false,
        block_nanos: 0,
        global: false,
        calendar: None,
    }
}

fn batch(key: &str, limit: LimitParams, cost: u64) -> Batch {
    let hit = Hit {
        key: key.as_bytes().into(),
        limit,
        cost,
        refund: false,
        group: 0,
        role: Role::Enforced,
        hold: None,
    };
    Batch { hits: vec![hit] }
}

/// Admitted, and what is left, for one hit.
fn check(l: &MemoryLimiter<ManualClock>, b: &Batch) -> (bool, u64) {
    let o = l
        .check(b)
        .now_or_never()
        .and_then(Result::ok)
        .expect("decided");
    (o.admitted, o.hits[0].remaining)
}

/// One key per algorithm, a penalty box, a named hold and an open reservation.
fn busy(l: &MemoryLimiter<ManualClock>) -> Vec<Batch> {
    let mut batches: Vec<Batch> = Algorithm::ALL
        .iter()
        .map(|&a| batch(a.as_str(), limit(a, 10, 60 * SEC), 3))
        .collect();
    let boxed = LimitParams {
        block_nanos: 30 * SEC,
        global: false,
        ..limit(Algorithm::Funnel, 1, 60 * SEC)
    };
    batches.push(batch("boxed", boxed, 1));
    for b in &batches {
        check(l, b);
    }
    check(l, &batch("boxed", boxed, 1));
    let hold = HoldRequest {
        key: Arc::from(&b"held"[..]),
        slots: 4,
        lease_nanos: 60 * SEC,
        op: HoldOp::Acquire { count: 2 },
    };
    assert!(l.hold_op(&hold).done);
    let reserve = ReserveRequest {
        records: records_key(b"reserved"),
        ttl_nanos: 60 * SEC,
        op: ReserveOp::Reserve {
            batch: batch("reserved", limit(Algorithm::Funnel, 10, 60 * SEC), 4),
            amount: 4,
        },
    };
    assert!(l.reserve_op(&reserve).is_ok_and(|o| o.done));
    batches
}

/// Each key's open reservations, as `(key, records, next id)`.
type Open = (Vec<u8>, Vec<crate::limiter::reserve::Record>, u64);

fn reservations(l: &MemoryLimiter<ManualClock>) -> Vec<Open> {
    let mut all = Vec::new();
    l.reservations
        .each(&mut |k, r| all.push((k.to_vec(), r.open.clone(), r.next_id)));
    all
}

#[test]
fn every_state_comes_back_and_decides_on_as_before() {
    let clock = ManualClock::at(NOON);
    let before = MemoryLimiter::with_clock(1_000, clock.clone());
    let batches = busy(&before);
    let bytes = before.encode_snapshot(NOON);
    let after = MemoryLimiter::with_clock(1_000, clock.clone());
    let restored = after.restore_snapshot(&bytes, NOON).expect("restored");
    assert_eq!(restored.states, before.len());
    assert_eq!((restored.reservations, restored.expired), (1, 0));
    assert_eq!(restored.written_at, NOON);
    assert_eq!(after.snapshot(), before.snapshot());
    assert_eq!(reservations(&after), reservations(&before));
    clock.advance(SEC);
    for b in &batches {
        assert_eq!(check(&after, b), check(&before, b));
    }
    assert_eq!(after.snapshot(), before.snapshot());
}

#[test]
fn fresh_states_are_not_written_nor_installed() {
    let clock = ManualClock::at(NOON);
    let l = MemoryLimiter::with_clock(100, clock.clone());
    check(&l, &batch("short", limit(Algorithm::Funnel, 10, SEC), 1));
    check(
        &l,
        &batch("long", limit(Algorithm::Funnel, 10, 600 * SEC), 1),
    );
    clock.advance(SEC);
    // "short" has drained: still held (no sweep yet), but not written.
    assert_eq!(l.len(), 2);
    let bytes = l.encode_snapshot(clock.now_nanos());
    let empty = MemoryLimiter::with_clock(100, clock.clone());
    let restored = empty.restore_snapshot(&bytes, clock.now_nanos());
    assert_eq!(restored.map(|r| (r.states, r.expired)), Ok((1, 0)));
    // Read a minute later (sluice down meanwhile): what drained meanwhile is skipped.
    clock.advance(600 * SEC);
    let later = MemoryLimiter::with_clock(100, clock.clone());
    let restored = later.restore_snapshot(&bytes, clock.now_nanos());
    assert_eq!(restored.map(|r| (r.states, r.expired)), Ok((0, 1)));
    assert!(later.is_empty());
}

#[test]
fn a_days_window_keeps_its_day_and_a_funnel_drains_through_the_downtime() {
    let day = limit(Algorithm::FixedWindow, 10, DAY);
    let funnel = limit(Algorithm::Funnel, 10, 100 * SEC);
    // The writer's clock runs 7 s behind the wall clock (started before a clock step).
    let written = ManualClock::at(NOON - 7 * SEC);
    let before = MemoryLimiter::with_clock(100, written.clone());
    for _ in 0..4 {
        check(&before, &batch("day", day, 1));
        check(&before, &batch("funnel", funnel, 1));
    }
    let bytes = before.encode_snapshot(NOON);
    // Read 20 s later (wall) by a process whose clock runs 3 s ahead of the wall clock.
    let read_at_wall = NOON + 20 * SEC;
    let clock = ManualClock::at(read_at_wall + 3 * SEC);
    let after = MemoryLimiter::with_clock(100, clock.clone());
    assert!(after.restore_snapshot(&bytes, read_at_wall).is_ok());
    // The day's count is the day's: 4 taken, 6 left, in the window that started at midnight.
    assert_eq!(check(&after, &batch("day", day, 0)), (true, 6));
    let start = |l: &MemoryLimiter<ManualClock>| {
        l.snapshot().into_iter().find_map(|(k, s)| match s {
            State::FixedWindow(w) if k == b"day" => Some(w.start),
            _ => None,
        })
    };
    assert_eq!(start(&after), Some(NOON - NOON % DAY));
    assert_eq!(start(&after), start(&before));
    // The funnel's 4 units drain at 1 per 10 s: 20 s of wall time later, 2 are left, as
    // on the writer's own clock 20 s on.
    assert_eq!(check(&after, &batch("funnel", funnel, 0)), (true, 8));
    written.advance(20 * SEC);
    assert_eq!(check(&before, &batch("funnel", funnel, 0)), (true, 8));
    let tat = |l: &MemoryLimiter<ManualClock>, at: u64| {
        l.snapshot().into_iter().find_map(|(k, s)| match s {
            State::Funnel(tat) if k == b"funnel" => Some(tat.tat - at),
            _ => None,
        })
    };
    assert_eq!(
        tat(&after, clock.now_nanos()),
        tat(&before, written.now_nanos())
    );
}

#[test]
fn a_window_read_in_the_next_day_starts_again() {
    let day = limit(Algorithm::FixedWindow, 10, DAY);
    let clock = ManualClock::at(NOON);
    let before = MemoryLimiter::with_clock(100, clock.clone());
    check(&before, &batch("day", day, 5));
    let bytes = before.encode_snapshot(NOON);
    clock.set(NOON + DAY / 2 + SEC);
    let after = MemoryLimiter::with_clock(100, clock.clone());
    let restored = after.restore_snapshot(&bytes, clock.now_nanos());
    assert_eq!(restored.map(|r| r.expired), Ok(1));
    assert_eq!(check(&after, &batch("day", day, 0)), (true, 10));
}

/// A snapshot of one funnel state and a reservation, from a limiter on `NOON`.
fn sample() -> Vec<u8> {
    let l = MemoryLimiter::with_clock(100, ManualClock::at(NOON));
    busy(&l);
    l.encode_snapshot(NOON)
}

fn refused(bytes: &[u8]) -> SnapshotError {
    let l = MemoryLimiter::with_clock(100, ManualClock::at(NOON));
    let error = l.restore_snapshot(bytes, NOON).expect_err("refused");
    assert!(l.is_empty(), "nothing installed for {error}");
    assert!(reservations(&l).is_empty());
    error
}

/// `bytes` with a correct checksum again.
fn resigned(mut bytes: Vec<u8>) -> Vec<u8> {
    let end = bytes.len() - TRAILER;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn a_corrupt_or_truncated_snapshot_installs_nothing() {
    let good = sample();
    let mut flipped = good.clone();
    flipped[HEADER + 9] ^= 0x40;
    assert!(matches!(refused(&flipped), SnapshotError::Checksum { .. }));
    let cut = &good[..good.len() - 10];
    assert_eq!(
        refused(cut),
        SnapshotError::Truncated {
            len: good.len() - 10,
            expected: good.len()
        }
    );
    assert!(matches!(
        refused(&good[..20]),
        SnapshotError::Truncated { .. }
    ));
    assert_eq!(refused(b""), SnapshotError::NotASnapshot);
    assert_eq!(refused(b"{\"counters\": []}"), SnapshotError::NotASnapshot);
    let mut longer = good.clone();
    longer.push(0);
    assert_eq!(refused(&longer), SnapshotError::TooLong { extra: 1 });
    let mut newer = good.clone();
    newer[8] = 3;
    assert_eq!(refused(&resigned(newer)), SnapshotError::Version(3));
    // A file of the first version (before states kept their quota and refundable units).
    let mut older = good.clone();
    older[8] = 1;
    assert_eq!(refused(&resigned(older)), SnapshotError::Version(1));
}

#[test]
fn a_bad_entry_after_good_ones_installs_nothing() {
    let good = sample();
    // The last state's tag is somewhere in the body; make the header count one state more
    // than there are, so the reservation's bytes are read as a state: never half-loaded.
    let mut more = good.clone();
    let states = u64::from_le_bytes(more[20..28].try_into().unwrap_or_default());
    more[20..28].copy_from_slice(&(states + 1).to_le_bytes());
    assert!(matches!(
        refused(&resigned(more)),
        SnapshotError::Malformed { .. }
    ));
    // A tag no version writes, as the first state's.
    let mut unknown = good;
    unknown[HEADER] = 99;
    let error = refused(&resigned(unknown));
    assert_eq!(
        error,
        SnapshotError::Malformed {
            at: HEADER + 1,
            what: "unknown state tag 99".into()
        }
    );
}

#[test]
fn an_empty_limiter_writes_a_snapshot_that_restores_nothing() {
    let l = MemoryLimiter::with_clock(100, ManualClock::at(NOON));
    let bytes = l.encode_snapshot(NOON);
    assert_eq!(bytes.len(), HEADER + TRAILER);
    let restored = l.restore_snapshot(&bytes, NOON);
    assert_eq!(restored.map(|r| r.states + r.reservations), Ok(0));
}
