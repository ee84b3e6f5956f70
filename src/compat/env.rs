//! envoyproxy/ratelimit's environment variables onto sluice's settings: what `sluice` does
//! when started as `ratelimit` (argv[0]) or with `--ratelimit-env`.
//!
//! [`translate`] is a pure function of the environment: it gives the `SLUICE_*` settings the
//! variables mean (with envoyproxy/ratelimit's defaults for those not set, e.g. its ports),
//! the variables it read but can safely ignore (each with why, logged once at start), or the
//! first variable whose behaviour sluice cannot honour (the start stops with exit 64, naming
//! it). [`settings`] layers the result with the real `SLUICE_*` variables: a ratelimit
//! variable that is set wins, a `SLUICE_*` one sets the rest (ratelimit's defaults included).
//! The full table is docs/ratelimit-compat.md.

use std::collections::HashMap;

use crate::config::settings::{Overrides, Settings, SettingsError};

/// What the environment means for sluice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// `SLUICE_*` names and values.
    pub settings: Vec<(String, String)>,
    /// Variables set but ignored, and why.
    pub ignored: Vec<(String, String)>,
}

/// A variable sluice cannot honour, or a value it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value}: {why}")]
pub struct Unsupported {
    pub name: String,
    pub value: String,
    pub why: String,
}

/// Why the start stops.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    #[error("envoyproxy/ratelimit setting not supported: {0}")]
    Unsupported(#[from] Unsupported),
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

/// Reads the environment of envoyproxy/ratelimit.
pub fn translate(env: &HashMap<String, String>) -> Result<Translation, Unsupported> {
    let mut t = Reader {
        env,
        out: Translation::default(),
    };
    t.listeners()?;
    t.log()?;
    t.tls()?;
    t.rules()?;
    t.backend()?;
    t.behaviour()?;
    t.stats()?;
    t.tracing()?;
    for (name, why) in IGNORED {
        if let Some(v) = env.get(*name) {
            t.out
                .ignored
                .push(((*name).to_owned(), format!("{v}: {why}")));
        }
    }
    t.out.ignored.sort();
    Ok(t.out)
}

/// The settings of the environment. A setting that an envoyproxy/ratelimit variable set
/// gives wins over the same `SLUICE_*` variable (the image's own `SLUICE_SERVER__*` defaults
/// must not undo `GRPC_PORT`); one that only comes from its defaults yields to it, and to a
/// settings file named by [`CONFIG_FILE`] (where `limits.domains` can be set).
pub fn settings(env: &HashMap<String, String>) -> Result<(Settings, Translation), CompatError> {
    let translation = spans_if_built(translate(env)?);
    let defaults = translate(&HashMap::new())?.settings;
    let mut layered = env.clone();
    let file = layered.remove(CONFIG_FILE).map(std::path::PathBuf::from);
    let mut base = HashMap::new();
    for (k, v) in &translation.settings {
        if defaults.iter().any(|(dk, dv)| dk == k && dv == v) {
            base.insert(k.clone(), v.clone());
        } else {
            layered.insert(k.clone(), v.clone());
        }
    }
    let settings = Settings::load_over(base, file.as_deref(), layered, &Overrides::default())?;
    Ok((settings, translation))
}

/// The variable that names a settings file (TOML or YAML) under envoyproxy/ratelimit's
/// environment, read below that environment's own variables.
pub(crate) const CONFIG_FILE: &str = "SLUICE_CONFIG_FILE";

/// `translation` without span export when this sluice is built without the `otel` feature:
/// tracing changes no answer, so `TRACING_ENABLED` is then ignored (and logged) rather than
/// stopping a drop-in start.
fn spans_if_built(mut translation: Translation) -> Translation {
    if cfg!(feature = "otel") {
        return translation;
    }
    let before = translation.settings.len();
    translation
        .settings
        .retain(|(k, _)| !k.starts_with("SLUICE_LOG__OTLP_"));
    if translation.settings.len() < before {
        let why = "true: no spans are exported, as this sluice is built without the `otel` feature";
        translation
            .ignored
            .push(("TRACING_ENABLED".to_owned(), why.to_owned()));
        translation.ignored.sort();
    }
    translation
}

struct Reader<'a> {
    env: &'a HashMap<String, String>,
    out: Translation,
}

impl Reader<'_> {
    /// A variable's value, absent when unset or empty.
    fn get(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }

    fn or<'s>(&'s self, name: &str, default: &'s str) -> &'s str {
        self.get(name).unwrap_or(default)
    }

    fn set(&mut self, key: &str, value: impl Into<String>) {
        self.out
            .settings
            .push((format!("SLUICE_{key}"), value.into()));
    }

    fn unsupported(&self, name: &str, why: &str) -> Unsupported {
        Unsupported {
            name: name.to_owned(),
            value: self.env.get(name).cloned().unwrap_or_default(),
            why: why.to_owned(),
        }
    }

    /// A boolean as Go's strconv.ParseBool reads it; `default` when unset.
    fn flag(&self, name: &str, default: bool) -> Result<bool, Unsupported> {
        match self.get(name) {
            None => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(_) => Err(self.unsupported(name, "expected true or false")),
        }
    }

    fn duration_ms(&self, name: &str) -> Result<Option<u64>, Unsupported> {
        self.get(name)
            .map(|v| {
                go_duration_ms(v).ok_or_else(|| {
                    self.unsupported(name, "expected a duration such as 10s or 500ms")
                })
            })
            .transpose()
    }
}

/// A Go duration (`300ms`, `10s`, `1m30s`, `2h`; a bare number is seconds) in milliseconds.
fn go_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return secs.checked_mul(1000);
    }
    let nanos = super::go_duration(text)?.as_nanos();
    u64::try_from((nanos + 500_000) / 1_000_000).ok()
}

mod backend;
mod ignored;
mod limits;
mod server;
mod telemetry;
#[cfg(test)]
mod tests;

use ignored::IGNORED;
