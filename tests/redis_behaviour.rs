//! One behaviour suite, run against both backends: every scenario is a module with a `memory`
//! and a `redis` test (the latter over a real `redis-server` on a loopback port). These are the
//! scenarios of tests/grpc_semantics.rs that need no control of time (Redis reads its own
//! clock), with the same rules file.

mod common;
#[path = "support/redis.rs"]
mod redis_support;

use std::sync::Arc;

use common::*;
use redis_support::RedisServer;
use sluice::config::settings::Settings;
use sluice::limiter::RedisLimiter;

const RULES: &str = include_str!("fixtures/semantics.yaml");

/// What a test holds on to: the server, and the Redis behind it (if any).
struct Backend {
    _server: TestServer,
    _redis: Option<RedisServer>,
}

async fn memory() -> (Backend, Client) {
    let server = TestServer::start(RULES).await;
    let c = client(&server).await;
    (
        Backend {
            _server: server,
            _redis: None,
        },
        c,
    )
}

async fn redis() -> (Backend, Client) {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1_000).expect("valid redis settings");
    let server = TestServer::start_over(Settings::default(), RULES, Arc::new(limiter)).await;
    let c = client(&server).await;
    (
        Backend {
            _server: server,
            _redis: Some(redis),
        },
        c,
    )
}

/// `scenario!(name, |c| { ... })`: the body runs once per backend with a fresh client `c`.
macro_rules! scenario {
    ($name:ident, |$c:ident| $body:block) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn memory() {
                let (_b, mut $c) = super::memory().await;
                $body
            }

            #[tokio::test]
            async fn redis() {
                let (_b, mut $c) = super::redis().await;
                $body
            }
        }
    };
}

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

scenario!(sliding_window_counts_within_the_hour, |c| {
    let cost = |n| req("test", vec![with_hits(desc(&[("sliding", "s")]), n)]);
    // 4 per hour. Nothing was counted in the previous hour, so this hour's count decides;
    // it is fresh again once it weighs nothing in the next hour: at most two hours away.
    let r = call(&mut c, cost(3)).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let reset = reset_secs(&r.statuses[0]).expect("a reset");
    assert!((3_600..=7_200).contains(&reset), "{reset}");
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
