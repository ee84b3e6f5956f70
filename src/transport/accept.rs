//! The accept loop: one task per connection (over TLS its handshake first), the cap on open
//! connections, and the drain.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{Semaphore, watch};
use tonic::service::Routes;

use super::listen::{GrpcListener, Peer};
use super::{Http2Server, tls};
use crate::tls::ActiveTls;

/// After an accept error that is not about one connection (out of file descriptors, say),
/// the loop pauses this long: accepting again at once would spin on the same error.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

impl Http2Server {
    /// Serves `routes` on every connection `listener` accepts (over TLS when `tls` is given)
    /// until `shutdown` resolves; then stops accepting (the listener is closed), asks every
    /// connection to close (GOAWAY: the requests in flight finish, no new ones start) and
    /// returns once all are closed.
    pub(crate) async fn serve(
        self,
        routes: Routes,
        listener: GrpcListener,
        tls: Option<ActiveTls>,
        shutdown: impl Future<Output = ()>,
    ) {
        let routes = routes.prepare();
        let (stop, stopped) = watch::channel(());
        let cap = self.connections.max_connections;
        let slots =
            Arc::new(Semaphore::new(cap.map_or(Semaphore::MAX_PERMITS, |n| {
                n.min(Semaphore::MAX_PERMITS)
            })));
        {
            let listener = listener;
            let mut shutdown = pin!(shutdown);
            while let Some((stream, peer)) = next(&listener, shutdown.as_mut()).await {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    // Dropped: closed at once.
                    tracing::debug!(%peer, ?cap, "gRPC connection refused: server.max_connections are open");
                    continue;
                };
                let (tls, routes, stopped) = (tls.clone(), routes.clone(), stopped.clone());
                // The slot is held until the connection's task ends.
                tokio::spawn(async move {
                    match stream {
                        Stream::Tcp(tcp) => {
                            // An answer is sent at once, not held back by Nagle's algorithm
                            // waiting for the ACK of the previous one.
                            if let Err(e) = tcp.set_nodelay(true) {
                                tracing::debug!(%peer, error = %e, "TCP_NODELAY could not be set");
                            }
                            self.connection(tcp, peer, tls, routes, stopped).await;
                        }
                        Stream::Unix(unix) => {
                            self.connection(unix, peer, tls, routes, stopped).await;
                        }
                    }
                    drop(slot);
                });
            }
        }
        drop(stopped);
        // Every connection task holds a receiver: `closed` resolves when the last one ends.
        let _ = stop.send(());
        stop.closed().await;
    }

    /// Serves one accepted connection.
    async fn connection<IO>(
        self,
        io: IO,
        peer: Peer,
        tls: Option<ActiveTls>,
        routes: Routes,
        mut stop: watch::Receiver<()>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match tls {
            None => self.http2(io, peer, routes, stop).await,
            Some(tls) => {
                if let Some(tls) = tls::handshake(io, peer, &tls, &mut stop).await {
                    self.http2(tls, peer, routes, stop).await;
                }
            }
        }
    }
}

/// An accepted connection.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// The next connection `listener` accepts.
async fn accept(listener: &GrpcListener) -> io::Result<(Stream, Peer)> {
    match listener {
        GrpcListener::Tcp(l) => {
            let (tcp, peer) = l.accept().await?;
            Ok((Stream::Tcp(tcp), Peer::Tcp(peer)))
        }
        GrpcListener::Unix(s) => {
            let (unix, _) = s.listener.accept().await?;
            Ok((Stream::Unix(unix), Peer::Unix))
        }
    }
}

/// The next connection `listener` accepts; none once `shutdown` resolved.
async fn next(
    listener: &GrpcListener,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<(Stream, Peer)> {
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return None,
            accepted = accept(listener) => accepted,
        };
        match accepted {
            Ok(accepted) => return Some(accepted),
            Err(e) if per_connection(&e) => {
                tracing::debug!(error = %e, "accepting a gRPC connection failed");
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting gRPC connections failed; pausing");
                tokio::select! {
                    () = &mut shutdown => return None,
                    () = tokio::time::sleep(ACCEPT_PAUSE) => {}
                }
            }
        }
    }
}

/// An accept error about one connection only (it was reset before it was accepted): the
/// next one is accepted at once.
fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}
