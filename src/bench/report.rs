//! The result of a load: counts, throughput, latency percentiles; as a table or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::load::{Plan, Tally};

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        let us = |nanos: u64| nanos as f64 / 1e3;
        Percentiles {
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p99_9: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            mean: h.mean() / 1e3,
        }
    }
}

/// The result of one load (the `--json` output).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub target: String,
    /// `closed` or `open`.
    pub mode: String,
    pub connections: usize,
    pub concurrency: usize,
    /// The measured window.
    pub duration_secs: f64,
    pub warmup_secs: f64,
    /// The open loop's schedule, requests per second.
    pub rate: Option<f64>,
    /// Requests counted in the window: `ok + over_limit + errors`.
    pub requests: u64,
    pub ok: u64,
    pub over_limit: u64,
    pub errors: u64,
    /// Errors by kind: a gRPC code (`Unavailable`, ...), `timeout`, `not_sent`.
    pub error_kinds: BTreeMap<String, u64>,
    pub requests_per_sec: f64,
    /// Closed loop: from send to answer. Open loop: from the due time to answer.
    pub latency_us: Percentiles,
    /// Open loop only: from the actual send to the answer.
    pub service_time_us: Option<Percentiles>,
}

impl Summary {
    pub(super) fn new(plan: &Plan, tally: Tally) -> Summary {
        let duration = plan.duration.as_secs_f64();
        let errors = tally.errors.values().sum();
        let requests = tally.ok + tally.over_limit + errors;
        Summary {
            target: plan.target.clone(),
            mode: if plan.rate.is_some() {
                "open"
            } else {
                "closed"
            }
            .to_owned(),
            connections: plan.connections,
            concurrency: plan.concurrency,
            duration_secs: duration,
            warmup_secs: plan.warmup.as_secs_f64(),
            rate: plan.rate,
            requests,
            ok: tally.ok,
            over_limit: tally.over_limit,
            errors,
            error_kinds: tally.errors,
            requests_per_sec: if duration > 0.0 {
                requests as f64 / duration
            } else {
                0.0
            },
            latency_us: Percentiles::of(&tally.latency),
            service_time_us: plan.rate.map(|_| Percentiles::of(&tally.service)),
        }
    }

    /// A human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mode = match self.rate {
            Some(rate) => format!("open loop at {rate} req/s, at most {}", self.concurrency),
            None => format!("closed loop, {}", self.concurrency),
        };
        // Writing to a String cannot fail.
        let _ = writeln!(out, "target       {}", self.target);
        let _ = writeln!(
            out,
            "load         {mode} in flight on {} connection(s)",
            self.connections
        );
        let _ = writeln!(
            out,
            "measured     {:.1} s after {:.1} s of warm-up",
            self.duration_secs, self.warmup_secs
        );
        let _ = writeln!(
            out,
            "requests     {} ({:.1} req/s)",
            self.requests, self.requests_per_sec
        );
        let _ = writeln!(out, "  ok         {}", self.ok);
        let _ = writeln!(out, "  over_limit {}", self.over_limit);
        let _ = writeln!(out, "  errors     {}", self.errors);
        for (kind, n) in &self.error_kinds {
            let _ = writeln!(out, "    {kind:<9} {n}");
        }
        let header = if self.rate.is_some() {
            "latency from due time (µs)"
        } else {
            "latency (µs)"
        };
        row(&mut out, header, &self.latency_us);
        if let Some(service) = &self.service_time_us {
            row(&mut out, "service time (µs)", service);
        }
        out
    }
}

fn row(out: &mut String, name: &str, p: &Percentiles) {
    let _ = writeln!(out, "{name}");
    let _ = writeln!(
        out,
        "  p50 {:.0}  p90 {:.0}  p99 {:.0}  p99.9 {:.0}  max {:.0}  mean {:.0}",
        p.p50, p.p90, p.p99, p.p99_9, p.max, p.mean
    );
}
