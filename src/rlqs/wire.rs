//! Protobuf <-> RLQS domain types: a usage report checked into [`Usage`]s (a malformed one is
//! `INVALID_ARGUMENT` naming the field), and bucket actions built from decisions.

use tonic::Status;

use super::bucket::BucketKey;
use super::share::TokenBucketSpec;
use crate::config::settings::InputSettings;
use crate::proto::envoy::service::rate_limit_quota::v3 as pb;
use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use pb::rate_limit_quota_response::BucketAction;
use pb::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};

/// One bucket's usage in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Usage {
    pub key: BucketKey,
    pub allowed: u64,
    pub denied: u64,
    /// Whole seconds since the bucket's previous report (0 in its first).
    pub elapsed_secs: u64,
}

/// What a bucket is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Assignment {
    TokenBucket(TokenBucketSpec),
    DenyAll,
    AllowAll,
}

impl Assignment {
    /// The `kind` label of the assignments metric.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Assignment::TokenBucket(_) => "token_bucket",
            Assignment::DenyAll => "deny_all",
            Assignment::AllowAll => "allow_all",
        }
    }
}

/// Checks a report's domain against the stream's (`None` before the first report) and
/// returns the domain the stream has from now on.
pub(super) fn domain(
    report: &pb::RateLimitQuotaUsageReports,
    stream: Option<&str>,
    bounds: &InputSettings,
) -> Result<String, Status> {
    let given = report.domain.as_str();
    match stream {
        None if given.is_empty() => Err(Status::invalid_argument(
            "domain: the first report of a stream must name the rules domain",
        )),
        None if given.len() > bounds.max_domain_bytes => Err(Status::invalid_argument(format!(
            "domain: {} bytes, more than input.max_domain_bytes = {}",
            given.len(),
            bounds.max_domain_bytes
        ))),
        None => Ok(given.to_owned()),
        Some(d) if !given.is_empty() && given != d => Err(Status::invalid_argument(format!(
            "domain: a stream serves one domain, `{d}`; got `{given}` (open another stream)"
        ))),
        Some(d) => Ok(d.to_owned()),
    }
}

/// Every bucket usage of a report, checked.
pub(super) fn usages(
    report: &pb::RateLimitQuotaUsageReports,
    bounds: &InputSettings,
) -> Result<Vec<Usage>, Status> {
    report
        .bucket_quota_usages
        .iter()
        .enumerate()
        .map(|(i, u)| usage(i, u, bounds))
        .collect()
}

fn usage(
    i: usize,
    u: &pb::rate_limit_quota_usage_reports::BucketQuotaUsage,
    bounds: &InputSettings,
) -> Result<Usage, Status> {
    let at = |field: &str| format!("bucket_quota_usages[{i}].{field}");
    let id = u
        .bucket_id
        .as_ref()
        .ok_or_else(|| Status::invalid_argument(format!("{} is required", at("bucket_id"))))?;
    let elapsed_secs = match &u.time_elapsed {
        None => 0,
        Some(d) if d.seconds < 0 || d.nanos < 0 => {
            return Err(Status::invalid_argument(format!(
                "{} must not be negative",
                at("time_elapsed")
            )));
        }
        Some(d) => d.seconds as u64,
    };
    Ok(Usage {
        key: bucket_key(id, &at("bucket_id.bucket"), bounds)?,
        allowed: u.num_requests_allowed,
        denied: u.num_requests_denied,
        elapsed_secs,
    })
}

/// A bucket id's entries, sorted by key, within the input bounds.
fn bucket_key(id: &pb::BucketId, at: &str, b: &InputSettings) -> Result<BucketKey, Status> {
    let n = id.bucket.len();
    if n == 0 {
        return Err(Status::invalid_argument(format!(
            "{at} must have at least one entry"
        )));
    }
    if n > b.max_entries {
        return Err(Status::invalid_argument(format!(
            "{at}: {n} entries, more than input.max_entries = {}",
            b.max_entries
        )));
    }
    let mut key: BucketKey = Vec::with_capacity(n);
    for (k, v) in &id.bucket {
        if k.is_empty() || v.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{at}: keys and values must not be empty (key `{k}`)"
            )));
        }
        if k.len() > b.max_key_bytes || v.len() > b.max_value_bytes {
            return Err(Status::invalid_argument(format!(
                "{at}: key `{}`: longer than input.max_key_bytes = {} or its value longer \
                 than input.max_value_bytes = {}",
                k.chars().take(64).collect::<String>(),
                b.max_key_bytes,
                b.max_value_bytes
            )));
        }
        key.push((k.clone(), v.clone()));
    }
    key.sort();
    Ok(key)
}

/// The bucket id of a bucket key.
pub(super) fn bucket_id(key: &BucketKey) -> pb::BucketId {
    pb::BucketId {
        bucket: key.iter().cloned().collect(),
    }
}

/// An assignment for `key`, valid `ttl_secs`.
pub(super) fn assign(key: &BucketKey, assignment: Assignment, ttl_secs: u64) -> BucketAction {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket(tb) => Strategy::TokenBucket(TokenBucket {
            max_tokens: tb.max_tokens,
            tokens_per_fill: Some(tb.tokens_per_fill),
            fill_interval: Some(secs(tb.fill_interval_secs)),
        }),
    };
    BucketAction {
        bucket_id: Some(bucket_id(key)),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(secs(ttl_secs)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// Tells the data plane to forget `key`.
pub(super) fn abandon(key: &BucketKey) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(key)),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn secs(s: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::rate_limit_quota_usage_reports::BucketQuotaUsage;

    fn report(domain: &str, buckets: Vec<Vec<(&str, &str)>>) -> pb::RateLimitQuotaUsageReports {
        pb::RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: buckets
                .into_iter()
                .map(|b| BucketQuotaUsage {
                    bucket_id: Some(pb::BucketId {
                        bucket: b
                            .into_iter()
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                            .collect(),
                    }),
                    time_elapsed: Some(prost_types::Duration {
                        seconds: 5,
                        nanos: 0,
                    }),
                    num_requests_allowed: 3,
                    num_requests_denied: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn the_first_report_names_the_domain_and_later_ones_keep_it() {
        let b = InputSettings::default();
        let err = domain(&report("", vec![]), None, &b).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().starts_with("domain:"), "{}", err.message());
        assert_eq!(domain(&report("d", vec![]), None, &b).unwrap(), "d");
        assert_eq!(domain(&report("", vec![]), Some("d"), &b).unwrap(), "d");
        let err = domain(&report("e", vec![]), Some("d"), &b).unwrap_err();
        assert!(err.message().contains("one domain"), "{}", err.message());
    }

    #[test]
    fn malformed_buckets_name_their_field() {
        let b = InputSettings::default();
        let u = usages(&report("d", vec![vec![("name", "a")]]), &b).unwrap();
        assert_eq!(u[0].key, vec![("name".to_owned(), "a".to_owned())]);
        assert_eq!((u[0].allowed, u[0].denied, u[0].elapsed_secs), (3, 1, 5));
        for (bucket, field) in [
            (vec![], "bucket_quota_usages[1].bucket_id.bucket must have"),
            (
                vec![("", "v")],
                "bucket_quota_usages[1].bucket_id.bucket: keys",
            ),
            (
                vec![("k", "")],
                "bucket_quota_usages[1].bucket_id.bucket: keys",
            ),
        ] {
            let r = report("d", vec![vec![("ok", "1")], bucket]);
            let err = usages(&r, &b).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().starts_with(field), "{}", err.message());
        }
        let mut r = report("d", vec![vec![("k", "v")]]);
        r.bucket_quota_usages[0].bucket_id = None;
        let err = usages(&r, &b).unwrap_err();
        assert_eq!(
            err.message(),
            "bucket_quota_usages[0].bucket_id is required"
        );
        r = report("d", vec![vec![("k", "v")]]);
        r.bucket_quota_usages[0].time_elapsed = Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        });
        assert!(usages(&r, &b).unwrap_err().message().contains("negative"));
        let long = "x".repeat(b.max_value_bytes + 1);
        let r = report("d", vec![vec![("k", long.as_str())]]);
        assert!(
            usages(&r, &b)
                .unwrap_err()
                .message()
                .contains("max_value_bytes")
        );
    }
}
