//! `memcache.srv` (envoyproxy/ratelimit's `MEMCACHE_SRV`): the Memcached servers are the
//! targets of a DNS SRV record, looked up here and handed to the backend
//! ([`MemcacheLimiter::set_servers`]).
//!
//! Each answer becomes `target:port` per record (the target without the root's final dot),
//! sorted, as envoyproxy/ratelimit sorts them: every replica that gets the same records
//! hashes keys over the same list. Until a first lookup answers, the backend has no server
//! (not ready, requests fail `UNAVAILABLE`) and the lookup is retried, 500 ms doubling up to
//! 30 s. After it, with `memcache.srv_refresh_ms` above 0, the record is looked up again at
//! that interval; a lookup that fails or finds no record keeps the list in use (logged).
//! The system's resolvers are asked (`/etc/resolv.conf`), or `memcache.srv_resolver`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use tokio_util::sync::CancellationToken;

use crate::config::settings::MemcacheSettings;
use crate::limiter::MemcacheLimiter;

/// The first lookups' retry: from this, doubling...
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// ...up to this.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Keeps a Memcached backend's servers those of an SRV record.
pub(crate) struct SrvWatch {
    name: String,
    refresh: Option<Duration>,
    resolver: TokioResolver,
    limiter: Arc<MemcacheLimiter>,
}

impl SrvWatch {
    /// The watch `settings` ask for (none without `memcache.srv`).
    pub(crate) fn new(
        settings: &MemcacheSettings,
        limiter: Arc<MemcacheLimiter>,
    ) -> anyhow::Result<Option<SrvWatch>> {
        let Some(parts) = settings.srv_parts() else {
            return Ok(None);
        };
        let (service, proto, name) = parts.map_err(anyhow::Error::msg)?;
        let resolver = resolver(settings.srv_resolver.as_deref())?;
        Ok(Some(SrvWatch {
            name: format!("_{service}._{proto}.{name}"),
            refresh: (settings.srv_refresh_ms > 0)
                .then(|| Duration::from_millis(settings.srv_refresh_ms)),
            resolver,
            limiter,
        }))
    }

    /// Looks the record up until a first answer, then every refresh interval, until `stop`.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut wait = RETRY_FIRST;
        loop {
            match lookup(&self.resolver, &self.name).await {
                Ok(servers) => {
                    self.limiter.set_servers(&servers);
                    break;
                }
                Err(e) => tracing::warn!(
                    srv = %self.name,
                    "memcache.srv: no servers yet, retrying in {wait:?}: {e}"
                ),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
        let Some(every) = self.refresh else {
            return;
        };
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            match lookup(&self.resolver, &self.name).await {
                Ok(servers) => self.limiter.set_servers(&servers),
                Err(e) => tracing::warn!(
                    srv = %self.name,
                    "memcache.srv: refresh failed, keeping {:?}: {e}",
                    self.limiter.server_addrs()
                ),
            }
        }
    }
}

/// The system's resolver, or one asking only `addr` (`ip:port`, over UDP then TCP).
fn resolver(addr: Option<&str>) -> anyhow::Result<TokioResolver> {
    let builder = match addr {
        Some(addr) => {
            let addr: SocketAddr = addr
                .parse()
                .map_err(|_| anyhow::anyhow!("memcache.srv_resolver: '{addr}' is not ip:port"))?;
            let mut server = NameServerConfig::udp_and_tcp(addr.ip());
            for connection in &mut server.connections {
                connection.port = addr.port();
            }
            let config = ResolverConfig::from_parts(None, Vec::new(), vec![server]);
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        }
        None => TokioResolver::builder_tokio()
            .map_err(|e| anyhow::anyhow!("memcache.srv: the system's DNS settings: {e}"))?,
    };
    builder
        .build()
        .map_err(|e| anyhow::anyhow!("memcache.srv: DNS resolver: {e}"))
}

/// The servers of SRV record `name`: `target:port` each, sorted. An answer without a record
/// is an error (the list in use is kept).
async fn lookup(resolver: &TokioResolver, name: &str) -> Result<Vec<String>, String> {
    // Every lookup asks again, as envoyproxy/ratelimit's does (no answer is cached here).
    resolver.clear_cache();
    let answer = resolver.srv_lookup(name).await.map_err(|e| e.to_string())?;
    let mut servers: Vec<String> = answer
        .answers()
        .iter()
        .filter_map(|record| match &record.data {
            RData::SRV(srv) => {
                let target = srv.target.to_ascii();
                Some(format!("{}:{}", target.trim_end_matches('.'), srv.port))
            }
            _ => None,
        })
        .collect();
    if servers.is_empty() {
        return Err(format!("no SRV record for {name}"));
    }
    servers.sort();
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolver_address_must_be_ip_and_port() {
        assert!(resolver(Some("dns.example:53")).is_err());
        assert!(resolver(Some("127.0.0.1:5353")).is_ok());
    }
}
