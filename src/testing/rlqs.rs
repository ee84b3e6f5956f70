//! An in-process sluice for the Rate Limit Quota Service tests: the server with handles on its
//! RLQS state, a stream of usage reports, and what an answer tells a bucket.

use std::net::SocketAddr;
use std::path::PathBuf;
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
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use super::SECOND;
use crate::app::{App, Listeners};
use crate::config::rules_file;
use crate::config::settings::Settings;
use crate::limiter::{Limiter, ManualClock, MemoryLimiter};
use crate::rlqs::Rlqs;
use crate::rules::RuleSet;

/// The rules `yaml`, compiled (e.g. to store in [`Server::rules`] for a reload).
///
/// # Panics
/// When the rules are invalid: this is test code.
pub fn rule_set(yaml: &str) -> RuleSet {
    let model = rules_file::from_sources(&[(PathBuf::from("test.yaml"), yaml.to_owned())])
        .unwrap_or_else(|e| panic!("test rules are invalid:\n{e}"));
    RuleSet::compile(model)
}

/// sluice in process on a loopback port (gRPC only), its limiter on a manual clock, with
/// handles on its RLQS state and its rules.
pub struct Server {
    pub addr: SocketAddr,
    pub rlqs: Arc<Rlqs>,
    pub rules: Arc<ArcSwap<RuleSet>>,
    pub clock: ManualClock,
    pub stop: CancellationToken,
    pub task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    /// Serves the rules `yaml` with `settings`.
    ///
    /// # Panics
    /// When the rules are invalid or no port can be bound: this is test code.
    pub async fn start(settings: Settings, yaml: &str) -> Server {
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
            grpc: listener.into(),
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

    pub async fn client(&self) -> RateLimitQuotaServiceClient<tonic::transport::Channel> {
        RateLimitQuotaServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to sluice")
    }

    /// A stream: where to send reports, and the answers.
    pub async fn open(&self) -> Stream {
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

/// One RLQS stream: where to send reports, and the answers.
pub struct Stream {
    pub tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    pub async fn send(&self, report: RateLimitQuotaUsageReports) {
        self.tx.send(report).await.expect("the stream is open");
    }

    /// The next answer, within 3 s.
    pub async fn next(&mut self) -> RateLimitQuotaResponse {
        match tokio::time::timeout(Duration::from_secs(3), self.answers.message()).await {
            Ok(Ok(Some(answer))) => answer,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    /// Nothing arrives within `wait`.
    pub async fn quiet(&mut self, wait: Duration) {
        if let Ok(got) = tokio::time::timeout(wait, self.answers.message()).await {
            panic!("expected nothing, got {got:?}");
        }
    }

    /// The status the stream ends with.
    pub async fn status(&mut self) -> tonic::Status {
        match tokio::time::timeout(Duration::from_secs(3), self.answers.message()).await {
            Ok(Err(status)) => status,
            other => panic!("expected a status, got {other:?}"),
        }
    }
}

/// A bucket id of `(key, value)` pairs.
pub fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// The usage of one bucket over `elapsed` seconds.
pub fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64, elapsed: i64) -> BucketQuotaUsage {
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

/// A report of domain `edge`.
pub fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: usages,
    }
}

/// What an answer tells a bucket, as `(max_tokens, tokens_per_fill, fill seconds)`, `DENY`,
/// `ALLOW` or `ABANDON`, with its TTL in seconds.
#[derive(Debug, PartialEq, Eq)]
pub enum Told {
    Bucket(u32, u32, i64, i64),
    Deny(i64),
    Allow(i64),
    Abandon,
}

/// What `action` tells.
pub fn told(action: &BucketAction) -> Told {
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
pub fn only(answer: &RateLimitQuotaResponse, pairs: &[(&str, &str)]) -> Told {
    assert_eq!(answer.bucket_action.len(), 1, "{answer:?}");
    let action = &answer.bucket_action[0];
    assert_eq!(action.bucket_id, Some(bucket(pairs)));
    told(action)
}
