//! Loading rules files: YAML in, a validated [`RulesModel`] or every error out.

use std::path::{Path, PathBuf};

use super::model::{DomainRules, RulesModel};

/// One problem in a rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub file: PathBuf,
    /// 1-based; 0 when the error is about the file as a whole (e.g. unreadable).
    pub line: usize,
    /// The YAML path of the key, e.g. `descriptors[2].rate_limit.unit`; empty for the document.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Every error found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuleErrors(pub Vec<RuleError>);

impl std::fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleErrors {}

/// The rules used when no rules path is given, and the name they are reported under.
pub const EMBEDDED_NAME: &str = "<embedded>/demo.yaml";
pub const EMBEDDED_RULES: &str = include_str!("../../../examples/rules/demo.yaml");

/// Loads every rules file of `paths` (files, or directories of `*.yaml`/`*.yml`).
pub fn load_paths(paths: &[PathBuf]) -> Result<RulesModel, RuleErrors> {
    let _ = paths;
    todo!("rules loader")
}

/// Validates already-read files, given as (name, text) pairs.
pub fn from_sources(sources: &[(PathBuf, String)]) -> Result<RulesModel, RuleErrors> {
    let _ = sources;
    todo!("rules loader")
}

/// Parses and validates the documents of one file.
pub fn parse_file(file: &Path, text: &str) -> Result<Vec<DomainRules>, RuleErrors> {
    let _ = (file, text);
    todo!("rules loader")
}
