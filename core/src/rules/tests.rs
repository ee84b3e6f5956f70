//! Matching, as in envoyproxy/ratelimit's README examples and its matching rules.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::key::descriptor_part;
use super::*;
use crate::config::model::{Algorithm, Charge, LimitRule, Unit};

/// A rule named after its limit, so a test can tell which one matched.
fn limited(
    key: &str,
    value: ValueMatch,
    name: &str,
    children: Vec<DescriptorRule>,
) -> DescriptorRule {
    let limit = LimitRule {
        name: Some(name.into()),
        unit: Unit::Second,
        requests_per_unit: 1,
        unit_multiplier: NonZeroU32::MIN,
        algorithm: Algorithm::Funnel,
        burst: 1,
        charge: Charge::Admitted,
        borrow: false,
        replaces: vec![],
        on_deny: None,
        block_nanos: 0,
        global: false,
        time_zone: None,
        hold_id: None,
    };
    DescriptorRule {
        policy: Policy::Limited(vec![limit]),
        ..pass(key, value, children)
    }
}

/// A rule without a limit.
fn pass(key: &str, value: ValueMatch, children: Vec<DescriptorRule>) -> DescriptorRule {
    DescriptorRule {
        key: key.into(),
        value,
        policy: Policy::None,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        share_threshold: false,
        metadata: None,
        children,
        location: location(),
    }
}

fn location() -> Location {
    Location {
        file: Arc::new("rules.yaml".into()),
        line: 1,
    }
}

fn exact(value: &str) -> ValueMatch {
    ValueMatch::Exact(value.into())
}

fn wild(pattern: &str) -> ValueMatch {
    ValueMatch::Wildcard(pattern.into())
}

fn domain(descriptors: Vec<DescriptorRule>) -> RuleSet {
    RuleSet::compile(RulesModel {
        domains: vec![DomainRules {
            domain: "d".into(),
            descriptors,
            location: location(),
            defaults: Default::default(),
        }],
        ..RulesModel::default()
    })
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|&(k, v)| Entry::new(k, v)).collect()
}

/// The name of the limit the request ends on; "-" for a rule without one.
fn found(rules: &RuleSet, pairs: &[(&str, &str)]) -> Option<String> {
    let found = rules.domain("d")?.find(&entries(pairs))?;
    assert_eq!(found.path().len(), pairs.len());
    Some(match &found.rule().policy {
        Policy::Limited(limits) => limits
            .first()
            .and_then(|l| l.name.clone())
            .unwrap_or_default(),
        _ => "-".into(),
    })
}

fn name(s: &str) -> Option<String> {
    Some(s.into())
}

#[test]
fn nested_descriptors() {
    // README example 2: a key-only rule with an exact child, and its own default.
    let rules = domain(vec![
        limited(
            "key2",
            ValueMatch::Any,
            "key2",
            vec![limited("subkey2", exact("subvalue2"), "sub", vec![])],
        ),
        pass(
            "foo",
            exact("bar"),
            vec![limited("baz", ValueMatch::Any, "baz", vec![])],
        ),
    ]);
    assert_eq!(found(&rules, &[("key2", "x")]), name("key2"));
    assert_eq!(
        found(&rules, &[("key2", "x"), ("subkey2", "subvalue2")]),
        name("sub")
    );
    assert_eq!(found(&rules, &[("key2", "x"), ("subkey2", "other")]), None);
    assert_eq!(found(&rules, &[("foo", "bar"), ("baz", "1")]), name("baz"));
    assert_eq!(found(&rules, &[("foo", "bar")]), name("-"));
    assert_eq!(found(&rules, &[("foo", "nope"), ("baz", "1")]), None);
}

#[test]
fn depth_must_match_in_both_directions() {
    let rules = domain(vec![pass(
        "a",
        exact("1"),
        vec![limited("b", ValueMatch::Any, "ab", vec![])],
    )]);
    // Shorter than the rule path: the intermediate node has no limit.
    assert_eq!(found(&rules, &[("a", "1")]), name("-"));
    // Longer than the tree.
    assert_eq!(found(&rules, &[("a", "1"), ("b", "2"), ("c", "3")]), None);
    assert_eq!(found(&rules, &[("a", "1"), ("b", "2")]), name("ab"));
}

#[test]
fn intermediate_limits_apply_only_at_their_depth() {
    let rules = domain(vec![limited(
        "a",
        ValueMatch::Any,
        "a",
        vec![limited("b", ValueMatch::Any, "ab", vec![])],
    )]);
    assert_eq!(found(&rules, &[("a", "1")]), name("a"));
    assert_eq!(found(&rules, &[("a", "1"), ("b", "2")]), name("ab"));
    assert_eq!(found(&rules, &[("a", "1"), ("x", "2")]), None);
}

#[test]
fn key_only_default_beside_exact_overrides() {
    let rules = domain(vec![
        limited("user", ValueMatch::Any, "default", vec![]),
        limited("user", exact("vip"), "vip", vec![]),
        limited("user", exact("bot"), "bot", vec![]),
    ]);
    assert_eq!(found(&rules, &[("user", "vip")]), name("vip"));
    assert_eq!(found(&rules, &[("user", "bot")]), name("bot"));
    assert_eq!(found(&rules, &[("user", "alice")]), name("default"));
    assert_eq!(found(&rules, &[("user", "")]), name("default"));
    assert_eq!(found(&rules, &[("other", "vip")]), None);
}

#[test]
fn precedence_exact_then_wildcards_in_order_then_key_only() {
    let rules = domain(vec![
        limited("path", ValueMatch::Any, "any", vec![]),
        limited("path", wild("/api/*"), "api", vec![]),
        limited("path", wild("/api/v1/*"), "v1", vec![]),
        limited("path", exact("/api/v1/health"), "health", vec![]),
    ]);
    assert_eq!(found(&rules, &[("path", "/api/v1/health")]), name("health"));
    // "/api/*" is declared first: it wins over the more specific "/api/v1/*".
    assert_eq!(found(&rules, &[("path", "/api/v1/users")]), name("api"));
    assert_eq!(found(&rules, &[("path", "/web")]), name("any"));
}

#[test]
fn a_value_equal_to_a_pattern_is_an_exact_match() {
    let rules = domain(vec![
        limited("path", wild("a*"), "a", vec![]),
        limited("path", wild("ab*"), "ab", vec![]),
    ]);
    assert_eq!(found(&rules, &[("path", "abc")]), name("a"));
    assert_eq!(found(&rules, &[("path", "ab*")]), name("ab"));
}

#[test]
fn wildcards_match_the_value_only() {
    let rules = domain(vec![limited("host", wild("*.example.com"), "ex", vec![])]);
    assert_eq!(found(&rules, &[("host", "api.example.com")]), name("ex"));
    assert_eq!(found(&rules, &[("hos", "tapi.example.com")]), None);
    assert_eq!(found(&rules, &[("host", "example.com")]), None);
}

#[test]
fn wildcard_nodes_descend() {
    let rules = domain(vec![pass(
        "path",
        wild("/files/*"),
        vec![limited("method", exact("GET"), "get", vec![])],
    )]);
    assert_eq!(
        found(&rules, &[("path", "/files/a"), ("method", "GET")]),
        name("get")
    );
    assert_eq!(
        found(&rules, &[("path", "/files/a"), ("method", "PUT")]),
        None
    );
}

#[test]
fn no_backtracking() {
    // The exact rule matches at level 1, its subtree lacks level 2's key, the key-only
    // sibling has it: nothing applies.
    let rules = domain(vec![
        pass(
            "a",
            exact("1"),
            vec![limited("x", ValueMatch::Any, "x", vec![])],
        ),
        pass(
            "a",
            ValueMatch::Any,
            vec![limited("b", ValueMatch::Any, "b", vec![])],
        ),
        pass(
            "a",
            wild("1*"),
            vec![limited("b", ValueMatch::Any, "wb", vec![])],
        ),
    ]);
    assert_eq!(found(&rules, &[("a", "1"), ("b", "2")]), None);
    assert_eq!(found(&rules, &[("a", "1"), ("x", "2")]), name("x"));
    // Likewise a wildcard that matched does not fall back to the key-only rule.
    assert_eq!(found(&rules, &[("a", "12"), ("b", "2")]), name("wb"));
    let rules = domain(vec![
        pass("a", wild("1*"), vec![]),
        pass(
            "a",
            ValueMatch::Any,
            vec![limited("b", ValueMatch::Any, "b", vec![])],
        ),
    ]);
    assert_eq!(found(&rules, &[("a", "12"), ("b", "2")]), None);
    assert_eq!(found(&rules, &[("a", "2"), ("b", "2")]), name("b"));
}

#[test]
fn unknown_domain_and_empty_entries() {
    let rules = domain(vec![limited("a", ValueMatch::Any, "a", vec![])]);
    assert!(rules.domain("other").is_none());
    assert!(rules.domain("D").is_none());
    assert_eq!(found(&rules, &[]), None);
    assert!(RuleSet::default().domain("d").is_none());
}

#[test]
fn path_holds_every_level() {
    let rules = domain(vec![pass(
        "a",
        exact("1"),
        vec![pass(
            "b",
            wild("*"),
            vec![limited("c", ValueMatch::Any, "c", vec![])],
        )],
    )]);
    let d = rules.domain("d").unwrap();
    let m = d
        .find(&entries(&[("a", "1"), ("b", "x"), ("c", "y")]))
        .unwrap();
    let keys: Vec<&str> = m.path().iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    assert!(std::ptr::eq(m.rule(), m.path()[2]));
}

#[test]
fn domains_and_dumps() {
    let mut model = RulesModel::default();
    for name in ["one", "two"] {
        model.domains.push(DomainRules {
            domain: name.into(),
            descriptors: vec![pass(
                "a",
                exact("1"),
                vec![pass("b", ValueMatch::Any, vec![])],
            )],
            location: location(),
            defaults: Default::default(),
        });
    }
    let rules = RuleSet::compile(model);
    assert_eq!(rules.len(), 2);
    assert!(!rules.is_empty());
    let names: Vec<&str> = rules.domains().map(Domain::name).collect();
    assert_eq!(names, ["one", "two"]);
    let two = rules.domain("two").unwrap();
    assert_eq!(two.rules().len(), 1);
    assert_eq!(two.rules()[0].children()[0].key, "b");
    assert!(RuleSet::default().is_empty());
}

#[test]
fn a_repeated_domain_keeps_its_first_definition() {
    let mut model = RulesModel::default();
    for key in ["first", "second"] {
        model.domains.push(DomainRules {
            domain: "d".into(),
            descriptors: vec![limited(key, ValueMatch::Any, key, vec![])],
            location: location(),
            defaults: Default::default(),
        });
    }
    let rules = RuleSet::compile(model);
    assert_eq!(rules.len(), 1);
    assert_eq!(found(&rules, &[("first", "x")]), name("first"));
}

#[test]
fn shared_wildcards_share_one_descriptor_part() {
    let shared = DescriptorRule {
        share_threshold: true,
        ..limited("path", wild("/files/*"), "files", vec![])
    };
    let rules = domain(vec![shared, limited("path", wild("/api/*"), "api", vec![])]);
    let d = rules.domain("d").unwrap();
    let part = |value: &str| {
        let e = entries(&[("path", value)]);
        descriptor_part("d", &e, d.find(&e).as_ref())
    };
    assert_eq!(part("/files/a"), "{d|path~/files/*}");
    assert_eq!(part("/files/b"), "{d|path~/files/*}");
    assert_eq!(part("/api/a"), "{d|path=/api/a}");
    // The request value equal to the pattern, without sharing, is a different key.
    assert_ne!(
        part("/files/a"),
        descriptor_part("d", &entries(&[("path", "/files/*")]), None)
    );
}

/// A concurrency rule with `hold_id: request_id` matches one more, last, entry of that key:
/// it names the request's hold, is no level of the path and no part of the state key.
#[test]
fn a_hold_id_entry_is_matched_but_not_keyed() {
    let mut tenant = limited("tenant", ValueMatch::Any, "slots", vec![]);
    if let Policy::Limited(limits) = &mut tenant.policy {
        limits[0].algorithm = Algorithm::Concurrency;
        limits[0].hold_id = Some("request_id".into());
    }
    let rules = domain(vec![tenant]);
    let d = rules.domain("d").expect("the domain");
    let with_id = entries(&[("tenant", "acme"), ("request_id", "r-1")]);
    let m = d.find(&with_id).expect("matched with the id");
    assert!(m.hold());
    assert_eq!(m.path().len(), 1);
    assert_eq!(m.rule().hold_id.as_deref(), Some("request_id"));
    let without = entries(&[("tenant", "acme")]);
    let plain = d.find(&without).expect("matched without an id");
    assert!(!plain.hold());
    assert_eq!(
        descriptor_part("d", &with_id[..1], Some(&m)),
        descriptor_part("d", &without, Some(&plain)),
        "one state for every request id"
    );
    // The admin's walk (/why) agrees.
    assert!(matches!(
        explain::explain(d, &with_id),
        explain::Walk::Matched(_)
    ));
    // Another key, or the id entry not last, matches nothing.
    assert!(
        d.find(&entries(&[("tenant", "acme"), ("trace_id", "t")]))
            .is_none()
    );
    let not_last = entries(&[("tenant", "acme"), ("request_id", "r"), ("x", "y")]);
    assert!(d.find(&not_last).is_none());
}
