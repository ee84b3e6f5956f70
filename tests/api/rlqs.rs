//! The Rate Limit Quota Service (RLQS) in process, over real gRPC with the `envoy-types` client
//! (generated from Envoy's own protos): assignments, the shared quota with RLS, blanket deny
//! and its lift, rebalancing, reloads, malformed reports, drain, reflection (grpcurl speaks
//! v1alpha). (Its bounds under stress, which read the process's memory, are in tests/serial/;
//! a real Envoy on the shipped recipe is in tests/deploy/.)

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use sluice::config::settings::Settings;
use sluice::testing::SECOND;
use sluice::testing::rlqs::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const RULES: &str = "
domain: edge
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    value: internal
    rate_limit: {unlimited: true}
  - key: tenant
    value: quiet
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
";

const ACME: &[(&str, &str)] = &[("tenant", "acme")];

#[tokio::test]
async fn usage_is_charged_to_the_rls_state_and_a_spent_quota_is_denied_until_it_refills() {
    let server = Server::start(Settings::default(), RULES).await;
    let mut s = server.open().await;
    // First report of a bucket: the one request that created it; the whole rate, and what is
    // left of the burst (10 - 1) as capacity.
    s.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    assert_eq!(only(&s.next().await, ACME), Told::Bucket(9, 10, 1, 15));
    // 5 s at the assigned rate: the same bucket again (Envoy keeps its tokens).
    server.clock.advance(5 * SECOND);
    s.send(report(vec![usage(ACME, 59, 190, 5)])).await;
    assert_eq!(only(&s.next().await, ACME), Told::Bucket(9, 10, 1, 15));
    // Far more than the rate allows: the shared state is in debt; a blanket deny.
    server.clock.advance(5 * SECOND);
    s.send(report(vec![usage(ACME, 200, 0, 5)])).await;
    assert_eq!(only(&s.next().await, ACME), Told::Deny(15));
    // RLS traffic on the same rule sees the same state.
    let mut rls = envoy_types_rls(server.addr).await;
    assert_eq!(
        rls_code(&mut rls).await,
        2,
        "OVER_LIMIT while RLQS usage is in debt"
    );
    // The debt is paid back with time; the server pushes a token bucket on its own.
    s.quiet(Duration::from_millis(600)).await;
    server.clock.advance(30 * SECOND);
    let lifted = only(&s.next().await, ACME);
    assert!(
        matches!(lifted, Told::Bucket(_, 10, 1, 15)),
        "a token bucket again: {lifted:?}"
    );
    assert_eq!(rls_code(&mut rls).await, 1, "RLS admitted again");
}

type RlsClient = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>;

async fn envoy_types_rls(addr: SocketAddr) -> RlsClient {
    RlsClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// The overall code of one RLS request for `tenant=acme`, cost 0 (a check).
async fn rls_code(client: &mut RlsClient) -> i32 {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: "acme".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    client
        .should_rate_limit(request)
        .await
        .expect("an answer")
        .into_inner()
        .overall_code
}

#[tokio::test]
async fn unmatched_buckets_get_nothing_and_a_removed_rule_is_abandoned() {
    let server = Server::start(Settings::default(), RULES).await;
    let mut s = server.open().await;
    let other = &[("tenant", "other")];
    let internal = &[("tenant", "internal")];
    let quiet = &[("tenant", "quiet")];
    let two_keys = &[("tenant", "acme"), ("route", "/")];
    s.send(report(vec![
        usage(other, 1, 0, 0),
        usage(internal, 1, 0, 0),
        usage(two_keys, 1, 0, 0),
        usage(quiet, 50, 0, 0),
        usage(ACME, 1, 0, 0),
    ]))
    .await;
    let answer = s.next().await;
    let ids: Vec<_> = answer
        .bucket_action
        .iter()
        .map(|a| a.bucket_id.clone())
        .collect();
    assert_eq!(
        ids,
        vec![
            Some(bucket(internal)),
            Some(bucket(quiet)),
            Some(bucket(ACME))
        ],
        "no action for buckets no rule matches"
    );
    assert_eq!(told(&answer.bucket_action[0]), Told::Allow(15), "unlimited");
    assert_eq!(
        told(&answer.bucket_action[1]),
        Told::Allow(15),
        "shadow mode"
    );
    assert!(matches!(told(&answer.bucket_action[2]), Told::Bucket(..)));
    assert_eq!(server.rlqs.buckets(), 3);
    // A reload without the acme rule: its bucket is abandoned at once (no report needed).
    server.rules.store(Arc::new(rule_set(
        "domain: edge\ndescriptors:\n  - key: tenant\n    value: internal\n    rate_limit: {unlimited: true}\n",
    )));
    let answer = s.next().await;
    let abandoned: Vec<_> = answer.bucket_action.iter().map(told).collect();
    assert_eq!(abandoned, vec![Told::Abandon, Told::Abandon]);
    assert_eq!(server.rlqs.buckets(), 1);
}

#[tokio::test]
async fn members_share_the_rate_and_rebalance_as_they_come_and_go() {
    let server = Server::start(Settings::default(), RULES).await;
    let mut a = server.open().await;
    a.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    assert!(matches!(
        only(&a.next().await, ACME),
        Told::Bucket(_, 10, 1, _)
    ));
    let mut b = server.open().await;
    b.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    assert!(matches!(
        only(&b.next().await, ACME),
        Told::Bucket(_, 5, 1, _)
    ));
    // A is told its new share without waiting for its next report.
    assert!(matches!(
        only(&a.next().await, ACME),
        Told::Bucket(_, 5, 1, _)
    ));
    assert_eq!(server.rlqs.members(), 2);
    // B reports a small demand (1/s): A may have the rest.
    server.clock.advance(5 * SECOND);
    b.send(report(vec![usage(ACME, 5, 0, 5)])).await;
    assert!(matches!(
        only(&b.next().await, ACME),
        Told::Bucket(_, 2, 1, _)
    ));
    server.clock.advance(5 * SECOND);
    a.send(report(vec![usage(ACME, 25, 200, 5)])).await;
    assert!(matches!(
        only(&a.next().await, ACME),
        Told::Bucket(_, 8, 1, _)
    ));
    // B goes away: A gets everything back.
    drop(b);
    assert!(matches!(
        only(&a.next().await, ACME),
        Told::Bucket(_, 10, 1, _)
    ));
    assert_eq!(server.rlqs.members(), 1);
}

#[tokio::test]
async fn malformed_reports_end_the_stream_with_invalid_argument() {
    let server = Server::start(Settings::default(), RULES).await;
    let cases: Vec<(RateLimitQuotaUsageReports, &str)> = vec![
        (
            RateLimitQuotaUsageReports {
                domain: String::new(),
                bucket_quota_usages: vec![usage(ACME, 1, 0, 0)],
            },
            "domain: the first report of a stream must name the rules domain",
        ),
        (
            report(vec![BucketQuotaUsage {
                bucket_id: None,
                ..usage(ACME, 1, 0, 0)
            }]),
            "bucket_quota_usages[0].bucket_id is required",
        ),
        (
            report(vec![usage(ACME, 1, 0, 0), usage(&[], 1, 0, 0)]),
            "bucket_quota_usages[1].bucket_id.bucket must have at least one entry",
        ),
        (
            report(vec![usage(&[("tenant", "")], 1, 0, 0)]),
            "bucket_quota_usages[0].bucket_id.bucket: keys and values must not be empty",
        ),
        (
            report(vec![usage(ACME, 1, 0, -5)]),
            "bucket_quota_usages[0].time_elapsed must not be negative",
        ),
    ];
    for (bad, message) in cases {
        let mut s = server.open().await;
        s.send(bad).await;
        let status = s.status().await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(message), "{status:?}");
    }
    // A later report naming another domain.
    let mut s = server.open().await;
    s.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    s.next().await;
    s.send(RateLimitQuotaUsageReports {
        domain: "other".into(),
        bucket_quota_usages: vec![],
    })
    .await;
    assert_eq!(s.status().await.code(), tonic::Code::InvalidArgument);
    // The server still serves.
    let mut s = server.open().await;
    s.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    assert!(matches!(only(&s.next().await, ACME), Told::Bucket(..)));
}

#[tokio::test]
async fn streams_beyond_the_bound_are_refused_and_health_names_the_service() {
    let mut settings = Settings::default();
    settings.rlqs.max_streams = 2;
    let server = Server::start(settings, RULES).await;
    let mut a = server.open().await;
    let _b = server.open().await;
    let (_tx, rx) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let refused = server
        .client()
        .await
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .expect_err("a third stream is refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("rlqs.max_streams = 2"),
        "{refused:?}"
    );
    a.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    a.next().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("a URL")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.rate_limit_quota.v3.RateLimitQuotaService".into(),
        })
        .await
        .expect("health answers")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn streams_end_cleanly_when_the_server_drains() {
    let mut server = Server::start(Settings::default(), RULES).await;
    let mut s = server.open().await;
    s.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    s.next().await;
    server.stop.cancel();
    let end = tokio::time::timeout(Duration::from_secs(3), s.answers.message()).await;
    assert!(matches!(end, Ok(Ok(None))), "ends with OK: {end:?}");
    let task = server.task.take().expect("running");
    let ran = tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the server stops although an RLQS stream was open");
    ran.expect("joined").expect("a clean stop");
    assert_eq!(server.rlqs.streams(), 0);
    assert_eq!(server.rlqs.buckets(), 0);
}

#[tokio::test]
async fn buckets_no_longer_reported_are_forgotten() {
    let mut settings = Settings::default();
    settings.rlqs.assignment_ttl_secs = 1;
    let server = Server::start(settings, RULES).await;
    let mut s = server.open().await;
    s.send(report(vec![
        usage(ACME, 1, 0, 0),
        usage(&[("tenant", "internal")], 1, 0, 0),
    ]))
    .await;
    assert_eq!(s.next().await.bucket_action.len(), 2);
    assert_eq!((server.rlqs.buckets(), server.rlqs.members()), (2, 1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.rlqs.buckets() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "state not dropped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((server.rlqs.members(), server.rlqs.streams()), (0, 1));
    // Reported again: a first report again.
    s.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    assert!(matches!(only(&s.next().await, ACME), Told::Bucket(..)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_and_v1alpha_list_the_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let server = Server::start(Settings::default(), RULES).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("a URL")
        .connect()
        .await
        .expect("connect");
    let mut v1 = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = v1
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1 answers")
        .into_inner();
    let answer = answers.message().await.expect("a message").expect("one");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"envoy.service.rate_limit_quota.v3.RateLimitQuotaService".to_owned()),
        "{names:?}"
    );
    // grpcurl speaks v1alpha.
    let grpcurl = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/grpcurl");
    assert!(
        grpcurl.is_file(),
        "grpcurl missing: run ./tests/run (it installs it)"
    );
    let out = tokio::process::Command::new(&grpcurl)
        .args(["-plaintext", &server.addr.to_string(), "describe"])
        .arg("envoy.service.rate_limit_quota.v3.RateLimitQuotaService")
        .output()
        .await
        .expect("run grpcurl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("rpc StreamRateLimitQuotas ( stream .envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports )"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_zero_quota_is_denied_without_repeating_itself() {
    let yaml = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 0}\n";
    let server = Server::start(Settings::default(), yaml).await;
    let mut s = server.open().await;
    let t = &[("tenant", "zero")];
    s.send(report(vec![usage(t, 1, 0, 0)])).await;
    assert_eq!(only(&s.next().await, t), Told::Deny(15));
    s.quiet(Duration::from_millis(1500)).await;
    s.send(report(vec![usage(t, 0, 40, 5)])).await;
    assert_eq!(
        only(&s.next().await, t),
        Told::Deny(15),
        "renewed at each report"
    );
}
