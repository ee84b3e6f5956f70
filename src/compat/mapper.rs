//! Names envoyproxy/ratelimit's stats as Prometheus series with a statsd_exporter mapping
//! file: the built-in one ([`DEFAULT_YAML`], Envoy Gateway's naming) or the operator's
//! (`ratelimit_metrics.mapper_file`, `PROMETHEUS_MAPPER_YAML`), read at start.
//!
//! The part of the format honoured: `mappings:` a list of `{match, name, labels, match_type
//! (glob | regex), action (map | drop), help, match_metric_type (counter | gauge | observer),
//! observer_type (timer_type), histogram_options, summary_options, buckets, quantiles}`, and
//! `defaults` (`match_type`, `observer_type`, `histogram_options`, `summary_options`,
//! `glob_disable_ordering`). A glob's `*` matches within one dot-separated segment; `$1`,
//! `${1}` ... in `name` and label values are the captures (a regex's named groups too). All
//! globs are tried before the regexes; the first match wins, globs in file order (or, with
//! `glob_disable_ordering: true`, the glob whose segments are literal furthest to the left,
//! as statsd_exporter's matcher then picks), regexes in file order; a regex is not anchored
//! (statsd_exporter's are not either). A stat no mapping matches keeps the default name: its
//! statsd name with every character outside `[a-zA-Z0-9_]` as `_`. A timer (the response
//! time) is a histogram or a summary ([`Observer`]) as statsd_exporter 0.26 (the version
//! envoyproxy/ratelimit builds with) makes it: a summary unless its mapping or the defaults
//! say histogram. See [`parse`] for what is ignored and what stops the start.

use std::path::Path;
use std::time::Duration;

use regex::Regex;

/// The built-in mapping.
pub const DEFAULT_YAML: &str = include_str!("mapper/default.yaml");

/// The kind of a stat, for `match_metric_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// A timer (sluice's response time).
    Observer,
}

/// How a timer (sluice's response time) is rendered: statsd_exporter's observer types.
#[derive(Debug, Clone, PartialEq)]
pub enum Observer {
    /// Cumulative buckets with these upper bounds (seconds, increasing), `_sum`, `_count`.
    Histogram { buckets: Vec<f64> },
    /// These quantiles of the last `max_age` (moving in `age_buckets` steps), `_sum` and
    /// `_count` (those two since the start, as Prometheus's Go client counts them).
    Summary {
        quantiles: Vec<f64>,
        max_age: Duration,
        age_buckets: u32,
    },
}

/// Prometheus's default histogram buckets (seconds), statsd_exporter's when a file names none.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// statsd_exporter's quantiles (with their rank errors) when a file names none.
pub const DEFAULT_QUANTILES: [(f64, f64); 3] = [(0.5, 0.05), (0.9, 0.01), (0.99, 0.001)];

/// Prometheus's Go client's summary window when a file sets none: 10 minutes in 5 steps.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(600);
pub const DEFAULT_AGE_BUCKETS: u32 = 5;

impl Default for Observer {
    /// What statsd_exporter makes of a timer that nothing types: a summary.
    fn default() -> Observer {
        Observer::Summary {
            quantiles: DEFAULT_QUANTILES.iter().map(|(q, _)| *q).collect(),
            max_age: DEFAULT_MAX_AGE,
            age_buckets: DEFAULT_AGE_BUCKETS,
        }
    }
}

/// What a stat becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapping<'m> {
    Series {
        name: String,
        labels: Vec<(String, String)>,
        help: Option<&'m str>,
    },
    Drop,
}

/// A mapping file that cannot be used, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {key}: {message}")]
pub struct MapperError {
    pub file: String,
    pub line: usize,
    pub key: String,
    pub message: String,
}

#[derive(Debug)]
struct Rule {
    /// A glob compiled to an anchored regex, or the regex as written.
    pattern: Regex,
    name: String,
    labels: Vec<(String, String)>,
    help: Option<String>,
    drop: bool,
    kind: Option<Kind>,
    /// How a timer it matches is rendered.
    observer: Observer,
    /// Per segment of a glob, whether it holds a `*` (for `glob_disable_ordering`).
    wild: Vec<bool>,
}

/// A parsed mapping file.
#[derive(Debug, Default)]
pub struct Mapper {
    globs: Vec<Rule>,
    regexes: Vec<Rule>,
    /// `defaults.glob_disable_ordering`.
    unordered_globs: bool,
    /// How a timer no mapping matches is rendered (the defaults').
    observer: Observer,
}

impl Mapper {
    /// The built-in mapping.
    pub(crate) fn builtin() -> Mapper {
        // Tested to parse; an empty mapper (default names) is the safe fallback.
        parse(DEFAULT_YAML, "built-in mapping").map_or_else(|_| Mapper::default(), |(m, _)| m)
    }

    /// The mapping `[ratelimit_metrics]` asks for: its `mapper_file` (what it ignores is
    /// logged), else the built-in one.
    pub(crate) fn for_settings(
        settings: &crate::config::settings::RatelimitMetricsSettings,
    ) -> Result<Mapper, MapperError> {
        let Some(path) = &settings.mapper_file else {
            return Ok(Mapper::builtin());
        };
        let (mapper, notes) = Mapper::load(path)?;
        for note in notes {
            tracing::info!("statsd mapping: {note}");
        }
        Ok(mapper)
    }

    /// Reads a mapping file; also returns what in it is ignored (to be logged).
    pub fn load(path: &Path) -> Result<(Mapper, Vec<String>), MapperError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| MapperError {
            file: file.clone(),
            line: 0,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        parse(&text, &file)
    }

    /// The mapping that matches `stat` of `kind`, with its captures.
    fn find<'s>(&self, stat: &'s str, kind: Kind) -> Option<(&Rule, regex::Captures<'s>)> {
        let typed = |rule: &&Rule| rule.kind.is_none_or(|k| k == kind);
        let glob = if self.unordered_globs {
            // Literal segments before `*` ones, from the left; file order among equals.
            self.globs
                .iter()
                .filter(typed)
                .filter_map(|rule| Some((rule, rule.pattern.captures(stat)?)))
                .min_by(|(a, _), (b, _)| a.wild.cmp(&b.wild))
        } else {
            self.globs
                .iter()
                .filter(typed)
                .find_map(|rule| Some((rule, rule.pattern.captures(stat)?)))
        };
        glob.or_else(|| {
            self.regexes
                .iter()
                .filter(typed)
                .find_map(|rule| Some((rule, rule.pattern.captures(stat)?)))
        })
    }

    /// What `stat` (a statsd name) of `kind` becomes.
    pub fn map(&self, stat: &str, kind: Kind) -> Mapping<'_> {
        let Some((rule, caps)) = self.find(stat, kind) else {
            return Mapping::Series {
                name: escape(stat),
                labels: Vec::new(),
                help: None,
            };
        };
        if rule.drop {
            return Mapping::Drop;
        }
        let expand = |template: &str| {
            let mut out = String::new();
            caps.expand(template, &mut out);
            out
        };
        Mapping::Series {
            name: escape(&expand(&rule.name)),
            labels: rule
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), expand(v)))
                .collect(),
            help: rule.help.as_deref(),
        }
    }

    /// How the timer `stat` is rendered: as its mapping says, else as the defaults say.
    pub fn observer(&self, stat: &str) -> &Observer {
        match self.find(stat, Kind::Observer) {
            Some((rule, _)) => &rule.observer,
            None => &self.observer,
        }
    }
}

/// A metric name from any text: characters outside `[a-zA-Z0-9_:]` as `_`, and `_` in
/// front of a leading digit.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            c
        } else {
            '_'
        }
    }));
    out
}

mod parse;
#[cfg(test)]
mod tests;

pub use parse::parse;
