//! The validated rules model: what a rules file means once every check has passed.
//!
//! Values of these types are only built by [`crate::config::rules_file`], which guarantees the
//! invariants written on each field; [`crate::rules`] compiles them into the matching tree.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::config::calendar::Zone;
use crate::config::calendar::{Calendar, CalendarUnit};

/// Where something was defined: a rules file and a 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: Arc<PathBuf>,
    pub line: usize,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// Every domain of every rules file, validated. Domain names are unique.
///
/// Equality is by value, field by field: a reload that yields an equal model changes
/// nothing (see [`crate::reload`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RulesModel {
    pub domains: Vec<DomainRules>,
    /// The limits of limitador-format files (`super::limitador`), in file order.
    pub namespaces: Vec<super::limitador::NamespaceLimit>,
    /// The algorithm given to limits that name none (already resolved in `domains`), and to
    /// limit overrides sent by clients: `limits.default_algorithm`.
    pub default_algorithm: Algorithm,
}

/// One `domain:` document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRules {
    /// Non-empty.
    pub domain: String,
    pub descriptors: Vec<DescriptorRule>,
    pub location: Location,
    /// The defaults its limits were loaded with; a client's limit override takes them too.
    pub defaults: LimitDefaults,
}

/// How a rule's `value` matches a request entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// No `value` (or an empty one): any value; each distinct value gets its own state.
    Any,
    /// A value without `*`: equal strings only.
    Exact(String),
    /// A value with at least one `*`; each `*` matches any run of characters (also none).
    Wildcard(String),
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRule {
    /// Non-empty.
    pub key: String,
    pub value: ValueMatch,
    pub policy: Policy,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    /// Only ever true on a [`ValueMatch::Wildcard`]: every matching value shares one state.
    pub share_threshold: bool,
    /// The YAML `metadata` map, as JSON (returned in `dynamic_metadata`).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// Unique `(key, value)` pairs; at most one `ValueMatch::Any` per key.
    pub children: Vec<DescriptorRule>,
    pub location: Location,
}

/// What a descriptor rule does when a request ends exactly on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// No `rate_limit`: a pass-through node (a request ending here gets no limit).
    None,
    /// `rate_limit: {unlimited: true}`: matched, never limited, never sent to the limiter.
    Unlimited {
        name: Option<String>,
        replaces: Vec<String>,
    },
    /// One (`rate_limit`) or several (`rate_limits`) limits; never empty. No two of them share
    /// the same algorithm and period, so each has a state of its own.
    Limited(Vec<LimitRule>),
}

/// One limit, with every default resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRule {
    pub name: Option<String>,
    pub unit: Unit,
    /// Q. Zero blocks every request that has a cost.
    pub requests_per_unit: u32,
    /// The period is `unit x unit_multiplier`.
    pub unit_multiplier: NonZeroU32,
    pub algorithm: Algorithm,
    /// B: capacity of `funnel` and `token_bucket`; defaults to `requests_per_unit`.
    pub burst: u32,
    pub charge: Charge,
    pub borrow: bool,
    /// Names of other limits this one replaces when both match in one request. Never empty
    /// strings, never this limit's own name.
    pub replaces: Vec<String>,
    /// What Envoy answers a request this limit denies, when set (`on_deny`).
    pub on_deny: Option<Arc<OnDeny>>,
    /// The penalty box (`block_for`), in nanoseconds: once this limit denies a key, the key
    /// stays denied this long. 0: none. At most [`LimitRule::MAX_BLOCK_SECS`] seconds.
    pub block_nanos: u64,
    /// `scope: global` (or the domain's `scope = "global"` in the settings): counted once
    /// across regions in the home Redis (`redis.global_url`); `false`: `scope: local`.
    pub global: bool,
    /// Calendar windows (`time_zone`): only on a `fixed_window` limit whose unit is day,
    /// week, month or year, with a `unit_multiplier` of 1.
    pub time_zone: Option<Zone>,
    /// `hold_id`: only on a `concurrency` limit, the key of the request entry that names
    /// the request's hold (Envoy's `x-request-id`). That entry, the descriptor's last, is
    /// matched by this rule but is not part of the state key (docs/holds.md).
    pub hold_id: Option<String>,
}

/// A custom denial (`on_deny`): the body and headers of the 429 Envoy sends when this limit
/// denies a request, carried by the answer's `raw_body` and `response_headers_to_add`.
/// Checked at load: sizes bounded, header names tokens, no line breaks in values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnDeny {
    /// The body, at most [`OnDeny::MAX_BODY`] bytes (may be empty).
    pub body: String,
    /// Sent as the `content-type` header, when set.
    pub content_type: Option<String>,
    /// More headers, by name (lower case, sorted); at most [`OnDeny::MAX_HEADERS`].
    pub headers: Vec<(String, String)>,
}

impl OnDeny {
    /// The largest body, in bytes.
    pub(crate) const MAX_BODY: usize = 4096;
    /// The most headers (besides `content-type`).
    pub(crate) const MAX_HEADERS: usize = 16;
    /// The longest header value, in bytes.
    pub(crate) const MAX_HEADER_VALUE: usize = 1024;

    /// Every header to send: `content-type` first when set, then the others.
    pub fn all_headers(&self) -> impl Iterator<Item = (&str, &str)> {
        let content_type = self.content_type.as_deref().map(|v| ("content-type", v));
        content_type
            .into_iter()
            .chain(self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl LimitRule {
    /// The longest `block_for`: 30 days.
    pub(crate) const MAX_BLOCK_SECS: u64 = 30 * 86_400;

    /// The calendar of a limit with a `time_zone` (whose unit validation made a calendar one).
    pub fn calendar(&self) -> Option<Calendar> {
        let unit = match self.unit {
            Unit::Day => CalendarUnit::Day,
            Unit::Week => CalendarUnit::Week,
            Unit::Month => CalendarUnit::Month,
            Unit::Year => CalendarUnit::Year,
            Unit::Second | Unit::Minute | Unit::Hour => return None,
        };
        self.time_zone.map(|zone| Calendar::new(zone, unit))
    }

    /// The period P in nanoseconds (validation guarantees it fits comfortably in a u64).
    pub fn period_nanos(&self) -> u64 {
        self.unit
            .seconds()
            .saturating_mul(u64::from(self.unit_multiplier.get()))
            .saturating_mul(1_000_000_000)
    }
}

/// Time units of the rules and of the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Length in seconds: week = 7 d, month = 30 d, year = 365 d.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// Parses a rules-file unit name, case-insensitively.
    pub fn parse(name: &str) -> Option<Unit> {
        const ALL: [(&str, Unit); 7] = [
            ("second", Unit::Second),
            ("minute", Unit::Minute),
            ("hour", Unit::Hour),
            ("day", Unit::Day),
            ("week", Unit::Week),
            ("month", Unit::Month),
            ("year", Unit::Year),
        ];
        ALL.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, u)| *u)
    }

    /// The upper-case name used on the wire and in dumps.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// The largest `requests_per_unit` of a `sliding_log` limit: its memory grows with the quota
/// (one entry per admitted request in the last period). A `concurrency` limit's slots are
/// capped alike (one hold per admitted request in flight).
pub const SLIDING_LOG_MAX_QUOTA: u32 = 10_000;

/// The limiter algorithm of one limit (see docs/algorithms.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// The leaky bucket in GCRA form (the default).
    #[default]
    Funnel,
    /// Stepwise refills: Q tokens every P, at most B held.
    TokenBucket,
    /// envoyproxy/ratelimit's counter per epoch-aligned window.
    FixedWindow,
    /// The current and previous windows' counts, the previous one weighted.
    SlidingWindow,
    /// An exact log of the admitted costs of the last period.
    SlidingLog,
    /// Requests in flight: Q slots, each hold leased for P (docs/holds.md).
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Funnel,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Concurrency,
    ];

    pub fn parse(name: &str) -> Option<Algorithm> {
        Self::ALL.into_iter().find(|a| a.as_str() == name)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::Funnel => "funnel",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Every name, for messages: `a, b or c`.
    pub fn names() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|a| a.as_str()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// Whether `burst` and `borrow` mean something: the algorithms with a capacity that
    /// refills at a rate, so that debt is paid back.
    pub const fn has_capacity(self) -> bool {
        matches!(self, Algorithm::Funnel | Algorithm::TokenBucket)
    }
}

/// An algorithm in the settings (`limits.default_algorithm`), by name.
impl<'de> serde::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Algorithm, D::Error> {
        let name = String::deserialize(d)?;
        Algorithm::parse(&name).ok_or_else(|| {
            let message = format!("unknown algorithm '{name}' (expected {})", Self::names());
            serde::de::Error::custom(message)
        })
    }
}

/// Where a limit is counted (`scope`): in this region's backend, or once across regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// In this region's backend (the default).
    #[default]
    Local,
    /// Once across regions, in the home Redis (`redis.global_url`, docs/regions.md).
    Global,
}

impl Scope {
    pub fn parse(name: &str) -> Option<Scope> {
        match name {
            "local" => Some(Scope::Local),
            "global" => Some(Scope::Global),
            _ => None,
        }
    }
}

/// When a limit's cost is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Charge {
    /// Only when the whole request is admitted (the default).
    #[default]
    Admitted,
    /// Always, even when denied (usage reporting).
    Always,
}

impl Charge {
    /// The name used in rules and settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Charge::Admitted => "admitted",
            Charge::Always => "always",
        }
    }

    /// The charge policy named `name` (lower case), if there is one.
    pub fn parse(name: &str) -> Option<Charge> {
        match name {
            "admitted" => Some(Charge::Admitted),
            "always" => Some(Charge::Always),
            _ => None,
        }
    }
}

/// A charge policy in the settings (`limits.default_charge`), by name.
impl<'de> serde::Deserialize<'de> for Charge {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Charge, D::Error> {
        let name = String::deserialize(d)?;
        Charge::parse(&name).ok_or_else(|| {
            let message = format!("unknown charge '{name}' (expected admitted or always)");
            serde::de::Error::custom(message)
        })
    }
}

/// What a domain's limits take when they do not say: from the settings (`limits.default_*`,
/// or the domain's own entry of `limits.domains`), resolved when the rules are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitDefaults {
    /// The algorithm of a limit (or a client's override) that names none.
    pub algorithm: Algorithm,
    /// Whether a denied cost is charged, for a limit (or a client's override) that does not say.
    pub charge: Charge,
    /// Whether a limit that does not say is global (`limits.domains."D".scope = "global"`).
    pub global: bool,
}
