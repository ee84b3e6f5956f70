//! `sluice_throttle_requests_total{name, result}`: Throttle calls by the caller's `name` and
//! how they ended (`allowed`, `limited`, `invalid`, `unavailable`).
//!
//! Names come from callers, so they are capped like every label built from request values:
//! at most `metrics.max_value_label_sets` distinct names over the process's life (a budget of
//! their own, apart from the rules' one); past it, new names count under `name="__other__"`.
//! A call without a name counts under `name=""`.

use std::collections::HashSet;

use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::per_rule::OTHER;
use crate::throttle::ThrottleResult;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThrottleLabels {
    name: String,
    result: &'static str,
}

pub(super) struct ThrottleCounters {
    requests: Family<ThrottleLabels, Counter>,
    names: RwLock<HashSet<String, ahash::RandomState>>,
    max_names: usize,
}

impl ThrottleCounters {
    pub(super) fn new(max_names: usize, registry: &mut Registry) -> ThrottleCounters {
        let c = ThrottleCounters {
            requests: Family::default(),
            names: RwLock::new(HashSet::default()),
            max_names,
        };
        registry.register(
            "throttle_requests",
            "sluice.v1.Throttle calls by the caller's name and result",
            c.requests.clone(),
        );
        c
    }

    pub(super) fn record(&self, name: &str, result: ThrottleResult) {
        let labels = ThrottleLabels {
            name: self.label(name).to_owned(),
            result: result.as_str(),
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// The name itself while under the cap, else [`OTHER`].
    fn label<'a>(&self, name: &'a str) -> &'a str {
        if self.names.read().contains(name) {
            return name;
        }
        let mut names = self.names.write();
        if names.contains(name) || names.len() < self.max_names {
            names.insert(name.to_owned());
            name
        } else {
            OTHER
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_cap_are_other() {
        let mut registry = Registry::default();
        let c = ThrottleCounters::new(2, &mut registry);
        for name in ["a", "b", "c", "a", "d"] {
            c.record(name, ThrottleResult::Allowed);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        assert!(
            out.contains(r#"throttle_requests_total{name="a",result="allowed"} 2"#),
            "{out}"
        );
        assert!(out.contains(r#"name="b",result="allowed"} 1"#), "{out}");
        assert!(
            out.contains(r#"name="__other__",result="allowed"} 2"#),
            "{out}"
        );
        assert!(!out.contains(r#"name="c""#), "{out}");
    }
}
