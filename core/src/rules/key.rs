//! State keys: an injective, escaped text encoding of what a limiter state belongs to.
//!
//! A state key is a descriptor part, then the algorithm and the period of one limit:
//!
//! ```text
//! {<domain>|<k1>=<v1>|<k2>=<v2>}:<algorithm>:<period seconds>
//! {api|remote_address=10.0.0.1|path=/login}:funnel:60
//! {files|path~/files/*}:funnel:1
//! ```
//!
//! Each level is `key=value` with the request's value, except a level whose matched rule has
//! `share_threshold`: it is `key~pattern`, so every value the wildcard matches shares one
//! state. The memory backend uses the key as is; the Redis backend puts its prefix in front.
//!
//! `%`, `{`, `}`, `|`, `=`, `~` and `:` in the domain, keys and values are written `%XX`
//! (upper-case hex), so the separators only ever appear as separators:
//!
//! - the encoding is injective: the domain ends at the first `|` or `}`, each level at the
//!   next one, its key at its `=` or `~`; the descriptor part ends at the first `}`, and
//!   the algorithm at the next `:`. (A `_` join, as envoyproxy/ratelimit's, makes
//!   `a` + `b_c` and `a_b` + `c` one key.)
//! - the first `{` and the first `}` of the key are the descriptor part's own, so its Redis
//!   Cluster hash tag is the whole descriptor: every limit of one descriptor lands in one
//!   slot. (The Redis prefix must not contain `{`.)
//!
//! Periods are written in whole seconds, which is what rules produce; a period that is not a
//! whole number of seconds is written `<nanoseconds>ns` so that the key stays injective.

use std::fmt::Write as _;
use std::sync::Arc;

use super::{Entry, Match};
use crate::config::model::Algorithm;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The descriptor part of a state key, braces included.
///
/// With `matched`, a level whose matched rule has `share_threshold` is written with the
/// pattern instead of the request value; without it (a limit override sent by the client)
/// every level uses the request value. Entries beyond the matched path, which a match built
/// from these entries never has, use the request value.
///
/// ```
/// use sluice_core::rules::Entry;
/// use sluice_core::rules::key::descriptor_part;
///
/// let entries = [Entry::new("remote_address", "10.0.0.1"), Entry::new("path", "/a|b")];
/// assert_eq!(
///     descriptor_part("api", &entries, None),
///     "{api|remote_address=10.0.0.1|path=/a%7Cb}",
/// );
/// assert_eq!(descriptor_part("a:b", &[], None), "{a%3Ab}");
/// ```
pub fn descriptor_part(domain: &str, entries: &[Entry], matched: Option<&Match<'_>>) -> String {
    let mut out = String::with_capacity(encoded_len_hint(domain, entries));
    out.push('{');
    escape_into(&mut out, domain);
    for (level, entry) in entries.iter().enumerate() {
        let shared = matched
            .and_then(|m| m.path().get(level))
            .and_then(|rule| rule.shared_pattern());
        out.push('|');
        escape_into(&mut out, &entry.key);
        match shared {
            Some(pattern) => {
                out.push('~');
                escape_into(&mut out, pattern);
            }
            None => {
                out.push('=');
                escape_into(&mut out, &entry.value);
            }
        }
    }
    out.push('}');
    out
}

/// The state key of one limit of a descriptor: its descriptor part, algorithm and period.
///
/// ```
/// use sluice_core::config::model::Algorithm;
/// use sluice_core::rules::Entry;
/// use sluice_core::rules::key::{descriptor_part, hash_tag, state_key};
///
/// let part = descriptor_part("api", &[Entry::new("user", "alice")], None);
/// let key = state_key(&part, Algorithm::Funnel, 60_000_000_000);
/// assert_eq!(&*key, b"{api|user=alice}:funnel:60");
/// assert_eq!(hash_tag(&key), b"api|user=alice");
/// ```
pub fn state_key(descriptor_part: &str, algorithm: Algorithm, period_nanos: u64) -> Arc<[u8]> {
    let algorithm = algorithm.as_str();
    let mut key = String::with_capacity(descriptor_part.len() + algorithm.len() + 24);
    key.push_str(descriptor_part);
    key.push(':');
    key.push_str(algorithm);
    key.push(':');
    push_period(&mut key, period_nanos);
    Arc::from(key.into_bytes())
}

/// What Redis Cluster hashes to choose a key's slot: the text between the first `{` and the
/// first `}` after it when that text is non-empty, else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let after = key.get(open + 1..).unwrap_or_default();
    match after.iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => after.get(..len).unwrap_or(key),
        _ => key,
    }
}

/// One level of a decoded state key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    pub key: String,
    /// The request's value, or the shared pattern when `shared`.
    pub value: String,
    /// Written `key~pattern`: a `share_threshold` level, whose value is the rule's pattern.
    pub shared: bool,
}

/// A state key read back: what [`descriptor_part`] and [`state_key`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub domain: String,
    pub levels: Vec<Level>,
    pub algorithm: Algorithm,
    pub period_nanos: u64,
}

impl Decoded {
    /// The levels as request entries (a shared level gives its pattern as the value, which
    /// the pattern's own wildcard matches).
    pub fn entries(&self) -> Vec<Entry> {
        let entries = self.levels.iter();
        entries.map(|l| Entry::new(&*l.key, &*l.value)).collect()
    }

    /// The state key these fields make.
    pub fn encode(&self) -> Arc<[u8]> {
        let mut part = String::from("{");
        escape_into(&mut part, &self.domain);
        if !self.levels.is_empty() {
            part.push('|');
            part.push_str(&self.descriptor());
        }
        part.push('}');
        state_key(&part, self.algorithm, self.period_nanos)
    }

    /// The descriptor part without its domain, for people: `k1=v1|k2~pattern`, escaped as in
    /// the key.
    pub fn descriptor(&self) -> String {
        let mut out = String::new();
        for (i, level) in self.levels.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            escape_into(&mut out, &level.key);
            out.push(if level.shared { '~' } else { '=' });
            escape_into(&mut out, &level.value);
        }
        out
    }
}

/// Why a key is not one of sluice's state keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a sluice state key: {0}")]
pub struct DecodeError(&'static str);

/// Reads a state key back (without the Redis prefix): the inverse of [`state_key`].
///
/// ```
/// use sluice_core::config::model::Algorithm;
/// use sluice_core::rules::key::decode;
///
/// let key = decode(b"{api|user=a%7Cb|path~/files/*}:funnel:60").unwrap();
/// assert_eq!(key.domain, "api");
/// assert_eq!(key.levels[0].value, "a|b");
/// assert!(key.levels[1].shared);
/// assert_eq!(key.algorithm, Algorithm::Funnel);
/// assert_eq!(key.period_nanos, 60_000_000_000);
/// ```
pub fn decode(key: &[u8]) -> Result<Decoded, DecodeError> {
    let key = std::str::from_utf8(key).map_err(|_| DecodeError("not UTF-8"))?;
    let rest = key.strip_prefix('{').ok_or(DecodeError("no '{'"))?;
    let close = rest.find('}').ok_or(DecodeError("no '}'"))?;
    let (part, tail) = (&rest[..close], &rest[close + 1..]);
    let mut fields = part.split('|');
    let domain = unescape(fields.next().unwrap_or_default())?;
    let levels = fields.map(level).collect::<Result<Vec<_>, _>>()?;
    let tail = tail
        .strip_prefix(':')
        .ok_or(DecodeError("no ':' after '}'"))?;
    let (algorithm, period) = tail.split_once(':').ok_or(DecodeError("no period"))?;
    let algorithm = Algorithm::parse(algorithm).ok_or(DecodeError("unknown algorithm"))?;
    Ok(Decoded {
        domain,
        levels,
        algorithm,
        period_nanos: period_of(period)?,
    })
}

fn level(text: &str) -> Result<Level, DecodeError> {
    let at = text
        .find(['=', '~'])
        .ok_or(DecodeError("a level without '=' or '~'"))?;
    Ok(Level {
        key: unescape(&text[..at])?,
        value: unescape(&text[at + 1..])?,
        shared: text.as_bytes().get(at) == Some(&b'~'),
    })
}

fn period_of(text: &str) -> Result<u64, DecodeError> {
    let bad = DecodeError("a bad period");
    let canonical = |digits: &str| digits == "0" || !digits.starts_with('0');
    if let Some(nanos) = text.strip_suffix("ns") {
        let n: u64 = nanos.parse().map_err(|_| bad.clone())?;
        // The encoder writes whole seconds without the suffix.
        return (canonical(nanos) && !n.is_multiple_of(NANOS_PER_SECOND))
            .then_some(n)
            .ok_or(bad);
    }
    let seconds: u64 = text.parse().map_err(|_| bad.clone())?;
    if !canonical(text) || text.starts_with('+') {
        return Err(bad);
    }
    seconds.checked_mul(NANOS_PER_SECOND).ok_or(bad)
}

/// The inverse of [`escape_into`]: only the escapes it writes are accepted, and no separator
/// may appear unescaped.
fn unescape(text: &str) -> Result<String, DecodeError> {
    if !text.contains(['%', '{', '}', '|', '=', '~', ':']) {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['%', '{', '}', '|', '=', '~', ':']) {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3).ok_or(DecodeError("a cut escape"))?;
        let c = ['%', ':', '=', '{', '|', '}', '~']
            .into_iter()
            .find(|&c| escaped(c) == Some(code))
            .ok_or(DecodeError("an unknown escape or a bare separator"))?;
        out.push(c);
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Appends `text` with every separator character escaped.
pub fn escape_into(out: &mut String, text: &str) {
    if !text.contains(|c| escaped(c).is_some()) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match escaped(c) {
            Some(code) => out.push_str(code),
            None => out.push(c),
        }
    }
}

/// The escape of a separator character.
fn escaped(c: char) -> Option<&'static str> {
    Some(match c {
        '%' => "%25",
        ':' => "%3A",
        '=' => "%3D",
        '{' => "%7B",
        '|' => "%7C",
        '}' => "%7D",
        '~' => "%7E",
        _ => return None,
    })
}

fn push_period(key: &mut String, period_nanos: u64) {
    // Writing to a String cannot fail.
    let _ = if period_nanos.is_multiple_of(NANOS_PER_SECOND) {
        write!(key, "{}", period_nanos / NANOS_PER_SECOND)
    } else {
        write!(key, "{period_nanos}ns")
    };
}

fn encoded_len_hint(domain: &str, entries: &[Entry]) -> usize {
    let entries: usize = entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 2)
        .sum();
    domain.len() + entries + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_separator_is_escaped() {
        let part = descriptor_part("%{}|=~:", &[Entry::new("%{}|=~:", "%{}|=~:")], None);
        assert_eq!(
            part,
            "{%25%7B%7D%7C%3D%7E%3A|%25%7B%7D%7C%3D%7E%3A=%25%7B%7D%7C%3D%7E%3A}"
        );
    }

    #[test]
    fn underscore_join_collision_does_not_exist() {
        let a = descriptor_part("d", &[Entry::new("a", "b_c")], None);
        let b = descriptor_part("d", &[Entry::new("a_b", "c")], None);
        assert_ne!(a, b);
    }

    #[test]
    fn empty_values_and_no_entries() {
        assert_eq!(descriptor_part("d", &[Entry::new("k", "")], None), "{d|k=}");
        assert_eq!(descriptor_part("d", &[], None), "{d}");
        assert_ne!(
            descriptor_part("d", &[Entry::new("k", "")], None),
            descriptor_part("d", &[], None)
        );
    }

    #[test]
    fn non_ascii_is_kept() {
        assert_eq!(
            descriptor_part("dé", &[Entry::new("k", "€ 1")], None),
            "{dé|k=€ 1}"
        );
    }

    #[test]
    fn periods_in_seconds() {
        let key = |nanos| state_key("{d}", Algorithm::Funnel, nanos);
        assert_eq!(&*key(1_000_000_000), b"{d}:funnel:1");
        assert_eq!(&*key(86_400_000_000_000), b"{d}:funnel:86400");
        assert_eq!(&*key(0), b"{d}:funnel:0");
        assert_eq!(&*key(1_500_000_000), b"{d}:funnel:1500000000ns");
        assert_ne!(key(1), key(2));
    }

    #[test]
    fn hash_tag_rules() {
        assert_eq!(hash_tag(b"sluice:{d|k=v}:funnel:1"), b"d|k=v");
        assert_eq!(hash_tag(b"no tag"), b"no tag");
        assert_eq!(hash_tag(b"{}x"), b"{}x");
        assert_eq!(hash_tag(b"{open"), b"{open");
        assert_eq!(hash_tag(b"a{b}c}"), b"b");
    }
    #[test]
    fn decoding_rejects_what_the_encoder_never_writes() {
        for bad in [
            "api:funnel:1",
            "{api}funnel:1",
            "{api}:funnel",
            "{api}:gcra:1",
            "{api|k}:funnel:1",
            "{api|k=%7}:funnel:1",
            "{api|k=%41}:funnel:1",
            "{api|k=a:b}:funnel:1",
            "{api}:funnel:01",
            "{api}:funnel:1000000000ns",
            "{api}:funnel:x",
        ] {
            assert!(decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    fn text() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[a-z%{}|=~:_ é€]{0,8}").expect("a valid regex")
    }

    fn period() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::strategy::Strategy as _;
        proptest::prop_oneof![
            (0u64..100_000).prop_map(|s| s * NANOS_PER_SECOND),
            proptest::num::u64::ANY,
        ]
    }

    fn fail(e: DecodeError) -> proptest::test_runner::TestCaseError {
        proptest::test_runner::TestCaseError::fail(e.to_string())
    }

    proptest::proptest! {
        #[test]
        fn decode_inverts_the_encoder(
            domain in text(),
            levels in proptest::collection::vec((text(), text()), 0..5),
            algorithm in proptest::sample::select(Algorithm::ALL.to_vec()),
            period in period(),
        ) {
            let entries: Vec<Entry> = levels.into_iter().map(|(k, v)| Entry::new(k, v)).collect();
            let key = state_key(&descriptor_part(&domain, &entries, None), algorithm, period);
            let decoded = decode(&key).map_err(fail)?;
            proptest::prop_assert_eq!(&decoded.domain, &domain);
            proptest::prop_assert_eq!(decoded.entries(), entries);
            proptest::prop_assert!(decoded.levels.iter().all(|l| !l.shared));
            proptest::prop_assert_eq!(decoded.algorithm, algorithm);
            proptest::prop_assert_eq!(decoded.period_nanos, period);
            proptest::prop_assert_eq!(decoded.encode(), key);
        }

        #[test]
        fn encode_and_decode_are_inverse_with_shared_levels(
            domain in text(),
            levels in proptest::collection::vec((text(), text(), proptest::bool::ANY), 0..5),
            algorithm in proptest::sample::select(Algorithm::ALL.to_vec()),
            period_nanos in period(),
        ) {
            let levels = levels
                .into_iter()
                .map(|(key, value, shared)| Level { key, value, shared })
                .collect();
            let key = Decoded { domain, levels, algorithm, period_nanos };
            proptest::prop_assert_eq!(decode(&key.encode()).map_err(fail)?, key);
        }
    }
}
