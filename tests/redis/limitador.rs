//! limitador's limits file on both backends, through `ShouldRateLimit` on gRPC: the behaviour
//! examples of limitador's own tests (limitador-server/src/envoy_rls/server.rs) and of its
//! example limits file give the answers limitador gives, as one table.

use sluice::testing::grpc::*;

/// limitador-server/examples/limits.yaml (namespace `test_namespace`), then the limits of
/// limitador's `envoy_rls` tests, one namespace per test.
const LIMITS: &str = concat!(
    include_str!("../fixtures/limitador/limits.yaml"),
    r#"- {namespace: method_and_app, max_value: 1, seconds: 60, conditions: ["descriptors[0]['req.method'] == 'GET'"], variables: ["descriptors[0]['app.id']"]}
- {namespace: all_descriptors, max_value: 10, seconds: 60, conditions: ["descriptors[0].x == '1'"], variables: ["descriptors[0].z"]}
- {namespace: all_descriptors, max_value: 0, seconds: 60, conditions: ["descriptors[0].x == '1'", "descriptors[1].y == '2'"], variables: ["descriptors[0].z"]}
- {namespace: hits_addend, max_value: 10, seconds: 60, conditions: ["descriptors[0].x == '1'"], variables: ["descriptors[0].y"]}
- {namespace: zero_addend, max_value: 1, seconds: 60, conditions: ["descriptors[0].x == '1'"], variables: ["descriptors[0].y"]}
"#
);

/// One request and limitador's answer to it.
struct Step {
    domain: &'static str,
    descriptors: &'static [&'static [(&'static str, &'static str)]],
    hits_addend: u32,
    expect: Code,
}

const fn step(
    domain: &'static str,
    descriptors: &'static [&'static [(&'static str, &'static str)]],
    hits_addend: u32,
    expect: Code,
) -> Step {
    Step {
        domain,
        descriptors,
        hits_addend,
        expect,
    }
}

const POST_ALICE: &[&[(&str, &str)]] = &[&[("req.method", "POST"), ("user_id", "alice")]];
const POST_BOB: &[&[(&str, &str)]] = &[&[("req.method", "POST"), ("user_id", "bob")]];
const GET_ALICE: &[&[(&str, &str)]] = &[&[("req.method", "GET"), ("user_id", "alice")]];
const POST_NOBODY: &[&[(&str, &str)]] = &[&[("req.method", "POST")]];
const GET_APP_1: &[&[(&str, &str)]] = &[&[("req.method", "GET"), ("app.id", "1")]];
const X1_Z1_Y2: &[&[(&str, &str)]] = &[&[("x", "1"), ("z", "1")], &[("y", "2")]];
const X1_Z1: &[&[(&str, &str)]] = &[&[("x", "1"), ("z", "1")]];
const X1_Y1: &[&[(&str, &str)]] = &[&[("x", "1"), ("y", "1")]];
const X1_Y2: &[&[(&str, &str)]] = &[&[("x", "1"), ("y", "2")]];
const METHOD_GET: &[&[(&str, &str)]] = &[&[("req.method", "GET")]];

/// Each case: what it shows, and its requests in order.
const TABLE: &[(&str, &[Step])] = &[
    (
        "conditions on method and user: 5 POSTs per user a minute, GETs not counted",
        &[
            step("test_namespace", POST_ALICE, 1, Code::Ok),
            step("test_namespace", POST_ALICE, 1, Code::Ok),
            step("test_namespace", POST_ALICE, 1, Code::Ok),
            step("test_namespace", POST_ALICE, 1, Code::Ok),
            step("test_namespace", POST_ALICE, 1, Code::Ok),
            step("test_namespace", POST_ALICE, 1, Code::OverLimit),
            step("test_namespace", POST_BOB, 1, Code::Ok),
            step("test_namespace", GET_ALICE, 1, Code::Ok),
            // No user_id: the per-user limit does not apply, the namespace-wide one does.
            step("test_namespace", POST_NOBODY, 1, Code::Ok),
        ],
    ),
    (
        "returns OK, then OVER_LIMIT (limit of 1 on GET per app)",
        &[
            step("method_and_app", GET_APP_1, 1, Code::Ok),
            step("method_and_app", GET_APP_1, 1, Code::OverLimit),
        ],
    ),
    (
        "takes every descriptor into account (a limit of 0 on the second one)",
        &[
            step("all_descriptors", X1_Z1_Y2, 1, Code::OverLimit),
            step("all_descriptors", X1_Z1, 10, Code::Ok),
            step("all_descriptors", X1_Z1, 1, Code::OverLimit),
        ],
    ),
    (
        "takes hits_addend into account (6 of 10, then 6 more)",
        &[
            step("hits_addend", X1_Y1, 6, Code::Ok),
            step("hits_addend", X1_Y1, 6, Code::OverLimit),
            step("hits_addend", X1_Y1, 4, Code::Ok),
        ],
    ),
    (
        "hits_addend 0 is converted to 1",
        &[
            step("zero_addend", X1_Y2, 0, Code::Ok),
            step("zero_addend", X1_Y2, 0, Code::OverLimit),
        ],
    ),
    (
        "returns OK when no limit applies",
        &[
            step("no_such_namespace", METHOD_GET, 1, Code::Ok),
            step("method_and_app", METHOD_GET, 1, Code::Ok),
        ],
    ),
    (
        "returns UNKNOWN when the domain is empty",
        &[step("", METHOD_GET, 1, Code::Unknown)],
    ),
];

fn request(s: &Step) -> RateLimitRequest {
    let descriptors = s.descriptors.iter().map(|d| desc(d)).collect();
    RateLimitRequest {
        hits_addend: s.hits_addend,
        ..req(s.domain, descriptors)
    }
}

scenario!(
    limitadors_examples_give_limitadors_answers,
    rules = LIMITS,
    |c, b| {
        // limitador's windows start at the first hit, sluice's fixed windows on multiples of
        // their length: keep every case clear of a minute's end on the wall clock (Redis).
        while b.memory_clock().is_none() && b.now_secs() % 60 >= 55 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        for (case, steps) in TABLE {
            for (i, s) in steps.iter().enumerate() {
                let r = call(&mut c, request(s)).await;
                assert_eq!(overall(&r), s.expect, "{case}: request {i}");
                assert!(
                    r.statuses.is_empty(),
                    "{case}: limitador answers no statuses"
                );
                assert!(
                    r.response_headers_to_add.is_empty(),
                    "{case}: no headers asked for"
                );
            }
        }
    }
);
