//! The sliding log's script against the memory backend on hand-made sequences that random
//! ones rarely reach: one request refunding part of the stored log then logging and being
//! denied on the same key, a full log merging into stored entries, a clock that goes back.
//! Each step must give identical outcomes from both, and the sorted set must hold the log.

use sluice::config::model::{Algorithm, Charge};
use sluice::limiter::{Batch, Hit, LimitParams, Limiter, ManualClock, MemoryLimiter, RedisLimiter};
use sluice::testing::limits;
use sluice::testing::redis::RedisServer;

const SEC: u64 = 1_000_000;
const KEY: &str = "{log}:sliding_log:60";

/// Q per minute, in microseconds (the unit of the script, and of the memory clock here).
fn log(quota: u32, charge: Charge) -> LimitParams {
    LimitParams {
        charge,
        ..limits::limit(Algorithm::SlidingLog, quota, 60 * SEC)
    }
}

/// A hit of `cost` (negative: a refund) in descriptor `group`.
fn hit(limit: LimitParams, cost: i64, group: usize) -> Hit {
    Hit {
        refund: cost < 0,
        group,
        ..limits::hit(KEY, limit, cost.unsigned_abs())
    }
}

/// Runs `steps` (time in seconds from a start, hits) through both backends; returns the
/// members of the sorted set after the last one.
async fn agree(steps: &[(u64, Vec<Hit>)]) -> Vec<String> {
    let redis = RedisServer::start();
    let script = RedisLimiter::new(&redis.settings(), 1).expect("valid settings");
    let start = 1_700_000_000 * SEC;
    let clock = ManualClock::at(start);
    let memory = MemoryLimiter::with_clock(16, clock.clone());
    for (i, (at, hits)) in steps.iter().enumerate() {
        clock.set(start + at * SEC);
        let batch = Batch { hits: hits.clone() };
        let expected = memory.check(&batch).await.expect("memory never fails");
        let got = script
            .check_micros(&batch, Some(start + at * SEC))
            .await
            .expect("the script answers");
        assert_eq!(got, expected, "step {i}: {batch:#?}");
    }
    redis.cmd(&["ZRANGE", &format!("sluice:{KEY}"), "0", "-1"])
}

#[tokio::test]
async fn a_refund_cutting_the_stored_log_then_a_denial_in_one_request() {
    let l = log(6, Charge::Admitted);
    let members = agree(&[
        (0, vec![hit(l, 1, 0)]),
        (1, vec![hit(l, 4, 0)]),
        // Gives 2 back (all of nothing added yet: from the entry of 1 s), logs 3, then denies
        // 4: the wait walks the stored entries, the cut one, and the added one.
        (2, vec![hit(l, -2, 0), hit(l, 3, 1), hit(l, 4, 2)]),
        (2, vec![hit(l, -2, 0), hit(l, 3, 1)]),
        (3, vec![hit(l, 0, 0)]),
    ])
    .await;
    let start = 1_700_000_000 * SEC;
    let at = |s: u64| format!("{}:", start + s * SEC);
    assert_eq!(members.len(), 4, "{members:?}");
    assert_eq!(members[0], "sum");
    assert!(members[1].starts_with(&at(0)) && members[2].starts_with(&at(1)));
    assert!(members[3].starts_with(&at(2)), "{members:?}");
}

#[tokio::test]
async fn a_full_log_merges_into_its_newest_entry_stored_or_added() {
    let l = log(2, Charge::Always);
    let members = agree(&[
        (0, vec![hit(l, 1, 0)]),
        (1, vec![hit(l, 1, 0)]),
        (2, vec![hit(l, 1, 0)]),
        (3, vec![hit(l, 1, 0), hit(l, 5, 1), hit(l, -2, 2)]),
        (4, vec![hit(l, -10, 0), hit(l, 1, 1)]),
        (70, vec![hit(l, 1, 0)]),
    ])
    .await;
    assert_eq!(
        members.len(),
        2,
        "one entry left after the others expired: {members:?}"
    );
}

#[tokio::test]
async fn a_clock_that_goes_back_never_reorders_the_log() {
    let l = log(5, Charge::Admitted);
    let members = agree(&[
        (10, vec![hit(l, 1, 0)]),
        (5, vec![hit(l, 1, 0)]),
        (7, vec![hit(l, -1, 0), hit(l, 2, 1)]),
        (69, vec![hit(l, 1, 0)]),
        (71, vec![hit(l, 1, 0)]),
    ])
    .await;
    assert_eq!(members.len(), 3, "the sum, 69 s and 71 s: {members:?}");
}
