//! Token budgets that hold where gateways drive them (issue 27), on the real binary started as
//! `ratelimit` with each gateway's environment, Redis behind it. A gateway sends two
//! `ShouldRateLimit` calls per request with the same descriptors: a check before forwarding,
//! and, once the stream is done, a report costing the answer's tokens (Envoy ignores its
//! answer). Under envoyproxy/ratelimit's environment sluice counts as that project does: a
//! fixed window, every reported cost added even past the limit, a 0-cost check over only
//! when the count is already above the limit.
//!
//! - Envoy Gateway's `cost.request`/`cost.response` layout through a real Envoy 1.40, rules
//!   over its mTLS ADS: an answer that crosses a user's budget goes through, the next requests
//!   are denied, other users are not;
//! - two replicas on one Redis take 20 concurrent checks and reports, count exactly their
//!   sum, and charge a report past the budget although it is denied;
//! - AI Gateway's QuotaPolicy tree over its plain ADS, through a real Envoy: a spent backend
//!   is denied, the other passes, and `dynamic_metadata` names the spent descriptor.
//!
//! sluice's own recipe (deploy/envoy/llm-tokens.yaml) runs in `envoy_e2e`. Needs
//! `redis-server` and `.venv/bin/envoy`; a missing one FAILS with the set-up command.

use std::time::Duration;

use serde_json::{Value, json};
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor as Node, RateLimitPolicy, RateLimitUnit,
};
use sluice::testing::eventually;
use sluice::testing::grpc::{
    Code, RateLimitRequest, RateLimitResponse, call, code, desc, metadata_json, overall, req,
    with_hits,
};
use sluice::testing::http::{Answer, get, get_with};
use sluice::testing::process::loopback;
use sluice::testing::ratelimit_env::ISTIO;
use sluice::testing::redis::RedisServer;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::support::ads::snapshot;
use crate::support::envoy::EnvoyProcess;
use crate::support::ratelimit::{
    EG_DOMAIN, EnvoyGateway, Ports, Ratelimit, RlsFilter, ads_server, clear_of_window_end, envoy,
    healthy, node_id, plain_client, ratelimit_link, runtime_root, swap,
};
use crate::support::upstream::Upstream;

/// The xDS route name Envoy Gateway gives the one match of HTTPRoute `default/llm-route`.
const LLM_ROUTE: &str = "httproute/default/llm-route/rule/0/match/0/*";
/// The key of its rule's Distinct `x-user-id` selector (key only: one budget per user).
const USER_RULE: &str = "rule-0-match-0";
/// Where the stream-done entries read the answer's tokens: the upstream stub sets the header
/// from the request's `x-reply-tokens` (AI Gateway reads its ext_proc's dynamic metadata).
const TOKENS: &str = "%RESP(x-tokens-used)%";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute";

const QUOTA_DOMAIN: &str = "ai-gateway-quota";
const BACKEND_A: [(&str, &str); 2] = [
    ("backend_name", "default/backend-a"),
    ("model_name_override", "gpt-4o-mini"),
];
const BACKEND_B: [(&str, &str); 2] = [
    ("backend_name", "default/backend-b"),
    ("model_name_override", "llama-3-8b"),
];
/// The keys of backend-a's bucket rules: x-tenant Exact `premium`, x-user-id Distinct (shadow
/// mode), the default bucket.
const RULE_0: &str = "rule-0-x-tenant|premium-match-0";
const RULE_1: &str = "rule-1-x-user-id-match-0";
const RULE_2: &str = "rule-2-match--1";

/// AI Gateway's rate-limit Deployment (envoyproxy/ai-gateway
/// tests/e2e/testdata/backend_quota_ratelimit.yaml), plus RESPONSE_DYNAMIC_METADATA, which
/// quota-aware routing needs (ai-gateway issue #2460).
const AI_GATEWAY: &[(&str, &str)] = &[
    ("LOG_LEVEL", "debug"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ai-gateway-ratelimit"),
    (
        "CONFIG_GRPC_XDS_SERVER_URL",
        "ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local:18002",
    ),
    ("GRPC_PORT", "8081"),
    ("RESPONSE_DYNAMIC_METADATA", "true"),
];

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
/// How long a stream-done report may take to reach sluice once the client has its answer.
const REPORTED_WITHIN: Duration = Duration::from_secs(5);

/// Envoy Gateway: 1000 tokens per hour per user, each answer's tokens reported when it is
/// done. A 1200-token answer goes through, then the user is denied; 600 and 600 go through,
/// then denied; another user is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_token_budget_denies_after_the_answer_that_crosses_it() {
    let (dir, redis) = (tempfile::tempdir().unwrap(), RedisServer::start());
    let (_push, rules) = watch::channel(Some(snapshot("eg-budget", &[eg_budget(1000)])));
    let mut eg = EnvoyGateway::start(dir.path(), redis.port, rules).await;
    let upstream = Upstream::start().await;
    healthy(&eg.ports).await;
    assert_eq!(node_id(&mut eg.requests).await, "envoy-ratelimit");
    rules_loaded(&eg.ports, "eg-budget").await;

    // Envoy as Envoy Gateway configures it (failing closed here, so that an RLS it cannot
    // reach shows as 500, never as a silent 200), over TLS to the rate-limit service.
    let filter = RlsFilter {
        name: "envoy.filters.http.ratelimit",
        domain: EG_DOMAIN,
        settings: "failure_mode_deny: true, timeout: 5s, disable_x_envoy_ratelimited_header: true, \
                   enable_x_ratelimit_headers: DRAFT_VERSION_03,",
    };
    let route = per_route(
        filter.name,
        EG_DOMAIN,
        json!({ "prefix": "/" }),
        eg_rate_limits(),
    );
    let envoy = envoy(
        &filter,
        &[route],
        eg.ports.grpc,
        Some(&eg.ca_file),
        upstream.port,
    )
    .await;

    // The budget is an hourly window aligned to the epoch: the steps below must all fall in
    // one, so a start within 30 s of the hour waits for the next hour to begin.
    clear_of_window_end(HOUR, Duration::from_secs(30)).await;
    let steps = [
        ("alice", 1200, 200),
        ("alice", 100, 429),
        ("alice", 100, 429),
        ("bob", 600, 200),
        ("bob", 600, 200),
        ("bob", 100, 429),
        ("carol", 100, 200),
    ];
    // The check costs 0 (`hits_addend: 0`).
    let watch = Watch {
        domain: EG_DOMAIN,
        rule: USER_RULE,
        check: 0,
    };
    walk(&envoy, &eg.ports, &watch, ("x-user-id", &[]), &steps).await;
}

/// Two replicas on one Redis: 20 concurrent requests of one user, each checked (cost 0) at
/// one replica and reported at the other, are counted exactly; a report past what is left is
/// charged although it is denied, so the next check is over at both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_count_concurrent_reports_exactly_and_charge_past_the_budget() {
    const BUDGET: u64 = 1_000_000;
    let (dir, redis) = (tempfile::tempdir().unwrap(), RedisServer::start());
    let link = ratelimit_link(dir.path());
    // Envoy Gateway's rules as a file, each replica run as Istio's sample runs
    // envoyproxy/ratelimit (rules files under RUNTIME_ROOT, Redis).
    let rules = eg_budget_file(BUDGET);
    let data = runtime_root(dir.path(), "ratelimit/config", &[("budget.yaml", &rules)]);
    let replicas: Vec<(Ports, Ratelimit)> = (0..2)
        .map(|_| {
            let env = swap(
                ISTIO,
                &[
                    ("LOG_LEVEL", "info".into()),
                    ("RUNTIME_ROOT", data.clone()),
                    ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
                ],
            );
            let rl = Ratelimit::start(&link, &env);
            (rl.ports, rl)
        })
        .collect();
    let mut clients = Vec::new();
    for (ports, _) in &replicas {
        healthy(ports).await;
        clients.push(plain_client(ports).await);
    }

    // One hourly window (aligned to the epoch) for the whole test.
    clear_of_window_end(HOUR, Duration::from_secs(30)).await;
    let tokens = |i: u64| 1000 + 7 * i;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (mut at_check, mut at_report) = (clients[i % 2].clone(), clients[(i + 1) % 2].clone());
        let cost = tokens(i as u64);
        tasks.spawn(async move {
            let check = call(&mut at_check, budget_call("dana", 0)).await;
            let report = call(&mut at_report, budget_call("dana", cost)).await;
            (overall(&check), overall(&report))
        });
    }
    let answers = tasks.join_all().await;
    assert!(
        answers.iter().all(|a| *a == (Code::Ok, Code::Ok)),
        "checks and reports within the budget: {answers:?}"
    );
    let sum: u64 = (0..20).map(tokens).sum();
    let state = counter(&replicas[0].0, "dana").await;
    let used = state["limit"].as_u64().zip(state["remaining"].as_u64());
    assert_eq!(
        used.map(|(limit, left)| limit - left),
        Some(sum),
        "the sum of the reports: {state}"
    );
    assert_eq!(state["algorithm"], "fixed_window", "{state}");

    // A report of more than is left: denied (Envoy ignores it) but charged.
    let past = call(&mut clients[0], budget_call("dana", BUDGET - sum + 1)).await;
    let mut seen = vec![("report past the budget", overall(&past))];
    for (i, c) in clients.iter_mut().enumerate() {
        let check = call(c, budget_call("dana", 0)).await;
        seen.push((["check at 0", "check at 1"][i], overall(&check)));
    }
    let other = call(&mut clients[1], budget_call("erin", 0)).await;
    seen.push(("another user", overall(&other)));
    let state = counter(&replicas[0].0, "dana").await;
    assert_eq!(
        seen,
        [
            ("report past the budget", Code::OverLimit),
            ("check at 0", Code::OverLimit),
            ("check at 1", Code::OverLimit),
            ("another user", Code::Ok),
        ],
        "{state}"
    );
}

/// AI Gateway's QuotaPolicy: backend-b's 5000 tokens per minute spent by two 3000-token
/// answers, its next request is denied (its quota descriptor is the only one sent), while
/// backend-a's pass; a call with both backends' descriptors (a route targeting both) passes,
/// and its `dynamic_metadata` says which one is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ai_gateways_quota_policy_denies_a_spent_backend_and_names_it() {
    let (dir, redis) = (tempfile::tempdir().unwrap(), RedisServer::start());
    let (_push, rules) = watch::channel(Some(snapshot("quota-1", &[quota_policy()])));
    let (xds, mut requests) = ads_server(None, rules).await;
    let env = swap(
        AI_GATEWAY,
        &[
            ("LOG_LEVEL", "info".into()),
            (
                "CONFIG_GRPC_XDS_SERVER_URL",
                format!("127.0.0.1:{}", xds.port()),
            ),
            ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ],
    );
    let rl = Ratelimit::start(&ratelimit_link(dir.path()), &env);
    let ports = rl.ports;
    let upstream = Upstream::start().await;
    healthy(&ports).await;
    assert_eq!(node_id(&mut requests).await, "envoy-ai-gateway-ratelimit");
    rules_loaded(&ports, "quota-1").await;
    let envoy = quota_envoy(ports.grpc, upstream.port).await;

    // backend-b's window is a minute aligned to the epoch: none of the steps below (well under
    // a second, unloaded) may fall in the next one, so a start within 10 s of the minute waits
    // for it.
    clear_of_window_end(MINUTE, Duration::from_secs(10)).await;
    let steps = [("b", 3000, 200), ("b", 3000, 200), ("b", 10, 429)];
    // The request-time call costs 1 (no `hits_addend`).
    let watch = Watch {
        domain: QUOTA_DOMAIN,
        rule: "llama-3-8b",
        check: 1,
    };
    let alice: &[(&str, &str)] = &[("x-user-id", "alice")];
    walk(&envoy, &ports, &watch, ("x-backend", alice), &steps).await;
    let a = ask(envoy.1, &[("x-backend", "a"), alice[0]], 10).await;
    assert_eq!(a.status, 200, "backend-a: {a:?}");

    // The same calls straight over gRPC, shaped as Envoy sends them.
    let mut client = plain_client(&ports).await;
    let b_only = req(QUOTA_DOMAIN, vec![desc(&BACKEND_B)]);
    let answer = call(&mut client, b_only).await;
    assert_eq!(
        decision(&answer),
        (Code::OverLimit, vec![("OVER_LIMIT", Code::OverLimit)]),
        "backend-b alone: {answer:?}"
    );
    let default_a = desc(&[BACKEND_A[0], BACKEND_A[1], (RULE_2, RULE_2)]);
    let both = req(QUOTA_DOMAIN, vec![default_a, desc(&BACKEND_B)]);
    let answer = call(&mut client, both).await;
    assert_eq!(
        decision(&answer),
        (
            Code::Ok,
            vec![("OK", Code::Ok), ("OVER_LIMIT", Code::OverLimit)]
        ),
        "both backends: {answer:?}"
    );
    let echo = metadata_json(&answer).unwrap_or_default();
    assert_eq!(echo["domain"], QUOTA_DOMAIN, "{echo}");
    let spent = &echo["descriptors"][1];
    assert_eq!(
        spent["entries"],
        json!([
            "backend_name=default/backend-b",
            "model_name_override=llama-3-8b"
        ]),
        "{echo}"
    );
    // AI Gateway names no limit.
    assert!(spent.get("limitName").is_none(), "{echo}");
}

// ---------------------------------------------------------------------------------------
// Rules.

/// What Envoy Gateway serves for a BackendTrafficPolicy on HTTPRoute `default/llm-route` with
/// one global rule (a Distinct `x-user-id` selector, `budget` per hour): the route's generic
/// key, then the rule's key-only entry.
fn eg_budget(budget: u32) -> RateLimitConfig {
    let user = node(USER_RULE, "", Some((budget, RateLimitUnit::Hour)), vec![]);
    RateLimitConfig {
        name: EG_DOMAIN.into(),
        domain: EG_DOMAIN.into(),
        descriptors: vec![node(LLM_ROUTE, LLM_ROUTE, None, vec![user])],
    }
}

/// The same as a rules file.
fn eg_budget_file(budget: u64) -> String {
    format!(
        "\
domain: {EG_DOMAIN}
descriptors:
  - key: \"{LLM_ROUTE}\"
    value: \"{LLM_ROUTE}\"
    descriptors:
      - key: {USER_RULE}
        rate_limit: {{ unit: hour, requests_per_unit: {budget} }}
"
    )
}

/// What AI Gateway serves for two QuotaPolicies: `default/quota-a` on backend-a (model
/// gpt-4o-mini; x-tenant premium 50000/h, x-user-id Distinct 2000/h in shadow mode, default
/// 10000/h) and `default/quota-b` on backend-b (model llama-3-8b, default 5000/min only).
/// Every leaf is in quota mode.
fn quota_policy() -> RateLimitConfig {
    let quota = |key, value, n, unit, shadow| Node {
        quota_mode: true,
        shadow_mode: shadow,
        ..node(key, value, Some((n, unit)), vec![])
    };
    let a = vec![
        quota(RULE_0, RULE_0, 50_000, RateLimitUnit::Hour, false),
        quota(RULE_1, "", 2000, RateLimitUnit::Hour, true),
        quota(RULE_2, RULE_2, 10_000, RateLimitUnit::Hour, false),
    ];
    let (model_a, model_b) = (BACKEND_A[1], BACKEND_B[1]);
    let backend_b = quota(model_b.0, model_b.1, 5000, RateLimitUnit::Minute, false);
    RateLimitConfig {
        name: QUOTA_DOMAIN.into(),
        domain: QUOTA_DOMAIN.into(),
        descriptors: vec![
            node(
                BACKEND_A[0].0,
                BACKEND_A[0].1,
                None,
                vec![node(model_a.0, model_a.1, None, a)],
            ),
            node(BACKEND_B[0].0, BACKEND_B[0].1, None, vec![backend_b]),
        ],
    }
}

fn node(key: &str, value: &str, limit: Option<(u32, RateLimitUnit)>, children: Vec<Node>) -> Node {
    Node {
        key: key.into(),
        value: value.into(),
        rate_limit: limit.map(|(requests_per_unit, unit)| RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        }),
        descriptors: children,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------
// Envoy's routes, as the gateways write them.

/// A route matching `matcher` to the upstream, with `rate_limits` for `filter` (JSON, which
/// is flow-style YAML).
fn per_route(filter: &str, domain: &str, matcher: Value, rate_limits: Vec<Value>) -> String {
    json!({
        "match": matcher,
        "route": { "cluster": "upstream" },
        "typed_per_filter_config": {
            filter: { "@type": PER_ROUTE, "domain": domain, "rate_limits": rate_limits }
        },
    })
    .to_string()
}

fn generic(key: &str, value: &str) -> Value {
    json!({ "generic_key": { "descriptor_key": key, "descriptor_value": value } })
}

/// The entry sent when the stream is done, costing the answer's tokens.
fn when_done(actions: Vec<Value>) -> Value {
    json!({ "actions": actions, "apply_on_stream_done": true, "hits_addend": { "format": TOKENS } })
}

/// Envoy Gateway's two entries for a rule with `cost.request: 0` and a response cost: the
/// route's generic key and the user's header, checked (`hits_addend: 0`) then reported.
fn eg_rate_limits() -> Vec<Value> {
    let actions = vec![
        generic(LLM_ROUTE, LLM_ROUTE),
        json!({ "request_headers": { "header_name": "x-user-id", "descriptor_key": USER_RULE } }),
    ];
    vec![
        json!({ "actions": actions, "hits_addend": { "number": 0 } }),
        when_done(actions),
    ]
}

/// Envoy with AI Gateway's quota filter and the per-route entries it writes for the two
/// backends (envoyproxy/ai-gateway internal/extensionserver/quota_ratelimit.go), except that
/// the backend is chosen by `x-backend: a|b`, the stream-done entries name the backend and
/// model by generic keys (the same descriptors as its dynamic metadata gives), and the filter
/// fails closed (AI Gateway's fails open: a 200 could hide an unreachable RLS).
async fn quota_envoy(rls: u16, upstream: u16) -> (EnvoyProcess, u16) {
    let filter = RlsFilter {
        name: "envoy.filters.http.ratelimit/ai-gateway-quota",
        domain: QUOTA_DOMAIN,
        settings: "timeout: 5s, failure_mode_deny: true, disable_x_envoy_ratelimited_header: true, \
                   enable_x_ratelimit_headers: DRAFT_VERSION_03, \
                   rate_limited_as_resource_exhausted: false,",
    };
    let of = |backend: [(&str, &str); 2], last: Option<Value>| -> Vec<Value> {
        let mut actions = vec![generic(backend[0].0, backend[0].1)];
        actions.push(generic(backend[1].0, backend[1].1));
        actions.extend(last);
        actions
    };
    let tenant = json!({ "header_value_match": {
        "descriptor_key": RULE_0, "descriptor_value": RULE_0, "expect_match": true,
        "headers": [{ "name": "x-tenant", "string_match": { "exact": "premium" } }],
    } });
    let user =
        json!({ "request_headers": { "header_name": "x-user-id", "descriptor_key": RULE_1 } });
    // Request time: one entry per bucket rule, then the default bucket; when done, the same,
    // but the Distinct selector becomes a generic key (value = key), as AI Gateway sends it.
    let a = vec![
        json!({ "actions": of(BACKEND_A, Some(tenant.clone())) }),
        json!({ "actions": of(BACKEND_A, Some(user)) }),
        json!({ "actions": of(BACKEND_A, Some(generic(RULE_2, RULE_2))) }),
        when_done(of(BACKEND_A, Some(tenant))),
        when_done(of(BACKEND_A, Some(generic(RULE_1, RULE_1)))),
        when_done(of(BACKEND_A, Some(generic(RULE_2, RULE_2)))),
    ];
    let b = vec![
        json!({ "actions": of(BACKEND_B, None) }),
        when_done(of(BACKEND_B, None)),
    ];
    let on = |backend: &str| {
        let header = json!({ "name": "x-backend", "string_match": { "exact": backend } });
        json!({ "prefix": "/", "headers": [header] })
    };
    let routes = [
        per_route(filter.name, QUOTA_DOMAIN, on("a"), a),
        per_route(filter.name, QUOTA_DOMAIN, on("b"), b),
        "{ match: { prefix: \"/\" }, direct_response: { status: 404 } }".to_owned(),
    ];
    envoy(&filter, &routes, rls, None, upstream).await
}

// ---------------------------------------------------------------------------------------
// Asking, and waiting.

/// A request through Envoy with `headers`, whose answer reports `tokens`.
async fn ask(port: u16, headers: &[(&str, &str)], tokens: u64) -> Answer {
    let tokens = tokens.to_string();
    let mut all = headers.to_vec();
    all.push(("x-reply-tokens", &tokens));
    get_with(loopback(port), "/v1/chat/completions", &all).await
}

/// Where [`walk`] waits for each request to be counted: the rules of `domain` whose label
/// holds `rule`, and what a request-time call costs there.
struct Watch<'a> {
    domain: &'a str,
    rule: &'a str,
    check: u64,
}

/// Sends each step `(who, tokens, status wanted)` through `envoy`, with `who` in header
/// `header.0` and the headers `header.1`, its answer reporting `tokens`; after each, waits
/// until sluice has counted it (`watch.check`, plus the tokens when the answer is 200, as
/// the report comes once the stream is done). Asserts the statuses wanted.
async fn walk(
    envoy: &(EnvoyProcess, u16),
    ports: &Ports,
    watch: &Watch<'_>,
    header: (&str, &[(&str, &str)]),
    steps: &[(&str, u64, u16)],
) {
    let mut counted = 0;
    let mut seen = Vec::new();
    for &(who, tokens, _) in steps {
        let mut headers = vec![(header.0, who)];
        headers.extend(header.1);
        let answer = ask(envoy.1, &headers, tokens).await;
        counted += watch.check + if answer.status == 200 { tokens } else { 0 };
        reports_landed(ports, watch.domain, watch.rule, counted).await;
        seen.push((who, tokens, answer.status));
    }
    let counters = counters(ports, watch.domain).await;
    assert_eq!(seen, steps, "{counters}\n{}", envoy.0.log());
}

/// Envoy Gateway's call for `user`: the check (`cost` 0) or the report.
fn budget_call(user: &str, cost: u64) -> RateLimitRequest {
    let d = desc(&[(LLM_ROUTE, LLM_ROUTE), (USER_RULE, user)]);
    req(EG_DOMAIN, vec![with_hits(d, cost)])
}

/// An answer's overall code, and each status's `code` in `dynamic_metadata` with its own.
fn decision(answer: &RateLimitResponse) -> (Code, Vec<(&'static str, Code)>) {
    let echo = metadata_json(answer).unwrap_or_default();
    let named = |i: usize| match echo["descriptors"][i]["code"].as_str() {
        Some("OK") => "OK",
        Some("OVER_LIMIT") => "OVER_LIMIT",
        Some(_) => "another code",
        None => "no code",
    };
    let statuses = answer.statuses.iter().enumerate();
    let per = statuses.map(|(i, s)| (named(i), code(s))).collect();
    (overall(answer), per)
}

/// Waits until the rules of `version` pushed over xDS are active.
async fn rules_loaded(ports: &Ports, version: &str) {
    let want = format!("# xds version {version}");
    let debug = loopback(ports.debug);
    let what = format!("/rlconfig shows `{want}`");
    eventually(Duration::from_secs(20), &what, || {
        let want = want.clone();
        async move { get(debug, "/rlconfig").await.body.contains(&want) }
    })
    .await;
}

/// Waits until sluice has counted `cost` in all on the rules of `domain` whose label holds
/// `rule`: the checks and the reports, admitted or not (`sluice_rule_hits_total`). A report
/// is sent when the stream is done, so it may land a little after the client got the answer.
async fn reports_landed(ports: &Ports, domain: &str, rule: &str, cost: u64) {
    let prefix = format!("sluice_rule_hits_total{{domain=\"{domain}\",rule=\"");
    let deadline = Instant::now() + REPORTED_WITHIN;
    loop {
        let body = get(loopback(ports.http), "/metrics").await.body;
        let counted: f64 = body
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter(|l| l.split('"').next().is_some_and(|r| r.contains(rule)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if counted == cost as f64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sluice counted {counted} on {domain} {rule}, not {cost}, within {REPORTED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/counters` of `domain` on the HTTP port, as text for a failure message.
async fn counters(ports: &Ports, domain: &str) -> String {
    get(loopback(ports.http), &format!("/counters?domain={domain}"))
        .await
        .body
}

/// The state of user `user`'s budget key, from `/counters`.
async fn counter(ports: &Ports, user: &str) -> Value {
    let body = counters(ports, EG_DOMAIN).await;
    let page: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let suffix = format!("|{USER_RULE}={user}");
    let keys = page["keys"].as_array().cloned().unwrap_or_default();
    keys.into_iter()
        .find(|k| {
            k["descriptor"]
                .as_str()
                .is_some_and(|d| d.ends_with(&suffix))
        })
        .unwrap_or_else(|| panic!("no key for {user} in {body}"))
}
