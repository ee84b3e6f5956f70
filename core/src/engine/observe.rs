//! What the engine tells the outside about each request: the seam the metrics implement,
//! kept free of any metrics library.

use std::sync::Arc;
use std::time::Duration;

use super::limitador::Counting;
use super::plan::{Applies, Planned};
use super::{Descriptor, Options, Request, response};
use crate::limiter::{BatchOutcome, LimiterError};
use crate::rules::{Entry, Match};

/// Receives what the engine decided. Called on the request path: keep it cheap, never block.
pub trait Observer: Send + Sync + 'static {
    /// One call per descriptor that limits applied to (none for unknown domains, unmatched,
    /// unlimited or replaced descriptors), after the request was decided.
    fn descriptor(&self, _report: &DescriptorReport<'_>) {}

    /// A valid request for a domain the rules do not have, with its number of descriptors
    /// (each answered OK without a limit).
    fn unknown_domain(&self, _domain: &str, _descriptors: usize) {}

    /// A request whose overall answer was OVER_LIMIT and that the global shadow mode turned
    /// into OK (once per request, after its descriptors were reported).
    fn global_shadow(&self) {}

    /// One call per request, with its result and how long the engine took.
    fn request(&self, _result: RequestResult<'_>, _elapsed: Duration) {}

    /// One call per request decided against limitador-format namespaces (`ShouldRateLimit`
    /// while they are loaded, the Kuadrant service, limitador's `/check_and_report`), after
    /// it was decided; none when the backend failed.
    fn namespace(&self, _report: &NamespaceReport<'_>) {}
}

/// What a limitador-format namespace decided.
#[derive(Debug, Clone, Copy)]
pub struct NamespaceReport<'a> {
    /// The request's domain: a namespace, or a domain that is neither a namespace nor a
    /// ratelimit domain (`known` false).
    pub namespace: &'a str,
    /// The request's descriptors (what limitador's CEL metric labels read).
    pub descriptors: &'a [Descriptor],
    /// The namespace holds limits.
    pub known: bool,
    pub counting: Counting,
    /// Every applicable limit admitted the request (always, when counting only).
    pub admitted: bool,
    /// The name of the first limit that denied it, if it has one.
    pub limited_by: Option<&'a str>,
    /// The request's cost (`hits_addend`, 0 as 1).
    pub cost: u64,
    /// How long the limiter call took; `None` when no limit applied (no call was made).
    pub backend_elapsed: Option<Duration>,
}

/// Observes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// Several observers as one: each hears every call, in order (sluice's metrics, and
/// envoyproxy/ratelimit's stats when they are asked for).
#[derive(Default)]
pub struct Observers(Vec<Arc<dyn Observer>>);

impl Observers {
    /// No observer yet.
    pub fn new() -> Observers {
        Observers::default()
    }

    /// `observer` hears every call from now on, after those added before.
    pub fn with(mut self, observer: Arc<dyn Observer>) -> Observers {
        self.0.push(observer);
        self
    }
}

impl Observer for Observers {
    fn descriptor(&self, report: &DescriptorReport<'_>) {
        for o in &self.0 {
            o.descriptor(report);
        }
    }

    fn unknown_domain(&self, domain: &str, descriptors: usize) {
        for o in &self.0 {
            o.unknown_domain(domain, descriptors);
        }
    }

    fn global_shadow(&self) {
        for o in &self.0 {
            o.global_shadow();
        }
    }

    fn request(&self, result: RequestResult<'_>, elapsed: Duration) {
        for o in &self.0 {
            o.request(result, elapsed);
        }
    }

    fn namespace(&self, report: &NamespaceReport<'_>) {
        for o in &self.0 {
            o.namespace(report);
        }
    }
}

/// The verdict on one descriptor.
#[derive(Debug)]
pub struct DescriptorReport<'a> {
    pub domain: &'a str,
    /// The request's entries for this descriptor.
    pub entries: &'a [Entry],
    /// The rule matched, or `None` for a limit sent by the client (an override).
    pub matched: Option<&'a Match<'a>>,
    /// The descriptor's cost (0: check only).
    pub cost: u64,
    /// The cost is given back (`is_negative_hits`).
    pub refund: bool,
    /// Its own limits denied it (whatever shadow mode then made of that).
    pub over: bool,
    /// A denial here does not block the request: the rule's or the global shadow mode.
    pub shadow: bool,
    /// The rule itself is in shadow mode (`shadow_mode: true`), not only the global mode.
    pub rule_shadow: bool,
    /// The capacity (burst) of the limit reported: the one that denied, else the one with
    /// least left.
    pub capacity: u64,
    /// What is left of that limit after this request.
    pub remaining: u64,
    /// That limit's answer came from the limiter's local copy of an earlier denial (the
    /// Redis deny cache), without asking the backend.
    pub local_cache: bool,
}

impl DescriptorReport<'_> {
    /// The part of an admitted cost that used capacity beyond `ratio` of it (the near-limit
    /// counts): 0 for a denial or a refund. Metrics only: a float threshold is fine here
    /// (decisions never use floats).
    pub fn near_part(&self, ratio: f64) -> u64 {
        if self.over || self.refund {
            return 0;
        }
        let threshold = (self.capacity as f64 * ratio).floor() as u64;
        let used_after = self.capacity.saturating_sub(self.remaining);
        let used_before = used_after.saturating_sub(self.cost);
        if used_after <= threshold {
            0
        } else {
            used_after - used_before.max(threshold)
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
impl<'a> DescriptorReport<'a> {
    /// For tests: a descriptor of `domain` with `entries` and no rule (an override), costing 1,
    /// denied by a limit of capacity 1 with nothing left, from the backend; change a field with
    /// struct update syntax.
    pub fn denied(domain: &'a str, entries: &'a [Entry]) -> DescriptorReport<'a> {
        DescriptorReport {
            domain,
            entries,
            matched: None,
            cost: 1,
            refund: false,
            over: true,
            shadow: false,
            rule_shadow: false,
            capacity: 1,
            remaining: 0,
            local_cache: false,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy)]
pub enum RequestResult<'a> {
    Ok,
    OverLimit,
    /// A malformed request (`INVALID_ARGUMENT`).
    Invalid,
    /// The backend failed (`UNAVAILABLE`).
    Unavailable(&'a LimiterError),
}

impl RequestResult<'_> {
    pub fn as_str(&self) -> &'static str {
        match self {
            RequestResult::Ok => "ok",
            RequestResult::OverLimit => "over_limit",
            RequestResult::Invalid => "invalid",
            RequestResult::Unavailable(_) => "unavailable",
        }
    }
}

/// Reports every limited descriptor of a decided request, then whether the global shadow
/// mode let an over-limit request through.
pub(super) fn report(
    observer: &dyn Observer,
    request: &Request,
    planned: &Planned<'_>,
    outcome: &BatchOutcome,
    options: &Options,
) {
    for (d, plan) in request.descriptors.iter().zip(&planned.descriptors) {
        let Applies::Limits { limits, role } = &plan.applies else {
            continue;
        };
        let Some((rule, hit)) = response::chosen(limits, &outcome.hits) else {
            continue;
        };
        observer.descriptor(&DescriptorReport {
            domain: &request.domain,
            entries: &d.entries,
            matched: plan.matched.as_ref(),
            cost: plan.cost,
            refund: d.refund,
            over: !hit.admitted,
            shadow: role.is_shadow() || options.shadow_mode,
            rule_shadow: role.is_shadow(),
            capacity: u64::from(rule.burst),
            remaining: hit.remaining,
            local_cache: hit.from_local_cache,
        });
    }
    if !outcome.admitted && options.shadow_mode {
        observer.global_shadow();
    }
}
