//! A gRPC client of the rate-limit service for tests, built with the `envoy-types` crate
//! (generated from Envoy's own protos), so every call proves wire compatibility: requests,
//! descriptors, calls and the assertions on their answers.

pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit::Unit,
};
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
pub use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;

pub use super::{SECOND, TestServer};

use std::time::Duration;

pub type Client = RateLimitServiceClient<tonic::transport::Channel>;

/// A channel to the test server, for the other gRPC clients.
pub async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(server.url())
        .expect("a valid URL")
        .connect()
        .await
        .expect("connect to the test server")
}

pub async fn client(server: &TestServer) -> Client {
    RateLimitServiceClient::connect(server.url())
        .await
        .expect("connect to the test server")
}

/// A descriptor from `(key, value)` pairs.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// `message` as one gRPC frame (uncompressed): a flag byte, its length in four bytes big-endian,
/// then its bytes; for a client that speaks HTTP/2 itself.
pub fn grpc_frame(message: &impl prost::Message) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let mut frame = vec![0];
    frame.extend_from_slice(
        &u32::try_from(bytes.len())
            .expect("a small message")
            .to_be_bytes(),
    );
    frame.extend_from_slice(&bytes);
    frame
}

/// The same descriptor with its own cost.
pub fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
    d
}

pub fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// Calls and expects an answer (not a gRPC error).
pub async fn call(c: &mut Client, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r)
        .await
        .expect("ShouldRateLimit answered with an error")
        .into_inner()
}

/// Calls one single-entry descriptor in domain `test`.
pub async fn hit(c: &mut Client, key: &str, value: &str) -> RateLimitResponse {
    call(c, req("test", vec![desc(&[(key, value)])])).await
}

pub fn overall(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).expect("a known overall code")
}

pub fn code(s: &DescriptorStatus) -> Code {
    Code::try_from(s.code).expect("a known code")
}

/// `(requests_per_unit, unit, name)` of a status's current limit.
pub fn limit_of(s: &DescriptorStatus) -> Option<(u32, Unit, String)> {
    s.current_limit.as_ref().map(|l| {
        (
            l.requests_per_unit,
            Unit::try_from(l.unit).expect("a known unit"),
            l.name.clone(),
        )
    })
}

pub fn reset_secs(s: &DescriptorStatus) -> Option<i64> {
    s.duration_until_reset.as_ref().map(|d| d.seconds)
}

/// A response's `dynamic_metadata` as JSON (protobuf numbers are doubles: `1` reads `1.0`).
pub fn metadata_json(r: &RateLimitResponse) -> Option<serde_json::Value> {
    r.dynamic_metadata.as_ref().map(struct_json)
}

fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> serde_json::Value {
    let fields = s.fields.iter().map(|(k, v)| (k.clone(), value_json(v)));
    serde_json::Value::Object(fields.collect())
}

fn value_json(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    use serde_json::Value as J;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(value_json).collect()),
    }
}

/// A client of the server at `url`, retrying until it accepts a connection or `limit` passes.
pub async fn connect_within(url: &str, limit: Duration) -> Client {
    let start = tokio::time::Instant::now();
    loop {
        match RateLimitServiceClient::connect(url.to_owned()).await {
            Ok(c) => return c,
            Err(e) if start.elapsed() > limit => panic!("sluice did not come up: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The overall code of one [`hit`].
pub async fn hit_code(c: &mut Client, key: &str, value: &str) -> Code {
    overall(&hit(c, key, value).await)
}

/// A request in domain `test` with one descriptor per `(key, value)` pair.
pub fn each(pairs: &[(&str, &str)]) -> RateLimitRequest {
    req("test", pairs.iter().map(|&p| desc(&[p])).collect())
}

/// A request in domain `test` with one single-entry descriptor that costs `cost`.
pub fn costing(key: &str, value: &str, cost: u64) -> RateLimitRequest {
    req("test", vec![with_hits(desc(&[(key, value)]), cost)])
}

/// A request in domain `test` that gives `amount` back to one single-entry descriptor.
pub fn refund(key: &str, value: &str, amount: u64) -> RateLimitRequest {
    let mut back = with_hits(desc(&[(key, value)]), amount);
    back.is_negative_hits = true;
    req("test", vec![back])
}

/// `d` with the client's own limit of `requests_per_unit` per `unit`.
pub fn overridden(
    mut d: RateLimitDescriptor,
    requests_per_unit: u32,
    unit: RateLimitUnit,
) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    d
}

/// The name of a status's current limit.
pub fn limit_name(s: &DescriptorStatus) -> Option<String> {
    limit_of(s).map(|l| l.2)
}

/// Asserts the overall code of `r`, and the code of each of its statuses, in order.
#[track_caller]
pub fn assert_codes(r: &RateLimitResponse, overall_code: Code, statuses: &[Code]) {
    assert_eq!(overall(r), overall_code, "overall code");
    let codes: Vec<Code> = r.statuses.iter().map(code).collect();
    assert_eq!(codes, statuses, "status codes");
}

/// Calls `r` and asserts that it is answered OK with no limit: no current limit, nothing
/// remaining, no reset.
pub async fn assert_ok_without_limit(c: &mut Client, r: RateLimitRequest) {
    let answer = call(c, r.clone()).await;
    assert_eq!(overall(&answer), Code::Ok, "{r:?}");
    let s = &answer.statuses[0];
    assert_eq!(code(s), Code::Ok, "{r:?}");
    assert_eq!(s.current_limit, None, "{r:?}");
    assert_eq!(s.limit_remaining, 0, "{r:?}");
    assert_eq!(s.duration_until_reset, None, "{r:?}");
}

/// A request sent by [`send_in_background`].
pub type InFlight =
    tokio::task::JoinHandle<Result<tonic::Response<RateLimitResponse>, tonic::Status>>;

/// A request for `k=v` in domain `test` from a new client of `url`, sent in the background (to
/// be in flight while the server stops); the client is connected when this returns.
pub async fn send_in_background(url: &str) -> InFlight {
    let mut c = RateLimitServiceClient::connect(url.to_owned())
        .await
        .expect("connect to the server");
    tokio::spawn(async move {
        c.should_rate_limit(req("test", vec![desc(&[("k", "v")])]))
            .await
    })
}

/// Once the server is stopping ([`TestServer::begin_stop`]): the request in flight completes,
/// `OK`, then the server stops within 5 s.
pub async fn in_flight_completes_then_stops(server: TestServer, in_flight: InFlight) {
    let answer = in_flight
        .await
        .expect("the in-flight request's task")
        .expect("the in-flight request completes");
    assert_eq!(overall(answer.get_ref()), Code::Ok);
    tokio::time::timeout(Duration::from_secs(5), server.stop())
        .await
        .expect("the server stops once the request is done")
        .expect("the server's result");
}
