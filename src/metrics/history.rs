//! The last minutes of every rule's rates, for the admin page: a sample of each rule's live
//! counts (see [`super::live`]) every [`EVERY`], kept for [`KEPT`] samples; rates are the
//! differences between consecutive samples. Bounded by the number of rules times [`KEPT`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use super::live::{LiveRules, each_rule};
use crate::config::model::Policy;
use crate::rules::RuleSet;

/// Time between samples.
pub(crate) const EVERY: Duration = Duration::from_secs(2);
/// Samples kept (5 minutes).
pub(crate) const KEPT: usize = 150;

/// One rule's rates, per second, oldest first, one per sample interval.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Series {
    pub domain: String,
    pub rule: String,
    pub requests: VecDeque<f64>,
    pub denied: VecDeque<f64>,
    pub near: VecDeque<f64>,
    #[serde(skip)]
    last: [u64; 3],
    #[serde(skip)]
    seen: bool,
}

/// Every rule's series, and when each sample was taken.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Unix time (milliseconds) of each rate's end.
    times: VecDeque<u64>,
    last_at: Option<tokio::time::Instant>,
    series: HashMap<(String, String), Series>,
}

impl History {
    /// Takes a sample of `rules`' counts now.
    pub(super) fn sample(&self, rules: &RuleSet, live: &LiveRules) {
        let mut inner = self.inner.lock();
        let now = tokio::time::Instant::now();
        let elapsed = inner.last_at.map(|at| now.duration_since(at).as_secs_f64());
        inner.last_at = Some(now);
        let mut present = Vec::new();
        for domain in rules.domains() {
            each_rule(domain.rules(), "", &mut |path, rule| {
                if !matches!(rule.policy, Policy::Limited(_)) {
                    return;
                }
                let counts = live.of(rule).map_or([0; 3], |l| {
                    [&l.hits, &l.denied, &l.near].map(|c| c.load(Ordering::Relaxed))
                });
                present.push(((domain.name().to_owned(), path.to_owned()), counts));
            });
        }
        let width = inner.times.len();
        inner
            .series
            .retain(|k, _| present.iter().any(|(p, _)| p == k));
        for (key, counts) in present {
            let s = inner.series.entry(key.clone()).or_insert_with(|| Series {
                domain: key.0,
                rule: key.1,
                ..Series::default()
            });
            s.push(counts, elapsed, width);
        }
        if elapsed.is_some() {
            let unix = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            inner.times.push_back(unix);
            if inner.times.len() > KEPT {
                inner.times.pop_front();
            }
        }
    }

    /// The sample times (Unix milliseconds) and every rule's series, by domain then rule.
    pub fn read(&self) -> (Vec<u64>, Vec<Series>) {
        let inner = self.inner.lock();
        let mut series: Vec<Series> = inner.series.values().cloned().collect();
        series.sort_by(|a, b| (&a.domain, &a.rule).cmp(&(&b.domain, &b.rule)));
        (inner.times.iter().copied().collect(), series)
    }
}

impl Series {
    /// Adds the rates since the last sample; a new series starts padded with zeros to the
    /// others' length, and counts that went down (the rules were reloaded: new counters)
    /// count from zero.
    fn push(&mut self, counts: [u64; 3], elapsed: Option<f64>, width: usize) {
        if !self.seen {
            self.seen = true;
            self.last = counts;
            for v in [&mut self.requests, &mut self.denied, &mut self.near] {
                v.resize(width, 0.0);
            }
            if elapsed.is_none() {
                return;
            }
        }
        let Some(secs) = elapsed.filter(|s| *s > 0.0) else {
            return;
        };
        for ((v, now), last) in [&mut self.requests, &mut self.denied, &mut self.near]
            .into_iter()
            .zip(counts)
            .zip(self.last)
        {
            let delta = if now >= last { now - last } else { now };
            v.push_back(delta as f64 / secs);
            if v.len() > KEPT {
                v.pop_front();
            }
        }
        self.last = counts;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_differences_per_second_and_a_reload_counts_from_zero() {
        let mut s = Series::default();
        s.push([10, 0, 0], None, 0);
        assert!(s.requests.is_empty());
        s.push([30, 4, 2], Some(2.0), 0);
        s.push([5, 4, 2], Some(1.0), 1);
        assert_eq!(s.requests, [10.0, 5.0]);
        assert_eq!(s.denied, [2.0, 0.0]);
        assert_eq!(s.near, [1.0, 0.0]);
        for _ in 0..2 * KEPT {
            s.push([5, 4, 2], Some(1.0), 0);
        }
        assert_eq!(s.requests.len(), KEPT);
        // A rule that appears later starts padded to the others' length.
        let mut late = Series::default();
        late.push([7, 0, 0], Some(1.0), 3);
        assert_eq!(late.requests, [0.0, 0.0, 0.0, 0.0]);
    }
}
