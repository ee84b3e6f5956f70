//! A limit's `algorithm`, and the settings that only some algorithms take: the default from
//! the settings when none is named, `burst` and `borrow` only where there is a capacity, and
//! the quota cap of `sliding_log` and `concurrency`, and what `concurrency` refuses.

use super::scalar::string;
use super::tree::{Ctx, Fields};
use crate::config::model::{Algorithm, Charge, SLIDING_LOG_MAX_QUOTA as MAX_QUOTA};

/// The algorithm and whether it was written (`false`: the default of the settings).
pub(super) fn algorithm(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<(Algorithm, bool)> {
    let Some(f) = fields.get("algorithm") else {
        return Some((ctx.defaults.algorithm, false));
    };
    let name = string(f, ctx)?;
    let algorithm = Algorithm::parse(&name);
    if algorithm.is_none() {
        let message = format!(
            "unknown algorithm '{name}' (expected {})",
            Algorithm::names()
        );
        ctx.error(f.line, &f.path, message);
    }
    algorithm.map(|a| (a, true))
}

/// `burst` and `borrow: true` only mean something to an algorithm with a capacity; a sliding
/// log keeps one entry per admitted request, so its quota is capped.
pub(super) fn fits_algorithm(
    fields: &Fields<'_>,
    (algorithm, written): (Algorithm, bool),
    (requests, borrow): (Option<u32>, bool),
    ctx: &mut Ctx<'_>,
) -> bool {
    if algorithm.has_capacity() {
        return true;
    }
    let which = if written {
        format!("this limit's algorithm is {}", algorithm.as_str())
    } else {
        format!(
            "this limit's algorithm is {} ({})",
            algorithm.as_str(),
            ctx.algorithm_source()
        )
    };
    let mut ok = true;
    if let Some(f) = fields.get("burst") {
        let message = format!("burst only applies to funnel and token_bucket; {which}");
        ctx.error(f.line, &f.path, message);
        ok = false;
    }
    if let Some(f) = fields.get("borrow").filter(|_| borrow) {
        let message = format!(
            "borrow only applies to funnel and token_bucket, whose debt is paid back at their \
             rate (a window forgets it when the window passes); {which}"
        );
        ctx.error(f.line, &f.path, message);
        ok = false;
    }
    let over = requests.filter(|&q| algorithm == Algorithm::SlidingLog && q > MAX_QUOTA);
    if let (Some(q), Some(f)) = (over, fields.get("requests_per_unit")) {
        let message = format!(
            "sliding_log keeps one entry per admitted request: requests_per_unit must be at \
             most {MAX_QUOTA} with it, got {q} (sliding_window needs two counters whatever the \
             quota); {which}"
        );
        ctx.error(f.line, &f.path, message);
        ok = false;
    }
    ok &= algorithm != Algorithm::Concurrency || slots_fit(fields, requests, &which, ctx);
    ok
}

/// A `concurrency` limit keeps one hold per admitted request: its slots are capped like a
/// sliding log's quota.
fn slots_fit(fields: &Fields<'_>, requests: Option<u32>, which: &str, ctx: &mut Ctx<'_>) -> bool {
    let over = requests.filter(|&q| q > MAX_QUOTA);
    let (Some(q), Some(f)) = (over, fields.get("requests_per_unit")) else {
        return true;
    };
    let message = format!(
        "concurrency keeps one hold per admitted request: requests_per_unit (the slots) must \
         be at most {MAX_QUOTA} with it, got {q}; {which}"
    );
    ctx.error(f.line, &f.path, message);
    false
}

/// A `concurrency` limit's charge: `always` unless written (a denied request's cost is kept
/// as pending its release, which Envoy's plain layout sends for denied requests too), whatever
/// the domain's or the settings' default; `admitted` when written (a layout that releases only
/// admitted requests, docs/holds.md).
pub(super) fn concurrency_charge(
    fields: &Fields<'_>,
    algorithm: Option<(Algorithm, bool)>,
    charge: Option<Charge>,
) -> Option<Charge> {
    if algorithm.is_none_or(|(a, _)| a != Algorithm::Concurrency) || fields.get("charge").is_some()
    {
        return charge;
    }
    Some(Charge::Always)
}
