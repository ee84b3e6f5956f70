//! The tokio runtime that `sluice serve` and the no-op server (`sluice bench --noop-server`)
//! share, so that the no-op is measured on exactly sluice's serving stack. The gRPC port
//! itself is [`crate::transport`].

pub use sluice_core::limiter::gathering::{gathered, gathering};

/// The multi-threaded runtime that serves: `worker_threads` workers, or one per CPU the
/// process may use when 0 (`std::thread::available_parallelism`, which follows the affinity
/// mask and a container's cgroup CPU quota). The count is always given to tokio, so its
/// `TOKIO_WORKER_THREADS` variable plays no part (tokio panics on a bad value there). Worker
/// threads are named `sluice-worker` for `top -H` and profilers; the blocking pool's threads
/// (file reads of a reload, for instance) are `sluice-blocking`. tokio names both through one
/// function and starts the workers first, while the runtime is built, so the first
/// `worker_threads` names are the workers'. (sluice never calls `block_in_place`, which would
/// hand a worker's queue to a blocking thread.)
pub fn build(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = match worker_threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let named = std::sync::atomic::AtomicUsize::new(0);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name_fn(move || {
            if named.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < workers {
                "sluice-worker".to_owned()
            } else {
                "sluice-blocking".to_owned()
            }
        })
        .worker_threads(workers)
        .build()
}
