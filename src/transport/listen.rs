//! The gRPC port's listener: TCP, or a Unix socket (`server.grpc_listen = "unix:/path"`,
//! envoyproxy/ratelimit's `GRPC_UDS`).
//!
//! The socket file is made by `bind(2)` alone, as envoyproxy/ratelimit's (Go's
//! `net.Listen("unix", path)`) is: its mode is `0777` less the process's umask
//! (`srwxr-xr-x` under the usual `022`), and connecting takes write permission on it, so a
//! client under another user needs a umask that grants it (or a shared group and `002`). At
//! start, a file already at the path is removed only when it is a socket that nothing
//! listens on (one a process that died left); a socket something answers on, or a file of
//! another kind, stops the start with the path and why. The file is removed when the
//! listener closes (the server stops accepting), unless another file has taken its place.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};

use crate::config::settings::ListenAddr;

/// A bound gRPC listener.
#[derive(Debug)]
pub enum GrpcListener {
    Tcp(TcpListener),
    Unix(UnixSocket),
}

impl From<TcpListener> for GrpcListener {
    fn from(listener: TcpListener) -> GrpcListener {
        GrpcListener::Tcp(listener)
    }
}

impl GrpcListener {
    /// Binds `addr` (see the module doc for a Unix socket's file).
    pub async fn bind(addr: &ListenAddr) -> io::Result<GrpcListener> {
        match addr {
            ListenAddr::Tcp(addr) => TcpListener::bind(addr).await.map(GrpcListener::Tcp),
            ListenAddr::Unix(path) => UnixSocket::bind(path).await.map(GrpcListener::Unix),
        }
    }

    /// Where it listens (for TCP port 0: the port the system chose).
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        match self {
            GrpcListener::Tcp(l) => l.local_addr().map(ListenAddr::Tcp),
            GrpcListener::Unix(s) => Ok(ListenAddr::Unix(s.path.clone())),
        }
    }
}

/// A listening Unix socket whose file is removed when it is dropped.
#[derive(Debug)]
pub struct UnixSocket {
    pub(super) listener: UnixListener,
    path: PathBuf,
    /// The file's device and inode once bound: it is removed only while still this file.
    file: Option<(u64, u64)>,
}

impl UnixSocket {
    async fn bind(path: &Path) -> io::Result<UnixSocket> {
        let listener = match UnixListener::bind(path) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                remove_stale(path).await?;
                UnixListener::bind(path)
            }
            bound => bound,
        }?;
        let file = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        Ok(UnixSocket {
            listener,
            path: path.to_path_buf(),
            file,
        })
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let same = std::fs::symlink_metadata(&self.path)
            .ok()
            .is_some_and(|m| Some((m.dev(), m.ino())) == self.file);
        if same && let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "the gRPC socket file could not be removed");
        }
    }
}

/// Removes the file at `path` when it is a socket nothing listens on; otherwise an error
/// that says what is there.
async fn remove_stale(path: &Path) -> io::Result<()> {
    let in_use = |why: &str| {
        io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{}: {why}", path.display()),
        )
    };
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_socket() {
        return Err(in_use("exists and is not a socket; not removed"));
    }
    match tokio::net::UnixStream::connect(path).await {
        Ok(_) => Err(in_use("another process is listening on this socket")),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing a stale gRPC socket file (nothing listens on it)");
            std::fs::remove_file(path)
        }
        Err(e) => Err(in_use(&format!("exists and cannot be checked: {e}"))),
    }
}

/// Who a connection came from, for the logs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Peer {
    Tcp(SocketAddr),
    /// A Unix socket's client (its address is unnamed).
    Unix,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(addr) => addr.fmt(f),
            Peer::Unix => f.write_str("unix socket"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// The process's umask, from /proc (Linux).
    fn umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
    }

    fn unix(path: &Path) -> ListenAddr {
        ListenAddr::Unix(path.to_path_buf())
    }

    #[tokio::test]
    async fn the_socket_file_has_bind_modes_and_goes_with_the_listener() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.sock");
        let listener = GrpcListener::bind(&unix(&path)).await.unwrap();
        assert_eq!(listener.local_addr().unwrap(), unix(&path));
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o777 & !umask());
        drop(listener);
        assert!(!path.exists(), "removed with the listener");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_or_another_file_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.sock");
        // Left behind: a socket whose listener is gone without removing it.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let listener = GrpcListener::bind(&unix(&path)).await.unwrap();
        // Something listens now: a second start is refused, the file kept.
        let err = GrpcListener::bind(&unix(&path)).await.unwrap_err();
        assert!(
            err.to_string().contains("another process is listening"),
            "{err}"
        );
        assert!(path.exists());
        drop(listener);
        // A file that is not a socket is never removed.
        std::fs::write(&path, "data").unwrap();
        let err = GrpcListener::bind(&unix(&path)).await.unwrap_err();
        assert!(err.to_string().contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }

    #[tokio::test]
    async fn a_file_put_in_its_place_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rl.sock");
        let listener = GrpcListener::bind(&unix(&path)).await.unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "another's").unwrap();
        drop(listener);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "another's");
    }
}
