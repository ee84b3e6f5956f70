//! One request, in domain types: validate, match every descriptor, make ONE limiter call for
//! all their limits, and assemble statuses, the overall code, headers and metadata.
//! Nothing here knows about tonic or protobuf, nor about metrics: what was decided goes to
//! an [`Observer`].
//!
//! Each request runs in a `should_rate_limit` span at debug level (domain, descriptor count,
//! result, latency), closed by one debug event; nothing per request is logged at info.

mod explain;
pub mod limitador;
mod observe;
mod plan;
mod response;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arc_swap::ArcSwap;
use tracing::Instrument as _;

use crate::config::model::{Algorithm, SLIDING_LOG_MAX_QUOTA, Unit};
use crate::config::settings::InputSettings;
use crate::limiter::{Batch, BatchOutcome, Limiter, LimiterError};
use crate::rules::{self, Entry, RuleSet};

pub use explain::{DescriptorWhy, Explanation, LimitWhy, Matched, RuleWhy};
pub use observe::{
    DescriptorReport, NamespaceReport, NoObserver, Observer, Observers, RequestResult,
};
pub use response::{Code, CurrentLimit, DescriptorStatus, Response};

/// A rate-limit request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// The request's cost; 0 means 1.
    pub hits_addend: u32,
}

/// One descriptor of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<Entry>,
    /// A limit sent by the client, used instead of the rules when the domain exists.
    pub limit: Option<Override>,
    /// This descriptor's own cost; wins over the request's; 0 checks without consuming.
    pub hits_addend: Option<u64>,
    /// Give the cost back instead of taking it.
    pub refund: bool,
}

/// A client-sent limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The limiter backend failed; nothing was decided.
    #[error(transparent)]
    Backend(#[from] LimiterError),
}

/// Names of the optional rate-limit response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
    /// Also add `Retry-After` when the request is over the limit.
    pub retry_after: bool,
}

/// Request-independent behaviour of the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Global shadow mode: an OVER_LIMIT overall answer becomes OK (statuses keep their code).
    pub shadow_mode: bool,
    /// Global quota mode: every descriptor with limits (not in shadow mode) is a quota-mode one.
    pub quota_mode: bool,
    /// Add rate-limit headers to `response_headers_to_add`.
    pub headers: Option<HeaderNames>,
    /// Echo the request in `dynamic_metadata`.
    pub echo_metadata: bool,
    /// Bounds on the shape of a request; beyond them it is `InvalidArgument`.
    pub input: InputSettings,
}

/// Decides requests against the current rules with one limiter.
pub struct Engine {
    rules: Arc<ArcSwap<RuleSet>>,
    limiter: Arc<dyn Limiter>,
    options: Options,
    observer: Arc<dyn Observer>,
}

impl Engine {
    /// `rules` is shared with whoever reloads them; each request uses one snapshot.
    pub fn new(rules: Arc<ArcSwap<RuleSet>>, limiter: Arc<dyn Limiter>, options: Options) -> Self {
        Engine {
            rules,
            limiter,
            options,
            observer: Arc::new(NoObserver),
        }
    }

    /// The limiter the engine asks (shared with the other services on the gRPC port; admin
    /// `/counters` reads it too).
    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.limiter
    }

    /// The same engine, reporting what it decides to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// The bounds on requests this engine enforces.
    pub fn input_limits(&self) -> &InputSettings {
        &self.options.input
    }

    /// The name of the limiter backend.
    pub fn backend_name(&self) -> &'static str {
        self.limiter.name()
    }

    /// Global shadow mode (`rules.shadow_mode`).
    pub fn shadow_mode(&self) -> bool {
        self.options.shadow_mode
    }

    /// One batch straight to the limiter, for callers that plan their own hits (RLQS usage
    /// reports); nothing is observed. The answer has one outcome per hit.
    pub async fn check_batch(&self, batch: &Batch) -> Result<BatchOutcome, LimiterError> {
        check_whole(&*self.limiter, batch).await
    }

    /// Answers one request.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Response, EngineError> {
        let span = tracing::debug_span!(
            "should_rate_limit",
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            result = tracing::field::Empty,
            latency_us = tracing::field::Empty,
        );
        let started = tokio::time::Instant::now();
        let answer = self.decide(request).instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let result = match &answer {
            Ok(r) if r.overall_code != Code::OverLimit => RequestResult::Ok,
            Ok(_) => RequestResult::OverLimit,
            Err(EngineError::InvalidArgument(_)) => RequestResult::Invalid,
            Err(EngineError::Backend(e)) => RequestResult::Unavailable(e),
        };
        span.record("result", result.as_str());
        span.record(
            "latency_us",
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        );
        span.in_scope(|| tracing::debug!("answered"));
        self.observer.request(result, elapsed);
        answer
    }

    async fn decide(&self, request: &Request) -> Result<Response, EngineError> {
        let rules = self.rules.load_full();
        if !rules.namespaces().is_empty() {
            if request.domain.is_empty() {
                return Ok(limitador::unknown());
            }
            let ns = rules.namespaces().get(&request.domain);
            if ns.is_some() || rules.domain(&request.domain).is_none() {
                validate(request, &self.options.input)?;
                return self.decide_namespace(ns, request).await;
            }
        }
        validate(request, &self.options.input)?;
        let domain = rules.domain(&request.domain);
        match domain {
            Some(d) => check_overrides(request, d.defaults().algorithm)?,
            None => self
                .observer
                .unknown_domain(&request.domain, request.descriptors.len()),
        }
        let modes = plan::Modes {
            quota_mode: self.options.quota_mode,
        };
        let planned = plan::plan_request(domain, request, modes);
        if let Some(message) = &planned.bad_hold_id {
            return Err(invalid(message.clone()));
        }
        let outcome = if planned.batch.hits.is_empty() {
            BatchOutcome {
                hits: Vec::new(),
                admitted: true,
            }
        } else {
            check_whole(&*self.limiter, &planned.batch).await?
        };
        observe::report(&*self.observer, request, &planned, &outcome, &self.options);
        Ok(response::assemble(
            request,
            &planned,
            &outcome,
            &self.options,
        ))
    }
}

impl Engine {
    /// Decides a request against the limitador namespace named by its domain, counting as
    /// `counting` says, observed (the Kuadrant service). An empty domain is `Unknown`; a
    /// domain that is no namespace is `Ok` with `known` false.
    pub async fn decide_limitador(
        &self,
        request: &Request,
        counting: limitador::Counting,
    ) -> Result<limitador::Answer, EngineError> {
        let asked = limitador::Asked {
            observe: true,
            headers: false,
        };
        self.decide_limitador_as(request, counting, asked).await
    }

    /// [`Engine::decide_limitador`], observed and with headers as `asked` says (limitador's
    /// HTTP API: only `/check_and_report` is observed, and it may ask for headers).
    pub async fn decide_limitador_as(
        &self,
        request: &Request,
        counting: limitador::Counting,
        asked: limitador::Asked,
    ) -> Result<limitador::Answer, EngineError> {
        if request.domain.is_empty() {
            return Ok(limitador::Answer {
                code: Code::Unknown,
                limited_by: None,
                known: false,
                headers: Vec::new(),
            });
        }
        validate(request, &self.options.input)?;
        let rules = self.rules.load_full();
        let Some(ns) = rules.namespaces().get(&request.domain) else {
            if asked.observe {
                let mut nothing = limitador::Decision::nothing();
                nothing.cost = u64::from(request.hits_addend.max(1));
                self.observer
                    .namespace(&nothing.report(request, false, counting));
            }
            return Ok(limitador::Answer {
                code: Code::Ok,
                limited_by: None,
                known: false,
                headers: Vec::new(),
            });
        };
        let decision = limitador::decide(ns, request, counting, &*self.limiter).await?;
        if asked.observe {
            self.observer
                .namespace(&decision.report(request, true, counting));
        }
        Ok(limitador::Answer::of(&decision, asked.headers))
    }

    /// A request while limitador-format namespaces are loaded, to one of them or to a domain
    /// that is neither a namespace nor a ratelimit domain (answered as limitador does: OK,
    /// without statuses).
    async fn decide_namespace(
        &self,
        ns: Option<&rules::limitador::Namespace>,
        request: &Request,
    ) -> Result<Response, EngineError> {
        let counting = limitador::Counting::CheckAndCount;
        let Some(ns) = ns else {
            self.observer
                .unknown_domain(&request.domain, request.descriptors.len());
            let mut nothing = limitador::Decision::nothing();
            nothing.cost = u64::from(request.hits_addend.max(1));
            self.observer
                .namespace(&nothing.report(request, false, counting));
            return Ok(limitador::response(&nothing, &self.options));
        };
        let decision = limitador::decide(ns, request, counting, &*self.limiter).await?;
        self.observer
            .namespace(&decision.report(request, true, counting));
        Ok(limitador::response(&decision, &self.options))
    }
}

/// Rejects what no answer can be given for, and what is beyond the input bounds (before
/// anything is matched, keyed or logged per value).
fn validate(request: &Request, bounds: &InputSettings) -> Result<(), EngineError> {
    if request.domain.is_empty() {
        return Err(invalid("rate limit domain must not be empty".to_owned()));
    }
    let domain = request.domain.len();
    within(domain, bounds.max_domain_bytes, "max_domain_bytes", || {
        format!("domain: {domain} bytes")
    })?;
    let count = request.descriptors.len();
    if count == 0 {
        return Err(invalid(
            "rate limit descriptor list must not be empty".to_owned(),
        ));
    }
    within(count, bounds.max_descriptors, "max_descriptors", || {
        format!("{count} descriptors")
    })?;
    for (i, d) in request.descriptors.iter().enumerate() {
        let n = d.entries.len();
        within(n, bounds.max_entries, "max_entries", || {
            format!("descriptors[{i}]: {n} entries")
        })?;
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return Err(invalid(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                )));
            }
            let (k, v) = (e.key.len(), e.value.len());
            within(k, bounds.max_key_bytes, "max_key_bytes", || {
                format!("descriptors[{i}].entries[{j}].key: {k} bytes")
            })?;
            within(v, bounds.max_value_bytes, "max_value_bytes", || {
                format!("descriptors[{i}].entries[{j}].value: {v} bytes")
            })?;
        }
    }
    Ok(())
}

/// Refuses a client's limit override that the rules would refuse: under a `sliding_log` or
/// `concurrency` default, one above its quota cap. (Overrides are used only when the domain
/// exists.)
fn check_overrides(request: &Request, algorithm: Algorithm) -> Result<(), EngineError> {
    let what = match algorithm {
        Algorithm::SlidingLog => "keeps one entry per admitted request",
        Algorithm::Concurrency => "keeps one hold per admitted request",
        _ => return Ok(()),
    };
    let name = algorithm.as_str();
    for (i, d) in request.descriptors.iter().enumerate() {
        if let Some(limit) = d.limit
            && limit.requests_per_unit > SLIDING_LOG_MAX_QUOTA
            && !d.entries.is_empty()
        {
            return Err(invalid(format!(
                "descriptors[{i}].limit.requests_per_unit: {name} {what}: an override must be \
                 at most {SLIDING_LOG_MAX_QUOTA} with it, got {} (the domain's default \
                 algorithm is {name})",
                limit.requests_per_unit
            )));
        }
    }
    Ok(())
}

fn invalid(message: String) -> EngineError {
    EngineError::InvalidArgument(message)
}

/// `value` must not exceed the bound `input.<setting>` = `max`; the error says what is over
/// (`what`), by how much, and which setting bounds it.
fn within(
    value: usize,
    max: usize,
    setting: &str,
    what: impl FnOnce() -> String,
) -> Result<(), EngineError> {
    if value <= max {
        return Ok(());
    }
    Err(invalid(format!(
        "{}, more than input.{setting} = {max}",
        what()
    )))
}

/// `limiter`'s answer to `batch`, which must have one outcome per hit: a backend that answers
/// otherwise has failed.
pub(crate) async fn check_whole(
    limiter: &dyn Limiter,
    batch: &Batch,
) -> Result<BatchOutcome, LimiterError> {
    let outcome = limiter.check(batch).await?;
    if outcome.hits.len() != batch.hits.len() {
        return Err(LimiterError {
            backend: limiter.name(),
            message: format!(
                "answered {} hits for a batch of {}",
                outcome.hits.len(),
                batch.hits.len()
            ),
            transient: false,
            source: None,
        });
    }
    Ok(outcome)
}
