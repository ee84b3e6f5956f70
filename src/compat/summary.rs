//! The response time as a Prometheus summary (a mapping file's `observer_type: summary`, the
//! type statsd_exporter gives a timer no mapping types): quantiles of the last `max_age`,
//! which moves in `age_buckets` steps, as Prometheus's Go client moves a summary's window.
//!
//! The window is `age_buckets` slots of `max_age / age_buckets` each; an observation goes into
//! the slot of its time, which is emptied first when it last held an older step. The
//! quantiles are read from the slots of the last `age_buckets` steps merged, so they cover
//! between `max_age - max_age / age_buckets` and `max_age` of observations (the Go client's
//! head stream covers the same). Each slot is a log-scale histogram (HdrHistogram, 3
//! significant digits): a quantile is within 0.1% of the observation at its rank, a tighter
//! bound than the rank errors a mapping file states for its quantiles (0.05, 0.01, 0.001 by
//! default), which are therefore met and not otherwise used. Observations above 60 s count
//! as 60 s.

use std::time::Duration;

use tokio::time::Instant;

use hdrhistogram::Histogram;

/// The largest response time told apart (nanoseconds); longer ones count as this.
const HIGHEST_NANOS: u64 = 60_000_000_000;

/// Quantiles of the observations of a sliding window.
#[derive(Debug)]
pub(crate) struct Window {
    start: Instant,
    /// One step: `max_age / age_buckets`, at least 1 ms.
    step: Duration,
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct Slot {
    /// The step whose observations it holds.
    step: u64,
    values: Histogram<u64>,
}

impl Window {
    /// A window of `max_age` moving in `age_buckets` steps (at least one), from `start`.
    pub(crate) fn new(max_age: Duration, age_buckets: u32, start: Instant) -> Window {
        let n = age_buckets.max(1);
        let step = (max_age / n).max(Duration::from_millis(1));
        let empty = Histogram::new_with_bounds(1, HIGHEST_NANOS, 3)
            .expect("1 ns to 60 s at 3 significant digits are valid bounds");
        let slots = (0..n)
            .map(|_| Slot {
                step: u64::MAX,
                values: empty.clone(),
            })
            .collect();
        Window { start, step, slots }
    }

    fn step_at(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.start);
        (since.as_nanos() / self.step.as_nanos()) as u64
    }

    /// Counts one observation made at `now`.
    pub(crate) fn record(&mut self, value: Duration, now: Instant) {
        let step = self.step_at(now);
        let n = self.slots.len() as u64;
        let slot = &mut self.slots[(step % n) as usize];
        if slot.step != step {
            slot.values.reset();
            slot.step = step;
        }
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        slot.values.saturating_record(nanos.clamp(1, HIGHEST_NANOS));
    }

    /// The value (seconds) at each quantile of `quantiles` over the window at `now`; `NaN`
    /// when the window holds no observation, as Prometheus's Go client renders it.
    pub(crate) fn quantiles(&self, quantiles: &[f64], now: Instant) -> Vec<f64> {
        let step = self.step_at(now);
        let n = self.slots.len() as u64;
        let mut merged: Option<Histogram<u64>> = None;
        for slot in &self.slots {
            // The current step and the `n - 1` before it.
            if slot.step > step || step - slot.step >= n || slot.values.is_empty() {
                continue;
            }
            match &mut merged {
                None => merged = Some(slot.values.clone()),
                // Slots share their bounds, so adding cannot fail; were it to, that slot's
                // observations would be left out rather than the scrape failing.
                Some(m) => {
                    let _ = m.add(&slot.values);
                }
            }
        }
        quantiles
            .iter()
            .map(|q| match &merged {
                Some(m) => m.value_at_quantile(*q) as f64 / 1e9,
                None => f64::NAN,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quantiles_are_within_a_thousandth_of_the_observation_at_their_rank() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(600), 5, t0);
        // 1 ms to 1000 ms, one each: the q-quantile is about q seconds.
        for i in 1..=1000u64 {
            w.record(MS * i as u32, t0);
        }
        let got = w.quantiles(&[0.5, 0.9, 0.99, 1.0], t0 + MS);
        for (q, v) in [0.5, 0.9, 0.99, 1.0].iter().zip(&got) {
            assert!((v - q).abs() <= q * 0.001 + 1e-9, "{q}: {v}");
        }
    }

    #[test]
    fn observations_leave_the_window_step_by_step() {
        let t0 = Instant::now();
        let step = Duration::from_secs(1);
        // max_age 3 s in 3 steps of 1 s.
        let mut w = Window::new(step * 3, 3, t0);
        w.record(MS * 100, t0);
        w.record(MS * 300, t0 + step);
        let extremes = |w: &Window, at: Duration| w.quantiles(&[0.0, 1.0], t0 + at);
        let [lo, hi] = extremes(&w, step * 2)[..] else {
            unreachable!()
        };
        assert!(
            (lo - 0.1).abs() < 0.001 && (hi - 0.3).abs() < 0.001,
            "{lo} {hi}"
        );
        // At 3 s the first step (0-1 s) has left the window; at 4 s the second too.
        let [lo, hi] = extremes(&w, step * 3)[..] else {
            unreachable!()
        };
        assert!(
            (lo - 0.3).abs() < 0.001 && (hi - 0.3).abs() < 0.001,
            "{lo} {hi}"
        );
        assert!(extremes(&w, step * 4).iter().all(|v| v.is_nan()));
        // A slot used again is emptied first.
        w.record(MS * 500, t0 + step * 4);
        let [lo, hi] = extremes(&w, step * 4)[..] else {
            unreachable!()
        };
        assert!(
            (lo - 0.5).abs() < 0.001 && (hi - 0.5).abs() < 0.001,
            "{lo} {hi}"
        );
    }

    #[test]
    fn extreme_values_are_clamped_not_lost() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(60), 1, t0);
        w.record(Duration::ZERO, t0);
        w.record(Duration::from_secs(3600), t0);
        let [lo, hi] = w.quantiles(&[0.0, 1.0], t0)[..] else {
            unreachable!()
        };
        assert!(lo < 1e-8, "{lo}");
        assert!((hi - 60.0).abs() < 0.1, "{hi}");
    }
}
