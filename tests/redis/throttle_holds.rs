//! Holds with ids (the Throttle API's AcquireHold, ReleaseHold, ExtendHold) on both backends
//! (docs/holds.md): the same operations go to the memory backend and to two replicas sharing
//! one real `redis-server`, on one manual clock; every operation must give the identical
//! outcome (ids, holds, waits) everywhere, cost exactly one script call on Redis (once the script is cached), and keep the
//! key one sorted set of records scored by expiry.

use std::sync::Arc;

use sluice::limiter::Limiter;
use sluice::limiter::holds::{HoldOp, HoldOutcome, HoldRequest};

use crate::support::limiters::Backends;

const SEC: u64 = 1_000_000_000;
const KEY: &str = "throttle:{jobs}:concurrency:2000ms";

impl Backends {
    /// One operation on 3 slots leased for 2 s, on both backends (the next replica in turn):
    /// their common outcome, after checking it took one script call.
    async fn op(&mut self, op: HoldOp) -> HoldOutcome {
        let request = HoldRequest {
            key: Arc::from(KEY.as_bytes()),
            slots: 3,
            lease_nanos: 2 * SEC,
            op,
        };
        let expected = self
            .memory
            .hold(&request)
            .await
            .expect("memory never fails");
        let replica = &self.replicas[self.step % 2];
        self.step += 1;
        self.redis.reset_stats();
        let got = replica.hold(&request).await.expect("redis answers");
        // The first call of all finds the script not cached yet: EVALSHA, NOSCRIPT, EVAL.
        let calls = if self.step == 1 { 2 } else { 1 };
        assert_eq!(
            self.redis.script_calls(),
            calls,
            "step {}: one script call",
            self.step
        );
        assert_eq!(got, expected, "step {}: {op:?}", self.step);
        expected
    }
}

#[tokio::test]
async fn acquire_release_and_extend_agree_on_both_backends() {
    let mut b = Backends::start();
    let a = b.op(HoldOp::Acquire { count: 2 }).await;
    assert!(a.done && a.held == 2);
    let c = b.op(HoldOp::Acquire { count: 1 }).await;
    assert!(
        c.done && c.held == 3 && c.id != a.id,
        "same instant, distinct ids"
    );
    b.clock.advance(SEC / 2);
    let full = b.op(HoldOp::Acquire { count: 1 }).await;
    assert!(!full.done && full.held == 3);
    assert_eq!(
        full.wait_nanos,
        3 * SEC / 2,
        "the oldest hold expires in 1.5 s"
    );
    let members = b.members(KEY);
    assert_eq!(members.len(), 3, "the next id and two holds: {members:?}");
    assert_eq!(
        b.redis.cmd::<String>(&["TYPE", &format!("sluice:{KEY}")]),
        "zset"
    );

    // An unknown id frees nothing; the hold's own id frees exactly its count.
    let unknown = b.op(HoldOp::Release { id: c.id + 100 }).await;
    assert!(!unknown.done && unknown.held == 3);
    let unknown = b.op(HoldOp::Extend { id: c.id + 100 }).await;
    assert!(!unknown.done && unknown.held == 3);
    let freed = b.op(HoldOp::Release { id: a.id }).await;
    assert!(freed.done && freed.held == 1);
    assert!(
        !b.op(HoldOp::Release { id: a.id }).await.done,
        "released once"
    );

    // Extended at 1.5 s, the hold of id c lasts until 3.5 s; without, it would end at 2 s.
    b.clock.advance(SEC);
    assert!(b.op(HoldOp::Extend { id: c.id }).await.done);
    b.clock.advance(SEC);
    let d = b.op(HoldOp::Acquire { count: 2 }).await;
    assert!(d.done && d.held == 3, "c still held at 2.5 s: {d:?}");
    // d is lost (never released): at 4.5 s, one lease after it was taken, it is gone too.
    b.clock.advance(SEC);
    let after = b.op(HoldOp::Acquire { count: 1 }).await;
    assert!(
        after.done && after.held == 3,
        "c expired at 3.5 s: {after:?}"
    );
    assert!(
        !b.op(HoldOp::Extend { id: c.id }).await.done,
        "an expired hold stays gone"
    );
    b.clock.advance(2 * SEC);
    let fresh = b.op(HoldOp::Release { id: d.id }).await;
    assert!(
        !fresh.done && fresh.held == 0,
        "every hold expired: {fresh:?}"
    );
    assert!(b.members(KEY).is_empty(), "nothing kept");
    let again = b.op(HoldOp::Acquire { count: 3 }).await;
    assert!(
        again.done && again.id > after.id,
        "ids count on after the key went fresh"
    );
}
