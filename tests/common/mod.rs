//! Shared helpers of the integration tests: requests built with the `envoy-types` client
//! (generated from Envoy's own protos), so every call proves wire compatibility.

#![allow(dead_code, unused_imports)]

pub mod http;

pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit::Unit,
};
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
pub use sluice::testing::{SECOND, TestServer};

use std::process::{Child, Command};
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

/// The `sluice` binary at `path`, with no `SLUICE_*` or `RUST_LOG` from the test's environment.
pub fn sluice_command(path: &str) -> Command {
    let mut cmd = Command::new(path);
    cmd.env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("SLUICE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits up to 20 s until something accepts connections on `port` of 127.0.0.1.
pub fn wait_listening(port: u16) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing listens on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `sluice serve` child process, killed if the test fails before stopping it.
pub struct Served(pub Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
