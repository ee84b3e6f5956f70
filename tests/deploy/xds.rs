//! Rules over xDS, end to end: an ADS server started here (tonic, built from sluice's own
//! protos, mTLS with certificates generated here) pushes `RateLimitConfig` sets to the real
//! `sluice` binary: the first set, an update (answers change within 1 s), a broken set
//! (NACKed with its errors, answers unchanged), then the server goes away and comes back
//! (answers unchanged meanwhile, the client reconnects and follows the new set).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sluice::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use sluice::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use sluice::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use sluice::testing::eventually;
use sluice::testing::grpc::*;
use sluice::testing::http::get;
use sluice::testing::process::{
    HeldPort, LISTENERS_LOG, Served, loopback, serving, serving_grpc, sluice_command,
};
use sluice::xds::TYPE_URL;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::support::ads::{Ads, snapshot};
use crate::support::certs::Ca;

const WITHIN: Duration = Duration::from_secs(10);

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The rules of domain `d`: key `k` with `n` per minute (unit UNKNOWN: a broken set).
fn rules(n: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: "d".into(),
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// A running management server on `addr`, stopped (streams and listener) by `stop`.
struct Running {
    kill: CancellationToken,
    serving: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.kill.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.serving).await;
    }
}

struct Tls {
    server: (String, String),
    ca: String,
}

async fn serve(
    addr: SocketAddr,
    tls: &Tls,
    snapshot: watch::Receiver<Option<DiscoveryResponse>>,
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
) -> Running {
    let kill = CancellationToken::new();
    let ads = Ads {
        snapshot,
        requests,
        kill: kill.clone(),
    };
    let config = ServerTlsConfig::new()
        .identity(Identity::from_pem(&tls.server.0, &tls.server.1))
        .client_ca_root(Certificate::from_pem(&tls.ca));
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let signal = kill.clone().cancelled_owned();
    let serving = tokio::spawn(async move {
        Server::builder()
            .tls_config(config)
            .unwrap()
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming_shutdown(incoming, signal)
            .await
            .unwrap();
    });
    Running { kill, serving }
}

/// The limit sluice answers for `k` in domain `d` (None: no limit, or no answer).
async fn limit(url: &str) -> Option<u32> {
    let mut c = RateLimitServiceClient::connect(url.to_owned()).await.ok()?;
    let answer = c
        .should_rate_limit(req("d", vec![desc(&[("k", "v")])]))
        .await
        .ok()?
        .into_inner();
    answer.statuses.first().and_then(limit_of).map(|l| l.0)
}

/// The next request the server received, within `WITHIN`.
async fn next(requests: &mut mpsc::UnboundedReceiver<DiscoveryRequest>) -> DiscoveryRequest {
    tokio::time::timeout(WITHIN, requests.recv())
        .await
        .expect("a request from sluice in time")
        .expect("the request channel is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_arrive_update_refuse_and_survive_a_lost_server() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let tls = Tls {
        server: ca.leaf(&["localhost", "127.0.0.1"]),
        ca: ca.0.pem(),
    };
    let (client_cert, client_key) = ca.leaf(&["envoy-ratelimit"]);
    let ca_file = write(dir.path(), "ca.crt", &tls.ca);
    let cert_file = write(dir.path(), "tls.crt", &client_cert);
    let key_file = write(dir.path(), "tls.key", &client_key);

    // The management server goes away and comes back on the same address: a port from the
    // kernel, held for it meanwhile.
    let held = HeldPort::new();
    let addr = held.addr();
    let (push, snapshots) = watch::channel(None);
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let server = serve(addr, &tls, snapshots.clone(), requests_tx.clone()).await;

    let any = loopback(0).to_string();
    let mut child = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--grpc-listen", &any])
        .args(["--admin-listen", &any])
        .env("SLUICE_XDS__SERVER", addr.to_string())
        .env("SLUICE_XDS__NODE_ID", "envoy-ratelimit")
        .env("SLUICE_XDS__CA_FILE", &ca_file)
        .env("SLUICE_XDS__CERT_FILE", &cert_file)
        .env("SLUICE_XDS__KEY_FILE", &key_file)
        .env("SLUICE_XDS__SERVER_NAME", "localhost")
        .env("SLUICE_XDS__START_WITHOUT_RULES", "true")
        .env("SLUICE_XDS__RETRY_INITIAL_MS", "100")
        .env("SLUICE_XDS__RETRY_MAX_MS", "400")
        .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice");
    let [grpc, admin] = serving(&mut child, ["gRPC", "admin HTTP"]);
    let _served = Served(child);
    let url = format!("http://{grpc}");

    // Started without rules: not ready, and says why.
    let first = next(&mut requests).await;
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!(
        first.node.as_ref().map(|n| n.id.as_str()),
        Some("envoy-ratelimit")
    );
    assert!(first.version_info.is_empty() && first.response_nonce.is_empty());
    let ready = get(admin, "/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(
        ready
            .body
            .contains("waiting for the first rules from xDS server"),
        "{}",
        ready.body
    );

    // A broken first set: NACKed, and readiness says why.
    push.send_replace(Some(snapshot("0", &[rules(1, RateLimitUnit::Unknown)])));
    let nack = next(&mut requests).await;
    assert!(nack.error_detail.is_some() && nack.version_info.is_empty());
    let ready = get(admin, "/readyz").await;
    assert_eq!(ready.status, 503);
    assert!(
        ready.body.contains("set version 0 refused (1 error(s))"),
        "{}",
        ready.body
    );

    // The first good set: answered within 1 s, ACKed, ready.
    push_and_see(&push, snapshot_of("1", 2), &url, 2, "the first set answers").await;
    let ack = next(&mut requests).await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "nonce-1")
    );
    assert!(ack.error_detail.is_none());
    eventually(WITHIN, "ready after the first set", || async {
        get(admin, "/readyz").await.status == 200
    })
    .await;

    // An update: answers change within 1 s.
    push_and_see(&push, snapshot_of("2", 5), &url, 5, "the update answers").await;
    let ack = next(&mut requests).await;
    assert_eq!(ack.version_info, "2");
    assert!(ack.error_detail.is_none());

    // A broken set: NACKed with its errors, the last good rules still answer.
    push.send_replace(Some(snapshot("3", &[rules(9, RateLimitUnit::Unknown)])));
    let nack = next(&mut requests).await;
    assert_eq!(nack.response_nonce, "nonce-3");
    assert_eq!(
        nack.version_info, "2",
        "a NACK carries the last accepted version"
    );
    let error = nack.error_detail.expect("a NACK carries the errors");
    assert_eq!(error.code, 3);
    assert!(error.message.contains("xds:d:"), "{}", error.message);
    assert!(error.message.contains("missing unit"), "{}", error.message);
    assert_eq!(limit(&url).await, Some(5));
    let dump = get(admin, "/rlconfig").await.body;
    assert!(dump.starts_with("# xds version 2\n"), "{dump}");
    assert!(dump.contains("last failed reload"), "{dump}");

    // The server goes away: nothing changes meanwhile.
    server.stop().await;
    for _ in 0..10 {
        assert_eq!(limit(&url).await, Some(5));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(admin, "/readyz").await.status, 200);

    // It comes back with a new set: sluice reconnects, says what it has, follows.
    push.send_replace(Some(snapshot_of("4", 7)));
    let server = serve(addr, &tls, snapshots, requests_tx).await;
    let hello = loop {
        let r = next(&mut requests).await;
        if r.response_nonce.is_empty() {
            break r;
        }
    };
    assert_eq!(
        hello.version_info, "2",
        "the reconnection says the accepted version"
    );
    eventually(WITHIN, "the set after reconnection answers", || async {
        limit(&url).await == Some(7)
    })
    .await;
    let ack = next(&mut requests).await;
    assert_eq!(ack.version_info, "4");
    assert!(
        get(admin, "/rlconfig")
            .await
            .body
            .starts_with("# xds version 4\n")
    );
    server.stop().await;
}

/// Pushes `set`, then waits until the answers show `expected`: within 1 s of the push.
async fn push_and_see(
    push: &watch::Sender<Option<DiscoveryResponse>>,
    set: DiscoveryResponse,
    url: &str,
    expected: u32,
    what: &str,
) {
    let pushed = Instant::now();
    push.send_replace(Some(set));
    eventually(WITHIN, what, || async {
        limit(url).await == Some(expected)
    })
    .await;
    assert!(
        pushed.elapsed() < Duration::from_secs(1),
        "{what}: {:?}",
        pushed.elapsed()
    );
}

fn snapshot_of(version: &str, n: u32) -> DiscoveryResponse {
    snapshot(version, &[rules(n, RateLimitUnit::Minute)])
}

/// Without `start_without_rules`, sluice listens only once the first set arrived; a client
/// with no certificate trusted by the server never gets one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_start_without_rules_it_listens_after_the_first_set() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let tls = Tls {
        server: ca.leaf(&["localhost"]),
        ca: ca.0.pem(),
    };
    let stranger = Ca::new();
    let (cert, key) = stranger.leaf(&["intruder"]);
    let held = HeldPort::new();
    let addr = held.addr();
    let (push, snapshot) = watch::channel(Some(snapshot_of("7", 3)));
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let server = serve(addr, &tls, snapshot, requests_tx).await;
    let any = loopback(0).to_string();
    let start = |cert: &str, key: &str, name: &str| {
        sluice_command(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--grpc-listen", &any])
            .args(["--admin-listen", &any])
            .env(
                "SLUICE_XDS__SERVER",
                format!("https://localhost:{}", addr.port()),
            )
            .env("SLUICE_XDS__CA_FILE", write(dir.path(), "ca.crt", &tls.ca))
            .env(
                "SLUICE_XDS__CERT_FILE",
                write(dir.path(), &format!("{name}.crt"), cert),
            )
            .env(
                "SLUICE_XDS__KEY_FILE",
                write(dir.path(), &format!("{name}.key"), key),
            )
            .env("SLUICE_XDS__RETRY_INITIAL_MS", "100")
            .env("SLUICE_XDS__RETRY_MAX_MS", "200")
            .env("SLUICE_LOG__LEVEL", LISTENERS_LOG)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sluice")
    };
    // Refused by the server: never gets rules, never listens (its log, which names each
    // port it binds, names none).
    let mut refused = start(&cert, &key, "stranger");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    refused.kill().unwrap();
    let log = refused.wait_with_output().unwrap().stderr;
    let log = String::from_utf8_lossy(&log);
    assert!(!log.contains("serving"), "{log}");
    assert!(
        requests.try_recv().is_err(),
        "a client without a trusted certificate got through"
    );
    // Trusted: listens once the set is in, and answers from it.
    let (good_cert, good_key) = ca.leaf(&["envoy-ratelimit"]);
    let mut good = start(&good_cert, &good_key, "good");
    let grpc = serving_grpc(&mut good);
    let _served = Served(good);
    assert_eq!(limit(&format!("http://{grpc}")).await, Some(3));
    drop(push);
    server.stop().await;
}
