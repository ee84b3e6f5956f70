//! `[redis]`: where the Redis backend is and how it behaves when Redis fails. The URL may
//! hold a password: `Debug` and the errors here never show it.

use std::path::PathBuf;

use serde::Deserialize;

/// What the Redis backend answers when Redis fails (or its circuit breaker is open).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// gRPC `UNAVAILABLE`, so that Envoy's `failure_mode_deny` decides.
    #[default]
    Error,
    /// Admit every limit.
    Allow,
    /// Deny every limit.
    Deny,
    /// Decide with an in-process limiter until Redis is back.
    Local,
}

/// `redis.leases`: whether a replica leases a share of a busy key's capacity and decides it
/// locally (docs/redis.md, "Leases").
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    #[default]
    Off,
    On,
}

/// `redis.global_on_error`: what a region answers for a global limit once it is cut off from
/// the home Redis and has spent the share it held (docs/regions.md).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GlobalOnError {
    /// Deny: never over the limit.
    #[default]
    Deny,
    /// Admit up to `global_share_percent` of the limit per period, counted in this region's
    /// Redis: over-admits by at most regions x percent of the limit per period.
    Share,
}

/// `[redis]`: the Redis backend (see docs/redis.md). Its `Debug` hides the URL's password.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://`, `rediss://`, `redis+sentinel://.../master`, `redis+cluster://...`.
    pub url: String,
    /// Put in front of every state key; must not contain `{`.
    pub prefix: String,
    /// Time to establish a connection.
    pub connect_timeout_ms: u64,
    /// Time one request may wait for Redis, connecting included.
    pub timeout_ms: u64,
    pub on_error: OnError,
    /// Consecutive failures that open the circuit breaker (0 = never).
    pub breaker_failures: u32,
    /// How long an open breaker answers from `on_error` before probing Redis again.
    pub breaker_cooldown_ms: u64,
    /// Denied keys answered locally until their retry time (0 = no deny cache).
    pub deny_cache_size: usize,
    /// Off (the default): the limiter's Lua is a script, called with `EVALSHA`. On: a
    /// function library, loaded once with `FUNCTION LOAD` and called with `FCALL` (Redis 7+;
    /// back to the script where Redis refuses functions).
    pub functions: bool,
    /// Connections to Redis (lanes of group commit: each has at most one script call in
    /// flight, which carries every request that queued meanwhile).
    pub connections: usize,
    /// CA certificates (PEM) that Redis's certificate must chain to, instead of the system's
    /// roots (TLS URLs only).
    pub tls_ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM) presented to Redis (mTLS); goes with `tls_key_file`.
    pub tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub tls_key_file: Option<PathBuf>,
    /// Accept a certificate whatever names it carries, the chain still verified: against
    /// `tls_ca_file` when given, else against the system's roots (logged at warn: any
    /// certificate those CAs signed, for any name, is then accepted). With Sentinel, for the
    /// sentinels and the master.
    pub tls_skip_hostname_verification: bool,
    /// After each script call, wait until this many replicas of the master that ran it have
    /// its writes (`WAIT`), so that a failover does not lose them (0 = do not wait: Redis's
    /// asynchronous replication).
    pub wait_replicas: u32,
    /// How long one `WAIT` may take; below `timeout_ms`. An answer is still given when fewer
    /// replicas confirmed in time (counted as the `wait_short` backend event).
    pub wait_timeout_ms: u64,
    /// Limits whose period is one second live in this Redis instead (envoyproxy/ratelimit's
    /// `REDIS_PERSECOND_URL`): the same URL forms, and every other `redis.*` setting applies
    /// to it as to `url` (docs/redis.md, "Per-second limits in a Redis of their own").
    pub per_second_url: Option<String>,
    /// With a Sentinel URL: the password sluice gives the sentinels themselves (`AUTH`), apart
    /// from the master's in the URL. None: the sentinels are asked without one.
    pub sentinel_password: Option<String>,
    /// With `sentinel_password`: the sentinels' ACL user (none: `default`).
    pub sentinel_username: Option<String>,
    /// With a Sentinel `per_second_url`: the password for its sentinels
    /// (`REDIS_PERSECOND_SENTINEL_AUTH`). None: those of `sentinel_password`.
    pub per_second_sentinel_password: Option<String>,
    /// With `per_second_sentinel_password`: its ACL user.
    pub per_second_sentinel_username: Option<String>,
    /// `on`: a replica takes leases on its busy keys and decides them locally (exact: Redis
    /// counts leased units as spent at the lease's expiry); `off` (the default): every
    /// decision is a script call.
    pub leases: LeaseMode,
    /// A lease covers about this many milliseconds of a key's traffic on this replica.
    pub lease_horizon_ms: u64,
    /// A lease is valid at most this long: what a replica that dies can hold back.
    pub lease_validity_ms: u64,
    /// A lease holds at most this share of the limit's burst (of its quota, for windows), in
    /// percent (1 to 50).
    pub lease_burst_percent: u64,
    /// A key is leased from this many units a second on this replica.
    pub lease_min_rate: u64,
    /// The home Redis of `scope: global` limits (same URL forms as `url`): it holds their
    /// state and lends shares of them to each region's Redis (docs/regions.md). None: no
    /// limit may be global.
    pub global_url: Option<String>,
    /// This region's name (needed with `global_url`): the lessee in the home Redis's records.
    pub region: Option<String>,
    /// Cut off from home with its share spent: `deny` (the default) or `share`.
    pub global_on_error: GlobalOnError,
    /// With `global_on_error = "share"`: the percent of a limit each region admits per period
    /// on its own while home is unreachable (1 to 100).
    pub global_share_percent: u64,
    /// A share covers about this many milliseconds of the region's observed traffic.
    pub global_share_ms: u64,
    /// A share may be spent at most this long (what a cut-off or dead region holds back).
    pub global_lease_ms: u64,
}

impl Default for RedisSettings {
    fn default() -> Self {
        RedisSettings {
            url: "redis://127.0.0.1:6379".to_owned(),
            prefix: "sluice:".to_owned(),
            connect_timeout_ms: 500,
            timeout_ms: 100,
            on_error: OnError::Error,
            breaker_failures: 3,
            breaker_cooldown_ms: 500,
            deny_cache_size: 100_000,
            functions: false,
            connections: 1,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_skip_hostname_verification: false,
            wait_replicas: 0,
            wait_timeout_ms: 50,
            per_second_url: None,
            sentinel_password: None,
            sentinel_username: None,
            per_second_sentinel_password: None,
            per_second_sentinel_username: None,
            leases: LeaseMode::Off,
            lease_horizon_ms: 20,
            lease_validity_ms: 100,
            lease_burst_percent: 10,
            lease_min_rate: 200,
            global_url: None,
            region: None,
            global_on_error: GlobalOnError::Deny,
            global_share_percent: 10,
            global_share_ms: 2_000,
            global_lease_ms: 10_000,
        }
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redacted_url(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("timeout_ms", &self.timeout_ms)
            .field("on_error", &self.on_error)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_cooldown_ms", &self.breaker_cooldown_ms)
            .field("deny_cache_size", &self.deny_cache_size)
            .field("functions", &self.functions)
            .field("connections", &self.connections)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field(
                "tls_skip_hostname_verification",
                &self.tls_skip_hostname_verification,
            )
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_timeout_ms", &self.wait_timeout_ms)
            .field(
                "per_second_url",
                &self.per_second_url.as_deref().map(redacted_url),
            )
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "<redacted>"),
            )
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "per_second_sentinel_password",
                &self
                    .per_second_sentinel_password
                    .as_ref()
                    .map(|_| "<redacted>"),
            )
            .field(
                "per_second_sentinel_username",
                &self.per_second_sentinel_username,
            )
            .field("leases", &self.leases)
            .field("lease_horizon_ms", &self.lease_horizon_ms)
            .field("lease_validity_ms", &self.lease_validity_ms)
            .field("lease_burst_percent", &self.lease_burst_percent)
            .field("lease_min_rate", &self.lease_min_rate)
            .field("global_url", &self.global_url.as_deref().map(redacted_url))
            .field("region", &self.region)
            .field("global_on_error", &self.global_on_error)
            .field("global_share_percent", &self.global_share_percent)
            .field("global_share_ms", &self.global_share_ms)
            .field("global_lease_ms", &self.global_lease_ms)
            .finish()
    }
}

impl RedisSettings {
    /// The settings of the per-second Redis (`per_second_url`), if there is one: these, with
    /// its URL.
    pub fn per_second(&self) -> Option<RedisSettings> {
        let url = self.per_second_url.as_ref()?;
        let (sentinel_password, sentinel_username) = match &self.per_second_sentinel_password {
            Some(password) => (
                Some(password.clone()),
                self.per_second_sentinel_username.clone(),
            ),
            None => (
                self.sentinel_password.clone(),
                self.sentinel_username.clone(),
            ),
        };
        Some(RedisSettings {
            url: url.clone(),
            per_second_url: None,
            sentinel_password,
            sentinel_username,
            per_second_sentinel_password: None,
            per_second_sentinel_username: None,
            ..self.clone()
        })
    }

    /// Whether any `tls_*` setting is given.
    pub fn has_tls_settings(&self) -> bool {
        self.tls_ca_file.is_some()
            || self.tls_cert_file.is_some()
            || self.tls_key_file.is_some()
            || self.tls_skip_hostname_verification
    }

    /// Checks `wait_timeout_ms` against `timeout_ms`: the wait is part of the request's time.
    pub(super) fn check_wait(&self) -> Result<(), String> {
        if self.wait_replicas > 0 && self.wait_timeout_ms >= self.timeout_ms {
            return Err(format!(
                "redis.wait_timeout_ms ({}) must be below redis.timeout_ms ({}): the wait for \
                 replicas is part of the time a request may wait for Redis",
                self.wait_timeout_ms, self.timeout_ms
            ));
        }
        Ok(())
    }

    /// Checks that the `sentinel_*` settings go with a Sentinel URL, the user with a password.
    pub(super) fn check_sentinel(&self) -> Result<(), String> {
        let is_sentinel = |url: &str| {
            url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
        };
        let sentinel = is_sentinel(&self.url);
        if self.per_second_sentinel_password.is_some()
            && !self.per_second_url.as_deref().is_some_and(is_sentinel)
        {
            return Err(
                "redis.per_second_sentinel_password needs a Sentinel per_second_url \
                        (redis+sentinel:// or rediss+sentinel://)"
                    .to_owned(),
            );
        }
        if self.per_second_sentinel_username.is_some()
            && self.per_second_sentinel_password.is_none()
        {
            return Err(
                "redis.per_second_sentinel_username needs redis.per_second_sentinel_password"
                    .to_owned(),
            );
        }
        if self.sentinel_password.is_some() && !sentinel {
            return Err("redis.sentinel_password needs a Sentinel URL \
                        (redis+sentinel:// or rediss+sentinel://)"
                .to_owned());
        }
        if self.sentinel_username.is_some() && self.sentinel_password.is_none() {
            return Err("redis.sentinel_username needs redis.sentinel_password".to_owned());
        }
        Ok(())
    }

    /// Checks the `global_*` settings and `region`: a region named (letters, digits, `-`,
    /// `_`, `.`) when `global_url` is set, sizes within their ranges.
    pub(super) fn check_global(&self) -> Result<(), String> {
        let Some(url) = &self.global_url else {
            return Ok(());
        };
        if url.is_empty() {
            return Err(
                "redis.global_url must not be empty (leave it out for no home Redis)".into(),
            );
        }
        check_userinfo(url).map_err(|e| e.replace("redis.url", "redis.global_url"))?;
        let region = self.region.as_deref().unwrap_or("");
        if region.is_empty() {
            return Err(
                "redis.region must name this region when redis.global_url is set: the home \
                 Redis lends shares to regions by name"
                    .into(),
            );
        }
        let named = region.len() <= 64
            && region
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !named {
            return Err(format!(
                "redis.region ({region:?}) must be 1 to 64 letters, digits, '-', '_' or '.'"
            ));
        }
        if !(1..=100).contains(&self.global_share_percent) {
            return Err(format!(
                "redis.global_share_percent ({}) must be 1 to 100",
                self.global_share_percent
            ));
        }
        if !(100..=3_600_000).contains(&self.global_lease_ms) {
            return Err(format!(
                "redis.global_lease_ms ({}) must be 100 to 3600000",
                self.global_lease_ms
            ));
        }
        if !(1..=self.global_lease_ms).contains(&self.global_share_ms) {
            return Err(format!(
                "redis.global_share_ms ({}) must be 1 to redis.global_lease_ms ({})",
                self.global_share_ms, self.global_lease_ms
            ));
        }
        Ok(())
    }

    /// Checks the `lease_*` settings: a lease valid 1 ms to 1 s, covering 1 ms to its validity
    /// of traffic, holding 1 to 50% of the burst.
    pub(super) fn check_leases(&self) -> Result<(), String> {
        if !(1..=1_000).contains(&self.lease_validity_ms) {
            return Err(format!(
                "redis.lease_validity_ms ({}) must be 1 to 1000: a dead replica's leases hold \
                 capacity back that long",
                self.lease_validity_ms
            ));
        }
        if !(1..=self.lease_validity_ms).contains(&self.lease_horizon_ms) {
            return Err(format!(
                "redis.lease_horizon_ms ({}) must be 1 to redis.lease_validity_ms ({})",
                self.lease_horizon_ms, self.lease_validity_ms
            ));
        }
        if !(1..=50).contains(&self.lease_burst_percent) {
            return Err(format!(
                "redis.lease_burst_percent ({}) must be 1 to 50: one replica must not take the \
                 others' share",
                self.lease_burst_percent
            ));
        }
        Ok(())
    }

    /// Checks the `tls_*` settings against each other and the URL (the files are read when
    /// the backend is built).
    pub(super) fn check_tls(&self) -> Result<(), String> {
        if !self.has_tls_settings() {
            return Ok(());
        }
        let plain = |url: &str| !url.starts_with("rediss");
        if plain(&self.url) && self.per_second_url.as_deref().is_none_or(plain) {
            return Err(
                "redis.tls_*: the TLS settings need a TLS URL (rediss://, rediss+sentinel:// \
                 or rediss+cluster://) in redis.url or redis.per_second_url"
                    .to_owned(),
            );
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("redis: tls_cert_file and tls_key_file go together".to_owned());
        }
        Ok(())
    }
}

/// `url` with the password of its `user:password@` part (everything up to the last `@`)
/// replaced, for logs and debug output.
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let Some((userinfo, hosts)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = userinfo.split_once(':').map_or("", |(user, _)| user);
    let sep = if scheme.is_empty() { "" } else { "://" };
    format!("{scheme}{sep}{user}:<redacted>@{hosts}")
}

/// Sentinel and Cluster URLs are split by hand at the first `/` after the hosts, so a
/// password holding a `/` would be cut there and shown in the parse error; refuse it without
/// quoting the URL.
pub(super) fn check_userinfo(url: &str) -> Result<(), String> {
    let hand_split = [
        "redis+sentinel://",
        "rediss+sentinel://",
        "redis+cluster://",
        "rediss+cluster://",
    ];
    let Some(rest) = hand_split
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
    else {
        return Ok(());
    };
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    if rest.contains('@') && !authority.contains('@') {
        return Err(
            "redis.url: in a Sentinel or Cluster URL the user:password part must not \
                    contain '/' (the URL is not shown: it holds the password)"
                .to_owned(),
        );
    }
    Ok(())
}
