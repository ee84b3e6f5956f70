//! A TCP proxy for fault tests (iptables and netem are not on CI's machines): it listens on a
//! loopback port from the kernel and forwards every connection to one server, each direction
//! in order. It can delay every chunk by D ms from when it was read (a slow node or link),
//! hold every chunk (a partition: connections stay open, nothing gets through, as when
//! packets are dropped and TCP retransmits), and heal (what was held then passes, in order).
//!
//! ```no_run
//! # async fn example(redis: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::Duration;
//! let proxy = sluice::testing::proxy::Proxy::start(redis).await?;
//! // Point the client at proxy.addr(); then:
//! proxy.delay(Duration::from_millis(300));
//! proxy.hold();
//! proxy.heal();
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// What the proxy does with what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Passes every chunk this long after it was read.
    Pass(Duration),
    /// Passes nothing until the mode changes.
    Hold,
}

/// A running proxy; it stops (closing every connection) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `target` on `127.0.0.1:0`, passing everything at once.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass(Duration::ZERO));
        let task = tokio::spawn(serve(listener, target, watching));
        Ok(Proxy { addr, mode, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every chunk, each way, passes `delay` after it was read (from now on, and for those
    /// still waiting).
    pub fn delay(&self, delay: Duration) {
        self.mode.send_replace(Mode::Pass(delay));
    }

    /// Nothing passes either way until [`Self::heal`] or [`Self::delay`].
    pub fn hold(&self) {
        self.mode.send_replace(Mode::Hold);
    }

    /// Everything passes at once again (what was held first, in order).
    pub fn heal(&self) {
        self.delay(Duration::ZERO);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections and links each to `target`, until aborted (which drops the links).
async fn serve(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<Mode>) {
    let mut links = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    links.spawn(link(client, target, mode.clone()));
                }
            }
            Some(_) = links.join_next(), if !links.is_empty() => {}
        }
    }
}

/// One client's connection and its own to the target, both ways until both end.
async fn link(client: TcpStream, target: SocketAddr, mode: watch::Receiver<Mode>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, mode.clone()),
        pump(server_read, client_write, mode)
    );
}

/// Copies `from` to `to`, each chunk when [`release`] lets it; at the end of `from`, what was
/// read still goes, then `to` is shut down.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let (chunks, mut pending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reading = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writing = async move {
        while let Some((read_at, chunk)) = pending.recv().await {
            if release(read_at, &mut mode).await.is_err() || to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}

/// Waits until a chunk read at `read_at` may pass: not held, and its delay over.
async fn release(
    read_at: Instant,
    mode: &mut watch::Receiver<Mode>,
) -> Result<(), watch::error::RecvError> {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Hold => mode.changed().await?,
            Mode::Pass(delay) => {
                tokio::select! {
                    () = tokio::time::sleep_until(read_at + delay) => return Ok(()),
                    changed = mode.changed() => changed?,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a kernel port.
    async fn echo() -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        (addr, task)
    }

    async fn round_trip(conn: &mut TcpStream, text: &[u8]) -> Vec<u8> {
        conn.write_all(text).await.unwrap();
        let mut back = vec![0u8; text.len()];
        conn.read_exact(&mut back).await.unwrap();
        back
    }

    #[tokio::test]
    async fn delays_holds_and_heals_in_order() {
        let (server, task) = echo().await;
        let proxy = Proxy::start(server).await.unwrap();
        let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut conn, b"a").await, b"a");

        proxy.delay(Duration::from_millis(100));
        let sent = Instant::now();
        assert_eq!(round_trip(&mut conn, b"bc").await, b"bc");
        assert!(sent.elapsed() >= Duration::from_millis(200), "each way");

        proxy.hold();
        conn.write_all(b"def").await.unwrap();
        let mut back = [0u8; 3];
        let held = tokio::time::timeout(Duration::from_millis(200), conn.read_exact(&mut back));
        assert!(held.await.is_err(), "nothing passes while held");
        proxy.heal();
        conn.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"def", "what was held passes, in order");
        task.abort();
    }
}
