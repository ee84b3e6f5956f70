//! Logs and traces of the binary: `tracing` events to stderr (text or JSON, filtered by
//! `log.level` or `RUST_LOG`) and, with the `otel` cargo feature and `log.otlp_endpoint`,
//! sluice's spans (the per-request `should_rate_limit` span among them) exported over
//! OTLP (`log.otlp_protocol`: gRPC, or HTTP with protobuf bodies) whatever the log level.
//!
//! An invalid filter is an error, not a silent fallback. Text logs carry ANSI colours only
//! when stderr is a terminal (and `NO_COLOR` is unset), so files and `kubectl logs` stay
//! plain. The `log` records of dependencies (the file watcher's `notify` among them) reach
//! the same output.
//!
//! With `otel`, [`init`] must run inside a tokio runtime (the exporter's batch task lives
//! there), and [`Telemetry::shutdown`] flushes what is left before the process exits; a
//! request's span joins the caller's trace when the request carries one ([`propagation`]).

pub(crate) mod propagation;

use std::io::IsTerminal as _;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::settings::{LogFormat, LogSettings, OtlpProtocol};

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log.otlp_endpoint is set, but this sluice was built without the `otel` feature")]
    NotBuilt,
    #[cfg(feature = "otel")]
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("log.otlp_endpoint {0:?}: {1}")]
    Endpoint(String, &'static str),
    /// A TLS file of the exporter that cannot be used: the message names the setting (or
    /// the variable) and the file.
    #[error("{0}")]
    Tls(String),
    #[error("{origin}: invalid log filter {filter:?}: {source}")]
    Filter {
        /// `log.level` or `RUST_LOG`.
        origin: &'static str,
        filter: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("{origin}: the log filter is empty; give one such as `info`")]
    EmptyFilter { origin: &'static str },
    #[error("a global logger is already set: {0}")]
    Init(#[from] tracing_subscriber::util::TryInitError),
}

/// What must live until the process exits.
#[must_use = "call shutdown() before exiting to flush exported spans"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the span exporter, if any.
    pub fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "cannot flush the OTLP exporter");
        }
    }
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// Added to a filter that names no `notify` target: the file watcher's library logs at
/// info on every ConfigMap update (`unable to remove watch descriptor`), noise for an
/// operator. Its warnings and errors still show.
const QUIET_WATCHER: &str = "notify=warn";

/// Installs the global subscriber.
pub fn init(log: &LogSettings) -> Result<Telemetry, TelemetryError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = filter(rust_log.as_deref(), &log.level)?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colours());
    let fmt: Boxed = match log.format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    let mut layers = vec![fmt];
    #[cfg(feature = "otel")]
    let provider = match &log.otlp_endpoint {
        Some(endpoint) => {
            let (layer, provider) = otel::layer(endpoint, log)?;
            layers.push(layer);
            Some(provider)
        }
        None => None,
    };
    #[cfg(not(feature = "otel"))]
    if log.otlp_endpoint.is_some() {
        return Err(TelemetryError::NotBuilt);
    }
    tracing_subscriber::registry().with(layers).try_init()?;
    Ok(Telemetry {
        #[cfg(feature = "otel")]
        provider,
    })
}

/// Where spans are sent: for gRPC, `endpoint` as given; for OTLP/HTTP, `endpoint`
/// (`http://`, or `https://` for TLS) with `/v1/traces` when it has no path (the
/// collector's base URL).
pub fn otlp_url(endpoint: &str, protocol: OtlpProtocol) -> Result<String, TelemetryError> {
    let bad = |why| TelemetryError::Endpoint(endpoint.to_owned(), why);
    let (scheme, rest) = match endpoint.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
        _ => return Err(bad("expected an http:// or https:// URL")),
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("no host"));
    }
    if protocol == OtlpProtocol::Grpc {
        return Ok(endpoint.to_owned());
    }
    match rest.split_once('/') {
        None => Ok(format!("{endpoint}/v1/traces")),
        Some((host, "")) => Ok(format!("{scheme}://{host}/v1/traces")),
        Some(_) => Ok(endpoint.to_owned()),
    }
}

/// The TLS files of an `https://` collector, each with the name of the setting or variable
/// that gave it (for errors): `log.otlp_*_file` first, then the standard variables
/// `OTEL_EXPORTER_OTLP_TRACES_*`, then `OTEL_EXPORTER_OTLP_*`.
#[derive(Debug, Default, PartialEq)]
pub struct OtlpTlsFiles {
    /// The CA the collector's certificate must chain to; none: the system's roots.
    pub ca: Option<(String, std::path::PathBuf)>,
    /// The client certificate and its key, presented when both are given.
    pub cert: Option<(String, std::path::PathBuf)>,
    pub key: Option<(String, std::path::PathBuf)>,
}

impl OtlpTlsFiles {
    /// From `log`, then the variables `env` gives (empty values count as unset).
    pub fn from(
        log: &LogSettings,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<OtlpTlsFiles, TelemetryError> {
        let pick = |setting: &Option<std::path::PathBuf>, name: &str, var: &str| {
            if let Some(path) = setting {
                return Some((format!("log.{name}"), path.clone()));
            }
            [
                format!("OTEL_EXPORTER_OTLP_TRACES_{var}"),
                format!("OTEL_EXPORTER_OTLP_{var}"),
            ]
            .into_iter()
            .find_map(|v| {
                let value = env(&v).filter(|p| !p.trim().is_empty())?;
                Some((v, std::path::PathBuf::from(value)))
            })
        };
        let files = OtlpTlsFiles {
            ca: pick(&log.otlp_ca_file, "otlp_ca_file", "CERTIFICATE"),
            cert: pick(&log.otlp_cert_file, "otlp_cert_file", "CLIENT_CERTIFICATE"),
            key: pick(&log.otlp_key_file, "otlp_key_file", "CLIENT_KEY"),
        };
        if let (Some((name, _)), None) | (None, Some((name, _))) = (&files.cert, &files.key) {
            return Err(TelemetryError::Tls(format!(
                "{name}: the OTLP client certificate and key go together (log.otlp_cert_file \
                 and log.otlp_key_file, or OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and \
                 OTEL_EXPORTER_OTLP_CLIENT_KEY)"
            )));
        }
        Ok(files)
    }
}

/// The log filter: `rust_log` (the `RUST_LOG` variable) when set and not blank, else
/// `level` (`log.level`), with [`QUIET_WATCHER`] added unless it names `notify` itself.
fn filter(rust_log: Option<&str>, level: &str) -> Result<EnvFilter, TelemetryError> {
    let (origin, text) = match rust_log {
        Some(v) if !v.trim().is_empty() => ("RUST_LOG", v),
        _ => ("log.level", level),
    };
    if text.trim().is_empty() {
        return Err(TelemetryError::EmptyFilter { origin });
    }
    let names_notify = text
        .split(',')
        .any(|directive| directive.trim_start().starts_with("notify"));
    let full = if names_notify {
        text.to_owned()
    } else {
        format!("{text},{QUIET_WATCHER}")
    };
    EnvFilter::try_new(&full).map_err(|source| TelemetryError::Filter {
        origin,
        filter: text.to_owned(),
        source,
    })
}

/// ANSI colours only for a person at a terminal: not in files, pipes or `kubectl logs`, and
/// not when `NO_COLOR` is set (<https://no-color.org>).
fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter's directives, in no particular order.
    fn directives(rust_log: Option<&str>, level: &str) -> std::collections::BTreeSet<String> {
        let filter = filter(rust_log, level).expect("a valid filter").to_string();
        filter.split(',').map(str::to_owned).collect()
    }

    #[test]
    fn the_watcher_is_quiet_unless_the_filter_names_it() {
        let set = |d: &[&str]| d.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(directives(None, "info"), set(&["info", "notify=warn"]));
        let debug = set(&["debug", "notify=debug"]);
        assert_eq!(directives(None, "debug,notify=debug"), debug);
        let rust_log = set(&["sluice=trace", "notify=warn"]);
        assert_eq!(directives(Some("sluice=trace"), "info"), rust_log);
        assert_eq!(directives(Some(" "), "warn"), set(&["warn", "notify=warn"]));
    }

    #[test]
    fn otlp_http_urls_get_the_traces_path_when_they_have_none() {
        let http = |e| otlp_url(e, OtlpProtocol::Http).map_err(|e| e.to_string());
        let grpc = |e| otlp_url(e, OtlpProtocol::Grpc).map_err(|e| e.to_string());
        assert_eq!(http("http://c:4318").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(http("http://c:4318/").unwrap(), "http://c:4318/v1/traces");
        assert_eq!(
            http("http://c/otlp/v1/traces").unwrap(),
            "http://c/otlp/v1/traces"
        );
        assert_eq!(grpc("http://c:4317").unwrap(), "http://c:4317");
        assert_eq!(http("https://c:4318").unwrap(), "https://c:4318/v1/traces");
        assert_eq!(http("https://c:4318/").unwrap(), "https://c:4318/v1/traces");
        assert_eq!(grpc("https://c:4317").unwrap(), "https://c:4317");
        assert!(http("http://").is_err());
        let err = http("ftp://c").unwrap_err();
        assert!(err.contains("expected an http:// or https:// URL"), "{err}");
        assert!(grpc("c:4317").is_err());
    }

    #[test]
    fn otlp_tls_files_come_from_the_settings_then_the_standard_variables() {
        use std::path::PathBuf;
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let none = OtlpTlsFiles::from(&LogSettings::default(), vars(&[])).unwrap();
        assert_eq!(none, OtlpTlsFiles::default());
        let env = vars(&[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/all-ca"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces-ca"),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k"),
        ]);
        let files = OtlpTlsFiles::from(&LogSettings::default(), env).unwrap();
        let named = |n: &str, p: &str| Some((n.to_owned(), PathBuf::from(p)));
        assert_eq!(
            files.ca,
            named("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces-ca")
        );
        assert_eq!(
            files.cert,
            named("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c")
        );
        let log = LogSettings {
            otlp_ca_file: Some(PathBuf::from("/own-ca")),
            ..LogSettings::default()
        };
        let files = OtlpTlsFiles::from(&log, env).unwrap();
        assert_eq!(files.ca, named("log.otlp_ca_file", "/own-ca"));
        let half = vars(&[("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/c")]);
        let err = OtlpTlsFiles::from(&LogSettings::default(), half)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: the OTLP client certificate and key go together"),
            "{err}"
        );
    }

    #[test]
    fn an_invalid_or_empty_filter_is_an_error_naming_its_origin() {
        let e = filter(None, "sluice=loud").unwrap_err().to_string();
        assert!(
            e.starts_with("log.level: invalid log filter \"sluice=loud\": "),
            "{e}"
        );
        let e = filter(Some("nonsense=["), "info").unwrap_err().to_string();
        assert!(
            e.starts_with("RUST_LOG: invalid log filter \"nonsense=[\""),
            "{e}"
        );
        let e = filter(None, "  ").unwrap_err().to_string();
        assert_eq!(
            e,
            "log.level: the log filter is empty; give one such as `info`"
        );
    }
}

#[cfg(feature = "otel")]
pub mod otel {
    //! The OTLP span exporter (gRPC, or HTTP with protobuf bodies) as a `tracing` layer.

    use opentelemetry::KeyValue;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
    use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
    use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
    use tracing_subscriber::{EnvFilter, Layer as _};

    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use opentelemetry_otlp::{WithHttpConfig as _, WithTonicConfig as _};
    use sluice_core::pem::{certificates, private_key};

    use super::{Boxed, LogSettings, OtlpProtocol, OtlpTlsFiles, TelemetryError, otlp_url};

    /// How long one OTLP/HTTP export over TLS may take: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`,
    /// else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else 10 s, as the exporter reads
    /// them for its own client.
    fn export_timeout() -> Duration {
        [
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ]
        .into_iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
    }

    /// A layer exporting sluice's spans (debug level and up) to `endpoint` over
    /// `log.otlp_protocol` (see [`otlp_url`]) under the service names of `log`, sampled
    /// by `log.otlp_sampling_ratio`, and the provider to shut down at exit. An `https://`
    /// endpoint is reached over TLS with the files of [`OtlpTlsFiles::from`] (the
    /// settings, then the process's `OTEL_EXPORTER_OTLP_*` variables). Needs a tokio
    /// runtime.
    pub fn layer(
        endpoint: &str,
        log: &LogSettings,
    ) -> Result<(Boxed, SdkTracerProvider), TelemetryError> {
        let tls = OtlpTlsFiles::from(log, |name| std::env::var(name).ok())?;
        layer_with(endpoint, log, &tls)
    }

    /// The same with the TLS files `tls`: an `https://` endpoint is reached over TLS
    /// (rustls with ring), its certificate checked against `tls.ca` (else the system's
    /// roots) and its name, `tls.cert` presented when given.
    pub fn layer_with(
        endpoint: &str,
        log: &LogSettings,
        tls: &OtlpTlsFiles,
    ) -> Result<(Boxed, SdkTracerProvider), TelemetryError> {
        let protocol = log.otlp_protocol;
        let url = otlp_url(endpoint, protocol)?;
        let secure = url.starts_with("https://");
        let exporter = match protocol {
            OtlpProtocol::Grpc if secure => SpanExporter::builder()
                .with_tonic()
                .with_tls_config(tonic_tls(tls)?)
                .with_endpoint(url)
                .build()?,
            OtlpProtocol::Grpc => SpanExporter::builder()
                .with_tonic()
                .with_endpoint(url)
                .build()?,
            OtlpProtocol::Http if secure => {
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(rustls_config(tls)?)
                    .https_only()
                    .enable_http1()
                    .build();
                let client =
                    opentelemetry_http::hyper::HyperClient::new(connector, export_timeout(), None);
                SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(url)
                    .build()?
            }
            OtlpProtocol::Http => SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url)
                .build()?,
        };
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let names = [
            ("service.namespace", &log.otlp_service_namespace),
            ("service.instance.id", &log.otlp_service_instance_id),
        ];
        let resource =
            opentelemetry_sdk::Resource::builder()
                .with_service_name(log.otlp_service_name.clone())
                .with_attributes(names.into_iter().filter_map(|(key, value)| {
                    value.as_ref().map(|v| KeyValue::new(key, v.clone()))
                }))
                .build();
        // Root spans (a request's) are kept by trace id at the configured ratio; the spans
        // inside them follow their parent's choice.
        let ratio = Sampler::TraceIdRatioBased(log.otlp_sampling_ratio);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .with_sampler(Sampler::ParentBased(Box::new(ratio)))
            .build();
        let tracer = provider.tracer("sluice");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(EnvFilter::new("sluice=debug"))
            .boxed();
        Ok((layer, provider))
    }

    fn tls_error(name: &str, e: impl std::fmt::Display) -> TelemetryError {
        TelemetryError::Tls(format!("{name}: {e}"))
    }

    /// `path`'s bytes, for a file already checked.
    fn read(name: &str, path: &Path) -> Result<Vec<u8>, TelemetryError> {
        std::fs::read(path).map_err(|e| tls_error(name, format!("{}: {e}", path.display())))
    }

    /// The trust anchors: `tls.ca`'s certificates, else the system's roots.
    fn roots(tls: &OtlpTlsFiles) -> Result<rustls::RootCertStore, TelemetryError> {
        let mut roots = rustls::RootCertStore::empty();
        match &tls.ca {
            Some((name, path)) => {
                for cert in certificates(path).map_err(|e| tls_error(name, e))? {
                    roots
                        .add(cert)
                        .map_err(|e| tls_error(name, format!("{}: {e}", path.display())))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
            }
        }
        Ok(roots)
    }

    /// The OTLP/HTTP client's configuration (ring, TLS 1.2 and 1.3).
    fn rustls_config(tls: &OtlpTlsFiles) -> Result<rustls::ClientConfig, TelemetryError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("log.otlp_endpoint", e))?
            .with_root_certificates(roots(tls)?);
        match (&tls.cert, &tls.key) {
            (Some((cert_name, cert)), Some((key_name, key))) => {
                let chain = certificates(cert).map_err(|e| tls_error(cert_name, e))?;
                let key_der = private_key(key).map_err(|e| tls_error(key_name, e))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| tls_error(key_name, format!("{}: {e}", key.display())))
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }

    /// The OTLP/gRPC channel's TLS: the same files, checked the same way (by building the
    /// rustls configuration), handed to tonic.
    fn tonic_tls(tls: &OtlpTlsFiles) -> Result<tonic::transport::ClientTlsConfig, TelemetryError> {
        rustls_config(tls)?;
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match &tls.ca {
            Some((name, path)) => {
                config.ca_certificate(tonic::transport::Certificate::from_pem(read(name, path)?))
            }
            None => config.with_native_roots(),
        };
        if let (Some((cert_name, cert)), Some((key_name, key))) = (&tls.cert, &tls.key) {
            let identity =
                tonic::transport::Identity::from_pem(read(cert_name, cert)?, read(key_name, key)?);
            config = config.identity(identity);
        }
        Ok(config)
    }
}
