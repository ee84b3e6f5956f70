//! The Rate Limit Quota Service (RLQS).
//!
//! In process, over real gRPC with the `envoy-types` client (generated from Envoy's own
//! protos): assignments, the shared quota with RLS, blanket deny and its lift, rebalancing,
//! reloads, malformed reports, drain, bounds under stress.
//!
//! Through a real Envoy 1.40 (`deploy/envoy/rlqs.yaml`, the shipped recipe) and the real
//! `sluice` binary: admitted requests within the bound of docs/rlqs.md, alone, with two
//! Envoys, with the Redis backend and two replicas, and the fallbacks when sluice is gone.

#[path = "support/envoy.rs"]
mod envoy;
#[path = "support/http_client.rs"]
mod http_client;
#[path = "support/proc_stats.rs"]
mod proc_stats;
#[path = "support/redis.rs"]
mod redis_support;
#[path = "support/stack.rs"]
mod stack;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use sluice::app::{App, Listeners};
use sluice::config::rules::from_sources;
use sluice::config::settings::Settings;
use sluice::limiter::{Limiter, ManualClock, MemoryLimiter};
use sluice::rlqs::Rlqs;
use sluice::rules::RuleSet;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

const SECOND: u64 = 1_000_000_000;

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

fn rule_set(yaml: &str) -> RuleSet {
    let model = from_sources(&[(PathBuf::from("test.yaml"), yaml.to_owned())])
        .unwrap_or_else(|e| panic!("test rules are invalid:\n{e}"));
    RuleSet::compile(model)
}

/// sluice in process on a loopback port, its limiter on a manual clock.
struct Server {
    addr: SocketAddr,
    rlqs: Arc<Rlqs>,
    rules: Arc<ArcSwap<RuleSet>>,
    clock: ManualClock,
    stop: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    async fn start(settings: Settings, yaml: &str) -> Server {
        let clock = ManualClock::at(1_000 * SECOND);
        let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::with_clock(
            settings.memory.max_keys,
            clock.clone(),
        ));
        let app = App::from_parts(&settings, rule_set(yaml), limiter);
        let (rlqs, rules) = (app.rlqs(), app.rules());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let stop = CancellationToken::new();
        let listeners = Listeners {
            grpc: listener,
            admin: None,
        };
        let task = tokio::spawn(app.run(listeners, stop.clone().cancelled_owned()));
        Server {
            addr,
            rlqs,
            rules,
            clock,
            stop,
            task: Some(task),
        }
    }

    async fn client(&self) -> RateLimitQuotaServiceClient<tonic::transport::Channel> {
        RateLimitQuotaServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to sluice")
    }

    /// A stream: where to send reports, and the answers.
    async fn open(&self) -> Stream {
        let (tx, rx) = mpsc::channel(16);
        let answers = self
            .client()
            .await
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("the stream opens")
            .into_inner();
        Stream { tx, answers }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn send(&self, report: RateLimitQuotaUsageReports) {
        self.tx.send(report).await.expect("the stream is open");
    }

    /// The next answer, within 3 s.
    async fn next(&mut self) -> RateLimitQuotaResponse {
        match tokio::time::timeout(Duration::from_secs(3), self.answers.message()).await {
            Ok(Ok(Some(answer))) => answer,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    /// Nothing arrives within `wait`.
    async fn quiet(&mut self, wait: Duration) {
        if let Ok(got) = tokio::time::timeout(wait, self.answers.message()).await {
            panic!("expected nothing, got {got:?}");
        }
    }

    /// The status the stream ends with.
    async fn status(&mut self) -> tonic::Status {
        match tokio::time::timeout(Duration::from_secs(3), self.answers.message()).await {
            Ok(Err(status)) => status,
            other => panic!("expected a status, got {other:?}"),
        }
    }
}

fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64, elapsed: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(bucket(pairs)),
        time_elapsed: Some(PbDuration {
            seconds: elapsed,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: usages,
    }
}

/// What an answer tells a bucket, as `(max_tokens, tokens_per_fill, fill seconds)`, `DENY`,
/// `ALLOW` or `ABANDON`, with its TTL in seconds.
#[derive(Debug, PartialEq, Eq)]
enum Told {
    Bucket(u32, u32, i64, i64),
    Deny(i64),
    Allow(i64),
    Abandon,
}

fn told(action: &BucketAction) -> Told {
    match action.bucket_action.as_ref().expect("an action") {
        Action::AbandonAction(_) => Told::Abandon,
        Action::QuotaAssignmentAction(q) => {
            let ttl = q.assignment_time_to_live.expect("a TTL").seconds;
            let strategy = q
                .rate_limit_strategy
                .expect("a strategy")
                .strategy
                .expect("set");
            match strategy {
                Strategy::TokenBucket(tb) => Told::Bucket(
                    tb.max_tokens,
                    tb.tokens_per_fill.expect("tokens per fill").value,
                    tb.fill_interval.expect("an interval").seconds,
                    ttl,
                ),
                Strategy::BlanketRule(r) if r == BlanketRule::DenyAll as i32 => Told::Deny(ttl),
                Strategy::BlanketRule(_) => Told::Allow(ttl),
                Strategy::RequestsPerTimeUnit(_) => panic!("not enforced by Envoy"),
            }
        }
    }
}

/// The one action of an answer, for `pairs`.
fn only(answer: &RateLimitQuotaResponse, pairs: &[(&str, &str)]) -> Told {
    assert_eq!(answer.bucket_action.len(), 1, "{answer:?}");
    let action = &answer.bucket_action[0];
    assert_eq!(action.bucket_id, Some(bucket(pairs)));
    told(action)
}

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
    assert_eq!(rls_code(&mut rls).await, 2, "OVER_LIMIT while RLQS usage is in debt");
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
    let ids: Vec<_> = answer.bucket_action.iter().map(|a| a.bucket_id.clone()).collect();
    assert_eq!(
        ids,
        vec![Some(bucket(internal)), Some(bucket(quiet)), Some(bucket(ACME))],
        "no action for buckets no rule matches"
    );
    assert_eq!(told(&answer.bucket_action[0]), Told::Allow(15), "unlimited");
    assert_eq!(told(&answer.bucket_action[1]), Told::Allow(15), "shadow mode");
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
    assert!(matches!(only(&a.next().await, ACME), Told::Bucket(_, 10, 1, _)));
    let mut b = server.open().await;
    b.send(report(vec![usage(ACME, 1, 0, 0)])).await;
    assert!(matches!(only(&b.next().await, ACME), Told::Bucket(_, 5, 1, _)));
    // A is told its new share without waiting for its next report.
    assert!(matches!(only(&a.next().await, ACME), Told::Bucket(_, 5, 1, _)));
    assert_eq!(server.rlqs.members(), 2);
    // B reports a small demand (1/s): A may have the rest.
    server.clock.advance(5 * SECOND);
    b.send(report(vec![usage(ACME, 5, 0, 5)])).await;
    assert!(matches!(only(&b.next().await, ACME), Told::Bucket(_, 2, 1, _)));
    server.clock.advance(5 * SECOND);
    a.send(report(vec![usage(ACME, 25, 200, 5)])).await;
    assert!(matches!(only(&a.next().await, ACME), Told::Bucket(_, 8, 1, _)));
    // B goes away: A gets everything back.
    drop(b);
    assert!(matches!(only(&a.next().await, ACME), Told::Bucket(_, 10, 1, _)));
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
    assert!(refused.message().contains("rlqs.max_streams = 2"), "{refused:?}");
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
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_buckets_and_dozens_of_streams_stay_within_their_bounds() {
    const STREAMS: usize = 40;
    const BUCKETS: usize = 300;
    let mut settings = Settings::default();
    settings.rlqs.max_buckets = 6_000;
    settings.rlqs.max_buckets_per_stream = 200;
    settings.rlqs.assignment_ttl_secs = 4;
    let yaml = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
    let server = Server::start(settings, yaml).await;
    let rss_before = proc_stats::own_rss();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let mut stream = server.open().await;
        // Buckets 0..BUCKETS: the same tenants on every stream (shared states), in 3 reports.
        for chunk in (0..BUCKETS).collect::<Vec<_>>().chunks(100) {
            let usages = chunk
                .iter()
                .map(|b| usage(&[("tenant", &format!("t{b}"))], 1, 0, 0))
                .collect();
            stream.send(report(usages)).await;
        }
        // At most max_buckets_per_stream each, until max_buckets in all.
        let expected = 200.min(6_000usize.saturating_sub(200 * s));
        let mut assigned = 0;
        while assigned < expected {
            assigned += stream.next().await.bucket_action.len();
        }
        assert_eq!(assigned, expected, "stream {s}");
        if expected == 0 {
            stream.quiet(Duration::from_millis(200)).await;
        }
        streams.push(stream);
    }
    let held = server.rlqs.buckets();
    assert!(held <= 6_000, "held {held} buckets, above rlqs.max_buckets");
    assert_eq!(held, 6_000, "the total bound is reached: 40 x 200 asked");
    assert_eq!(server.rlqs.members(), held);
    let grown = proc_stats::own_rss().saturating_sub(rss_before);
    assert!(
        grown < 64 << 20,
        "{held} buckets on {STREAMS} streams took {} MiB",
        grown >> 20
    );
    // Reports stop: every bucket is forgotten after the TTL, the streams stay open.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.rlqs.buckets() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "state not dropped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.rlqs.members(), 0);
    assert_eq!(server.rlqs.streams(), STREAMS);
    drop(streams);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.rlqs.streams() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "streams not released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Through a real Envoy.
// ---------------------------------------------------------------------------------------

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/envoy")
        .join(name)
}
