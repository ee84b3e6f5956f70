//! A descriptor's `rate_limit` or `rate_limits`: every limit key, its defaults and its checks,
//! turned into a [`Policy`].

use std::num::NonZeroU32;

use saphyr::{MarkedYaml, YamlData};

use super::algorithm::{algorithm, concurrency_charge, fits_algorithm};
use super::calendar::{block_for, time_zone};
use super::deny::on_deny;
use super::scalar::{boolean, string, uint};
use super::tree::{Ctx, Field, Fields, describe, index, is_null, line, mapping};
use crate::config::model::{Algorithm, Charge, LimitRule, Policy, Scope, Unit};

/// The keys of one limit.
const LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "unit_multiplier",
    "algorithm",
    "burst",
    "charge",
    "borrow",
    "on_deny",
    "block_for",
    "time_zone",
    "hold_id",
    "scope",
];

/// The keys that mean nothing on an unlimited limit.
const LIMITED_ONLY: &[&str] = &[
    "unit",
    "unit_multiplier",
    "algorithm",
    "burst",
    "charge",
    "borrow",
    "on_deny",
    "block_for",
    "time_zone",
    "hold_id",
    "scope",
];

/// The longest period a limit may have: 100 years of 365 days.
const MAX_PERIOD_SECS: u64 = 100 * Unit::Year.seconds();

/// One parsed limit.
enum Limit {
    Unlimited {
        name: Option<String>,
        replaces: Vec<String>,
    },
    Limited(LimitRule),
}

/// A parsed limit with where it was written.
struct Placed {
    limit: Limit,
    path: String,
    line: usize,
    /// The line of its `unlimited:` key, if any.
    unlimited_line: usize,
}

/// The policy of a descriptor mapping: none, unlimited, or its limits.
pub(super) fn policy(descriptor: &Fields<'_>, ctx: &mut Ctx<'_>) -> Policy {
    let single = descriptor.get("rate_limit");
    let list = descriptor.get_raw("rate_limits");
    if let (Some(_), Some(l)) = (single, list) {
        let message = "rate_limit and rate_limits cannot be used together; use one of them";
        ctx.error(l.line, &descriptor.path, message);
    }
    let single = single.map(|f| one(f.node, &f.path, f.line, ctx));
    let list = list.map(|f| several(f, ctx));
    match (single, list) {
        (Some(Some(p)), None) => to_policy(p.limit),
        (None, Some(Some(p))) => p,
        _ => Policy::None,
    }
}

fn to_policy(limit: Limit) -> Policy {
    match limit {
        Limit::Unlimited { name, replaces } => Policy::Unlimited { name, replaces },
        Limit::Limited(rule) => Policy::Limited(vec![rule]),
    }
}

/// `rate_limits: [...]`: at least one limit; an unlimited one must be alone; no two limits
/// may share a state.
fn several(f: &Field<'_>, ctx: &mut Ctx<'_>) -> Option<Policy> {
    let items = match &f.node.data {
        YamlData::Sequence(items) => items.as_slice(),
        _ if is_null(f.node) => &[],
        _ => {
            let message = format!("expected a sequence, got {}", describe(f.node, ctx));
            ctx.error(f.line, &f.path, message);
            return None;
        }
    };
    if items.is_empty() {
        ctx.error(f.line, &f.path, "must list at least one limit");
        return None;
    }
    let parsed: Vec<Option<Placed>> = items
        .iter()
        .enumerate()
        .map(|(i, node)| one(node, &index(&f.path, i), line(node), ctx))
        .collect();
    let all_parsed = parsed.iter().all(Option::is_some);
    let placed: Vec<Placed> = parsed.into_iter().flatten().collect();
    // Check the limits that parsed against each other even when others did not.
    combine(placed, items.len(), ctx).filter(|_| all_parsed)
}

/// Combines the `listed` limits of a `rate_limits` list (`placed` are those that parsed).
fn combine(placed: Vec<Placed>, listed: usize, ctx: &mut Ctx<'_>) -> Option<Policy> {
    if listed == 1 {
        return placed.into_iter().next().map(|p| to_policy(p.limit));
    }
    let mut ok = true;
    for p in placed
        .iter()
        .filter(|p| matches!(p.limit, Limit::Unlimited { .. }))
    {
        let path = format!("{}.unlimited", p.path);
        let message = "an unlimited limit must be the only limit of its descriptor";
        ctx.error(p.unlimited_line, &path, message);
        ok = false;
    }
    ok &= distinct_states(&placed, ctx);
    ok &= one_hold_id(&placed, ctx);
    let rules = placed.into_iter().filter_map(|p| match p.limit {
        Limit::Limited(rule) => Some(rule),
        Limit::Unlimited { .. } => None,
    });
    ok.then(|| Policy::Limited(rules.collect()))
}

/// Two limits with the same algorithm and period would share one state: reject the later.
fn distinct_states(placed: &[Placed], ctx: &mut Ctx<'_>) -> bool {
    let mut ok = true;
    for (j, later) in placed.iter().enumerate() {
        let Limit::Limited(b) = &later.limit else {
            continue;
        };
        let first = placed[..j]
            .iter()
            .find(|p| matches!(&p.limit, Limit::Limited(a) if same_state(a, b)));
        if let Some(first) = first {
            let message = format!(
                "same algorithm ({}) and period ({}s) as {}: the two limits would share one state",
                b.algorithm.as_str(),
                period_secs(b.unit, b.unit_multiplier),
                first.path
            );
            ctx.error(later.line, &later.path, message);
            ok = false;
        }
    }
    ok
}

/// The limits of one descriptor that name a hold name it by one entry key.
fn one_hold_id(placed: &[Placed], ctx: &mut Ctx<'_>) -> bool {
    let mut first: Option<(&str, &str)> = None;
    let mut ok = true;
    for p in placed {
        let Limit::Limited(LimitRule {
            hold_id: Some(key), ..
        }) = &p.limit
        else {
            continue;
        };
        match first {
            None => first = Some((key, &p.path)),
            Some((k, _)) if k == key => {}
            Some((k, at)) => {
                let message = format!(
                    "hold_id '{key}' differs from {at}'s '{k}': the limits of one descriptor \
                     name a request's hold by one entry"
                );
                ctx.error(p.line, &p.path, message);
                ok = false;
            }
        }
    }
    ok
}

fn same_state(a: &LimitRule, b: &LimitRule) -> bool {
    a.algorithm == b.algorithm
        && period_secs(a.unit, a.unit_multiplier) == period_secs(b.unit, b.unit_multiplier)
}

fn period_secs(unit: Unit, multiplier: NonZeroU32) -> u64 {
    unit.seconds().saturating_mul(u64::from(multiplier.get()))
}

/// One limit mapping, at `path`; `at` is the line to report a missing key on.
fn one(node: &MarkedYaml<'_>, path: &str, at: usize, ctx: &mut Ctx<'_>) -> Option<Placed> {
    let fields = mapping(node, path, at, LIMIT_KEYS, ctx)?;
    let unlimited_line = fields.get("unlimited").map_or(at, |f| f.line);
    let unlimited = flag(&fields, "unlimited", ctx);
    let name = fields
        .get("name")
        .and_then(|f| string(f, ctx))
        .filter(|n| !n.is_empty());
    let replaces = replaces(&fields, name.as_deref(), ctx);
    let requests = fields.get("requests_per_unit").map(|f| uint(f, ctx));
    let limit = if unlimited {
        no_limited_keys(&fields, ctx);
        Some(Limit::Unlimited {
            name,
            replaces: replaces?,
        })
    } else {
        let requests = requests.unwrap_or(Some(0));
        limited(&fields, at, name, replaces, requests, ctx).map(Limit::Limited)
    };
    Some(Placed {
        limit: limit?,
        path: path.to_owned(),
        line: at,
        unlimited_line,
    })
}

/// Reads an optional boolean field; absent, null or invalid is false.
pub(super) fn flag(fields: &Fields<'_>, name: &str, ctx: &mut Ctx<'_>) -> bool {
    fields
        .get(name)
        .and_then(|f| boolean(f, ctx))
        .unwrap_or(false)
}

fn no_limited_keys(fields: &Fields<'_>, ctx: &mut Ctx<'_>) {
    for key in LIMITED_ONLY {
        if let Some(f) = fields.get(key) {
            let message = format!("{key} must not be set on an unlimited limit");
            ctx.error(f.line, &f.path, message);
        }
    }
}

/// The settings of a limited (not unlimited) limit, with defaults resolved.
fn limited(
    fields: &Fields<'_>,
    at: usize,
    name: Option<String>,
    replaces: Option<Vec<String>>,
    requests: Option<u32>,
    ctx: &mut Ctx<'_>,
) -> Option<LimitRule> {
    let unit = unit(fields, at, ctx);
    let multiplier = multiplier(fields, unit, ctx);
    let algorithm = algorithm(fields, ctx);
    let burst = burst(fields, ctx);
    let charge = charge(fields, ctx);
    let charge = concurrency_charge(fields, algorithm, charge);
    let borrow = flag(fields, "borrow", ctx);
    let on_deny = on_deny(fields, ctx);
    let block_nanos = block_for(fields, ctx);
    let written = algorithm.map(|(a, _)| a);
    let time_zone = time_zone(fields, (written, unit), ctx);
    let hold_id = hold_id(fields, written, ctx);
    let fits = algorithm.is_none_or(|a| fits_algorithm(fields, a, (requests, borrow), ctx));
    let global = scope(fields, at, ctx);
    let requests = requests?;
    let (algorithm, written) = algorithm?;
    if !fits || !backend_keeps(fields, at, (algorithm, written), ctx) {
        return None;
    }
    if let Some((true, place)) = &global {
        let shape = Shape {
            algorithm,
            calendar: time_zone.as_ref().is_some_and(Option::is_some),
            charge: charge == Some(Charge::Always),
            borrow,
            block: block_nanos.is_some_and(|b| b > 0),
        };
        if !shareable(place, shape, ctx) {
            return None;
        }
    }
    let global = global.map(|(g, _)| g);
    if algorithm.has_capacity() {
        let drains = (unit?, multiplier?, burst?.unwrap_or(requests));
        if !capacity_fits(fields, at, drains, requests, ctx) {
            return None;
        }
    }
    Some(LimitRule {
        name,
        unit: unit?,
        requests_per_unit: requests,
        unit_multiplier: multiplier?,
        algorithm,
        burst: burst?.unwrap_or(requests),
        charge: charge?,
        borrow,
        replaces: replaces?,
        on_deny: on_deny?,
        block_nanos: block_nanos?,
        global: global?,
        time_zone: time_zone?,
        hold_id: hold_id?,
    })
}

/// Whether the backend can keep this limit: with `limiter.backend = "memcache"`, fixed
/// windows without `block_for` only (Memcached counts with `INCR`, and has no scripts).
fn backend_keeps(
    fields: &Fields<'_>,
    at: usize,
    (algorithm, written): (crate::config::model::Algorithm, bool),
    ctx: &mut Ctx<'_>,
) -> bool {
    if !ctx.options.fixed_windows_only {
        return true;
    }
    let mut ok = true;
    if algorithm != crate::config::model::Algorithm::FixedWindow {
        let (line, path) = match fields.get("algorithm") {
            Some(f) if written => (f.line, f.path.clone()),
            _ => (at, fields.path.clone()),
        };
        let source = if written {
            String::new()
        } else {
            format!(" ({})", ctx.algorithm_source())
        };
        let message = format!(
            "the memcache backend (limiter.backend) keeps fixed windows only, as Memcached \
             counts with INCR and runs no scripts; this limit's algorithm is {}{source}: \
             write algorithm: fixed_window, or use the redis or memory backend",
            algorithm.as_str()
        );
        ctx.error(line, &path, message);
        ok = false;
    }
    if let Some(f) = fields.get("block_for") {
        let message = "block_for needs the redis or memory backend: the memcache backend \
                       (limiter.backend) keeps a counter per window and nothing else";
        ctx.error(f.line, &f.path, message.to_owned());
        ok = false;
    }
    ok
}

/// Where a limit's global scope was set: its own `scope` key (line, path), or its domain's
/// `limits.domains."D".scope` in the settings (the limit's line and path).
struct ScopePlace {
    line: usize,
    path: String,
    /// The setting that made it global, when not the limit's own key.
    from_settings: Option<String>,
}

/// `scope: local | global` (default: the domain's `limits.domains."D".scope`, else local): a
/// global limit needs a home Redis (`redis.global_url`). Whether it is global, and where that
/// was said.
fn scope(fields: &Fields<'_>, at: usize, ctx: &mut Ctx<'_>) -> Option<(bool, ScopePlace)> {
    let (global, place) = match fields.get("scope") {
        Some(f) => {
            let name = string(f, ctx)?;
            let Some(scope) = Scope::parse(&name) else {
                let message = format!("unknown scope '{name}' (expected local or global)");
                ctx.error(f.line, &f.path, message);
                return None;
            };
            let place = ScopePlace {
                line: f.line,
                path: f.path.clone(),
                from_settings: None,
            };
            (scope == Scope::Global, place)
        }
        None => {
            let place = ScopePlace {
                line: at,
                path: fields.path.clone(),
                from_settings: Some(format!("limits.domains.\"{}\".scope", ctx.domain())),
            };
            (ctx.defaults.global, place)
        }
    };
    if global && !ctx.options.global_url {
        let message = format!(
            "scope: global{} counts the limit once across regions in a home Redis: it needs \
             limiter.backend = \"redis\" and redis.global_url (and redis.region) in the settings",
            place
                .from_settings
                .as_ref()
                .map_or(String::new(), |s| format!(" (from {s})"))
        );
        ctx.error(place.line, &place.path, message);
        return None;
    }
    Some((global, place))
}

/// What decides whether a limit can be shared across regions.
struct Shape {
    algorithm: Algorithm,
    calendar: bool,
    charge: bool,
    borrow: bool,
    block: bool,
}

/// Whether a global limit's state can be lent to regions exactly (the lease rules of
/// `limiter::lease`): fixed windows (not calendar ones), sliding windows, token buckets and
/// funnels, counted when admitted, without `borrow` or `block_for`. Otherwise an error at the
/// `scope` key (or the limit, when its domain made it global) saying why.
fn shareable(place: &ScopePlace, shape: Shape, ctx: &mut Ctx<'_>) -> bool {
    let why = match shape.algorithm {
        Algorithm::SlidingLog => Some(
            "a sliding log dates every admission, so a share lent to a region cannot be \
             counted exactly in the home Redis; use sliding_window, fixed_window, \
             token_bucket or funnel",
        ),
        Algorithm::Concurrency => Some(
            "a concurrency limit's releases must reach the state that took the hold, which a \
             region's share cannot promise; keep it local",
        ),
        _ if shape.calendar => Some(
            "a calendar window (time_zone) ends at a local time the home Redis does not \
             share with the regions; use a window without time_zone",
        ),
        _ if shape.charge => Some(
            "charge: always takes denied costs, which only the home Redis can decide; a \
             region decides from its share, counted when admitted",
        ),
        _ if shape.borrow => Some("borrow goes into debt, which only the home Redis can decide"),
        _ if shape.block => Some("block_for needs the home Redis's state on every denial"),
        _ => None,
    };
    let Some(why) = why else {
        return true;
    };
    let from = place
        .from_settings
        .as_ref()
        .map_or(String::new(), |s| format!(" (from {s})"));
    let message = format!(
        "scope: global{from} cannot be shared exactly across regions with algorithm {}: {why}",
        shape.algorithm.as_str()
    );
    ctx.error(place.line, &place.path, message);
    false
}

/// `hold_id: <entry key>`: only with `algorithm: concurrency`; a non-empty key.
fn hold_id(
    fields: &Fields<'_>,
    algorithm: Option<crate::config::model::Algorithm>,
    ctx: &mut Ctx<'_>,
) -> Option<Option<String>> {
    let Some(f) = fields.get("hold_id") else {
        return Some(None);
    };
    let key = string(f, ctx)?;
    if key.is_empty() {
        ctx.error(
            f.line,
            &f.path,
            "must name the descriptor entry that carries the request's id (e.g. request_id)",
        );
        return None;
    }
    if algorithm != Some(crate::config::model::Algorithm::Concurrency) {
        let message = "hold_id names a request's hold: it needs algorithm: concurrency";
        ctx.error(f.line, &f.path, message);
        return None;
    }
    Some(Some(key))
}

fn unit(fields: &Fields<'_>, at: usize, ctx: &mut Ctx<'_>) -> Option<Unit> {
    let Some(f) = fields.get("unit") else {
        let message = "missing unit (second, minute, hour, day, week, month or year)";
        ctx.error(at, &fields.path, message);
        return None;
    };
    let name = string(f, ctx)?;
    let unit = Unit::parse(&name);
    if unit.is_none() {
        ctx.error(f.line, &f.path, format!("unknown unit '{name}'"));
    }
    unit
}

/// `unit_multiplier`: at least 1 (the default), and the period at most 100 years.
fn multiplier(fields: &Fields<'_>, unit: Option<Unit>, ctx: &mut Ctx<'_>) -> Option<NonZeroU32> {
    let Some(f) = fields.get("unit_multiplier") else {
        return Some(NonZeroU32::MIN);
    };
    let Some(n) = NonZeroU32::new(uint(f, ctx)?) else {
        ctx.error(f.line, &f.path, "must be at least 1");
        return None;
    };
    let unit = unit?;
    if period_secs(unit, n) > MAX_PERIOD_SECS {
        let name = unit.as_str().to_ascii_lowercase();
        let message = format!("a period of {n} x {name} is longer than 100 years");
        ctx.error(f.line, &f.path, message);
        return None;
    }
    Some(n)
}

/// For a funnel or a token bucket, the time a full burst takes to drain (or refill):
/// `burst x period / requests_per_unit`, at most 100 years like a period. Beyond it the state's
/// nanosecond times would pass the end of u64 time, where they can no longer limit.
fn capacity_fits(
    fields: &Fields<'_>,
    at: usize,
    (unit, multiplier, burst): (Unit, NonZeroU32, u32),
    requests: u32,
    ctx: &mut Ctx<'_>,
) -> bool {
    if requests == 0 {
        return true;
    }
    let secs = u128::from(period_secs(unit, multiplier)) * u128::from(burst) / u128::from(requests);
    if secs <= u128::from(MAX_PERIOD_SECS) {
        return true;
    }
    let years = secs / u128::from(Unit::Year.seconds());
    let message = format!(
        "a burst of {burst} at {requests} per period takes {years} years to drain \
         (burst x period / requests_per_unit must be at most 100 years)"
    );
    match fields.get("burst") {
        Some(f) => ctx.error(f.line, &f.path, message),
        None => ctx.error(at, &fields.path, message),
    }
    false
}

/// `burst`: at least 1 when given; `Some(None)` when absent (defaults to the quota).
fn burst(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<Option<u32>> {
    let Some(f) = fields.get("burst") else {
        return Some(None);
    };
    let burst = uint(f, ctx)?;
    if burst == 0 {
        ctx.error(f.line, &f.path, "must be at least 1");
        return None;
    }
    Some(Some(burst))
}

fn charge(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<Charge> {
    let Some(f) = fields.get("charge") else {
        return Some(ctx.defaults.charge);
    };
    let name = string(f, ctx)?;
    let charge = Charge::parse(&name);
    if charge.is_none() {
        let message = format!("unknown charge '{name}' (expected admitted or always)");
        ctx.error(f.line, &f.path, message);
    }
    charge
}

/// `replaces: [{name: X}, ...]`: names must be non-empty and not the limit's own.
fn replaces(fields: &Fields<'_>, own: Option<&str>, ctx: &mut Ctx<'_>) -> Option<Vec<String>> {
    let Some(f) = fields.get("replaces") else {
        return Some(Vec::new());
    };
    let YamlData::Sequence(items) = &f.node.data else {
        let message = format!("expected a sequence, got {}", describe(f.node, ctx));
        ctx.error(f.line, &f.path, message);
        return None;
    };
    let names: Vec<Option<String>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| replaced(item, &index(&f.path, i), own, ctx))
        .collect();
    names.into_iter().collect()
}

/// One `{name: X}` entry of `replaces`.
fn replaced(
    item: &MarkedYaml<'_>,
    path: &str,
    own: Option<&str>,
    ctx: &mut Ctx<'_>,
) -> Option<String> {
    let fields = mapping(item, path, line(item), &["name"], ctx)?;
    let Some(f) = fields.get("name") else {
        ctx.error(fields.line, path, "missing name of the limit to replace");
        return None;
    };
    let name = string(f, ctx)?;
    if name.is_empty() {
        ctx.error(f.line, &f.path, "must not be empty");
        return None;
    }
    if own == Some(name.as_str()) {
        let message = format!("a limit cannot replace itself ('{name}')");
        ctx.error(f.line, &f.path, message);
        return None;
    }
    Some(name)
}
