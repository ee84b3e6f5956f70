//! The latency histogram of `ShouldRateLimit`, written with atomics only.
//!
//! Every request records one observation from whichever worker thread answered it. A histogram
//! behind a lock makes two workers wait for each other, and on a machine shared with other
//! processes a worker preempted while holding that lock stalls every request of the other one
//! for a whole time slice. Here an observation is two relaxed atomic additions; a scrape
//! reads the counters one by one, so it may see a count and a bucket that differ by the
//! requests recorded meanwhile (Prometheus tolerates that, as it does for separate series).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Upper bounds of the buckets, in seconds (a last `+Inf` bucket is implied).
pub(super) const BOUNDS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// A histogram of durations over [`BOUNDS`]; clones share it.
#[derive(Debug, Clone, Default)]
pub(super) struct Latency(Arc<Inner>);

#[derive(Debug)]
pub(super) struct Inner {
    /// `BOUNDS` in nanoseconds, compared with each observation.
    bounds_nanos: [u64; BOUNDS.len()],
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            bounds_nanos: BOUNDS.map(|s| (s * 1e9).round() as u64),
            buckets: Default::default(),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl Latency {
    pub(super) fn observe(&self, elapsed: Duration) {
        let l = &*self.0;
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = l.bounds_nanos.partition_point(|&b| b < nanos);
        l.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        l.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let mut buckets = [(f64::INFINITY, 0); BOUNDS.len() + 1];
        for (i, slot) in buckets.iter_mut().enumerate() {
            *slot = (
                BOUNDS.get(i).copied().unwrap_or(f64::INFINITY),
                self.0.buckets[i].load(Ordering::Relaxed),
            );
        }
        // The count is the buckets' sum, so that it always equals the `+Inf` bucket.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(latency: Latency) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("lat", "latency", latency);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encodes");
        out
    }

    #[test]
    fn buckets_are_cumulative_and_bounds_inclusive() {
        let l = Latency::default();
        l.observe(Duration::from_micros(100)); // exactly the first bound: in it
        l.observe(Duration::from_micros(101)); // just over: the second
        l.observe(Duration::from_millis(3)); // 0.005
        l.observe(Duration::from_secs(2)); // +Inf only
        let out = text(l);
        for line in [
            "lat_bucket{le=\"0.0001\"} 1",
            "lat_bucket{le=\"0.00025\"} 2",
            "lat_bucket{le=\"0.0025\"} 2",
            "lat_bucket{le=\"0.005\"} 3",
            "lat_bucket{le=\"1.0\"} 3",
            "lat_bucket{le=\"+Inf\"} 4",
            "lat_count 4",
            "lat_sum 2.003201",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
    }
}
