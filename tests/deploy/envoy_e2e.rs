//! End to end through a real Envoy 1.40: a client asks Envoy, Envoy asks the real `sluice`
//! binary (gRPC, HTTP/2) and forwards to an upstream stub, every process on loopback ports.
//!
//! Envoy runs `deploy/envoy/envoy.yaml` itself, its own addresses swapped for port 0 (the
//! ports it got read back) and its targets' for their real ports, and sluice runs
//! `deploy/envoy/rules.yaml`: what is shipped is what is tested. Two Envoys share one sluice:
//! one with `failure_mode_deny: true` (as shipped), one with `false`. The same scenario runs
//! on the memory backend and on a real `redis-server`.

use std::path::Path;

use crate::support::envoy::{self, EnvoyProcess};
use crate::support::upstream::Upstream;
use crate::support::{deploy_file, start_sluice};
use sluice::testing::http::{Answer, get, get_with, sample};
use sluice::testing::process::{SluiceProcess, loopback};
use sluice::testing::redis::RedisServer;

/// An Envoy running the shipped config on loopback, and the port it listens on.
struct Proxy {
    port: u16,
    _envoy: EnvoyProcess,
}

impl Proxy {
    /// `deploy/envoy/<file>` with loopback addresses.
    async fn start(file: &str, upstream: u16, sluice: u16, failure_mode_deny: bool) -> Proxy {
        let template = std::fs::read_to_string(deploy_file(file)).expect("an Envoy config");
        Self::start_config(template, upstream, sluice, failure_mode_deny).await
    }

    /// `config` with loopback addresses.
    async fn start_config(
        template: String,
        upstream: u16,
        sluice: u16,
        failure_mode_deny: bool,
    ) -> Proxy {
        // Envoy's admin and listener on ports from the kernel, read back once it runs.
        let swaps = [
            (
                "address: { socket_address: { address: 127.0.0.1, port_value: 9901 } }",
                0,
            ),
            (
                "address: { socket_address: { address: 0.0.0.0, port_value: 10000 } }",
                0,
            ),
            (
                "address: { socket_address: { address: app, port_value: 8000 } }",
                upstream,
            ),
            (
                "address: { socket_address: { address: sluice, port_value: 8081 } }",
                sluice,
            ),
        ];
        let mut config = template;
        for (from, to) in swaps {
            let to = format!(
                "address: {{ socket_address: {{ address: 127.0.0.1, port_value: {to} }} }}"
            );
            config = envoy::replace_once(&config, from, &to);
        }
        config = envoy::replace_once(
            &config,
            "failure_mode_deny: true",
            &format!("failure_mode_deny: {failure_mode_deny}"),
        );
        // A loaded CI machine runs a debug sluice: a generous deadline keeps "too slow" out of
        // what this test observes.
        config = envoy::replace_once(&config, " timeout: 0.25s", " timeout: 5s");
        let envoy = EnvoyProcess::start(&config).await;
        Proxy {
            port: envoy.port("ingress"),
            _envoy: envoy,
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        get_with(loopback(self.port), path, headers).await
    }
}

fn header<'a>(answer: &'a Answer, name: &str) -> &'a str {
    answer
        .header(name)
        .unwrap_or_else(|| panic!("no {name} header in {answer:?}"))
}

/// The whole scenario against one sluice (started with `backend` arguments).
async fn scenario(backend: &[&str]) {
    let upstream = Upstream::start().await;
    let mut sluice = start_sluice(&deploy_file("rules.yaml"), backend).await;
    let deny = Proxy::start("envoy.yaml", upstream.port, sluice.port, true).await;
    let allow = Proxy::start("envoy.yaml", upstream.port, sluice.port, false).await;

    // /login: 5 per minute, so one every 12 s. Within the limit: 200s, counting down. The
    // path status has the least left, so it gives remaining and reset (12 s per request taken).
    // The limit header lists every status with a limit: remote_address's, then the path's.
    let limit = r#"5, 50;w=1, 5;w=60;name="login""#;
    for taken in 1..=5u32 {
        let answer = deny.get("/login", &[]).await;
        assert_eq!(
            answer.status, 200,
            "request {taken} within the limit: {answer:?}"
        );
        assert_eq!(answer.body, "upstream");
        assert_eq!(header(&answer, "x-ratelimit-limit"), limit);
        assert_eq!(
            header(&answer, "x-ratelimit-remaining"),
            (5 - taken).to_string()
        );
        assert_eq!(
            header(&answer, "x-ratelimit-reset"),
            (12 * taken).to_string()
        );
        assert!(answer.header("x-envoy-ratelimited").is_none());
    }

    // The next one is over: 429, marked by Envoy, admitted again in 12 s.
    let over = deny.get("/login", &[]).await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(header(&over, "x-envoy-ratelimited"), "true");
    assert_eq!(header(&over, "x-ratelimit-limit"), limit);
    assert_eq!(header(&over, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&over, "x-ratelimit-reset"), "12");

    // A path with no rule passes, again and again; only remote_address's limit is reported.
    for _ in 0..8 {
        let answer = deny.get("/orders", &[]).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(header(&answer, "x-ratelimit-limit"), "50, 50;w=1");
    }

    // The header descriptor: an API key's per-second limit has the least left.
    let keyed = deny.get("/orders", &[("x-api-key", "k-1")]).await;
    assert_eq!(keyed.status, 200, "{keyed:?}");
    assert_eq!(
        header(&keyed, "x-ratelimit-limit"),
        r#"10, 50;w=1, 10;w=1;name="api_key_per_second""#
    );
    assert_eq!(header(&keyed, "x-ratelimit-remaining"), "9");
    assert_eq!(header(&keyed, "x-ratelimit-reset"), "1");

    // The fail-open Envoy asks the same sluice (it reports the limit, and /login is over).
    let answer = allow.get("/orders", &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(header(&answer, "x-ratelimit-limit"), "50, 50;w=1");
    assert_eq!(allow.get("/login", &[]).await.status, 429);

    // sluice stopped: failure_mode_deny true answers 500, false lets the request through.
    sluice.stop();
    let denied = deny.get("/orders", &[]).await;
    assert_eq!(denied.status, 500, "failure_mode_deny: true: {denied:?}");
    let allowed = allow.get("/orders", &[]).await;
    assert_eq!(allowed.status, 200, "failure_mode_deny: false: {allowed:?}");
    assert_eq!(allowed.body, "upstream");
    assert!(allowed.header("x-ratelimit-limit").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_the_memory_backend() {
    scenario(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_the_redis_backend() {
    let redis = RedisServer::start();
    scenario(&["--backend", "redis", "--redis-url", &redis.url()]).await;
    // The limits were Redis's: it holds the /login funnel.
    let keys: Vec<String> = redis.cmd(&["KEYS", "sluice:*"]);
    assert!(
        keys.iter().any(|k| k.contains("path=/login")),
        "no /login key in Redis: {keys:?}"
    );
}

/// Waits until sluice has counted `tokens` on the large-model rule (reports are sent after
/// the answer, so they may land a little after the client got it).
async fn wait_for_tokens(sluice: &SluiceProcess, tokens: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let labels = [("domain", "llm"), ("rule", "user.model_large")];
    loop {
        let metrics = get(sluice.admin(), "/metrics").await;
        let counted = sample(&metrics.body, "sluice_rule_hits_total", &labels);
        if counted == Some(tokens as f64) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sluice counted {counted:?} tokens, not {tokens}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// deploy/examples/daily-quota.yaml behind the shipped Envoy, its domain set to "quota" (its
/// `x-api-key` action gives the example's descriptor): the limit header shows the one limit
/// the descriptor reports, the per-second one, as the example's comment says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reports_the_binding_limit_of_the_daily_quota_example() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/daily-quota.yaml");
    let upstream = Upstream::start().await;
    let sluice = start_sluice(&rules, &[]).await;
    let shipped = std::fs::read_to_string(deploy_file("envoy.yaml")).expect("an Envoy config");
    let config = envoy::replace_once(&shipped, "domain: edge", "domain: quota");
    let proxy = Proxy::start_config(config, upstream.port, sluice.port, true).await;
    for (key, limit) in [
        ("k-1", r#"10, 10;w=1;name="per_second""#),
        ("partner-7f3a", r#"100, 100;w=1;name="partner_per_second""#),
    ] {
        let answer = proxy.get("/orders", &[("x-api-key", key)]).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(header(&answer, "x-ratelimit-limit"), limit);
    }
}

/// deploy/envoy/llm-tokens.yaml with the rules of deploy/examples/llm-tokens.yaml: a check
/// before the request, the answer's token count reported when the stream is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reports_llm_tokens_after_the_answer() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/llm-tokens.yaml");
    let upstream = Upstream::start().await;
    let sluice = start_sluice(&rules, &[]).await;
    let proxy = Proxy::start("llm-tokens.yaml", upstream.port, sluice.port, true).await;
    let alice = [("x-user-id", "alice"), ("x-model", "large")];

    // 100k tokens per minute. A first answer of 60k tokens: admitted (the check costs 0).
    let first = proxy
        .get(
            "/v1/chat",
            &[alice[0], alice[1], ("x-reply-tokens", "60000")],
        )
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(header(&first, "x-ratelimit-remaining"), "100000");
    // The report arrives after the answer: wait until sluice has counted it.
    wait_for_tokens(&sluice, 60_000).await;
    let second = proxy
        .get(
            "/v1/chat",
            &[alice[0], alice[1], ("x-reply-tokens", "90000")],
        )
        .await;
    // Not in debt yet (40k left, plus what leaked since: 1667 tokens a second): admitted; its
    // 90k overshoot is charged anyway.
    assert_eq!(second.status, 200, "{second:?}");
    let left: u32 = header(&second, "x-ratelimit-remaining").parse().unwrap();
    assert!((40_000..42_000).contains(&left), "{left} left");
    wait_for_tokens(&sluice, 150_000).await;
    let third = proxy.get("/v1/chat", &alice).await;
    assert_eq!(third.status, 429, "{third:?}");
    // In debt by about 50k: denied for the ~30 s it takes to leak away (100k per minute).
    assert_eq!(header(&third, "x-envoy-ratelimited"), "true");
    assert_eq!(header(&third, "x-ratelimit-remaining"), "0");
    assert_eq!(
        header(&third, "x-ratelimit-limit"),
        r#"100000, 100000;w=60;name="large_tokens_per_minute""#
    );
    let reset: u32 = header(&third, "x-ratelimit-reset").parse().unwrap();
    assert!((28..=30).contains(&reset), "reset in {reset} s");
    // Another user is not affected.
    let bob = proxy
        .get("/v1/chat", &[("x-user-id", "bob"), ("x-model", "large")])
        .await;
    assert_eq!(bob.status, 200, "{bob:?}");
}

/// A limit's `on_deny` through the shipped Envoy: the 429 carries the rule's body, its
/// content type and its headers, and an admitted request none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_answers_a_denial_with_the_limits_custom_body_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: minute\n      \
         requests_per_unit: 1\n      on_deny:\n        body: '{\"error\":\"quota spent\",\"upgrade\":\"/plans\"}'\n        \
         content_type: application/json\n        headers: {x-quota-plan: free}\n",
    )
    .unwrap();
    let upstream = Upstream::start().await;
    let sluice = start_sluice(&rules, &[]).await;
    let proxy = Proxy::start("envoy.yaml", upstream.port, sluice.port, true).await;
    let key = [("x-api-key", "k-free")];
    let first = proxy.get("/orders", &key).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-quota-plan"), None);
    let denied = proxy.get("/orders", &key).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.body,
        "{\"error\":\"quota spent\",\"upgrade\":\"/plans\"}"
    );
    assert_eq!(
        header(&denied, "content-type"),
        "application/json",
        "{denied:?}"
    );
    assert_eq!(header(&denied, "x-quota-plan"), "free");
    let types = denied
        .headers
        .iter()
        .filter(|(k, _)| k == "content-type")
        .count();
    assert_eq!(types, 1, "one content type: {denied:?}");
}
