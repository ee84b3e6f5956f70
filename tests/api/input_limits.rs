//! The `[input]` bounds, through the real gRPC path: for each, a request at the bound is
//! answered and one unit over it is refused with the right code and a message naming the
//! setting; the bound on concurrent streams holds a third call back while two are in flight.

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use sluice::config::settings::{InputSettings, Settings};
use sluice::testing::grpc::*;
use sluice::testing::http::{post, sample};
use sluice::testing::limits::Gate;
use tonic::Code as GrpcCode;

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";

fn settings(input: InputSettings) -> Settings {
    Settings {
        input,
        ..Settings::default()
    }
}

/// Expects INVALID_ARGUMENT naming `setting`, its bound and `value`.
async fn refused(c: &mut Client, r: RateLimitRequest, setting: &str, value: usize, max: usize) {
    let err = c.should_rate_limit(r).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::InvalidArgument, "{}", err.message());
    let m = err.message();
    assert!(m.contains(&format!("input.{setting} = {max}")), "{m}");
    assert!(m.contains(&value.to_string()), "{m}");
}

fn entries(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{i}"), "v".to_owned())).collect()
}

fn desc_of(pairs: &[(String, String)]) -> RateLimitDescriptor {
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
    desc(&refs)
}

#[tokio::test]
async fn descriptors_per_request() {
    let d = InputSettings::default();
    assert_eq!(d.max_descriptors, 64);
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    let many = |n: usize| (0..n).map(|i| desc(&[("k", &i.to_string())])).collect();
    let r = call(&mut c, req("test", many(64))).await;
    assert_eq!(r.statuses.len(), 64);
    assert!(r.statuses.iter().all(|s| s.current_limit.is_some()));
    refused(&mut c, req("test", many(65)), "max_descriptors", 65, 64).await;
}

#[tokio::test]
async fn entries_per_descriptor() {
    assert_eq!(InputSettings::default().max_entries, 32);
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    let r = call(&mut c, req("test", vec![desc_of(&entries(32))])).await;
    assert_eq!(r.statuses.len(), 1);
    let over = req("test", vec![desc(&[("k", "v")]), desc_of(&entries(33))]);
    refused(&mut c, over, "max_entries", 33, 32).await;
}

#[tokio::test]
async fn domain_key_and_value_lengths_in_bytes() {
    let d = InputSettings::default();
    assert_eq!(
        (d.max_domain_bytes, d.max_key_bytes, d.max_value_bytes),
        (256, 256, 16384)
    );
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    // A multi-byte character counts for its bytes: 128 x 2 bytes is exactly the bound.
    let domain = "é".repeat(128);
    let r = call(&mut c, req(&domain, vec![desc(&[("k", "v")])])).await;
    assert_eq!(overall(&r), Code::Ok);
    let over = format!("{domain}x");
    refused(
        &mut c,
        req(&over, vec![desc(&[("k", "v")])]),
        "max_domain_bytes",
        257,
        256,
    )
    .await;

    let key = "k".repeat(256);
    let r = call(&mut c, req("test", vec![desc(&[(&key, "v")])])).await;
    assert_eq!(r.statuses.len(), 1);
    let long = format!("{key}k");
    let over = req("test", vec![desc(&[("k", "v"), (&long, "v")])]);
    refused(&mut c, over, "max_key_bytes", 257, 256).await;

    let value = "v".repeat(16384);
    let r = call(&mut c, req("test", vec![desc(&[("k", &value)])])).await;
    assert!(
        r.statuses[0].current_limit.is_some(),
        "the value is matched whole"
    );
    let long = format!("{value}v");
    let over = req("test", vec![desc(&[("k", &long)])]);
    refused(&mut c, over, "max_value_bytes", 16385, 16384).await;
}

#[tokio::test]
async fn the_message_names_where_the_bound_is_exceeded() {
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    let value = "v".repeat(16385);
    let over = req(
        "test",
        vec![desc(&[("k", "v")]), desc(&[("a", "b"), ("k", &value)])],
    );
    let err = c.should_rate_limit(over).await.unwrap_err();
    assert_eq!(
        err.message(),
        "descriptors[1].entries[1].value: 16385 bytes, more than input.max_value_bytes = 16384"
    );
}

/// A request of `descriptors` single-entry descriptors whose encoding is exactly `bytes`,
/// its values as even as can be.
fn request_of_size(descriptors: usize, bytes: usize) -> RateLimitRequest {
    let mut r = req(
        "test",
        (0..descriptors).map(|_| desc(&[("k", "")])).collect(),
    );
    let each = (bytes / descriptors).saturating_sub(16);
    for d in &mut r.descriptors {
        d.entries[0].value = "v".repeat(each);
    }
    let mut next = 0;
    while r.encoded_len() < bytes {
        r.descriptors[next % descriptors].entries[0].value.push('v');
        next += 1;
    }
    while r.encoded_len() > bytes {
        r.descriptors[next % descriptors].entries[0].value.pop();
        next += 1;
    }
    assert_eq!(
        r.encoded_len(),
        bytes,
        "no request of exactly {bytes} bytes"
    );
    r
}

#[tokio::test]
async fn request_size_at_the_default_bound() {
    let max = InputSettings::default().max_request_bytes;
    assert_eq!(max, 1 << 20);
    let server = TestServer::start(RULES).await;
    let mut c = client(&server).await;
    // 64 descriptors with values just under 16 KiB: every shape bound holds, and the
    // encoding is exactly 1 MiB.
    let at = request_of_size(64, max);
    assert!(
        at.descriptors
            .iter()
            .all(|d| d.entries[0].value.len() <= 16384)
    );
    let r = call(&mut c, at).await;
    assert_eq!(r.statuses.len(), 64);
    let over = request_of_size(64, max + 1);
    let err = c.should_rate_limit(over).await.unwrap_err();
    assert_eq!(err.code(), GrpcCode::ResourceExhausted, "{}", err.message());
    assert!(
        err.message().contains(&format!("{}", max + 1)),
        "{}",
        err.message()
    );
    let r = hit(&mut c, "k", "after").await;
    assert_eq!(overall(&r), Code::Ok, "the connection still serves");
}

#[tokio::test]
async fn request_size_when_configured() {
    let input = InputSettings {
        max_request_bytes: 1000,
        ..InputSettings::default()
    };
    let server = TestServer::start_with(settings(input), RULES).await;
    let mut c = client(&server).await;
    let r = call(&mut c, request_of_size(1, 1000)).await;
    assert_eq!(overall(&r), Code::Ok);
    let err = c
        .should_rate_limit(request_of_size(1, 1001))
        .await
        .unwrap_err();
    assert_eq!(err.code(), GrpcCode::ResourceExhausted, "{}", err.message());
    assert!(err.message().contains("1001"), "{}", err.message());
    assert!(
        err.message().contains("input.max_request_bytes = 1000"),
        "{}",
        err.message()
    );

    // `/json` takes the same bound on its body: 413 above it.
    let body = format!(
        r#"{{"domain":"test","descriptors":[{{"entries":[{{"key":"k","value":"{}"}}]}}]}}"#,
        "v".repeat(900)
    );
    assert!(body.len() <= 1000);
    assert_eq!(post(server.admin_addr, "/json", &body).await.status, 200);
    let body = format!("{body}{}", " ".repeat(1001 - body.len()));
    assert_eq!(post(server.admin_addr, "/json", &body).await.status, 413);
}

#[tokio::test]
async fn bounds_are_configurable_and_refusals_are_counted() {
    let input = InputSettings {
        max_descriptors: 2,
        max_entries: 1,
        max_key_bytes: 3,
        ..InputSettings::default()
    };
    let server = TestServer::start_with(settings(input), RULES).await;
    let mut c = client(&server).await;
    let two = req("test", vec![desc(&[("k", "a")]), desc(&[("abc", "b")])]);
    assert_eq!(call(&mut c, two).await.statuses.len(), 2);
    let three = req("test", vec![desc(&[("k", "a")]); 3]);
    refused(&mut c, three, "max_descriptors", 3, 2).await;
    let deep = req("test", vec![desc(&[("k", "a"), ("k", "b")])]);
    refused(&mut c, deep, "max_entries", 2, 1).await;
    let long = req("test", vec![desc(&[("abcd", "a")])]);
    refused(&mut c, long, "max_key_bytes", 4, 3).await;

    let json = r#"{"domain":"test","descriptors":[{"entries":[{"key":"k","value":"a"}]},{"entries":[{"key":"k","value":"a"}]},{"entries":[{"key":"k","value":"a"}]}]}"#;
    let answer = post(server.admin_addr, "/json", json).await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.body.contains("input.max_descriptors = 2"),
        "{}",
        answer.body
    );

    let text = sluice::testing::http::get(server.admin_addr, "/metrics")
        .await
        .body;
    let invalid = sample(&text, "sluice_requests_total", &[("result", "invalid")]);
    assert_eq!(invalid, Some(4.0), "{text}");
}

/// Starts three calls at once on ONE connection to a server allowing `streams`, holds them
/// in the limiter for a while, then lets them all go. Returns the most calls that were in the
/// limiter at once and how many calls were answered (the others must have been refused by
/// HTTP/2 with REFUSED_STREAM, which tonic reports as UNAVAILABLE).
async fn three_calls(streams: u32) -> (usize, usize) {
    let gate = Arc::new(Gate::new(100));
    let input = InputSettings {
        max_concurrent_streams: streams,
        ..InputSettings::default()
    };
    let server = TestServer::start_over(settings(input), RULES, gate.clone()).await;
    let channel = channel(&server).await;
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let mut c = RateLimitServiceClient::new(channel.clone());
            tokio::spawn(async move {
                c.should_rate_limit(req("test", vec![desc(&[("k", &i.to_string())])]))
                    .await
            })
        })
        .collect();
    tokio::time::timeout(
        Duration::from_secs(10),
        gate.entered((streams as usize).min(3)),
    )
    .await
    .expect("the calls never came");
    // Time for any call that is not held back to reach the limiter too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.release(3);
    let mut answered = 0;
    for call in calls {
        match call.await.expect("the call task") {
            Ok(answer) => {
                assert_eq!(overall(&answer.into_inner()), Code::Ok);
                answered += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), GrpcCode::Unavailable, "{e:?}");
                assert!(format!("{e:?}").contains("REFUSED_STREAM"), "{e:?}");
            }
        }
    }
    (gate.most_in_flight(), answered)
}

#[tokio::test]
async fn concurrent_streams_per_connection() {
    assert_eq!(InputSettings::default().max_concurrent_streams, 1024);
    // By default all three calls are in the limiter at once (the gate holds them, it does
    // not serialize them), and all are answered.
    assert_eq!(three_calls(1024).await, (3, 3));
    // With 2 streams allowed, never more than 2 are: the third waits on the client until a
    // stream is free (or, if it was sent before the client read the server's SETTINGS, it is
    // refused).
    let (most, answered) = three_calls(2).await;
    assert_eq!(most, 2);
    assert!(answered >= 2, "{answered} answered");
}
