//! The tokio runtime and the gRPC server settings that `sluice serve` and the no-op server
//! (`sluice bench --noop-server`) share, so that the no-op is measured on exactly sluice's
//! serving stack.

mod connection;

pub use connection::{Http2Server, Streams};
pub use sluice_core::limiter::gathering::{gathered, gathering};

/// The multi-threaded runtime that serves: `worker_threads` workers, or one per CPU the
/// process may use when 0 (`std::thread::available_parallelism`, which follows the affinity
/// mask and a container's cgroup CPU quota). The count is always given to tokio, so its
/// `TOKIO_WORKER_THREADS` variable plays no part (tokio panics on a bad value there). Worker
/// threads are named `sluice-worker` for `top -H` and profilers.
pub fn build(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-worker")
        .worker_threads(workers)
        .build()
}

/// The gRPC server with the HTTP/2 settings of the gRPC port. Beyond `max_concurrent_streams`
/// a client queues its requests (or opens another connection); a stream opened anyway is
/// refused (REFUSED_STREAM). HTTP/2 flow-control windows and frame sizes keep hyper's
/// defaults: a request and its answer are a few hundred bytes, far below them. `stream_tasks`:
/// each stream on a task of its own instead of on its connection's (src/runtime/connection.rs).
pub fn grpc_server(max_concurrent_streams: u32, stream_tasks: bool) -> Http2Server {
    Http2Server {
        max_concurrent_streams,
        streams: if stream_tasks {
            Streams::OwnTasks
        } else {
            Streams::OnConnection
        },
    }
}
