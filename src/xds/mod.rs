//! Rules over xDS: an ADS state-of-the-world client for envoyproxy/ratelimit's
//! `RateLimitConfig` resources (one per domain), as Envoy Gateway serves them.
//!
//! The client opens `StreamAggregatedResources` on `xds.server` (plain, TLS or mTLS), asks for
//! every `RateLimitConfig` for node `xds.node_id`, and for each response (the whole state of
//! the world) decodes every resource, validates it as a rules file
//! ([`convert`]), and swaps the compiled set in atomically, exactly like a reload from files.
//! A set that validates is ACKed (`version_info` and `response_nonce` of the response); one
//! that does not is NACKed with every error in `error_detail` (code `INVALID_ARGUMENT`), and
//! the last good rules stay active. A lost stream or server is retried with exponential
//! backoff and jitter (`xds.retry_initial_ms` up to `xds.retry_max_ms`); the active rules do
//! not change meanwhile. On reconnection the client sends the last accepted version.
//!
//! Readiness: until a first set has been accepted, the service is not ready, with the reason
//! (`waiting for the first rules from xDS server ...: <last error>`); an accepted empty set
//! counts (the server has nothing to limit yet). `/rlconfig` shows the accepted version.

pub mod convert;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::rules_file::LoadOptions;
use crate::config::settings::XdsSettings;
use crate::health::RulesProbe;
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status;
use crate::reload::{ActiveRules, Reloaded};

pub use convert::TYPE_URL;

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK.
const INVALID_ARGUMENT: i32 = 3;

/// What the client knows, shared with readiness.
#[derive(Debug)]
pub(crate) struct XdsState {
    server: String,
    inner: Mutex<Inner>,
    accepted: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Inner {
    last_error: Option<String>,
    acked_version: Option<String>,
}

impl XdsState {
    /// Waits until a first set of rules has been accepted.
    pub(crate) async fn first_rules(&self) {
        let mut rx = self.accepted.subscribe();
        let _ = rx.wait_for(|accepted| *accepted).await;
    }

    /// The version of the last accepted set.
    pub(crate) fn acked_version(&self) -> Option<String> {
        self.inner.lock().acked_version.clone()
    }

    fn failed(&self, error: String) {
        self.inner.lock().last_error = Some(error);
    }
}

impl RulesProbe for XdsState {
    fn ready(&self) -> Result<(), String> {
        if *self.accepted.borrow() {
            return Ok(());
        }
        let inner = self.inner.lock();
        let why = inner.last_error.as_deref().unwrap_or("no answer yet");
        Err(format!(
            "waiting for the first rules from xDS server {}: {why}",
            self.server
        ))
    }
}

/// A report of each set received (for metrics), called after it was applied.
pub type Report = Box<dyn Fn(&Reloaded) + Send + Sync>;

/// The rules client.
pub(crate) struct XdsClient {
    settings: XdsSettings,
    rules: Arc<ActiveRules>,
    options: LoadOptions,
    state: Arc<XdsState>,
    report: Report,
}

/// A setting the client cannot use (unreadable TLS files, bad address).
#[derive(Debug, thiserror::Error)]
#[error("xds: {0}")]
pub(crate) struct XdsError(String);

impl XdsClient {
    /// A client that swaps what it receives into `rules`, validated with `options`.
    pub(crate) fn new(
        settings: &XdsSettings,
        rules: Arc<ActiveRules>,
        options: LoadOptions,
        report: Report,
    ) -> XdsClient {
        let (accepted, _) = watch::channel(false);
        XdsClient {
            state: Arc::new(XdsState {
                server: settings.server.clone(),
                inner: Mutex::new(Inner::default()),
                accepted,
            }),
            settings: settings.clone(),
            rules,
            options,
            report,
        }
    }

    /// The shared state (readiness, the first set).
    pub(crate) fn state(&self) -> Arc<XdsState> {
        self.state.clone()
    }

    /// Checks the settings the connection needs (address, TLS files) once, before running.
    pub(crate) fn endpoint(&self) -> Result<Endpoint, XdsError> {
        endpoint(&self.settings)
    }

    /// Runs until `stop`: connects, follows the stream, reconnects with backoff.
    pub(crate) async fn run(self, endpoint: Endpoint, stop: CancellationToken) {
        let mut backoff = Backoff::new(&self.settings);
        loop {
            let progressed = tokio::select! {
                () = stop.cancelled() => return,
                outcome = self.session(&endpoint) => match outcome {
                    Ok(()) => {
                        tracing::warn!(server = %self.settings.server, "xDS stream ended");
                        self.state.failed("the stream ended".to_owned());
                        true
                    }
                    Err(Session { error, progressed }) => {
                        tracing::warn!(server = %self.settings.server, "xDS: {error}");
                        self.state.failed(error);
                        progressed
                    }
                },
            };
            if progressed {
                backoff.reset();
            }
            let wait = backoff.next();
            tracing::info!(?wait, "reconnecting to the xDS server");
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One connection and stream, until it ends.
    async fn session(&self, endpoint: &Endpoint) -> Result<(), Session> {
        let fail = |progressed| {
            move |e: &dyn std::fmt::Display| Session {
                error: e.to_string(),
                progressed,
            }
        };
        let channel: Channel = endpoint
            .connect()
            .await
            .map_err(|e| fail(false)(&format!("cannot connect: {}", chain(&e))))?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.settings.max_message_bytes);
        let (tx, rx) = mpsc::channel(4);
        let first = self.request(
            self.state.acked_version().unwrap_or_default(),
            String::new(),
            None,
        );
        tx.try_send(first).map_err(|e| fail(false)(&e))?;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        for (k, v) in self.settings.header_pairs() {
            let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes());
            let value = tonic::metadata::MetadataValue::try_from(v.as_str());
            if let (Ok(key), Ok(value)) = (key, value) {
                request.metadata_mut().insert(key, value);
            }
        }
        let mut responses = client
            .stream_aggregated_resources(request)
            .await
            .map_err(|s| fail(false)(&status(&s)))?
            .into_inner();
        tracing::info!(server = %self.settings.server, node = %self.settings.node_id, "xDS stream open");
        let mut progressed = false;
        loop {
            let response = match responses.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(()),
                Err(s) => return Err(fail(progressed)(&status(&s))),
            };
            progressed = true;
            let answer = self.handle(response);
            if tx.send(answer).await.is_err() {
                return Err(fail(true)(&"the stream closed"));
            }
        }
    }

    /// Applies one response; the ACK or NACK to send.
    fn handle(&self, response: DiscoveryResponse) -> DiscoveryRequest {
        let version = response.version_info;
        let nonce = response.nonce;
        let loaded = if response.type_url == TYPE_URL {
            convert::load(&response.resources, self.options.clone())
        } else {
            Err(crate::config::rules_file::RuleErrors(vec![
                crate::config::rules_file::RuleError {
                    file: "xds".into(),
                    line: 0,
                    path: String::new(),
                    message: format!(
                        "unexpected type_url '{}' (expected {TYPE_URL})",
                        response.type_url
                    ),
                },
            ]))
        };
        let outcome = self.rules.apply(loaded, &version);
        (self.report)(&outcome);
        match outcome {
            Reloaded::Failed(errors) => {
                tracing::error!(%version, "xDS rules refused (NACK); the last good rules stay active:\n{errors}");
                let first = errors
                    .0
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                self.state.failed(format!(
                    "set version {version} refused ({} error(s)), first: {first}",
                    errors.0.len()
                ));
                let previous = self.state.acked_version().unwrap_or_default();
                self.request(
                    previous,
                    nonce,
                    Some(Status {
                        code: INVALID_ARGUMENT,
                        message: errors.to_string(),
                        details: Vec::new(),
                    }),
                )
            }
            outcome => {
                let domains = self.rules.load_full().len();
                if let Reloaded::Updated { version: v } = outcome {
                    tracing::info!(xds_version = %version, rules_version = v, domains, "xDS rules applied (ACK)");
                }
                {
                    let mut inner = self.state.inner.lock();
                    inner.acked_version = Some(version.clone());
                    inner.last_error = None;
                }
                self.state.accepted.send_replace(true);
                self.request(version, nonce, None)
            }
        }
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version,
            node: Some(self.node()),
            resource_names: Vec::new(),
            type_url: TYPE_URL.to_owned(),
            response_nonce: nonce,
            error_detail: error,
        }
    }

    fn node(&self) -> Node {
        let fields = self.settings.metadata_pairs().into_iter().map(|(k, v)| {
            let value = prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(v)),
            };
            (k, value)
        });
        Node {
            id: self.settings.node_id.clone(),
            cluster: self.settings.node_cluster.clone(),
            metadata: Some(prost_types::Struct {
                fields: fields.collect(),
            }),
            user_agent_name: "sluice".to_owned(),
            user_agent_version_type: Some(
                crate::proto::envoy::config::core::v3::node::UserAgentVersionType::UserAgentVersion(
                    env!("CARGO_PKG_VERSION").to_owned(),
                ),
            ),
        }
    }
}

/// Why a session ended, and whether it got as far as a response (then the backoff restarts).
struct Session {
    error: String,
    progressed: bool,
}

fn status(s: &tonic::Status) -> String {
    format!("stream failed: {:?}: {}", s.code(), s.message())
}

/// An error with its sources.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The endpoint of `settings.server`, with TLS when asked.
fn endpoint(settings: &XdsSettings) -> Result<Endpoint, XdsError> {
    let tls = settings.uses_tls();
    let server = settings.server.trim();
    let (host_port, scheme) = match server.split_once("://") {
        Some((_, rest)) => (rest, if tls { "https" } else { "http" }),
        None => (server, if tls { "https" } else { "http" }),
    };
    let uri = format!("{scheme}://{host_port}");
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| XdsError(format!("invalid server address '{server}': {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if tls {
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| XdsError(format!("cannot read {}: {e}", path.display())))
        };
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &settings.ca_file {
            config = config.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&settings.cert_file, &settings.key_file) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if !settings.server_name.is_empty() {
            config = config.domain_name(settings.server_name.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| XdsError(format!("TLS to {uri}: {}", chain(&e))))?;
    }
    Ok(endpoint)
}

/// Exponential backoff with jitter (each wait between half and all of the current step).
struct Backoff {
    initial: Duration,
    max: Duration,
    step: Duration,
    seed: u64,
}

impl Backoff {
    fn new(settings: &XdsSettings) -> Backoff {
        let initial = Duration::from_millis(settings.retry_initial_ms.max(1));
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos() as u64 | 1);
        Backoff {
            initial,
            max: Duration::from_millis(settings.retry_max_ms).max(initial),
            step: initial,
            seed,
        }
    }

    fn reset(&mut self) {
        self.step = self.initial;
    }

    fn next(&mut self) -> Duration {
        // xorshift: jitter only, no need for a better generator.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_nanos(self.seed % nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_and_resets() {
        let settings = XdsSettings {
            retry_initial_ms: 100,
            retry_max_ms: 400,
            ..XdsSettings::default()
        };
        let mut b = Backoff::new(&settings);
        let waits: Vec<Duration> = (0..5).map(|_| b.next()).collect();
        for (wait, step) in waits.iter().zip([100, 200, 400, 400, 400]) {
            let step = Duration::from_millis(step);
            assert!(
                *wait >= step / 2 && *wait <= step,
                "{wait:?} for a step of {step:?}"
            );
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(100));
    }

    #[test]
    fn endpoints_take_host_port_or_a_url_and_check_tls_files() {
        let plain = XdsSettings {
            server: "envoy-gateway:18001".into(),
            ..XdsSettings::default()
        };
        assert_eq!(
            endpoint(&plain).unwrap().uri().to_string(),
            "http://envoy-gateway:18001/"
        );
        let tls = XdsSettings {
            server: "https://127.0.0.1:1".into(),
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..XdsSettings::default()
        };
        let err = endpoint(&tls).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
