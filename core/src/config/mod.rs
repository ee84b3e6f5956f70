//! Configuration: the service settings and the rules files.
//!
//! Rules files are parsed into a marked YAML tree, checked key by key, and validated into the
//! immutable [`model::RulesModel`]; every error names its file, line and YAML path.

pub mod calendar;
pub mod limitador;
pub mod model;
pub mod rules_file;
pub mod settings;
