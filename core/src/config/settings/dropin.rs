//! The drop-in sections: `[statsd]` (envoyproxy/ratelimit's stat names over UDP or TCP),
//! `[ratelimit_metrics]` (its Prometheus series, named as Envoy Gateway's mapping renders
//! them) and `[debug]` (a second HTTP listener for the admin endpoints, as its debug port).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// `[statsd]`: off while `address` is empty.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StatsdSettings {
    /// `host:port` of a statsd server.
    pub address: String,
    /// `udp` (datagrams) or `tcp` (one connection, newline-terminated lines).
    pub protocol: StatsdProtocol,
    /// DogStatsD tags (`|#k:v`) instead of plain statsd (tags in the name, `.__k=v`).
    pub dogstatsd: bool,
    /// Tags on every stat, `k1:v1,k2:v2`.
    pub tags: String,
    /// How often counters are sent.
    pub flush_interval_ms: u64,
    /// With `dogstatsd`: names rewritten into a name and tags, the first whose pattern
    /// matches a stat's name (envoyproxy/ratelimit's DogStatsD mogrifiers). A list of
    /// tables, or the same list as a JSON string (how `SLUICE_STATSD__MOGRIFIERS` and the
    /// `USE_DOG_STATSD_MOGRIFIERS` translation give it).
    #[serde(deserialize_with = "mogrifiers")]
    pub mogrifiers: Vec<Mogrifier>,
}

/// One rewrite of stat names: `pattern` (a regular expression, not anchored) is searched
/// in the name; when it matches, the stat is sent as `name`, with `tags` (`k:v,k:v`) added
/// to its tags. In `name` and in tag values, `$0` is the whole match and `$1`, `$2`, ... the
/// pattern's groups (an unmatched group is empty; a `$N` beyond the groups stays as
/// written).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Mogrifier {
    /// What names it in errors (envoyproxy/ratelimit's mogrifier key, `DOMAIN`, ...).
    pub id: String,
    pub pattern: String,
    pub name: String,
    pub tags: String,
}

impl Mogrifier {
    /// `tags` as pairs, in the order written.
    pub fn tag_pairs(&self) -> Result<Vec<(String, String)>, String> {
        self.tags
            .split(',')
            .filter(|t| !t.is_empty())
            .map(|t| match t.split_once(':') {
                Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_owned(), v.to_owned())),
                _ => Err(format!("expected key:value, got '{t}'")),
            })
            .collect()
    }
}

fn mogrifiers<'de, D>(d: D) -> Result<Vec<Mogrifier>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrJson {
        List(Vec<Mogrifier>),
        Json(String),
    }
    match ListOrJson::deserialize(d)? {
        ListOrJson::List(list) => Ok(list),
        ListOrJson::Json(text) if text.trim().is_empty() => Ok(Vec::new()),
        ListOrJson::Json(text) => serde_json::from_str(&text).map_err(serde::de::Error::custom),
    }
}

impl Default for StatsdSettings {
    fn default() -> Self {
        StatsdSettings {
            address: String::new(),
            protocol: StatsdProtocol::Udp,
            dogstatsd: false,
            tags: String::new(),
            flush_interval_ms: 10_000,
            mogrifiers: Vec::new(),
        }
    }
}

/// How statsd lines travel.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StatsdProtocol {
    #[default]
    Udp,
    Tcp,
}

impl StatsdSettings {
    pub fn enabled(&self) -> bool {
        !self.address.trim().is_empty()
    }

    /// `tags` as pairs.
    pub fn tag_pairs(&self) -> Vec<(String, String)> {
        self.tags
            .split(',')
            .filter_map(|t| t.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .filter(|(k, _)| !k.is_empty())
            .collect()
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if self.enabled() && self.flush_interval_ms == 0 {
            return Err("statsd.flush_interval_ms must be at least 1".to_owned());
        }
        if self.dogstatsd && self.protocol == StatsdProtocol::Tcp {
            return Err(
                "statsd.protocol = tcp does not go with statsd.dogstatsd (DogStatsD agents listen on UDP)"
                    .to_owned(),
            );
        }
        if let Some(bad) = self
            .tags
            .split(',')
            .map(str::trim)
            .find(|t| !t.is_empty() && !t.contains(':'))
        {
            return Err(format!("statsd.tags: expected key:value, got '{bad}'"));
        }
        if !self.mogrifiers.is_empty() && !self.dogstatsd {
            return Err(
                "statsd.mogrifiers needs statsd.dogstatsd (plain statsd names carry no tags to move into)"
                    .to_owned(),
            );
        }
        for (i, m) in self.mogrifiers.iter().enumerate() {
            let at = format!("statsd.mogrifiers[{i}] ({})", m.id);
            if m.pattern.is_empty() {
                return Err(format!("{at}: no pattern"));
            }
            if m.name.is_empty() {
                return Err(format!("{at}: no name"));
            }
            m.tag_pairs().map_err(|e| format!("{at}: tags: {e}"))?;
        }
        Ok(())
    }
}

/// `[ratelimit_metrics]`: off while `listen` is unset.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RatelimitMetricsSettings {
    /// Where to serve them (Envoy Gateway: `0.0.0.0:19001`).
    pub listen: Option<SocketAddr>,
    /// The path they are served on.
    pub path: String,
    /// A statsd_exporter mapping file naming the series instead of the built-in mapping
    /// (Envoy Gateway's); read at start, an invalid one stops it (exit 64).
    pub mapper_file: Option<PathBuf>,
}

impl Default for RatelimitMetricsSettings {
    fn default() -> Self {
        RatelimitMetricsSettings {
            listen: None,
            path: "/metrics".to_owned(),
            mapper_file: None,
        }
    }
}

/// `[debug]`: off while `listen` is unset.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DebugSettings {
    /// A second listener for the admin endpoints (`/rlconfig`, `/metrics`, ...), as
    /// envoyproxy/ratelimit's debug port (6070).
    pub listen: Option<SocketAddr>,
}
