//! One behaviour suite, run against both backends: every scenario is a module with a `memory`
//! and a `redis` test (the latter over a real `redis-server` on a loopback port). These are the
//! scenarios of tests/grpc_semantics.rs that need no control of time (Redis reads its own
//! clock), with the same rules file. tests/algorithms_behaviour.rs runs every algorithm the
//! same way.

#[path = "support/backends.rs"]
mod backends;
mod common;
#[path = "support/redis.rs"]
mod redis_support;

use common::*;

scenario!(within_then_over_the_limit, |c| {
    let r = hit(&mut c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::Ok);
    let s = &r.statuses[0];
    assert_eq!(limit_of(s), Some((1, Unit::Minute, String::new())));
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(reset_secs(s), Some(60));
    let r = hit(&mut c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(reset_secs(&r.statuses[0]), Some(60));
});

scenario!(a_key_only_rule_gives_each_value_its_own_state, |c| {
    assert_eq!(overall(&hit(&mut c, "one_per_minute", "a").await), Code::Ok);
    assert_eq!(overall(&hit(&mut c, "one_per_minute", "b").await), Code::Ok);
    assert_eq!(
        overall(&hit(&mut c, "one_per_minute", "a").await),
        Code::OverLimit
    );
});

scenario!(unit_multiplier_and_burst, |c| {
    let r = hit(&mut c, "five_minutes", "x").await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(reset_secs(&r.statuses[0]), Some(60));
    for _ in 0..3 {
        assert_eq!(overall(&hit(&mut c, "bursty", "x").await), Code::Ok);
    }
    let over = hit(&mut c, "bursty", "x").await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(reset_secs(&over.statuses[0]), Some(1));
});

scenario!(unknown_domain_no_match_and_unlimited, |c| {
    for r in [
        req("nope", vec![desc(&[("one_per_minute", "a")])]),
        req("test", vec![desc(&[("no_such_key", "a")])]),
        req("test", vec![desc(&[])]),
        req("test", vec![desc(&[("passthrough", "a")])]),
    ] {
        let answer = call(&mut c, r).await;
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    let r = hit(&mut c, "path", "/healthz").await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
});

scenario!(share_threshold_makes_matching_values_share_one_state, |c| {
    assert_eq!(overall(&hit(&mut c, "shared", "files/a").await), Code::Ok);
    assert_eq!(overall(&hit(&mut c, "shared", "files/b").await), Code::Ok);
    assert_eq!(
        overall(&hit(&mut c, "shared", "files/c").await),
        Code::OverLimit
    );
});

scenario!(
    several_limits_report_the_least_remaining_then_the_denying_one,
    |c| {
        let name = |r: &RateLimitResponse| limit_of(&r.statuses[0]).map(|l| l.2);
        let r = hit(&mut c, "multi", "x").await;
        assert_eq!(name(&r).as_deref(), Some("per_second"));
        assert_eq!(r.statuses[0].limit_remaining, 1);
        assert_eq!(overall(&hit(&mut c, "multi", "x").await), Code::Ok);
        let r = hit(&mut c, "multi", "x").await;
        assert_eq!(overall(&r), Code::OverLimit);
        assert_eq!(name(&r).as_deref(), Some("per_second"));
    }
);

scenario!(a_denied_request_consumes_nothing_anywhere, |c| {
    let both = || {
        req(
            "test",
            vec![
                desc(&[("one_per_minute", "y")]),
                desc(&[("five_minutes", "x")]),
            ],
        )
    };
    assert_eq!(overall(&call(&mut c, both()).await), Code::Ok);
    let r = call(&mut c, both()).await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(code(&r.statuses[0]), Code::OverLimit);
    assert_eq!(code(&r.statuses[1]), Code::Ok);
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
    let mut r = req("test", vec![with_hits(desc(&[("five_minutes", "a")]), 1)]);
    r.hits_addend = 4;
    assert_eq!(call(&mut c, r).await.statuses[0].limit_remaining, 2);
    for _ in 0..3 {
        let check = req("test", vec![with_hits(desc(&[("five_minutes", "a")]), 0)]);
        let answer = call(&mut c, check).await;
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(answer.statuses[0].limit_remaining, 2);
    }
});

scenario!(refunds_give_back_and_never_below_empty, |c| {
    hit(&mut c, "five_minutes", "r").await;
    hit(&mut c, "five_minutes", "r").await;
    let mut back = with_hits(desc(&[("five_minutes", "r")]), 1);
    back.is_negative_hits = true;
    let answer = call(&mut c, req("test", vec![back.clone()])).await;
    assert_eq!(overall(&answer), Code::Ok);
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    back.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1_000 });
    let answer = call(&mut c, req("test", vec![back])).await;
    assert_eq!(answer.statuses[0].limit_remaining, 5);
});

scenario!(limit_override_is_used_when_the_domain_exists, |c| {
    let mut d = desc(&[("one_per_minute", "ov")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 3,
    }); // per HOUR
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
    let both = || {
        req(
            "test",
            vec![desc(&[("general", "g")]), desc(&[("vip", "v")])],
        )
    };
    for _ in 0..3 {
        let r = call(&mut c, both()).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None);
    }
    assert_eq!(overall(&hit(&mut c, "general", "g").await), Code::Ok);
    assert_eq!(overall(&hit(&mut c, "general", "g").await), Code::OverLimit);
});

scenario!(zero_quota_blocks_every_request_with_a_cost, |c| {
    let r = hit(&mut c, "blocked", "x").await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert!(reset_secs(&r.statuses[0]).unwrap() >= 1);
    let r = call(
        &mut c,
        req("test", vec![with_hits(desc(&[("blocked", "x")]), 0)]),
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
});

scenario!(shadow_rules_are_counted_but_never_block, |c| {
    hit(&mut c, "shadow", "x").await;
    let r = hit(&mut c, "shadow", "x").await;
    assert_eq!(overall(&r), Code::Ok);
    let r = call(
        &mut c,
        req(
            "test",
            vec![desc(&[("shadow", "x")]), desc(&[("one_per_minute", "s")])],
        ),
    )
    .await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        overall(&hit(&mut c, "one_per_minute", "s").await),
        Code::OverLimit
    );
});

scenario!(
    quota_mode_denies_only_when_every_quota_descriptor_is_over,
    |c| {
        let both = || {
            req(
                "test",
                vec![desc(&[("quota_a", "q")]), desc(&[("quota_b", "q")])],
            )
        };
        hit(&mut c, "quota_a", "q").await;
        let r = call(&mut c, both()).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(code(&r.statuses[0]), Code::OverLimit);
        assert_eq!(code(&r.statuses[1]), Code::Ok);
        assert_eq!(overall(&call(&mut c, both()).await), Code::OverLimit);
    }
);

scenario!(charge_always_charges_denied_costs, |c| {
    let r = call(
        &mut c,
        req("test", vec![with_hits(desc(&[("tokens", "t")]), 150)]),
    )
    .await;
    assert_eq!(overall(&r), Code::OverLimit);
    let r = call(
        &mut c,
        req("test", vec![with_hits(desc(&[("tokens", "t")]), 0)]),
    )
    .await;
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "in debt: even a check is over"
    );
});

scenario!(borrow_admits_while_not_in_debt, |c| {
    let cost = |n| req("test", vec![with_hits(desc(&[("borrow", "b")]), n)]);
    assert_eq!(call(&mut c, cost(8)).await.statuses[0].limit_remaining, 2);
    let r = call(&mut c, cost(5)).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(overall(&call(&mut c, cost(1)).await), Code::OverLimit);
    assert_eq!(overall(&call(&mut c, cost(0)).await), Code::OverLimit);
});

scenario!(statuses_follow_request_order, |c| {
    let r = call(
        &mut c,
        req(
            "test",
            vec![
                desc(&[("path", "/healthz")]),
                desc(&[("nothing", "here")]),
                desc(&[("one_per_minute", "o")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[1].current_limit, None);
    assert_eq!(limit_of(&r.statuses[2]).map(|l| l.0), Some(1));
});
