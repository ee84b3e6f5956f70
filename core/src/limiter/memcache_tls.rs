//! TLS to the Memcached servers (`memcache.tls`). The `async-memcached` client opens its own
//! TCP or Unix connections and takes no stream, so each server's TLS connections are handed
//! to it through a relay: sluice opens the TLS connection itself (verified, within the
//! connect time-out), queues it, and has the client connect to a Unix socket of that server's
//! in a directory only this user can enter (mode 0700, removed with the server); the relay
//! pairs each connection it accepts there with a queued TLS connection and copies bytes both
//! ways until either side closes. Every queued connection goes to the same server, so any
//! pairing is right.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::{TcpStream, UnixListener};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::config::settings::MemcacheSettings;
use crate::pem::{certificates, private_key};

/// The client configuration `settings` ask for; none without `memcache.tls`.
pub(super) fn client_config(
    settings: &MemcacheSettings,
) -> Result<Option<Arc<ClientConfig>>, String> {
    if !settings.tls {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(ca) = &settings.tls_ca_file {
        for cert in certificates(ca).map_err(|e| format!("memcache.tls_ca_file: {e}"))? {
            roots
                .add(cert)
                .map_err(|e| format!("memcache.tls_ca_file: {}: {e}", ca.display()))?;
        }
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("memcache.tls: {e}"))?;
    let builder = if settings.tls_skip_hostname_verification {
        // With a CA file, only that CA: a public CA's certificate for any name is not enough.
        // Without one, the system's roots, as asked (and said at start).
        let trusted = match &settings.tls_ca_file {
            Some(ca) => {
                let mut own = RootCertStore::empty();
                for cert in certificates(ca).map_err(|e| format!("memcache.tls_ca_file: {e}"))? {
                    own.add(cert)
                        .map_err(|e| format!("memcache.tls_ca_file: {e}"))?;
                }
                own
            }
            None => {
                tracing::warn!("{}", crate::pem::skip_without_ca("memcache"));
                roots.clone()
            }
        };
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(trusted), provider)
            .build()
            .map_err(|e| format!("memcache.tls_ca_file: {e}"))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName { inner }))
    } else {
        builder.with_root_certificates(roots)
    };
    let config = match (&settings.tls_cert_file, &settings.tls_key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert).map_err(|e| format!("memcache.tls_cert_file: {e}"))?;
            let key = private_key(key).map_err(|e| format!("memcache.tls_key_file: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("memcache.tls_key_file: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(Arc::new(config)))
}

/// Verifies the chain, not the name (`memcache.tls_skip_hostname_verification`).
#[derive(Debug)]
struct AnyName {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
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

/// One server's relay: its socket, the TLS connections waiting for the client, and the task
/// accepting there. Dropping it stops the task and removes the directory.
pub(super) struct Relay {
    dir: PathBuf,
    socket: PathBuf,
    waiting: Arc<parking_lot::Mutex<VecDeque<TlsStream<TcpStream>>>>,
    task: JoinHandle<()>,
}

/// Distinguishes the relays of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

impl Relay {
    pub(super) fn start() -> std::io::Result<Relay> {
        use std::os::unix::fs::DirBuilderExt;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("sluice-memcache-tls-{}-{n}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let socket = dir.join("relay.sock");
        let listener = UnixListener::bind(&socket)?;
        let waiting: Arc<parking_lot::Mutex<VecDeque<TlsStream<TcpStream>>>> = Arc::default();
        let queue = waiting.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Some(mut server) = queue.lock().pop_front() else {
                    continue;
                };
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Ok(Relay {
            dir,
            socket,
            waiting,
            task,
        })
    }

    /// The DSN the client connects to, once [`Relay::hand_over`] queued its TLS connection.
    pub(super) fn dsn(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub(super) fn hand_over(&self, tls: TlsStream<TcpStream>) {
        self.waiting.lock().push_back(tls);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS connection to `addr` (`host:port`), the certificate checked for `host`.
pub(super) async fn connect(
    config: &Arc<ClientConfig>,
    addr: &str,
) -> Result<TlsStream<TcpStream>, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| format!("'{host}' is not a host name for TLS"))?;
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))
}
