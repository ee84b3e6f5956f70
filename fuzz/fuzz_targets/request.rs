//! Arbitrary wire requests through the decision path the gRPC handler takes
//! (`sluice::wire::decide`), against fixed rules and a small memory limiter on a manual clock.
//!
//! Input: one byte of engine options, then frames of `[clock step][length: u16 LE][bytes]`,
//! each `bytes` decoded as a `RateLimitRequest` (a decode error skips the frame). Nothing may
//! panic; an answer has one status per descriptor, a known overall code, and is over the limit
//! only when some descriptor is; an error is only ever `INVALID_ARGUMENT`; the limiter never
//! holds more than its bound.

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use sluice::config::rules_file;
use sluice::config::settings::InputSettings;
use sluice::engine::{Engine, EngineError, HeaderNames, Options};
use sluice::wire;
use sluice::limiter::{ManualClock, MemoryLimiter};
use sluice::proto::RateLimitRequest;
use sluice::proto::rate_limit_response::Code;
use sluice::rules::RuleSet;

/// Every kind of rule: exact, wildcard (shared or not), key-only, nested, unlimited,
/// replaces, shadow and quota mode, zero quota, every algorithm, burst, borrow, charge.
const RULES: &str = r#"
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 3, burst: 5, name: per_ip}
      - {unit: minute, requests_per_unit: 20, algorithm: sliding_window}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log, name: login}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: fixed_window, charge: always}
  - key: path
    value: "*/x*y*"
    rate_limit: {unit: second, unit_multiplier: 7, requests_per_unit: 2, algorithm: token_bucket, burst: 3, borrow: true}
  - key: user
    quota_mode: true
    descriptors:
      - key: plan
        value: premium
        rate_limit: {unlimited: true, name: premium, replaces: [{name: per_ip}, {name: login}]}
      - key: plan
        value: p*
        quota_mode: true
        rate_limit: {unit: day, requests_per_unit: 5, borrow: true, replaces: [{name: per_ip}]}
      - key: plan
        rate_limit: {unit: week, requests_per_unit: 7, algorithm: sliding_window, charge: always}
  - key: blocked
    rate_limit: {unit: year, requests_per_unit: 0}
  - key: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            value: "*"
            rate_limits:
              - {unit: second, requests_per_unit: 1, algorithm: sliding_log}
              - {unit: second, requests_per_unit: 1, algorithm: fixed_window}
              - {unit: second, requests_per_unit: 1, algorithm: funnel, charge: always}
---
domain: other
descriptors:
  - key: k
    shadow_mode: true
    rate_limit: {unit: month, requests_per_unit: 1, algorithm: token_bucket}
"#;

static RULESET: LazyLock<Arc<ArcSwap<RuleSet>>> = LazyLock::new(|| {
    let sources = [(PathBuf::from("fuzz.yaml"), RULES.to_owned())];
    let model = rules_file::from_sources(&sources).expect("the fuzz rules are valid");
    Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)))
});

const SECOND: u64 = 1_000_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let max_keys = [0, 1, 3, 40][usize::from(flags >> 6)];
    let clock = ManualClock::at(1_700_000_000 * SECOND);
    let limiter = Arc::new(MemoryLimiter::with_clock(max_keys, clock.clone()));
    let options = Options {
        shadow_mode: flags & 1 != 0,
        quota_mode: false,
        headers: (flags & 2 != 0).then(|| HeaderNames {
            limit: "x-ratelimit-limit".into(),
            remaining: "x-ratelimit-remaining".into(),
            reset: "x-ratelimit-reset".into(),
            retry_after: flags & 4 != 0,
        }),
        echo_metadata: flags & 8 != 0,
        // Bit 4: tight input bounds, which most requests cross somewhere.
        input: if flags & 16 != 0 {
            InputSettings {
                max_descriptors: 4,
                max_entries: 3,
                max_domain_bytes: 8,
                max_key_bytes: 8,
                max_value_bytes: 16,
                ..InputSettings::default()
            }
        } else {
            InputSettings::default()
        },
    };
    let engine = Engine::new(RULESET.clone(), limiter.clone(), options);
    while let Some((step, len, tail)) = frame_header(rest) {
        clock.advance(clock_step(step));
        let (bytes, tail) = tail.split_at(len.min(tail.len()));
        rest = tail;
        let Ok(request) = RateLimitRequest::decode(bytes) else {
            continue;
        };
        decide(&engine, request, flags & 1 != 0);
        assert!(
            limiter.len() <= max_keys.max(1),
            "{} keys held",
            limiter.len()
        );
    }
});

fn frame_header(data: &[u8]) -> Option<(u8, usize, &[u8])> {
    let (&step, rest) = data.split_first()?;
    let (len, rest) = rest.split_first_chunk::<2>()?;
    Some((step, usize::from(u16::from_le_bytes(*len)), rest))
}

/// 0, or up to 63 milliseconds, seconds or hours.
fn clock_step(step: u8) -> u64 {
    let n = u64::from(step & 63);
    match step >> 6 {
        0 => 0,
        1 => n * 1_000_000,
        2 => n * SECOND,
        _ => n * 3_600 * SECOND,
    }
}

fn decide(engine: &Engine, request: RateLimitRequest, shadow: bool) {
    let descriptors = request.descriptors.len();
    let answer = wire::decide(engine, request)
        .now_or_never()
        .expect("the memory backend answers at once");
    let response = match answer {
        Ok(r) => r,
        Err(EngineError::InvalidArgument(message)) => {
            assert!(!message.is_empty());
            return;
        }
        Err(e) => panic!("the memory backend failed: {e}"),
    };
    assert_eq!(response.statuses.len(), descriptors, "{response:?}");
    let overall = Code::try_from(response.overall_code).expect("a known code");
    assert_ne!(overall, Code::Unknown, "{response:?}");
    for s in &response.statuses {
        let code = Code::try_from(s.code).expect("a known code");
        assert_ne!(code, Code::Unknown, "{response:?}");
    }
    if shadow {
        assert_eq!(overall, Code::Ok, "{response:?}");
    }
    if overall == Code::OverLimit {
        let over = response
            .statuses
            .iter()
            .any(|s| s.code == Code::OverLimit as i32);
        assert!(
            over,
            "over the limit with every descriptor OK: {response:?}"
        );
    }
}
