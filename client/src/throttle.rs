//! The `sluice.v1.Throttle` call in typed form: [`Limit`] and [`Throttle`] build a request,
//! [`Verdict`] reads the answer.

use std::time::Duration;

use crate::pb::sluice::v1 as pb;

/// The algorithm that keeps a key's state (the server's default is the funnel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// CL.THROTTLE's leaky bucket (GCRA).
    #[default]
    Funnel,
    /// A token bucket refilled at the steady rate.
    TokenBucket,
    /// A counter per period, reset at its end.
    FixedWindow,
    /// The current and the previous window, weighted.
    SlidingWindow,
    /// Every admission's time, over one period.
    SlidingLog,
}

impl Algorithm {
    fn to_proto(self) -> pb::Algorithm {
        match self {
            Algorithm::Funnel => pb::Algorithm::Funnel,
            Algorithm::TokenBucket => pb::Algorithm::TokenBucket,
            Algorithm::FixedWindow => pb::Algorithm::FixedWindow,
            Algorithm::SlidingWindow => pb::Algorithm::SlidingWindow,
            Algorithm::SlidingLog => pb::Algorithm::SlidingLog,
        }
    }
}

/// A key's limit: `count` per `period`, with CL.THROTTLE's burst (a fresh key admits
/// `max_burst + 1` at once; the default `max_burst` is 0: one at a time, evenly spaced).
///
/// ```
/// use std::time::Duration;
/// use sluice_client::Limit;
///
/// let limit = Limit::per_minute(30).max_burst(15);
/// assert_eq!(limit.capacity(), 16);
/// assert_eq!(Limit::per(5, Duration::from_millis(500)).capacity(), 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    count: u32,
    period: Duration,
    max_burst: u32,
    algorithm: Algorithm,
}

impl Limit {
    /// `count` per `period` (whole milliseconds are sent; sluice refuses 0).
    pub fn per(count: u32, period: Duration) -> Limit {
        Limit {
            count,
            period,
            max_burst: 0,
            algorithm: Algorithm::Funnel,
        }
    }

    /// `count` a second.
    pub fn per_second(count: u32) -> Limit {
        Limit::per(count, Duration::from_secs(1))
    }

    /// `count` a minute.
    pub fn per_minute(count: u32) -> Limit {
        Limit::per(count, Duration::from_secs(60))
    }

    /// `count` an hour.
    pub fn per_hour(count: u32) -> Limit {
        Limit::per(count, Duration::from_secs(3600))
    }

    /// Units admitted on top of the steady rate.
    pub fn max_burst(mut self, max_burst: u32) -> Limit {
        self.max_burst = max_burst;
        self
    }

    /// The algorithm (the funnel by default).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Limit {
        self.algorithm = algorithm;
        self
    }

    /// The most a fresh key admits at once with the buckets: `max_burst + 1`.
    pub fn capacity(&self) -> u64 {
        u64::from(self.max_burst) + 1
    }

    /// `(max_burst, count, period_ms, algorithm)` as a request carries them.
    pub(crate) fn to_fields(self) -> (u32, u32, u64, i32) {
        let period_ms = u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX);
        let algorithm = self.algorithm.to_proto().into();
        (self.max_burst, self.count, period_ms, algorithm)
    }
}

/// One Throttle call: one or more keys, decided all or nothing.
///
/// ```
/// use sluice_client::{Limit, Throttle};
///
/// // Take 3 units from a tenant's key and 1 from the shared one, or nothing.
/// let call = Throttle::key("tenant:7", Limit::per_minute(600).max_burst(99))
///     .and("api:global", Limit::per_second(1000))
///     .quantity(3)
///     .name("jobs");
/// assert_eq!(call.to_proto().keys.len(), 2);
/// assert_eq!(call.to_proto().keys[0].quantity, Some(3));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Throttle {
    keys: Vec<pb::ThrottleKey>,
    name: String,
}

impl Throttle {
    /// A call on one key, taking 1 unit.
    pub fn key(key: impl Into<Vec<u8>>, limit: Limit) -> Throttle {
        Throttle {
            keys: Vec::new(),
            name: String::new(),
        }
        .and(key, limit)
    }

    /// Another key, taking the same quantity as the ones before it.
    pub fn and(mut self, key: impl Into<Vec<u8>>, limit: Limit) -> Throttle {
        let quantity = self.keys.last().and_then(|k| k.quantity);
        self.keys.push(pb::ThrottleKey {
            id: Some(pb::throttle_key::Id::KeyBytes(key.into())),
            max_burst: limit.max_burst,
            count: limit.count,
            period_ms: u64::try_from(limit.period.as_millis()).unwrap_or(u64::MAX),
            quantity,
            refund: false,
            algorithm: limit.algorithm.to_proto().into(),
        });
        self
    }

    /// Units every key takes (1 by default; 0 only checks; negative gives back).
    pub fn quantity(mut self, quantity: i64) -> Throttle {
        for k in &mut self.keys {
            k.quantity = Some(quantity);
        }
        self
    }

    /// Only asks, takes nothing.
    pub fn check_only(self) -> Throttle {
        self.quantity(0)
    }

    /// Gives `quantity` units back to every key (always admitted).
    pub fn refund(mut self, quantity: u32) -> Throttle {
        for k in &mut self.keys {
            k.quantity = Some(i64::from(quantity));
            k.refund = true;
        }
        self
    }

    /// The label of sluice's `sluice_throttle_requests_total` metric.
    pub fn name(mut self, name: impl Into<String>) -> Throttle {
        self.name = name.into();
        self
    }

    /// The wire request.
    pub fn to_proto(&self) -> pb::ThrottleRequest {
        pb::ThrottleRequest {
            keys: self.keys.clone(),
            name: self.name.clone(),
        }
    }
}

/// Where a verdict came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// sluice decided.
    Sluice,
    /// sluice could not be asked in time; the fail-open policy admitted.
    FailedOpen,
    /// sluice could not be asked in time; the fail-closed policy refused.
    FailedClosed,
}

/// The answer to a [`Throttle`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Some key was limited (then nothing was taken), or the fail-closed policy refused.
    pub limited: bool,
    /// When limited: how long until the call may be admitted; `None` when waiting cannot help
    /// (a quantity above a key's limit) or is unknown (fail-closed).
    pub retry_after: Option<Duration>,
    /// One per key, in call order (empty when sluice was not reached).
    pub keys: Vec<KeyVerdict>,
    /// Whether sluice answered, or the fail policy did.
    pub source: Source,
}

/// One key's answer: CL.THROTTLE's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyVerdict {
    /// The key did not admit the quantity.
    pub limited: bool,
    /// The most this key admits at once (`max_burst + 1`).
    pub limit: u64,
    /// Units it would still admit now.
    pub remaining: u64,
    /// When limited: until its quantity would be admitted; `None` if never.
    pub retry_after: Option<Duration>,
    /// Until the key is back to its full limit.
    pub reset_after: Duration,
}

impl Verdict {
    pub(crate) fn from_proto(r: pb::ThrottleResponse) -> Verdict {
        Verdict {
            limited: r.limited,
            retry_after: r.limited.then(|| ms(r.retry_after_ms)).flatten(),
            keys: r.results.into_iter().map(KeyVerdict::from_proto).collect(),
            source: Source::Sluice,
        }
    }

    pub(crate) fn failed(source: Source) -> Verdict {
        Verdict {
            limited: source == Source::FailedClosed,
            retry_after: None,
            keys: Vec::new(),
            source,
        }
    }

    /// A limited call that waiting can never admit.
    pub fn never(&self) -> bool {
        self.limited && self.retry_after.is_none() && self.source == Source::Sluice
    }

    /// The key to report in headers: the limited one that waits longest, else the one with
    /// least remaining.
    pub fn headline(&self) -> Option<&KeyVerdict> {
        let limited = self
            .keys
            .iter()
            .filter(|k| k.limited)
            .max_by_key(|k| k.retry_after.unwrap_or(Duration::MAX));
        limited.or_else(|| self.keys.iter().min_by_key(|k| k.remaining))
    }
}

impl KeyVerdict {
    fn from_proto(r: pb::ThrottleResult) -> KeyVerdict {
        KeyVerdict {
            limited: r.limited,
            limit: r.limit,
            remaining: r.remaining,
            retry_after: r.limited.then(|| ms(r.retry_after_ms)).flatten(),
            reset_after: Duration::from_millis(r.reset_after_ms),
        }
    }
}

/// Milliseconds, `None` when negative (CL.THROTTLE's -1).
fn ms(value: i64) -> Option<Duration> {
    u64::try_from(value).ok().map(Duration::from_millis)
}
