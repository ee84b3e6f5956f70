//! Finding and reading rules files: explicit files, and directories walked for
//! `*.yaml`/`*.yml`.
//!
//! Directory walks follow symlinks, skip every entry whose name starts with `.` (Kubernetes
//! ConfigMap internals such as `..data` and `..2024_01_01_00_00_00.123`), never enter a
//! directory that is one of their own ancestors (a symlink loop), and list entries sorted by
//! name so the order is the same on every machine.

use std::fs;
use std::path::{Path, PathBuf};

use super::RuleError;

/// What a rules path expands to: the files to load, in order, or an error for that path.
pub(super) type Found = Result<PathBuf, RuleError>;

/// Expands each path: a directory into its rules files, anything else into itself (so an
/// explicitly named file is loaded whatever its extension).
pub(super) fn expand(paths: &[PathBuf]) -> Vec<Found> {
    let mut found = Vec::new();
    for path in paths {
        match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => walk(path, &mut Vec::new(), &mut found),
            Ok(_) => found.push(Ok(path.clone())),
            Err(e) => found.push(Err(io_error(path, &e))),
        }
    }
    found
}

/// Adds the rules files under `dir`; `ancestors` holds the canonical directories being walked.
fn walk(dir: &Path, ancestors: &mut Vec<PathBuf>, found: &mut Vec<Found>) {
    let canonical = match fs::canonicalize(dir) {
        Ok(c) => c,
        Err(e) => return found.push(Err(io_error(dir, &e))),
    };
    if ancestors.contains(&canonical) {
        return;
    }
    let entries = match sorted_entries(dir) {
        Ok(entries) => entries,
        Err(e) => return found.push(Err(io_error(dir, &e))),
    };
    ancestors.push(canonical);
    for path in entries {
        match fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => walk(&path, ancestors, found),
            Ok(meta) if meta.is_file() && is_rules_file(&path) => found.push(Ok(path)),
            Ok(_) => {}
            Err(e) if is_rules_file(&path) => found.push(Err(io_error(&path, &e))),
            Err(_) => {}
        }
    }
    ancestors.pop();
}

/// The visible entries of a directory, sorted by name.
fn sorted_entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        if !name.as_encoded_bytes().starts_with(b".") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}

/// `*.yaml` or `*.yml`, in any letter case.
fn is_rules_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// Reads a rules file, which must be UTF-8.
pub(super) fn read(path: &Path) -> Result<String, RuleError> {
    let bytes = fs::read(path).map_err(|e| io_error(path, &e))?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = 1 + valid.iter().filter(|b| **b == b'\n').count();
        RuleError {
            file: path.to_path_buf(),
            line,
            path: String::new(),
            message: "not valid UTF-8 (rules files must be UTF-8)".into(),
        }
    })
}

/// An error about a whole file or directory: line 0 and the operating system's message.
fn io_error(path: &Path, error: &std::io::Error) -> RuleError {
    RuleError {
        file: path.to_path_buf(),
        line: 0,
        path: String::new(),
        message: error.to_string(),
    }
}
