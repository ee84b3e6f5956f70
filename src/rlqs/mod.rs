//! The Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): Envoy's
//! `rate_limit_quota` filter streams usage reports per bucket; sluice charges them to the same
//! limiter state as RLS traffic and answers each bucket with a token bucket carrying its
//! share of the rule's rate, or a blanket deny while the shared quota is spent.
//!
//! - [`share`]: the pure share computation (fair rates, token buckets, report allowance);
//! - [`bucket`]: a bucket id matched against the rules, planned into limiter hits;
//! - [`registry`]: the members (buckets of streams) of each shared state;
//! - `session`: one stream's buckets and timers; `wire`: protobuf in and out;
//! - this module: the tonic service and the stream loop (ends cleanly on drain).
//!
//! docs/rlqs.md states the behaviour and the bound it keeps.

pub mod bucket;
pub mod registry;
mod session;
pub mod share;
mod wire;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::config::settings::RlqsSettings;
use crate::engine::Engine;
use crate::proto::envoy::service::rate_limit_quota::v3 as pb;
use crate::rules::RuleSet;
use pb::rate_limit_quota_service_server::{RateLimitQuotaService, RateLimitQuotaServiceServer};
use registry::Registry;
use session::Session;

/// How often a stream looks at its timers (deny lifts, rebalancing, stale buckets, reloads).
const TICK: Duration = Duration::from_millis(250);

/// Receives what the quota service does (sluice's metrics implement it).
pub trait RlqsObserver: Send + Sync + 'static {
    /// What a data plane reported for a bucket of `rule`.
    fn reported(&self, domain: &str, rule: &str, allowed: u64, denied: u64);
    /// A stream opened (`+1`) or closed (`-1`).
    fn streams(&self, delta: i64);
    /// Buckets taken (`+n`) or dropped (`-n`).
    fn buckets(&self, delta: i64);
    /// One bucket action of `kind` sent (`token_bucket`, `deny_all`, `allow_all`, `abandon`).
    fn assigned(&self, kind: &'static str);
    /// A stream or a bucket (`kind`) refused at a bound.
    fn refused(&self, kind: &'static str);
}

impl RlqsObserver for () {
    fn reported(&self, _: &str, _: &str, _: u64, _: u64) {}
    fn streams(&self, _: i64) {}
    fn buckets(&self, _: i64) {}
    fn assigned(&self, _: &'static str) {}
    fn refused(&self, _: &'static str) {}
}

/// What every RLQS stream shares.
pub struct Rlqs {
    engine: Arc<Engine>,
    rules: Arc<ArcSwap<RuleSet>>,
    observer: Arc<dyn RlqsObserver>,
    settings: RlqsSettings,
    registry: Registry,
    streams: AtomicUsize,
    buckets: AtomicUsize,
    next_stream: AtomicU64,
}

impl Rlqs {
    pub fn new(
        engine: Arc<Engine>,
        rules: Arc<ArcSwap<RuleSet>>,
        observer: Arc<dyn RlqsObserver>,
        settings: RlqsSettings,
    ) -> Arc<Rlqs> {
        Arc::new(Rlqs {
            engine,
            rules,
            observer,
            settings,
            registry: Registry::default(),
            streams: AtomicUsize::new(0),
            buckets: AtomicUsize::new(0),
            next_stream: AtomicU64::new(0),
        })
    }

    /// The gRPC service; its streams end (status OK) when `closing` is cancelled.
    pub fn service(
        self: &Arc<Self>,
        closing: CancellationToken,
    ) -> RateLimitQuotaServiceServer<RlqsService> {
        let max = self.engine.input_limits().max_request_bytes;
        RateLimitQuotaServiceServer::new(RlqsService {
            ctx: self.clone(),
            closing,
        })
        .max_decoding_message_size(max)
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Buckets held over all streams.
    pub fn buckets(&self) -> usize {
        self.buckets.load(Ordering::Relaxed)
    }

    /// Members of shared states (one per held limited bucket).
    pub fn members(&self) -> usize {
        self.registry.members()
    }
}

/// The tonic service.
pub struct RlqsService {
    ctx: Arc<Rlqs>,
    closing: CancellationToken,
}

type Answers = Pin<Box<dyn Stream<Item = Result<pb::RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<pb::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let open = StreamSlot::take(&self.ctx)?;
        let id = self.ctx.next_stream.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(self.ctx.clone(), id);
        let state = Loop {
            session,
            inbound: request.into_inner(),
            closing: self.closing.clone(),
            tick: tick(),
            _open: open,
        };
        Ok(Response::new(Box::pin(futures_util::stream::unfold(
            Some(state),
            step,
        ))))
    }
}

/// One open stream counted against `rlqs.max_streams`; given back on drop.
struct StreamSlot(Arc<Rlqs>);

impl StreamSlot {
    fn take(ctx: &Arc<Rlqs>) -> Result<StreamSlot, Status> {
        let open = ctx.streams.fetch_add(1, Ordering::Relaxed);
        if open >= ctx.settings.max_streams {
            ctx.streams.fetch_sub(1, Ordering::Relaxed);
            ctx.observer.refused("stream");
            return Err(Status::resource_exhausted(format!(
                "{open} RLQS streams are open, rlqs.max_streams = {}",
                ctx.settings.max_streams
            )));
        }
        ctx.observer.streams(1);
        Ok(StreamSlot(ctx.clone()))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
        self.0.observer.streams(-1);
    }
}

struct Loop {
    session: Session,
    inbound: Streaming<pb::RateLimitQuotaUsageReports>,
    closing: CancellationToken,
    tick: tokio::time::Interval,
    _open: StreamSlot,
}

fn tick() -> tokio::time::Interval {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

type Step = Option<(Result<pb::RateLimitQuotaResponse, Status>, Option<Loop>)>;

/// Runs a stream until it has something to send: a report's answer, a timer's push, or its
/// end (the client closed, the server drains: OK; a malformed report: its status).
async fn step(state: Option<Loop>) -> Step {
    let mut st = state?;
    loop {
        let actions = tokio::select! {
            biased;
            () = st.closing.cancelled() => return None,
            report = st.inbound.next() => match report {
                Some(Ok(report)) => match st.session.report(report).await {
                    Ok(actions) => actions,
                    Err(status) => return Some((Err(status), None)),
                },
                Some(Err(status)) => {
                    tracing::debug!(%status, "rlqs stream failed");
                    return None;
                }
                None => return None,
            },
            _ = st.tick.tick() => st.session.tick().await,
        };
        if !actions.is_empty() {
            let answer = pb::RateLimitQuotaResponse {
                bucket_action: actions,
            };
            return Some((Ok(answer), Some(st)));
        }
    }
}
