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
const REFUSED_KEYS: &[(&str, &str)] = &[
    (
        "buckets",
        "the response-time histogram has fixed buckets (statsd_exporter's defaults)",
    ),
    (
        "histogram_options",
        "the response-time histogram has fixed buckets (statsd_exporter's defaults)",
    ),
    (
        "quantiles",
        "timers are rendered as histograms, not summaries",
    ),
    (
        "summary_options",
        "timers are rendered as histograms, not summaries",
    ),
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

/// Parses a mapping file's text. Ignored, with a note: `ttl`, `scale`, `honor_labels`, and
/// `defaults.ttl`. Refused: custom buckets or quantiles, `summary` timers,
/// `defaults.glob_disable_ordering: true`, any other key, a regex or name that does not
/// compile, a label name Prometheus would refuse.
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
    let mut default_regex = false;
    let mut mappings = None;
    for (key, line, value) in &top {
        match key.as_str() {
            "defaults" => default_regex = defaults(value, &mut r)?,
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
    let mut mapper = Mapper::default();
    for (i, item) in items.iter().enumerate() {
        let (rule, is_regex) = rule(item, &format!("mappings[{i}]"), default_regex, &mut r)?;
        if is_regex {
            mapper.regexes.push(rule);
        } else {
            mapper.globs.push(rule);
        }
    }
    Ok((mapper, r.notes))
}

/// Reads `defaults`; returns whether `match_type` defaults to regex.
fn defaults(node: &MarkedYaml<'_>, r: &mut Reader<'_>) -> Result<bool, MapperError> {
    let mut regex = false;
    for (key, line, value) in entries(node, "defaults", r)? {
        let path = format!("defaults.{key}");
        match key.as_str() {
            "match_type" => regex = match_type(value, &path, r)?,
            "timer_type" | "observer_type" => timer_type(value, &path, r)?,
            "ttl" => r.notes.push(format!(
                "{}:{line}: {path} ignored: series are kept while the process runs",
                r.file
            )),
            "glob_disable_ordering" => {
                if scalar(value).as_deref() != Some("false") {
                    return Err(r.error(line, &path, "not supported: globs are tried in order"));
                }
            }
            _ => refused_or_unknown(&key, line, &path, r)?,
        }
    }
    Ok(regex)
}

fn rule(
    node: &MarkedYaml<'_>,
    path: &str,
    default_regex: bool,
    r: &mut Reader<'_>,
) -> Result<(Rule, bool), MapperError> {
    let mut found: Vec<(String, usize, &MarkedYaml<'_>)> = Vec::new();
    for (key, line, value) in entries(node, path, r)? {
        let key_path = format!("{path}.{key}");
        if let Some((_, why)) = IGNORED_KEYS.iter().find(|(k, _)| *k == key) {
            r.notes
                .push(format!("{}:{line}: {key_path} ignored: {why}", r.file));
        } else if MAPPING_KEYS.contains(&key.as_str()) {
            found.push((key, line, value));
        } else {
            refused_or_unknown(&key, line, &key_path, r)?;
        }
    }
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
        None => default_regex,
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
    for k in ["timer_type", "observer_type"] {
        if let Some((_, _, v)) = get(k) {
            timer_type(v, &format!("{path}.{k}"), r)?;
        }
    }
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
    let rule = Rule {
        pattern: compiled,
        name,
        labels,
        help,
        drop,
        kind,
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

/// Accepts the histogram timer type (sluice's); refuses a summary.
fn timer_type(node: &MarkedYaml<'_>, path: &str, r: &Reader<'_>) -> Result<(), MapperError> {
    match scalar(node).as_deref() {
        Some("histogram" | "") => Ok(()),
        other => Err(r.error(
            node_line(node),
            path,
            format!("not supported: {other:?}: timers are rendered as histograms"),
        )),
    }
}

fn refused_or_unknown(
    key: &str,
    line: usize,
    path: &str,
    r: &Reader<'_>,
) -> Result<(), MapperError> {
    let why = REFUSED_KEYS
        .iter()
        .find(|(k, _)| *k == key)
        .map_or("unknown key", |(_, why)| why);
    let message = if why == "unknown key" {
        why.to_owned()
    } else {
        format!("not supported: {why}")
    };
    Err(r.error(line, path, message))
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
