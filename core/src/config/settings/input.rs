//! `[input]`: the bounds on what one caller may send. The engine checks the shape of every
//! request against them (gRPC and `/json` alike); the gRPC server applies the size and stream
//! bounds before a request is decoded. docs/security.md explains the defaults.

use serde::Deserialize;

/// `[input]`: every bound is at least 1.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct InputSettings {
    /// Most descriptors in one request.
    pub max_descriptors: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Longest domain, in bytes.
    pub max_domain_bytes: usize,
    /// Longest entry key, in bytes.
    pub max_key_bytes: usize,
    /// Longest entry value, in bytes.
    pub max_value_bytes: usize,
    /// Largest encoded request (the gRPC message, or the `/json` body), in bytes.
    pub max_request_bytes: usize,
    /// Most concurrent HTTP/2 streams (requests in flight) on one gRPC connection.
    pub max_concurrent_streams: u32,
}

impl Default for InputSettings {
    fn default() -> Self {
        InputSettings {
            max_descriptors: 64,
            max_entries: 32,
            max_domain_bytes: 256,
            max_key_bytes: 256,
            max_value_bytes: 16 * 1024,
            max_request_bytes: 1024 * 1024,
            max_concurrent_streams: 1024,
        }
    }
}

impl InputSettings {
    /// Names every bound that is 0 (a bound of 0 would refuse every request).
    pub fn check(&self) -> Result<(), String> {
        let zero = super::zero_names([
            ("max_descriptors", self.max_descriptors as u64),
            ("max_entries", self.max_entries as u64),
            ("max_domain_bytes", self.max_domain_bytes as u64),
            ("max_key_bytes", self.max_key_bytes as u64),
            ("max_value_bytes", self.max_value_bytes as u64),
            ("max_request_bytes", self.max_request_bytes as u64),
            ("max_concurrent_streams", self.max_concurrent_streams as u64),
        ]);
        if zero.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "input.{} must be at least 1",
                zero.join(", input.")
            ))
        }
    }
}
