//! Visibility, on both backends (memory, and a real `redis-server`): after a known traffic
//! pattern `/counters` lists exactly the keys with their state (filters, pages, text form);
//! `/counters/top` ranks the heavy keys first under a skewed flood of 100,000 distinct keys,
//! within the sketch's memory and error bounds; the limit gauges; and with `admin.token` set,
//! every guarded endpoint answers 401 without it (revealing nothing) and 200 with it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use sluice::config::settings::Settings;
use sluice::limiter::RedisLimiter;
use sluice::testing::TestServer;
use sluice::testing::http::{self, Answer};
use sluice::testing::redis::RedisServer;

const RULES: &str = include_str!("../fixtures/rules/suites/visibility.yaml");

const TOKEN: &str = "s3cret-t0ken";

/// An answer's body as JSON.
fn json_of(answer: &Answer) -> Value {
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
}

/// One request (a JSON body) on its own connection, with an optional bearer token.
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    headers.extend(auth.as_deref().map(|a| ("authorization", a)));
    http::request(addr, method, path, &headers, body).await
}

/// One `/json` request with these descriptors (each a list of `(key, value)`).
async fn ask(
    server: &TestServer,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    token: Option<&str>,
) -> u16 {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|d| json!({ "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>() }))
        .collect();
    let body = json!({ "domain": domain, "descriptors": descriptors }).to_string();
    let answer = http(server.admin_addr, "POST", "/json", &body, token).await;
    assert!(
        matches!(answer.status, 200 | 429),
        "{} {}",
        answer.status,
        answer.body
    );
    answer.status
}

/// The known pattern: what each key must hold afterwards.
async fn known_traffic(server: &TestServer, token: Option<&str>) {
    for _ in 0..3 {
        ask(server, "vis", &[&[("user", "alice")]], token).await;
    }
    ask(server, "vis", &[&[("user", "bob")]], token).await;
    for file in ["/files/a", "/files/b", "/files/a"] {
        ask(server, "vis", &[&[("path", file)]], token).await;
    }
    for _ in 0..2 {
        ask(
            server,
            "vis",
            &[&[("tenant", "t1"), ("route", "r|1")]],
            token,
        )
        .await;
    }
    ask(server, "other", &[&[("user", "carol")]], token).await;
}

/// Every key of every page of `query` (walking the cursor), by key.
async fn walk(server: &TestServer, query: &str, token: Option<&str>) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let path = match &cursor {
            Some(c) => format!("/counters?{query}&cursor={c}"),
            None => format!("/counters?{query}"),
        };
        let page = http(server.admin_addr, "GET", &path, "", token).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let page = json_of(&page);
        for k in page["keys"].as_array().expect("keys") {
            let key = k["key"].as_str().expect("a key").to_owned();
            assert!(all.insert(key, k.clone()).is_none(), "listed twice: {k}");
        }
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return all,
        }
    }
    panic!("the walk never ended");
}

/// `(remaining, reset upper bound in seconds, exact reset on the memory backend)` per key.
fn expected() -> BTreeMap<&'static str, (u64, &'static str, u32, f64, f64)> {
    BTreeMap::from([
        ("{vis|user=alice}:funnel:60", (2, "user", 5, 36.0, 60.0)),
        ("{vis|user=bob}:funnel:60", (4, "user", 5, 12.0, 60.0)),
        (
            "{vis|path~/files/*}:funnel:3600",
            (97, "path_/files/*", 100, 108.0, 3600.0),
        ),
        (
            "{vis|tenant=t1|route=r%7C1}:token_bucket:60",
            (8, "tenant.route", 10, -1.0, 60.0),
        ),
        (
            "{vis|tenant=t1|route=r%7C1}:fixed_window:3600",
            (98, "tenant.route", 100, -1.0, 3600.0),
        ),
    ])
}

async fn lists_exactly_the_keys(server: &TestServer, exact_resets: bool) {
    known_traffic(server, None).await;
    let want = expected();
    for count in [1, 2, 100] {
        let listed = walk(server, &format!("domain=vis&count={count}"), None).await;
        let keys: Vec<&str> = listed.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            want.keys().copied().collect::<Vec<_>>(),
            "count {count}"
        );
        for (key, (remaining, rule, limit, reset, period)) in &want {
            let k = &listed[*key];
            assert_eq!(k["remaining"], json!(remaining), "{k}");
            assert_eq!(k["rule"], json!(rule), "{k}");
            assert_eq!(k["limit"], json!(limit), "{k}");
            assert_eq!(k["domain"], json!("vis"), "{k}");
            assert_eq!(k["period_seconds"], json!(period), "{k}");
            let got = k["reset_seconds"].as_f64().expect("a reset");
            assert!(got > 0.0 && got <= *period, "{k}");
            if exact_resets && *reset >= 0.0 {
                assert_eq!(got, *reset, "{k}");
            }
        }
    }
    // The other domain, and every domain together.
    let other = walk(server, "domain=other", None).await;
    assert_eq!(
        other.keys().collect::<Vec<_>>(),
        ["{other|user=carol}:funnel:60"]
    );
    assert_eq!(other["{other|user=carol}:funnel:60"]["remaining"], json!(2));
    assert_eq!(walk(server, "count=3", None).await.len(), want.len() + 1);
    // Filters: by rule, and by key prefix.
    let users = walk(server, "domain=vis&rule=user", None).await;
    assert_eq!(
        users.keys().collect::<Vec<_>>(),
        ["{vis|user=alice}:funnel:60", "{vis|user=bob}:funnel:60"]
    );
    let routes = walk(server, "rule=tenant.route", None).await;
    assert_eq!(routes.len(), 2);
    let prefixed = walk(server, "prefix=%7Bvis%7Cuser%3Da", None).await;
    assert_eq!(
        prefixed.keys().collect::<Vec<_>>(),
        ["{vis|user=alice}:funnel:60"]
    );
    assert!(walk(server, "domain=nope", None).await.is_empty());
    // The text form, by parameter and by Accept.
    let text = http(
        server.admin_addr,
        "GET",
        "/counters?domain=vis&format=text",
        "",
        None,
    )
    .await;
    assert_eq!(text.status, 200);
    let content_type = text.header("content-type").unwrap_or_default();
    assert!(content_type.contains("text/plain"), "{:?}", text.headers);
    assert!(
        text.body
            .lines()
            .any(|l| l.starts_with("{vis|user=alice}:funnel:60  rule=user")
                && l.contains("remaining=2")),
        "{}",
        text.body
    );
    // Bad input: a clear 400.
    for bad in [
        "/counters?count=0",
        "/counters?count=x",
        "/counters?cursor=%21%21",
        "/counters/top?window=day",
    ] {
        let answer = http(server.admin_addr, "GET", bad, "", None).await;
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
    }
}

async fn ranks_heavy_keys_first(server: &TestServer) {
    // 100,000 distinct keys denied once each, and five heavy ones denied 5000, 4000, ...,
    // 1000 times, interleaved, 64 descriptors per request.
    let heavy = [
        ("h0", 5000u64),
        ("h1", 4000),
        ("h2", 3000),
        ("h3", 2000),
        ("h4", 1000),
    ];
    let mut values: Vec<String> = (0..100_000).map(|i| format!("light{i}")).collect();
    for (name, n) in heavy {
        for i in 0..n {
            let at = ((i * 100_000 / n) as usize).min(values.len());
            values.insert(at, name.to_owned());
        }
    }
    let total = values.len() as u64;
    for chunk in values.chunks(64) {
        let descriptors: Vec<Vec<(&str, &str)>> =
            chunk.iter().map(|v| vec![("flood", v.as_str())]).collect();
        let refs: Vec<&[(&str, &str)]> = descriptors.iter().map(Vec::as_slice).collect();
        assert_eq!(ask(server, "vis", &refs, None).await, 429);
    }
    for window in ["minute", "hour"] {
        let top = http(
            server.admin_addr,
            "GET",
            &format!("/counters/top?domain=vis&window={window}&n=20"),
            "",
            None,
        )
        .await;
        assert_eq!(top.status, 200, "{}", top.body);
        let top = json_of(&top);
        let d = &top["domains"][0];
        assert_eq!(d["domain"], json!("vis"));
        assert_eq!(d["total_denied"], json!(total));
        let bound = d["error_bound"].as_u64().expect("a bound");
        // N / K with K = 256 counters per sketch (nothing dropped: one request at a time).
        assert_eq!(bound, total.div_ceil(256), "{d}");
        let keys = d["keys"].as_array().expect("keys");
        let names: Vec<&str> = keys
            .iter()
            .take(5)
            .map(|k| k["key"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            names,
            ["flood=h0", "flood=h1", "flood=h2", "flood=h3", "flood=h4"],
            "{d}"
        );
        for k in keys {
            let truth = heavy
                .iter()
                .find(|(n, _)| k["key"] == json!(format!("flood={n}")))
                .map_or(1, |h| h.1);
            let denied = k["denied"].as_u64().expect("a count");
            assert!(
                denied.abs_diff(truth) <= bound,
                "{k} true {truth} bound {bound}"
            );
            assert_eq!(k["rule"], json!("flood"));
        }
        let sketch = &top["sketch"];
        let held = sketch["counters_held"].as_u64().expect("counters held");
        let max = sketch["max_counters_per_domain"].as_u64().expect("max");
        assert_eq!(max, 12 * 4 * 256);
        assert!(
            held > 0 && held <= max * sketch["domains"].as_u64().expect("domains"),
            "{sketch}"
        );
    }
    let text = http(
        server.admin_addr,
        "GET",
        "/counters/top?domain=vis&format=text&n=1",
        "",
        None,
    )
    .await;
    assert!(
        text.body
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("flood=h0")),
        "{}",
        text.body
    );
}

async fn gauges(server: &TestServer) {
    let text = http(server.admin_addr, "GET", "/metrics", "", None)
        .await
        .body;
    for line in [
        "sluice_rule_limit{domain=\"vis\",rule=\"user\",limit=\"funnel:60\"} 5",
        "sluice_rule_period_seconds{domain=\"vis\",rule=\"user\",limit=\"funnel:60\"} 60",
        "sluice_rule_limit{domain=\"vis\",rule=\"tenant.route\",limit=\"fixed_window:3600\"} 100",
        "sluice_rule_period_seconds{domain=\"vis\",rule=\"tenant.route\",limit=\"token_bucket:60\"} 60",
        // alice used 3 of 5; the zero quota denied: 1.
        "sluice_rule_capacity_used_ratio{domain=\"vis\",rule=\"user\"} 0.6",
        "sluice_rule_capacity_used_ratio{domain=\"vis\",rule=\"flood\"} 1.0",
        "sluice_rule_capacity_used_ratio{domain=\"other\",rule=\"user\"} 0.3333",
    ] {
        let found = text.lines().any(|l| l.starts_with(line));
        assert!(found, "no {line} in\n{text}");
    }
    // Since the last scrape, no request: the busiest share starts over.
    let again = http(server.admin_addr, "GET", "/metrics", "", None)
        .await
        .body;
    assert!(
        again.contains("sluice_rule_capacity_used_ratio{domain=\"vis\",rule=\"user\"} 0.0"),
        "{again}"
    );
}

/// What the page reads: the rules, the backend's health, the rules version, the top keys.
async fn ui_data(server: &TestServer, backend: &str) {
    let answer = http(server.admin_addr, "GET", "/ui/data", "", None).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let d = json_of(&answer);
    assert_eq!(d["version"], json!(1));
    assert_eq!(d["last_reload_error"], Value::Null);
    assert_eq!(d["backend"]["name"], json!(backend));
    let domains: Vec<&Value> = d["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| &r["domain"])
        .collect();
    assert_eq!(domains, [&json!("vis"), &json!("other")]);
    let route = &d["rules"][0]["rules"][2]["children"][0];
    assert_eq!(route["segment"], json!("route"), "{d}");
    assert_eq!(
        route["limits"][1]["algorithm"],
        json!("fixed_window"),
        "{d}"
    );
    assert_eq!(
        d["top"]["domains"][0]["keys"][0]["key"],
        json!("flood=h0"),
        "{d}"
    );
    if backend == "redis" {
        assert_eq!(d["backend"]["reachable"], json!(true), "{d}");
        assert_eq!(d["backend"]["breaker_open"], json!(false), "{d}");
        assert!(d["backend"]["deny_cache"].is_u64(), "{d}");
    } else {
        assert_eq!(d["backend"]["reachable"], Value::Null, "{d}");
        assert_eq!(d["backend"]["keys_held"], json!(6), "{d}");
    }
}

async fn redis_server_and_limiter() -> (RedisServer, Arc<RedisLimiter>) {
    let redis = RedisServer::start();
    let limiter = RedisLimiter::new(&redis.settings(), 1000).expect("valid Redis settings");
    (redis, Arc::new(limiter))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_counters_top_and_gauges() {
    let server = TestServer::start(RULES).await;
    lists_exactly_the_keys(&server, true).await;
    ranks_heavy_keys_first(&server).await;
    gauges(&server).await;
    ui_data(&server, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counters_top_and_gauges() {
    let (_redis, limiter) = redis_server_and_limiter().await;
    let server = TestServer::start_over(Settings::default(), RULES, limiter).await;
    lists_exactly_the_keys(&server, false).await;
    ranks_heavy_keys_first(&server).await;
    gauges(&server).await;
    ui_data(&server, "redis").await;
}

async fn token_guards(server: &TestServer, metrics_guarded: bool) {
    known_traffic(server, Some(TOKEN)).await;
    let guarded = [
        ("GET", "/counters"),
        ("GET", "/counters?domain=vis&format=text"),
        ("GET", "/counters/top"),
        ("GET", "/ui"),
        ("GET", "/ui/data"),
        ("POST", "/json"),
        ("POST", "/why"),
        ("POST", "/counters/reset"),
    ];
    let body = r#"{"domain":"vis","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;
    let mut refusals = Vec::new();
    for (method, path) in guarded {
        // The reset (which would pass with the token) of a key nothing else reads.
        let reset =
            r#"{"domain":"vis","descriptors":[{"entries":[{"key":"user","value":"zed"}]}]}"#;
        let body = match (method, path) {
            ("POST", "/counters/reset") => reset,
            ("POST", _) => body,
            _ => "",
        };
        for token in [None, Some("wrong"), Some("s3cret-t0ke"), Some("")] {
            let answer = http(server.admin_addr, method, path, body, token).await;
            assert_eq!(
                answer.status, 401,
                "{method} {path} with {token:?}: {}",
                answer.body
            );
            assert!(
                answer
                    .header("www-authenticate")
                    .is_some_and(|v| v.starts_with("Bearer")),
                "{:?}",
                answer.headers
            );
            for secret in ["alice", "vis", "funnel", TOKEN] {
                assert!(
                    !answer.body.contains(secret),
                    "{path} reveals {secret}: {}",
                    answer.body
                );
            }
            refusals.push((path == "/ui", answer.body));
        }
        let answer = http(server.admin_addr, method, path, body, Some(TOKEN)).await;
        let ok = if path == "/json" { 429 } else { 200 };
        assert!(
            answer.status == 200 || answer.status == ok,
            "{method} {path}: {} {}",
            answer.status,
            answer.body
        );
    }
    // Every refusal says the same, whatever was asked.
    for (page, text) in &refusals {
        let first = refusals.iter().find(|(p, _)| p == page).map(|(_, t)| t);
        assert_eq!(Some(text), first);
    }
    // The page also takes the token once in its query.
    let page = http(
        server.admin_addr,
        "GET",
        &format!("/ui?token={TOKEN}"),
        "",
        None,
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("sessionStorage"),
        "the page keeps the token for the tab"
    );
    let data = http(
        server.admin_addr,
        "GET",
        &format!("/ui/data?token={TOKEN}"),
        "",
        None,
    )
    .await;
    assert_eq!(
        data.status, 401,
        "only the page itself takes the token in its query"
    );
    // Open unless configured: health, readiness, the rules dump; metrics.
    for path in ["/healthz", "/readyz", "/rlconfig", "/"] {
        assert_eq!(
            http(server.admin_addr, "GET", path, "", None).await.status,
            200,
            "{path}"
        );
    }
    let metrics = http(server.admin_addr, "GET", "/metrics", "", None)
        .await
        .status;
    assert_eq!(metrics, if metrics_guarded { 401 } else { 200 });
    assert_eq!(
        http(server.admin_addr, "GET", "/metrics", "", Some(TOKEN))
            .await
            .status,
        200
    );
    // With the token, the data is there.
    let counters = http(
        server.admin_addr,
        "GET",
        "/counters?domain=vis",
        "",
        Some(TOKEN),
    )
    .await;
    assert!(
        counters.body.contains("{vis|user=alice}:funnel:60"),
        "{}",
        counters.body
    );
}

fn with_token(metrics: bool) -> Settings {
    let mut settings = Settings::default();
    settings.admin.token = Some(TOKEN.to_owned());
    settings.admin.token_metrics = metrics;
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_revealing_endpoint_memory() {
    for metrics in [false, true] {
        let server = TestServer::start_with(with_token(metrics), RULES).await;
        token_guards(&server, metrics).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_revealing_endpoint_redis() {
    let (_redis, limiter) = redis_server_and_limiter().await;
    let server = TestServer::start_over(with_token(false), RULES, limiter).await;
    token_guards(&server, false).await;
}

/// The limit gauges and the endpoints are documented in docs/operating.md (which README.md
/// links to), the admin token's settings in docs/settings.md.
#[test]
fn the_new_metrics_and_settings_are_documented() {
    for (doc, names) in [
        (
            "docs/operating.md",
            &[
                "`sluice_rule_limit`",
                "`sluice_rule_period_seconds`",
                "`sluice_rule_capacity_used_ratio`",
                "`GET /counters`",
                "`GET /counters/top`",
                "`GET /ui`",
            ][..],
        ),
        (
            "docs/settings.md",
            &["`admin.token`", "`SLUICE_ADMIN__TOKEN`"][..],
        ),
    ] {
        let text =
            std::fs::read_to_string(format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"))).expect(doc);
        for name in names {
            assert!(text.contains(name), "{doc} does not mention {name}");
        }
    }
}
