//! The arrows check itself, shared by the core's table (`core/src/layers.rs`) and the server
//! crate's (`src/layers.rs`, which includes this file by path): every line of code (not a
//! comment) in a module's files that names `crate::OTHER` must have `OTHER` in its row.

use std::path::{Path, PathBuf};

/// A crate's table: each module, and the other modules of the same crate its code may name.
pub(super) type Table = [(&'static str, &'static [&'static str])];

/// The `.rs` files of module `name` under `src`: `src/name.rs` and everything under
/// `src/name/`.
pub(super) fn files(src: &Path, name: &str) -> Vec<PathBuf> {
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

/// The modules of `table` that `line` names as `crate::MODULE`, unless the line is a comment.
pub(super) fn named<'a>(table: &'a Table, line: &str) -> Vec<&'a str> {
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
            table.iter().map(|(m, _)| *m).find(|m| *m == &rest[..end])
        })
        .collect()
}

/// Every line under `src` that names a module its own module's row does not allow, as
/// `file:line: module -> other`. Panics when a module of the table has no file (a stale row).
pub(super) fn wrong_arrows(src: &Path, table: &Table) -> Vec<String> {
    let mut wrong = Vec::new();
    for (module, allowed) in table {
        let found = files(src, module);
        assert!(!found.is_empty(), "no source file for module {module}");
        for path in found {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
            for (n, line) in text.lines().enumerate() {
                for other in named(table, line) {
                    if other != *module && !allowed.contains(&other) {
                        wrong.push(format!("{}:{}: {module} -> {other}", path.display(), n + 1));
                    }
                }
            }
        }
    }
    wrong
}
