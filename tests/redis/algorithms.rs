//! Every algorithm through gRPC on loopback, on both backends (the `scenario!` suite of
//! semantics.rs): one descriptor per algorithm in tests/fixtures/semantics.yaml.
//! Redis reads its own clock, so these scenarios need no control of time; a second may pass
//! between two calls.

use sluice::testing::grpc::*;

use crate::support::backends::Backend;

scenario!(token_bucket_bursts_then_refills_in_steps, |c| {
    let cost = |n| req("test", vec![with_hits(desc(&[("bucket", "b")]), n)]);
    // 3 tokens held; 2 come back one minute after the first is taken.
    let r = call(&mut c, cost(1)).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 2);
    assert_eq!(
        reset_secs(&r.statuses[0]),
        Some(60),
        "full again at the next refill"
    );
    let r = call(&mut c, cost(2)).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        reset_secs(&r.statuses[0]),
        Some(120),
        "3 missing: two refills"
    );
    let r = call(&mut c, cost(1)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(reset_secs(&r.statuses[0]), Some(60), "the next refill");
    assert_eq!(
        limit_of(&r.statuses[0]),
        Some((2, Unit::Minute, String::new()))
    );
    let r = call(&mut c, cost(0)).await;
    assert_eq!(overall(&r), Code::Ok, "empty is not in debt");
    let mut back = with_hits(desc(&[("bucket", "b")]), 2);
    back.is_negative_hits = true;
    let r = call(&mut c, req("test", vec![back])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "a refund puts tokens back"
    );
});

scenario!(
    fixed_window_counts_admitted_costs_until_the_window_ends,
    |c| {
        let cost = |n| req("test", vec![with_hits(desc(&[("window", "w")]), n)]);
        // 3 per day, days aligned to 00:00 UTC: the reset is the time to the end of the day.
        let r = call(&mut c, cost(2)).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 1);
        let to_day_end = reset_secs(&r.statuses[0]).expect("a reset");
        assert!((1..=86_400).contains(&to_day_end), "{to_day_end}");
        let r = call(&mut c, cost(2)).await;
        assert_eq!(overall(&r), Code::OverLimit);
        let later = |r: &RateLimitResponse| {
            // Redis reads its own clock: a second may pass between two calls.
            let reset = reset_secs(&r.statuses[0]).expect("a reset");
            assert!(
                reset <= to_day_end && reset + 1 >= to_day_end,
                "{reset} vs {to_day_end}"
            );
        };
        later(&r);
        let r = call(&mut c, cost(1)).await;
        assert_eq!(overall(&r), Code::Ok, "the denied cost was not counted");
        assert_eq!(r.statuses[0].limit_remaining, 0);
        later(&r);
        assert_eq!(
            overall(&call(&mut c, cost(0)).await),
            Code::Ok,
            "full is not over"
        );
        assert_eq!(overall(&call(&mut c, cost(1)).await), Code::OverLimit);
    }
);

scenario!(sliding_window_counts_within_the_hour, |c, b| {
    let cost = |n| req("test", vec![with_hits(desc(&[("sliding", "s")]), n)]);
    // 4 per hour, windows aligned to the clock's hours. Nothing was counted in the previous
    // hour, so this hour's count decides. It is fresh again once it weighs nothing in the next
    // hour: 3 * left / 3600 < 1 from 2,401 s into that hour, so the reset is the time to this
    // hour's end plus 2,401 s, on the clock of the backend.
    let to_hour_end = || 3_600 - (b.now_secs() % 3_600) as i64;
    let before = to_hour_end();
    let r = call(&mut c, cost(3)).await;
    let after = to_hour_end();
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let reset = reset_secs(&r.statuses[0]).expect("a reset");
    let (lo, hi) = (before.min(after) + 2_401, before.max(after) + 2_401);
    assert!(
        (lo - 1..=hi + 1).contains(&reset),
        "{reset} not in {lo}..={hi}"
    );
    let r = call(&mut c, cost(2)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let retry = reset_secs(&r.statuses[0]).expect("a retry time");
    assert!((1..=7_200).contains(&retry), "{retry}");
    let r = call(&mut c, cost(1)).await;
    assert_eq!(overall(&r), Code::Ok, "the denied cost was not counted");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let mut back = with_hits(desc(&[("sliding", "s")]), 2);
    back.is_negative_hits = true;
    let r = call(&mut c, req("test", vec![back])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2, "a refund uncounts");
});

scenario!(sliding_log_admits_at_most_the_quota_in_any_hour, |c| {
    let cost = |n| req("test", vec![with_hits(desc(&[("log", "l")]), n)]);
    // 3 per hour, exactly: each admitted cost counts for one hour from its own time.
    let r = call(&mut c, cost(2)).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(reset_secs(&r.statuses[0]), Some(3_600));
    let r = call(&mut c, cost(2)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        reset_secs(&r.statuses[0]),
        Some(3_600),
        "when the first entry leaves"
    );
    let r = call(&mut c, cost(1)).await;
    assert_eq!(overall(&r), Code::Ok, "the denied cost was not logged");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        overall(&call(&mut c, cost(0)).await),
        Code::Ok,
        "full is not over"
    );
    let mut back = with_hits(desc(&[("log", "l")]), 1);
    back.is_negative_hits = true;
    let r = call(&mut c, req("test", vec![back])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "a refund removes the newest cost"
    );
    assert_eq!(overall(&call(&mut c, cost(1)).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, cost(1)).await), Code::OverLimit);
});

/// Fixed windows of the long units, and fixed windows whose denials never fit.
const WINDOWS: &str = include_str!("../fixtures/rules/suites/windows.yaml");

/// 1970-01-12 13:46:40 UTC on the memory backend's clock: a time inside every long window,
/// not at the start of any.
const MEMORY_NOW: u64 = 1_000_000 * SECOND + SECOND / 2;

/// Sets the memory backend's clock to [`MEMORY_NOW`] (Redis reads its own).
fn at_memory_now(b: &Backend) {
    if let Some(clock) = b.memory_clock() {
        clock.set(MEMORY_NOW);
    }
}

/// Calls `r` and returns its first status's reset, checking that it is `expected(now)` for the
/// backend's time in seconds at the call (read before and after it, as a second may pass).
async fn reset_at_call(
    c: &mut Client,
    b: &Backend,
    r: RateLimitRequest,
    expected: impl Fn(u64) -> u64,
) -> RateLimitResponse {
    let before = expected(b.now_secs());
    let answer = call(c, r).await;
    let after = expected(b.now_secs());
    let reset = reset_secs(&answer.statuses[0]).expect("a reset");
    let reset = u64::try_from(reset).expect("a positive reset");
    assert!(
        reset == before || reset == after,
        "reset {reset}, expected {before} or {after}"
    );
    answer
}

scenario!(
    week_month_and_year_windows_are_7_30_and_365_days_from_the_epoch,
    rules = WINDOWS,
    |c, b| {
        at_memory_now(&b);
        // envoyproxy/ratelimit's reset: unit - now % unit, windows counted from the epoch
        // (weeks start on a Thursday, months and years are 30 and 365 days).
        for (key, unit) in [
            ("week", 604_800),
            ("month", 2_592_000),
            ("year", 31_536_000),
        ] {
            let r = reset_at_call(&mut c, &b, req("test", vec![desc(&[(key, "x")])]), |now| {
                unit - now % unit
            })
            .await;
            assert_eq!(overall(&r), Code::Ok, "{key}");
            assert_eq!(r.statuses[0].limit_remaining, 1, "{key}");
        }
        if b.memory_clock().is_some() {
            // At 1,000,000 s: 604,800 - 395,200, as envoyproxy/ratelimit computes it.
            let r = hit(&mut c, "week", "x").await;
            assert_eq!(reset_secs(&r.statuses[0]), Some(209_600));
        }
    }
);

scenario!(
    fixed_window_denials_that_never_fit_wait_for_the_window_end,
    rules = WINDOWS,
    |c, b| {
        at_memory_now(&b);
        let to_minute_end = |now: u64| 60 - now % 60;
        // A zero quota (envoyproxy/ratelimit's way to block), twice (the second from the Redis
        // backend's deny cache), and a cost above the quota: the reset is the window's end.
        for (key, cost) in [("blocked", 1), ("blocked", 1), ("minute", 3)] {
            let r = req("test", vec![with_hits(desc(&[(key, "x")]), cost)]);
            let r = reset_at_call(&mut c, &b, r, to_minute_end).await;
            assert_eq!(overall(&r), Code::OverLimit, "{key}");
            assert_eq!(r.statuses[0].limit_remaining, 0, "{key}");
        }
    }
);
