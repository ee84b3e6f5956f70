//! Logs and traces of the binary: `tracing` events to stderr (text or JSON, filtered by
//! `log.level` or `RUST_LOG`) and, with the `otel` cargo feature and `log.otlp_endpoint`,
//! sluice's spans (the per-request `should_rate_limit` span among them) exported over
//! OTLP/gRPC whatever the log level.
//!
//! With `otel`, [`init`] must run inside a tokio runtime (the exporter's batch task lives
//! there), and [`Telemetry::shutdown`] flushes what is left before the process exits.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::settings::{LogFormat, LogSettings};

/// The service name spans are exported under.
pub const SERVICE_NAME: &str = "sluice";

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log.otlp_endpoint is set, but this sluice was built without the `otel` feature")]
    NotBuilt,
    #[cfg(feature = "otel")]
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
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

/// Installs the global subscriber.
pub fn init(log: &LogSettings) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt: Boxed = match log.format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    let mut layers = vec![fmt];
    #[cfg(feature = "otel")]
    let provider = match &log.otlp_endpoint {
        Some(endpoint) => {
            let (layer, provider) = otel::layer(endpoint)?;
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

#[cfg(feature = "otel")]
pub mod otel {
    //! The OTLP/gRPC span exporter as a `tracing` layer.

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
    use tracing_subscriber::{EnvFilter, Layer as _};

    use super::{Boxed, SERVICE_NAME, TelemetryError};

    /// A layer exporting sluice's spans (debug level and up) to `endpoint`
    /// (`http://collector:4317`), and the provider to shut down at exit. Needs a tokio
    /// runtime.
    pub fn layer(endpoint: &str) -> Result<(Boxed, SdkTracerProvider), TelemetryError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(SERVICE_NAME)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer(SERVICE_NAME);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(EnvFilter::new("sluice=debug"))
            .boxed();
        Ok((layer, provider))
    }
}
