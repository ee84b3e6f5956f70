//! Throttle state keys: apart from every RLS key, and injective.
//!
//! ```text
//! throttle:{<key>}:<algorithm>:<period>ms
//! throttle:{user:42}:funnel:60000ms
//! ```
//!
//! RLS state keys start with `{` (see [`crate::rules::key`]); these start with `throttle:`, so
//! the two keyspaces never meet, in memory or in Redis (where the backend's prefix comes in
//! front of both). In the caller's key, `%`, `{` and `}` are written `%25`, `%7B` and `%7D`,
//! and every byte that is not part of valid UTF-8 `%XX`: the key part ends at the first `}`,
//! so two different keys (or periods, or algorithms) never share a state, and the braces are
//! the Redis Cluster hash tag (one key, one slot).

use std::fmt::Write as _;
use std::sync::Arc;

use crate::config::model::Algorithm;

/// The state key of a Throttle key with an algorithm and a period.
///
/// ```
/// use sluice::config::model::Algorithm;
/// use sluice::throttle::key::state_key;
///
/// assert_eq!(&*state_key(b"user:42", Algorithm::Funnel, 60_000), b"throttle:{user:42}:funnel:60000ms");
/// assert_eq!(&*state_key(b"a}b\xff", Algorithm::FixedWindow, 1), b"throttle:{a%7Db%FF}:fixed_window:1ms");
/// ```
pub fn state_key(key: &[u8], algorithm: Algorithm, period_ms: u64) -> Arc<[u8]> {
    let mut out = String::with_capacity(key.len() + 40);
    out.push_str("throttle:{");
    for chunk in key.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '%' => out.push_str("%25"),
                '{' => out.push_str("%7B"),
                '}' => out.push_str("%7D"),
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    let _ = write!(out, "}}:{}:{period_ms}ms", algorithm.as_str());
    Arc::from(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::key::hash_tag;

    #[test]
    fn escapes_make_it_injective() {
        let k = |key: &[u8]| state_key(key, Algorithm::Funnel, 1000);
        assert_ne!(k(b"%7D"), k(b"}"));
        assert_eq!(&*k(b"%"), b"throttle:{%25}:funnel:1000ms");
        assert_ne!(k(b"a}:funnel:1000ms"), k(b"a"));
        assert_ne!(
            state_key(b"a", Algorithm::Funnel, 1),
            state_key(b"a", Algorithm::TokenBucket, 1)
        );
        assert_ne!(
            state_key(b"a", Algorithm::Funnel, 1),
            state_key(b"a", Algorithm::Funnel, 10)
        );
    }

    #[test]
    fn never_an_rls_key_and_one_slot_per_key() {
        let key = state_key("dé{".as_bytes(), Algorithm::Funnel, 5);
        assert!(!key.starts_with(b"{"), "RLS keys start with a brace");
        assert_eq!(hash_tag(&key), "dé%7B".as_bytes());
        assert!(std::str::from_utf8(&state_key(&[0xff, 0xfe], Algorithm::Funnel, 5)).is_ok());
    }
}
