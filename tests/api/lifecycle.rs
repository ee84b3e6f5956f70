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

/// Settings whose gRPC streams run on tasks of their own (`server.stream_tasks = true`) or
/// on their connection's task (the default).
fn streams_on(own_tasks: bool) -> Settings {
    let mut settings = Settings::default();
    settings.server.stream_tasks = own_tasks;
    settings
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish_with_a_task_per_stream() {
    let limiter: Arc<dyn Limiter> = Arc::new(Slow(MemoryLimiter::new(100)));
    let server = TestServer::start_over(streams_on(true), RULES, limiter).await;
    let in_flight = send_in_background(&server.url()).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.begin_stop();
    in_flight_completes_then_stops(server, in_flight).await;
}

/// Sends one `ShouldRateLimit` for `k=v` with the header `grpc-timeout: {timeout}` over a
/// bare HTTP/2 client (tonic's client would enforce the deadline itself), and gives the
/// answer's `grpc-status` and how long it took.
async fn call_with_grpc_timeout(url: &str, timeout: &str) -> (String, Duration) {
    let authority = url.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "{url}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(())
        .expect("request");
    let frame = grpc_frame(&req("test", vec![desc(&[("k", "v")])]));
    let started = tokio::time::Instant::now();
    let (answer, mut body) = client.send_request(request, false).expect("send headers");
    body.send_data(frame.into(), true)
        .expect("send the message");
    let answer = answer.await.expect("an answer");
    let status = match answer.headers().get("grpc-status") {
        Some(status) => status.clone(),
        None => {
            let mut body = answer.into_body();
            while let Some(data) = body.data().await {
                data.expect("the answer's data");
            }
            let trailers = body
                .trailers()
                .await
                .expect("trailers")
                .expect("some trailers");
            trailers.get("grpc-status").expect("grpc-status").clone()
        }
    };
    (
        status.to_str().expect("ascii").to_owned(),
        started.elapsed(),
    )
}

/// The server honours `grpc-timeout`: a request whose deadline passes before the limiter
/// decides (the limiter takes 400 ms) is answered CANCELLED (1) at the deadline; one with
/// time to spare is answered OK (0).
#[tokio::test]
async fn a_grpc_timeout_that_passes_is_answered_cancelled() {
    for own_tasks in [false, true] {
        let limiter: Arc<dyn Limiter> = Arc::new(Slow(MemoryLimiter::new(100)));
        let server = TestServer::start_over(streams_on(own_tasks), RULES, limiter).await;
        let (status, took) = call_with_grpc_timeout(&server.url(), "50m").await;
        assert_eq!(status, "1", "stream_tasks {own_tasks}: CANCELLED");
        assert!(
            took < Duration::from_millis(350),
            "stream_tasks {own_tasks}: the deadline did not cut the decision short ({took:?})"
        );
        let (status, took) = call_with_grpc_timeout(&server.url(), "5S").await;
        assert_eq!(status, "0", "stream_tasks {own_tasks}: OK");
        assert!(took >= Duration::from_millis(400), "{took:?}");
    }
}

/// A memory limiter whose decisions end in an order of their own: each waits 0 to 22 ms,
/// by its first key.
struct Shuffled(MemoryLimiter);

impl Limiter for Shuffled {
    fn check<'a>(&'a self, batch: &'a Batch) -> BoxFuture<'a, Result<BatchOutcome, LimiterError>> {
        Box::pin(async move {
            let spread = batch
                .hits
                .first()
                .map_or(0, |h| h.key.iter().map(|&b| u64::from(b)).sum::<u64>() % 23);
            tokio::time::sleep(Duration::from_millis(spread)).await;
            self.0.check(batch).await
        })
    }

    fn name(&self) -> &'static str {
        "shuffled"
    }
}

/// 200 requests in flight at once on one connection, answered out of order, each get their
/// own answer: request i names `k=v{i}` (i % 4) + 1 times, so its answer has that many
/// statuses, each with 5 - that many remaining.
#[tokio::test]
async fn many_streams_on_one_connection_each_get_their_own_answer() {
    for own_tasks in [false, true] {
        let limiter: Arc<dyn Limiter> = Arc::new(Shuffled(MemoryLimiter::new(10_000)));
        let server = TestServer::start_over(streams_on(own_tasks), RULES, limiter).await;
        let c = client(&server).await;
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..200_u32 {
            let mut c = c.clone();
            calls.spawn(async move {
                let value = format!("v{i}");
                let times = (i % 4) as usize + 1;
                let r = req("test", vec![desc(&[("k", value.as_str())]); times]);
                (times, call(&mut c, r).await)
            });
        }
        let mut answered = 0;
        while let Some(joined) = calls.join_next().await {
            let (times, answer) = joined.expect("a call's task");
            assert_eq!(overall(&answer), Code::Ok, "stream_tasks {own_tasks}");
            assert_eq!(
                answer.statuses.len(),
                times,
                "stream_tasks {own_tasks}: {answer:?}"
            );
            for status in &answer.statuses {
                assert_eq!(
                    status.limit_remaining,
                    5 - times as u32,
                    "stream_tasks {own_tasks}: {answer:?}"
                );
            }
            answered += 1;
        }
        assert_eq!(answered, 200);
    }
}
