//! The backend: Redis (its URL forms, auth and TLS) or memory.

use super::{Reader, Unsupported};

impl Reader<'_> {
    pub(super) fn backend(&mut self) -> Result<(), Unsupported> {
        match self.or("BACKEND_TYPE", "redis") {
            "redis" => {}
            _ => {
                return Err(self.unsupported(
                    "BACKEND_TYPE",
                    "sluice's backends are memory and Redis, not Memcached",
                ));
            }
        }
        for name in ["MEMCACHE_HOST_PORT", "MEMCACHE_SRV", "MEMCACHE_TLS"] {
            self.refuse(name, "no Memcached backend")?;
        }
        self.refuse("REDIS_PERSECOND", "sluice keeps every limit in one Redis")?;
        self.sentinel_auth();
        self.set("LIMITER__BACKEND", "redis");
        let url = self.redis_url()?;
        self.set("REDIS__URL", url);
        self.redis_tls()?;
        if let Some(ms) = self.duration_ms("REDIS_TIMEOUT")? {
            self.set("REDIS__CONNECT_TIMEOUT_MS", ms.max(1).to_string());
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(str::to_owned) {
            self.set("REDIS__PREFIX", prefix);
        }
        Ok(())
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

    /// `REDIS_URL` (+ `REDIS_SOCKET_TYPE`, `REDIS_TYPE`, `REDIS_AUTH`, `REDIS_TLS`) as one URL.
    fn redis_url(&self) -> Result<String, Unsupported> {
        let url = self.or("REDIS_URL", "/var/run/nutcracker/ratelimit.sock");
        let tls = self.flag("REDIS_TLS", false)?;
        let auth = match self.get("REDIS_AUTH") {
            None => String::new(),
            Some(a) => match a.split_once(':') {
                Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
                None => format!(":{}@", encode(a)),
            },
        };
        let s = if tls { "s" } else { "" };
        let kind = self.or("REDIS_TYPE", "SINGLE").to_ascii_lowercase();
        match kind.as_str() {
            "single" => {
                if self
                    .or("REDIS_SOCKET_TYPE", "unix")
                    .eq_ignore_ascii_case("unix")
                {
                    if tls || !auth.is_empty() {
                        return Err(self.unsupported(
                            "REDIS_SOCKET_TYPE",
                            "sluice takes no TLS or password over a Unix socket",
                        ));
                    }
                    return Ok(format!("unix://{url}"));
                }
                Ok(format!("redis{s}://{auth}{url}"))
            }
            "sentinel" => {
                let mut parts = url.split(',');
                let master = parts.next().unwrap_or_default();
                let sentinels: Vec<&str> = parts.collect();
                if master.is_empty() || sentinels.is_empty() {
                    return Err(self.unsupported(
                        "REDIS_URL",
                        "with REDIS_TYPE=sentinel: <master name>,<sentinel1>,...,<sentinelN>",
                    ));
                }
                Ok(format!(
                    "redis{s}+sentinel://{auth}{}/{master}",
                    sentinels.join(",")
                ))
            }
            "cluster" => Ok(format!("redis{s}+cluster://{auth}{url}")),
            _ => Err(self.unsupported("REDIS_TYPE", "expected single, sentinel or cluster")),
        }
    }

    /// The files of `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`,
    /// and `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: read only with `REDIS_TLS=true`, and the
    /// client certificate only with its key, as envoyproxy/ratelimit reads them.
    fn redis_tls(&mut self) -> Result<(), Unsupported> {
        const FILES: [(&str, &str); 3] = [
            ("REDIS_TLS_CACERT", "REDIS__TLS_CA_FILE"),
            ("REDIS_TLS_CLIENT_CERT", "REDIS__TLS_CERT_FILE"),
            ("REDIS_TLS_CLIENT_KEY", "REDIS__TLS_KEY_FILE"),
        ];
        const SKIP: &str = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION";
        let skip = self.flag(SKIP, false)?;
        if !self.flag("REDIS_TLS", false)? {
            for name in FILES.map(|(name, _)| name).into_iter().chain([SKIP]) {
                if let Some(v) = self.get(name).map(str::to_owned) {
                    let why = format!("{v}: REDIS_TLS is off, so Redis is reached without TLS");
                    self.out.ignored.push((name.to_owned(), why));
                }
            }
            return Ok(());
        }
        let has_pair = self.get(FILES[1].0).is_some() && self.get(FILES[2].0).is_some();
        for (i, (name, key)) in FILES.into_iter().enumerate() {
            let Some(v) = self.get(name).map(str::to_owned) else {
                continue;
            };
            if i == 0 || has_pair {
                self.set(key, v);
            } else {
                let why = format!(
                    "{v}: the client certificate and key go together, and one is not set, so \
                     none is presented to Redis"
                );
                self.out.ignored.push((name.to_owned(), why));
            }
        }
        if skip {
            if self.get(FILES[0].0).is_none() {
                return Err(self.unsupported(
                    SKIP,
                    "sluice skips the name check only for certificates signed by the CA of \
                     REDIS_TLS_CACERT (otherwise any certificate a public CA signed, for any \
                     name, would be accepted); set REDIS_TLS_CACERT",
                ));
            }
            if self
                .or("REDIS_TYPE", "SINGLE")
                .eq_ignore_ascii_case("sentinel")
            {
                return Err(self.unsupported(
                    SKIP,
                    "sluice cannot skip the name check with REDIS_TYPE=sentinel",
                ));
            }
            self.set("REDIS__TLS_SKIP_HOSTNAME_VERIFICATION", "true");
        }
        Ok(())
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
