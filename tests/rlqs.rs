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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_buckets_and_dozens_of_streams_stay_within_their_bounds() {
    const STREAMS: usize = 40;
    const BUCKETS: usize = 300;
    let mut settings = Settings::default();
    settings.rlqs.max_buckets = 6_000;
    settings.rlqs.max_buckets_per_stream = 200;
    // Long enough that nothing expires while a loaded machine sets the streams up.
    settings.rlqs.assignment_ttl_secs = 120;
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
    assert_eq!(server.rlqs.streams(), STREAMS);
    drop(streams);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.rlqs.streams() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "streams not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((server.rlqs.buckets(), server.rlqs.members()), (0, 0));
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

// ---------------------------------------------------------------------------------------
// Through a real Envoy.
// ---------------------------------------------------------------------------------------

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/envoy")
        .join(name)
}

/// An Envoy running `deploy/envoy/rlqs.yaml` on loopback ports.
struct Proxy {
    port: u16,
    envoy: envoy::EnvoyProcess,
}

impl Proxy {
    async fn start(upstream: u16, sluice: u16) -> Proxy {
        let mut config = std::fs::read_to_string(deploy_file("rlqs.yaml")).expect("the recipe");
        let (port, admin) = (stack::free_port(), stack::free_port());
        for (from, to) in [
            ("address: 127.0.0.1, port_value: 9901", admin),
            ("address: 0.0.0.0, port_value: 10000", port),
            ("address: app, port_value: 8000", upstream),
            ("address: sluice, port_value: 8081", sluice),
        ] {
            let to = format!("address: 127.0.0.1, port_value: {to}");
            config = envoy::replace_once(&config, from, &to);
        }
        Proxy {
            port,
            envoy: envoy::EnvoyProcess::start(&config, admin).await,
        }
    }
}

/// Answers by status over a load run.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    ok: u64,
    denied: u64,
    other: u64,
}

/// `rate` requests per second for `tenant` through `port`, for `secs` seconds; each answer's
/// status with the time it was sent (seconds since the start).
async fn load(port: u16, tenant: &'static str, rate: u64, secs: u64) -> Vec<(f64, u16)> {
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_nanos(SECOND / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..rate * secs {
        tick.tick().await;
        let at = started.elapsed().as_secs_f64();
        sent.spawn(async move {
            let answer =
                http_client::get(stack::loopback(port), "/", &[("x-tenant", tenant)]).await;
            (at, answer.status)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = sent.join_next().await {
        answers.push(done.expect("a request task"));
    }
    answers.sort_by(|a, b| a.0.total_cmp(&b.0));
    answers
}

fn tally(answers: &[(f64, u16)]) -> Tally {
    let mut t = Tally::default();
    for &(_, status) in answers {
        match status {
            200 => t.ok += 1,
            429 => t.denied += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// The bound of docs/rlqs.md for a limit of `rate` per second and burst `burst` over `secs`
/// seconds, `envoys` Envoys starting together on `replicas` sluice replicas: the rate over
/// the window, the first buckets and their one rebalancing (2 x burst), 3 per Envoy (the
/// request that creates its bucket, and rounding), and, per extra replica, the rate for one
/// report period and a second (5 + 1 s) before the shared state shows the excess.
fn bound(rate: u64, burst: u64, secs: u64, envoys: u64, replicas: u64) -> u64 {
    rate * secs + 2 * burst + 3 * envoys + (replicas - 1) * rate * 6
}

/// Checks a run of `envoys` Envoys at 50/s each on the 10/s bucket for 10 s.
fn assert_within_bound(what: &str, t: Tally, envoys: u64, replicas: u64) {
    let max = bound(10, 10, 10, envoys, replicas);
    eprintln!("{what}: {t:?}, bound {max}");
    assert_eq!(t.other, 0, "{what}: only 200 and 429 expected: {t:?}");
    assert!(
        t.ok <= max,
        "{what}: {} admitted, above the bound {max}",
        t.ok
    );
    // Not starved either: at least 60% of the rate over the run.
    assert!(t.ok >= 60, "{what}: only {} admitted", t.ok);
    assert!(t.denied > 0, "{what}: nothing denied: {t:?}");
}

async fn metric(admin_port: u16, line_start: &str) -> Option<f64> {
    let answer = http_client::get(stack::loopback(admin_port), "/metrics", &[]).await;
    answer
        .body
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// One Envoy: the 10/s tenant within the bound; a tenant with no rule follows
/// no_assignment_behavior (allow all); an unlimited one is allowed.
async fn one_envoy(upstream: u16) {
    let sluice = stack::Sluice::start(&deploy_file("rlqs-rules.yaml"), &[]).await;
    let proxy = Proxy::start(upstream, sluice.grpc_port).await;
    let (acme, other, internal) = tokio::join!(
        load(proxy.port, "acme", 50, 10),
        load(proxy.port, "other", 20, 10),
        load(proxy.port, "internal", 20, 10),
    );
    assert_within_bound("one Envoy", tally(&acme), 1, 1);
    let other = tally(&other);
    assert_eq!(
        (other.ok, other.denied),
        (200, 0),
        "no rule: allowed, {other:?}"
    );
    let internal = tally(&internal);
    assert_eq!(
        (internal.ok, internal.denied),
        (200, 0),
        "unlimited: {internal:?}"
    );
    // sluice holds acme and internal; "other" got no assignment and holds no state.
    let held = metric(sluice.admin_port, "sluice_rlqs_buckets ").await;
    assert_eq!(
        held,
        Some(2.0),
        "buckets held; Envoy log:\n{}",
        proxy.envoy.log()
    );
    let allowed = metric(
        sluice.admin_port,
        "sluice_rlqs_reported_requests_total{domain=\"edge\",rule=\"tenant_acme\",result=\"allowed\"}",
    )
    .await;
    assert!(
        allowed.is_some_and(|n| n > 0.0),
        "per-rule report counters: {allowed:?}"
    );
}

/// Two Envoys on one sluice share the bucket: the same bound in total.
async fn two_envoys(upstream: u16) {
    let sluice = stack::Sluice::start(&deploy_file("rlqs-rules.yaml"), &[]).await;
    let (a, b) = tokio::join!(
        Proxy::start(upstream, sluice.grpc_port),
        Proxy::start(upstream, sluice.grpc_port),
    );
    let (ra, rb) = tokio::join!(load(a.port, "acme", 50, 10), load(b.port, "acme", 50, 10));
    let (ta, tb) = (tally(&ra), tally(&rb));
    eprintln!("two Envoys: {ta:?} {tb:?}");
    let total = Tally {
        ok: ta.ok + tb.ok,
        denied: ta.denied + tb.denied,
        other: ta.other + tb.other,
    };
    assert_within_bound("two Envoys", total, 2, 1);
    assert!(
        ta.ok >= 15 && tb.ok >= 15,
        "both get a share: {ta:?} {tb:?}"
    );
}

/// sluice stopped: Envoy keeps enforcing its last assignment until its time to live, then
/// follows expired_assignment_behavior (allow all).
async fn sluice_stopped(upstream: u16) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let settings = dir.path().join("sluice.toml");
    std::fs::write(&settings, "[rlqs]\nassignment_ttl_secs = 7\n").expect("write settings");
    let extra = ["--config".to_owned(), settings.display().to_string()];
    let mut sluice = stack::Sluice::start(&deploy_file("rlqs-rules.yaml"), &extra).await;
    let proxy = Proxy::start(upstream, sluice.grpc_port).await;
    let port = proxy.port;
    let running = tokio::spawn(load(port, "acme", 50, 17));
    // The report at about 5 s renewed the assignment until about 12 s.
    tokio::time::sleep(Duration::from_secs(7)).await;
    sluice.stop();
    let answers = running.await.expect("the load run");
    let window = |from: f64, to: f64| {
        let part: Vec<_> = answers
            .iter()
            .copied()
            .filter(|(at, _)| *at >= from && *at < to)
            .collect();
        tally(&part)
    };
    let held = window(7.5, 10.5);
    eprintln!("sluice stopped, before the TTL: {held:?}");
    assert!(
        held.ok <= 3 * 10 + 10 && held.denied > 0,
        "the last assignment still applies: {held:?}"
    );
    let expired = window(13.5, 17.0);
    eprintln!("sluice stopped, after the TTL: {expired:?}");
    assert_eq!(
        expired.denied, 0,
        "expired: allow all, as configured: {expired:?}"
    );
    assert!(expired.ok > 100, "{expired:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_admits_within_the_bound_and_falls_back_as_configured() {
    envoy::binary();
    let upstream = stack::Upstream::start().await;
    tokio::join!(
        one_envoy(upstream.port),
        two_envoys(upstream.port),
        sluice_stopped(upstream.port),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_redis_and_two_replicas_shares_one_quota() {
    envoy::binary();
    let redis = redis_support::RedisServer::start();
    let upstream = stack::Upstream::start().await;
    let backend = [
        "--backend".to_owned(),
        "redis".to_owned(),
        "--redis-url".to_owned(),
        redis.url(),
    ];
    let rules = deploy_file("rlqs-rules.yaml");
    let (r1, r2) = tokio::join!(
        stack::Sluice::start(&rules, &backend),
        stack::Sluice::start(&rules, &backend),
    );
    let (a, b) = tokio::join!(
        Proxy::start(upstream.port, r1.grpc_port),
        Proxy::start(upstream.port, r2.grpc_port),
    );
    let (ra, rb) = tokio::join!(load(a.port, "acme", 50, 10), load(b.port, "acme", 50, 10));
    let (ta, tb) = (tally(&ra), tally(&rb));
    eprintln!("two replicas: {ta:?} {tb:?}");
    let total = Tally {
        ok: ta.ok + tb.ok,
        denied: ta.denied + tb.denied,
        other: ta.other + tb.other,
    };
    assert_within_bound("two Envoys on two replicas (Redis)", total, 2, 2);
    let keys: Vec<String> = redis.cmd(&["KEYS", "sluice:*"]);
    assert!(
        keys.iter().any(|k| k.contains("tenant=acme")),
        "the usage went to Redis: {keys:?}"
    );
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
