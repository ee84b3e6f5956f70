//! Arbitrary bytes as a rules file: loading and validating must return the model or errors,
//! never panic. Errors must point into the file. For a valid file, matching and state keys
//! are built for descriptors following every rule, and for descriptors made of the file's
//! own words; none may panic, and every descriptor part must keep its separators.

#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use sluice_core::config::model::{Algorithm, Policy, ValueMatch};
use sluice_core::config::rules_file::{self, LoadOptions};
use sluice_core::limiter::LimitParams;
use sluice_core::rules::key::{descriptor_part, state_key};
use sluice_core::rules::{Domain, Entry, Rule, RuleSet};

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Funnel,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    // The default algorithm changes which checks apply; pick one without eating the text.
    let options = LoadOptions {
        default_algorithm: ALGORITHMS[data.len() % ALGORITHMS.len()],
        // Domains defined again merge (rules.merge_domains) for every other length.
        merge_domains: data.len() % 2 == 0,
        ..LoadOptions::default()
    };
    let sources = [(PathBuf::from("fuzz.yaml"), text.clone())];
    match rules_file::from_sources_with(&sources, options) {
        Ok(model) => exercise(RuleSet::compile(model), &text),
        Err(errors) => check_errors(&errors, &text),
    }
});

/// Every error names the file, a line of it (0 only for the whole file) and a message.
fn check_errors(errors: &rules_file::RuleErrors, text: &str) {
    assert!(!errors.0.is_empty(), "an Err without errors");
    // Line breaks as YAML counts them: `\n`, `\r\n`, a lone `\r`.
    let lines =
        1 + text.matches('\n').count() + text.matches('\r').count() - text.matches("\r\n").count();
    for e in &errors.0 {
        assert!(!e.message.is_empty(), "an error without a message: {e:?}");
        assert!(
            e.line <= lines + 1,
            "line {} of a {lines}-line file: {e}",
            e.line
        );
        let shown = e.to_string();
        assert!(shown.starts_with("fuzz.yaml:"), "{shown}");
    }
    let _ = errors.to_string();
}

fn exercise(set: RuleSet, text: &str) {
    let words: Vec<&str> = text.split_whitespace().take(8).collect();
    for domain in set.domains() {
        let mut path = Vec::new();
        walk(domain, domain.rules(), &mut path);
        // Descriptors of the file's own words, as keys and values.
        for pair in words.chunks(2).take(4) {
            let value = pair.get(1).copied().unwrap_or("");
            path.push(Entry::new(pair[0], value));
            if let Some(found) = domain.find(&path) {
                keys_of(domain, &path, Some(&found), found.rule());
            }
            check_part(
                domain.name(),
                &path,
                &descriptor_part(domain.name(), &path, None),
            );
        }
    }
}

/// Visits every rule with a request that follows the path down to it.
fn walk(domain: &Domain, level: &[Rule], path: &mut Vec<Entry>) {
    for rule in level {
        path.push(Entry::new(rule.key.clone(), value_for(&rule.value)));
        let found = domain.find(path);
        if let Some(found) = &found {
            keys_of(domain, path, Some(found), found.rule());
        }
        if path.len() < 8 {
            walk(domain, rule.children(), path);
        }
        path.pop();
    }
}

/// A value the rule matches: its own, a wildcard's stars filled, or any for a key-only rule.
fn value_for(value: &ValueMatch) -> String {
    match value {
        ValueMatch::Any => "any|value:{x}".to_owned(),
        ValueMatch::Exact(v) => v.clone(),
        ValueMatch::Wildcard(pattern) => pattern.replace('*', "%=~"),
    }
}

fn keys_of(
    domain: &Domain,
    entries: &[Entry],
    found: Option<&sluice_core::rules::Match<'_>>,
    rule: &Rule,
) {
    let part = descriptor_part(domain.name(), entries, found);
    check_part(domain.name(), entries, &part);
    if let Policy::Limited(limits) = &rule.policy {
        for limit in limits {
            let params = LimitParams::from_rule(limit);
            assert!(params.period_nanos > 0, "a zero period: {limit:?}");
            let key = state_key(&part, params.algorithm, params.period_nanos);
            assert!(key.starts_with(part.as_bytes()));
        }
    }
}

/// `{domain|k=v|...}`: the separators appear only as separators.
fn check_part(domain: &str, entries: &[Entry], part: &str) {
    let count = |c: char| part.chars().filter(|&x| x == c).count();
    assert!(part.starts_with('{') && part.ends_with('}'), "{part}");
    assert_eq!(
        (count('{'), count('}')),
        (1, 1),
        "{part} for {domain} {entries:?}"
    );
    assert_eq!(count('|'), entries.len(), "{part} for {entries:?}");
    assert_eq!(
        count('=') + count('~'),
        entries.len(),
        "{part} for {entries:?}"
    );
    assert_eq!(count(':'), 0, "{part}");
}
