//! The gRPC port below tonic's routes: sluice serves its gRPC connections itself (hyper's
//! HTTP/2 server, not tonic's `Server`) so that it decides how a connection's requests are
//! polled (src/transport/driven.rs). What tonic's server did, or would do, is here:
//!
//! | what | where |
//! |---|---|
//! | the listener: TCP, or a Unix socket (`server.grpc_listen = "unix:/path"`: the socket file's mode, a stale file at start, its removal at the end) | `listen.rs` |
//! | the accept loop: `TCP_NODELAY`, a pause after an accept error such as EMFILE, the drain (stop accepting, GOAWAY every connection, wait for them) | `accept.rs` |
//! | HTTP/2 settings: `max_concurrent_streams` (`input.max_concurrent_streams`); flow-control windows, frame and header-list sizes are hyper's defaults (a request and its answer are a few hundred bytes) | [`Http2Server`], `connection.rs` |
//! | `grpc-timeout`: past it a request is answered `CANCELLED` and its work dropped | `grpc_timeout.rs` |
//! | size limits: HTTP/2 frames and header lists (hyper's defaults); a message's size is still tonic's codec limit, its status rewritten by [`SizeLimited`] | `connection.rs`, `size_limit.rs` |
//! | server TLS handshakes, bounded by [`HANDSHAKE_TIMEOUT`] (certificates and their reload: [`crate::tls`]) | `tls.rs` |
//! | connection limits, which tonic's server never had: the preface timeout, the idle timeout, the cap on open connections ([`ConnectionLimits`]) | `accept.rs`, `connection.rs`, `preface.rs`, `activity.rs` |
//! | where a connection's streams run, polled gathering ([`Streams`]) | `driven.rs` |
//!
//! tonic still routes each request to its service (`tonic::service::Routes`) and encodes and
//! decodes the messages (its codecs, with their size limits); tonic-health and
//! tonic-reflection are services like the others.
//!
//! A connection beyond `server.max_connections` is refused: accepted, then closed at once
//! without a byte written, while the open ones keep being served. Not accepting it until
//! another closes would leave the client waiting in the kernel's backlog with no answer, past
//! the preface timeout's reach; a refusal lets it fail fast and try another replica.

mod accept;
mod activity;
mod connection;
mod driven;
mod grpc_timeout;
mod listen;
mod preface;
mod size_limit;
mod tls;

use std::time::Duration;

use crate::config::settings::ServerSettings;

pub use connection::CLOSE_GRACE;
pub use listen::{GrpcListener, UnixSocket};
pub use size_limit::SizeLimited;
pub use tls::HANDSHAKE_TIMEOUT;

/// Where a connection's streams run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streams {
    /// On the connection's task: the answers a wake-up finishes leave in one write.
    OnConnection,
    /// One task each, spread over the workers.
    OwnTasks,
}

/// Bounds on the gRPC port's connections; none: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionLimits {
    /// A connection must have sent its whole HTTP/2 preface this long after it was accepted
    /// (over TLS: after its handshake) (`server.preface_timeout_ms`).
    pub preface_timeout: Option<Duration>,
    /// A connection with no stream open this long is closed (`server.idle_timeout_secs`).
    pub idle_timeout: Option<Duration>,
    /// Connections open at once (`server.max_connections`).
    pub max_connections: Option<usize>,
}

impl From<&ServerSettings> for ConnectionLimits {
    /// 0 in a setting: no bound.
    fn from(s: &ServerSettings) -> ConnectionLimits {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        ConnectionLimits {
            preface_timeout: nonzero(Duration::from_millis(s.preface_timeout_ms)),
            idle_timeout: nonzero(Duration::from_secs(s.idle_timeout_secs)),
            max_connections: (s.max_connections > 0).then_some(s.max_connections),
        }
    }
}

impl Default for ConnectionLimits {
    /// The `[server]` settings' defaults.
    fn default() -> ConnectionLimits {
        (&ServerSettings::default()).into()
    }
}

/// The gRPC port's server: its HTTP/2 settings and connection limits. Beyond
/// `max_concurrent_streams` a client queues its requests (or opens another connection); a
/// stream opened anyway is refused (REFUSED_STREAM).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http2Server {
    /// Streams a client may open at once on one connection (advertised in SETTINGS).
    pub max_concurrent_streams: u32,
    pub streams: Streams,
    pub connections: ConnectionLimits,
}

impl Http2Server {
    /// `stream_tasks`: each stream on a task of its own (`server.stream_tasks`).
    pub(crate) fn new(
        max_concurrent_streams: u32,
        stream_tasks: bool,
        connections: ConnectionLimits,
    ) -> Http2Server {
        Http2Server {
            max_concurrent_streams,
            streams: if stream_tasks {
                Streams::OwnTasks
            } else {
                Streams::OnConnection
            },
            connections,
        }
    }
}
