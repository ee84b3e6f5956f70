//! Reading a mapping file: what is honoured, what is ignored (with why) and what stops the
//! start (with the line and key).

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::*;

/// The keys of a mapping honoured, ignored (with why) and refused (with why).
const MAPPING_KEYS: &[&str] = &[
    "match",
    "name",
    "labels",
    "match_type",
    "action",
    "help",
    "match_metric_type",
    "timer_type",
    "observer_type",
    "buckets",
    "quantiles",
    "histogram_options",
    "summary_options",
];
const IGNORED_KEYS: &[(&str, &str)] = &[
    (
        "ttl",
        "series are kept while the process runs (their stats keys are capped)",
    ),
    (
        "scale",
        "sluice's response time is already in seconds, which is what scale is used for",
    ),
    ("honor_labels", "sluice's stats carry no tags to honour"),
];
struct Reader<'f> {
    file: &'f str,
    notes: Vec<String>,
}

impl Reader<'_> {
    fn error(&self, line: usize, key: &str, message: impl Into<String>) -> MapperError {
        MapperError {
            file: self.file.to_owned(),
            line,
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

/// Parses a mapping file's text. Ignored, with a note: `ttl`, `scale`, `honor_labels`,
/// `defaults.ttl`, the native-histogram options and `buf_cap`. Refused, as statsd_exporter
/// refuses them: any other key, a regex or name that does not compile, a label name
/// Prometheus would refuse, an observer type other than histogram or summary, histogram
/// options on a summary (or the reverse), buckets or quantiles given both at the top of a
/// mapping and in its options; and (where the Go client would panic) buckets that do not
/// increase, a quantile or error outside 0 to 1.
pub fn parse(text: &str, file: &str) -> Result<(Mapper, Vec<String>), MapperError> {
    let mut r = Reader {
        file,
        notes: Vec::new(),
    };
    let docs = MarkedYaml::load_from_str(text).map_err(|e| {
        let message = format!("invalid YAML: {}", e.info());
        r.error(e.marker().line(), "", message)
    })?;
    let Some(doc) = docs.first() else {
        return Err(r.error(1, "mappings", "missing"));
    };
    let top = entries(doc, "", &r)?;
    let mut d = Defaults::default();
    let mut mappings = None;
    for (key, line, value) in &top {
        match key.as_str() {
            "defaults" => d = defaults(value, &mut r)?,
            "mappings" => mappings = Some(value),
            _ => return Err(r.error(*line, key, "unknown key")),
        }
    }
    let Some(list) = mappings else {
        return Err(r.error(node_line(doc), "mappings", "missing"));
    };
    let YamlData::Sequence(items) = &list.data else {
        return Err(r.error(node_line(list), "mappings", "expected a list"));
    };
    let mut mapper = Mapper {
        unordered_globs: d.unordered_globs,
        observer: d.observer.unmapped(),
        ..Mapper::default()
    };
    for (i, item) in items.iter().enumerate() {
        let (rule, is_regex) = rule(item, &format!("mappings[{i}]"), &d, &mut r)?;
        if is_regex {
            mapper.regexes.push(rule);
        } else {
            mapper.globs.push(rule);
        }
    }
    Ok((mapper, r.notes))
}

/// The file's `defaults`.
#[derive(Default)]
struct Defaults {
    regex: bool,
    unordered_globs: bool,
    observer: Spec,
}

/// What a mapping (or the defaults) says of timers, as written.
#[derive(Default)]
struct Spec {
    /// `observer_type` and the older `timer_type`: `Some(true)` for histogram.
    observer_type: Option<bool>,
    timer_type: Option<bool>,
    /// `histogram_options` given, and its `buckets`.
    histogram_options: bool,
    buckets: Vec<f64>,
    /// `summary_options` given, and its fields.
    summary_options: bool,
    quantiles: Vec<f64>,
    max_age: Option<Duration>,
    age_buckets: Option<u32>,
    /// The top-level `buckets` and `quantiles` (statsd_exporter's older form).
    legacy_buckets: Vec<f64>,
    legacy_quantiles: Vec<f64>,
}

impl Spec {
    /// Reads a key of timers; false when `key` is none of them.
    fn read(
        &mut self,
        key: &str,
        value: &MarkedYaml<'_>,
        path: &str,
        r: &mut Reader<'_>,
    ) -> Result<bool, MapperError> {
        match key {
            "observer_type" => self.observer_type = Some(observer_type(value, path, r)?),
            "timer_type" => self.timer_type = Some(observer_type(value, path, r)?),
            "buckets" => self.legacy_buckets = buckets(value, path, r)?,
            "quantiles" => self.legacy_quantiles = quantiles(value, path, r)?,
            "histogram_options" => {
                self.histogram_options = true;
                for (key, line, v) in entries(value, path, r)? {
                    let path = format!("{path}.{key}");
                    match key.as_str() {
                        "buckets" => self.buckets = buckets(v, &path, r)?,
                        "native_histogram_bucket_factor" | "native_histogram_max_buckets" => {
                            number(v, &path, r)?;
                            r.notes.push(format!(
                                "{}:{line}: {path} ignored: sluice serves the text format, \
                                 which carries the classic buckets only (native histograms \
                                 travel in the protobuf format)",
                                r.file
                            ));
                        }
                        _ => return Err(r.error(line, &path, "unknown key")),
                    }
                }
            }
            "summary_options" => {
                self.summary_options = true;
                for (key, line, v) in entries(value, path, r)? {
                    let path = format!("{path}.{key}");
                    match key.as_str() {
                        "quantiles" => self.quantiles = quantiles(v, &path, r)?,
                        "max_age" => self.max_age = Some(duration(v, &path, r)?),
                        "age_buckets" => {
                            let n = number(v, &path, r)?;
                            if n < 0.0 || n.fract() != 0.0 || n > f64::from(u32::MAX) {
                                let message = "expected a whole number of buckets";
                                return Err(r.error(line, &path, message));
                            }
                            self.age_buckets = Some(n as u32);
                        }
                        "buf_cap" => {
                            number(v, &path, r)?;
                            r.notes.push(format!(
                                "{}:{line}: {path} ignored: sluice keeps the window's \
                                 observations in histograms, with no buffer to size",
                                r.file
                            ));
                        }
                        _ => return Err(r.error(line, &path, "unknown key")),
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The type given: `observer_type`, else `timer_type` (`Some(true)`: histogram).
    fn histogram(&self) -> Option<bool> {
        self.observer_type.or(self.timer_type)
    }

    /// The defaults after statsd_exporter's reading of its older keys: top-level quantiles
    /// (buckets) replace the summary (histogram) options when those name none.
    fn settle_defaults(mut self) -> Spec {
        if self.quantiles.is_empty() && !self.legacy_quantiles.is_empty() {
            self.quantiles = std::mem::take(&mut self.legacy_quantiles);
            (self.max_age, self.age_buckets) = (None, None);
        }
        if self.buckets.is_empty() && !self.legacy_buckets.is_empty() {
            self.buckets = std::mem::take(&mut self.legacy_buckets);
        }
        self
    }

    /// How a timer no mapping matches is rendered.
    fn unmapped(&self) -> Observer {
        self.resolve(&Spec::default())
    }

    /// How a timer a mapping with `self`'s keys matches is rendered, `defaults` filling in
    /// what it leaves out (statsd_exporter's rules: a summary unless either says histogram).
    fn resolve(&self, mapping: &Spec) -> Observer {
        let first = |lists: [&Vec<f64>; 3]| lists.into_iter().find(|l| !l.is_empty()).cloned();
        let explicit = mapping.histogram().or(self.histogram());
        if explicit == Some(true) {
            let given = [&mapping.legacy_buckets, &mapping.buckets, &self.buckets];
            return Observer::Histogram {
                buckets: first(given).unwrap_or_else(|| DEFAULT_BUCKETS.to_vec()),
            };
        }
        // A summary. Typed, the mapping's options are completed by the defaults'; untyped,
        // statsd_exporter takes the mapping's options whole when it has them.
        let typed = explicit.is_some();
        let legacy = if typed {
            &mapping.legacy_quantiles
        } else {
            &mapping.quantiles
        };
        let quantiles = first([legacy, &mapping.quantiles, &self.quantiles])
            .unwrap_or_else(|| DEFAULT_QUANTILES.iter().map(|(q, _)| *q).collect());
        let (max_age, age_buckets) = if typed || !mapping.summary_options {
            (
                mapping.max_age.filter(|d| !d.is_zero()).or(self.max_age),
                mapping.age_buckets.filter(|n| *n > 0).or(self.age_buckets),
            )
        } else {
            (mapping.max_age, mapping.age_buckets)
        };
        Observer::Summary {
            quantiles,
            max_age: max_age.filter(|d| !d.is_zero()).unwrap_or(DEFAULT_MAX_AGE),
            age_buckets: age_buckets
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_AGE_BUCKETS),
        }
    }

    /// statsd_exporter's refusals of a mapping's timer keys.
    fn check(
        &self,
        defaults: &Spec,
        path: &str,
        line: usize,
        r: &Reader<'_>,
    ) -> Result<(), MapperError> {
        if !self.legacy_quantiles.is_empty() && !self.quantiles.is_empty() {
            let message = "quantiles given both here and in summary_options";
            return Err(r.error(line, &format!("{path}.quantiles"), message));
        }
        if !self.legacy_buckets.is_empty() && !self.buckets.is_empty() {
            let message = "buckets given both here and in histogram_options";
            return Err(r.error(line, &format!("{path}.buckets"), message));
        }
        match self.histogram().or(defaults.histogram()) {
            Some(true) if self.summary_options => Err(r.error(
                line,
                &format!("{path}.summary_options"),
                "a histogram takes no summary options",
            )),
            Some(false) if self.histogram_options => Err(r.error(
                line,
                &format!("{path}.histogram_options"),
                "a summary takes no histogram options",
            )),
            _ => Ok(()),
        }
    }
}

/// Reads `defaults`.
fn defaults(node: &MarkedYaml<'_>, r: &mut Reader<'_>) -> Result<Defaults, MapperError> {
    let mut d = Defaults::default();
    for (key, line, value) in entries(node, "defaults", r)? {
        let path = format!("defaults.{key}");
        if d.observer.read(&key, value, &path, r)? {
            continue;
        }
        match key.as_str() {
            "match_type" => d.regex = match_type(value, &path, r)?,
            "ttl" => r.notes.push(format!(
                "{}:{line}: {path} ignored: series are kept while the process runs",
                r.file
            )),
            "glob_disable_ordering" => {
                d.unordered_globs = match scalar(value).as_deref() {
                    Some("true") => true,
                    Some("false" | "") => false,
                    _ => return Err(r.error(line, &path, "expected true or false")),
                }
            }
            _ => return Err(r.error(line, &path, "unknown key")),
        }
    }
    d.observer = d.observer.settle_defaults();
    Ok(d)
}

fn rule(
    node: &MarkedYaml<'_>,
    path: &str,
    d: &Defaults,
    r: &mut Reader<'_>,
) -> Result<(Rule, bool), MapperError> {
    let mut found: Vec<(String, usize, &MarkedYaml<'_>)> = Vec::new();
    let mut spec = Spec::default();
    for (key, line, value) in entries(node, path, r)? {
        let key_path = format!("{path}.{key}");
        if let Some((_, why)) = IGNORED_KEYS.iter().find(|(k, _)| *k == key) {
            r.notes
                .push(format!("{}:{line}: {key_path} ignored: {why}", r.file));
        } else if spec.read(&key, value, &key_path, r)? {
            continue;
        } else if MAPPING_KEYS.contains(&key.as_str()) {
            found.push((key, line, value));
        } else {
            return Err(r.error(line, &key_path, "unknown key"));
        }
    }
    spec.check(&d.observer, path, node_line(node), r)?;
    let get = |k: &str| found.iter().find(|(key, _, _)| key == k);
    let text = |k: &str| -> Result<Option<(String, usize)>, MapperError> {
        match get(k) {
            None => Ok(None),
            Some((_, line, v)) => scalar(v)
                .map(|s| Some((s, *line)))
                .ok_or_else(|| r.error(*line, &format!("{path}.{k}"), "expected a string")),
        }
    };
    let Some((pattern, match_line)) = text("match")? else {
        return Err(r.error(node_line(node), &format!("{path}.match"), "missing"));
    };
    let is_regex = match get("match_type") {
        Some((_, _, v)) => match_type(v, &format!("{path}.match_type"), r)?,
        None => d.regex,
    };
    let drop = match text("action")? {
        None => false,
        Some((a, _)) if a == "map" => false,
        Some((a, _)) if a == "drop" => true,
        Some((a, line)) => {
            let message = format!("expected map or drop, got '{a}'");
            return Err(r.error(line, &format!("{path}.action"), message));
        }
    };
    let kind = match text("match_metric_type")? {
        None => None,
        Some((k, line)) => Some(match k.as_str() {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "observer" | "timer" | "histogram" | "summary" | "distribution" => Kind::Observer,
            _ => {
                let message = format!("expected counter, gauge or observer, got '{k}'");
                return Err(r.error(line, &format!("{path}.match_metric_type"), message));
            }
        }),
    };
    let compiled = if is_regex {
        Regex::new(&pattern)
    } else {
        Regex::new(&glob_regex(&pattern))
    }
    .map_err(|e| r.error(match_line, &format!("{path}.match"), e.to_string()))?;
    let name = match text("name")? {
        Some((n, line)) => {
            if !n.contains('$') && (n.is_empty() || escape(&n) != n) {
                let message = format!("'{n}' is not a Prometheus metric name");
                return Err(r.error(line, &format!("{path}.name"), message));
            }
            n
        }
        None if drop => String::new(),
        None => return Err(r.error(node_line(node), &format!("{path}.name"), "missing")),
    };
    let labels = match get("labels") {
        None => Vec::new(),
        Some((_, _, v)) => labels(v, &format!("{path}.labels"), r)?,
    };
    let help = text("help")?.map(|(h, _)| h);
    let wild = if is_regex {
        Vec::new()
    } else {
        pattern.split('.').map(|seg| seg.contains('*')).collect()
    };
    let rule = Rule {
        pattern: compiled,
        name,
        labels,
        help,
        drop,
        kind,
        observer: d.observer.resolve(&spec),
        wild,
    };
    Ok((rule, is_regex))
}

fn labels(
    node: &MarkedYaml<'_>,
    path: &str,
    r: &Reader<'_>,
) -> Result<Vec<(String, String)>, MapperError> {
    let mut out = Vec::new();
    for (key, line, value) in entries(node, path, r)? {
        let valid = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !key.starts_with("__");
        if !valid {
            let message = "not a Prometheus label name";
            return Err(r.error(line, &format!("{path}.{key}"), message));
        }
        let value = scalar(value)
            .ok_or_else(|| r.error(line, &format!("{path}.{key}"), "expected a string"))?;
        out.push((key, value));
    }
    Ok(out)
}

fn match_type(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<bool, MapperError> {
    match scalar(node).as_deref() {
        Some("glob" | "") => Ok(false),
        Some("regex") => Ok(true),
        other => Err(r.error(
            node_line(node),
            path,
            format!("expected glob or regex, got {other:?}"),
        )),
    }
}

/// `histogram` (true), or `summary` or empty (false: statsd_exporter reads an empty type as
/// a summary).
fn observer_type(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<bool, MapperError> {
    match scalar(node).as_deref() {
        Some("histogram") => Ok(true),
        Some("summary" | "") => Ok(false),
        other => Err(r.error(
            node_line(node),
            path,
            format!("expected histogram or summary, got {other:?}"),
        )),
    }
}

/// A number (an integer or a float).
fn number(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<f64, MapperError> {
    match &node.data {
        YamlData::Value(Scalar::Integer(i)) => Ok(*i as f64),
        YamlData::Value(Scalar::FloatingPoint(f)) => Ok(f.into_inner()),
        _ => Err(r.error(node_line(node), path, "expected a number")),
    }
}

/// Histogram buckets: upper bounds (seconds) that increase; a last `+Inf` is dropped (it is
/// always there), as Prometheus's Go client drops it.
fn buckets(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<Vec<f64>, MapperError> {
    let YamlData::Sequence(items) = &node.data else {
        return Err(r.error(node_line(node), path, "expected a list of numbers"));
    };
    let mut out = items
        .iter()
        .map(|item| number(item, path, r))
        .collect::<Result<Vec<f64>, _>>()?;
    if out.last() == Some(&f64::INFINITY) {
        out.pop();
    }
    let increasing = out.windows(2).all(|w| w[0] < w[1]);
    if !increasing || out.iter().any(|b| !b.is_finite()) {
        let message = format!("buckets must be finite and increase: {out:?}");
        return Err(r.error(node_line(node), path, message));
    }
    Ok(out)
}

/// Summary quantiles: `[{quantile: Q, error: E}, ...]`, each between 0 and 1. The errors are
/// checked, not used: sluice's quantiles are within 0.1% of the value at their rank.
fn quantiles(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<Vec<f64>, MapperError> {
    let YamlData::Sequence(items) = &node.data else {
        return Err(r.error(
            node_line(node),
            path,
            "expected a list of {quantile, error}",
        ));
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        let mut quantile = None;
        for (key, line, v) in entries(item, &item_path, r)? {
            let key_path = format!("{item_path}.{key}");
            let n = match key.as_str() {
                "quantile" | "error" => number(v, &key_path, r)?,
                _ => return Err(r.error(line, &key_path, "unknown key")),
            };
            if !(0.0..=1.0).contains(&n) {
                return Err(r.error(line, &key_path, format!("{n} is not between 0 and 1")));
            }
            if key == "quantile" {
                quantile = Some(n);
            }
        }
        let q = quantile
            .ok_or_else(|| r.error(node_line(item), &format!("{item_path}.quantile"), "missing"))?;
        out.push(q);
    }
    out.sort_by(f64::total_cmp);
    out.dedup();
    Ok(out)
}

/// A Go duration (`30s`, `10m`), or an integer of nanoseconds (as Go's YAML reads one).
fn duration(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<Duration, MapperError> {
    let parsed = match &node.data {
        YamlData::Value(Scalar::Integer(i)) => u64::try_from(*i).ok().map(Duration::from_nanos),
        YamlData::Value(Scalar::String(s)) => crate::compat::go_duration(s),
        _ => None,
    };
    parsed.ok_or_else(|| {
        r.error(
            node_line(node),
            path,
            "expected a duration such as 30s or 10m",
        )
    })
}

/// The keys (as text), their lines and values of a mapping node.
fn entries<'a>(
    node: &'a MarkedYaml<'a>,
    path: &str,
    r: &Reader<'_>,
) -> Result<Vec<(String, usize, &'a MarkedYaml<'a>)>, MapperError> {
    let YamlData::Mapping(map) = &node.data else {
        let key = if path.is_empty() { "mappings" } else { path };
        return Err(r.error(node_line(node), key, "expected a mapping"));
    };
    map.iter()
        .map(|(k, v)| {
            let key =
                scalar(k).ok_or_else(|| r.error(node_line(k), path, "expected a plain key"))?;
            Ok((key, node_line(k), v))
        })
        .collect()
}

/// A scalar as text.
fn scalar(node: &MarkedYaml<'_>) -> Option<String> {
    match &node.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Null) => Some(String::new()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
        YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.to_string()),
        _ => None,
    }
}

fn node_line(node: &MarkedYaml<'_>) -> usize {
    node.span.start.line()
}

/// A glob as an anchored regex: `*` captures a run of characters within one segment.
fn glob_regex(glob: &str) -> String {
    let parts: Vec<String> = glob.split('*').map(regex::escape).collect();
    format!("^{}$", parts.join("([^.]*)"))
}
