//! The whole service in process, as the binary composes it (`sluice::app::server`): rules from
//! an ADS server started here, envoyproxy/ratelimit's metric names and debug port, every port
//! on a port the system chose. The ports are bound only once the first rules arrived; the
//! answers come from them; the drop-in listeners serve; the service stops on its shutdown
//! future.

use std::collections::HashMap;
use std::time::Duration;

use sluice::app::server::Server;
use sluice::config::settings::{Overrides, Settings};
use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use sluice::testing::grpc::*;
use sluice::testing::http::get;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::support::ads::{Ads, snapshot};

fn settings(xds: std::net::SocketAddr) -> Settings {
    let env: HashMap<String, String> = [
        ("SLUICE_XDS__SERVER", format!("http://{xds}")),
        ("SLUICE_XDS__RETRY_INITIAL_MS", "100".to_owned()),
        ("SLUICE_SERVER__GRPC_LISTEN", "127.0.0.1:0".to_owned()),
        ("SLUICE_SERVER__ADMIN_LISTEN", "127.0.0.1:0".to_owned()),
        ("SLUICE_RATELIMIT_METRICS__LISTEN", "127.0.0.1:0".to_owned()),
        ("SLUICE_DEBUG__LISTEN", "127.0.0.1:0".to_owned()),
        ("SLUICE_SERVER__DRAIN_DELAY_SECS", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    Settings::load(None, env, &Overrides::default()).expect("settings")
}

fn config(per_minute: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: "composed".into(),
        domain: "composed".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: per_minute,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_composed_service_binds_after_the_first_xds_rules_and_serves_every_listener() {
    // The management server, with no rules yet.
    let (push, rules) = watch::channel(None);
    let (requests, _received) = mpsc::unbounded_channel();
    let kill = CancellationToken::new();
    let ads = Ads {
        snapshot: rules,
        requests,
        kill: kill.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let xds = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let ads_stopped = kill.clone().cancelled_owned();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming_shutdown(incoming, ads_stopped),
    );

    let server = Server::build(settings(xds)).expect("built");
    let (stop, stopped) = oneshot::channel::<()>();
    let binding = tokio::spawn(server.bind(std::future::pending()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!binding.is_finished(), "bound before any rules arrived");
    push.send(Some(snapshot("1", &[config(3)]))).unwrap();
    let bound = tokio::time::timeout(Duration::from_secs(10), binding)
        .await
        .expect("bound once the rules arrived")
        .expect("joined")
        .expect("bound")
        .expect("not shut down");
    let addrs = bound.addresses().expect("addresses");
    let running = tokio::spawn(bound.run(async {
        let _ = stopped.await;
    }));

    let url = format!("http://{}", addrs.grpc);
    let mut client = RateLimitServiceClient::connect(url).await.expect("gRPC");
    let ask = || req("composed", vec![desc(&[("k", "v")])]);
    let codes: Vec<Code> = {
        let mut codes = Vec::new();
        for _ in 0..4 {
            codes.push(overall(&call(&mut client, ask()).await));
        }
        codes
    };
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
        "3 per minute, from xDS"
    );
    let metrics = get(addrs.ratelimit_metrics.expect("metrics port"), "/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains("ratelimit_service_rate_limit_over_limit{domain=\"composed\",key1=\"k\"} 1"),
        "{}",
        metrics.body
    );
    let debug = get(addrs.debug.expect("debug port"), "/rlconfig").await;
    assert_eq!(debug.status, 200);
    assert!(debug.body.contains("composed"), "{}", debug.body);
    let admin = get(addrs.admin.expect("admin port"), "/readyz").await;
    assert_eq!(admin.status, 200, "{}", admin.body);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("stopped within the grace period")
        .expect("joined")
        .expect("a clean stop");
    assert!(
        tokio::net::TcpStream::connect(addrs.grpc.tcp().expect("TCP"))
            .await
            .is_err(),
        "the gRPC port is closed"
    );
    kill.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_while_waiting_for_the_first_rules_binds_nothing() {
    let server = Server::build(settings("127.0.0.1:9".parse().unwrap())).expect("built");
    let bound = tokio::time::timeout(
        Duration::from_secs(5),
        server.bind(tokio::time::sleep(Duration::from_millis(200))),
    )
    .await
    .expect("returned on shutdown")
    .expect("no error");
    assert!(bound.is_none());
}

#[test]
fn bad_rules_files_are_every_error_of_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let env = [("SLUICE_RULES__PATHS".to_owned(), path.display().to_string())]
        .into_iter()
        .collect();
    let settings = Settings::load(None, env, &Overrides::default()).expect("settings");
    let Err(error) = Server::build(settings) else {
        panic!("built from bad rules");
    };
    assert!(
        error
            .0
            .iter()
            .any(|e| e.contains("bad.yaml:4") && e.contains("unit")),
        "{error}"
    );
}
