//! Drop-in for envoyproxy/ratelimit where it runs today (Envoy Gateway, Istio's sample):
//! its stats under its names ([`stats`], sent by [`statsd`], served by [`prometheus`] as
//! [`mapper`] names them), its
//! debug port ([`serve`]), and its environment variables mapped onto sluice's settings
//! ([`env`]). See docs/ratelimit-compat.md.
//!
//! Drop-in for limitador: its command line and environment ([`limitador`]). See
//! docs/limitador-compat.md.

pub mod env;
pub mod limitador;
pub mod mapper;
pub mod prometheus;
pub mod serve;
pub mod stats;
pub mod statsd;
mod summary;

/// A duration as Go's `time.ParseDuration` writes it (`300ms`, `1.5s`, `1m30s`, `2h`; units
/// `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`; `0` alone): what envoyproxy/ratelimit's settings
/// and statsd_exporter's mapping files hold. `None` for anything else, negative included.
pub(crate) fn go_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let mut nanos = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(digits);
        let n: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        nanos += n * scale;
        rest = tail;
    }
    nanos
        .is_finite()
        .then(|| std::time::Duration::from_nanos(nanos.round().min(u64::MAX as f64) as u64))
}
