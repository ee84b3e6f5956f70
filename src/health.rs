//! Readiness: whether this replica should receive traffic, and why not.
//!
//! Ready means all three: rules are loaded (at least one domain), the limiter backend is
//! ready, and the service is not draining. Liveness needs none of them: a process that
//! answers at all is alive.
//!
//! The backend's part is [`Limiter::ready`]: always ready for the memory backend, and for
//! Redis with an `on_error` other than `error` (which still answers while Redis is down);
//! otherwise whether Redis answered its last request or probe.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::limiter::Limiter;
use crate::rules::RuleSet;

/// A source of rules other than files (xDS): whether it has delivered a set.
pub(crate) trait RulesProbe: Send + Sync + 'static {
    /// Ready, or why not.
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
    backend: Arc<dyn Limiter>,
    /// Where the rules come from when not from files (xDS): it decides whether rules are
    /// loaded (a set received, even empty) instead of "at least one domain".
    rules_source: Option<Arc<dyn RulesProbe>>,
}

impl Readiness {
    pub fn new(rules: Arc<ArcSwap<RuleSet>>, backend: Arc<dyn Limiter>) -> Self {
        Readiness {
            draining: AtomicBool::new(false),
            rules,
            backend,
            rules_source: None,
        }
    }

    /// Rules are loaded when `source` says so (see the field).
    pub(crate) fn with_rules_source(mut self, source: Option<Arc<dyn RulesProbe>>) -> Self {
        self.rules_source = source;
        self
    }

    /// From now on the service is not ready; never undone.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_draining(&self) -> bool {
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
        self.backend.ready().map_err(NotReady::Backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rules_file::from_sources;

    use crate::limiter::{Batch, BatchOutcome, BoxFuture, LimiterError, MemoryLimiter};

    /// A backend that is never ready.
    struct Down;
    impl Limiter for Down {
        fn check<'a>(&'a self, _: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
            Box::pin(std::future::ready(Ok(BatchOutcome {
                hits: Vec::new(),
                admitted: true,
            })))
        }

        fn name(&self) -> &'static str {
            "down"
        }

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
        let memory = Arc::new(MemoryLimiter::new(1));
        let r = Readiness::new(some.clone(), memory.clone());
        assert_eq!(r.check(), Ok(()));
        let r = Readiness::new(rules(""), memory);
        assert_eq!(r.check(), Err(NotReady::NoRules));
        let r = Readiness::new(some, Arc::new(Down));
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
        impl RulesProbe for Waiting {
            fn ready(&self) -> Result<(), String> {
                Err("waiting for xDS".to_owned())
            }
        }
        struct Received;
        impl RulesProbe for Received {
            fn ready(&self) -> Result<(), String> {
                Ok(())
            }
        }
        let some = rules("domain: d\n");
        let r = Readiness::new(some, Arc::new(MemoryLimiter::new(1)))
            .with_rules_source(Some(Arc::new(Waiting)));
        assert_eq!(
            r.check().unwrap_err().to_string(),
            "rules not ready: waiting for xDS"
        );
        // An accepted empty set is ready: the source has nothing to limit yet.
        let r = Readiness::new(rules(""), Arc::new(MemoryLimiter::new(1)))
            .with_rules_source(Some(Arc::new(Received)));
        assert_eq!(r.check(), Ok(()));
    }
}
