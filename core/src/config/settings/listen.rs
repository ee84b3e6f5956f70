//! `server.grpc_listen`: a TCP address, or a Unix socket (`unix:/path`).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

/// Where a listener listens: `host:port`, or `unix:PATH` (also `unix://PATH`, gRPC's form for
/// an absolute path, `unix:///run/sluice.sock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl ListenAddr {
    /// The TCP address; none for a Unix socket.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ListenAddr::Tcp(addr) => Some(*addr),
            ListenAddr::Unix(_) => None,
        }
    }

    /// The socket file's path; none for TCP.
    pub fn unix(&self) -> Option<&Path> {
        match self {
            ListenAddr::Tcp(_) => None,
            ListenAddr::Unix(path) => Some(path),
        }
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(addr: SocketAddr) -> ListenAddr {
        ListenAddr::Tcp(addr)
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<ListenAddr, String> {
        if let Some(rest) = s.strip_prefix("unix:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(format!("'{s}': a Unix socket needs a path, unix:/path"));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("'{s}': expected an address (ip:port, [ipv6]:port) or unix:/path"))
    }
}

impl fmt::Display for ListenAddr {
    /// `ip:port`, or `unix:PATH`: what [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => addr.fmt(f),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ListenAddr, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_unix_forms_read_and_print_back() {
        for (text, want, shown) in [
            ("127.0.0.1:8081", None, "127.0.0.1:8081"),
            ("[::1]:0", None, "[::1]:0"),
            (
                "unix:/run/rl.sock",
                Some("/run/rl.sock"),
                "unix:/run/rl.sock",
            ),
            (
                "unix:///run/rl.sock",
                Some("/run/rl.sock"),
                "unix:/run/rl.sock",
            ),
            ("unix:rl.sock", Some("rl.sock"), "unix:rl.sock"),
        ] {
            let addr: ListenAddr = text.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(addr.unix(), want.map(Path::new), "{text}");
            assert_eq!(addr.tcp().is_some(), want.is_none(), "{text}");
            assert_eq!(addr.to_string(), shown);
            assert_eq!(addr.to_string().parse::<ListenAddr>(), Ok(addr));
        }
        for bad in ["unix:", "unix://", "localhost:80", "/run/rl.sock"] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }
}
