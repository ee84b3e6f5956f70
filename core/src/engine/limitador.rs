//! One request to a limitador-format namespace: every applicable limit, one batch, one verdict.
//!
//! The answer is limitador's: an overall code, no per-descriptor statuses (a namespace's
//! limits do not belong to descriptors), and the rate-limit headers when asked for.

use std::time::Duration;

use super::{Code, EngineError, HeaderNames, NamespaceReport, Options, Request, Response};
use crate::config::limitador::NamespaceLimit;
use crate::limiter::{Batch, BatchOutcome, Hit, HitOutcome, LimitParams, Limiter, Role};
use crate::rules::Entry;
use crate::rules::key;
use crate::rules::limitador::{Applied, Namespace};

/// How the request's cost is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Check and count, all or nothing (`ShouldRateLimit`, `/check_and_report`).
    CheckAndCount,
    /// Check only, counting nothing (`CheckRateLimit`, `/check`).
    CheckOnly,
    /// Count whatever the verdict (`Report`, `/report`).
    CountOnly,
}

/// One applicable limit and what the limiter said about it.
#[derive(Debug, Clone)]
pub struct LimitVerdict<'a> {
    pub limit: &'a NamespaceLimit,
    /// The variables' values, in the limit's order.
    pub values: Vec<String>,
    pub outcome: HitOutcome,
}

/// What a namespace decided.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    /// Every applicable limit admits the request (always true when counting only).
    pub admitted: bool,
    /// One per applicable limit, in file order.
    pub limits: Vec<LimitVerdict<'a>>,
    /// The request's cost (`hits_addend`, 0 as 1).
    pub cost: u64,
    /// How long the limiter call took; `None` when no limit applied.
    pub backend_elapsed: Option<Duration>,
}

impl Decision<'_> {
    /// No limit applied: admitted.
    pub fn nothing() -> Decision<'static> {
        Decision {
            admitted: true,
            limits: Vec::new(),
            cost: 1,
            backend_elapsed: None,
        }
    }

    /// What the observers hear of this decision on `request` (to its domain).
    pub fn report<'s>(
        &'s self,
        request: &'s Request,
        known: bool,
        counting: Counting,
    ) -> NamespaceReport<'s> {
        NamespaceReport {
            namespace: &request.domain,
            descriptors: &request.descriptors,
            known,
            counting,
            admitted: self.admitted,
            limited_by: self.limited_by(),
            cost: self.cost,
            backend_elapsed: self.backend_elapsed,
        }
    }

    /// The name of the first limit that denied the request, if it has one.
    pub fn limited_by(&self) -> Option<&str> {
        self.limits
            .iter()
            .find(|l| !l.outcome.admitted)
            .and_then(|l| l.limit.name.as_deref())
    }
}

/// Decides `request` against the namespace `ns` with `limiter`, counting as `counting` says.
/// The cost is the request's `hits_addend`, 0 meaning 1 (as limitador reads it).
pub async fn decide<'a>(
    ns: &'a Namespace,
    request: &Request,
    counting: Counting,
    limiter: &dyn Limiter,
) -> Result<Decision<'a>, EngineError> {
    let descriptors: Vec<&[Entry]> = request
        .descriptors
        .iter()
        .map(|d| d.entries.as_slice())
        .collect();
    let applied = ns.applicable(&descriptors);
    let cost = u64::from(request.hits_addend.max(1));
    let batch = batch(&applied, cost, counting);
    let mut backend_elapsed = None;
    let outcome = if batch.hits.is_empty() {
        BatchOutcome {
            hits: Vec::new(),
            admitted: true,
        }
    } else {
        let started = tokio::time::Instant::now();
        let outcome = super::check_whole(limiter, &batch).await?;
        backend_elapsed = Some(started.elapsed());
        outcome
    };
    let outcome = if counting == Counting::CheckOnly {
        would_admit(outcome, cost)
    } else {
        outcome
    };
    let limits = applied
        .into_iter()
        .zip(outcome.hits)
        .map(|(a, outcome)| LimitVerdict {
            limit: &a.limit.limit,
            values: a.values,
            outcome,
        })
        .collect();
    Ok(Decision {
        admitted: outcome.admitted || counting == Counting::CountOnly,
        limits,
        cost,
        backend_elapsed,
    })
}

/// A check of cost 0 admits anything: whether the real cost would have been admitted is
/// whether it fits in what each limit has left (limitador's `value + delta > max_value`).
fn would_admit(mut outcome: BatchOutcome, cost: u64) -> BatchOutcome {
    for hit in &mut outcome.hits {
        hit.admitted = hit.remaining >= cost;
    }
    outcome.admitted = outcome.hits.iter().all(|h| h.admitted);
    outcome
}

/// One hit per applicable limit, all in one group: admitted only if every limit admits.
fn batch(applied: &[Applied<'_>], cost: u64, counting: Counting) -> Batch {
    let hits = applied
        .iter()
        .map(|a| {
            let mut params = LimitParams::from_rule(&a.limit.rule);
            if counting == Counting::CountOnly {
                params.charge = crate::config::model::Charge::Always;
            }
            Hit {
                key: key::state_key(&a.key_part, params.algorithm, params.period_nanos),
                limit: params,
                cost: if counting == Counting::CheckOnly {
                    0
                } else {
                    cost
                },
                refund: false,
                group: 0,
                role: Role::Enforced,
                hold: None,
            }
        })
        .collect();
    Batch { hits }
}

/// A decision, owned: what the Kuadrant service and limitador's HTTP API answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `Unknown` for an empty domain; `Ok` when no limit applies or the namespace is unknown.
    pub code: Code,
    /// The name of the limit that denied the request, if it has one.
    pub limited_by: Option<String>,
    /// The request's namespace holds limits.
    pub known: bool,
    /// limitador's rate-limit headers, when asked for ([`Asked::headers`]).
    pub headers: Vec<(String, String)>,
}

/// What a caller of [`super::Engine::decide_limitador_as`] wants besides the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// The observers hear of the decision (limitador's metrics count it).
    pub observe: bool,
    /// The answer carries limitador's `X-RateLimit-*` headers (draft 03).
    pub headers: bool,
}

/// The names limitador gives its rate-limit headers (draft 03 of the IETF RateLimit
/// headers), without `Retry-After`.
pub(crate) fn draft03_names() -> HeaderNames {
    HeaderNames {
        limit: "X-RateLimit-Limit".to_owned(),
        remaining: "X-RateLimit-Remaining".to_owned(),
        reset: "X-RateLimit-Reset".to_owned(),
        retry_after: false,
    }
}

impl Answer {
    pub(super) fn of(decision: &Decision<'_>, headers: bool) -> Answer {
        let code = if decision.admitted {
            Code::Ok
        } else {
            Code::OverLimit
        };
        let headers = if headers {
            header_lines(decision, code, &draft03_names())
        } else {
            Vec::new()
        };
        Answer {
            code,
            limited_by: decision.limited_by().map(str::to_owned),
            known: true,
            headers,
        }
    }
}

/// The `ShouldRateLimit` answer for a decision.
pub(super) fn response(decision: &Decision<'_>, options: &Options) -> Response {
    let overall_code = if decision.admitted || options.shadow_mode {
        Code::Ok
    } else {
        Code::OverLimit
    };
    Response {
        overall_code,
        statuses: Vec::new(),
        response_headers: headers(decision, overall_code, options),
        dynamic_metadata: None,
        raw_body: None,
    }
}

/// limitador's answer to an empty domain: `UNKNOWN`, nothing else.
pub(super) fn unknown() -> Response {
    Response {
        overall_code: Code::Unknown,
        statuses: Vec::new(),
        response_headers: Vec::new(),
        dynamic_metadata: None,
        raw_body: None,
    }
}

/// The rate-limit headers, as limitador writes them (draft 03 of the IETF RateLimit
/// headers): the applicable limits sorted by what is left (stable), the limit header giving
/// the first one's quota and then every limit's `quota;w=seconds` (with `;name="..."` when
/// named), the remaining header the first one's remainder, the reset header its whole seconds
/// to the window's end; `Retry-After` when configured and denied. No limit, no headers.
fn headers(decision: &Decision<'_>, overall: Code, options: &Options) -> Vec<(String, String)> {
    match &options.headers {
        Some(names) => header_lines(decision, overall, names),
        None => Vec::new(),
    }
}

fn header_lines(
    decision: &Decision<'_>,
    overall: Code,
    names: &HeaderNames,
) -> Vec<(String, String)> {
    let mut sorted: Vec<&LimitVerdict<'_>> = decision.limits.iter().collect();
    sorted.sort_by_key(|l| remaining(l));
    let Some(first) = sorted.first() else {
        return Vec::new();
    };
    let mut limit = first.limit.max_value.to_string();
    for l in &sorted {
        limit.push_str(&format!(", {};w={}", l.limit.max_value, l.limit.seconds));
        if let Some(name) = &l.limit.name {
            limit.push_str(&format!(";name=\"{}\"", name.replace('"', "'")));
        }
    }
    let reset = first.outcome.reset_nanos / 1_000_000_000;
    let mut out = vec![
        (names.limit.clone(), limit),
        (names.remaining.clone(), remaining(first).to_string()),
        (names.reset.clone(), reset.to_string()),
    ];
    if names.retry_after && overall == Code::OverLimit {
        out.push(("Retry-After".to_owned(), reset.max(1).to_string()));
    }
    out.sort();
    out
}

/// What a limit has left after the request (nothing when it denied it).
fn remaining(l: &LimitVerdict<'_>) -> u64 {
    if l.outcome.admitted {
        l.outcome.remaining
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use arc_swap::ArcSwap;

    use super::super::{Descriptor, Engine, HeaderNames};
    use super::*;
    use crate::config::rules_file::from_sources;
    use crate::limiter::{ManualClock, MemoryLimiter};
    use crate::rules::RuleSet;

    /// The limits of limitador-server's own `envoy_rls` tests, one namespace per test.
    const LIMITS: &str = r#"
- {namespace: get, max_value: 1, seconds: 60, conditions: ["descriptors[0]['req.method'] == 'GET'"], variables: ["descriptors[0]['app.id']"]}
- {namespace: all, max_value: 10, seconds: 60, conditions: ["descriptors[0].x == '1'"], variables: ["descriptors[0].z"]}
- {namespace: all, max_value: 0, seconds: 60, conditions: ["descriptors[0].x == '1'", "descriptors[1].y == '2'"], variables: ["descriptors[0].z"]}
- {namespace: addend, max_value: 10, seconds: 60, conditions: ["descriptors[0].x == '1'"], variables: ["descriptors[0].y"]}
- {namespace: named, max_value: 2, seconds: 30, name: "the \"two\"", conditions: ["limit.name == 'the \"two\"'"]}
"#;

    fn engine() -> Engine {
        let model = from_sources(&[(PathBuf::from("l.yaml"), LIMITS.to_owned())])
            .unwrap_or_else(|e| panic!("{e}"));
        let limiter = MemoryLimiter::with_clock(1000, ManualClock::at(1_000_000_000_000));
        let options = Options {
            headers: Some(HeaderNames {
                limit: "X-RateLimit-Limit".into(),
                remaining: "X-RateLimit-Remaining".into(),
                reset: "X-RateLimit-Reset".into(),
                retry_after: false,
            }),
            ..Options::default()
        };
        Engine::new(
            Arc::new(ArcSwap::from_pointee(RuleSet::compile(model))),
            Arc::new(limiter),
            options,
        )
    }

    fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits_addend: u32) -> Request {
        let descriptors = descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
                ..Descriptor::default()
            })
            .collect();
        Request {
            domain: domain.into(),
            descriptors,
            hits_addend,
        }
    }

    async fn answer(e: &Engine, r: &Request) -> (Code, Vec<(String, String)>) {
        let response = e
            .should_rate_limit(r)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            response.statuses.is_empty(),
            "limitador answers no statuses"
        );
        (response.overall_code, response.response_headers)
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    #[tokio::test]
    async fn ok_then_over_limit_with_limitadors_headers() {
        let e = engine();
        let r = request("get", &[&[("req.method", "GET"), ("app.id", "1")]], 1);
        let (code, h) = answer(&e, &r).await;
        assert_eq!(code, Code::Ok);
        assert_eq!(header(&h, "X-RateLimit-Limit"), "1, 1;w=60");
        assert_eq!(header(&h, "X-RateLimit-Remaining"), "0");
        assert!(header(&h, "X-RateLimit-Reset").parse::<u64>().unwrap() <= 60);
        let (code, h) = answer(&e, &r).await;
        assert_eq!(code, Code::OverLimit);
        assert_eq!(header(&h, "X-RateLimit-Remaining"), "0");
        // Another app has its own counter; a POST matches no limit: no headers.
        let other = request("get", &[&[("req.method", "GET"), ("app.id", "2")]], 1);
        assert_eq!(answer(&e, &other).await.0, Code::Ok);
        let post = request("get", &[&[("req.method", "POST"), ("app.id", "1")]], 1);
        assert_eq!(answer(&e, &post).await, (Code::Ok, Vec::new()));
    }

    #[tokio::test]
    async fn every_descriptor_is_taken_into_account() {
        let e = engine();
        let r = request("all", &[&[("x", "1"), ("z", "1")], &[("y", "2")]], 1);
        let (code, h) = answer(&e, &r).await;
        assert_eq!(code, Code::OverLimit);
        assert_eq!(header(&h, "X-RateLimit-Limit"), "0, 0;w=60, 10;w=60");
        assert_eq!(header(&h, "X-RateLimit-Remaining"), "0");
        // Without the second descriptor only the limit of 10 applies, and nothing was counted.
        let one = request("all", &[&[("x", "1"), ("z", "1")]], 10);
        assert_eq!(answer(&e, &one).await.0, Code::Ok);
    }

    #[tokio::test]
    async fn hits_addend_counts_and_zero_counts_as_one() {
        let e = engine();
        let r = request("addend", &[&[("x", "1"), ("y", "1")]], 6);
        let (code, h) = answer(&e, &r).await;
        assert_eq!((code, header(&h, "X-RateLimit-Remaining")), (Code::Ok, "4"));
        assert_eq!(header(&h, "X-RateLimit-Limit"), "10, 10;w=60");
        assert_eq!(answer(&e, &r).await.0, Code::OverLimit);
        let zero = request("addend", &[&[("x", "1"), ("y", "2")]], 0);
        for _ in 0..10 {
            assert_eq!(answer(&e, &zero).await.0, Code::Ok);
        }
        assert_eq!(answer(&e, &zero).await.0, Code::OverLimit);
    }

    #[tokio::test]
    async fn missing_variables_unknown_namespaces_and_the_empty_domain() {
        let e = engine();
        let no_var = request("addend", &[&[("x", "1")]], 1);
        assert_eq!(answer(&e, &no_var).await, (Code::Ok, Vec::new()));
        let unknown = request("nope", &[&[("x", "1")]], 1);
        let response = e.should_rate_limit(&unknown).await.unwrap();
        assert_eq!(response.overall_code, Code::Ok);
        let empty = request("", &[&[("x", "1")]], 1);
        assert_eq!(answer(&e, &empty).await, (Code::Unknown, Vec::new()));
    }

    #[tokio::test]
    async fn limit_is_bound_with_its_name_and_names_go_into_the_header() {
        let e = engine();
        let r = request("named", &[&[("a", "b")]], 1);
        let (code, h) = answer(&e, &r).await;
        assert_eq!(code, Code::Ok);
        assert_eq!(
            header(&h, "X-RateLimit-Limit"),
            "2, 2;w=30;name=\"the 'two'\""
        );
    }

    /// What an observer heard: (namespace, known, counting, admitted, limited_by, cost, timed).
    type Heard = (String, bool, Counting, bool, Option<String>, u64, bool);

    #[derive(Default)]
    struct Recorder(parking_lot::Mutex<Vec<Heard>>);

    impl crate::engine::Observer for Recorder {
        fn namespace(&self, r: &NamespaceReport<'_>) {
            self.0.lock().push((
                r.namespace.to_owned(),
                r.known,
                r.counting,
                r.admitted,
                r.limited_by.map(str::to_owned),
                r.cost,
                r.backend_elapsed.is_some(),
            ));
        }
    }

    #[tokio::test]
    async fn observers_hear_every_namespace_decision_but_unobserved_ones() {
        let recorder = Arc::new(Recorder::default());
        let e = engine().with_observer(recorder.clone());
        let named = request("named", &[&[("a", "b")]], 0);
        for _ in 0..3 {
            e.should_rate_limit(&named).await.unwrap();
        }
        let elsewhere = request("elsewhere", &[&[("a", "b")]], 4);
        e.should_rate_limit(&elsewhere).await.unwrap();
        let addend = request("addend", &[&[("x", "1"), ("y", "1")]], 4);
        e.decide_limitador(&addend, Counting::CountOnly)
            .await
            .unwrap();
        e.decide_limitador(&addend, Counting::CheckOnly)
            .await
            .unwrap();
        let quiet = Asked {
            observe: false,
            headers: true,
        };
        let answer = e
            .decide_limitador_as(&addend, Counting::CheckAndCount, quiet)
            .await
            .unwrap();
        assert_eq!(answer.code, Code::Ok);
        assert_eq!(
            header(&answer.headers, "X-RateLimit-Limit"),
            "10, 10;w=60",
            "limitador's names, asked for"
        );
        assert_eq!(header(&answer.headers, "X-RateLimit-Remaining"), "2");
        let no_var = request("addend", &[&[("x", "1")]], 1);
        e.decide_limitador(&no_var, Counting::CheckOnly)
            .await
            .unwrap();
        e.decide_limitador(&request("", &[&[("x", "1")]], 1), Counting::CheckOnly)
            .await
            .unwrap();
        let heard = recorder.0.lock().clone();
        let s = |v: &str| v.to_owned();
        let named_over = Some(s("the \"two\""));
        assert_eq!(
            heard,
            [
                (
                    s("named"),
                    true,
                    Counting::CheckAndCount,
                    true,
                    None,
                    1,
                    true
                ),
                (
                    s("named"),
                    true,
                    Counting::CheckAndCount,
                    true,
                    None,
                    1,
                    true
                ),
                (
                    s("named"),
                    true,
                    Counting::CheckAndCount,
                    false,
                    named_over,
                    1,
                    true
                ),
                (
                    s("elsewhere"),
                    false,
                    Counting::CheckAndCount,
                    true,
                    None,
                    4,
                    false
                ),
                (s("addend"), true, Counting::CountOnly, true, None, 4, true),
                (s("addend"), true, Counting::CheckOnly, true, None, 4, true),
                // The unobserved call counted 4 (2 left), unheard; then no limit applied to a
                // missing variable (no limiter call); the empty domain is not heard.
                (s("addend"), true, Counting::CheckOnly, true, None, 1, false),
            ]
        );
    }

    #[tokio::test]
    async fn check_only_counts_nothing_and_count_only_always_counts() {
        let e = engine();
        let rules = e.rules.load_full();
        let ns = rules.namespaces().get("addend").unwrap();
        let r = request("addend", &[&[("x", "1"), ("y", "1")]], 8);
        let limiter = &**e.limiter();
        for _ in 0..3 {
            let d = decide(ns, &r, Counting::CheckOnly, limiter).await.unwrap();
            assert!(d.admitted);
        }
        let d = decide(ns, &r, Counting::CountOnly, limiter).await.unwrap();
        assert!(d.admitted);
        assert_eq!(d.limits[0].outcome.remaining, 2);
        let d = decide(ns, &r, Counting::CheckOnly, limiter).await.unwrap();
        assert!(!d.admitted, "8 more do not fit in the 2 left");
        let d = decide(ns, &r, Counting::CountOnly, limiter).await.unwrap();
        assert!(d.admitted, "a report is never denied");
        let d = decide(ns, &r, Counting::CheckAndCount, limiter)
            .await
            .unwrap();
        assert!(!d.admitted);
        assert_eq!(d.limited_by(), None);
    }
}
