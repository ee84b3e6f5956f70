//! Where Redis is and how to reach it: URL forms, and connections that are made lazily (so
//! sluice starts while Redis is down) and remade after failures.
//!
//! | URL | deployment |
//! |---|---|
//! | `redis://[user:password@]host:port[/db]` | one server (`rediss://` for TLS) |
//! | `unix:///path/to/redis.sock` | one server over its Unix socket (`redis+unix://` too) |
//! | `redis+sentinel://[user:password@]s1:port,s2:port/master_name` | Sentinel: the sentinels' addresses and the master's name; the credentials are the master's (`rediss+sentinel://` for TLS to both) |
//! | `redis+cluster://[user:password@]n1:port,n2:port` | Cluster: seed nodes (`rediss+cluster://` for TLS) |
//!
//! A connector keeps `redis.connections` connections (lanes), each made on first use. One
//! server: a multiplexed [`ConnectionManager`] per lane, which reconnects by itself. Sentinel:
//! per lane, a multiplexed connection to the master the sentinels name now ([`Sentinels`],
//! which follows `+switch-master`, errors and a check every second); a lane whose master is
//! no longer the named one connects again at its next call.
//! Cluster: per lane and master, a multiplexed connection, routed by sluice's own slot map
//! ([`Topology`]); `super::redirect` follows the Cluster's redirections.
//!
//! Each deployment has nodes, named by address ([`Node`]): the server, the master Sentinel
//! last named, or each master of a Cluster. The circuit breaker and readiness act per node.
//!
//! TLS ([`Tls`], from the `redis.tls_*` settings) applies to every kind: Redis's certificate
//! must chain to `tls_ca_file` when given (else to the system's roots), and sluice presents
//! `tls_cert_file` when given. With Sentinel, the sentinels get the same as the master,
//! `tls_skip_hostname_verification` included (the chain is checked, the names not).
//!
//! [`Conn`] is where the kinds meet: it is a [`ConnectionLike`], so everything above this
//! module sends commands without asking which kind it holds.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{
    ClientTlsConfig, Cmd, ConnectionAddr, Pipeline, RedisError, RedisFuture, RedisResult,
    TlsCertificates, Value,
};

use super::sentinel::{Options, Sentinels};
use super::topology::{Node, Topology};
use crate::config::settings::RedisSettings;
use crate::pem::{read_ca, read_identity};

/// TLS beyond the URL's scheme: the CA that Redis's certificate must chain to and the
/// certificate sluice presents (`None`: the system's roots, no client certificate), and
/// whether the certificate's names are left unchecked.
#[derive(Clone, Default)]
pub struct Tls {
    certificates: Option<TlsCertificates>,
    skip_hostname_verification: bool,
}

impl Tls {
    /// Reads and checks the files of the `redis.tls_*` settings; the error names the setting
    /// and the file.
    pub fn from_settings(s: &RedisSettings) -> Result<Tls, String> {
        let root_cert = match &s.tls_ca_file {
            Some(path) => Some(read_ca(path).map_err(|e| format!("redis.tls_ca_file: {e}"))?),
            None => None,
        };
        let client_tls = match (&s.tls_cert_file, &s.tls_key_file) {
            (Some(cert), Some(key)) => {
                let (client_cert, client_key) = read_identity(cert, key)
                    .map_err(|e| format!("redis.tls_cert_file, redis.tls_key_file: {e}"))?;
                Some(ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            _ => None,
        };
        let certificates =
            (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
                client_tls,
                root_cert,
            });
        if s.tls_skip_hostname_verification && s.tls_ca_file.is_none() {
            tracing::warn!("{}", crate::pem::skip_without_ca("redis"));
        }
        Ok(Tls {
            certificates,
            skip_hostname_verification: s.tls_skip_hostname_verification,
        })
    }

    /// The CA and client certificate, when the settings give either.
    pub fn certificates(&self) -> Option<&TlsCertificates> {
        self.certificates.as_ref()
    }

    /// Whether the certificate's names go unchecked.
    pub(crate) fn skips_hostname_verification(&self) -> bool {
        self.skip_hostname_verification
    }
}

/// Time limits of connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// A connection ready for one call (cheap to clone: all of them are multiplexed handles).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server, reconnecting by itself.
    Single(ConnectionManager),
    /// One node: the master Sentinel named, or a node of a Cluster.
    Node(MultiplexedConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Node(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Node(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Node(c) => c.get_db(),
        }
    }
}

/// Makes and keeps the connections to a Redis deployment, one per lane.
pub(crate) struct Connector {
    kind: Kind,
    lanes: Vec<Lane>,
}

/// One lane's connection.
struct Lane {
    /// The connection to reuse, and (Sentinel) the generation of the master it goes to.
    cached: ArcSwapOption<(Conn, u64)>,
    /// Held while (re)connecting, so that one task connects and the others wait for it.
    connecting: tokio::sync::Mutex<()>,
}

// One per connector: the size of the largest kind costs nothing.
#[allow(clippy::large_enum_variant)]
enum Kind {
    /// The client, its manager's settings, and the server's address.
    Single(redis::Client, ConnectionManagerConfig, Node),
    /// The sentinels, and the master they name (`super::sentinel`).
    Sentinel(Sentinels),
    Cluster(Topology),
}

impl Connector {
    /// Parses `url` and prepares `lanes` connections (at least one); no I/O happens until the
    /// first call.
    #[cfg(test)]
    pub(crate) fn new(
        url: &str,
        tls: &Tls,
        timeouts: Timeouts,
        lanes: usize,
    ) -> RedisResult<Connector> {
        Connector::with_sentinel_auth(url, tls, &SentinelAuth::default(), timeouts, lanes)
    }

    /// Parses `url` and prepares `lanes` connections (at least one), the sentinels of a
    /// Sentinel URL asked with `auth`; no I/O happens until the first call.
    pub(crate) fn with_sentinel_auth(
        url: &str,
        tls: &Tls,
        auth: &SentinelAuth,
        timeouts: Timeouts,
        lanes: usize,
    ) -> RedisResult<Connector> {
        let kind = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            sentinel(rest, None, auth, timeouts)?
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            sentinel(rest, Some(tls), auth, timeouts)?
        } else if let Some(rest) = url.strip_prefix("redis+cluster://") {
            cluster(rest, None, timeouts, lanes)?
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            cluster(rest, Some(tls), timeouts, lanes)?
        } else {
            single(url, tls, timeouts)?
        };
        let lanes = (0..lanes.max(1))
            .map(|_| Lane {
                cached: ArcSwapOption::empty(),
                connecting: tokio::sync::Mutex::new(()),
            })
            .collect();
        Ok(Connector { kind, lanes })
    }

    /// Whether this is a Redis Cluster (whose calls must keep to one slot each).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(_))
    }

    /// The Cluster, for a Cluster.
    pub(crate) fn topology(&self) -> Option<&Topology> {
        match &self.kind {
            Kind::Cluster(topology) => Some(topology),
            _ => None,
        }
    }

    /// The node a call of `slot` goes to now, when known: the server, the master Sentinel
    /// last named, or the master of `slot` by the Cluster's slot map.
    pub(crate) fn node(&self, slot: Option<u16>) -> Option<Node> {
        match &self.kind {
            Kind::Single(.., node) => Some(node.clone()),
            Kind::Sentinel(sentinels) => Some(sentinels.node()),
            Kind::Cluster(topology) => slot.and_then(|s| topology.owner_now(s)),
        }
    }

    /// How many lanes (connections) it keeps.
    pub(crate) fn lanes(&self) -> usize {
        self.lanes.len()
    }

    fn lane(&self, lane: usize) -> &Lane {
        &self.lanes[lane % self.lanes.len()]
    }

    /// Lane `lane`'s connection: the cached one, or a new one.
    pub(crate) async fn get(&self, lane: usize) -> RedisResult<Conn> {
        // A Cluster's calls go to their slot's master (`super::redirect`); this is any node,
        // for a `PING`.
        if let Kind::Cluster(topology) = &self.kind {
            return Ok(Conn::Node(topology.any(lane).await?));
        }
        // Sentinel: a lane's connection serves while it goes to the master named now.
        let generation = || match &self.kind {
            Kind::Sentinel(sentinels) => sentinels.current().map_or(0, |m| m.generation),
            _ => 0,
        };
        let lane = self.lane(lane);
        if let Some(cached) = lane.cached.load_full()
            && cached.1 == generation()
        {
            return Ok(cached.0.clone());
        }
        let _guard = lane.connecting.lock().await;
        if let Some(cached) = lane.cached.load_full()
            && cached.1 == generation()
        {
            return Ok(cached.0.clone());
        }
        let (conn, generation) = match &self.kind {
            // Lazy: this makes no connection yet, but needs the runtime (so not in `new`).
            Kind::Single(client, config, _) => (
                Conn::Single(ConnectionManager::new_lazy_with_config(
                    client.clone(),
                    config.clone(),
                )?),
                0,
            ),
            Kind::Sentinel(sentinels) => {
                let master = sentinels.master().await?;
                let conn = master
                    .client
                    .get_multiplexed_async_connection_with_config(sentinels.config())
                    .await
                    .inspect_err(|_| sentinels.suspect())?;
                (Conn::Node(conn), master.generation)
            }
            Kind::Cluster(_) => return Err(invalid("a Cluster has no connection of its own")),
        };
        lane.cached
            .store(Some(Arc::new((conn.clone(), generation))));
        Ok(conn)
    }

    /// A new publish/subscribe connection to the server, or to the master the sentinels name
    /// now; a Cluster has none.
    pub(crate) async fn pubsub(&self) -> RedisResult<redis::aio::PubSub> {
        match &self.kind {
            Kind::Single(client, ..) => client.get_async_pubsub().await,
            Kind::Sentinel(sentinels) => sentinels.master().await?.client.get_async_pubsub().await,
            Kind::Cluster(topology) => topology.pubsub().await,
        }
    }

    /// Tells the connector that a call took too long: a Sentinel connection is dropped (a
    /// master that hangs is as lost as one that is gone), and the sentinels asked again.
    pub(crate) fn timed_out(&self, lane: usize) {
        if let Kind::Sentinel(sentinels) = &self.kind {
            self.lane(lane).cached.store(None);
            sentinels.suspect();
        }
    }

    /// Tells the connector that a call failed with `err`: a Sentinel connection is dropped,
    /// and the sentinels asked again at once (a failover shows up as a lost connection or a
    /// `READONLY` reply from a demoted master).
    pub(crate) fn failed(&self, lane: usize, err: &RedisError) {
        let lost = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
            || err.code() == Some("READONLY")
            || err.code() == Some("MASTERDOWN");
        if let (true, Kind::Sentinel(sentinels)) = (lost, &self.kind) {
            self.lane(lane).cached.store(None);
            sentinels.suspect();
        }
    }
}

fn invalid(message: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::InvalidClientConfig, message))
}

fn single(url: &str, tls: &Tls, t: Timeouts) -> RedisResult<Kind> {
    let mut client = match &tls.certificates {
        Some(certificates) => redis::Client::build_with_tls(url, certificates.clone())?,
        None => redis::Client::open(url)?,
    };
    let info = client.get_connection_info();
    if let ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
        return Err(invalid(
            "redis.url: #insecure (no certificate check at all) is not supported; give \
             Redis's CA in redis.tls_ca_file",
        ));
    }
    if tls.skip_hostname_verification {
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        client = redis::Client::open(info.clone().set_addr(addr))?;
    }
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t.connect))
        .set_response_timeout(Some(t.response))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(200));
    let node = client.get_connection_info().addr().to_string().into();
    Ok(Kind::Single(client, config, node))
}

/// `[user:password@]host:port,host:port[/rest]`, split.
struct Hosts<'a> {
    user: Option<&'a str>,
    password: Option<&'a str>,
    hosts: Vec<(String, u16)>,
    path: &'a str,
}

fn hosts(rest: &str) -> RedisResult<Hosts<'_>> {
    let invalid = |what: String| {
        RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "invalid Redis URL",
            what,
        ))
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, list) = match authority.rsplit_once('@') {
        Some((u, l)) => (Some(u), l),
        None => (None, authority),
    };
    let (user, password) = match userinfo.map(|u| u.split_once(':').unwrap_or(("", u))) {
        Some((u, p)) => ((!u.is_empty()).then_some(u), (!p.is_empty()).then_some(p)),
        None => (None, None),
    };
    let hosts = list
        .split(',')
        .map(|h| {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| invalid(format!("{h}: no port")))?;
            let port = port
                .parse()
                .map_err(|_| invalid(format!("{h}: bad port")))?;
            Ok((host.to_owned(), port))
        })
        .collect::<RedisResult<Vec<_>>>()?;
    Ok(Hosts {
        user,
        password,
        hosts,
        path,
    })
}

/// The credentials sluice gives the sentinels themselves (`redis.sentinel_password`,
/// `redis.sentinel_username`), apart from the master's in the URL.
#[derive(Debug, Clone, Default)]
pub(crate) struct SentinelAuth {
    pub username: Option<String>,
    pub password: Option<String>,
}

/// `tls`: `None` for plain TCP.
fn sentinel(rest: &str, tls: Option<&Tls>, auth: &SentinelAuth, t: Timeouts) -> RedisResult<Kind> {
    let h = hosts(rest)?;
    let master = h.path.trim_matches('/');
    if master.is_empty() {
        return Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a Sentinel URL needs the master name: redis+sentinel://host:port,.../master_name",
        )));
    }
    let options = Options {
        name: master,
        sentinels: h.hosts,
        master_user: h.user,
        master_password: h.password,
        sentinel_user: auth.password.as_ref().and(auth.username.as_deref()),
        sentinel_password: auth.password.as_deref(),
        tls: tls.map(Tls::certificates),
        skip_hostname_verification: tls.is_some_and(Tls::skips_hostname_verification),
        timeouts: t,
    };
    Ok(Kind::Sentinel(Sentinels::new(&options)?))
}

/// `tls`: `None` for plain TCP.
fn cluster(rest: &str, tls: Option<&Tls>, t: Timeouts, lanes: usize) -> RedisResult<Kind> {
    let h = hosts(rest)?;
    let topology = Topology::new(&h.hosts, h.user, h.password, tls, t, lanes.max(1))?;
    Ok(Kind::Cluster(topology))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_with_credentials() {
        let h = hosts("u:p@a:1,b:2/mymaster").unwrap();
        assert_eq!(
            (h.user, h.password, h.path),
            (Some("u"), Some("p"), "mymaster")
        );
        assert_eq!(h.hosts, [("a".to_owned(), 1), ("b".to_owned(), 2)]);
        let h = hosts(":secret@a:1").unwrap();
        assert_eq!((h.user, h.password), (None, Some("secret")));
        assert!(hosts("a").is_err());
        assert!(hosts("a:x").is_err());
    }

    #[test]
    fn tls_files_that_are_missing_or_unreadable_are_named_with_their_setting() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let missing = dir.path().join("missing.pem");
        let with = |ca: &std::path::Path, cert: Option<&std::path::Path>| RedisSettings {
            url: "rediss://127.0.0.1:1".to_owned(),
            tls_ca_file: Some(ca.to_path_buf()),
            tls_cert_file: cert.map(std::path::Path::to_path_buf),
            tls_key_file: cert.map(|_| junk.clone()),
            ..RedisSettings::default()
        };
        let err = Tls::from_settings(&with(&missing, None)).err().unwrap();
        assert!(err.starts_with("redis.tls_ca_file: "), "{err}");
        assert!(err.contains("missing.pem"), "{err}");
        let err = Tls::from_settings(&with(&junk, None)).err().unwrap();
        assert!(err.contains("junk.pem: no certificate found"), "{err}");
        let err = Tls::from_settings(&RedisSettings {
            tls_ca_file: None,
            ..with(&junk, Some(&missing))
        })
        .err()
        .unwrap();
        assert!(
            err.starts_with("redis.tls_cert_file, redis.tls_key_file: "),
            "{err}"
        );
        assert!(err.contains("missing.pem"), "{err}");
        let none = Tls::from_settings(&RedisSettings::default()).unwrap();
        assert!(none.certificates.is_none() && !none.skip_hostname_verification);
    }

    #[tokio::test]
    async fn urls_of_every_form_parse_without_io() {
        let t = Timeouts {
            connect: Duration::from_millis(10),
            response: Duration::from_millis(10),
        };
        for url in [
            "redis://127.0.0.1:1",
            "rediss://user:pw@127.0.0.1:1/2",
            "redis+sentinel://127.0.0.1:1,127.0.0.1:2/m",
            "redis+cluster://127.0.0.1:1,127.0.0.1:2",
        ] {
            assert!(Connector::new(url, &Tls::default(), t, 2).is_ok(), "{url}");
        }
        let none = Tls::default();
        assert!(Connector::new("redis+sentinel://127.0.0.1:1", &none, t, 1).is_err());
        assert!(Connector::new("http://x", &none, t, 1).is_err());
        let insecure = Connector::new("rediss://127.0.0.1:1/#insecure", &none, t, 1);
        let err = insecure.err().expect("#insecure is refused").to_string();
        assert!(err.contains("#insecure"), "{err}");
        let cluster = Connector::new("redis+cluster://127.0.0.1:1", &none, t, 0).unwrap();
        assert!(cluster.is_cluster());
        assert_eq!(cluster.lanes(), 1, "at least one lane");
    }
}
