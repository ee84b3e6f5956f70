//! Sentinel: the master the sentinels name now, followed as it changes.
//!
//! Every sentinel is asked `SENTINEL MASTER <name>` at once, and the master of the highest
//! `config-epoch` wins: a failover raises the epoch, so the sentinel that carried it out is
//! believed before the others hear of it (they learn it from its hello messages, up to 2 s
//! later). The winner must answer `ROLE` as a master before sluice uses it.
//!
//! The answer is asked again (a resolution):
//! - at once when a sentinel publishes `+switch-master` for the name (sluice subscribes on every
//!   sentinel, subscribing again after a lost connection);
//! - at once after a call meets a `READONLY` or `MASTERDOWN` reply, a lost connection or a
//!   time-out (the master may be demoted or gone);
//! - every [`CHECK_EVERY`] regardless, as a backstop (a lost `+switch-master`, a sentinel that
//!   was unreachable), which also checks that the master still answers `ROLE` as a master;
//!
//! at most once per [`RESOLVE_GAP`]. When the master changes, its generation goes up, and each
//! lane of the connector connects to the new master at its next call: a `SENTINEL FAILOVER`
//! of a master that stays up (and goes on answering as a master until the sentinels demote it,
//! about 10 s later) moves sluice's writes as soon as the failover is announced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::StreamExt as _;
use futures_util::future::join_all;
use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo as _,
    RedisConnectionInfo, RedisError, RedisResult, TlsCertificates, Value,
};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::connection::Timeouts;
use super::topology::Node;

/// The backstop: how often the sentinels are asked even without a cue.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The least time between two resolutions by the watcher.
pub(super) const RESOLVE_GAP: Duration = Duration::from_millis(50);

/// How long a lost subscription to a sentinel waits before subscribing again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// The channel on which a sentinel announces a new master.
const SWITCH_MASTER: &str = "+switch-master";

/// The master the sentinels name, and a client to reach it.
pub(crate) struct Master {
    pub addr: Node,
    pub client: redis::Client,
    /// Goes up by one each time the master changes.
    pub generation: u64,
}

/// Where to reach the sentinels and the master.
pub(crate) struct Options<'a> {
    pub name: &'a str,
    pub sentinels: Vec<(String, u16)>,
    /// The master's credentials (the URL's).
    pub master_user: Option<&'a str>,
    pub master_password: Option<&'a str>,
    /// The sentinels' own (`redis.sentinel_*`).
    pub sentinel_user: Option<&'a str>,
    pub sentinel_password: Option<&'a str>,
    /// `Some` for TLS to both, with the CA and client certificate when given.
    pub tls: Option<Option<&'a TlsCertificates>>,
    /// With TLS: the certificates' chain is checked, their names not
    /// (`redis.tls_skip_hostname_verification`), for the sentinels and the master alike.
    pub skip_hostname_verification: bool,
    pub timeouts: Timeouts,
}

/// The sentinels of one master name, and what they name.
pub(crate) struct Sentinels {
    inner: Arc<Inner>,
    tasks: OnceLock<Vec<AbortHandle>>,
}

struct Inner {
    name: String,
    sentinels: Vec<Sentinel>,
    /// How to reach the master: credentials and TLS; the address is replaced.
    master: Template,
    config: AsyncConnectionConfig,
    timeouts: Timeouts,
    current: ArcSwapOption<Master>,
    /// A connection to the current master for `ROLE`.
    probe: Mutex<Option<(Node, MultiplexedConnection)>>,
    /// Held while resolving, so that concurrent askers share one resolution.
    resolving: tokio::sync::Mutex<()>,
    /// Resolutions finished, for those that waited on one.
    resolved: AtomicU64,
    /// Wakes the watcher for a resolution now.
    wake: Notify,
}

struct Sentinel {
    addr: Node,
    client: redis::Client,
    cached: Mutex<Option<MultiplexedConnection>>,
}

struct Template {
    info: ConnectionInfo,
    certificates: Option<TlsCertificates>,
    skip_hostname_verification: bool,
}

impl Template {
    fn new(
        host: &str,
        port: u16,
        user: Option<&str>,
        password: Option<&str>,
        tls: Option<Option<&TlsCertificates>>,
        skip_hostname_verification: bool,
    ) -> RedisResult<Template> {
        let mut redis = RedisConnectionInfo::default();
        if let Some(user) = user {
            redis = redis.set_username(user);
        }
        if let Some(password) = password {
            redis = redis.set_password(password);
        }
        let addr = match tls {
            Some(_) => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
            None => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        Ok(Template {
            info: addr.into_connection_info()?.set_redis_settings(redis),
            certificates: tls.flatten().cloned(),
            skip_hostname_verification: skip_hostname_verification && tls.is_some(),
        })
    }

    /// A client for `host:port` with this template's credentials and TLS.
    fn client(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let addr = match self.info.addr() {
            ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let info = self.info.clone().set_addr(addr);
        let client = match &self.certificates {
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone())?,
            None => redis::Client::open(info)?,
        };
        if !self.skip_hostname_verification {
            return Ok(client);
        }
        // As for one server (`connection::single`): the parameters built from the CA, with
        // the name check turned off.
        let info = client.get_connection_info();
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        redis::Client::open(info.clone().set_addr(addr))
    }
}

impl Sentinels {
    /// The sentinels of `options`; no I/O until the first call.
    pub(crate) fn new(options: &Options<'_>) -> RedisResult<Sentinels> {
        let mut sentinels = Vec::new();
        for (host, port) in &options.sentinels {
            let template = Template::new(
                host,
                *port,
                options.sentinel_user,
                options.sentinel_password,
                options.tls,
                options.skip_hostname_verification,
            )?;
            sentinels.push(Sentinel {
                addr: format!("{host}:{port}").into(),
                client: template.client(host, *port)?,
                cached: Mutex::new(None),
            });
        }
        if sentinels.is_empty() {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a Sentinel URL needs at least one sentinel",
            )));
        }
        let master = Template::new(
            "localhost",
            0,
            options.master_user,
            options.master_password,
            options.tls,
            options.skip_hostname_verification,
        )?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.timeouts.connect))
            .set_response_timeout(Some(options.timeouts.response));
        Ok(Sentinels {
            inner: Arc::new(Inner {
                name: options.name.to_owned(),
                sentinels,
                master,
                config,
                timeouts: options.timeouts,
                current: ArcSwapOption::empty(),
                probe: Mutex::new(None),
                resolving: tokio::sync::Mutex::new(()),
                resolved: AtomicU64::new(0),
                wake: Notify::new(),
            }),
            tasks: OnceLock::new(),
        })
    }

    /// The connection settings for the master.
    pub(crate) fn config(&self) -> &AsyncConnectionConfig {
        &self.inner.config
    }

    /// The master known now, if any.
    pub(crate) fn current(&self) -> Option<Arc<Master>> {
        self.inner.current.load_full()
    }

    /// The master's address known now, else the master's name.
    pub(crate) fn node(&self) -> Node {
        match self.inner.current.load_full() {
            Some(master) => master.addr.clone(),
            None => self.inner.name.as_str().into(),
        }
    }

    /// The master known now, or (when none is yet) the one the sentinels name. Starts the
    /// watcher on first use (it needs the runtime).
    pub(crate) async fn master(&self) -> RedisResult<Arc<Master>> {
        self.start();
        if let Some(master) = self.current() {
            return Ok(master);
        }
        self.inner.resolve_shared().await
    }

    /// A cue that the master may have changed: the watcher asks the sentinels now.
    pub(crate) fn suspect(&self) {
        self.start();
        self.inner.wake.notify_one();
    }

    fn start(&self) {
        self.tasks.get_or_init(|| {
            let mut tasks = vec![tokio::spawn(watch(self.inner.clone())).abort_handle()];
            for i in 0..self.inner.sentinels.len() {
                tasks.push(tokio::spawn(listen(self.inner.clone(), i)).abort_handle());
            }
            tasks
        });
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for task in self.tasks.get().into_iter().flatten() {
            task.abort();
        }
    }
}

/// What one sentinel names.
struct Named {
    epoch: u64,
    host: String,
    port: u16,
}

impl Inner {
    /// A resolution, or the outcome of one that finished while this one waited for it.
    async fn resolve_shared(&self) -> RedisResult<Arc<Master>> {
        let seen = self.resolved.load(Ordering::Acquire);
        let _guard = self.resolving.lock().await;
        if self.resolved.load(Ordering::Acquire) != seen
            && let Some(master) = self.current.load_full()
        {
            return Ok(master);
        }
        let result = self.resolve().await;
        self.resolved.fetch_add(1, Ordering::Release);
        result
    }

    /// Asks every sentinel at once; the master of the highest epoch, when it answers `ROLE`
    /// as a master, becomes the current one.
    async fn resolve(&self) -> RedisResult<Arc<Master>> {
        let answers = join_all(self.sentinels.iter().map(|s| self.ask(s))).await;
        let mut last = None;
        let mut best: Option<Named> = None;
        for answer in answers {
            match answer {
                Ok(named) if best.as_ref().is_none_or(|b| named.epoch > b.epoch) => {
                    best = Some(named);
                }
                Ok(_) => {}
                Err(e) => last = Some(e),
            }
        }
        let Some(named) = best else {
            let e = last.unwrap_or_else(|| io("no sentinel answered"));
            // The sentinels are out of reach, not the master: keep the one known.
            return match self.current.load_full() {
                Some(master) => {
                    tracing::debug!(error = %e, "redis sentinel: no sentinel answered");
                    Ok(master)
                }
                None => Err(e),
            };
        };
        let addr: Node = format!("{}:{}", named.host, named.port).into();
        self.check_role(&addr, &named).await?;
        let old = self.current.load_full();
        if let Some(old) = &old
            && old.addr == addr
        {
            return Ok(old.clone());
        }
        let master = Arc::new(Master {
            client: self.master.client(&named.host, named.port)?,
            addr: addr.clone(),
            generation: old.as_ref().map_or(0, |m| m.generation + 1),
        });
        self.current.store(Some(master.clone()));
        match &old {
            Some(old) => tracing::info!(
                master = %addr,
                previous = %old.addr,
                epoch = named.epoch,
                "redis sentinel: connected to the master"
            ),
            None => tracing::info!(
                master = %addr,
                epoch = named.epoch,
                "redis sentinel: connected to the master"
            ),
        }
        Ok(master)
    }

    /// `SENTINEL MASTER <name>` of one sentinel: the master's address and its epoch.
    async fn ask(&self, sentinel: &Sentinel) -> RedisResult<Named> {
        let asked = async {
            let mut conn = self.connection(sentinel).await?;
            let reply: RedisResult<std::collections::HashMap<String, String>> =
                redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(&self.name)
                    .query_async(&mut conn)
                    .await;
            if reply.as_ref().is_err_and(|e| e.code().is_none()) {
                *sentinel.cached.lock() = None;
            }
            reply
        };
        let fields = tokio::time::timeout(self.timeouts.connect + self.timeouts.response, asked)
            .await
            .map_err(|_| {
                *sentinel.cached.lock() = None;
                io("no answer from the sentinel")
            })??;
        let field = |name: &str| {
            fields.get(name).ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "SENTINEL MASTER: a field is missing",
                    format!("{name} from {}", sentinel.addr),
                ))
            })
        };
        let number = |name: &str| -> RedisResult<u64> {
            field(name)?.parse().map_err(|_| {
                RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "SENTINEL MASTER: a field is not a number",
                    format!("{name} from {}", sentinel.addr),
                ))
            })
        };
        Ok(Named {
            epoch: number("config-epoch")?,
            host: field("ip")?.clone(),
            port: u16::try_from(number("port")?).map_err(|_| io("SENTINEL MASTER: bad port"))?,
        })
    }

    async fn connection(&self, sentinel: &Sentinel) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = sentinel.cached.lock().clone() {
            return Ok(conn);
        }
        let conn = sentinel
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *sentinel.cached.lock() = Some(conn.clone());
        Ok(conn)
    }

    /// Checks that `addr` answers `ROLE` as a master.
    async fn check_role(&self, addr: &Node, named: &Named) -> RedisResult<()> {
        let cached = self
            .probe
            .lock()
            .as_ref()
            .filter(|(at, _)| at == addr)
            .map(|(_, conn)| conn.clone());
        let asked = async {
            let mut conn = match cached {
                Some(conn) => conn,
                None => {
                    let conn = self
                        .master
                        .client(&named.host, named.port)?
                        .get_multiplexed_async_connection_with_config(&self.config)
                        .await?;
                    *self.probe.lock() = Some((addr.clone(), conn.clone()));
                    conn
                }
            };
            let role: RedisResult<Value> = redis::cmd("ROLE").query_async(&mut conn).await;
            if role.as_ref().is_err_and(|e| e.code().is_none()) {
                *self.probe.lock() = None;
            }
            role
        };
        let role = tokio::time::timeout(self.timeouts.connect + self.timeouts.response, asked)
            .await
            .map_err(|_| {
                *self.probe.lock() = None;
                io("no answer to ROLE from the master the sentinels name")
            })??;
        let first = match &role {
            Value::Array(items) => items.first(),
            _ => None,
        };
        match first {
            Some(Value::BulkString(role)) if role.as_slice() == b"master" => Ok(()),
            _ => Err(RedisError::from((
                redis::ErrorKind::Io,
                "the master the sentinels name does not answer ROLE as a master",
                addr.to_string(),
            ))),
        }
    }
}

fn io(message: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Io, message))
}

/// Resolves when woken (at most once per [`RESOLVE_GAP`]) and every [`CHECK_EVERY`], until
/// the sentinels are dropped.
async fn watch(inner: Arc<Inner>) {
    loop {
        let _ = tokio::time::timeout(CHECK_EVERY, inner.wake.notified()).await;
        let started = Instant::now();
        if let Err(e) = inner.resolve_shared().await {
            tracing::debug!(error = %e, "redis sentinel: no master resolved");
        }
        tokio::time::sleep_until(started + RESOLVE_GAP).await;
    }
}

/// Subscribes to `+switch-master` on sentinel `index`, waking the watcher on each message for
/// the master's name, and subscribes again after a lost connection, until dropped.
async fn listen(inner: Arc<Inner>, index: usize) {
    let Some(sentinel) = inner.sentinels.get(index) else {
        return;
    };
    loop {
        let subscribed = async {
            let mut pubsub = tokio::time::timeout(
                inner.timeouts.connect + inner.timeouts.response,
                sentinel.client.get_async_pubsub(),
            )
            .await
            .map_err(|_| io("no answer from the sentinel"))??;
            pubsub.subscribe(SWITCH_MASTER).await?;
            Ok::<_, RedisError>(pubsub)
        };
        match subscribed.await {
            Ok(mut pubsub) => {
                // Whatever was announced while not subscribed: ask now.
                inner.wake.notify_one();
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let payload: String = message.get_payload().unwrap_or_default();
                    if payload.split(' ').next() == Some(inner.name.as_str()) {
                        tracing::debug!(sentinel = %sentinel.addr, %payload, "redis sentinel: +switch-master");
                        inner.wake.notify_one();
                    }
                }
            }
            Err(e) => {
                tracing::debug!(sentinel = %sentinel.addr, error = %e, "redis sentinel: cannot subscribe to +switch-master");
            }
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}
