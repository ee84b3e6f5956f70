//! The arrows inside the core, checked: `engine -> { rules, limiter } -> config`, with `pem`
//! and `rng` beside them. A module may name (in code, not in its docs) only the modules below
//! it; the crate boundary keeps everything above the core out.

use std::path::{Path, PathBuf};

/// Each module, and the other core modules its code may name.
const ALLOWED: &[(&str, &[&str])] = &[
    ("config", &["config"]),
    ("rules", &["rules", "config"]),
    ("limiter", &["limiter", "config", "pem"]),
    ("engine", &["engine", "rules", "limiter", "config"]),
    ("pem", &["pem"]),
    ("rng", &["rng"]),
];

/// The `.rs` files of module `name`: `src/name.rs` and everything under `src/name/`.
fn files(name: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let single = src.join(format!("{name}.rs"));
    if single.is_file() {
        out.push(single);
    }
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The core modules that `line` names as `crate::MODULE`, unless the line is a comment.
fn named(line: &str) -> Vec<&str> {
    let code = line.trim_start();
    if code.starts_with("//") {
        return Vec::new();
    }
    code.match_indices("crate::")
        .filter_map(|(at, _)| {
            let rest = &code[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            ALLOWED.iter().map(|(m, _)| *m).find(|m| *m == &rest[..end])
        })
        .collect()
}

#[test]
fn every_module_names_only_the_modules_below_it() {
    let mut wrong = Vec::new();
    for (module, allowed) in ALLOWED {
        let found = files(module);
        assert!(!found.is_empty(), "no source file for module {module}");
        for path in found {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
            for (n, line) in text.lines().enumerate() {
                for other in named(line) {
                    if !allowed.contains(&other) {
                        wrong.push(format!("{}:{}: {module} -> {other}", path.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_an_arrow_and_passes_over_a_comment() {
    assert_eq!(named("use crate::engine::Engine;"), vec!["engine"]);
    assert_eq!(
        named("    let x = crate::rules::key::f(crate::limiter::Y);"),
        vec!["rules", "limiter"]
    );
    assert!(named("/// see [`crate::engine`]").is_empty());
    assert!(named("use crate::enginery;").is_empty());
}
