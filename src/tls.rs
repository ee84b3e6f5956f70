//! TLS on the gRPC port: a certificate chain and key from PEM files, optionally a client CA
//! (then every client must present a certificate it signed: mTLS), all reloaded when the
//! files change. The PEM files are read by `sluice_core::pem`, which the Redis backend's
//! client TLS shares.
//!
//! The active `rustls` configuration sits in an `ArcSwap`; each new connection's handshake
//! uses the one active when it starts, so a reload never disturbs an open connection. A
//! reload that fails (a missing file, a key that does not match) keeps the active
//! configuration and is logged. The handshakes themselves are the gRPC port's
//! ([`crate::transport`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::client::verify_server_name;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use tokio_rustls::rustls::{self, DigitallySignedStruct, DistinguishedName, RootCertStore};
use tokio_rustls::rustls::{ServerConfig, SignatureScheme};
use tokio_util::sync::CancellationToken;

use sluice_core::pem::{PemError, certificates, private_key};

use crate::config::settings::TlsSettings;
use crate::reload::ReloadTrigger;
use crate::watcher::{FileWatcher, debounced};

/// Where the certificates are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Clients must present a certificate signed by one of these (PEM); none: no client
    /// certificate is asked for.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: the DNS name or IP address a client certificate must also name
    /// among its subject alternative names.
    pub client_san: Option<String>,
}

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    File(#[from] PemError),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
    #[error("tls.client_san: {0:?} is neither a DNS name nor an IP address")]
    ClientSan(String),
}

impl TlsFiles {
    /// The files of the `[tls]` settings, when TLS is on (`cert_file` and `key_file` set).
    pub(crate) fn from_settings(settings: &TlsSettings) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: settings.cert_file.clone()?,
            key: settings.key_file.clone()?,
            client_ca: settings.client_ca_file.clone(),
            client_san: settings.client_san.clone(),
        })
    }

    /// Every file, for watching.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cert.clone(), self.key.clone()];
        paths.extend(self.client_ca.clone());
        paths
    }

    /// Reads the files and builds the server configuration (HTTP/2 only, as gRPC needs).
    pub fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(ca)? {
                    roots.add(cert)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()?;
                match &self.client_san {
                    Some(san) => builder.with_client_cert_verifier(Arc::new(SanVerifier {
                        name: ServerName::try_from(san.clone())
                            .map_err(|_| TlsError::ClientSan(san.clone()))?,
                        inner: verifier,
                    })),
                    None => builder.with_client_cert_verifier(verifier),
                }
            }
            None => builder.with_no_client_auth(),
        };
        let key = private_key(&self.key)?;
        let mut config = builder.with_single_cert(certificates(&self.cert)?, key)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A client verifier that, once the chain is verified, also requires the client
/// certificate to name `name` among its subject alternative names: a DNS name (a wildcard
/// name of the certificate such as `*.example.com` covers one label) or an IP address.
/// This is the rule envoyproxy/ratelimit applies to `GRPC_CLIENT_TLS_SAN` (its `DNSName` of
/// Go's certificate verification): no fallback to the subject's common name.
#[derive(Debug)]
struct SanVerifier {
    name: ServerName<'static>,
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        if let Err(e) = verify_server_name(&parsed, &self.name) {
            tracing::warn!(
                "gRPC client certificate refused: it does not name {:?} (tls.client_san): {e}",
                self.name.to_str()
            );
            return Err(e);
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The active configuration, swapped whole on reload.
pub(crate) type ActiveTls = Arc<ArcSwap<ServerConfig>>;

/// Reloads `tls` from `files` whenever one of them changes (their contents, not only their
/// directory), until `stop`.
pub async fn watch(
    files: TlsFiles,
    tls: ActiveTls,
    debounce: Duration,
    stop: CancellationToken,
) -> Result<(), tokio::task::JoinError> {
    let (trigger, mut requests) = ReloadTrigger::channel();
    let _watcher = FileWatcher::start("TLS certificates", &files.paths(), trigger);
    let mut active = contents_hash(&files);
    while debounced(&mut requests, debounce, &stop).await {
        let loading = files.clone();
        let (hash, loaded) =
            tokio::task::spawn_blocking(move || (contents_hash(&loading), loading.load())).await?;
        if hash.is_some() && hash == active {
            continue;
        }
        match loaded {
            Ok(config) => {
                tls.store(config);
                active = hash;
                tracing::info!("TLS certificates reloaded");
            }
            Err(e) => tracing::error!("TLS reload failed, keeping the active certificates: {e}"),
        }
    }
    Ok(())
}

/// A hash of the files' contents; `None` when one cannot be read.
fn contents_hash(files: &TlsFiles) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for path in files.paths() {
        std::fs::read(path).ok()?.hash(&mut h);
    }
    Some(h.finish())
}
