//! Calendar windows (`time_zone` on a `fixed_window` limit): a window is one local day, ISO
//! week (Monday to Monday), calendar month or calendar year of an IANA time zone, from its
//! first instant to the first instant of the next one. A day is then 23, 24 or 25 hours long
//! across a daylight-saving change, and a month 28 to 31 days.
//!
//! Zones come from the tz database bundled with the `jiff` crate (so every replica, whatever
//! its host's `/usr/share/zoneinfo`, computes the same boundaries from the same rules), and are
//! interned: a [`Zone`] is a small copyable handle, so that a limit's parameters stay `Copy`.
//! Both backends compute windows here, from their clock: the Redis backend sends the window's
//! boundaries to its script, which never computes zones itself.
//!
//! ```
//! use sluice_core::config::calendar::{Calendar, CalendarUnit, Zone};
//! const SEC: u64 = 1_000_000_000;
//! let berlin = Zone::named("Europe/Berlin").unwrap();
//! let day = Calendar::new(berlin, CalendarUnit::Day);
//! // 2026-03-29 12:00 UTC, the day Berlin moves to summer time: a 23-hour day.
//! let (start, end) = day.window(1_774_785_600 * SEC);
//! assert_eq!((end - start) / SEC, 23 * 3_600);
//! ```

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan as _};

/// One interned time zone: its IANA name and its rules.
struct ZoneData {
    name: String,
    tz: TimeZone,
}

/// Every zone named so far, once each (at most the tz database's few hundred names, so the
/// interned zones are never freed).
static ZONES: LazyLock<Mutex<HashMap<String, &'static ZoneData>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// An IANA time zone from the bundled tz database; equal when the names are.
#[derive(Clone, Copy)]
pub struct Zone(&'static ZoneData);

impl Zone {
    /// The zone of this IANA name (`Europe/Berlin`, `UTC`, ...); an error names what is wrong.
    pub fn named(name: &str) -> Result<Zone, String> {
        let mut zones = ZONES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(data) = zones.get(name) {
            return Ok(Zone(data));
        }
        let tz = jiff::tz::db().get(name).map_err(|_| {
            format!("unknown time zone '{name}' (expected an IANA name such as Europe/Berlin)")
        })?;
        let data: &'static ZoneData = Box::leak(Box::new(ZoneData {
            name: name.to_owned(),
            tz,
        }));
        zones.insert(name.to_owned(), data);
        Ok(Zone(data))
    }

    /// Its IANA name.
    pub fn name(&self) -> &'static str {
        &self.0.name
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Zone {}

impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl std::fmt::Debug for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.name)
    }
}

/// The calendar length of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From local midnight to the next.
    Day,
    /// An ISO week: from Monday's local midnight to the next Monday's.
    Week,
    /// From the first of a month's local midnight to the next month's.
    Month,
    /// From January 1st's local midnight to the next year's.
    Year,
}

/// A limit's calendar: windows of one unit in one zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    pub zone: Zone,
    pub unit: CalendarUnit,
}

const DAY: u64 = 86_400 * 1_000_000_000;

impl Calendar {
    pub fn new(zone: Zone, unit: CalendarUnit) -> Calendar {
        Calendar { zone, unit }
    }

    /// The window holding `now` (nanoseconds since the Unix epoch): its first instant and the
    /// first instant of the next window. Outside the range the tz database covers (before
    /// year -9999 or after 9999), a UTC day.
    pub fn window(&self, now: u64) -> (u64, u64) {
        self.bounds(now).unwrap_or_else(|| {
            let start = now - now % DAY;
            (start, start.saturating_add(DAY))
        })
    }

    /// The windows before and after the one holding `now` too: `(previous start, start, end,
    /// next end)`. The Redis script picks among them by its own clock.
    pub fn around(&self, now: u64) -> [u64; 4] {
        let (start, end) = self.window(now);
        let (previous, _) = self.window(start.saturating_sub(1));
        let (_, next) = self.window(end);
        [previous, start, end, next]
    }

    fn bounds(&self, now: u64) -> Option<(u64, u64)> {
        let tz = &self.zone.0.tz;
        let today = Timestamp::from_nanosecond(i128::from(now))
            .ok()?
            .to_zoned(tz.clone())
            .date();
        let first = match self.unit {
            CalendarUnit::Day => today,
            CalendarUnit::Week => {
                let back = i64::from(today.weekday().to_monday_zero_offset());
                today.checked_sub(back.days()).ok()?
            }
            CalendarUnit::Month => today.first_of_month(),
            CalendarUnit::Year => today.first_of_year(),
        };
        let next = match self.unit {
            CalendarUnit::Day => first.checked_add(1.day()),
            CalendarUnit::Week => first.checked_add(7.days()),
            CalendarUnit::Month => first.checked_add(1.month()),
            CalendarUnit::Year => first.checked_add(1.year()),
        }
        .ok()?;
        Some((day_start(first, tz)?, day_start(next, tz)?))
    }
}

/// The first instant of a local date (midnight, or the end of a gap that skips it).
fn day_start(date: Date, tz: &TimeZone) -> Option<u64> {
    let start = date.to_zoned(tz.clone()).ok()?.start_of_day().ok()?;
    u64::try_from(start.timestamp().as_nanosecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    const HOUR: u64 = 3_600 * SEC;

    /// Nanoseconds of a UTC civil time.
    fn utc(text: &str) -> u64 {
        let ts: Timestamp = text.parse().expect("a timestamp");
        u64::try_from(ts.as_nanosecond()).expect("after 1970")
    }

    #[test]
    fn berlin_days_are_23_and_25_hours_at_the_changes() {
        let day = Calendar::new(Zone::named("Europe/Berlin").unwrap(), CalendarUnit::Day);
        let (s, e) = day.window(utc("2026-03-29T12:00:00Z"));
        assert_eq!(
            (s, e),
            (utc("2026-03-28T23:00:00Z"), utc("2026-03-29T22:00:00Z"))
        );
        assert_eq!(e - s, 23 * HOUR);
        let (s, e) = day.window(utc("2026-10-25T12:00:00Z"));
        assert_eq!(
            (s, e),
            (utc("2026-10-24T22:00:00Z"), utc("2026-10-25T23:00:00Z"))
        );
        assert_eq!(e - s, 25 * HOUR);
        // One nanosecond before local midnight is the day before.
        assert_eq!(day.window(e - 1).1, e);
        assert_eq!(day.window(e).0, e);
    }

    #[test]
    fn weeks_start_on_monday_and_months_are_calendar_months() {
        let ny = Zone::named("America/New_York").unwrap();
        let week = Calendar::new(ny, CalendarUnit::Week);
        // Sunday 2026-03-08, the day New York moves to summer time.
        let (s, e) = week.window(utc("2026-03-08T12:00:00Z"));
        assert_eq!(
            (s, e),
            (utc("2026-03-02T05:00:00Z"), utc("2026-03-09T04:00:00Z"))
        );
        let month = Calendar::new(ny, CalendarUnit::Month);
        let (s, e) = month.window(utc("2026-02-28T12:00:00Z"));
        assert_eq!(
            (s, e),
            (utc("2026-02-01T05:00:00Z"), utc("2026-03-01T05:00:00Z"))
        );
        let year = Calendar::new(ny, CalendarUnit::Year);
        assert_eq!(
            year.window(utc("2026-06-01T00:00:00Z")).1,
            utc("2027-01-01T05:00:00Z")
        );
        assert_eq!(
            month.around(utc("2026-02-28T12:00:00Z")),
            [
                utc("2026-01-01T05:00:00Z"),
                utc("2026-02-01T05:00:00Z"),
                utc("2026-03-01T05:00:00Z"),
                utc("2026-04-01T04:00:00Z"),
            ]
        );
    }

    #[test]
    fn unknown_zones_are_errors_and_names_are_interned() {
        assert!(Zone::named("Mars/Olympus").is_err());
        let a = Zone::named("Asia/Kolkata").unwrap();
        assert_eq!(a, Zone::named("Asia/Kolkata").unwrap());
        assert_eq!(a.name(), "Asia/Kolkata");
        let day = Calendar::new(a, CalendarUnit::Day);
        assert_eq!(
            day.window(utc("2026-01-01T00:00:00Z")).0,
            utc("2025-12-31T18:30:00Z")
        );
    }
}
