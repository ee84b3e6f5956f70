//! Serving around the rate-limit call: gRPC health, server reflection (v1 and v1alpha), and a
//! shutdown that lets in-flight requests finish.

use std::sync::Arc;
use std::time::Duration;

use sluice::config::settings::Settings;
use sluice::limiter::{Batch, BatchOutcome, BoxFuture, Limiter, LimiterError, MemoryLimiter};
use sluice::testing::grpc::*;
use tokio_stream::StreamExt as _;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n";

#[tokio::test]
async fn grpc_health_reports_serving() {
    let server = TestServer::start(RULES).await;
    let mut health = HealthClient::new(channel(&server).await);
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
}

/// Asks the reflection service of `$server`, in version `$v` (`v1` or `v1alpha` of
/// tonic-reflection's protos), the question `$question` (a `MessageRequest` of that version),
/// and gives the answer's `message_response`.
macro_rules! reflect {
    ($v:ident, $server:expr, $question:expr) => {{
        use tonic_reflection::pb::$v::ServerReflectionRequest;
        use tonic_reflection::pb::$v::server_reflection_client::ServerReflectionClient;
        let mut c = ServerReflectionClient::new(channel($server).await);
        let ask = ServerReflectionRequest {
            host: String::new(),
            message_request: Some($question),
        };
        let mut answers = c
            .server_reflection_info(tokio_stream::iter([ask]))
            .await
            .unwrap()
            .into_inner();
        answers.next().await.unwrap().unwrap().message_response
    }};
}

#[tokio::test]
async fn reflection_v1_lists_the_service() {
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let server = TestServer::start(RULES).await;
    let answer = reflect!(v1, &server, MessageRequest::ListServices(String::new()));
    let Some(MessageResponse::ListServicesResponse(list)) = answer else {
        panic!("unexpected reflection answer: {answer:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_owned()),
        "{names:?}"
    );
}

#[tokio::test]
async fn reflection_v1alpha_resolves_the_request_type() {
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let server = TestServer::start(RULES).await;
    let symbol = "envoy.service.ratelimit.v3.RateLimitRequest".to_owned();
    let answer = reflect!(
        v1alpha,
        &server,
        MessageRequest::FileContainingSymbol(symbol)
    );
    let Some(MessageResponse::FileDescriptorResponse(files)) = answer else {
        panic!("unexpected reflection answer: {answer:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
}

/// A memory limiter that takes its time, to keep a request in flight.
struct Slow(MemoryLimiter);

impl Limiter for Slow {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            self.0.check(batch).await
        })
    }

    fn name(&self) -> &'static str {
        "slow"
    }
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let limiter: Arc<dyn Limiter> = Arc::new(Slow(MemoryLimiter::new(100)));
    let server = TestServer::start_over(Settings::default(), RULES, limiter).await;
    let url = server.url();
    let in_flight = send_in_background(&url).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.begin_stop();
    in_flight_completes_then_stops(server, in_flight).await;
    assert!(
        RateLimitServiceClient::connect(url).await.is_err(),
        "no new connections after shutdown"
    );
}
