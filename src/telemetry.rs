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

/// Where spans are sent: for gRPC, `endpoint` as given; for OTLP/HTTP, `endpoint` (plain
/// `http://`: no TLS client is built in) with `/v1/traces` when it has no path (the
/// collector's base URL).
pub fn otlp_url(endpoint: &str, protocol: OtlpProtocol) -> Result<String, TelemetryError> {
    if protocol == OtlpProtocol::Grpc {
        return Ok(endpoint.to_owned());
    }
    let bad = |why| TelemetryError::Endpoint(endpoint.to_owned(), why);
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return Err(bad("expected an http:// URL (sluice exports without TLS)"));
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("no host"));
    }
    match rest.split_once('/') {
        None => Ok(format!("{endpoint}/v1/traces")),
        Some((host, "")) => Ok(format!("http://{host}/v1/traces")),
        Some(_) => Ok(endpoint.to_owned()),
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
        let err = http("https://c:4318").unwrap_err();
        assert!(err.starts_with("log.otlp_endpoint \"https://c:4318\": expected an http://"));
        assert_eq!(grpc("https://c:4317").unwrap(), "https://c:4317");
        assert!(http("http://").is_err());
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

    use super::{Boxed, LogSettings, OtlpProtocol, TelemetryError, otlp_url};

    /// A layer exporting sluice's spans (debug level and up) to `endpoint` over
    /// `log.otlp_protocol` (see [`otlp_url`]) under the service names of `log`, sampled
    /// by `log.otlp_sampling_ratio`, and the provider to shut down at exit. Needs a tokio
    /// runtime.
    pub fn layer(
        endpoint: &str,
        log: &LogSettings,
    ) -> Result<(Boxed, SdkTracerProvider), TelemetryError> {
        let protocol = log.otlp_protocol;
        let url = otlp_url(endpoint, protocol)?;
        let exporter = match protocol {
            OtlpProtocol::Grpc => SpanExporter::builder()
                .with_tonic()
                .with_endpoint(url)
                .build()?,
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
}
