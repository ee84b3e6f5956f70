//! `[memcache]`: where the Memcached backend is (`limiter.backend = "memcache"`,
//! envoyproxy/ratelimit's `BACKEND_TYPE=memcache`).

use serde::Deserialize;

/// `[memcache]`: the Memcached backend (docs/ratelimit-compat.md, "Memcached").
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MemcacheSettings {
    /// The servers, `host:port` separated by commas (envoyproxy/ratelimit's
    /// `MEMCACHE_HOST_PORT`). A key lives on one of them, chosen by a hash of the key over
    /// this list: every replica must list the same servers in the same order.
    pub servers: String,
    /// Put in front of every key.
    pub prefix: String,
    /// Time to establish a connection.
    pub connect_timeout_ms: u64,
    /// Time one request may take, every server it needs included.
    pub timeout_ms: u64,
    /// Connections kept open to each server (envoyproxy/ratelimit's
    /// `MEMCACHE_MAX_IDLE_CONNS`).
    pub connections: usize,
    /// A DNS SRV name, `_service._proto.name` (envoyproxy/ratelimit's `MEMCACHE_SRV`): the
    /// servers are its targets, `target:port` sorted, instead of `servers`. Empty: off.
    pub srv: String,
    /// How often the SRV name is looked up again (`MEMCACHE_SRV_REFRESH`); 0: only until
    /// the first answer.
    pub srv_refresh_ms: u64,
    /// The DNS server (`ip:port`) SRV lookups ask, instead of the system's resolvers
    /// (`/etc/resolv.conf`). Meant for tests and for a resolver of the operator's own.
    pub srv_resolver: Option<String>,
    /// TLS to every server (`MEMCACHE_TLS`): the server's certificate must chain to the
    /// system's roots or to `tls_ca_file`, and name the server's host.
    pub tls: bool,
    /// A CA (PEM) trusted besides the system's roots (`MEMCACHE_TLS_CACERT`).
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// A client certificate chain (PEM), with `tls_key_file` (`MEMCACHE_TLS_CLIENT_CERT`).
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// Its private key (`MEMCACHE_TLS_CLIENT_KEY`).
    pub tls_key_file: Option<std::path::PathBuf>,
    /// The chain is still verified, the host name is not
    /// (`MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION`): against `tls_ca_file` alone when given,
    /// else against the system's roots (logged at warn: any certificate those CAs signed,
    /// for any name, is then accepted).
    pub tls_skip_hostname_verification: bool,
}

impl Default for MemcacheSettings {
    fn default() -> Self {
        MemcacheSettings {
            servers: "127.0.0.1:11211".to_owned(),
            prefix: "sluice:".to_owned(),
            connect_timeout_ms: 500,
            timeout_ms: 100,
            connections: 2,
            srv: String::new(),
            srv_refresh_ms: 0,
            srv_resolver: None,
            tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_skip_hostname_verification: false,
        }
    }
}

impl MemcacheSettings {
    /// The servers, each `host:port`.
    pub fn server_list(&self) -> Vec<String> {
        self.servers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `srv` as (service, protocol, name), when set: `_service._proto.name`, split as
    /// envoyproxy/ratelimit splits it (the shortest service and protocol).
    pub fn srv_parts(&self) -> Option<Result<(&str, &str, &str), String>> {
        let srv = self.srv.trim();
        if srv.is_empty() {
            return None;
        }
        let bad = || format!("memcache.srv: '{srv}' is not _service._proto.name");
        let parts = srv.strip_prefix('_').and_then(|rest| {
            let (service, rest) = rest.split_once("._")?;
            let (proto, name) = rest.split_once('.')?;
            (!service.is_empty() && !proto.is_empty() && !name.is_empty())
                .then_some((service, proto, name))
        });
        Some(parts.ok_or_else(bad))
    }

    /// Checks the settings against each other.
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(parts) = self.srv_parts() {
            parts?;
        }
        if let Some(r) = &self.srv_resolver
            && r.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(format!("memcache.srv_resolver: '{r}' is not ip:port"));
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("memcache.tls_cert_file and memcache.tls_key_file go together".to_owned());
        }
        let servers = self.server_list();
        if servers.is_empty() {
            return Err("memcache.servers: name at least one host:port".to_owned());
        }
        if let Some(bad) = servers.iter().find(|s| !is_host_port(s)) {
            return Err(format!("memcache.servers: '{bad}' is not host:port"));
        }
        if self.prefix.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err("memcache.prefix: no spaces or control characters".to_owned());
        }
        if self.prefix.len() > 100 {
            return Err("memcache.prefix: at most 100 bytes (a key is at most 250)".to_owned());
        }
        if self.connections == 0 {
            return Err("memcache.connections: at least 1".to_owned());
        }
        Ok(())
    }
}

fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_host_port_pairs() {
        let mut s = MemcacheSettings {
            servers: " a:1, b:11211 ,".to_owned(),
            ..MemcacheSettings::default()
        };
        assert_eq!(s.server_list(), ["a:1", "b:11211"]);
        assert!(s.check().is_ok());
        for bad in ["", "a", "a:0", ":1", "a:x"] {
            s.servers = bad.to_owned();
            assert!(s.check().is_err(), "{bad}");
        }
    }

    #[test]
    fn srv_names_split_as_envoyproxy_ratelimit_splits_them() {
        let parts = |srv: &str| {
            let s = MemcacheSettings {
                srv: srv.to_owned(),
                ..MemcacheSettings::default()
            };
            s.srv_parts()
                .map(|p| p.map(|(a, b, c)| format!("{a}|{b}|{c}")))
        };
        assert_eq!(parts(""), None);
        assert_eq!(
            parts("_memcache._tcp.mc.ns.svc.cluster.local"),
            Some(Ok("memcache|tcp|mc.ns.svc.cluster.local".to_owned()))
        );
        assert_eq!(parts("_a.b._tcp.x"), Some(Ok("a.b|tcp|x".to_owned())));
        for bad in [
            "memcache._tcp.x",
            "_memcache.tcp.x",
            "_memcache._tcp",
            "_._tcp.x",
        ] {
            assert!(matches!(parts(bad), Some(Err(_))), "{bad}");
        }
    }
}
