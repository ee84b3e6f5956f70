//! The Memcached backend's servers: which server holds a key, a few connections to each
//! (opened when first needed, dropped on any error and opened again by the next request),
//! and the four commands the backend sends (`incr`, `add`, `decr`, `get`), over the
//! `async-memcached` client (the text protocol). With `memcache.tls`, each connection is a
//! TLS connection handed to the client through a relay ([`super::memcache_tls`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::memcache_tls::{self as tls, Relay};

use async_memcached::{AsciiProtocol, Client, Error, Status};
use tokio::sync::{Mutex, MutexGuard};

/// Memcached's longest key.
const MAX_KEY: usize = 250;

/// Memcached reads an expiry above 30 days as a Unix time.
const RELATIVE_EXPIRY_MAX: u64 = 30 * 86_400;

/// One server and its connections.
pub(super) struct Server {
    /// `host:port`.
    pub(super) addr: String,
    connections: Vec<Mutex<Option<Client>>>,
    next: AtomicUsize,
    connect_timeout: Duration,
    /// With TLS: the client configuration, and the relay (started with the first connection).
    tls: Option<(Arc<rustls::ClientConfig>, tokio::sync::OnceCell<Relay>)>,
}

/// A failed exchange with a server.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) addr: String,
    pub(super) message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "memcached {}: {}", self.addr, self.message)
    }
}

impl Server {
    pub(super) fn new(
        addr: String,
        connections: usize,
        connect_timeout: Duration,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Server {
        Server {
            addr,
            connections: (0..connections.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            connect_timeout,
            tls: tls.map(|config| (config, tokio::sync::OnceCell::new())),
        }
    }

    /// A new client: over TCP, or over TLS through the relay.
    async fn open(&self) -> Result<Client, String> {
        let Some((config, relay)) = &self.tls else {
            return Client::new(format!("tcp://{}", self.addr))
                .await
                .map_err(|e| e.to_string());
        };
        let relay = relay
            .get_or_try_init(|| async { Relay::start() })
            .await
            .map_err(|e| format!("TLS relay: {e}"))?;
        let stream = tls::connect(config, &self.addr).await?;
        relay.hand_over(stream);
        Client::new(relay.dsn()).await.map_err(|e| e.to_string())
    }

    /// A connection of its own: a free one if there is one, else the next in turn once it is.
    pub(super) async fn connection(&self) -> Result<Connection<'_>, Failure> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.connections.len();
        let free = (0..n).find_map(|i| self.connections.get((start + i) % n)?.try_lock().ok());
        let mut guard = match free {
            Some(g) => g,
            None => match self.connections.get(start % n) {
                Some(slot) => slot.lock().await,
                None => return Err(self.failure("no connection slot")),
            },
        };
        if guard.as_ref().is_none_or(Client::is_closed) {
            let client = tokio::time::timeout(self.connect_timeout, self.open())
                .await
                .map_err(|_| {
                    self.failure(&format!("no connection within {:?}", self.connect_timeout))
                })?
                .map_err(|e| self.failure(&e))?;
            *guard = Some(client);
        }
        Ok(Connection {
            server: self,
            guard,
        })
    }

    fn failure(&self, message: &str) -> Failure {
        Failure {
            addr: self.addr.clone(),
            message: message.to_owned(),
        }
    }
}

/// One connection, held for a request's commands on its server.
pub(super) struct Connection<'a> {
    server: &'a Server,
    guard: MutexGuard<'a, Option<Client>>,
}

impl Connection<'_> {
    /// Adds `by` to `key`'s count, creating it (expiring `expiry` from now) when missing:
    /// `incr`; on a miss, `add`; when another client's `add` came first, `incr` again. The
    /// count after.
    pub(super) async fn take(&mut self, key: &[u8], by: u64, expiry: u64) -> Result<u64, Failure> {
        let first = self.client()?.increment(key, by).await;
        if let Some(after) = self.answer(first)? {
            return Ok(after);
        }
        let value = by.to_string();
        let ttl = i64::try_from(expiry).unwrap_or(i64::MAX);
        let added = self
            .client()?
            .add(key, value.as_str(), Some(ttl), None)
            .await;
        if self.answer(added)?.is_some() {
            return Ok(by);
        }
        let again = self.client()?.increment(key, by).await;
        match self.answer(again)? {
            Some(after) => Ok(after),
            None => Err(self.fail("the key vanished between add and incr")),
        }
    }

    /// Takes `by` off `key`'s count (never below 0): `decr`. The count after; `None` when
    /// the key is gone (expired with its window).
    pub(super) async fn give_back(&mut self, key: &[u8], by: u64) -> Result<Option<u64>, Failure> {
        let result = self.client()?.decrement(key, by).await;
        self.answer(result)
    }

    /// `key`'s count: `get`; 0 when missing.
    pub(super) async fn read(&mut self, key: &[u8]) -> Result<u64, Failure> {
        let result = self.client()?.get(key).await;
        let value = self.answer(result)?.flatten();
        let Some(data) = value.and_then(|v| v.data) else {
            return Ok(0);
        };
        std::str::from_utf8(&data)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| self.fail("a counter that is not a number"))
    }

    fn client(&mut self) -> Result<&mut Client, Failure> {
        let server = self.server;
        self.guard
            .as_mut()
            .ok_or_else(|| server.failure("not connected"))
    }

    /// A command's result. `Ok(None)`: memcached answered NOT_FOUND or NOT_STORED. Any other
    /// error drops the connection (its state is unknown); the next request opens another.
    fn answer<T>(&mut self, result: Result<T, Error>) -> Result<Option<T>, Failure> {
        match result {
            Ok(v) => Ok(Some(v)),
            Err(Error::Protocol(Status::NotFound | Status::NotStored)) => Ok(None),
            Err(e) => Err(self.fail(&e.to_string())),
        }
    }

    fn fail(&mut self, message: &str) -> Failure {
        *self.guard = None;
        self.server.failure(message)
    }
}

/// The Memcached key of a state key's window: `prefix`, the state key with every byte that
/// Memcached refuses in a key (space, control characters) and `%` written as `%XX`, `:`,
/// and the window's start in seconds. A key longer than Memcached's 250 bytes becomes
/// `prefix` `#` and the SHA-256 of the long form, in hex.
pub(super) fn key(prefix: &[u8], state_key: &[u8], window_start_secs: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + state_key.len() + 24);
    out.extend_from_slice(prefix);
    for &b in state_key {
        if b <= b' ' || b == 0x7f || b == b'%' {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out.push(b':');
    out.extend_from_slice(window_start_secs.to_string().as_bytes());
    if out.len() <= MAX_KEY {
        return out;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, &out);
    let mut short = prefix.to_vec();
    short.push(b'#');
    for b in digest.as_ref() {
        short.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    short
}

/// The expiry to give a window's key at `now_nanos` when the window ends at `end_nanos`
/// (both Unix time): a second past the end, as Memcached reads it (seconds from now up to 30
/// days, a Unix time beyond).
pub(super) fn expiry(now_nanos: u64, end_nanos: u64) -> u64 {
    let left = end_nanos.saturating_sub(now_nanos).div_ceil(1_000_000_000) + 1;
    if left <= RELATIVE_EXPIRY_MAX {
        left
    } else {
        end_nanos.div_ceil(1_000_000_000) + 1
    }
}

/// The server of `key` among `n`: FNV-1a of the key, modulo `n` (the same on every replica
/// that lists the same servers in the same order).
pub(super) fn server_of(key: &[u8], n: usize) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    usize::try_from(hash % n.max(1) as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_what_memcached_refuses_and_stay_distinct() {
        assert_eq!(key(b"s:", b"d|a b", 60), b"s:d|a%20b:60");
        assert_eq!(key(b"s:", b"d|a%20b", 60), b"s:d|a%2520b:60");
        assert_ne!(key(b"s:", b"x\n", 0), key(b"s:", b"x\r", 0));
        let long = key(b"s:", &[b'a'; 300], 0);
        assert_eq!(long.len(), 2 + 1 + 64);
        assert_ne!(long, key(b"s:", &[b'b'; 300], 0));
    }

    #[test]
    fn expiry_is_relative_up_to_thirty_days() {
        const SEC: u64 = 1_000_000_000;
        assert_eq!(expiry(10 * SEC, 60 * SEC), 51);
        assert_eq!(expiry(10 * SEC + 1, 60 * SEC), 51);
        let year_end = 2_000_000_000 * SEC;
        assert_eq!(
            expiry(year_end - 100 * 86_400 * SEC, year_end),
            2_000_000_001
        );
    }

    #[test]
    fn a_key_picks_one_server() {
        let k = b"sluice:d|a=1:60";
        assert_eq!(server_of(k, 3), server_of(k, 3));
        assert!(server_of(k, 3) < 3);
        assert_eq!(server_of(k, 1), 0);
    }
}
