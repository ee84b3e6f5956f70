//! Inputs found by the fuzz targets (`fuzz/`, docs/fuzzing.md), kept as tests of the main
//! crate: each reproduces a finding, inline, and asserts the fixed behaviour.

use std::path::PathBuf;

use sluice::config::rules_file::{RuleErrors, from_sources};
use sluice::limiter::funnel::{FRESH, Funnel};
use sluice::limiter::sliding_log::{Log, SlidingLog};
use sluice::limiter::token_bucket::{Bucket, TokenBucket};

const SEC: u64 = 1_000_000_000;

fn errors_of(text: &str) -> RuleErrors {
    match from_sources(&[(PathBuf::from("f.yaml"), text.to_owned())]) {
        Ok(model) => panic!("accepted: {model:?}"),
        Err(e) => e,
    }
}

/// A line indented 101 columns under a key: refused before parsing.
fn too_deep_line() -> String {
    format!("{}- key: k", " ".repeat(101))
}

/// `rules` target: the nesting check split lines at `\r` and NUL too, so in a CRLF file (or
/// after a NUL) it reported a line past the end of the file. Lines are counted as YAML
/// counts them: `\n`, `\r\n`, a lone `\r`.
#[test]
fn nesting_errors_name_the_line_in_crlf_files_and_after_nul() {
    let crlf = format!("domain: d\r\ndescriptors:\r\n{}\r\n", too_deep_line());
    let nul = format!("domain: d\0\0\0\ndescriptors:\n{}\n", too_deep_line());
    let lone_cr = format!("domain: d\rdescriptors:\r{}\r", too_deep_line());
    for text in [crlf, nul, lone_cr] {
        let errors = errors_of(&text);
        assert_eq!(errors.0.len(), 1, "{errors}");
        assert_eq!(errors.0[0].line, 3, "{errors}");
        assert!(
            errors.0[0].message.starts_with("nested too deeply"),
            "{errors}"
        );
    }
}

/// `algorithms` target: with `charge: always`, two entries of cost near `u64::MAX` made the
/// sum of a sliding log's expired entries overflow (a panic with overflow checks, a wrong
/// count without). The sum now saturates, as the log's own total does.
#[test]
fn a_sliding_log_sums_huge_expired_costs_without_overflow() {
    let l = SlidingLog::new(10, SEC);
    let mut log = Log::default();
    l.consume(&mut log, 0, u64::MAX);
    l.consume(&mut log, SEC / 2, u64::MAX);
    assert_eq!(log.len(), 2);
    assert_eq!(l.logged(&log, 2 * SEC), 0);
    assert_eq!(l.remaining(&log, 2 * SEC), 10);
    assert!(l.admits(&log, 2 * SEC, 10));
}

/// `algorithms` target: when `tat` would pass the end of u64 time it saturated, and the
/// funnel then admitted any cost; rules reached it when the capacity `B x P/Q` passed 584
/// years (1 per 100 years with a burst of 6, 1 per year with a burst of 600). The rules now
/// refuse a funnel or token bucket whose full burst drains in over 100 years.
#[test]
fn a_capacity_past_100_years_is_refused() {
    for (unit, multiplier, burst) in [("year", 100, 6), ("year", 1, 600), ("day", 36_501, 1)] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: {unit}\n      \
             unit_multiplier: {multiplier}\n      requests_per_unit: 1\n      burst: {burst}\n"
        );
        let errors = errors_of(&text);
        assert!(
            errors.to_string().contains("years to drain")
                || errors.to_string().contains("longer than 100 years"),
            "{errors}"
        );
    }
}

/// The largest capacity the rules allow (100 years), in the year 2262: the funnel admits
/// exactly its burst.
#[test]
fn a_funnel_at_the_largest_capacity_still_limits() {
    let period = 100 * 365 * 86_400 * SEC;
    let f = Funnel::new(6, period, 6, false);
    let now = u64::MAX / 2;
    let mut tat = FRESH;
    let mut admitted = 0;
    for _ in 0..20 {
        let step = f.evaluate(tat, now, 1);
        if step.admitted {
            admitted += 1;
            tat = step.tat;
        }
    }
    assert_eq!(admitted, 6, "a burst of 6 admitted {admitted}");
}

/// `algorithms` target: a bucket whose use saturated at `u64::MAX` (`charge: always` with a
/// huge cost) got a retry time one refill short, as `used + cost` saturated too. The excess
/// is now `used - (burst - cost)`, which cannot overflow.
#[test]
fn a_saturated_bucket_gets_an_exact_retry_time() {
    let b = TokenBucket::new(u32::MAX, 15_306, u32::MAX, true);
    let anchor = 7_089_517_091_439_667_002;
    let bucket = Bucket {
        used: u64::MAX,
        anchor,
        refundable: 0,
    };
    assert!(!b.admits(bucket, anchor, 1));
    let wait = b.until_admitted(bucket, anchor, 1);
    assert!(!b.admits(bucket, anchor + wait - 1, 1));
    assert!(
        b.admits(bucket, anchor + wait, 1),
        "still denied after {wait}"
    );
}
