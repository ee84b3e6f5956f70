//! Server TLS handshakes on the gRPC port, each with the configuration that `crate::tls` keeps
//! current when it starts (a reload never disturbs an open connection). A handshake runs on
//! its connection's own task, so a slow client never holds up the others.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::listen::Peer;
use crate::tls::ActiveTls;

/// A handshake that takes longer is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `io` after its handshake; none when the handshake failed, timed out or the server
/// stopped first (each logged at debug: a client's failure, not the server's).
pub(super) async fn handshake<IO: AsyncRead + AsyncWrite + Unpin>(
    io: IO,
    peer: Peer,
    tls: &ActiveTls,
    stop: &mut watch::Receiver<()>,
) -> Option<TlsStream<IO>> {
    let acceptor = TlsAcceptor::from(tls.load_full());
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io));
    tokio::select! {
        _ = stop.changed() => {
            tracing::debug!(%peer, "TLS handshake dropped: the gRPC server stops");
            None
        }
        done = handshake => match done {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        },
    }
}
