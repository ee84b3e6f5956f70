//! The request semantics of docs/semantics.md, run against both backends: every scenario is a
//! module with a `memory` and a `redis` test (the latter over a real `redis-server` on a
//! loopback port), serving tests/fixtures/semantics.yaml. Redis reads its own clock, so the
//! scenarios need no control of time; where the memory backend's manual clock shows more
//! (`b.memory_clock()`), the memory test goes on with it. tests/api/semantics.rs has the
//! scenarios that need what only an in-process server has; algorithms.rs runs every algorithm
//! the same way.

use sluice::testing::grpc::*;

scenario!(within_then_over_the_limit, |c| {
    let r = hit(&mut c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses.len(), 1);
    let s = &r.statuses[0];
    assert_eq!(code(s), Code::Ok);
    assert_eq!(limit_of(s), Some((1, Unit::Minute, String::new())));
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(reset_secs(s), Some(60));

    let r = hit(&mut c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::OverLimit);
    let s = &r.statuses[0];
    assert_eq!(code(s), Code::OverLimit);
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(reset_secs(s), Some(60));
    assert_eq!(limit_of(s), Some((1, Unit::Minute, String::new())));
});

scenario!(a_key_only_rule_gives_each_value_its_own_state, |c| {
    assert_eq!(hit_code(&mut c, "one_per_minute", "a").await, Code::Ok);
    assert_eq!(hit_code(&mut c, "one_per_minute", "b").await, Code::Ok);
    assert_eq!(
        hit_code(&mut c, "one_per_minute", "a").await,
        Code::OverLimit
    );
});

// `five_minutes` (5 per 5 minutes) drains one unit a minute; `bursty` (1/s, burst 3) admits 3
// at once, then denies with a reset of one second.
scenario!(unit_multiplier_and_burst, |c, b| {
    let r = hit(&mut c, "five_minutes", "x").await;
    assert_eq!(
        limit_of(&r.statuses[0]),
        Some((5, Unit::Minute, String::new()))
    );
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(
        reset_secs(&r.statuses[0]),
        Some(60),
        "one unit of 5/5min drains in 60 s"
    );

    for _ in 0..3 {
        assert_eq!(hit_code(&mut c, "bursty", "x").await, Code::Ok);
    }
    let over = hit(&mut c, "bursty", "x").await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(reset_secs(&over.statuses[0]), Some(1));
    // On the memory backend's clock: one second later, one more is admitted, not two.
    if let Some(clock) = b.memory_clock() {
        clock.advance(SECOND);
        assert_eq!(hit_code(&mut c, "bursty", "x").await, Code::Ok);
        assert_eq!(hit_code(&mut c, "bursty", "x").await, Code::OverLimit);
    }
});

scenario!(unknown_domain_no_match_and_unlimited, |c| {
    for r in [
        req("nope", vec![desc(&[("one_per_minute", "a")])]),
        req("test", vec![desc(&[("no_such_key", "a")])]),
        req("test", vec![desc(&[])]),
        req("test", vec![desc(&[("passthrough", "a")])]),
    ] {
        assert_ok_without_limit(&mut c, r).await;
    }
    let r = hit(&mut c, "path", "/healthz").await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
});

scenario!(share_threshold_makes_matching_values_share_one_state, |c| {
    assert_eq!(hit_code(&mut c, "shared", "files/a").await, Code::Ok);
    assert_eq!(hit_code(&mut c, "shared", "files/b").await, Code::Ok);
    assert_eq!(hit_code(&mut c, "shared", "files/c").await, Code::OverLimit);
});

// `multi` (2/second and 3/minute): the limit with the least remaining is reported, then the
// one that denies.
scenario!(
    several_limits_report_the_least_remaining_then_the_denying_one,
    |c, b| {
        let r = hit(&mut c, "multi", "x").await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(
            limit_name(&r.statuses[0]).as_deref(),
            Some("per_second"),
            "least remaining is reported"
        );
        assert_eq!(r.statuses[0].limit_remaining, 1);
        assert_eq!(hit_code(&mut c, "multi", "x").await, Code::Ok);
        let r = hit(&mut c, "multi", "x").await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(
            limit_name(&r.statuses[0]).as_deref(),
            Some("per_second"),
            "the denying limit is reported"
        );
        // On the memory backend's clock: the denied request took nothing from the per-minute
        // limit, so one more passes a second later; the next is denied by the per-minute limit.
        if let Some(clock) = b.memory_clock() {
            clock.advance(SECOND);
            let r = hit(&mut c, "multi", "x").await;
            assert_eq!(overall(&r), Code::Ok);
            assert_eq!(limit_name(&r.statuses[0]).as_deref(), Some("per_minute"));
            assert_eq!(r.statuses[0].limit_remaining, 0);
            clock.advance(SECOND);
            let r = hit(&mut c, "multi", "x").await;
            assert_eq!(overall(&r), Code::OverLimit);
            assert_eq!(limit_name(&r.statuses[0]).as_deref(), Some("per_minute"));
            assert!(reset_secs(&r.statuses[0]).unwrap() >= 1);
        }
    }
);

scenario!(a_denied_request_consumes_nothing_anywhere, |c| {
    let both = || each(&[("one_per_minute", "y"), ("five_minutes", "x")]);
    assert_eq!(overall(&call(&mut c, both()).await), Code::Ok);
    let r = call(&mut c, both()).await;
    assert_codes(&r, Code::OverLimit, &[Code::OverLimit, Code::Ok]);
    assert_eq!(
        r.statuses[1].limit_remaining, 4,
        "nothing consumed: still 4 left"
    );
    let r = hit(&mut c, "five_minutes", "x").await;
    assert_eq!(r.statuses[0].limit_remaining, 3);
});

scenario!(cost_precedence_and_check_only, |c| {
    let mut r = req("test", vec![desc(&[("five_minutes", "a")])]);
    r.hits_addend = 2;
    assert_eq!(call(&mut c, r).await.statuses[0].limit_remaining, 3);
    let mut r = costing("five_minutes", "a", 1);
    r.hits_addend = 4;
    assert_eq!(call(&mut c, r).await.statuses[0].limit_remaining, 2);
    for _ in 0..3 {
        let answer = call(&mut c, costing("five_minutes", "a", 0)).await;
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(answer.statuses[0].limit_remaining, 2);
    }
});

scenario!(refunds_give_back_and_never_below_empty, |c| {
    hit(&mut c, "five_minutes", "r").await;
    hit(&mut c, "five_minutes", "r").await;
    let answer = call(&mut c, refund("five_minutes", "r", 1)).await;
    assert_eq!(overall(&answer), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    let answer = call(&mut c, refund("five_minutes", "r", 1_000)).await;
    assert_eq!(answer.statuses[0].limit_remaining, 5);
});

scenario!(limit_override_is_used_when_the_domain_exists, |c| {
    let d = overridden(desc(&[("one_per_minute", "ov")]), 3, RateLimitUnit::Hour);
    for remaining in [2, 1, 0] {
        let r = call(&mut c, req("test", vec![d.clone()])).await;
        assert_eq!(
            limit_of(&r.statuses[0]),
            Some((3, Unit::Hour, String::new()))
        );
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    assert_eq!(
        overall(&call(&mut c, req("test", vec![d])).await),
        Code::OverLimit
    );
});

scenario!(replaces_drops_the_named_limit, |c| {
    let both = || each(&[("general", "g"), ("vip", "v")]);
    for _ in 0..3 {
        let r = call(&mut c, both()).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None, "general is replaced");
        assert_eq!(limit_name(&r.statuses[1]).as_deref(), Some("vip"));
    }
    // The replaced limit consumed nothing meanwhile.
    assert_eq!(hit_code(&mut c, "general", "g").await, Code::Ok);
    assert_eq!(hit_code(&mut c, "general", "g").await, Code::OverLimit);
});

scenario!(zero_quota_blocks_every_request_with_a_cost, |c| {
    let r = hit(&mut c, "blocked", "x").await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[0]).unwrap() >= 1);
    let r = call(&mut c, costing("blocked", "x", 0)).await;
    assert_eq!(overall(&r), Code::Ok);
});

scenario!(shadow_rules_are_counted_but_never_block, |c| {
    assert_eq!(hit_code(&mut c, "shadow", "x").await, Code::Ok);
    let r = hit(&mut c, "shadow", "x").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // A shadow denial does not stop another descriptor from consuming.
    let r = call(&mut c, each(&[("shadow", "x"), ("one_per_minute", "s")])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        hit_code(&mut c, "one_per_minute", "s").await,
        Code::OverLimit
    );
});

scenario!(
    quota_mode_denies_only_when_every_quota_descriptor_is_over,
    |c| {
        let both = || each(&[("quota_a", "q"), ("quota_b", "q")]);
        assert_eq!(hit_code(&mut c, "quota_a", "q").await, Code::Ok);
        assert_eq!(hit_code(&mut c, "quota_a", "q").await, Code::OverLimit);
        let r = call(&mut c, both()).await;
        assert_codes(&r, Code::Ok, &[Code::OverLimit, Code::Ok]);
        let r = call(&mut c, both()).await;
        assert_eq!(overall(&r), Code::OverLimit);
    }
);

scenario!(charge_always_charges_denied_costs, |c| {
    let r = call(&mut c, costing("tokens", "t", 150)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    // The 150 were charged anyway: the limiter is in debt, so even a check is over.
    let r = call(&mut c, costing("tokens", "t", 0)).await;
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "in debt: even a check is over"
    );
});

scenario!(borrow_admits_while_not_in_debt, |c| {
    let r = call(&mut c, costing("borrow", "b", 8)).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    let r = call(&mut c, costing("borrow", "b", 5)).await;
    assert_eq!(overall(&r), Code::Ok, "5 > 2 left, but borrowing admits it");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        overall(&call(&mut c, costing("borrow", "b", 1)).await),
        Code::OverLimit
    );
    assert_eq!(
        overall(&call(&mut c, costing("borrow", "b", 0)).await),
        Code::OverLimit,
        "in debt"
    );
});

scenario!(statuses_follow_request_order, |c| {
    let r = call(
        &mut c,
        each(&[
            ("path", "/healthz"),
            ("nothing", "here"),
            ("one_per_minute", "o"),
        ]),
    )
    .await;
    assert_eq!(r.statuses.len(), 3);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[1].current_limit, None);
    assert_eq!(limit_of(&r.statuses[2]).map(|l| l.0), Some(1));
});

/// 10 a second (a funnel, burst 10) with every cost charged, denied or not.
const METERED: &str = "domain: test\ndescriptors:\n  - key: metered\n    rate_limit: {unit: second, requests_per_unit: 10, charge: always}\n";

// A client that hammers a limit charged `always` owes at most one period beyond the burst
// (docs/algorithms.md): 300 tries would owe 30 s uncapped, yet a check right after reports a
// wait of at most a second, and the key is admitted again a period and one interval (1.1 s)
// after the last try.
scenario!(
    a_hammering_client_is_admitted_again_within_the_debt_bound,
    rules = METERED,
    |c, b| {
        let mut over = 0;
        for _ in 0..300 {
            if hit_code(&mut c, "metered", "x").await == Code::OverLimit {
                over += 1;
            }
        }
        assert!(over >= 280, "the tries past the burst are denied: {over}");
        let check = req("test", vec![with_hits(desc(&[("metered", "x")]), 0)]);
        let r = call(&mut c, check).await;
        assert_eq!(overall(&r), Code::OverLimit, "in debt: a check is denied");
        let wait = reset_secs(&r.statuses[0]).expect("a reset");
        assert!(wait <= 1, "the debt is capped: {wait} s");
        match b.memory_clock() {
            Some(clock) => clock.advance(1_100 * SECOND / 1_000),
            None => tokio::time::sleep(std::time::Duration::from_millis(1_150)).await,
        }
        assert_eq!(hit_code(&mut c, "metered", "x").await, Code::Ok);
    }
);
