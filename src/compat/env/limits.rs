//! How limits are decided and answered: counting, shadow and quota mode, response headers
//! and metadata, the local cache.

use super::{Reader, Unsupported};

impl Reader<'_> {
    pub(super) fn behaviour(&mut self) -> Result<(), Unsupported> {
        // envoyproxy/ratelimit's counting: fixed windows, every cost added even past the
        // limit; STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT keeps denied costs out
        // (docs/token-budgets.md).
        self.set("LIMITS__DEFAULT_ALGORITHM", "fixed_window");
        let charge = if self.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)? {
            "admitted"
        } else {
            "always"
        };
        self.set("LIMITS__DEFAULT_CHARGE", charge);
        for (name, key) in [
            ("SHADOW_MODE", "RULES__SHADOW_MODE"),
            ("QUOTA_MODE", "LIMITS__QUOTA_MODE"),
            ("RESPONSE_DYNAMIC_METADATA", "RESPONSE__DYNAMIC_METADATA"),
        ] {
            if self.flag(name, false)? {
                self.set(key, "true");
            }
        }
        if self.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            self.set("RESPONSE__HEADERS", "true");
            // envoyproxy/ratelimit adds no Retry-After.
            self.set("RESPONSE__RETRY_AFTER", "false");
            for (name, key) in [
                ("LIMIT_LIMIT_HEADER", "RESPONSE__LIMIT_HEADER"),
                ("LIMIT_REMAINING_HEADER", "RESPONSE__REMAINING_HEADER"),
                ("LIMIT_RESET_HEADER", "RESPONSE__RESET_HEADER"),
            ] {
                if let Some(v) = self.get(name).map(str::to_owned) {
                    self.set(key, v);
                }
            }
        }
        if let Some(ratio) = self.get("NEAR_LIMIT_RATIO").map(str::to_owned) {
            self.set("METRICS__NEAR_LIMIT_RATIO", ratio);
        }
        if let Some(bytes) = self.get("LOCAL_CACHE_SIZE_IN_BYTES") {
            let bytes: u64 = bytes.parse().map_err(|_| {
                self.unsupported("LOCAL_CACHE_SIZE_IN_BYTES", "expected a number of bytes")
            })?;
            if bytes > 0 {
                // sluice's deny cache holds entries, not bytes: one per 128 bytes asked for.
                self.set("REDIS__DENY_CACHE_SIZE", (bytes / 128).max(1).to_string());
            }
        }
        Ok(())
    }
}
