//! The RLS messages <-> the engine's domain types, both ways, and [`decide`]: one wire request
//! through the engine, the path every front end takes (gRPC, the admin port's `/json`, the
//! bench's requests, Kuadrant's `CheckRateLimit`/`Report`).

use prost_types::value::Kind;
use serde_json::Value;

use crate::config::model::Unit;
use crate::engine::{self, Code, Engine, EngineError};
use crate::proto::rate_limit_response::{self as pb_resp, rate_limit::Unit as PbUnit};
use crate::proto::{self as pb, RateLimitUnit};
use crate::rules::Entry;

/// One wire request through the engine: the path every front end (gRPC, `/json`) takes.
pub async fn decide(
    engine: &Engine,
    request: pb::RateLimitRequest,
) -> Result<pb::RateLimitResponse, EngineError> {
    let request = from_proto(request)?;
    Ok(to_proto(engine.should_rate_limit(&request).await?))
}

/// Whether a wire answer is `OVER_LIMIT` as a whole.
pub fn over_limit(answer: &pb::RateLimitResponse) -> bool {
    answer.overall_code == pb_resp::Code::OverLimit as i32
}

/// Converts a wire request, moving its strings.
pub fn from_proto(request: pb::RateLimitRequest) -> Result<engine::Request, EngineError> {
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| descriptor_from_proto(i, d))
        .collect::<Result<_, _>>()?;
    Ok(engine::Request {
        domain: request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

fn descriptor_from_proto(
    index: usize,
    d: pb::RateLimitDescriptor,
) -> Result<engine::Descriptor, EngineError> {
    let limit = match d.limit {
        Some(l) => Some(engine::Override {
            requests_per_unit: l.requests_per_unit,
            unit: override_unit(l.unit).ok_or_else(|| {
                EngineError::InvalidArgument(format!(
                    "descriptors[{index}].limit.unit must be one of SECOND, MINUTE, HOUR, DAY, \
                     MONTH, YEAR (got {})",
                    l.unit
                ))
            })?,
        }),
        None => None,
    };
    Ok(engine::Descriptor {
        entries: d
            .entries
            .into_iter()
            .map(|e| Entry::new(e.key, e.value))
            .collect(),
        limit,
        hits_addend: d.hits_addend,
        refund: d.is_negative_hits,
    })
}

fn override_unit(raw: i32) -> Option<Unit> {
    Some(match RateLimitUnit::try_from(raw).ok()? {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => Unit::Second,
        RateLimitUnit::Minute => Unit::Minute,
        RateLimitUnit::Hour => Unit::Hour,
        RateLimitUnit::Day => Unit::Day,
        RateLimitUnit::Month => Unit::Month,
        RateLimitUnit::Year => Unit::Year,
    })
}

fn unit_to_proto(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn code_to_proto(code: Code) -> pb_resp::Code {
    match code {
        Code::Ok => pb_resp::Code::Ok,
        Code::OverLimit => pb_resp::Code::OverLimit,
        Code::Unknown => pb_resp::Code::Unknown,
    }
}

/// Converts an engine answer to the wire.
pub fn to_proto(r: engine::Response) -> pb::RateLimitResponse {
    pb::RateLimitResponse {
        overall_code: code_to_proto(r.overall_code).into(),
        statuses: r.statuses.into_iter().map(status_to_proto).collect(),
        response_headers_to_add: r
            .response_headers
            .into_iter()
            .map(|(key, value)| pb::HeaderValue {
                key,
                value,
                raw_value: Vec::new(),
            })
            .collect(),
        dynamic_metadata: r.dynamic_metadata.map(struct_of),
        raw_body: r.raw_body.map(String::into_bytes).unwrap_or_default(),
        ..Default::default()
    }
}

fn status_to_proto(s: engine::DescriptorStatus) -> pb_resp::DescriptorStatus {
    pb_resp::DescriptorStatus {
        code: code_to_proto(s.code).into(),
        current_limit: s.current_limit.map(|l| pb_resp::RateLimit {
            name: l.name.unwrap_or_default(),
            requests_per_unit: l.requests_per_unit,
            unit: unit_to_proto(l.unit).into(),
        }),
        limit_remaining: s.limit_remaining,
        duration_until_reset: s.duration_until_reset.map(|secs| prost_types::Duration {
            seconds: i64::try_from(secs).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// JSON object -> `google.protobuf.Struct`.
pub fn struct_of(map: serde_json::Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map.into_iter().map(|(k, v)| (k, value_of(v))).collect(),
    }
}

fn value_of(v: Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(value_of).collect(),
        }),
        Value::Object(m) => Kind::StructValue(struct_of(m)),
    };
    prost_types::Value { kind: Some(kind) }
}
