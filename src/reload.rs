//! The active rules: loading them from their paths, swapping them atomically, and the
//! version and load time that `/rlconfig` and `/metrics` show.
//!
//! A reload loads and validates every rules path, compiles the result, and only then stores
//! it: a request takes one snapshot of the rules, so it never sees a half-loaded set. A load
//! with any error keeps the last good rules and logs every error with its file and line. A
//! load that yields the same rules as the active ones changes nothing (no new version).
//!
//! [`watch`] runs the reloads: on a trigger (SIGHUP, via [`ReloadTrigger`]) or on a change
//! under a rules path (see [`watch`] for what is watched).

pub(crate) mod watch;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::config::model::RulesModel;
use crate::config::rules::{self, EMBEDDED_NAME, EMBEDDED_RULES, LoadOptions, RuleErrors};
use crate::rules::{Rule, RuleSet};

pub use watch::{ReloadTrigger, WatchOptions, watch};

/// Loads the rules of `paths` (files or directories), or the embedded demo rules when there
/// is no path. Start-up and every reload go through here, with the same options.
pub fn load(paths: &[PathBuf], options: LoadOptions) -> Result<RulesModel, RuleErrors> {
    if paths.is_empty() {
        let embedded = [(PathBuf::from(EMBEDDED_NAME), EMBEDDED_RULES.to_owned())];
        rules::from_sources_with(&embedded, options)
    } else {
        rules::load_paths_with(paths, options)
    }
}

/// What a reload did.
#[derive(Debug)]
pub enum Reloaded {
    /// New rules are active under this version.
    Updated { version: u64 },
    /// The files give the rules already active.
    Unchanged,
    /// The files have errors; the last good rules stay active.
    Failed(RuleErrors),
}

impl Reloaded {
    /// `success`, `unchanged` or `failure` (the metrics label).
    pub fn label(&self) -> &'static str {
        match self {
            Reloaded::Updated { .. } => "success",
            Reloaded::Unchanged => "unchanged",
            Reloaded::Failed(_) => "failure",
        }
    }
}

/// The active rules' version and history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigStatus {
    /// 1 for the rules loaded at start, then one more per reload that changed them.
    pub version: u64,
    /// When the active rules were loaded.
    pub loaded_at: SystemTime,
    /// The last failed reload since then, and its number of errors.
    pub last_failure: Option<(SystemTime, usize)>,
}

struct State {
    status: ConfigStatus,
    fingerprint: u64,
}

/// The rules every request reads, and where they come from.
pub struct ActiveRules {
    current: Arc<ArcSwap<RuleSet>>,
    paths: Vec<PathBuf>,
    options: LoadOptions,
    state: Mutex<State>,
    /// The rules come from outside (xDS): reloads from files keep them.
    external: AtomicBool,
    /// The version the outside source gave the active rules (xDS `version_info`).
    source_version: Mutex<Option<String>>,
}

impl ActiveRules {
    /// Rules loaded from `paths` (empty: the embedded demo rules) with `options`, as version 1;
    /// reloads use the same paths and options.
    pub fn new(set: RuleSet, paths: Vec<PathBuf>, options: LoadOptions) -> ActiveRules {
        let fingerprint = fingerprint(&set);
        ActiveRules {
            current: Arc::new(ArcSwap::from_pointee(set)),
            paths,
            options,
            state: Mutex::new(State {
                status: ConfigStatus {
                    version: 1,
                    loaded_at: SystemTime::now(),
                    last_failure: None,
                },
                fingerprint,
            }),
            external: AtomicBool::new(false),
            source_version: Mutex::new(None),
        }
    }

    /// From now on the rules come from outside through [`ActiveRules::apply`]: reloads
    /// (SIGHUP, file changes) change nothing.
    pub fn set_external(&self) {
        self.external.store(true, Ordering::SeqCst);
    }

    /// The version the outside source gave the active rules, if they came from one.
    pub fn source_version(&self) -> Option<String> {
        self.source_version.lock().clone()
    }

    /// Swaps in rules validated elsewhere (xDS), under the source's `version`: the same
    /// compilation, fingerprint and version history as a reload from files. Errors keep the
    /// last good rules.
    pub fn apply(&self, loaded: Result<RulesModel, RuleErrors>, version: &str) -> Reloaded {
        let mut state = self.state.lock();
        let set = match loaded {
            Ok(model) => RuleSet::compile(model),
            Err(errors) => {
                state.status.last_failure = Some((SystemTime::now(), errors.0.len()));
                return Reloaded::Failed(errors);
            }
        };
        *self.source_version.lock() = Some(version.to_owned());
        let fingerprint = fingerprint(&set);
        if fingerprint == state.fingerprint {
            return Reloaded::Unchanged;
        }
        self.current.store(Arc::new(set));
        state.fingerprint = fingerprint;
        state.status.version += 1;
        state.status.loaded_at = SystemTime::now();
        Reloaded::Updated {
            version: state.status.version,
        }
    }

    /// The shared cell the engine reads.
    pub fn shared(&self) -> Arc<ArcSwap<RuleSet>> {
        self.current.clone()
    }

    /// The active rules.
    pub fn load_full(&self) -> Arc<RuleSet> {
        self.current.load_full()
    }

    /// The rules paths watched and reloaded.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    pub fn status(&self) -> ConfigStatus {
        self.state.lock().status.clone()
    }

    /// Loads, validates and compiles the rules paths, and swaps the result in if it is valid
    /// and different. Blocking (reads files); one reload at a time.
    pub fn reload(&self) -> Reloaded {
        if self.external.load(Ordering::SeqCst) {
            return Reloaded::Unchanged;
        }
        let mut state = self.state.lock();
        let set = match load(&self.paths, self.options) {
            Ok(model) => RuleSet::compile(model),
            Err(errors) => {
                state.status.last_failure = Some((SystemTime::now(), errors.0.len()));
                return Reloaded::Failed(errors);
            }
        };
        let fingerprint = fingerprint(&set);
        if fingerprint == state.fingerprint {
            return Reloaded::Unchanged;
        }
        self.current.store(Arc::new(set));
        state.fingerprint = fingerprint;
        state.status.version += 1;
        state.status.loaded_at = SystemTime::now();
        Reloaded::Updated {
            version: state.status.version,
        }
    }
}

/// A hash of everything a rule set means (domains, rules, limits, flags, metadata, where each
/// was defined), walked in declaration order so that equal files give equal fingerprints.
fn fingerprint(set: &RuleSet) -> u64 {
    let mut h = DefaultHasher::new();
    for domain in set.domains() {
        (domain.name(), format!("{:?}", domain.location())).hash(&mut h);
        hash_rules(domain.rules(), &mut h);
    }
    h.finish()
}

fn hash_rules(rules: &[Rule], h: &mut DefaultHasher) {
    rules.len().hash(h);
    for r in rules {
        let flags = [
            r.shadow_mode,
            r.quota_mode,
            r.detailed_metric,
            r.value_to_metric,
            r.share_threshold,
        ];
        (&r.key, format!("{:?}", r.value), format!("{:?}", r.policy)).hash(h);
        (
            flags,
            format!("{:?}", r.metadata),
            format!("{:?}", r.location),
        )
            .hash(h);
        hash_rules(r.children(), h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, text: &str) -> PathBuf {
        let file = dir.join("r.yaml");
        std::fs::write(&file, text).unwrap();
        file
    }

    const V1: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    const V2: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n";

    #[test]
    fn updates_only_on_change_and_keeps_the_last_good_rules() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), V1);
        let set =
            RuleSet::compile(load(std::slice::from_ref(&file), LoadOptions::default()).unwrap());
        let active = ActiveRules::new(set, vec![file], LoadOptions::default());
        assert!(matches!(active.reload(), Reloaded::Unchanged));
        write(dir.path(), V2);
        assert!(matches!(active.reload(), Reloaded::Updated { version: 2 }));
        write(dir.path(), "domain: d\ndescriptors: 5\n");
        let Reloaded::Failed(errors) = active.reload() else {
            panic!("a broken file must fail");
        };
        assert!(errors.to_string().contains("r.yaml:2"), "{errors}");
        let status = active.status();
        assert_eq!(status.version, 2);
        assert_eq!(status.last_failure.map(|f| f.1), Some(1));
        assert_eq!(active.load_full().len(), 1);
    }

    #[test]
    fn no_path_means_the_embedded_rules() {
        let model = load(&[], LoadOptions::default()).unwrap();
        assert!(!model.domains.is_empty());
    }
}
