//! The proto3 JSON mapping of `RateLimitRequest` (in) and `RateLimitResponse` (out), for
//! `/json`, written by hand for the few fields these messages have.
//!
//! In: field names in lowerCamelCase or as in the `.proto` (`hitsAddend`, `hits_addend`);
//! `null` for the default; 64-bit and 32-bit integers as numbers or strings; enums by name
//! or number; unknown fields are errors. Out: lowerCamelCase, default values left out, enums
//! by name, durations as `"<seconds>s"`, as protobuf's JSON printers write them.

use prost_types::value::Kind;
use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
use serde_json::{Map, Value, json};

use crate::proto::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::proto::rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit};
use crate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default, deserialize_with = "nullable")]
    domain: String,
    #[serde(default, deserialize_with = "nullable")]
    descriptors: Vec<JsonDescriptor>,
    #[serde(
        default,
        rename = "hitsAddend",
        alias = "hits_addend",
        deserialize_with = "u32_of"
    )]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default, deserialize_with = "nullable")]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(
        default,
        rename = "hitsAddend",
        alias = "hits_addend",
        deserialize_with = "u64_of"
    )]
    hits_addend: Option<u64>,
    #[serde(
        default,
        rename = "isNegativeHits",
        alias = "is_negative_hits",
        deserialize_with = "nullable"
    )]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default, deserialize_with = "nullable")]
    key: String,
    #[serde(default, deserialize_with = "nullable")]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        default,
        rename = "requestsPerUnit",
        alias = "requests_per_unit",
        deserialize_with = "u32_of"
    )]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "unit_of")]
    unit: i32,
}

/// Parses a proto3-JSON `RateLimitRequest`; the error reads like serde_json's, with the
/// line and column.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, serde_json::Error> {
    let r: JsonRequest = serde_json::from_slice(body)?;
    Ok(RateLimitRequest {
        domain: r.domain,
        descriptors: r.descriptors.into_iter().map(descriptor).collect(),
        hits_addend: r.hits_addend,
    })
}

fn descriptor(d: JsonDescriptor) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: d
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        limit: d.limit.map(|l| RateLimitOverride {
            requests_per_unit: l.requests_per_unit,
            unit: l.unit,
        }),
        hits_addend: d.hits_addend,
        is_negative_hits: d.is_negative_hits,
    }
}

fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A number, or a string holding one (proto3 JSON allows both for integers).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

fn u64_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<NumberOrText>::deserialize(d)? {
        None => Ok(None),
        Some(NumberOrText::Number(n)) => Ok(Some(n)),
        Some(NumberOrText::Text(t)) => t
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("expected an unsigned integer, got {t:?}"))),
    }
}

fn u32_of<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u64_of(d)?.unwrap_or(0);
    u32::try_from(n).map_err(|_| D::Error::custom(format!("{n} does not fit in 32 bits")))
}

/// A `RateLimitUnit` by name (`"MINUTE"`) or number.
fn unit_of<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    match Option::<NumberOrText>::deserialize(d)? {
        None => Ok(0),
        Some(NumberOrText::Number(n)) => i32::try_from(n).map_err(D::Error::custom),
        Some(NumberOrText::Text(t)) => RateLimitUnit::from_str_name(&t)
            .map(|u| u as i32)
            .ok_or_else(|| D::Error::custom(format!("unknown unit {t:?}"))),
    }
}

/// A `RateLimitResponse` in proto3 JSON.
pub fn response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if let Ok(code) = Code::try_from(r.overall_code)
        && code != Code::Unknown
    {
        out.insert("overallCode".into(), code.as_str_name().into());
    }
    if !r.statuses.is_empty() {
        out.insert("statuses".into(), r.statuses.iter().map(status).collect());
    }
    if !r.response_headers_to_add.is_empty() {
        let headers = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), headers);
    }
    if let Some(meta) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_json(meta));
    }
    Value::Object(out)
}

fn status(s: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    if let Ok(code) = Code::try_from(s.code)
        && code != Code::Unknown
    {
        out.insert("code".into(), code.as_str_name().into());
    }
    if let Some(l) = &s.current_limit {
        let mut limit = Map::new();
        if !l.name.is_empty() {
            limit.insert("name".into(), l.name.clone().into());
        }
        if l.requests_per_unit != 0 {
            limit.insert("requestsPerUnit".into(), l.requests_per_unit.into());
        }
        if let Ok(unit) = Unit::try_from(l.unit)
            && unit != Unit::Unknown
        {
            limit.insert("unit".into(), unit.as_str_name().into());
        }
        out.insert("currentLimit".into(), Value::Object(limit));
    }
    if s.limit_remaining != 0 {
        out.insert("limitRemaining".into(), s.limit_remaining.into());
    }
    if let Some(d) = &s.duration_until_reset {
        out.insert(
            "durationUntilReset".into(),
            format!("{}s", d.seconds).into(),
        );
    }
    Value::Object(out)
}

fn struct_json(s: &prost_types::Struct) -> Value {
    let fields = s.fields.iter().map(|(k, v)| (k.clone(), value_json(v)));
    Value::Object(fields.collect())
}

fn value_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => l.values.iter().map(value_json).collect(),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_snake_case_strings_and_nulls() {
        let body = br#"{"domain":"d","hits_addend":"3","descriptors":[
            {"entries":[{"key":"k","value":"v"}],"hitsAddend":0,"isNegativeHits":null,
             "limit":{"requestsPerUnit":"5","unit":"MINUTE"}},
            {"entries":null,"limit":{"requests_per_unit":1,"unit":1}}]}"#;
        let r = request(body).unwrap();
        assert_eq!(r.hits_addend, 3);
        assert_eq!(r.descriptors[0].hits_addend, Some(0));
        assert_eq!(
            r.descriptors[0]
                .limit
                .map(|l| (l.requests_per_unit, l.unit)),
            Some((5, 2))
        );
        assert!(r.descriptors[1].entries.is_empty());
        assert_eq!(r.descriptors[1].limit.map(|l| l.unit), Some(1));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_errors() {
        for (body, needle) in [
            (&br#"{"domian":"d"}"#[..], "unknown field `domian`"),
            (br#"{"hitsAddend":-1}"#, "did not match"),
            (br#"{"hitsAddend":"x"}"#, "expected an unsigned integer"),
            (
                br#"{"descriptors":[{"limit":{"unit":"MINUTES"}}]}"#,
                "unknown unit",
            ),
            (br#"{"domain":"#, "EOF"),
        ] {
            let e = request(body).err().unwrap().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
