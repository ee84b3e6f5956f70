//! `RateLimitConfig` resources into rules documents: each resource becomes the rules-file
//! document it means (written as JSON, which is YAML), named `xds:<resource>`, and goes
//! through the same validation as a file. Errors read like a file's:
//! `xds:api:7: descriptors[0].rate_limit.unit: missing unit (...)`, the line being that of
//! the rendered document.

use std::path::PathBuf;

use prost::Message as _;
use serde_json::{Map, Value};

use crate::config::model::RulesModel;
use crate::config::rules_file::{self, LoadOptions, RuleError, RuleErrors};
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// The type URL of the resources.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Decodes and validates a whole set of resources (the state of the world).
pub fn load(
    resources: &[prost_types::Any],
    options: LoadOptions,
) -> Result<RulesModel, RuleErrors> {
    let mut sources = Vec::with_capacity(resources.len());
    let mut errors = Vec::new();
    for (i, any) in resources.iter().enumerate() {
        let at = PathBuf::from(format!("xds:resources[{i}]"));
        if any.type_url != TYPE_URL {
            errors.push(whole(
                at,
                format!("unexpected resource type '{}'", any.type_url),
            ));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => sources.push(source(&config, i)),
            Err(e) => errors.push(whole(at, format!("cannot decode RateLimitConfig: {e}"))),
        }
    }
    let loaded = rules_file::from_sources_with(&sources, options);
    if errors.is_empty() {
        return loaded;
    }
    if let Err(mut more) = loaded {
        errors.append(&mut more.0);
    }
    Err(RuleErrors(errors))
}

fn whole(file: PathBuf, message: String) -> RuleError {
    RuleError {
        file,
        line: 0,
        path: String::new(),
        message,
    }
}

/// One resource as a named rules document.
pub fn source(config: &RateLimitConfig, index: usize) -> (PathBuf, String) {
    let name = if !config.name.is_empty() {
        config.name.clone()
    } else if !config.domain.is_empty() {
        config.domain.clone()
    } else {
        format!("resources[{index}]")
    };
    let mut doc = Map::new();
    doc.insert("domain".into(), Value::String(config.domain.clone()));
    if !config.descriptors.is_empty() {
        doc.insert("descriptors".into(), descriptors(&config.descriptors));
    }
    let text = serde_json::to_string_pretty(&Value::Object(doc)).unwrap_or_default();
    (PathBuf::from(format!("xds:{name}")), text)
}

fn descriptors(list: &[RateLimitDescriptor]) -> Value {
    Value::Array(list.iter().map(descriptor).collect())
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), Value::String(d.key.clone()));
    if !d.value.is_empty() {
        m.insert("value".into(), Value::String(d.value.clone()));
    }
    if let Some(policy) = &d.rate_limit {
        m.insert("rate_limit".into(), rate_limit(policy));
    }
    for (name, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            m.insert(name.into(), Value::Bool(true));
        }
    }
    if let Some(metadata) = &d.metadata {
        m.insert("metadata".into(), structure(metadata));
    }
    if !d.descriptors.is_empty() {
        m.insert("descriptors".into(), descriptors(&d.descriptors));
    }
    Value::Object(m)
}

fn rate_limit(p: &RateLimitPolicy) -> Value {
    let mut m = Map::new();
    // UNKNOWN is "no unit": an error on a limited limit, as in a file without `unit`.
    match RateLimitUnit::try_from(p.unit) {
        Ok(RateLimitUnit::Unknown) => {}
        Ok(unit) => {
            let name = unit.as_str_name().to_ascii_lowercase();
            m.insert("unit".into(), Value::String(name));
        }
        Err(_) => {
            m.insert(
                "unit".into(),
                Value::String(format!("enum value {}", p.unit)),
            );
        }
    }
    if p.unlimited {
        m.insert("unlimited".into(), Value::Bool(true));
    } else {
        m.insert("requests_per_unit".into(), Value::from(p.requests_per_unit));
    }
    if !p.name.is_empty() {
        m.insert("name".into(), Value::String(p.name.clone()));
    }
    if !p.replaces.is_empty() {
        let replaces = p.replaces.iter().map(|r| {
            let mut one = Map::new();
            one.insert("name".into(), Value::String(r.name.clone()));
            Value::Object(one)
        });
        m.insert("replaces".into(), Value::Array(replaces.collect()));
    }
    Value::Object(m)
}

/// A `google.protobuf.Struct` as JSON.
fn structure(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

fn value(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::Policy;
    use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;
    use crate::rules::RuleSet;

    fn any(config: &RateLimitConfig) -> prost_types::Any {
        prost_types::Any {
            type_url: TYPE_URL.to_owned(),
            value: config.encode_to_vec(),
        }
    }

    fn limit(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        })
    }

    fn desc(key: &str, value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }

    /// What Envoy Gateway's translator emits (a route descriptor, nested rule/match
    /// descriptors, shadow mode), plus every other field of the proto and every unit.
    #[test]
    fn every_field_and_unit_is_understood() {
        let units = [
            RateLimitUnit::Second,
            RateLimitUnit::Minute,
            RateLimitUnit::Hour,
            RateLimitUnit::Day,
            RateLimitUnit::Week,
            RateLimitUnit::Month,
            RateLimitUnit::Year,
        ];
        let mut leaves: Vec<RateLimitDescriptor> = units
            .iter()
            .enumerate()
            .map(|(i, unit)| RateLimitDescriptor {
                rate_limit: limit(*unit, 10 + i as u32),
                ..desc("unit", unit.as_str_name())
            })
            .collect();
        let mut shadow = desc("rule-0-match-0", "rule-0-match-0");
        shadow.shadow_mode = true;
        shadow.detailed_metric = true;
        shadow.quota_mode = true;
        shadow.rate_limit = Some(RateLimitPolicy {
            name: "per-user".into(),
            ..limit(RateLimitUnit::Minute, 3).unwrap()
        });
        let mut metadata = prost_types::Struct::default();
        metadata.fields.insert(
            "team".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("a".into())),
            },
        );
        shadow.metadata = Some(metadata);
        leaves.push(shadow);
        let mut vip = desc("vip", "yes");
        vip.rate_limit = Some(RateLimitPolicy {
            unlimited: true,
            replaces: vec![RateLimitReplace {
                name: "per-user".into(),
            }],
            ..Default::default()
        });
        leaves.push(vip);
        let route = RateLimitDescriptor {
            descriptors: leaves,
            ..desc("httproute/default/r", "httproute/default/r")
        };
        let config = RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![route],
        };
        let model = load(&[any(&config)], LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let set = RuleSet::compile(model);
        let domain = set.domains().next().expect("one domain");
        assert_eq!(domain.name(), "default/eg/http");
        let children = domain.rules()[0].children();
        assert_eq!(children.len(), 9);
        let periods: Vec<String> = children[..7]
            .iter()
            .map(|r| format!("{:?}", r.policy))
            .collect();
        for (text, unit) in periods
            .iter()
            .zip(["Second", "Minute", "Hour", "Day", "Week", "Month", "Year"])
        {
            assert!(text.contains(unit), "{text} lacks {unit}");
        }
        let shadow = &children[7];
        assert!(shadow.shadow_mode && shadow.detailed_metric && shadow.quota_mode);
        assert!(format!("{:?}", shadow.metadata).contains("team"));
        assert!(format!("{:?}", shadow.policy).contains("per-user"));
        match &children[8].policy {
            Policy::Unlimited { replaces, .. } => {
                assert_eq!(format!("{replaces:?}"), "[\"per-user\"]")
            }
            other => panic!("unlimited expected, got {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_resource_and_the_field() {
        let bad = RateLimitConfig {
            name: "broken".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                rate_limit: limit(RateLimitUnit::Unknown, 1),
                ..desc("k", "")
            }],
        };
        let dup = RateLimitConfig {
            name: "again".into(),
            domain: "d".into(),
            descriptors: vec![],
        };
        let wrong = prost_types::Any {
            type_url: "type.googleapis.com/other".into(),
            value: vec![],
        };
        let errors = load(&[any(&bad), any(&dup), wrong], LoadOptions::default()).unwrap_err();
        let text = errors.to_string();
        assert!(
            text.contains("xds:resources[2]:0: unexpected resource type"),
            "{text}"
        );
        assert!(text.contains("xds:broken:"), "{text}");
        assert!(
            text.contains("descriptors[0].rate_limit: missing unit"),
            "{text}"
        );
        assert!(
            text.contains("xds:again:2: domain: duplicate domain 'd'"),
            "{text}"
        );
    }
}
