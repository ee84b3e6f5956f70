//! `[rlqs]`: the Rate Limit Quota Service's bounds and assignment lifetime (docs/rlqs.md).

use serde::Deserialize;

/// `[rlqs]`: every value is at least 1.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RlqsSettings {
    /// Most RLQS streams open at once; one more is refused with `RESOURCE_EXHAUSTED`.
    pub max_streams: usize,
    /// Most buckets one stream holds; further buckets get no assignment.
    pub max_buckets_per_stream: usize,
    /// Most buckets held over all streams; further buckets get no assignment.
    pub max_buckets: usize,
    /// `assignment_time_to_live` of every assignment, in seconds; a bucket not reported for
    /// this long is forgotten. Envoy reports every 5 s: the default outlives two missed reports.
    pub assignment_ttl_secs: u64,
}

impl Default for RlqsSettings {
    fn default() -> Self {
        RlqsSettings {
            max_streams: 1024,
            max_buckets_per_stream: 10_000,
            max_buckets: 100_000,
            assignment_ttl_secs: 15,
        }
    }
}

impl RlqsSettings {
    /// Names every value that is 0.
    pub fn check(&self) -> Result<(), String> {
        let zero = super::zero_names([
            ("max_streams", self.max_streams as u64),
            ("max_buckets_per_stream", self.max_buckets_per_stream as u64),
            ("max_buckets", self.max_buckets as u64),
            ("assignment_ttl_secs", self.assignment_ttl_secs),
        ]);
        if zero.is_empty() {
            Ok(())
        } else {
            Err(format!("rlqs: must be at least 1: {}", zero.join(", ")))
        }
    }
}
