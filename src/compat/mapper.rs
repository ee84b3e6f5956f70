//! Names envoyproxy/ratelimit's stats as Prometheus series with a statsd_exporter mapping
//! file: the built-in one ([`DEFAULT_YAML`], Envoy Gateway's naming) or the operator's
//! (`ratelimit_metrics.mapper_file`, `PROMETHEUS_MAPPER_YAML`), read at start.
//!
//! The part of the format honoured: `mappings:` a list of `{match, name, labels, match_type
//! (glob | regex), action (map | drop), help, match_metric_type (counter | gauge | observer)}`,
//! and `defaults.match_type`. A glob's `*` matches within one dot-separated segment; `$1`,
//! `${1}` ... in `name` and label values are the captures (a regex's named groups too). All
//! globs are tried before the regexes, each kind in file order, and the first match wins;
//! a regex is not anchored (statsd_exporter's are not either). A stat no mapping matches
//! keeps the default name: its statsd name with every character outside `[a-zA-Z0-9_]` as
//! `_`. See [`parse`] for what is ignored and what stops the start.

use std::path::Path;

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
}

/// A parsed mapping file.
#[derive(Debug, Default)]
pub struct Mapper {
    globs: Vec<Rule>,
    regexes: Vec<Rule>,
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

    /// What `stat` (a statsd name) of `kind` becomes.
    pub fn map(&self, stat: &str, kind: Kind) -> Mapping<'_> {
        for rule in self.globs.iter().chain(&self.regexes) {
            if rule.kind.is_some_and(|k| k != kind) {
                continue;
            }
            let Some(caps) = rule.pattern.captures(stat) else {
                continue;
            };
            if rule.drop {
                return Mapping::Drop;
            }
            let expand = |template: &str| {
                let mut out = String::new();
                caps.expand(template, &mut out);
                out
            };
            return Mapping::Series {
                name: escape(&expand(&rule.name)),
                labels: rule
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), expand(v)))
                    .collect(),
                help: rule.help.as_deref(),
            };
        }
        Mapping::Series {
            name: escape(stat),
            labels: Vec::new(),
            help: None,
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
