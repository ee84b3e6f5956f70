//! Matching a 4-entry descriptor against 1,000 rules (exact values, wildcards, nesting), and
//! state-key encoding.

mod common;

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::config::model::Algorithm;
use sluice_core::config::rules_file;
use sluice_core::rules::{Entry, RuleSet, key};

/// Exactly this many rules, over four levels.
const RULES: usize = 1_000;

/// A domain `bench` of [`RULES`] rules:
///
/// - level 1, key `tenant`: exact values `t0`, `t1`, ..., wildcards `w0-*` .. `w9-*`, a key-only rule;
/// - under `t0` .. `t9`, key `route`: `/r0` .. `/r29`, wildcards `/api/v0/*` .. `/api/v9/*`
///   (declaration order), a key-only rule;
/// - under each `/api/v9/*`, key `method`: 8 verbs;
/// - under each verb, key `user`: `root`, `bot-*`, `admin-*`, and a key-only rule.
///
/// Level 1 is padded with exact values until the total is [`RULES`].
fn rules_yaml() -> String {
    const VERBS: [&str; 8] = [
        "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE",
    ];
    let limit = "rate_limit: {unit: second, requests_per_unit: 100}";
    let mut nested = String::new();
    let mut count = 0;
    for t in 0..10 {
        nested += &format!("  - key: tenant\n    value: t{t}\n    descriptors:\n");
        count += 1;
        for r in 0..30 {
            nested += &format!("      - {{key: route, value: /r{r}, {limit}}}\n");
        }
        for v in 0..9 {
            nested += &format!("      - key: route\n        value: /api/v{v}/*\n        {limit}\n");
        }
        // The last wildcard, `/api/v9/*`, leads to the deeper levels.
        nested += "      - key: route\n        value: /api/v9/*\n        descriptors:\n";
        for verb in VERBS {
            nested += &format!(
                "          - key: method\n            value: {verb}\n            descriptors:\n"
            );
            for user in ["root", "bot-*", "admin-*"] {
                nested += &format!("              - {{key: user, value: \"{user}\", {limit}}}\n");
            }
            nested += &format!("              - {{key: user, {limit}}}\n");
            count += 5;
        }
        nested += &format!("      - {{key: route, {limit}}}\n");
        count += 41;
    }
    let mut top = String::new();
    for w in 0..10 {
        top += &format!("  - {{key: tenant, value: \"w{w}-*\", {limit}}}\n");
    }
    top += &format!("  - {{key: tenant, {limit}}}\n");
    count += 11;
    let mut t = 10;
    while count < RULES {
        top += &format!("  - {{key: tenant, value: t{t}, {limit}}}\n");
        t += 1;
        count += 1;
    }
    format!("domain: bench\ndescriptors:\n{nested}{top}")
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

fn matching(c: &mut Criterion) {
    let yaml = rules_yaml();
    let model = rules_file::from_sources(&[(PathBuf::from("bench.yaml"), yaml)])
        .unwrap_or_else(|e| panic!("bench rules are invalid:\n{e}"));
    let set = RuleSet::compile(model);
    let domain = set.domain("bench").expect("the bench domain");
    let mut g = c.benchmark_group("match_1000_rules");
    // The last wildcard at level 2, then an exact verb, then two failed wildcards and the
    // key-only rule at level 4.
    let deep = entries(&[
        ("tenant", "t7"),
        ("route", "/api/v9/orders"),
        ("method", "POST"),
        ("user", "alice"),
    ]);
    assert_eq!(domain.find(&deep).map(|m| m.path().len()), Some(4));
    g.bench_function("4_entries_wildcards", |b| {
        b.iter(|| domain.find(black_box(&deep)).is_some())
    });
    let exact = entries(&[
        ("tenant", "t3"),
        ("route", "/api/v9/x"),
        ("method", "GET"),
        ("user", "root"),
    ]);
    g.bench_function("4_entries_exact_leaf", |b| {
        b.iter(|| domain.find(black_box(&exact)).is_some())
    });
    let miss = entries(&[
        ("tenant", "t7"),
        ("route", "/api/v9/orders"),
        ("method", "CONNECT"),
        ("user", "alice"),
    ]);
    assert!(domain.find(&miss).is_none());
    g.bench_function("4_entries_no_match", |b| {
        b.iter(|| domain.find(black_box(&miss)).is_none())
    });
    g.finish();
}

fn key_encoding(c: &mut Criterion) {
    let mut g = c.benchmark_group("state_key");
    let one = entries(&[("user", "user-4242")]);
    g.bench_function("1_entry", |b| {
        b.iter(|| {
            let part = key::descriptor_part(black_box("bench"), black_box(&one), None);
            key::state_key(&part, Algorithm::Funnel, 3_600_000_000_000)
        })
    });
    let four = entries(&[
        ("tenant", "t7"),
        ("route", "/api/v9/orders"),
        ("method", "POST"),
        ("user", "alice"),
    ]);
    g.bench_function("4_entries", |b| {
        b.iter(|| {
            let part = key::descriptor_part(black_box("bench"), black_box(&four), None);
            key::state_key(&part, Algorithm::Funnel, 3_600_000_000_000)
        })
    });
    let escaped = entries(&[("path", "/a|b=c:d{e}")]);
    g.bench_function("1_entry_escaped", |b| {
        b.iter(|| {
            let part = key::descriptor_part(black_box("bench"), black_box(&escaped), None);
            key::state_key(&part, Algorithm::Funnel, 1_000_000_000)
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = matching, key_encoding
}
criterion_main!(benches);
