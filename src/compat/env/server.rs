//! Where sluice listens, how it logs, TLS on the gRPC port, and where its rules come from
//! (files or xDS).

use super::{Reader, Unsupported};

impl Reader<'_> {
    pub(super) fn listeners(&mut self) -> Result<(), Unsupported> {
        for (host, port, dh, dp, key) in [
            (
                "GRPC_HOST",
                "GRPC_PORT",
                "0.0.0.0",
                "8081",
                "SERVER__GRPC_LISTEN",
            ),
            ("HOST", "PORT", "0.0.0.0", "8080", "SERVER__ADMIN_LISTEN"),
            (
                "DEBUG_HOST",
                "DEBUG_PORT",
                "0.0.0.0",
                "6070",
                "DEBUG__LISTEN",
            ),
        ] {
            // A Unix socket instead of GRPC_HOST:GRPC_PORT, as there.
            let uds = self.get("GRPC_UDS").filter(|_| host == "GRPC_HOST");
            let addr = match uds {
                Some(path) => format!("unix:{path}"),
                None => self.address(host, port, dh, dp)?,
            };
            self.set(key, addr);
        }
        // envoyproxy/ratelimit answers `/json` on its HTTP port to anyone, as its gRPC port;
        // its users' callers rely on that (docs/security.md#the-drop-ins). A setting below
        // the environment: SLUICE_ADMIN__OPEN_DECISIONS=false closes it.
        self.set("ADMIN__OPEN_DECISIONS", "true");
        Ok(())
    }

    /// `host` and `port` as a socket address (`localhost` is 127.0.0.1; another host name is
    /// looked up once, its first IPv4 address taken, else its first address, as Go's
    /// `net.Listen` listens on one of them).
    fn address(&self, host: &str, port: &str, dh: &str, dp: &str) -> Result<String, Unsupported> {
        let name = self.or(host, dh);
        let ip = match ip(name) {
            Some(ip) => ip,
            None => resolve(name).ok_or_else(|| {
                self.unsupported(host, "not an IP address, and the name does not resolve")
            })?,
        };
        let p: u16 = self
            .or(port, dp)
            .parse()
            .map_err(|_| self.unsupported(port, "expected a port number"))?;
        Ok(std::net::SocketAddr::new(ip, p).to_string())
    }

    pub(super) fn log(&mut self) -> Result<(), Unsupported> {
        let level = match self.or("LOG_LEVEL", "WARN").to_ascii_lowercase().as_str() {
            // sluice's own debug lines, not those of every library (HTTP/2 frames...).
            "trace" => "info,sluice=trace",
            "debug" => "info,sluice=debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => {
                return Err(self.unsupported(
                    "LOG_LEVEL",
                    "expected trace, debug, info, warn, error, fatal or panic",
                ));
            }
        };
        self.set("LOG__LEVEL", level);
        match self.or("LOG_FORMAT", "text") {
            "text" => self.set("LOG__FORMAT", "text"),
            "json" => self.set("LOG__FORMAT", "json"),
            _ => return Err(self.unsupported("LOG_FORMAT", "expected text or json")),
        }
        Ok(())
    }

    pub(super) fn tls(&mut self) -> Result<(), Unsupported> {
        if !self.flag("GRPC_SERVER_USE_TLS", false)? {
            return Ok(());
        }
        for (name, key) in [
            ("GRPC_SERVER_TLS_CERT", "TLS__CERT_FILE"),
            ("GRPC_SERVER_TLS_KEY", "TLS__KEY_FILE"),
        ] {
            let Some(v) = self.get(name).map(str::to_owned) else {
                return Err(self.unsupported(name, "GRPC_SERVER_USE_TLS=true needs it"));
            };
            self.set(key, v);
        }
        let ca = self.get("GRPC_CLIENT_TLS_CACERT").map(str::to_owned);
        let san = self.get("GRPC_CLIENT_TLS_SAN").map(str::to_owned);
        match (ca, san) {
            (Some(ca), san) => {
                self.set("TLS__CLIENT_CA_FILE", ca);
                if let Some(san) = san {
                    self.set("TLS__CLIENT_SAN", san);
                }
            }
            (None, Some(san)) => self.out.ignored.push((
                "GRPC_CLIENT_TLS_SAN".to_owned(),
                format!(
                    "{san}: no client certificate is asked for without GRPC_CLIENT_TLS_CACERT, so there is no name to check (as in envoyproxy/ratelimit)"
                ),
            )),
            (None, None) => {}
        }
        Ok(())
    }

    pub(super) fn rules(&mut self) -> Result<(), Unsupported> {
        if self.flag("MERGE_DOMAIN_CONFIG", false)? {
            self.set("RULES__MERGE_DOMAINS", "true");
        }
        match self.or("CONFIG_TYPE", "FILE").to_ascii_uppercase().as_str() {
            "FILE" => {
                let root = self
                    .or("RUNTIME_ROOT", "/srv/runtime_data/current")
                    .to_owned();
                let sub = self.or("RUNTIME_SUBDIRECTORY", "").to_owned();
                let app = self.or("RUNTIME_APPDIRECTORY", "config").to_owned();
                let mut path = std::path::PathBuf::from(root);
                for part in [sub, app] {
                    if !part.is_empty() {
                        path.push(part);
                    }
                }
                self.set("RULES__PATHS", path.display().to_string());
            }
            "GRPC_XDS_SOTW" => self.xds()?,
            _ => return Err(self.unsupported("CONFIG_TYPE", "expected FILE or GRPC_XDS_SOTW")),
        }
        Ok(())
    }

    pub(super) fn xds(&mut self) -> Result<(), Unsupported> {
        let server = self
            .or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")
            .to_owned();
        self.set("XDS__SERVER", server);
        let node = self.or("CONFIG_GRPC_XDS_NODE_ID", "default").to_owned();
        self.set("XDS__NODE_ID", node);
        for (name, key) in [
            ("CONFIG_GRPC_XDS_NODE_METADATA", "XDS__NODE_METADATA"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "XDS__HEADERS"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "XDS__CERT_FILE"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "XDS__KEY_FILE"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "XDS__CA_FILE"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "XDS__SERVER_NAME"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "XDS__MAX_MESSAGE_BYTES"),
        ] {
            if let Some(v) = self.get(name).map(str::to_owned) {
                self.set(key, v);
            }
        }
        if self.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
            self.set("XDS__TLS", "true");
        }
        if self.flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)? {
            self.set("XDS__START_WITHOUT_RULES", "true");
        }
        if let Some(ms) = self.duration_ms("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")? {
            self.set("XDS__RETRY_INITIAL_MS", ms.max(1).to_string());
        }
        if let Some(ms) = self.duration_ms("XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
            self.set("XDS__RETRY_MAX_MS", ms.max(1).to_string());
        }
        Ok(())
    }
}

/// An IP address, `[v6]`, or `localhost` (127.0.0.1).
/// The address a listener on host name `name` takes: its first IPv4 address, else its
/// first; none when the name does not resolve.
pub(super) fn resolve(name: &str) -> Option<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let all: Vec<std::net::IpAddr> = (name, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied()
}

pub(super) fn ip(host: &str) -> Option<std::net::IpAddr> {
    if host == "localhost" {
        return Some(std::net::IpAddr::from([127, 0, 0, 1]));
    }
    host.trim_matches(|c| c == '[' || c == ']').parse().ok()
}
