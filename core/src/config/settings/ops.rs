//! The operations sections of the settings: `[metrics]`, `[reload]` and `[tls]`.

use std::path::PathBuf;

use serde::Deserialize;

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// A descriptor counts as near its limit once more than this share (0 < r <= 1) of the
    /// capacity is used.
    pub near_limit_ratio: f64,
    /// At most this many per-rule label sets built from request values (`detailed_metric`,
    /// `value_to_metric`, overrides); later ones count under `rule="__other__"`.
    pub max_value_label_sets: usize,
    /// Also serve limitador's metrics under its names (`limitador_up`, `authorized_calls`,
    /// `limited_calls`, ...) on `/metrics`, which is then in the Prometheus text format 0.0.4
    /// (on when started as `limitador-server`).
    pub limitador: bool,
    /// With `limitador`, `limited_calls` also has the `limit_name` label (limitador's
    /// `--limit-name-in-labels`).
    pub limitador_limit_name_label: bool,
    /// With `limitador`: a YAML file of `label: CEL expression` whose values label
    /// `authorized_calls`, `authorized_hits` and `limited_calls` (limitador's
    /// `--custom-metric-labels`), read at start.
    pub limitador_labels_file: Option<PathBuf>,
    /// With `limitador`: a CEL expression giving a map of labels for the same series
    /// (limitador's `--metric-labels-default`).
    pub limitador_labels_default: Option<String>,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            near_limit_ratio: 0.8,
            max_value_label_sets: 10_000,
            limitador: false,
            limitador_limit_name_label: false,
            limitador_labels_file: None,
            limitador_labels_default: None,
        }
    }
}

/// `[reload]`: hot reload of the rules.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ReloadSettings {
    /// Watch the rules paths and reload on change (SIGHUP reloads either way).
    pub watch: bool,
    /// Quiet time after the last change before reloading.
    pub debounce_ms: u64,
}

impl Default for ReloadSettings {
    fn default() -> Self {
        ReloadSettings {
            watch: true,
            debounce_ms: 200,
        }
    }
}

/// `[tls]`: TLS on the gRPC port (off unless `cert_file` and `key_file` are set). The files
/// are PEM and are reloaded when they change.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The server certificate chain, leaf first.
    pub cert_file: Option<PathBuf>,
    /// The server's private key.
    pub key_file: Option<PathBuf>,
    /// With it, clients must present a certificate signed by one of these CAs (mTLS).
    pub client_ca_file: Option<PathBuf>,
    /// With it (and `client_ca_file`), a client's certificate must also name this DNS name
    /// or IP address among its subject alternative names (envoyproxy/ratelimit's
    /// `GRPC_CLIENT_TLS_SAN`).
    pub client_san: Option<String>,
}
