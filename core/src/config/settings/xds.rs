//! `[xds]`: rules over xDS (an ADS state-of-the-world stream of envoyproxy/ratelimit's
//! `RateLimitConfig` resources, as Envoy Gateway serves them). Off while `server` is empty;
//! one source of rules at a time, so `rules.paths` must then be empty.

use std::path::PathBuf;

use serde::Deserialize;

/// `[xds]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct XdsSettings {
    /// The management server, `host:port` or `http(s)://host:port`; empty: rules from files.
    pub server: String,
    /// The node id sent to the server (Envoy Gateway serves `envoy-ratelimit`).
    pub node_id: String,
    /// The node's cluster (optional).
    pub node_cluster: String,
    /// Node metadata, `k1=v1,k2=v2` (string values).
    pub node_metadata: String,
    /// Extra gRPC headers on the stream, `k1:v1,k2:v2`.
    pub headers: String,
    /// Connect over TLS (also on with `https://` or any of the files below).
    pub tls: bool,
    /// The CA that signed the server's certificate (PEM); required with TLS.
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM), for mTLS; goes with `key_file`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry; default: the server's host.
    pub server_name: String,
    /// Start serving before the first rules arrive (readiness stays off until they do);
    /// without it, sluice waits for them before listening.
    pub start_without_rules: bool,
    /// First wait before reconnecting to a lost server; doubles up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// The largest response accepted.
    pub max_message_bytes: usize,
}

impl Default for XdsSettings {
    fn default() -> Self {
        XdsSettings {
            server: String::new(),
            node_id: "sluice".to_owned(),
            node_cluster: String::new(),
            node_metadata: String::new(),
            headers: String::new(),
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: String::new(),
            start_without_rules: false,
            retry_initial_ms: 500,
            retry_max_ms: 30_000,
            max_message_bytes: 16 * 1024 * 1024,
        }
    }
}

impl XdsSettings {
    /// Whether rules come over xDS.
    pub fn enabled(&self) -> bool {
        !self.server.trim().is_empty()
    }

    /// Whether the connection uses TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls
            || self.server.starts_with("https://")
            || self.ca_file.is_some()
            || self.cert_file.is_some()
    }

    /// Checks what deserializing cannot.
    pub(super) fn check(&self, rules_paths: &[PathBuf]) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        if !rules_paths.is_empty() {
            return Err(
                "xds.server and rules.paths cannot be used together: rules come \
                        from one source at a time"
                    .to_owned(),
            );
        }
        if self.node_id.is_empty() {
            return Err("xds.node_id must not be empty".to_owned());
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err("xds: cert_file and key_file go together".to_owned());
        }
        if self.uses_tls() && self.ca_file.is_none() {
            return Err("xds: TLS to the server needs xds.ca_file".to_owned());
        }
        if self.retry_initial_ms == 0 || self.retry_max_ms < self.retry_initial_ms {
            return Err("xds: retry_initial_ms must be at least 1 and at most retry_max_ms".into());
        }
        pairs(&self.node_metadata, '=').map_err(|e| format!("xds.node_metadata: {e}"))?;
        pairs(&self.headers, ':').map_err(|e| format!("xds.headers: {e}"))?;
        Ok(())
    }

    /// `node_metadata` as pairs.
    pub fn metadata_pairs(&self) -> Vec<(String, String)> {
        pairs(&self.node_metadata, '=').unwrap_or_default()
    }

    /// `headers` as pairs.
    pub fn header_pairs(&self) -> Vec<(String, String)> {
        pairs(&self.headers, ':').unwrap_or_default()
    }
}

/// `k1<sep>v1,k2<sep>v2` as pairs (empty: none).
fn pairs(text: &str, sep: char) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once(sep) {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(format!("expected key{sep}value, got '{item}'")),
        })
        .collect()
}
