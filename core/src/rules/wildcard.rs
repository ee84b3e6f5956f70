//! Wildcard values: a rule value where each `*` matches any run of characters (also none).
//!
//! A pattern is split once, at load time, into its literal segments: the text before the first
//! `*` must be a prefix of the value, the text after the last `*` a suffix that does not overlap
//! the prefix, and the segments in between are found left to right, each after the previous
//! one. Taking the leftmost occurrence of every middle segment is always right (it leaves the
//! most room for the next ones), so matching is linear in the value and never backtracks.
//! Segments are whole strings, so matching bytes is matching characters.

/// A compiled wildcard pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wildcard {
    prefix: Box<str>,
    /// The non-empty literal segments between the first and the last `*`.
    middle: Box<[Box<str>]>,
    suffix: Box<str>,
}

impl Wildcard {
    /// Compiles `pattern`; `None` when it has no `*` (it is then a plain value).
    pub(crate) fn new(pattern: &str) -> Option<Wildcard> {
        let (prefix, rest) = pattern.split_once('*')?;
        let (middle, suffix) = rest.rsplit_once('*').unwrap_or(("", rest));
        let middle = middle
            .split('*')
            .filter(|segment| !segment.is_empty())
            .map(Box::from)
            .collect();
        Some(Wildcard {
            prefix: prefix.into(),
            middle,
            suffix: suffix.into(),
        })
    }

    /// Whether `value` matches the whole pattern.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let Some(rest) = value.strip_prefix(&*self.prefix) else {
            return false;
        };
        let Some(mut rest) = rest.strip_suffix(&*self.suffix) else {
            return false;
        };
        for segment in &self.middle {
            match rest.split_once(&**segment) {
                Some((_, after)) => rest = after,
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matches(pattern: &str, value: &str) -> bool {
        Wildcard::new(pattern).is_some_and(|w| w.matches(value))
    }

    /// The obvious exponential matcher, as the reference.
    fn naive(pattern: &[u8], value: &[u8]) -> bool {
        match pattern.split_first() {
            None => value.is_empty(),
            Some((b'*', rest)) => (0..=value.len()).any(|i| naive(rest, &value[i..])),
            Some((c, rest)) => value
                .split_first()
                .is_some_and(|(v, vs)| v == c && naive(rest, vs)),
        }
    }

    #[test]
    fn plain_value_is_not_a_wildcard() {
        assert_eq!(Wildcard::new("abc"), None);
        assert_eq!(Wildcard::new(""), None);
    }

    #[test]
    fn trailing_star() {
        assert!(matches("foo*", "foo"));
        assert!(matches("foo*", "foobar"));
        assert!(!matches("foo*", "fo"));
        assert!(!matches("foo*", "xfoo"));
    }

    #[test]
    fn leading_star() {
        assert!(matches("*.example.com", "api.example.com"));
        assert!(matches("*.example.com", ".example.com"));
        assert!(!matches("*.example.com", "example.com"));
        assert!(!matches("*.example.com", "api.example.org"));
    }

    #[test]
    fn middle_star() {
        assert!(matches("/api/*/action", "/api/v1/action"));
        assert!(matches("/api/*/action", "/api//action"));
        assert!(matches("/api/*/action", "/api/a/b/action"));
        assert!(!matches("/api/*/action", "/api/action"));
    }

    #[test]
    fn several_stars() {
        assert!(matches("a*b*c", "abc"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(matches("a*b*c", "abbc"));
        assert!(!matches("a*b*c", "acb"));
        assert!(matches("*a*b*", "xaybz"));
        assert!(!matches("*a*b*", "ba"));
        assert!(matches("foo*bar*baz", "foobarbaz"));
        assert!(!matches("foo*bar*baz", "foobaz"));
    }

    #[test]
    fn star_alone_and_double_star_match_anything() {
        for pattern in ["*", "**", "***"] {
            assert!(matches(pattern, ""));
            assert!(matches(pattern, "anything at all"));
        }
        assert!(matches("a**b", "ab"));
        assert!(matches("a**b", "a-b"));
        assert!(!matches("a**b", "a"));
    }

    #[test]
    fn prefix_and_suffix_never_overlap() {
        assert!(!matches("ab*ba", "aba"));
        assert!(matches("ab*ba", "abba"));
        assert!(!matches("a*a", "a"));
        assert!(matches("a*a", "aa"));
    }

    #[test]
    fn value_shorter_than_literals() {
        assert!(!matches("abc*def", "abcde"));
        assert!(!matches("a*bcd*e", "abce"));
        assert!(!matches("x*", ""));
    }

    #[test]
    fn middle_segments_do_not_overlap_the_suffix() {
        assert!(!matches("*ab*b", "ab"));
        assert!(matches("*ab*b", "abb"));
    }

    #[test]
    fn multibyte_values() {
        assert!(matches("é*ü", "éaü"));
        assert!(matches("*€*", "10€"));
        assert!(!matches("é*ü", "eü"));
    }

    #[test]
    fn a_pattern_matches_itself() {
        for pattern in ["ab*", "*", "a*b*c", "*x*"] {
            assert!(matches(pattern, pattern));
        }
    }

    proptest! {
        #[test]
        fn agrees_with_the_naive_matcher(pattern in "[ab*]{1,8}", value in "[ab]{0,10}") {
            prop_assume!(pattern.contains('*'));
            prop_assert_eq!(
                matches(&pattern, &value),
                naive(pattern.as_bytes(), value.as_bytes())
            );
        }
    }
}
