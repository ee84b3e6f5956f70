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
}

impl Default for MemcacheSettings {
    fn default() -> Self {
        MemcacheSettings {
            servers: "127.0.0.1:11211".to_owned(),
            prefix: "sluice:".to_owned(),
            connect_timeout_ms: 500,
            timeout_ms: 100,
            connections: 2,
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

    /// Checks the settings against each other.
    pub(super) fn check(&self) -> Result<(), String> {
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
}
