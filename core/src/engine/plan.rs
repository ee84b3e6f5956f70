//! From a request to the limiter batch: what applies to each descriptor, after `replaces`.

use std::borrow::Cow;
use std::collections::HashSet;
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;

use super::{Descriptor, Override, Request};
use crate::config::model::{Algorithm, Charge, LimitDefaults, LimitRule, Policy};
use crate::limiter::{Batch, Hit, LimitParams, Role, concurrency};
use crate::rules::{Domain, Match, Rule, key};

/// YAML `metadata` of a matched rule.
pub(super) type Metadata = Arc<serde_json::Map<String, serde_json::Value>>;

/// What applies to one descriptor.
pub(super) enum Applies<'r> {
    /// Nothing: unknown domain, no match, no entries, a pass-through rule, or replaced.
    Nothing,
    /// An `unlimited` rule.
    Unlimited,
    /// Limits, each with the index of its hit in the batch.
    Limits {
        limits: Vec<(Cow<'r, LimitRule>, usize)>,
        role: Role,
    },
}

pub(super) struct DescriptorPlan<'r> {
    pub applies: Applies<'r>,
    pub metadata: Option<&'r Metadata>,
    /// The rule matched (none for an override or no match).
    pub matched: Option<Match<'r>>,
    /// The descriptor's cost.
    pub cost: u64,
}

pub(super) struct Planned<'r> {
    pub descriptors: Vec<DescriptorPlan<'r>>,
    pub batch: Batch,
    /// A hold id (a `hold_id` entry's value) longer than
    /// [`concurrency::MAX_HOLD_ID_BYTES`]: the request is refused (`INVALID_ARGUMENT`).
    pub bad_hold_id: Option<String>,
}

/// What a descriptor matched before `replaces` is applied.
enum Candidate<'r> {
    Nothing,
    Rule(Match<'r>),
    Override(LimitRule),
}

/// What planning takes from the rules and the settings, besides the request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Modes {
    /// Global quota mode (`limits.quota_mode`).
    pub quota_mode: bool,
}

/// Plans a request.
pub(super) fn plan_request<'r>(
    domain: Option<&'r Domain>,
    request: &Request,
    modes: Modes,
) -> Planned<'r> {
    let candidates: Vec<Candidate<'r>> = request
        .descriptors
        .iter()
        .map(|d| candidate(domain, d))
        .collect();
    let replaced = replaced_names(&candidates);
    let mut batch = Batch::default();
    let mut bad_hold_id = None;
    let descriptors = candidates
        .into_iter()
        .zip(&request.descriptors)
        .enumerate()
        .map(|(group, (c, d))| {
            let ctx = HitContext {
                domain: domain.map_or("", |d| d.name()),
                descriptor: d,
                cost: cost(request, d),
                group,
                quota_mode: modes.quota_mode,
                hold: None,
            };
            if let Candidate::Rule(m) = &c
                && m.hold()
                && let Some(id) = d.entries.last()
                && id.value.len() > concurrency::MAX_HOLD_ID_BYTES
            {
                bad_hold_id.get_or_insert_with(|| {
                    format!(
                        "descriptors[{group}].entries[{}].value: a hold id ({}) of {} bytes, \
                         more than {}",
                        d.entries.len() - 1,
                        id.key,
                        id.value.len(),
                        concurrency::MAX_HOLD_ID_BYTES
                    )
                });
            }
            descriptor_plan(c, &replaced, &ctx, &mut batch)
        })
        .collect();
    Planned {
        descriptors,
        batch,
        bad_hold_id,
    }
}

fn candidate<'r>(domain: Option<&'r Domain>, d: &Descriptor) -> Candidate<'r> {
    let Some(domain) = domain else {
        return Candidate::Nothing;
    };
    if d.entries.is_empty() {
        return Candidate::Nothing;
    }
    if let Some(limit) = d.limit {
        return Candidate::Override(override_rule(limit, domain.defaults()));
    }
    match domain.find(&d.entries) {
        Some(m) => Candidate::Rule(m),
        None => Candidate::Nothing,
    }
}

/// A client-sent limit as a rule: the domain's default algorithm and charge, burst equal to
/// the quota. A `concurrency` default keeps denied requests' costs as pending their release
/// (`charge: always`, as the rules do when no charge is written).
fn override_rule(limit: Override, defaults: LimitDefaults) -> LimitRule {
    let charge = match defaults.algorithm {
        Algorithm::Concurrency => Charge::Always,
        _ => defaults.charge,
    };
    LimitRule {
        name: None,
        unit: limit.unit,
        requests_per_unit: limit.requests_per_unit,
        unit_multiplier: NonZeroU32::MIN,
        algorithm: defaults.algorithm,
        burst: limit.requests_per_unit,
        charge,
        borrow: false,
        replaces: Vec::new(),
        on_deny: None,
        block_nanos: 0,
        global: false,
        time_zone: None,
        hold_id: None,
    }
}

/// Every name that some matched limit of the request replaces.
fn replaced_names<'r>(candidates: &[Candidate<'r>]) -> HashSet<&'r str> {
    let mut names = HashSet::new();
    for c in candidates {
        if let Candidate::Rule(m) = c {
            match &m.rule().policy {
                Policy::Limited(limits) => {
                    for l in limits {
                        names.extend(l.replaces.iter().map(String::as_str));
                    }
                }
                Policy::Unlimited { replaces, .. } => {
                    names.extend(replaces.iter().map(String::as_str));
                }
                Policy::None => {}
            }
        }
    }
    names
}

fn is_replaced(name: &Option<String>, replaced: &HashSet<&str>) -> bool {
    name.as_deref().is_some_and(|n| replaced.contains(n))
}

/// The cost of a descriptor: its own `hits_addend`, else the request's (0 meaning 1).
fn cost(request: &Request, d: &Descriptor) -> u64 {
    d.hits_addend
        .unwrap_or_else(|| u64::from(request.hits_addend.max(1)))
}

#[derive(Clone, Copy)]
struct HitContext<'a> {
    domain: &'a str,
    descriptor: &'a Descriptor,
    cost: u64,
    group: usize,
    quota_mode: bool,
    /// The hold the descriptor names (its `hold_id` entry's, hashed), if any: given to the
    /// hits of the limits that declare `hold_id`.
    hold: Option<NonZeroU64>,
}

fn descriptor_plan<'r>(
    c: Candidate<'r>,
    replaced: &HashSet<&str>,
    ctx: &HitContext<'_>,
    batch: &mut Batch,
) -> DescriptorPlan<'r> {
    match c {
        Candidate::Nothing => DescriptorPlan {
            applies: Applies::Nothing,
            metadata: None,
            matched: None,
            cost: ctx.cost,
        },
        Candidate::Override(rule) => {
            let part = key::descriptor_part(ctx.domain, &ctx.descriptor.entries, None);
            let role = if ctx.quota_mode {
                Role::Quota
            } else {
                Role::Enforced
            };
            let limits = push_hits(vec![Cow::Owned(rule)], &part, role, ctx, batch);
            DescriptorPlan {
                applies: Applies::Limits { limits, role },
                metadata: None,
                matched: None,
                cost: ctx.cost,
            }
        }
        Candidate::Rule(m) => {
            let rule = m.rule();
            let applies = match &rule.policy {
                Policy::None => Applies::Nothing,
                Policy::Unlimited { name, .. } if is_replaced(name, replaced) => Applies::Nothing,
                Policy::Unlimited { .. } => Applies::Unlimited,
                Policy::Limited(limits) => {
                    let kept: Vec<Cow<'r, LimitRule>> = limits
                        .iter()
                        .filter(|l| !is_replaced(&l.name, replaced))
                        .map(Cow::Borrowed)
                        .collect();
                    if kept.is_empty() {
                        Applies::Nothing
                    } else {
                        // A hold id entry (the last) is no part of the state key: every
                        // request id shares the holds.
                        let entries = &ctx.descriptor.entries;
                        let (entries, hold) = match entries.split_last() {
                            Some((id, levels)) if m.hold() => (
                                levels,
                                NonZeroU64::new(concurrency::hold_id(id.value.as_bytes())),
                            ),
                            _ => (entries.as_slice(), None),
                        };
                        let part = key::descriptor_part(ctx.domain, entries, Some(&m));
                        let role = role_of(rule, ctx.quota_mode);
                        let ctx = HitContext { hold, ..*ctx };
                        Applies::Limits {
                            limits: push_hits(kept, &part, role, &ctx, batch),
                            role,
                        }
                    }
                }
            };
            DescriptorPlan {
                applies,
                metadata: rule.metadata.as_ref(),
                matched: Some(m),
                cost: ctx.cost,
            }
        }
    }
}

/// A rule's role: shadow mode wins over quota mode (the rule's or the global one).
fn role_of(rule: &Rule, quota_mode: bool) -> Role {
    match (rule.shadow_mode, rule.quota_mode || quota_mode) {
        (true, true) => Role::QuotaShadow,
        (true, false) => Role::Shadow,
        (false, true) => Role::Quota,
        (false, false) => Role::Enforced,
    }
}

fn push_hits<'r>(
    limits: Vec<Cow<'r, LimitRule>>,
    descriptor_part: &str,
    role: Role,
    ctx: &HitContext<'_>,
    batch: &mut Batch,
) -> Vec<(Cow<'r, LimitRule>, usize)> {
    limits
        .into_iter()
        .map(|rule| {
            let params = LimitParams::from_rule(&rule);
            batch.hits.push(Hit {
                key: key::state_key(descriptor_part, params.algorithm, params.period_nanos),
                limit: params,
                cost: ctx.cost,
                refund: ctx.descriptor.refund,
                group: ctx.group,
                role,
                hold: ctx.hold.filter(|_| rule.hold_id.is_some()),
            });
            (rule, batch.hits.len() - 1)
        })
        .collect()
}
