//! TLS on the gRPC port: a certificate chain and key from PEM files, optionally a client CA
//! (then every client must present a certificate it signed: mTLS), all reloaded when the
//! files change. Also the PEM files sluice presents and trusts as a TLS client
//! ([`read_ca`], [`read_identity`]), checked before the first connection.
//!
//! The active `rustls` configuration sits in an `ArcSwap`; each new connection's handshake
//! uses the one active when it starts, so a reload never disturbs an open connection. A
//! reload that fails (a missing file, a key that does not match) keeps the active
//! configuration and is logged. Handshakes run concurrently (a slow client never holds up
//! the others) and time out after [`HANDSHAKE_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::config::settings::TlsSettings;
use crate::reload::ReloadTrigger;
use crate::reload::watch::{debounced, start_watcher};

/// A handshake that takes longer is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
}

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
}

impl TlsFiles {
    /// The files of the `[tls]` settings, when TLS is on (`cert_file` and `key_file` set).
    pub fn from_settings(settings: &TlsSettings) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: settings.cert_file.clone()?,
            key: settings.key_file.clone()?,
            client_ca: settings.client_ca_file.clone(),
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
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|e| file(&self.key, e))?;
        let mut config = builder.with_single_cert(certificates(&self.cert)?, key)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A CA file of a TLS client: its PEM text, checked to hold at least one certificate usable
/// as a trust anchor.
pub fn read_ca(path: &Path) -> Result<Vec<u8>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| file(path, e))?;
    }
    std::fs::read(path).map_err(|e| file(path, e))
}

/// A TLS client's certificate chain and private key: their PEM texts, checked to parse and
/// to belong together.
pub fn read_identity(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| file(key, e))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| file(key, e))?;
    match rustls::sign::CertifiedKey::new(chain, signing).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            let why = format!("is not the key of the certificate {}", cert.display());
            return Err(file(key, why));
        }
        Err(e) => {
            return Err(file(
                cert,
                format!("not usable as a client certificate: {e}"),
            ));
        }
    }
    let read = |path: &Path| std::fs::read(path).map_err(|e| file(path, e));
    Ok((read(cert)?, read(key)?))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(path, e))?;
    if certs.is_empty() {
        return Err(file(path, "no certificate found"));
    }
    Ok(certs)
}

fn file(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// The active configuration, swapped whole on reload.
pub type ActiveTls = Arc<ArcSwap<ServerConfig>>;

/// Accepts TCP connections on `listener` until `stop`, and sends each one whose handshake
/// succeeded to `accepted` (the gRPC server's incoming stream).
pub async fn accept(
    listener: TcpListener,
    tls: ActiveTls,
    accepted: mpsc::Sender<std::io::Result<TlsStream<TcpStream>>>,
    stop: CancellationToken,
) {
    // Owned here: dropping it (when this task ends) aborts unfinished handshakes.
    let mut handshakes = JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            () = stop.cancelled() => return,
            () = accepted.closed() => return,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
            got = listener.accept() => match got {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC accept failed");
                    continue;
                }
            },
        };
        // As on the plain port: a response is flushed as soon as it is written, not held back
        // by Nagle's algorithm until the peer's delayed ACK.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY could not be set");
        }
        let acceptor = TlsAcceptor::from(tls.load_full());
        let accepted = accepted.clone();
        handshakes.spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = accepted.send(Ok(stream)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Reloads `tls` from `files` whenever one of them changes (their contents, not only their
/// directory), until `stop`.
pub async fn watch(
    files: TlsFiles,
    tls: ActiveTls,
    debounce: Duration,
    stop: CancellationToken,
) -> Result<(), tokio::task::JoinError> {
    let (trigger, mut requests) = ReloadTrigger::channel();
    let _watcher = start_watcher(&files.paths(), trigger);
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
