//! The tokio runtime and the gRPC server settings that `sluice serve` and the no-op server
//! (`sluice bench --noop-server`) share, so that the no-op is measured on exactly sluice's
//! serving stack.

use tonic::transport::Server;

/// The multi-threaded runtime that serves: `worker_threads` workers, or one per CPU the
/// process may use when 0 (tokio's default, which follows the cgroup CPU quota of a
/// container). Worker threads are named `sluice-worker` for `top -H` and profilers.
pub fn build(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("sluice-worker");
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder.build()
}

/// The gRPC server with the HTTP/2 settings of the gRPC port. Beyond `max_concurrent_streams`
/// a client queues its requests (or opens another connection); a stream opened anyway is
/// refused (REFUSED_STREAM). HTTP/2 flow-control windows and frame sizes keep hyper's
/// defaults: a request and its answer are a few hundred bytes, far below them.
pub fn grpc_server(max_concurrent_streams: u32) -> Server {
    Server::builder().max_concurrent_streams(max_concurrent_streams)
}
