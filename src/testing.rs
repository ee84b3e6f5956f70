//! Test helpers (feature `test-util`): a real server on a loopback port, over a manual clock
//! (memory backend) or over any limiter the test builds (e.g. a Redis one); and, for every
//! integration test binary under `tests/`, what more than one of them needs:
//!
//! | module | what |
//! | --- | --- |
//! | [`envoy`] | a real Envoy 1.40 as a child process on loopback ports |
//! | [`grpc`] | an Envoy RLS client (`envoy-types`), requests and assertions on answers |
//! | [`http`] | a minimal HTTP/1.1 client (admin server, Envoy), metrics samples |
//! | [`limits`] | limits and hits for driving a `Limiter` directly |
//! | [`process`] | the real `sluice` binary as a child process, ports from the kernel, `/proc` readings |
//! | [`proxy`] | a TCP proxy that delays, holds (a partition) and heals, between a client and a server |
//! | [`ratelimit_env`] | envoyproxy/ratelimit's container env in Envoy Gateway and Istio's sample |
//! | [`redis`] | real `redis-server` (or `valkey-server`) processes (standalone, Sentinel, Cluster) |
//! | [`rlqs`] | an in-process server with handles on its RLQS state, RLQS streams and reports |

pub mod dns;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod limits;
pub mod memcached;
pub mod process;
pub mod proxy;
pub mod ratelimit_env;
pub mod redis;
pub mod rlqs;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::config::model::RulesModel;
use crate::config::rules_file;
use crate::config::settings::Settings;
use crate::limiter::{Limiter, ManualClock, MemoryLimiter};
use crate::rules::RuleSet;

/// A running sluice on `127.0.0.1:<port from the kernel>` (gRPC) and another (admin HTTP), stopped
/// when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The admin HTTP server's address.
    pub admin_addr: SocketAddr,
    /// The memory backend's clock; advance it to let funnels drain.
    pub clock: ManualClock,
    stop: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// One second in the limiters' nanoseconds.
pub const SECOND: u64 = 1_000_000_000;

/// Polls `check` every 20 ms until it holds, for something that happens in the background (a
/// reload, a certificate swap, a pushed rules set) without a fixed sleep; fails, naming
/// `what`, after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl TestServer {
    /// Serves `rules_yaml` with default settings.
    pub async fn start(rules_yaml: &str) -> TestServer {
        Self::start_with(Settings::default(), rules_yaml).await
    }

    /// Serves `rules_yaml` with `settings` (its listen address and rules paths are ignored).
    ///
    /// # Panics
    /// When the rules are invalid or no port can be bound: this is test code.
    pub async fn start_with(settings: Settings, rules_yaml: &str) -> TestServer {
        let clock = ManualClock::at(1_000 * SECOND);
        let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::with_clock(
            settings.memory.max_keys,
            clock.clone(),
        ));
        Self::serve(settings, rules_yaml, limiter, clock).await
    }

    /// Serves an already validated model (e.g. loaded with `limits.default_algorithm`) with
    /// `settings`, over the memory backend on a manual clock.
    pub async fn start_model(settings: Settings, model: RulesModel) -> TestServer {
        let clock = ManualClock::at(1_000 * SECOND);
        let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::with_clock(
            settings.memory.max_keys,
            clock.clone(),
        ));
        Self::serve_model(settings, model, limiter, clock).await
    }

    /// Serves an already validated model over `limiter` (e.g. rules loaded with a home Redis,
    /// whose limits may be `scope: global`).
    pub async fn start_model_over(
        settings: Settings,
        model: RulesModel,
        limiter: Arc<dyn Limiter>,
    ) -> TestServer {
        Self::serve_model(settings, model, limiter, ManualClock::default()).await
    }

    /// Serves `rules_yaml` with `settings` over `limiter`; `clock` then controls nothing.
    ///
    /// # Panics
    /// When the rules are invalid or no port can be bound: this is test code.
    pub async fn start_over(
        settings: Settings,
        rules_yaml: &str,
        limiter: Arc<dyn Limiter>,
    ) -> TestServer {
        Self::serve(settings, rules_yaml, limiter, ManualClock::default()).await
    }

    async fn serve(
        settings: Settings,
        rules_yaml: &str,
        limiter: Arc<dyn Limiter>,
        clock: ManualClock,
    ) -> TestServer {
        let model =
            rules_file::from_sources(&[(PathBuf::from("test.yaml"), rules_yaml.to_owned())])
                .unwrap_or_else(|e| panic!("test rules are invalid:\n{e}"));
        Self::serve_model(settings, model, limiter, clock).await
    }

    async fn serve_model(
        settings: Settings,
        model: RulesModel,
        limiter: Arc<dyn Limiter>,
        clock: ManualClock,
    ) -> TestServer {
        let app = App::from_parts(&settings, RuleSet::compile(model), limiter);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let admin_addr = admin.local_addr().expect("local address");
        let listeners = crate::app::Listeners {
            grpc: listener.into(),
            admin: Some(admin),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(app.run(listeners, stop.clone().cancelled_owned()));
        TestServer {
            addr,
            admin_addr,
            clock,
            stop,
            task: Some(task),
        }
    }

    /// `http://127.0.0.1:<port>`, for gRPC clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Begins the shutdown (readiness fails, the drain) without waiting for it; [`stop`]
    /// then waits for the end.
    ///
    /// [`stop`]: TestServer::stop
    pub fn begin_stop(&self) {
        self.stop.cancel();
    }

    /// Stops the server and waits for it to finish; returns its result.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An environment as the settings loaders take it, from `(name, value)` pairs.
pub fn env_map(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
