//! The scenarios of DESIGN.md §4 that need no control of time, written once and run by
//! tests/grpc_semantics.rs (memory backend, manual clock) and by tests/redis_behaviour.rs (memory
//! and a real Redis), with the request and assertion helpers both files use. Every scenario takes
//! a fresh client of a server serving tests/fixtures/semantics.yaml.

#![allow(dead_code)]

use crate::common::*;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;

/// The overall code of one `hit` (a single-entry descriptor in domain `test`).
pub async fn hit_code(c: &mut Client, key: &str, value: &str) -> Code {
    overall(&hit(c, key, value).await)
}

/// A request in domain `test` with one descriptor per `(key, value)` pair.
pub fn each(pairs: &[(&str, &str)]) -> RateLimitRequest {
    req("test", pairs.iter().map(|&p| desc(&[p])).collect())
}

/// A request in domain `test` with one single-entry descriptor that costs `cost`.
pub fn costing(key: &str, value: &str, cost: u64) -> RateLimitRequest {
    req("test", vec![with_hits(desc(&[(key, value)]), cost)])
}

/// A request in domain `test` that gives `amount` back to one single-entry descriptor.
pub fn refund(key: &str, value: &str, amount: u64) -> RateLimitRequest {
    let mut back = with_hits(desc(&[(key, value)]), amount);
    back.is_negative_hits = true;
    req("test", vec![back])
}

/// `d` with the client's own limit of `requests_per_unit` per `unit`.
pub fn overridden(
    mut d: RateLimitDescriptor,
    requests_per_unit: u32,
    unit: RateLimitUnit,
) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    d
}

/// The name of a status's current limit.
pub fn limit_name(s: &DescriptorStatus) -> Option<String> {
    limit_of(s).map(|l| l.2)
}

/// Asserts the overall code of `r`, and the code of each of its statuses, in order.
#[track_caller]
pub fn assert_codes(r: &RateLimitResponse, overall_code: Code, statuses: &[Code]) {
    assert_eq!(overall(r), overall_code, "overall code");
    let codes: Vec<Code> = r.statuses.iter().map(code).collect();
    assert_eq!(codes, statuses, "status codes");
}

/// Calls `r` and asserts that it is answered OK with no limit: no current limit, nothing
/// remaining, no reset.
pub async fn assert_ok_without_limit(c: &mut Client, r: RateLimitRequest) {
    let answer = call(c, r.clone()).await;
    assert_eq!(overall(&answer), Code::Ok, "{r:?}");
    let s = &answer.statuses[0];
    assert_eq!(code(s), Code::Ok, "{r:?}");
    assert_eq!(s.current_limit, None, "{r:?}");
    assert_eq!(s.limit_remaining, 0, "{r:?}");
    assert_eq!(s.duration_until_reset, None, "{r:?}");
}

pub async fn within_then_over_the_limit(c: &mut Client) {
    let r = hit(c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses.len(), 1);
    let s = &r.statuses[0];
    assert_eq!(code(s), Code::Ok);
    assert_eq!(limit_of(s), Some((1, Unit::Minute, String::new())));
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(reset_secs(s), Some(60));

    let r = hit(c, "one_per_minute", "a").await;
    assert_eq!(overall(&r), Code::OverLimit);
    let s = &r.statuses[0];
    assert_eq!(code(s), Code::OverLimit);
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(reset_secs(s), Some(60));
    assert_eq!(limit_of(s), Some((1, Unit::Minute, String::new())));
}

pub async fn a_key_only_rule_gives_each_value_its_own_state(c: &mut Client) {
    assert_eq!(hit_code(c, "one_per_minute", "a").await, Code::Ok);
    assert_eq!(hit_code(c, "one_per_minute", "b").await, Code::Ok);
    assert_eq!(hit_code(c, "one_per_minute", "a").await, Code::OverLimit);
}

/// `five_minutes` (5 per 5 minutes) drains one unit a minute; `bursty` (1/s, burst 3) admits 3
/// at once, then denies with a reset of one second.
pub async fn unit_multiplier_and_burst(c: &mut Client) {
    let r = hit(c, "five_minutes", "x").await;
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
        assert_eq!(hit_code(c, "bursty", "x").await, Code::Ok);
    }
    let over = hit(c, "bursty", "x").await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(reset_secs(&over.statuses[0]), Some(1));
}

pub async fn share_threshold_makes_matching_values_share_one_state(c: &mut Client) {
    assert_eq!(hit_code(c, "shared", "files/a").await, Code::Ok);
    assert_eq!(hit_code(c, "shared", "files/b").await, Code::Ok);
    assert_eq!(hit_code(c, "shared", "files/c").await, Code::OverLimit);
}

/// `multi` (2/second and 3/minute): the limit with the least remaining is reported, then the
/// one that denies.
pub async fn several_limits_report_the_least_remaining_then_the_denying_one(c: &mut Client) {
    let r = hit(c, "multi", "x").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        limit_name(&r.statuses[0]).as_deref(),
        Some("per_second"),
        "least remaining is reported"
    );
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(hit_code(c, "multi", "x").await, Code::Ok);
    let r = hit(c, "multi", "x").await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(
        limit_name(&r.statuses[0]).as_deref(),
        Some("per_second"),
        "the denying limit is reported"
    );
}

pub async fn statuses_follow_request_order(c: &mut Client) {
    let r = call(
        c,
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
}

pub async fn replaces_drops_the_named_limit(c: &mut Client) {
    let both = || each(&[("general", "g"), ("vip", "v")]);
    for _ in 0..3 {
        let r = call(c, both()).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None, "general is replaced");
        assert_eq!(limit_name(&r.statuses[1]).as_deref(), Some("vip"));
    }
    // The replaced limit consumed nothing meanwhile.
    assert_eq!(hit_code(c, "general", "g").await, Code::Ok);
    assert_eq!(hit_code(c, "general", "g").await, Code::OverLimit);
}

pub async fn zero_quota_blocks_every_request_with_a_cost(c: &mut Client) {
    let r = hit(c, "blocked", "x").await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[0]).unwrap() >= 1);
    let r = call(c, costing("blocked", "x", 0)).await;
    assert_eq!(overall(&r), Code::Ok);
}

pub async fn shadow_rules_are_counted_but_never_block(c: &mut Client) {
    assert_eq!(hit_code(c, "shadow", "x").await, Code::Ok);
    let r = hit(c, "shadow", "x").await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(code(&r.statuses[0]), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // A shadow denial does not stop another descriptor from consuming.
    let r = call(c, each(&[("shadow", "x"), ("one_per_minute", "s")])).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(hit_code(c, "one_per_minute", "s").await, Code::OverLimit);
}

pub async fn quota_mode_denies_only_when_every_quota_descriptor_is_over(c: &mut Client) {
    let both = || each(&[("quota_a", "q"), ("quota_b", "q")]);
    assert_eq!(hit_code(c, "quota_a", "q").await, Code::Ok);
    assert_eq!(hit_code(c, "quota_a", "q").await, Code::OverLimit);
    let r = call(c, both()).await;
    assert_codes(&r, Code::Ok, &[Code::OverLimit, Code::Ok]);
    let r = call(c, both()).await;
    assert_eq!(overall(&r), Code::OverLimit);
}

pub async fn charge_always_charges_denied_costs(c: &mut Client) {
    let r = call(c, costing("tokens", "t", 150)).await;
    assert_eq!(overall(&r), Code::OverLimit);
    // The 150 were charged anyway: the limiter is in debt, so even a check is over.
    let r = call(c, costing("tokens", "t", 0)).await;
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "in debt: even a check is over"
    );
}

pub async fn borrow_admits_while_not_in_debt(c: &mut Client) {
    let r = call(c, costing("borrow", "b", 8)).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    let r = call(c, costing("borrow", "b", 5)).await;
    assert_eq!(overall(&r), Code::Ok, "5 > 2 left, but borrowing admits it");
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(
        overall(&call(c, costing("borrow", "b", 1)).await),
        Code::OverLimit
    );
    assert_eq!(
        overall(&call(c, costing("borrow", "b", 0)).await),
        Code::OverLimit,
        "in debt"
    );
}
