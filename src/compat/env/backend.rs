//! The backend: Redis (its URL forms, auth and TLS, and the per-second Redis of
//! `REDIS_PERSECOND`), or Memcached (`BACKEND_TYPE=memcache`).

use super::{Reader, Unsupported};

/// The Memcached variables, read only with `BACKEND_TYPE=memcache`.
const MEMCACHE: [&str; 9] = [
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "MEMCACHE_MAX_IDLE_CONNS",
];

/// The per-second Redis's variables, read only with `REDIS_PERSECOND=true`.
const PER_SECOND: [&str; 6] = [
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_SENTINEL_AUTH",
];

impl Reader<'_> {
    pub(super) fn backend(&mut self) -> Result<(), Unsupported> {
        match self.or("BACKEND_TYPE", "redis") {
            "redis" => self.redis_backend(),
            "memcache" => self.memcache_backend(),
            _ => Err(self.unsupported("BACKEND_TYPE", "expected redis or memcache")),
        }
    }

    fn redis_backend(&mut self) -> Result<(), Unsupported> {
        for name in MEMCACHE {
            self.unused(name, "BACKEND_TYPE is redis");
        }
        self.sentinel_auth();
        self.set("LIMITER__BACKEND", "redis");
        let url = self.redis_url("REDIS", "/var/run/nutcracker/ratelimit.sock")?;
        self.set("REDIS__URL", url);
        self.per_second()?;
        self.redis_tls()?;
        if let Some(ms) = self.duration_ms("REDIS_TIMEOUT")? {
            self.set("REDIS__CONNECT_TIMEOUT_MS", ms.max(1).to_string());
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(str::to_owned) {
            self.set("REDIS__PREFIX", prefix);
        }
        Ok(())
    }

    /// `REDIS_PERSECOND=true`: per-second limits in the Redis of `REDIS_PERSECOND_URL` (+
    /// `_SOCKET_TYPE`, `_TYPE`, `_AUTH`, `_TLS`), as `redis.per_second_url`.
    fn per_second(&mut self) -> Result<(), Unsupported> {
        if !self.flag("REDIS_PERSECOND", false)? {
            for name in PER_SECOND {
                self.unused(name, "REDIS_PERSECOND is off");
            }
            return Ok(());
        }
        if let Some(auth) = self.get("REDIS_PERSECOND_SENTINEL_AUTH").map(str::to_owned) {
            if self
                .or("REDIS_PERSECOND_TYPE", "SINGLE")
                .eq_ignore_ascii_case("sentinel")
            {
                let (user, password) = match auth.split_once(':') {
                    Some((user, password)) => (Some(user.to_owned()), password.to_owned()),
                    None => (None, auth),
                };
                if let Some(user) = user {
                    self.set("REDIS__PER_SECOND_SENTINEL_USERNAME", user);
                }
                self.set("REDIS__PER_SECOND_SENTINEL_PASSWORD", password);
            } else {
                let why = "<redacted>: only read with REDIS_PERSECOND_TYPE=sentinel".to_owned();
                self.out
                    .ignored
                    .push(("REDIS_PERSECOND_SENTINEL_AUTH".to_owned(), why));
            }
        }
        let url = self.redis_url(
            "REDIS_PERSECOND",
            "/var/run/nutcracker/ratelimitpersecond.sock",
        )?;
        self.set("REDIS__PER_SECOND_URL", url);
        Ok(())
    }

    /// `BACKEND_TYPE=memcache`: the servers of `MEMCACHE_HOST_PORT`, or of the SRV record
    /// `MEMCACHE_SRV` (looked up again every `MEMCACHE_SRV_REFRESH`).
    fn memcache_backend(&mut self) -> Result<(), Unsupported> {
        self.set("LIMITER__BACKEND", "memcache");
        self.memcache_tls()?;
        let hosts = self.get("MEMCACHE_HOST_PORT").map(str::to_owned);
        let srv = self.get("MEMCACHE_SRV").map(str::to_owned);
        match (hosts, srv) {
            (Some(_), Some(_)) => {
                return Err(self.unsupported(
                    "MEMCACHE_SRV",
                    "MEMCACHE_HOST_PORT is set too: name the servers one way, as envoyproxy/ratelimit requires",
                ));
            }
            (Some(servers), None) => {
                self.set("MEMCACHE__SERVERS", servers);
                self.unused("MEMCACHE_SRV_REFRESH", "MEMCACHE_SRV is not set");
            }
            (None, Some(srv)) => {
                let parts = crate::config::settings::MemcacheSettings {
                    srv: srv.clone(),
                    ..Default::default()
                };
                if let Some(Err(e)) = parts.srv_parts() {
                    return Err(self.unsupported("MEMCACHE_SRV", &e));
                }
                self.set("MEMCACHE__SRV", srv);
                if let Some(ms) = self.duration_ms("MEMCACHE_SRV_REFRESH")? {
                    self.set("MEMCACHE__SRV_REFRESH_MS", ms.to_string());
                }
            }
            (None, None) => {
                return Err(self.unsupported(
                    "BACKEND_TYPE",
                    "memcache needs its servers in MEMCACHE_HOST_PORT (host:port[,host:port...]) or MEMCACHE_SRV",
                ));
            }
        }
        if let Some(n) = self.get("MEMCACHE_MAX_IDLE_CONNS").map(str::to_owned) {
            match n.trim().parse::<usize>() {
                Ok(n) => self.set("MEMCACHE__CONNECTIONS", n.max(1).to_string()),
                Err(_) => {
                    return Err(self.unsupported("MEMCACHE_MAX_IDLE_CONNS", "expected a number"));
                }
            }
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(str::to_owned) {
            self.set("MEMCACHE__PREFIX", prefix);
        }
        Ok(())
    }

    /// `MEMCACHE_TLS=true`: TLS to every server, with `MEMCACHE_TLS_CACERT` (besides the
    /// system's roots), the client certificate and key (together, as there), and
    /// `MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION`.
    fn memcache_tls(&mut self) -> Result<(), Unsupported> {
        let on = self.flag("MEMCACHE_TLS", false)?;
        if on {
            self.set("MEMCACHE__TLS", "true");
        }
        self.tls_files(("MEMCACHE", "Memcached"), on)
    }

    /// The TLS variables of one backend (`prefix` `REDIS` or `MEMCACHE`, `what` it is called):
    /// `<prefix>_TLS_CACERT`, `_CLIENT_CERT` and `_CLIENT_KEY` (the certificate only with its
    /// key, as envoyproxy/ratelimit reads them) and `_SKIP_HOSTNAME_VERIFICATION`, into the
    /// `<prefix>__TLS_*` settings when `on`; otherwise each one set is ignored, saying why.
    fn tls_files(&mut self, (prefix, what): (&str, &str), on: bool) -> Result<(), Unsupported> {
        let skip_var = format!("{prefix}_TLS_SKIP_HOSTNAME_VERIFICATION");
        let skip = self.flag(&skip_var, false)?;
        let files = [
            ("CACERT", "CA_FILE"),
            ("CLIENT_CERT", "CERT_FILE"),
            ("CLIENT_KEY", "KEY_FILE"),
        ]
        .map(|(var, key)| {
            (
                format!("{prefix}_TLS_{var}"),
                format!("{prefix}__TLS_{key}"),
            )
        });
        if !on {
            let why = format!("{prefix}_TLS is off, so {what} is reached without TLS");
            for name in files.iter().map(|(name, _)| name).chain([&skip_var]) {
                self.unused(name, &why);
            }
            return Ok(());
        }
        let has_pair = self.get(&files[1].0).is_some() && self.get(&files[2].0).is_some();
        for (i, (name, key)) in files.iter().enumerate() {
            let Some(v) = self.get(name).map(str::to_owned) else {
                continue;
            };
            if i == 0 || has_pair {
                self.set(key, v);
            } else {
                let why = format!(
                    "the client certificate and key go together, and one is not set, so none \
                     is presented to {what}"
                );
                self.unused(name, &why);
            }
        }
        if skip {
            self.set(&format!("{prefix}__TLS_SKIP_HOSTNAME_VERIFICATION"), "true");
        }
        Ok(())
    }

    /// `name`, when set, goes to the ignored list: `why` it is not read.
    fn unused(&mut self, name: &str, why: &str) {
        if let Some(v) = self.get(name).map(str::to_owned) {
            self.out
                .ignored
                .push((name.to_owned(), format!("{v}: {why}")));
        }
    }

    /// `REDIS_SENTINEL_AUTH` (`password` or `user:password`, as `REDIS_AUTH`): the sentinels'
    /// own credentials, read with `REDIS_TYPE=sentinel` only (as envoyproxy/ratelimit).
    fn sentinel_auth(&mut self) {
        let Some(auth) = self.get("REDIS_SENTINEL_AUTH").map(str::to_owned) else {
            return;
        };
        if !self
            .or("REDIS_TYPE", "SINGLE")
            .eq_ignore_ascii_case("sentinel")
        {
            let why = "<redacted>: only read with REDIS_TYPE=sentinel".to_owned();
            self.out
                .ignored
                .push(("REDIS_SENTINEL_AUTH".to_owned(), why));
            return;
        }
        match auth.split_once(':') {
            Some((user, password)) => {
                self.set("REDIS__SENTINEL_USERNAME", user);
                self.set("REDIS__SENTINEL_PASSWORD", password);
            }
            None => self.set("REDIS__SENTINEL_PASSWORD", auth),
        }
    }

    /// `<var>_URL` (+ `<var>_SOCKET_TYPE`, `<var>_TYPE`, `<var>_AUTH`, `<var>_TLS`) as one
    /// URL, `var` being `REDIS` or `REDIS_PERSECOND`.
    fn redis_url(&self, var: &str, default_url: &str) -> Result<String, Unsupported> {
        let name = |suffix: &str| format!("{var}_{suffix}");
        let url = self.or(&name("URL"), default_url);
        let tls = self.flag(&name("TLS"), false)?;
        let credentials = self.get(&name("AUTH")).map(|a| match a.split_once(':') {
            Some((user, password)) => (Some(user), password),
            None => (None, a),
        });
        let auth = match credentials {
            None => String::new(),
            Some((Some(user), password)) => format!("{}:{}@", encode(user), encode(password)),
            Some((None, password)) => format!(":{}@", encode(password)),
        };
        let s = if tls { "s" } else { "" };
        let kind = self.or(&name("TYPE"), "SINGLE").to_ascii_lowercase();
        match kind.as_str() {
            "single" => {
                if self
                    .or(&name("SOCKET_TYPE"), "unix")
                    .eq_ignore_ascii_case("unix")
                {
                    if tls {
                        return Err(self.unsupported(
                            &name("TLS"),
                            "redis-server speaks TLS on its TCP tls-port only, never on its Unix \
                             socket: reach a TLS Redis over TCP (SOCKET_TYPE=tcp)",
                        ));
                    }
                    // The password (and user) as the socket URL's query, as Redis's clients
                    // read it there.
                    let query = match credentials {
                        None => String::new(),
                        Some((Some(user), password)) => {
                            format!("?user={}&pass={}", encode(user), encode(password))
                        }
                        Some((None, password)) => format!("?pass={}", encode(password)),
                    };
                    return Ok(format!("unix://{url}{query}"));
                }
                Ok(format!("redis{s}://{auth}{url}"))
            }
            "sentinel" => {
                let mut parts = url.split(',');
                let master = parts.next().unwrap_or_default();
                let sentinels: Vec<&str> = parts.collect();
                if master.is_empty() || sentinels.is_empty() {
                    return Err(self.unsupported(
                        &name("URL"),
                        &format!(
                            "with {var}_TYPE=sentinel: <master name>,<sentinel1>,...,<sentinelN>"
                        ),
                    ));
                }
                Ok(format!(
                    "redis{s}+sentinel://{auth}{}/{master}",
                    sentinels.join(",")
                ))
            }
            "cluster" => Ok(format!("redis{s}+cluster://{auth}{url}")),
            _ => Err(self.unsupported(&name("TYPE"), "expected single, sentinel or cluster")),
        }
    }

    /// The files of `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`,
    /// and `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: read only with `REDIS_TLS=true` (or
    /// `REDIS_PERSECOND_TLS=true` with `REDIS_PERSECOND`: both Redis share them), and the
    /// client certificate only with its key, as envoyproxy/ratelimit reads them.
    fn redis_tls(&mut self) -> Result<(), Unsupported> {
        let per_second_tls =
            self.flag("REDIS_PERSECOND", false)? && self.flag("REDIS_PERSECOND_TLS", false)?;
        let on = self.flag("REDIS_TLS", false)? || per_second_tls;
        self.tls_files(("REDIS", "Redis"), on)
    }
}

/// Percent-encodes what is not unreserved in a URL's user info.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
