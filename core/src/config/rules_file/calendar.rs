//! Two keys of a limit: `block_for` (the penalty box: a duration) and `time_zone` (calendar
//! windows for a `fixed_window` limit: an IANA zone name), with their checks.

use super::scalar::string;
use super::tree::{Ctx, Fields};
use crate::config::model::{Algorithm, LimitRule, Unit, Zone};

/// `block_for: <duration>`: `<n><unit>` with unit `ms`, `s`, `m`, `h` or `d` (`90s`, `10m`),
/// or a whole number of seconds; more than 0 and at most 30 days. `Some(0)` when absent.
pub(super) fn block_for(fields: &Fields<'_>, ctx: &mut Ctx<'_>) -> Option<u64> {
    let Some(f) = fields.get("block_for") else {
        return Some(0);
    };
    let text = string(f, ctx)?;
    let Some(nanos) = duration_nanos(text.trim()) else {
        let message = format!(
            "invalid duration '{text}' (expected a number and a unit: ms, s, m, h or d, \
             e.g. 30s or 10m)"
        );
        ctx.error(f.line, &f.path, message);
        return None;
    };
    let max = LimitRule::MAX_BLOCK_SECS * 1_000_000_000;
    if nanos == 0 || nanos > max {
        let message = format!("must be more than 0 and at most 30 days, got '{text}'");
        ctx.error(f.line, &f.path, message);
        return None;
    }
    Some(nanos)
}

/// A duration in nanoseconds; `None` when it is not one (or overflows).
fn duration_nanos(text: &str) -> Option<u64> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// `time_zone: <IANA name>`: a known zone, on a `fixed_window` limit whose unit is day, week,
/// month or year and whose `unit_multiplier` is 1. `Some(None)` when absent.
pub(super) fn time_zone(
    fields: &Fields<'_>,
    (algorithm, unit): (Option<Algorithm>, Option<Unit>),
    ctx: &mut Ctx<'_>,
) -> Option<Option<Zone>> {
    let Some(f) = fields.get("time_zone") else {
        return Some(None);
    };
    let name = string(f, ctx)?;
    let zone = match Zone::named(name.trim()) {
        Ok(zone) => Some(zone),
        Err(message) => {
            ctx.error(f.line, &f.path, message);
            None
        }
    };
    let mut ok = true;
    if let Some(a) = algorithm.filter(|&a| a != Algorithm::FixedWindow) {
        let message = format!(
            "time_zone only applies to fixed_window (calendar windows); this limit's algorithm \
             is {}",
            a.as_str()
        );
        ctx.error(f.line, &f.path, message);
        ok = false;
    }
    if let Some(u) = unit.filter(|u| matches!(u, Unit::Second | Unit::Minute | Unit::Hour)) {
        let message = format!(
            "time_zone aligns windows to local days, ISO weeks, calendar months or years; \
             unit {} has no calendar meaning (use day, week, month or year)",
            u.as_str().to_ascii_lowercase()
        );
        ctx.error(f.line, &f.path, message);
        ok = false;
    }
    if let Some(m) = fields.get("unit_multiplier") {
        let message = "time_zone windows are one calendar unit long: unit_multiplier must not \
                       be set with it";
        ctx.error(m.line, &m.path, message);
        ok = false;
    }
    if ok { zone.map(Some) } else { None }
}

#[cfg(test)]
mod tests {
    use super::duration_nanos;

    #[test]
    fn durations_take_a_unit() {
        const SEC: u64 = 1_000_000_000;
        assert_eq!(duration_nanos("30"), Some(30 * SEC));
        assert_eq!(duration_nanos("30s"), Some(30 * SEC));
        assert_eq!(duration_nanos("250ms"), Some(SEC / 4));
        assert_eq!(duration_nanos("10m"), Some(600 * SEC));
        assert_eq!(duration_nanos("2h"), Some(7_200 * SEC));
        assert_eq!(duration_nanos("1d"), Some(86_400 * SEC));
        for bad in [
            "",
            "s",
            "1.5s",
            "-1s",
            "10 parsecs",
            "99999999999999999999d",
        ] {
            assert_eq!(duration_nanos(bad), None, "{bad}");
        }
    }
}
