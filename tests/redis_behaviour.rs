//! One behaviour suite, run against both backends: every scenario is a module with a `memory`
//! and a `redis` test (the latter over a real `redis-server` on a loopback port). These are the
//! scenarios of tests/grpc_semantics.rs that need no control of time (Redis reads its own
//! clock), with the same rules file; those the two files share word for word are written once,
//! in tests/support/semantics.rs. tests/algorithms_behaviour.rs runs every algorithm the same
//! way.

#[path = "support/backends.rs"]
mod backends;
mod common;
#[path = "support/redis.rs"]
mod redis_support;
#[path = "support/semantics.rs"]
mod semantics;

use common::*;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use semantics::{assert_codes, assert_ok_without_limit, costing, each, overridden, refund};

scenario!(within_then_over_the_limit, |c| {
    semantics::within_then_over_the_limit(&mut c).await;
});

scenario!(a_key_only_rule_gives_each_value_its_own_state, |c| {
    semantics::a_key_only_rule_gives_each_value_its_own_state(&mut c).await;
});

scenario!(unit_multiplier_and_burst, |c| {
    semantics::unit_multiplier_and_burst(&mut c).await;
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
    semantics::share_threshold_makes_matching_values_share_one_state(&mut c).await;
});

scenario!(
    several_limits_report_the_least_remaining_then_the_denying_one,
    |c| {
        semantics::several_limits_report_the_least_remaining_then_the_denying_one(&mut c).await;
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
    semantics::replaces_drops_the_named_limit(&mut c).await;
});

scenario!(zero_quota_blocks_every_request_with_a_cost, |c| {
    semantics::zero_quota_blocks_every_request_with_a_cost(&mut c).await;
});

scenario!(shadow_rules_are_counted_but_never_block, |c| {
    semantics::shadow_rules_are_counted_but_never_block(&mut c).await;
});

scenario!(
    quota_mode_denies_only_when_every_quota_descriptor_is_over,
    |c| {
        semantics::quota_mode_denies_only_when_every_quota_descriptor_is_over(&mut c).await;
    }
);

scenario!(charge_always_charges_denied_costs, |c| {
    semantics::charge_always_charges_denied_costs(&mut c).await;
});

scenario!(borrow_admits_while_not_in_debt, |c| {
    semantics::borrow_admits_while_not_in_debt(&mut c).await;
});

scenario!(statuses_follow_request_order, |c| {
    semantics::statuses_follow_request_order(&mut c).await;
});
