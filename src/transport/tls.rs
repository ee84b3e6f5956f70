//! Server TLS handshakes on the gRPC port, each with the configuration that `crate::tls` keeps
//! current when it starts (a reload never disturbs an open connection). A handshake runs on
//! its connection's own task, so a slow client never holds up the others.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::tls::ActiveTls;

/// A handshake that takes longer is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `tcp` after its handshake; none when the handshake failed, timed out or the server
/// stopped first (each logged at debug: a client's failure, not the server's).
pub(super) async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    tls: &ActiveTls,
    stop: &mut watch::Receiver<()>,
) -> Option<TlsStream<TcpStream>> {
    let acceptor = TlsAcceptor::from(tls.load_full());
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
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
