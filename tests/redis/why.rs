//! `POST /why` and `POST /counters/reset` through the real server, on both backends (memory,
//! and a real `redis-server`): a key within its limit and one over it, descriptors no rule
//! takes (with the reason), a shadow-mode rule; any number of `/why` calls charge nothing
//! (a `charge: always` limit would show it at once); a reset by request and by rule unblocks
//! the keys and is counted; and over Redis, a reset through one `sluice` process reaches
//! another one's deny cache (one server, and through Sentinel).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use sluice::config::settings::Settings;
use sluice::limiter::RedisLimiter;
use sluice::testing::TestServer;
use sluice::testing::http::{self, Answer};
use sluice::testing::redis::RedisServer;

const RULES: &str = "
domain: why
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, charge: always}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /login
    descriptors:
      - key: ip
        rate_limit: {unit: hour, requests_per_unit: 3}
";

async fn post(addr: SocketAddr, path: &str, body: &str) -> Answer {
    http::request(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body,
    )
    .await
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|d| json!({ "entries": d.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>() }))
        .collect();
    json!({ "domain": domain, "descriptors": descriptors }).to_string()
}

async fn why(addr: SocketAddr, body: &str) -> Value {
    let answer = post(addr, "/why", body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
}

/// The status of a real `/json` request.
async fn decide(addr: SocketAddr, body: &str) -> u16 {
    let answer = post(addr, "/json", body).await;
    assert!(matches!(answer.status, 200 | 429), "{}", answer.body);
    answer.status
}

/// The `/counters` entry of `key` (state now).
async fn counter(addr: SocketAddr, key: &str) -> Option<Value> {
    let answer = http::request(addr, "GET", "/counters?domain=why", &[], "").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let page: Value = serde_json::from_str(&answer.body).expect("JSON");
    let keys = page["keys"].as_array().expect("keys").clone();
    keys.into_iter().find(|k| k["key"] == key)
}

async fn within_and_over(addr: SocketAddr) {
    // Within: a fresh key, asked many times, stays fresh.
    let bob = request("why", &[&[("user", "bob")]]);
    for _ in 0..20 {
        let w = why(addr, &bob).await;
        assert_eq!(w["charged"], false);
        assert_eq!(w["overall_code"], "OK", "{w}");
        let d = &w["descriptors"][0];
        assert_eq!(d["match"]["code"], "matched", "{d}");
        assert_eq!(d["match"]["rule"]["name"], "why.user", "{d}");
        assert_eq!(d["applies"], "limits");
        assert_eq!(d["mode"], "enforced");
        assert_eq!(d["cost"], 1);
        let l = &d["limits"][0];
        assert_eq!(l["algorithm"], "funnel", "{l}");
        assert_eq!(l["requests_per_unit"], 2);
        assert_eq!(l["charge"], "always");
        assert_eq!(l["override"], false);
        assert_eq!(l["key"], "{why|user=bob}:funnel:60");
        assert_eq!(l["state"]["remaining"], 2, "{l}");
        assert_eq!(l["state"]["in_debt"], false, "{l}");
        assert_eq!(l["verdict"]["admitted"], true, "{l}");
        assert_eq!(l["verdict"]["remaining"], 1, "{l}");
        assert_eq!(d["denied"]["last_minute"]["cost"], 0);
        assert_eq!(d["denied"]["scope"], "replica");
    }
    assert!(counter(addr, "{why|user=bob}:funnel:60").await.is_none());
    same_answer_as_json(addr, &bob).await;
    assert_eq!(decide(addr, &bob).await, 200);
    assert_eq!(decide(addr, &bob).await, 429);

    // Over: charge: always puts the key in debt with each denied request; /why never does.
    let al = request("why", &[&[("user", "al")]]);
    for expected in [200, 200, 429] {
        assert_eq!(decide(addr, &al).await, expected);
    }
    let key = "{why|user=al}:funnel:60";
    let before = counter(addr, key).await.expect("al is held");
    assert_eq!(before["remaining"], 0, "{before}");
    for _ in 0..50 {
        let w = why(addr, &al).await;
        assert_eq!(w["overall_code"], "OVER_LIMIT", "{w}");
        assert_eq!(w["response"]["overallCode"], "OVER_LIMIT", "{w}");
        let d = &w["descriptors"][0];
        let l = &d["limits"][0];
        assert_eq!(l["verdict"]["admitted"], false, "{l}");
        assert_eq!(l["state"]["remaining"], 0, "{l}");
        assert_eq!(d["denied"]["last_minute"]["cost"], 1, "{d}");
        assert_eq!(d["denied"]["last_hour"]["cost"], 1, "{d}");
    }
    let after = counter(addr, key).await.expect("al is still held");
    assert_eq!(after["remaining"], 0);
    let (b, a) = (&before["reset_seconds"], &after["reset_seconds"]);
    // A charged /why would have added 30 s of debt each time.
    assert!(a.as_f64() <= b.as_f64(), "reset grew from {b} to {a}");
    assert_eq!(after["in_debt"], before["in_debt"]);
    // And a real request now is answered as /why said (and charged: it is real).
    same_answer_as_json(addr, &al).await;
}

/// `/why`'s `response` is what `/json` answers right after (the memory backend's clock stands
/// still in these tests, so there to the second; over Redis, the code). The `/json` request
/// is real: it is charged.
async fn same_answer_as_json(addr: SocketAddr, body: &str) {
    let w = why(addr, body).await;
    let real = post(addr, "/json", body).await;
    let real: Value = serde_json::from_str(&real.body).expect("JSON");
    if w["backend"] == "memory" {
        assert_eq!(w["response"], real, "/why said otherwise than /json");
    } else {
        assert_eq!(w["response"]["overallCode"], real["overallCode"]);
    }
}

async fn no_rule_and_shadow(addr: SocketAddr) {
    // (domain, entries, match code, a part of the reason)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case<'_>; 5] = [
        ("why", &[("path", "/logout")], "no_value", "\"/logout\""),
        ("why", &[("path", "/login")], "too_short", "depth mismatch"),
        (
            "why",
            &[("user", "a"), ("extra", "x")],
            "too_long",
            "depth mismatch",
        ),
        ("why", &[("nokey", "x")], "no_key", "\"nokey\""),
        ("nope", &[("user", "a")], "unknown_domain", "\"nope\""),
    ];
    for (domain, entries, code, reason) in cases {
        let w = why(addr, &request(domain, &[entries])).await;
        let d = &w["descriptors"][0];
        assert_eq!(d["match"]["code"], code, "{w}");
        assert!(
            d["match"]["reason"].as_str().unwrap_or("").contains(reason),
            "{w}"
        );
        assert_eq!(d["applies"], "nothing", "{w}");
        assert_eq!(w["overall_code"], "OK");
        assert_eq!(w["domain_known"], domain == "why");
    }
    // Shadow mode: denied by its limit, never the request.
    let s = request("why", &[&[("shadow", "s")]]);
    assert_eq!(decide(addr, &s).await, 200);
    assert_eq!(decide(addr, &s).await, 200);
    let w = why(addr, &s).await;
    let d = &w["descriptors"][0];
    assert_eq!(d["mode"], "shadow", "{w}");
    assert_eq!(d["shadow"], true);
    assert_eq!(d["match"]["rule"]["shadow_mode"], true);
    assert_eq!(d["limits"][0]["verdict"]["admitted"], false, "{w}");
    assert_eq!(w["overall_code"], "OK", "{w}");
    // Bad input: a clear 400.
    let bad = post(addr, "/why", r#"{"domian":"why"}"#).await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("unknown field"), "{}", bad.body);
    let empty = post(addr, "/why", r#"{"domain":"why"}"#).await;
    assert_eq!(empty.status, 400);
    assert!(empty.body.contains("descriptor list"), "{}", empty.body);
}

async fn resets(addr: SocketAddr) {
    let users = ["r1", "r2", "r3"];
    for u in users {
        let body = request("why", &[&[("user", u)]]);
        for expected in [200, 200, 429] {
            assert_eq!(decide(addr, &body).await, expected, "{u}");
        }
    }
    // By request: one key.
    let r1 = request("why", &[&[("user", "r1")]]);
    let answer = post(addr, "/counters/reset", &r1).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let reset: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(reset["form"], "key");
    assert_eq!(reset["reset"], json!(["{why|user=r1}:funnel:60"]));
    assert_eq!(reset["held"], 1);
    assert_eq!(decide(addr, &r1).await, 200);
    assert_eq!(
        decide(addr, &request("why", &[&[("user", "r2")]])).await,
        429
    );
    // By rule: every key of it.
    let answer = post(addr, "/counters/reset", r#"{"rule":"why.user"}"#).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let reset: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(reset["form"], "rule");
    assert_eq!(reset["held"], 3, "{reset}");
    for u in users {
        let w = why(addr, &request("why", &[&[("user", u)]])).await;
        assert_eq!(
            w["descriptors"][0]["limits"][0]["state"]["remaining"], 2,
            "{u}"
        );
    }
    let unknown = post(addr, "/counters/reset", r#"{"rule":"why.nope"}"#).await;
    assert_eq!(unknown.status, 400);
    assert!(unknown.body.contains("why.nope"), "{}", unknown.body);
    let metrics = http::request(addr, "GET", "/metrics", &[], "").await;
    for line in [
        "sluice_counter_resets_total{form=\"key\"} 1",
        "sluice_counter_resets_total{form=\"rule\"} 1",
        "sluice_counter_reset_keys_total{form=\"rule\"} 3",
    ] {
        assert!(metrics.body.contains(line), "{line}\n{}", metrics.body);
    }
}

async fn redis_server(rules: &str) -> (RedisServer, TestServer) {
    redis_server_with(rules, false).await
}

/// Over Redis, calling the script (`EVALSHA`) or its function library (`FCALL`).
async fn redis_server_with(rules: &str, functions: bool) -> (RedisServer, TestServer) {
    let redis = RedisServer::start();
    let mut settings = redis.settings();
    settings.functions = functions;
    let limiter = RedisLimiter::new(&settings, 1_000).expect("valid redis settings");
    let server = TestServer::start_over(Settings::default(), rules, Arc::new(limiter)).await;
    (redis, server)
}

#[tokio::test]
async fn within_and_over_memory() {
    within_and_over(TestServer::start(RULES).await.admin_addr).await;
}

#[tokio::test]
async fn within_and_over_redis() {
    let (_redis, server) = redis_server(RULES).await;
    within_and_over(server.admin_addr).await;
}

#[tokio::test]
async fn within_and_over_redis_functions() {
    let (_redis, server) = redis_server_with(RULES, true).await;
    within_and_over(server.admin_addr).await;
}

#[tokio::test]
async fn no_rule_and_shadow_memory() {
    no_rule_and_shadow(TestServer::start(RULES).await.admin_addr).await;
}

#[tokio::test]
async fn no_rule_and_shadow_redis() {
    let (_redis, server) = redis_server(RULES).await;
    no_rule_and_shadow(server.admin_addr).await;
}

#[tokio::test]
async fn resets_memory() {
    resets(TestServer::start(RULES).await.admin_addr).await;
}

#[tokio::test]
async fn resets_redis() {
    let (_redis, server) = redis_server(RULES).await;
    resets(server.admin_addr).await;
}

/// Two `sluice` processes on one Redis: a key denied through both (so each one's deny cache
/// holds it), reset through the first, is admitted at once through the second, whose deny
/// cache heard of the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reaches_every_replicas_deny_cache() {
    let redis = RedisServer::start();
    reset_reaches_the_other_replica(&redis.url()).await;
}

/// The same through Sentinel: each replica listens on the master the sentinel names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reaches_every_replicas_deny_cache_through_sentinel() {
    let master = RedisServer::start();
    let sentinel = RedisServer::sentinel("mymaster", master.port, 1);
    let url = format!("redis+sentinel://{}/mymaster", sentinel.addr());
    reset_reaches_the_other_replica(&url).await;
}

/// The same on a Redis Cluster: each replica listens on one node, and the Cluster delivers
/// the reset's message to the subscribers of every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reaches_every_replicas_deny_cache_on_a_cluster() {
    let cluster = sluice::testing::redis::RedisCluster::start();
    reset_reaches_the_other_replica(&cluster.url()).await;
}

async fn reset_reaches_the_other_replica(url: &str) {
    let (_rules, replicas) = crate::support::load::replicas(2, RULES, url);
    let mut ready = Vec::new();
    for r in replicas {
        ready.push(r.ready().await);
    }
    let (a, b) = (ready[0].admin(), ready[1].admin());
    // 3 per hour: the fourth is denied (a `charge: always` limit is never cached, so the
    // key is one whose denial charges nothing).
    let cached = request("why", &[&[("path", "/login"), ("ip", "1.2.3.4")]]);
    for expected in [200, 200, 200, 429] {
        assert_eq!(decide(a, &cached).await, expected);
    }
    let hits_before = deny_cache_hits(b).await;
    assert_eq!(decide(b, &cached).await, 429);
    assert_eq!(decide(b, &cached).await, 429);
    assert!(
        deny_cache_hits(b).await > hits_before,
        "the second replica answered from its deny cache"
    );
    let answer = post(a, "/counters/reset", &cached).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // The message reaches the other replica within a round trip.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let status = decide(b, &cached).await;
        if status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second replica still denies a reset key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn deny_cache_hits(admin: SocketAddr) -> f64 {
    let metrics = http::request(admin, "GET", "/metrics", &[], "").await;
    metrics
        .body
        .lines()
        .find(|l| {
            l.starts_with("sluice_backend_events_total{") && l.contains("event=\"deny_cache_hit\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

const HELD: &str = "
domain: held
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
";

/// A concurrency key with both slots held: `/why` shows the holds and the denial it would
/// give, and leaves nothing behind: after any number of `/why` calls, one release frees one
/// slot for the next request (a `/why` that left a pending denial would have swallowed it).
async fn held(addr: SocketAddr) {
    let take = request("held", &[&[("tenant", "t")]]);
    let release = json!({
        "domain": "held",
        "descriptors": [{
            "entries": [{"key": "tenant", "value": "t"}],
            "hitsAddend": 1,
            "isNegativeHits": true,
        }],
    })
    .to_string();
    assert_eq!(decide(addr, &take).await, 200);
    assert_eq!(decide(addr, &take).await, 200);
    for _ in 0..20 {
        let w = why(addr, &take).await;
        assert_eq!(w["overall_code"], "OVER_LIMIT", "{w}");
        let l = &w["descriptors"][0]["limits"][0];
        assert_eq!(l["algorithm"], "concurrency", "{l}");
        assert_eq!(l["state"]["holds"], 2, "{l}");
        assert_eq!(l["state"]["remaining"], 0, "{l}");
        assert_eq!(l["verdict"]["admitted"], false, "{l}");
    }
    assert_eq!(decide(addr, &release).await, 200);
    let w = why(addr, &take).await;
    assert_eq!(w["descriptors"][0]["limits"][0]["state"]["holds"], 1, "{w}");
    assert_eq!(decide(addr, &take).await, 200, "the released slot is free");
}

#[tokio::test]
async fn a_held_concurrency_key_memory() {
    held(TestServer::start(HELD).await.admin_addr).await;
}

#[tokio::test]
async fn a_held_concurrency_key_redis() {
    let (_redis, server) = redis_server(HELD).await;
    held(server.admin_addr).await;
}

const BOXED: &str = "
domain: boxed
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, block_for: 30s}
";

/// A key in its penalty box: `/why` shows the box and how long is left, and charges nothing;
/// a reset ends the box, and the key is admitted again.
async fn boxed(addr: SocketAddr) {
    let ask = request("boxed", &[&[("ip", "1.2.3.4")]]);
    assert_eq!(decide(addr, &ask).await, 200);
    assert_eq!(decide(addr, &ask).await, 429, "denied: the box starts");
    for _ in 0..5 {
        let w = why(addr, &ask).await;
        assert_eq!(w["overall_code"], "OVER_LIMIT", "{w}");
        let l = &w["descriptors"][0]["limits"][0];
        assert_eq!(l["block_for_seconds"], 30.0, "{l}");
        let left = l["state"]["blocked_seconds"].as_f64().expect("in its box");
        assert!(left > 25.0 && left <= 30.0, "{l}");
    }
    let reset = post(addr, "/counters/reset", &ask).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    let w = why(addr, &ask).await;
    let l = &w["descriptors"][0]["limits"][0];
    assert_eq!(l["state"]["blocked_seconds"], Value::Null, "{l}");
    assert_eq!(decide(addr, &ask).await, 200, "the reset ended the box");
}

#[tokio::test]
async fn a_boxed_key_memory() {
    boxed(TestServer::start(BOXED).await.admin_addr).await;
}

#[tokio::test]
async fn a_boxed_key_redis() {
    let (_redis, server) = redis_server(BOXED).await;
    boxed(server.admin_addr).await;
}

const LEASED: &str = "
domain: leased
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 100000, algorithm: fixed_window}
";

/// A leased key (`redis.leases = "on"`): `/why` and `/counters` show its true state in Redis
/// (which counts every leased unit as spent), the units out on lease (every replica's record)
/// and this replica's lease; the state and the lease add up to what was admitted.
#[tokio::test]
async fn a_leased_key_shows_its_true_state_and_its_units_out_on_lease() {
    let redis = RedisServer::start();
    let mut settings = redis.settings();
    settings.leases = sluice::config::settings::LeaseMode::On;
    settings.lease_min_rate = 1;
    // Leases long enough to be still held when the test reads them.
    settings.lease_validity_ms = 60_000;
    settings.lease_horizon_ms = 60_000;
    let limiter = RedisLimiter::new(&settings, 1_000).expect("valid redis settings");
    let server = TestServer::start_over(Settings::default(), LEASED, Arc::new(limiter)).await;
    let addr = server.admin_addr;
    let hot = request("leased", &[&[("hot", "k")]]);
    let admitted = 200;
    for _ in 0..admitted {
        assert_eq!(decide(addr, &hot).await, 200);
    }
    let w = why(addr, &hot).await;
    let state = &w["descriptors"][0]["limits"][0]["state"];
    let leases = &state["leases"];
    let here = &leases["here"];
    let (units, left) = (
        here["units"].as_u64().expect("a lease held here"),
        here["left"].as_u64().expect("units left"),
    );
    assert!(units >= 1 && left <= units, "{state}");
    let records = leases["records"].as_array().expect("records");
    assert_eq!(records.len(), 1, "{state}");
    assert_eq!(records[0]["units"], units, "{state}");
    assert_eq!(leases["out"], units, "{state}");
    assert!(records[0]["expires_seconds"].as_f64().unwrap_or(0.0) > 0.0);
    // Redis's count is what was admitted plus what is left on lease, nothing else.
    let remaining = state["remaining"].as_u64().expect("remaining");
    assert_eq!(remaining + admitted + left, 100_000, "{state}");
    // `/counters` shows the same.
    let key = w["descriptors"][0]["limits"][0]["key"]
        .as_str()
        .expect("key")
        .to_owned();
    let answer = http::request(addr, "GET", "/counters?domain=leased", &[], "").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let page: Value = serde_json::from_str(&answer.body).expect("JSON");
    let keys = page["keys"].as_array().expect("keys");
    assert_eq!(
        keys.len(),
        1,
        "the records' hash is not a key of its own: {page}"
    );
    let entry = &keys[0];
    assert_eq!(entry["key"], key.as_str());
    assert_eq!(entry["remaining"], remaining, "{entry}");
    assert_eq!(entry["leased_here"], left, "{entry}");
    assert_eq!(entry["leases"]["out"], units, "{entry}");
    assert_eq!(entry["leases"]["here"]["left"], left, "{entry}");
    // The text form says so too.
    let text = http::request(addr, "GET", "/counters?domain=leased&format=text", &[], "").await;
    assert!(
        text.body
            .contains(&format!("leased_out={units} leased_here={left}")),
        "{}",
        text.body
    );
    // With leases off, none of it is shown.
    let off = RedisServer::start();
    let settings = sluice::config::settings::RedisSettings {
        leases: sluice::config::settings::LeaseMode::Off,
        ..off.settings()
    };
    let limiter = RedisLimiter::new(&settings, 1_000).expect("valid redis settings");
    let plain = TestServer::start_over(Settings::default(), LEASED, Arc::new(limiter)).await;
    assert_eq!(decide(plain.admin_addr, &hot).await, 200);
    let w = why(plain.admin_addr, &hot).await;
    assert_eq!(
        w["descriptors"][0]["limits"][0]["state"]["leases"],
        Value::Null
    );
}
