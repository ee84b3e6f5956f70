//! limitador's metrics under its own names (`metrics.limitador`, on when started as
//! `limitador-server`), heard from the engine's observers and rendered beside sluice's own on
//! `/metrics`, which is then in the Prometheus text format 0.0.4 (limitador's counters carry
//! no `_total` suffix, which OpenMetrics would add):
//!
//! | series | type | what |
//! |---|---|---|
//! | `limitador_up` | gauge | 1 |
//! | `datastore_partitioned` | gauge | 1 while the Redis backend is unreachable or its breaker is open, else 0 |
//! | `authorized_calls{limitador_namespace}` | counter | admitted `ShouldRateLimit`, `CheckRateLimit` and `/check_and_report` calls |
//! | `authorized_hits{limitador_namespace}` | counter | the cost of admitted `ShouldRateLimit` and `/check_and_report` calls, and of every `Report` |
//! | `limited_calls{limitador_namespace[,limit_name]}` | counter | denied calls of the same kinds; `limit_name` (`""` when unnamed) with `metrics.limitador_limit_name_label` |
//! | `datastore_latency`, `counter_latency` | histogram | seconds of the limiter call of those calls (the same observations: limitador's name since 1.6, and before) |
//!
//! A counter series appears with its first count, as in limitador. The namespace label is
//! the request's domain (limitador counts calls to namespaces without limits too). The three
//! counters also carry the labels of `metrics.limitador_labels_file` and
//! `metrics.limitador_labels_default` (limitador's `--custom-metric-labels` and
//! `--metric-labels-default`: CEL over the request's descriptors, see
//! `config::limitador::labels`). Past `metrics.max_value_label_sets` distinct label sets
//! (namespace and CEL labels together), new ones count under
//! `limitador_namespace="__other__"` without CEL labels.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::sync::OnceLock;

use parking_lot::RwLock;

use crate::config::limitador::labels::MetricLabels;
use crate::engine::limitador::Counting;
use crate::engine::{NamespaceReport, Observer};
use crate::limiter::counters::BackendStatus;

/// The content type of the `/metrics` answer while limitador's metrics are served.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The namespace label of label sets past the cap.
const OTHER: &str = "__other__";

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// A namespace's `limited_calls`, by limit name.
type ByLimitName = HashMap<Box<str>, AtomicU64>;

/// A label set: the namespace, and the CEL labels rendered (`,name="value"`..., sorted).
type Set = (Box<str>, Box<str>);

/// The counters of one namespace.
#[derive(Default)]
struct Calls {
    authorized_calls: AtomicU64,
    authorized_hits: AtomicU64,
}

/// limitador's series.
pub struct LimitadorMetrics {
    limit_name_label: bool,
    max_label_sets: usize,
    /// The CEL labels, set once at start (none: no labels).
    labels: OnceLock<MetricLabels>,
    by_namespace: RwLock<HashMap<Set, Calls>>,
    /// By label set, then limit name (`""` without the label).
    limited: RwLock<HashMap<Set, ByLimitName>>,
    buckets: [AtomicU64; BUCKETS.len() + 1],
    latency_nanos: AtomicU64,
}

impl LimitadorMetrics {
    pub fn new(limit_name_label: bool, max_label_sets: usize) -> LimitadorMetrics {
        LimitadorMetrics {
            limit_name_label,
            max_label_sets: max_label_sets.max(1),
            labels: OnceLock::new(),
            by_namespace: RwLock::default(),
            limited: RwLock::default(),
            buckets: Default::default(),
            latency_nanos: AtomicU64::new(0),
        }
    }

    /// Sets the CEL labels (`metrics.limitador_labels_*`); only the first call counts.
    pub fn set_labels(&self, labels: MetricLabels) {
        if !labels.is_empty() {
            let _ = self.labels.set(labels);
        }
    }

    /// The CEL labels of a report, rendered (empty without labels).
    fn extra(&self, report: &NamespaceReport<'_>) -> String {
        let Some(labels) = self.labels.get() else {
            return String::new();
        };
        let descriptors = report
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
        let mut out = String::new();
        for (name, value) in labels.eval(descriptors) {
            let _ = write!(out, ",{name}=\"{}\"", escape(&value));
        }
        out
    }

    fn count_namespace(&self, set: (&str, &str), calls: u64, hits: u64) {
        let add = |c: &Calls| {
            c.authorized_calls.fetch_add(calls, Ordering::Relaxed);
            c.authorized_hits.fetch_add(hits, Ordering::Relaxed);
        };
        let key: Set = (set.0.into(), set.1.into());
        if let Some(c) = self.by_namespace.read().get(&key) {
            add(c);
            return;
        }
        let mut all = self.by_namespace.write();
        let key = if all.len() < self.max_label_sets || all.contains_key(&key) {
            key
        } else {
            (OTHER.into(), "".into())
        };
        add(all.entry(key).or_default());
    }

    fn count_limited(&self, set: (&str, &str), limit_name: &str) {
        let limit_name = if self.limit_name_label {
            limit_name
        } else {
            ""
        };
        let key: Set = (set.0.into(), set.1.into());
        if let Some(c) = self
            .limited
            .read()
            .get(&key)
            .and_then(|by_name| by_name.get(limit_name))
        {
            c.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut all = self.limited.write();
        let sets: usize = all.values().map(HashMap::len).sum();
        let known = all
            .get(&key)
            .is_some_and(|by_name| by_name.contains_key(limit_name));
        let (key, limit_name) = if known || sets < self.max_label_sets {
            (key, limit_name)
        } else {
            ((OTHER.into(), "".into()), "")
        };
        all.entry(key)
            .or_default()
            .entry(limit_name.into())
            .or_insert_with(|| AtomicU64::new(0))
            .fetch_add(1, Ordering::Relaxed);
    }

    fn observe_latency(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let index = BUCKETS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(BUCKETS.len());
        if let Some(b) = self.buckets.get(index) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.latency_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// limitador's series in the Prometheus text format 0.0.4, given what the backend says of
    /// its health now.
    pub fn render(&self, backend: &BackendStatus) -> String {
        let mut out = String::new();
        head(&mut out, "limitador_up", "gauge", "1 while sluice serves");
        out.push_str("limitador_up 1\n");
        let partitioned =
            backend.breaker_open == Some(true) || matches!(backend.reachable, Some(Err(_)));
        let help = "1 while the counters' datastore (Redis) cannot be reached";
        head(&mut out, "datastore_partitioned", "gauge", help);
        let _ = writeln!(out, "datastore_partitioned {}", u8::from(partitioned));
        self.authorized(&mut out);
        self.limited(&mut out);
        for name in ["datastore_latency", "counter_latency"] {
            self.histogram(&mut out, name);
        }
        out
    }

    /// `authorized_calls` and `authorized_hits`, once something counted.
    fn authorized(&self, out: &mut String) {
        let mut namespaces: Vec<(String, String, u64, u64)> = self
            .by_namespace
            .read()
            .iter()
            .map(|((n, extra), c)| {
                let calls = c.authorized_calls.load(Ordering::Relaxed);
                (
                    n.to_string(),
                    extra.to_string(),
                    calls,
                    c.authorized_hits.load(Ordering::Relaxed),
                )
            })
            .collect();
        if namespaces.is_empty() {
            return;
        }
        namespaces.sort();
        let hits_help = "Hits counted for admitted calls and reports, by namespace";
        for (name, help, hits) in [
            ("authorized_calls", "Calls admitted, by namespace", false),
            ("authorized_hits", hits_help, true),
        ] {
            head(out, name, "counter", help);
            for (ns, extra, calls, hit_count) in &namespaces {
                let value = if hits { hit_count } else { calls };
                let ns = escape(ns);
                let _ = writeln!(out, "{name}{{limitador_namespace=\"{ns}\"{extra}}} {value}");
            }
        }
    }

    /// `limited_calls`, once something counted.
    fn limited(&self, out: &mut String) {
        let mut limited: Vec<(String, String, String, u64)> = self
            .limited
            .read()
            .iter()
            .flat_map(|((n, extra), by_name)| {
                by_name.iter().map(|(l, c)| {
                    let count = c.load(Ordering::Relaxed);
                    (n.to_string(), extra.to_string(), l.to_string(), count)
                })
            })
            .collect();
        if limited.is_empty() {
            return;
        }
        limited.sort();
        let help = "Calls denied, by namespace (and limit name)";
        head(out, "limited_calls", "counter", help);
        for (ns, extra, limit, n) in &limited {
            let _ = write!(out, "limited_calls{{limitador_namespace=\"{}\"", escape(ns));
            if self.limit_name_label {
                let _ = write!(out, ",limit_name=\"{}\"", escape(limit));
            }
            let _ = writeln!(out, "{extra}}} {n}");
        }
    }

    /// The latency histogram under `name` (its count is its `+Inf` bucket's).
    fn histogram(&self, out: &mut String, name: &str) {
        let help = "Seconds the limiter backend took to decide a namespace's call";
        head(out, name, "histogram", help);
        let mut cumulative = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let le = BUCKETS.get(i).map_or("+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.latency_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

impl Observer for LimitadorMetrics {
    fn namespace(&self, report: &NamespaceReport<'_>) {
        if let Some(elapsed) = report.backend_elapsed {
            self.observe_latency(elapsed);
        }
        let extra = self.extra(report);
        let set = (report.namespace, extra.as_str());
        match (report.counting, report.admitted) {
            (Counting::CountOnly, _) => self.count_namespace(set, 0, report.cost),
            (Counting::CheckAndCount, true) => self.count_namespace(set, 1, report.cost),
            (Counting::CheckOnly, true) => self.count_namespace(set, 1, 0),
            (_, false) => self.count_limited(set, report.limited_by.unwrap_or("")),
        }
    }
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value, escaped for the text format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// sluice's own metrics (OpenMetrics text, as the registry encodes them) in the Prometheus
/// text format 0.0.4, with the same series names: a counter family `x` (samples `x_total`)
/// is declared as `x_total`; `unknown` becomes `untyped`; `# UNIT` and `# EOF` go.
pub(crate) fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut counters: Vec<&str> = Vec::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, "counter")) = rest.split_once(' ')
        {
            counters.push(name);
        }
    }
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("HELP", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("TYPE", r)));
        if let Some((what, rest)) = meta {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if counters.contains(&name) {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            let tail = if what == "TYPE" && tail == "unknown" {
                "untyped"
            } else {
                tail
            };
            let _ = writeln!(out, "# {what} {name} {tail}");
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(namespace: &str, counting: Counting, admitted: bool) -> NamespaceReport<'_> {
        NamespaceReport {
            namespace,
            descriptors: &[],
            known: true,
            counting,
            admitted,
            limited_by: (!admitted).then_some("per_user"),
            cost: 3,
            backend_elapsed: Some(Duration::from_micros(300)),
        }
    }

    #[test]
    fn counts_as_limitador_does_by_kind_of_call() {
        let m = LimitadorMetrics::new(true, 100);
        m.namespace(&report("a", Counting::CheckAndCount, true));
        m.namespace(&report("a", Counting::CheckAndCount, false));
        m.namespace(&report("a", Counting::CheckOnly, true));
        m.namespace(&report("a", Counting::CountOnly, true));
        let text = m.render(&BackendStatus::default());
        assert!(text.contains("\nlimitador_up 1\n"), "{text}");
        assert!(text.contains("\ndatastore_partitioned 0\n"), "{text}");
        assert!(text.contains("\nauthorized_calls{limitador_namespace=\"a\"} 2\n"));
        assert!(text.contains("\nauthorized_hits{limitador_namespace=\"a\"} 6\n"));
        let limited = "\nlimited_calls{limitador_namespace=\"a\",limit_name=\"per_user\"} 1\n";
        assert!(text.contains(limited), "{text}");
        assert!(text.contains("\ndatastore_latency_count 4\n"), "{text}");
        assert!(text.contains("\ncounter_latency_bucket{le=\"0.0005\"} 4\n"));
        assert!(text.contains("\ncounter_latency_bucket{le=\"0.00025\"} 0\n"));
    }

    #[test]
    fn no_limit_name_without_the_option_and_label_sets_are_capped() {
        let m = LimitadorMetrics::new(false, 1);
        m.namespace(&report("a", Counting::CheckAndCount, false));
        m.namespace(&report("b", Counting::CheckAndCount, false));
        m.namespace(&report("b", Counting::CheckAndCount, true));
        let down = BackendStatus {
            breaker_open: Some(true),
            ..BackendStatus::default()
        };
        let text = m.render(&down);
        assert!(text.contains("\nlimited_calls{limitador_namespace=\"a\"} 1\n"));
        assert!(text.contains("\nlimited_calls{limitador_namespace=\"__other__\"} 1\n"));
        assert!(text.contains("\nauthorized_calls{limitador_namespace=\"b\"} 1\n"));
        assert!(text.contains("\ndatastore_partitioned 1\n"), "{text}");
    }

    #[test]
    fn cel_labels_are_label_values_and_count_towards_the_cap() {
        use crate::engine::Descriptor;
        use crate::rules::Entry;
        let m = LimitadorMetrics::new(false, 2);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "user: descriptors[0].user\n").unwrap();
        let (labels, _) = MetricLabels::load(Some(file.path()), Some("{'app': 'shop'}")).unwrap();
        m.set_labels(labels);
        let of = |user: &str| {
            vec![Descriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: user.into(),
                }],
                ..Descriptor::default()
            }]
        };
        for (user, admitted) in [("a\"b", true), ("a\"b", true), ("c", false), ("d", true)] {
            let descriptors = of(user);
            let mut r = report("ns", Counting::CheckAndCount, admitted);
            r.descriptors = &descriptors;
            m.namespace(&r);
        }
        let text = m.render(&BackendStatus::default());
        let a = "\nauthorized_calls{limitador_namespace=\"ns\",app=\"shop\",user=\"a\\\"b\"} 2\n";
        assert!(text.contains(a), "{text}");
        let c = "\nlimited_calls{limitador_namespace=\"ns\",app=\"shop\",user=\"c\"} 1\n";
        assert!(text.contains(c), "{text}");
        // A cap of 2: user d is a third set... of authorized ones it is the second.
        let d = "\nauthorized_hits{limitador_namespace=\"ns\",app=\"shop\",user=\"d\"} 3\n";
        assert!(text.contains(d), "{text}");
        let descriptors = of("e");
        let mut r = report("ns", Counting::CheckAndCount, true);
        r.descriptors = &descriptors;
        m.namespace(&r);
        let text = m.render(&BackendStatus::default());
        assert!(
            text.contains("\nauthorized_calls{limitador_namespace=\"__other__\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn openmetrics_counters_keep_their_series_names() {
        let om = "# HELP sluice_requests Requests.\n# TYPE sluice_requests counter\n\
                  sluice_requests_total{result=\"ok\"} 1\n# HELP sluice_v Version.\n\
                  # TYPE sluice_v gauge\nsluice_v 3\n# EOF\n";
        let text = openmetrics_to_text(om);
        assert_eq!(
            text,
            "# HELP sluice_requests_total Requests.\n# TYPE sluice_requests_total counter\n\
             sluice_requests_total{result=\"ok\"} 1\n# HELP sluice_v Version.\n\
             # TYPE sluice_v gauge\nsluice_v 3\n"
        );
    }
}
