//! Readiness: whether this replica should receive traffic, and why not.
//!
//! Ready means all three: rules are loaded (at least one domain), the limiter backend is
//! ready, and the service is not draining. Liveness needs none of them: a process that
//! answers at all is alive.
//!
//! The backend's part is a seam: a backend that can be unreachable (Redis) gives the app a
//! [`BackendProbe`]; without one the backend is always ready. That is the memory backend, and
//! Redis with an `on_error` other than `error`, which still answers while Redis is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::rules::RuleSet;

/// A backend's own view of whether it can answer now. Called on every readiness check, so it
/// must be cheap (a flag kept up to date by the backend, not a round trip).
pub trait BackendProbe: Send + Sync + 'static {
    /// `Err` carries a short reason, shown by `/readyz`.
    fn ready(&self) -> Result<(), String>;
}

/// Why the service is not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("draining: shutting down")]
    Draining,
    #[error("no rules loaded (0 domains)")]
    NoRules,
    #[error("backend not ready: {0}")]
    Backend(String),
    #[error("rules not ready: {0}")]
    RulesSource(String),
}

/// The readiness latch and its inputs.
pub struct Readiness {
    draining: AtomicBool,
    rules: Arc<ArcSwap<RuleSet>>,
    backend: Option<Arc<dyn BackendProbe>>,
    /// Where the rules come from when not from files (xDS): it decides whether rules are
    /// loaded (a set received, even empty) instead of "at least one domain".
    rules_source: Option<Arc<dyn BackendProbe>>,
}

impl Readiness {
    pub fn new(rules: Arc<ArcSwap<RuleSet>>, backend: Option<Arc<dyn BackendProbe>>) -> Self {
        Readiness {
            draining: AtomicBool::new(false),
            rules,
            backend,
            rules_source: None,
        }
    }

    /// Rules are loaded when `source` says so (see the field).
    pub fn with_rules_source(mut self, source: Option<Arc<dyn BackendProbe>>) -> Self {
        self.rules_source = source;
        self
    }

    /// From now on the service is not ready; never undone.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Ready, or the first reason not to be (draining first, then rules, then backend).
    pub fn check(&self) -> Result<(), NotReady> {
        if self.is_draining() {
            return Err(NotReady::Draining);
        }
        match &self.rules_source {
            Some(source) => source.ready().map_err(NotReady::RulesSource)?,
            None if self.rules.load().is_empty() => return Err(NotReady::NoRules),
            None => {}
        }
        match &self.backend {
            Some(probe) => probe.ready().map_err(NotReady::Backend),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rules::from_sources;

    struct Down;
    impl BackendProbe for Down {
        fn ready(&self) -> Result<(), String> {
            Err("no connection".to_owned())
        }
    }

    fn rules(yaml: &str) -> Arc<ArcSwap<RuleSet>> {
        let model = from_sources(&[("r.yaml".into(), yaml.to_owned())]).unwrap();
        Arc::new(ArcSwap::from_pointee(RuleSet::compile(model)))
    }

    #[test]
    fn each_reason_in_order() {
        let some = rules("domain: d\n");
        let r = Readiness::new(some.clone(), None);
        assert_eq!(r.check(), Ok(()));
        let r = Readiness::new(rules(""), None);
        assert_eq!(r.check(), Err(NotReady::NoRules));
        let r = Readiness::new(some, Some(Arc::new(Down)));
        assert_eq!(
            r.check().unwrap_err().to_string(),
            "backend not ready: no connection"
        );
        r.start_draining();
        assert_eq!(r.check(), Err(NotReady::Draining));
    }

    #[test]
    fn a_rules_source_decides_whether_rules_are_loaded() {
        struct Waiting;
        impl BackendProbe for Waiting {
            fn ready(&self) -> Result<(), String> {
                Err("waiting for xDS".to_owned())
            }
        }
        struct Received;
        impl BackendProbe for Received {
            fn ready(&self) -> Result<(), String> {
                Ok(())
            }
        }
        let some = rules("domain: d\n");
        let r = Readiness::new(some, None).with_rules_source(Some(Arc::new(Waiting)));
        assert_eq!(
            r.check().unwrap_err().to_string(),
            "rules not ready: waiting for xDS"
        );
        // An accepted empty set is ready: the source has nothing to limit yet.
        let r = Readiness::new(rules(""), None).with_rules_source(Some(Arc::new(Received)));
        assert_eq!(r.check(), Ok(()));
    }
}
