//! The active rules: loading them from their paths, swapping them atomically, and the
//! version and load time that `/rlconfig` and `/metrics` show.
//!
//! A reload loads and validates every rules path, compiles the result, and only then stores
//! it: a request takes one snapshot of the rules, so it never sees a half-loaded set. A load
//! with any error keeps the last good rules and logs every error with its file and line. A
//! load that yields the same rules as the active ones changes nothing (no new version): the
//! validated models are compared by value, every field of every domain, rule and limit
//! (where each was defined included), so no field can be forgotten.
//!
//! [`watch`] runs the reloads: on a trigger (SIGHUP, via [`ReloadTrigger`]) or on a change
//! under a rules path (see [`watch`] for what is watched). [`ActiveRules::rlconfig`] is their
//! `/rlconfig` text.

mod rlconfig;
pub(crate) mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::config::model::RulesModel;
use crate::config::rules_file::{self, EMBEDDED_NAME, EMBEDDED_RULES, LoadOptions, RuleErrors};
use crate::rules::RuleSet;

pub use watch::{ReloadTrigger, WatchOptions, watch};

/// Loads the rules of `paths` (files or directories), or the embedded demo rules when there
/// is no path. Start-up and every reload go through here, with the same options.
pub fn load(paths: &[PathBuf], options: LoadOptions) -> Result<RulesModel, RuleErrors> {
    if paths.is_empty() {
        let embedded = [(PathBuf::from(EMBEDDED_NAME), EMBEDDED_RULES.to_owned())];
        rules_file::from_sources_with(&embedded, options)
    } else {
        rules_file::load_paths_with(paths, options)
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

/// The rules every request reads, and where they come from.
pub struct ActiveRules {
    current: Arc<ArcSwap<RuleSet>>,
    paths: Vec<PathBuf>,
    options: LoadOptions,
    status: Mutex<ConfigStatus>,
    /// The rules come from outside (xDS): reloads from files keep them.
    external: AtomicBool,
    /// The version the outside source gave the active rules (xDS `version_info`).
    source_version: Mutex<Option<String>>,
}

impl ActiveRules {
    /// Rules loaded from `paths` (empty: the embedded demo rules) with `options`, as version 1;
    /// reloads use the same paths and options.
    pub fn new(set: RuleSet, paths: Vec<PathBuf>, options: LoadOptions) -> ActiveRules {
        ActiveRules {
            current: Arc::new(ArcSwap::from_pointee(set)),
            paths,
            options,
            status: Mutex::new(ConfigStatus {
                version: 1,
                loaded_at: SystemTime::now(),
                last_failure: None,
            }),
            external: AtomicBool::new(false),
            source_version: Mutex::new(None),
        }
    }

    /// From now on the rules come from outside through [`ActiveRules::apply`]: reloads
    /// (SIGHUP, file changes) change nothing.
    pub(crate) fn set_external(&self) {
        self.external.store(true, Ordering::SeqCst);
    }

    /// The version the outside source gave the active rules, if they came from one.
    /// The `/rlconfig` dump (the admin port's, and envoyproxy/ratelimit's debug port's): one
    /// line per limit, headed by the xDS version when the rules came over xDS.
    pub fn rlconfig(&self) -> String {
        let dump = rlconfig::dump(&self.load_full(), &self.status());
        match self.source_version() {
            Some(version) => format!("# xds version {version}\n{dump}"),
            None => dump,
        }
    }

    pub(crate) fn source_version(&self) -> Option<String> {
        self.source_version.lock().clone()
    }

    /// Swaps in rules validated elsewhere (xDS), under the source's `version`: the same
    /// compilation, comparison by value and version history as a reload from files. Errors
    /// keep the last good rules.
    pub fn apply(&self, loaded: Result<RulesModel, RuleErrors>, version: &str) -> Reloaded {
        let mut status = self.status.lock();
        match loaded {
            Ok(model) => {
                *self.source_version.lock() = Some(version.to_owned());
                swap(&self.current, &mut status, RuleSet::compile(model))
            }
            Err(errors) => {
                status.last_failure = Some((SystemTime::now(), errors.0.len()));
                Reloaded::Failed(errors)
            }
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
        self.status.lock().clone()
    }

    /// Loads, validates and compiles the rules paths, and swaps the result in if it is valid
    /// and different. Blocking (reads files); one reload at a time.
    pub fn reload(&self) -> Reloaded {
        if self.external.load(Ordering::SeqCst) {
            return Reloaded::Unchanged;
        }
        let mut status = self.status.lock();
        match load(&self.paths, self.options.clone()) {
            Ok(model) => swap(&self.current, &mut status, RuleSet::compile(model)),
            Err(errors) => {
                status.last_failure = Some((SystemTime::now(), errors.0.len()));
                Reloaded::Failed(errors)
            }
        }
    }
}

/// Makes `set` the active rules unless it equals them.
fn swap(current: &ArcSwap<RuleSet>, status: &mut ConfigStatus, set: RuleSet) -> Reloaded {
    if **current.load() == set {
        return Reloaded::Unchanged;
    }
    current.store(Arc::new(set));
    status.version += 1;
    status.loaded_at = SystemTime::now();
    Reloaded::Updated {
        version: status.version,
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::config::model::{
        Algorithm, Charge, DescriptorRule, DomainRules, LimitRule, Location, OnDeny, Policy, Unit,
        ValueMatch,
    };

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

    /// A model with one domain whose rule has a child with every field set.
    const FULL: &str = "\
domain: d
descriptors:
  - key: k
    value: v
    descriptors:
      - key: c
        value: \"x*\"
        share_threshold: true
        detailed_metric: true
        value_to_metric: true
        metadata: {team: a}
        rate_limits:
          - {name: per_second, unit: second, unit_multiplier: 2, requests_per_unit: 5, burst: 9, borrow: true, replaces: [{name: other}]}
  - key: u
    rate_limit: {unlimited: true, name: free, replaces: [{name: per_second}]}
";

    fn full() -> RulesModel {
        rules_file::from_sources(&[("r.yaml".into(), FULL.to_owned())]).unwrap()
    }

    /// The child rule `k=v / c=x*` of the model.
    fn child(model: &mut RulesModel) -> &mut DescriptorRule {
        &mut model.domains[0].descriptors[0].children[0]
    }

    fn limit(model: &mut RulesModel) -> &mut LimitRule {
        match &mut child(model).policy {
            Policy::Limited(limits) => &mut limits[0],
            other => panic!("a limited rule, not {other:?}"),
        }
    }

    fn unlimited(model: &mut RulesModel) -> (&mut Option<String>, &mut Vec<String>) {
        match &mut model.domains[0].descriptors[1].policy {
            Policy::Unlimited { name, replaces } => (name, replaces),
            other => panic!("an unlimited rule, not {other:?}"),
        }
    }

    type Change = (&'static str, fn(&mut RulesModel));

    /// One change per field of the model. The patterns below name every field (no `..`), so
    /// a new field does not compile until it has its change here.
    fn changes() -> Vec<Change> {
        let mut model = full();
        let RulesModel {
            domains: _,
            namespaces: _,
            default_algorithm: _,
        } = &model;
        let DomainRules {
            domain: _,
            descriptors: _,
            location: _,
            defaults: _,
        } = &model.domains[0];
        let DescriptorRule {
            key: _,
            value: _,
            policy: _,
            shadow_mode: _,
            quota_mode: _,
            detailed_metric: _,
            value_to_metric: _,
            share_threshold: _,
            metadata: _,
            children: _,
            location: _,
        } = child(&mut model);
        let LimitRule {
            name: _,
            unit: _,
            requests_per_unit: _,
            unit_multiplier: _,
            algorithm: _,
            burst: _,
            charge: _,
            borrow: _,
            replaces: _,
            on_deny: _,
            block_nanos: _,
            global: _,
            time_zone: _,
            hold_id: _,
        } = limit(&mut model);
        let Location { file: _, line: _ } = &model.domains[0].location;
        vec![
            ("domains", |m| m.domains.push(m.domains[0].clone())),
            ("namespaces", |m| {
                let text = "- {namespace: n, max_value: 1, seconds: 1}\n";
                let other =
                    rules_file::from_sources(&[("l.yaml".into(), text.to_owned())]).unwrap();
                m.namespaces = other.namespaces;
            }),
            ("default_algorithm", |m| {
                m.default_algorithm = Algorithm::SlidingLog
            }),
            ("domain", |m| m.domains[0].domain.push('2')),
            ("descriptors", |m| {
                m.domains[0].descriptors.pop();
            }),
            ("domain location", |m| m.domains[0].location.line += 1),
            ("domain defaults", |m| {
                m.domains[0].defaults.charge = Charge::Always;
            }),
            ("key", |m| child(m).key.push('2')),
            ("value", |m| {
                child(m).value = ValueMatch::Wildcard("y*".into())
            }),
            ("policy", |m| child(m).policy = Policy::None),
            ("shadow_mode", |m| child(m).shadow_mode = true),
            ("quota_mode", |m| child(m).quota_mode = true),
            ("detailed_metric", |m| child(m).detailed_metric = false),
            ("value_to_metric", |m| child(m).value_to_metric = false),
            ("share_threshold", |m| child(m).share_threshold = false),
            ("metadata", |m| child(m).metadata = None),
            ("children", |m| {
                let grandchild = child(m).clone();
                child(m).children.push(grandchild);
            }),
            ("rule line", |m| child(m).location.line += 1),
            ("rule file", |m| {
                child(m).location.file = Arc::new(PathBuf::from("other.yaml"));
            }),
            ("limit name", |m| limit(m).name = None),
            ("unit", |m| limit(m).unit = Unit::Minute),
            ("requests_per_unit", |m| limit(m).requests_per_unit += 1),
            ("unit_multiplier", |m| {
                limit(m).unit_multiplier = NonZeroU32::MIN;
            }),
            ("algorithm", |m| limit(m).algorithm = Algorithm::TokenBucket),
            ("burst", |m| limit(m).burst += 1),
            ("charge", |m| limit(m).charge = Charge::Always),
            ("borrow", |m| limit(m).borrow = false),
            ("limit replaces", |m| limit(m).replaces.clear()),
            ("on_deny", |m| {
                limit(m).on_deny = Some(Arc::new(OnDeny {
                    body: "slow down".into(),
                    content_type: None,
                    headers: Vec::new(),
                }));
            }),
            ("block_for", |m| limit(m).block_nanos = 30_000_000_000),
            ("time_zone", |m| {
                limit(m).time_zone = crate::config::model::Zone::named("Europe/Berlin").ok();
            }),
            ("hold_id", |m| limit(m).hold_id = Some("request_id".into())),
            ("unlimited name", |m| *unlimited(m).0 = None),
            ("unlimited replaces", |m| unlimited(m).1.push("x".into())),
        ]
    }

    #[test]
    fn a_reload_sees_a_change_of_any_field() {
        let current = ArcSwap::from_pointee(RuleSet::compile(full()));
        let mut status = ConfigStatus {
            version: 1,
            loaded_at: SystemTime::now(),
            last_failure: None,
        };
        let same = RuleSet::compile(full());
        assert!(matches!(
            swap(&current, &mut status, same),
            Reloaded::Unchanged
        ));
        for (field, change) in changes() {
            let mut changed = full();
            change(&mut changed);
            assert_ne!(changed, full(), "{field}: the change changes nothing");
            let before = status.version;
            let reloaded = swap(&current, &mut status, RuleSet::compile(changed));
            assert!(
                matches!(reloaded, Reloaded::Updated { version } if version == before + 1),
                "{field}: {reloaded:?}"
            );
            // And back: a change again.
            let back = swap(&current, &mut status, RuleSet::compile(full()));
            assert!(matches!(back, Reloaded::Updated { .. }), "{field} back");
        }
    }

    #[test]
    fn no_path_means_the_embedded_rules() {
        let model = load(&[], LoadOptions::default()).unwrap();
        assert!(!model.domains.is_empty());
    }
}
