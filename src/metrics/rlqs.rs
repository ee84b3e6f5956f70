//! The Rate Limit Quota Service's metrics: what data planes report per rule, the streams open,
//! the buckets held, and the assignments sent.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReportedLabels {
    domain: String,
    rule: String,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// The RLQS families, registered with the app's registry.
#[derive(Debug, Default)]
pub struct RlqsMetrics {
    reported: Family<ReportedLabels, Counter>,
    streams: Gauge,
    buckets: Gauge,
    assignments: Family<KindLabels, Counter>,
    refused: Family<KindLabels, Counter>,
}

impl RlqsMetrics {
    pub(super) fn new(registry: &mut Registry) -> RlqsMetrics {
        let m = RlqsMetrics::default();
        register!(
            registry,
            "rlqs_reported_requests", "Requests data planes reported over RLQS, by domain, rule and result (allowed, denied)", m.reported;
            "rlqs_streams", "RLQS streams open", m.streams;
            "rlqs_buckets", "RLQS buckets held over all streams", m.buckets;
            "rlqs_assignments", "RLQS bucket actions sent, by kind (token_bucket, deny_all, allow_all, abandon)", m.assignments;
            "rlqs_refused", "RLQS streams and buckets refused at a bound, by kind (stream, bucket)", m.refused;
        );
        m
    }

    /// Streams open now.
    pub fn streams_open(&self) -> i64 {
        self.streams.get()
    }

    /// Buckets held now.
    pub fn buckets_held(&self) -> i64 {
        self.buckets.get()
    }
}

impl crate::rlqs::RlqsObserver for RlqsMetrics {
    /// Counts what a data plane reported for a bucket of `rule`.
    fn reported(&self, domain: &str, rule: &str, allowed: u64, denied: u64) {
        for (result, n) in [("allowed", allowed), ("denied", denied)] {
            let labels = ReportedLabels {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
                result,
            };
            self.reported.get_or_create(&labels).inc_by(n);
        }
    }

    /// A stream opened (`+1`) or closed (`-1`).
    fn streams(&self, delta: i64) {
        self.streams.inc_by(delta);
    }

    /// Buckets taken (`+n`) or dropped (`-n`).
    fn buckets(&self, delta: i64) {
        self.buckets.inc_by(delta);
    }

    /// One bucket action of `kind` sent.
    fn assigned(&self, kind: &'static str) {
        self.assignments.get_or_create(&KindLabels { kind }).inc();
    }

    /// A stream or a bucket refused at a bound.
    fn refused(&self, kind: &'static str) {
        self.refused.get_or_create(&KindLabels { kind }).inc();
    }
}
