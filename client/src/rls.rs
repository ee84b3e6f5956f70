//! Envoy's `ShouldRateLimit` in typed form: [`RateLimit`] builds a request against sluice's
//! rules, [`RlsVerdict`] reads the answer.

use std::time::Duration;

use crate::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use crate::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response::Code,
};

/// A `ShouldRateLimit` request: a domain and descriptors of `(key, value)` entries.
///
/// ```
/// use sluice_client::RateLimit;
///
/// let request = RateLimit::domain("api")
///     .descriptor([("user", "alice"), ("path", "/upload")])
///     .descriptor_with_hits([("tenant", "7")], 10)
///     .to_proto();
/// assert_eq!(request.descriptors.len(), 2);
/// assert_eq!(request.hits_addend, 0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    request: RateLimitRequest,
}

impl RateLimit {
    /// A request for `domain`, with no descriptors yet.
    pub fn domain(domain: impl Into<String>) -> RateLimit {
        RateLimit {
            request: RateLimitRequest {
                domain: domain.into(),
                descriptors: Vec::new(),
                hits_addend: 0,
            },
        }
    }

    /// A descriptor costing the request's `hits` (1 by default).
    pub fn descriptor<K: Into<String>, V: Into<String>>(
        self,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> RateLimit {
        self.push(entries, None)
    }

    /// A descriptor with its own cost (0 checks only).
    pub fn descriptor_with_hits<K: Into<String>, V: Into<String>>(
        self,
        entries: impl IntoIterator<Item = (K, V)>,
        hits: u64,
    ) -> RateLimit {
        self.push(entries, Some(hits))
    }

    /// The cost of every descriptor without its own.
    pub fn hits(mut self, hits: u32) -> RateLimit {
        self.request.hits_addend = hits;
        self
    }

    fn push<K: Into<String>, V: Into<String>>(
        mut self,
        entries: impl IntoIterator<Item = (K, V)>,
        hits: Option<u64>,
    ) -> RateLimit {
        self.request.descriptors.push(RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry {
                    key: key.into(),
                    value: value.into(),
                })
                .collect(),
            limit: None,
            hits_addend: hits,
            is_negative_hits: false,
        });
        self
    }

    /// The wire request.
    pub fn to_proto(&self) -> RateLimitRequest {
        self.request.clone()
    }
}

/// The answer to a [`RateLimit`] request.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsVerdict {
    /// `overall_code` is OVER_LIMIT.
    pub over_limit: bool,
    /// Per descriptor: over its limit, what is left, and until reset (whole seconds).
    pub descriptors: Vec<DescriptorVerdict>,
    /// The whole answer, for headers and metadata.
    pub response: RateLimitResponse,
}

/// One descriptor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorVerdict {
    /// The descriptor is over its limit.
    pub over_limit: bool,
    /// The rule's requests per unit, when a rule applied.
    pub requests_per_unit: Option<u32>,
    /// What the limit would still admit.
    pub remaining: u32,
    /// How long until the limit is full again, when a rule applied.
    pub reset_after: Option<Duration>,
}

impl RlsVerdict {
    pub(crate) fn from_proto(response: RateLimitResponse) -> RlsVerdict {
        let descriptors = response
            .statuses
            .iter()
            .map(|s| DescriptorVerdict {
                over_limit: s.code == Code::OverLimit as i32,
                requests_per_unit: s.current_limit.as_ref().map(|l| l.requests_per_unit),
                remaining: s.limit_remaining,
                reset_after: s
                    .duration_until_reset
                    .as_ref()
                    .map(|d| Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))),
            })
            .collect();
        RlsVerdict {
            over_limit: response.overall_code == Code::OverLimit as i32,
            descriptors,
            response,
        }
    }
}
