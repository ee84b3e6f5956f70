//! The `[response]` header settings over gRPC, set through their `SLUICE_*` names: header
//! names of one's own, and no `Retry-After` when `retry_after` is off.

use std::collections::HashMap;

use sluice::config::settings::{Overrides, Settings};
use sluice::testing::grpc::*;

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

fn headers(r: &RateLimitResponse) -> Vec<(&str, &str)> {
    let added = r.response_headers_to_add.iter();
    added.map(|h| (h.key.as_str(), h.value.as_str())).collect()
}

#[tokio::test]
async fn header_names_are_configurable_and_retry_after_can_be_off() {
    let env: HashMap<String, String> = [
        ("SLUICE_RESPONSE__HEADERS", "true"),
        ("SLUICE_RESPONSE__LIMIT_HEADER", "X-RateLimit-Limit"),
        ("SLUICE_RESPONSE__REMAINING_HEADER", "X-RateLimit-Remaining"),
        ("SLUICE_RESPONSE__RESET_HEADER", "X-RateLimit-Reset"),
        ("SLUICE_RESPONSE__RETRY_AFTER", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let settings = Settings::load(None, env, &Overrides::default()).expect("valid settings");
    let server = TestServer::start_with(settings, RULES).await;
    let mut c = client(&server).await;
    let expected = [
        ("X-RateLimit-Limit", "1"),
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset", "60"),
    ];
    let ok = hit(&mut c, "k", "a").await;
    assert_eq!(overall(&ok), Code::Ok);
    assert_eq!(headers(&ok), expected);
    let over = hit(&mut c, "k", "a").await;
    assert_eq!(overall(&over), Code::OverLimit);
    assert_eq!(headers(&over), expected, "no Retry-After");
}
