//! `metrics.limitador` on a plain sluice (not started as `limitador-server`): limitador's
//! series after known `ShouldRateLimit` traffic, without `limit_name` unless asked, beside a
//! ratelimit-format domain that they do not count; and `/metrics` is OpenMetrics again
//! without the setting.

use sluice::config::settings::Settings;
use sluice::testing::grpc::*;
use sluice::testing::http::{get, sample};

const RULES: &str = r#"
domain: plain
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
---
- namespace: ns
  name: per_user
  max_value: 1
  seconds: 3600
  variables: ["descriptors[0].user"]
"#;

async fn traffic(server: &TestServer) {
    let mut c = client(server).await;
    for _ in 0..3 {
        call(&mut c, req("ns", vec![desc(&[("user", "u")])])).await;
    }
    for _ in 0..2 {
        call(&mut c, req("plain", vec![desc(&[("k", "v")])])).await;
    }
    // A domain that is neither: limitador's (OK, counted under its name).
    call(&mut c, req("neither", vec![desc(&[("k", "v")])])).await;
}

#[tokio::test]
async fn limitadors_series_as_an_option_of_plain_sluice() {
    let mut settings = Settings::default();
    settings.metrics.limitador = true;
    let server = TestServer::start_with(settings.clone(), RULES).await;
    traffic(&server).await;
    let answer = get(server.admin_addr, "/metrics").await;
    assert_eq!(
        answer.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = &answer.body;
    let ns = [("limitador_namespace", "ns")];
    assert_eq!(sample(text, "limitador_up", &[]), Some(1.0), "{text}");
    assert_eq!(sample(text, "authorized_calls", &ns), Some(1.0), "{text}");
    assert_eq!(sample(text, "authorized_hits", &ns), Some(1.0), "{text}");
    assert_eq!(sample(text, "limited_calls", &ns), Some(2.0), "{text}");
    assert_eq!(sample(text, "datastore_latency_count", &[]), Some(3.0));
    let neither = [("limitador_namespace", "neither")];
    assert_eq!(
        sample(text, "authorized_calls", &neither),
        Some(1.0),
        "{text}"
    );
    assert!(!text.contains("limit_name"), "{text}");
    assert!(
        !text.contains("limitador_namespace=\"plain\""),
        "ratelimit domains are not limitador's: {text}"
    );
    let over = [("result", "over_limit")];
    assert_eq!(sample(text, "sluice_requests_total", &over), Some(3.0));

    settings.metrics.limitador_limit_name_label = true;
    let named = TestServer::start_with(settings, RULES).await;
    traffic(&named).await;
    let text = get(named.admin_addr, "/metrics").await.body;
    let labels = [("limitador_namespace", "ns"), ("limit_name", "per_user")];
    assert_eq!(sample(&text, "limited_calls", &labels), Some(2.0), "{text}");

    let off = TestServer::start(RULES).await;
    traffic(&off).await;
    let answer = get(off.admin_addr, "/metrics").await;
    assert!(answer.body.ends_with("# EOF\n"));
    assert!(!answer.body.contains("limitador_up"));
    assert_eq!(
        answer.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
}
