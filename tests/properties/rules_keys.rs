//! State keys are injective and hash-tag their whole descriptor part.
//!
//! Injectivity is proved by decoding: a decoder written here recovers the exact input from
//! every encoded descriptor part, so two different inputs can never share one.

use std::num::NonZeroU32;
use std::sync::Arc;

use proptest::prelude::*;
use sluice::config::model::{
    Algorithm, Charge, DescriptorRule, DomainRules, LimitRule, Location, Policy, RulesModel, Unit,
    ValueMatch,
};
use sluice::rules::key::{descriptor_part, hash_tag, state_key};
use sluice::rules::{Entry, RuleSet};

/// One decoded level: its key, and the request value (`=`) or shared pattern (`~`).
#[derive(Debug, PartialEq, Eq)]
enum Level {
    Value(String, String),
    Shared(String, String),
}

fn unescape(text: &str) -> String {
    let mut out = Vec::new();
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex: Vec<u8> = bytes.by_ref().take(2).collect();
            let hex = std::str::from_utf8(&hex).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).unwrap()
}

/// Decodes a descriptor part back into the domain and levels it was built from.
fn decode(part: &str) -> (String, Vec<Level>) {
    let inner = part.strip_prefix('{').unwrap().strip_suffix('}').unwrap();
    assert!(!inner.contains(['{', '}']));
    let mut fields = inner.split('|');
    let domain = unescape(fields.next().unwrap());
    let levels = fields
        .map(|field| {
            let at = field.find(['=', '~']).unwrap();
            let (key, rest) = field.split_at(at);
            let (key, value) = (unescape(key), unescape(&rest[1..]));
            assert!(!rest[1..].contains(['=', '~']));
            if rest.starts_with('=') {
                Level::Value(key, value)
            } else {
                Level::Shared(key, value)
            }
        })
        .collect();
    (domain, levels)
}

/// Strings made mostly of separators and of the characters of a `_` join.
fn text() -> impl Strategy<Value = String> {
    "[a_%{}|=~:é]{0,5}"
}

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec((text(), text()), 0..4)
        .prop_map(|pairs| pairs.into_iter().map(|(k, v)| Entry::new(k, v)).collect())
}

fn as_levels(entries: &[Entry]) -> Vec<Level> {
    entries
        .iter()
        .map(|e| Level::Value(e.key.clone(), e.value.clone()))
        .collect()
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// Whole seconds, sub-second and odd nanosecond periods, and any `u64`.
fn period_nanos() -> impl Strategy<Value = u64> {
    prop_oneof![
        (1u64..100_000).prop_map(|s| s * 1_000_000_000),
        1u64..1_000_000_000,
        1u64..100_000_000_000,
        any::<u64>(),
    ]
}

/// Decodes `:<algorithm>:<period>` after `part` (seconds, or nanoseconds written `Nns`).
fn decode_tail(key: &[u8], part: &str) -> (Algorithm, u64) {
    let key = std::str::from_utf8(key).unwrap();
    let tail = key.strip_prefix(part).unwrap().strip_prefix(':').unwrap();
    let (name, period) = tail.split_once(':').unwrap();
    let algorithm = Algorithm::parse(name).unwrap();
    let nanos = match period.strip_suffix("ns") {
        Some(nanos) => nanos.parse().unwrap(),
        None => period
            .parse::<u64>()
            .unwrap()
            .checked_mul(1_000_000_000)
            .unwrap(),
    };
    (algorithm, nanos)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn descriptor_part_decodes_to_its_input(domain in text(), entries in entries()) {
        let part = descriptor_part(&domain, &entries, None);
        prop_assert_eq!(decode(&part), (domain, as_levels(&entries)));
    }

    /// Random pairs rarely come close to colliding; the decoding test above is the proof.
    #[test]
    fn different_inputs_give_different_parts(
        a in (text(), entries()),
        b in (text(), entries()),
    ) {
        let part_a = descriptor_part(&a.0, &a.1, None);
        let part_b = descriptor_part(&b.0, &b.1, None);
        prop_assert_eq!(a == b, part_a == part_b);
    }

    /// The tail after the descriptor part decodes back to the algorithm and the period, in
    /// whole seconds or in nanoseconds (`Nns`), so keys differ exactly when those do.
    #[test]
    fn state_keys_differ_by_algorithm_and_period(
        domain in text(),
        entries in entries(),
        a in (algorithm(), period_nanos()),
        b in (algorithm(), period_nanos()),
        same_period in any::<bool>(),
    ) {
        let part = descriptor_part(&domain, &entries, None);
        let b = (b.0, if same_period { a.1 } else { b.1 });
        let key_a = state_key(&part, a.0, a.1);
        let key_b = state_key(&part, b.0, b.1);
        prop_assert_eq!(decode_tail(&key_a, &part), a);
        prop_assert_eq!(decode_tail(&key_b, &part), b);
        prop_assert_eq!(a == b, key_a == key_b);
    }

    #[test]
    fn hash_tag_covers_exactly_the_descriptor_part(
        domain in "[a_%{}|=~:é]{1,5}",
        entries in entries(),
        prefix in "[a-z:]{0,8}",
    ) {
        let part = descriptor_part(&domain, &entries, None);
        let mut key = prefix.clone().into_bytes();
        key.extend_from_slice(&state_key(&part, Algorithm::Funnel, 1_000_000_000));
        // The first `{` opens the part, the first `}` closes it.
        prop_assert_eq!(key.iter().position(|&b| b == b'{'), Some(prefix.len()));
        prop_assert_eq!(
            key.iter().position(|&b| b == b'}'),
            Some(prefix.len() + part.len() - 1)
        );
        let inner = &part.as_bytes()[1..part.len() - 1];
        prop_assert_eq!(hash_tag(&key), inner);
    }

    #[test]
    fn shared_levels_decode_to_their_pattern(
        user in text(),
        path in "/files/[a_%{}|=~:é]{0,5}",
    ) {
        let rules = shared_rules();
        let entries = vec![Entry::new("user", user.clone()), Entry::new("path", path)];
        let found = rules.domain("d").unwrap().find(&entries).unwrap();
        let part = descriptor_part("d", &entries, Some(&found));
        let levels = vec![
            Level::Value("user".into(), user),
            Level::Shared("path".into(), "/files/*".into()),
        ];
        prop_assert_eq!(decode(&part), ("d".to_string(), levels));
    }
}

/// A concurrency rule on `tenant` whose holds are named by the last entry `request_id`
/// (`hold_id`), 2 slots leased for a minute.
const HOLD_RULES: &str = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, hold_id: request_id}\n";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Through the engine and the memory backend: requests of one tenant with any ids take
    /// holds on one state key, the tenant's alone (no id in it), and a release naming an id
    /// frees exactly that request's hold.
    #[test]
    fn a_hold_id_is_no_part_of_the_state_key(tenant in text(), ids in proptest::collection::vec(text(), 1..6)) {
        use futures_util::FutureExt as _;
        use sluice::engine::{Descriptor, Engine, Options, Request};
        use sluice::limiter::{Limiter, MemoryLimiter};
        let model = sluice::config::rules_file::from_sources(&[("r.yaml".into(), HOLD_RULES.to_owned())])
            .expect("valid rules");
        let rules = Arc::new(arc_swap::ArcSwap::from_pointee(RuleSet::compile(model)));
        let memory = Arc::new(MemoryLimiter::new(64));
        let engine = Engine::new(rules, memory.clone() as Arc<dyn Limiter>, Options::default());
        let request = |id: &str, refund: bool| Request {
            domain: "d".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry::new("tenant", tenant.clone()), Entry::new("request_id", id)],
                hits_addend: Some(1),
                refund,
                ..Descriptor::default()
            }],
            hits_addend: 0,
        };
        let mut admitted = Vec::new();
        for id in &ids {
            let answer = engine.should_rate_limit(&request(id, false)).now_or_never();
            let answer = answer.expect("ready").expect("answered");
            if answer.overall_code == sluice::engine::Code::Ok {
                admitted.push(id.clone());
            }
        }
        prop_assert!(!admitted.is_empty() && admitted.len() <= 2);
        let part = descriptor_part("d", &[Entry::new("tenant", tenant.clone())], None);
        let key = state_key(&part, Algorithm::Concurrency, 60_000_000_000);
        let keys: Vec<Vec<u8>> = memory.snapshot().into_iter().map(|(k, _)| k).collect();
        prop_assert_eq!(keys, vec![key.to_vec()]);
        // The first admitted id's release frees one slot of its hold, and nothing else: the
        // other holds (an id sent twice took two slots) stay.
        let first = admitted[0].clone();
        engine.should_rate_limit(&request(&first, true)).now_or_never().expect("ready").expect("answered");
        let check = Request {
            descriptors: vec![Descriptor { hits_addend: Some(0), ..request("probe", false).descriptors[0].clone() }],
            ..request("probe", false)
        };
        let answer = engine.should_rate_limit(&check).now_or_never().expect("ready").expect("answered");
        let remaining = answer.statuses[0].limit_remaining;
        prop_assert_eq!(remaining as usize, 2 - admitted.len() + 1);
    }
}

#[test]
fn underscore_join_collision_does_not_exist() {
    let a = descriptor_part("d", &[Entry::new("a", "b_c")], None);
    let b = descriptor_part("d", &[Entry::new("a_b", "c")], None);
    assert_ne!(a, b);
    let a = descriptor_part("d_a", &[Entry::new("b", "c")], None);
    let b = descriptor_part("d", &[Entry::new("a_b", "c")], None);
    assert_ne!(a, b);
}

#[test]
fn shared_and_literal_pattern_values_differ() {
    let rules = shared_rules();
    let entries = vec![Entry::new("user", "u"), Entry::new("path", "/files/*")];
    let found = rules.domain("d").unwrap().find(&entries).unwrap();
    assert_eq!(
        descriptor_part("d", &entries, Some(&found)),
        "{d|user=u|path~/files/*}"
    );
    assert_eq!(
        descriptor_part("d", &entries, None),
        "{d|user=u|path=/files/*}"
    );
}

/// `user` (any value, own state each) then `path: /files/*` shared.
fn shared_rules() -> RuleSet {
    let location = Location {
        file: Arc::new("rules.yaml".into()),
        line: 1,
    };
    let rule = |key: &str, value, policy, share_threshold, children| DescriptorRule {
        key: key.into(),
        value,
        policy,
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        share_threshold,
        metadata: None,
        children,
        location: location.clone(),
    };
    let limit = LimitRule {
        name: None,
        unit: Unit::Minute,
        requests_per_unit: 10,
        unit_multiplier: NonZeroU32::MIN,
        algorithm: Algorithm::Funnel,
        burst: 10,
        charge: Charge::Admitted,
        borrow: false,
        replaces: vec![],
        on_deny: None,
        block_nanos: 0,
        global: false,
        time_zone: None,
        hold_id: None,
    };
    let files = rule(
        "path",
        ValueMatch::Wildcard("/files/*".into()),
        Policy::Limited(vec![limit]),
        true,
        vec![],
    );
    let user = rule("user", ValueMatch::Any, Policy::None, false, vec![files]);
    RuleSet::compile(RulesModel {
        domains: vec![DomainRules {
            domain: "d".into(),
            descriptors: vec![user],
            location: location.clone(),
            defaults: Default::default(),
        }],
        ..RulesModel::default()
    })
}
