//! The engine alone, over the memory limiter on a manual clock behind a counting wrapper:
//! validation, matching outcomes, roles (enforced, shadow, quota), statuses and the overall
//! code. (The gRPC and admin layers have their own tests under `tests/`.)

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;

use super::*;
use crate::config::rules_file::from_sources;
use crate::limiter::{Batch, BoxFuture, ManualClock, MemoryLimiter};
use Code::{Ok as Fine, OverLimit as Over};

const SECOND: u64 = 1_000_000_000;

const RULES: &str = "\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 2, name: a_limit}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: pass
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: qs
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// The memory limiter, counting its calls and the hits they carried.
struct Counting {
    inner: MemoryLimiter<ManualClock>,
    calls: AtomicUsize,
    hits: AtomicUsize,
}

impl Limiter for Counting {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.hits.fetch_add(batch.hits.len(), Ordering::SeqCst);
        self.inner.check(batch)
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}

/// A backend that answers with the wrong number of hits, or fails.
struct Broken {
    fail: bool,
}

impl Limiter for Broken {
    fn check<'a>(&'a self, _: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        let answer = if self.fail {
            Err(LimiterError {
                backend: "broken",
                message: "down".to_owned(),
                transient: true,
                source: None,
            })
        } else {
            Ok(BatchOutcome {
                hits: Vec::new(),
                admitted: true,
            })
        };
        Box::pin(std::future::ready(answer))
    }

    fn name(&self) -> &'static str {
        "broken"
    }
}

struct Fixture {
    engine: Engine,
    limiter: Arc<Counting>,
}

impl Fixture {
    fn new(options: Options) -> Fixture {
        let limiter = Arc::new(Counting {
            inner: MemoryLimiter::with_clock(1_000, ManualClock::at(SECOND)),
            calls: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
        });
        let engine = Engine::new(rules(), limiter.clone(), options);
        Fixture { engine, limiter }
    }

    async fn ask(&self, domain: &str, keys: &[&str]) -> Response {
        let request = request(domain, keys);
        match self.engine.should_rate_limit(&request).await {
            Ok(response) => response,
            Err(e) => panic!("{keys:?}: {e}"),
        }
    }

    fn calls(&self) -> usize {
        self.limiter.calls.load(Ordering::SeqCst)
    }

    fn hits(&self) -> usize {
        self.limiter.hits.load(Ordering::SeqCst)
    }
}

fn rules() -> Arc<ArcSwap<RuleSet>> {
    let model = from_sources(&[(PathBuf::from("r.yaml"), RULES.to_owned())])
        .unwrap_or_else(|e| panic!("{e}"));
    Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)))
}

/// One descriptor per key, each `key=v`.
fn request(domain: &str, keys: &[&str]) -> Request {
    Request {
        domain: domain.to_owned(),
        descriptors: keys
            .iter()
            .map(|k| Descriptor {
                entries: vec![Entry::new(*k, "v")],
                ..Descriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

fn codes(r: &Response) -> Vec<Code> {
    r.statuses.iter().map(|s| s.code).collect()
}

fn remaining(r: &Response) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

#[tokio::test]
async fn invalid_requests_are_refused_before_the_limiter() {
    let f = Fixture::new(Options::default());
    let mut cases = vec![
        (request("", &["a"]), "domain must not be empty"),
        (request("d", &[]), "descriptor list must not be empty"),
        (
            request("d", &[""]),
            "descriptors[0].entries[0].key must not be empty",
        ),
    ];
    let mut many = request("d", &["a"]);
    let too_many = Options::default().input.max_descriptors + 1;
    many.descriptors = vec![many.descriptors[0].clone(); too_many];
    cases.push((many, "more than input.max_descriptors"));
    let mut long = request("d", &["a"]);
    long.descriptors[0].entries[0].value = "x".repeat(Options::default().input.max_value_bytes + 1);
    cases.push((long, "descriptors[0].entries[0].value"));
    for (request, expected) in cases {
        match f.engine.should_rate_limit(&request).await {
            Err(EngineError::InvalidArgument(message)) => {
                assert!(message.contains(expected), "{message}");
            }
            other => panic!("{expected}: {other:?}"),
        }
    }
    assert_eq!(f.calls(), 0);
}

#[tokio::test]
async fn no_match_and_unlimited_answer_ok_without_a_limiter_call() {
    let f = Fixture::new(Options::default());
    for (domain, key, left) in [
        ("unknown", "a", 0),
        ("d", "nothing", 0),
        ("d", "pass", 0),
        ("d", "free", u32::MAX),
    ] {
        let r = f.ask(domain, &[key]).await;
        assert_eq!(r.overall_code, Fine, "{domain}/{key}");
        let s = &r.statuses[0];
        assert_eq!(
            (
                s.code,
                &s.current_limit,
                s.limit_remaining,
                s.duration_until_reset
            ),
            (Fine, &None, left, None),
            "{domain}/{key}"
        );
    }
    assert_eq!(f.calls(), 0);
}

#[tokio::test]
async fn one_limiter_call_per_request_with_every_limit() {
    let f = Fixture::new(Options::default());
    let r = f.ask("d", &["a", "free", "b", "nothing"]).await;
    assert_eq!((f.calls(), f.hits()), (1, 2));
    // Statuses in request order.
    assert_eq!(remaining(&r), [1, u32::MAX, 0, 0]);
    let a = r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit));
    assert_eq!(a, Some((2, Unit::Minute)));
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .and_then(|l| l.name.as_deref()),
        Some("a_limit")
    );
    assert_eq!(r.statuses[1].current_limit, None);
    assert_eq!(r.statuses[3].current_limit, None);
}

#[tokio::test]
async fn all_or_nothing_a_denial_consumes_nothing_anywhere() {
    let f = Fixture::new(Options::default());
    assert_eq!(f.ask("d", &["b"]).await.overall_code, Fine);
    // `b` is spent: the request is denied, and `a` keeps its quota.
    let denied = f.ask("d", &["a", "b"]).await;
    assert_eq!(denied.overall_code, Over);
    assert_eq!(codes(&denied), [Fine, Over]);
    // What is left after this request: all of `a`'s quota.
    assert_eq!(remaining(&denied), [2, 0]);
    assert!(denied.statuses[1].duration_until_reset >= Some(1));
    let a = f.ask("d", &["a"]).await;
    assert_eq!(remaining(&a), [1], "the denied request took nothing from a");
    assert_eq!(f.calls(), 3);
}

#[tokio::test]
async fn a_shadow_rule_is_counted_but_never_denies() {
    let f = Fixture::new(Options::default());
    f.ask("d", &["shadow"]).await;
    let r = f.ask("d", &["shadow", "a"]).await;
    assert_eq!(r.overall_code, Fine);
    assert_eq!(codes(&r), [Fine, Fine]);
    // Over its limit (nothing left) yet OK; and it did not stop `a` from consuming.
    assert_eq!(remaining(&r), [0, 1]);
    assert_eq!(remaining(&f.ask("d", &["a"]).await), [0]);
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_overall_and_keeps_the_statuses() {
    let f = Fixture::new(Options {
        shadow_mode: true,
        ..Options::default()
    });
    f.ask("d", &["b"]).await;
    let r = f.ask("d", &["b"]).await;
    assert_eq!((r.overall_code, codes(&r)), (Fine, vec![Over]));
}

#[tokio::test]
async fn quota_mode_denies_only_when_every_quota_descriptor_is_over() {
    let f = Fixture::new(Options::default());
    f.ask("d", &["q1"]).await;
    let one_over = f.ask("d", &["q1", "q2"]).await;
    assert_eq!(one_over.overall_code, Fine);
    assert_eq!(codes(&one_over), [Over, Fine]);
    let both_over = f.ask("d", &["q1", "q2"]).await;
    assert_eq!(both_over.overall_code, Over);
    assert_eq!(codes(&both_over), [Over, Over]);
    // An enforced descriptor over its limit denies whatever the quota ones say.
    f.ask("d", &["b"]).await;
    let enforced = f.ask("d", &["b"]).await;
    assert_eq!(enforced.overall_code, Over);
}

/// AI Gateway's shadow buckets: a descriptor in quota and shadow mode is reported OK even when
/// over, and counts among the quota descriptors, so quota mode cannot deny while it is there.
#[tokio::test]
async fn a_shadow_quota_descriptor_keeps_quota_mode_from_denying() {
    let f = Fixture::new(Options::default());
    f.ask("d", &["q1"]).await;
    f.ask("d", &["qs"]).await;
    let r = f.ask("d", &["q1", "qs"]).await;
    assert_eq!((r.overall_code, codes(&r)), (Fine, vec![Over, Fine]));
    let alone = f.ask("d", &["q1"]).await;
    assert_eq!(
        alone.overall_code, Over,
        "without it, the spent quota denies"
    );
}

#[tokio::test]
async fn global_quota_mode_makes_every_limited_descriptor_a_quota_one() {
    let f = Fixture::new(Options {
        quota_mode: true,
        ..Options::default()
    });
    f.ask("d", &["b"]).await;
    let r = f.ask("d", &["b", "a"]).await;
    assert_eq!((r.overall_code, codes(&r)), (Fine, vec![Over, Fine]));
}

#[tokio::test]
async fn backend_failures_and_short_answers_are_backend_errors() {
    for (fail, transient, text) in [(true, true, "down"), (false, false, "answered 0 hits")] {
        let engine = Engine::new(rules(), Arc::new(Broken { fail }), Options::default());
        match engine.should_rate_limit(&request("d", &["a"])).await {
            Err(EngineError::Backend(e)) => {
                assert_eq!((e.backend, e.transient), ("broken", transient));
                assert!(e.message.contains(text), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
