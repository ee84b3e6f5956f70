//! Explaining a request without charging it (admin `/why`): per descriptor, the rule it
//! matched or why none did, every limit with its state now and its verdict for the request's
//! real costs, and the answer `should_rate_limit` would give now.
//!
//! Both come from the limiter's [`Limiter::dry_run`](crate::limiter::Limiter::dry_run): the
//! request's own batch (its real costs), decided as a request would be and written nowhere;
//! and the same hits at cost 0, the state as a check-only request sees it. Nothing is
//! observed: no metric, no top-denied count.

use std::sync::Arc;

use super::plan::{self, Applies};
use super::{
    Engine, EngineError, Override, Request, Response, check_overrides, response, validate,
};
use crate::config::model::{LimitRule, Policy};
use crate::limiter::{Batch, BatchOutcome, HitOutcome, Role};
use crate::rules::explain::{Walk, explain};
use crate::rules::naming::segment;
use crate::rules::{Entry, Match};

/// The explanation of a whole request.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// Whether the rules have the request's domain.
    pub domain_known: bool,
    /// One per request descriptor, in order.
    pub descriptors: Vec<DescriptorWhy>,
    /// The answer the request would get now (nothing charged to make it).
    pub response: Response,
}

/// The explanation of one descriptor.
#[derive(Debug, Clone)]
pub struct DescriptorWhy {
    pub entries: Vec<Entry>,
    /// How the rules took it.
    pub matched: Matched,
    /// The client's limit override it carries, if any (used instead of the rules when the
    /// domain is known).
    pub client_override: Option<Override>,
    /// What applies: `nothing`, `unlimited`, `limits`, or `replaced` (its rule's limits are
    /// all replaced by another descriptor's).
    pub applies: &'static str,
    /// Its role when limits apply: the rule's shadow mode and quota mode (or the global one).
    pub role: Option<Role>,
    /// Its cost in this request (0: check only).
    pub cost: u64,
    pub refund: bool,
    pub limits: Vec<LimitWhy>,
}

/// How the rules took a descriptor.
#[derive(Debug, Clone)]
pub enum Matched {
    /// The domain is not in the rules.
    UnknownDomain,
    /// A client override applied (the rules were not walked).
    Override,
    /// The walk's end: `code` and `reason` as [`Walk::code`] and [`Walk::reason`] give them,
    /// and the rule it ended on, when it ended on one.
    Walked {
        code: &'static str,
        reason: String,
        rule: Option<RuleWhy>,
    },
}

/// The rule a descriptor ended on.
#[derive(Debug, Clone)]
pub struct RuleWhy {
    /// As `/rlconfig` names it: `<domain>.<segment>.<segment>...`.
    pub name: String,
    /// Where it is defined (`file:line`).
    pub location: String,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// Whether its policy is `unlimited`.
    pub unlimited: bool,
}

/// One limit of a descriptor.
#[derive(Debug, Clone)]
pub struct LimitWhy {
    pub rule: LimitRule,
    /// The state key.
    pub key: Arc<[u8]>,
    /// The state as a check-only request (cost 0) sees it now.
    pub now: HitOutcome,
    /// This limit's verdict for the request's cost (charged nothing).
    pub verdict: HitOutcome,
}

impl Engine {
    /// Explains `request` as [`Engine::should_rate_limit`] would decide it now, charging
    /// nothing and observing nothing.
    pub async fn explain(&self, request: &Request) -> Result<Explanation, EngineError> {
        validate(request, &self.options.input)?;
        let rules = self.rules.load_full();
        let domain = rules.domain(&request.domain);
        if let Some(d) = domain {
            check_overrides(request, d.defaults().algorithm)?;
        }
        let modes = plan::Modes {
            quota_mode: self.options.quota_mode,
        };
        let planned = plan::plan_request(domain, request, modes);
        let (verdict, now) = self.dry_runs(&planned.batch).await?;
        let response = response::assemble(request, &planned, &verdict, &self.options);
        let descriptors = request
            .descriptors
            .iter()
            .zip(&planned.descriptors)
            .map(|(d, p)| {
                let matched = match domain {
                    None => Matched::UnknownDomain,
                    Some(_) if d.limit.is_some() && !d.entries.is_empty() => Matched::Override,
                    Some(dom) => walked(dom.name(), explain(dom, &d.entries)),
                };
                let (applies, role, limits) = match &p.applies {
                    Applies::Nothing if replaced(p.matched.as_ref()) => ("replaced", None, vec![]),
                    Applies::Nothing => ("nothing", None, vec![]),
                    Applies::Unlimited => ("unlimited", None, vec![]),
                    Applies::Limits { limits, role } => {
                        let limits = limits
                            .iter()
                            .filter_map(|(rule, i)| {
                                Some(LimitWhy {
                                    rule: rule.clone().into_owned(),
                                    key: planned.batch.hits.get(*i)?.key.clone(),
                                    now: *now.hits.get(*i)?,
                                    verdict: *verdict.hits.get(*i)?,
                                })
                            })
                            .collect();
                        ("limits", Some(*role), limits)
                    }
                };
                DescriptorWhy {
                    entries: d.entries.clone(),
                    matched,
                    client_override: d.limit,
                    applies,
                    role,
                    cost: p.cost,
                    refund: d.refund,
                    limits,
                }
            })
            .collect();
        Ok(Explanation {
            domain_known: domain.is_some(),
            descriptors,
            response,
        })
    }

    /// The state key of every limit `request`'s descriptors match (as a request would take
    /// them, `replaces` applied), each once, with its algorithm: what a reset of the request
    /// forgets.
    pub fn state_keys(
        &self,
        request: &Request,
    ) -> Result<Vec<crate::limiter::StateKey>, EngineError> {
        validate(request, &self.options.input)?;
        let rules = self.rules.load_full();
        let domain = rules.domain(&request.domain);
        let modes = plan::Modes {
            quota_mode: self.options.quota_mode,
        };
        let planned = plan::plan_request(domain, request, modes);
        let mut keys: Vec<crate::limiter::StateKey> = Vec::new();
        for hit in planned.batch.hits {
            let key = (hit.key, hit.limit.algorithm);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        Ok(keys)
    }

    /// The batch's verdict at its real costs, and its states at cost 0, both dry runs.
    async fn dry_runs(&self, batch: &Batch) -> Result<(BatchOutcome, BatchOutcome), EngineError> {
        if batch.hits.is_empty() {
            let empty = BatchOutcome {
                hits: Vec::new(),
                admitted: true,
            };
            return Ok((empty.clone(), empty));
        }
        let verdict = self.limiter.dry_run(batch).await?;
        let mut probe = batch.clone();
        for hit in &mut probe.hits {
            hit.cost = 0;
            hit.refund = false;
        }
        let now = self.limiter.dry_run(&probe).await?;
        if verdict.hits.len() != batch.hits.len() || now.hits.len() != batch.hits.len() {
            return Err(EngineError::Backend(crate::limiter::LimiterError {
                backend: self.limiter.name(),
                message: "a dry run answered the wrong number of hits".to_owned(),
                transient: false,
                source: None,
            }));
        }
        Ok((verdict, now))
    }
}

/// Whether a matched rule had limits that were all replaced.
fn replaced(matched: Option<&Match<'_>>) -> bool {
    matched.is_some_and(|m| matches!(&m.rule().policy, Policy::Limited(l) if !l.is_empty()))
}

fn walked(domain: &str, walk: Walk<'_>) -> Matched {
    let rule = match &walk {
        Walk::Matched(m) | Walk::TooShort { matched: m } | Walk::NoPolicy { matched: m } => {
            Some(rule_why(domain, m))
        }
        _ => None,
    };
    Matched::Walked {
        code: walk.code(),
        reason: walk.reason(),
        rule,
    }
}

fn rule_why(domain: &str, m: &Match<'_>) -> RuleWhy {
    let mut name = domain.to_owned();
    for r in m.path() {
        name.push('.');
        name.push_str(&segment(r));
    }
    let rule = m.rule();
    RuleWhy {
        name,
        location: format!("{}:{}", rule.location.file.display(), rule.location.line),
        shadow_mode: rule.shadow_mode,
        quota_mode: rule.quota_mode,
        unlimited: matches!(rule.policy, Policy::Unlimited { .. }),
    }
}
