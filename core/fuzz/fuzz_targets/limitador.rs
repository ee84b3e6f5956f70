//! Arbitrary bytes as a limitador limits file, and as one CEL expression: loading, compiling
//! and evaluating must return a model, errors or a value, never panic. Errors must point into
//! the file. For a valid file, every namespace is asked which limits apply to descriptors made
//! of the file's own words, and each applicable limit's key must keep its separators.

#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use sluice_core::config::limitador::cel::{Expr, request_context};
use sluice_core::config::rules_file;
use sluice_core::rules::{Entry, RuleSet};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let words: Vec<&str> = text.split_whitespace().take(8).collect();
    expression(&text, &words);
    let sources = [(PathBuf::from("fuzz.yaml"), text.clone())];
    match rules_file::from_sources(&sources) {
        Ok(model) => exercise(RuleSet::compile(model), &words),
        Err(errors) => {
            for e in &errors.0 {
                assert!(!e.message.is_empty(), "an error without a message: {e:?}");
                assert!(e.to_string().starts_with("fuzz.yaml:"), "{e}");
            }
        }
    }
});

/// The whole text as a condition and as a variable, over descriptors of its words.
fn expression(text: &str, words: &[&str]) {
    let Ok(expr) = Expr::compile(text) else {
        return;
    };
    let pairs: Vec<(&str, &str)> = words
        .chunks(2)
        .map(|p| (p[0], p.get(1).copied().unwrap_or("")))
        .collect();
    let half = &pairs[pairs.len() / 2..];
    let ctx = request_context([pairs.iter().copied(), half.iter().copied()]);
    let _ = expr.holds(&ctx);
    let _ = expr.value(&ctx);
}

fn exercise(set: RuleSet, words: &[&str]) {
    let entries: Vec<Entry> = words
        .chunks(2)
        .map(|p| Entry::new(p[0], p.get(1).copied().unwrap_or("")))
        .collect();
    let descriptors: [&[Entry]; 2] = [&entries, &entries[entries.len() / 2..]];
    for ns in set.namespaces().iter() {
        for applied in ns.applicable(&descriptors) {
            let part = &applied.key_part;
            let count = |c: char| part.chars().filter(|&x| x == c).count();
            assert!(part.starts_with('{') && part.ends_with('}'), "{part}");
            assert_eq!((count('{'), count('}')), (1, 1), "{part}");
            assert_eq!(count('|'), 1 + applied.values.len(), "{part}");
            assert_eq!(count(':'), 0, "{part}");
        }
    }
}
