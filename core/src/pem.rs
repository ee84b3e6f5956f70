//! PEM files read and checked before they are used: a CA to trust, a certificate chain with
//! its key. Shared by the gRPC port's server TLS and the Redis backend's client TLS, so that
//! both report a bad file the same way, naming it.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The warning of `<backend>.tls_skip_hostname_verification` without `<backend>.tls_ca_file`.
pub fn skip_without_ca(backend: &str) -> String {
    format!(
        "{backend}.tls_skip_hostname_verification without {backend}.tls_ca_file: the \
         server's certificate is checked against the system's roots but not for its name, so \
         a certificate any of those CAs signed for any name is accepted; give the server's CA \
         in {backend}.tls_ca_file to accept only its certificates"
    )
}

/// A PEM file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct PemError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

/// A CA file of a TLS client: its PEM text, checked to hold at least one certificate usable
/// as a trust anchor.
pub(crate) fn read_ca(path: &Path) -> Result<Vec<u8>, PemError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| file(path, e))?;
    }
    std::fs::read(path).map_err(|e| file(path, e))
}

/// A TLS client's certificate chain and private key: their PEM texts, checked to parse and
/// to belong together.
pub(crate) fn read_identity(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), PemError> {
    let chain = certificates(cert)?;
    let der = private_key(key)?;
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

/// Every certificate of a PEM file; none is an error.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(path, e))?;
    if certs.is_empty() {
        return Err(file(path, "no certificate found"));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file(path, e))
}

fn file(path: &Path, message: impl std::fmt::Display) -> PemError {
    PemError {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}
