//! The Rust client against the real binary: the axum example behind the tower layer answers
//! exactly its capacity of 200s per key, then 429 with `Retry-After` (and gRPC requests get
//! `RESOURCE_EXHAUSTED`); with sluice stopped or hung it follows its fail policy within its
//! timeout; `acquire` paces 50 callers on a 10/s key; TLS with a client certificate; the layer
//! on a tonic server answers `RESOURCE_EXHAUSTED` with `Retry-After`.

use std::net::SocketAddr;
use std::time::Duration;

use sluice::testing::http::{self, Answer};
use sluice::testing::process::SluiceProcess;
use sluice_client::{Client, FailPolicy, Limit, RateLimit, Throttle};
use tokio::time::Instant;

use crate::example;
use crate::serial_async;

/// `sluice serve` (memory backend, the demo rules it embeds) on ports from the kernel with `env`, killed
/// on drop.
fn start_sluice(env: &[(&str, &str)]) -> SluiceProcess {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules/demo.yaml");
    SluiceProcess::start(env!("CARGO_BIN_EXE_sluice"), demo.as_ref(), &[], env)
}

/// A sluice with no extra settings, and a client connected to it.
async fn start_with_client() -> (SluiceProcess, Client) {
    let sluice = start_sluice(&[]);
    let client = Client::builder(sluice.url())
        .connect()
        .await
        .expect("connect");
    (sluice, client)
}

/// The example service on a port from the kernel, with `client`; stopped when the guard drops.
async fn serve_example(
    client: Client,
    capacity: u32,
    period: Duration,
) -> (SocketAddr, tokio_util::sync::DropGuard) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let stop = tokio_util::sync::CancellationToken::new();
    let app = example::app(client, example::limit(capacity, period));
    let shutdown = stop.clone().cancelled_owned();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    });
    (addr, stop.drop_guard())
}

/// `GET /work` as `tenant`, with a `content-type` if given.
async fn get(addr: SocketAddr, tenant: &str, content_type: Option<&str>) -> Answer {
    let mut headers = vec![("x-tenant", tenant)];
    headers.extend(content_type.map(|c| ("content-type", c)));
    http::get_with(addr, "/work", &headers).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_admits_the_capacity_per_key_then_429_with_retry_after() {
    let _serial = serial_async().await;
    let sluice = start_sluice(&[]);
    let client = Client::builder(sluice.url())
        .timeout(Duration::from_millis(500))
        .fail_policy(FailPolicy::Closed)
        .connect()
        .await
        .expect("connect");
    // 5 per minute, all 5 at once: one more unit every 12 s.
    let (addr, _stop) = serve_example(client, 5, Duration::from_secs(60)).await;
    let started = Instant::now();
    let mut hammer = tokio::task::JoinSet::new();
    for tenant in ["acme", "globex", "initech"] {
        for _ in 0..20 {
            hammer.spawn(async move { (tenant, get(addr, tenant, None).await) });
        }
    }
    let mut per_tenant = std::collections::HashMap::<&str, (u32, u32)>::new();
    while let Some(done) = hammer.join_next().await {
        let (tenant, answer) = done.expect("a request");
        let counts = per_tenant.entry(tenant).or_default();
        match answer.status {
            200 => counts.0 += 1,
            429 => {
                counts.1 += 1;
                let retry: u64 = answer
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .expect("Retry-After");
                let waited = started.elapsed().as_secs();
                assert!(
                    (12 - waited.min(11)..=12).contains(&retry),
                    "Retry-After {retry} after {waited} s"
                );
                assert_eq!(answer.header("ratelimit-limit"), Some("5"));
                assert_eq!(answer.header("ratelimit-remaining"), Some("0"));
            }
            other => panic!("{tenant}: status {other}"),
        }
    }
    for tenant in ["acme", "globex", "initech"] {
        assert_eq!(per_tenant[tenant], (5, 15), "{tenant}: 200s and 429s");
    }
    // A gRPC request through the same layer is refused the gRPC way.
    let answer = get(addr, "acme", Some("application/grpc")).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("grpc-status"),
        Some("8"),
        "RESOURCE_EXHAUSTED"
    );
    assert!(answer.header("retry-after").is_some());
}

/// A port that accepts connections and never answers (a hung sluice).
fn black_hole() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    (listener, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sluice_the_fail_policy_answers_within_the_timeout() {
    let _serial = serial_async().await;
    let timeout = Duration::from_millis(300);
    let sluice = start_sluice(&[]);
    let stopped = sluice.url();
    drop(sluice);
    let (_hole, hung) = black_hole();
    for url in [stopped, hung] {
        for (policy, want) in [(FailPolicy::Open, 200), (FailPolicy::Closed, 503)] {
            let client = Client::builder(url.clone())
                .timeout(timeout)
                .fail_policy(policy)
                .connect_lazy()
                .expect("a lazy client");
            let (addr, _stop) = serve_example(client, 5, Duration::from_secs(60)).await;
            let started = Instant::now();
            let status = get(addr, "acme", None).await.status;
            let took = started.elapsed();
            assert_eq!(status, want, "{url} with {policy:?}");
            assert!(
                took < timeout + Duration::from_millis(200),
                "{url} with {policy:?}: {took:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_paces_fifty_callers_at_ten_per_second() {
    let _serial = serial_async().await;
    let (_sluice, client) = start_with_client().await;
    // 10 per second, one at a time (max_burst 0): one admission every 100 ms.
    let call = Throttle::key("pace", Limit::per_second(10));
    let started = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (client, call) = (client.clone(), call.clone());
        callers.spawn(async move {
            client
                .acquire(call, Duration::from_secs(30))
                .await
                .expect("acquired");
            Instant::now()
        });
    }
    let mut admitted: Vec<Duration> = Vec::new();
    while let Some(done) = callers.join_next().await {
        admitted.push(done.expect("a caller") - started);
    }
    admitted.sort();
    // The first goes at once, each next one 100 ms later: 4.9 s for 50.
    let total = admitted[49].as_secs_f64();
    assert!(
        (4.9 * 0.9..=4.9 * 1.1).contains(&total),
        "50 callers took {total:.3} s"
    );
    // Never more than 10 in any second, as sluice decides: its decisions are at least 100 ms
    // apart. They are seen here later than they are made, each by its own delay (the answer's
    // way back, a busy machine's scheduling), so times seen here can be closer together than
    // the decisions were, and a window over them proves nothing. What they do prove: every
    // decision came after `started`, and each is seen no earlier than it was made, so of the
    // first k + 1 seen, the one decided last was decided at least k x 100 ms after `started`,
    // and is seen no earlier: the (k + 1)-th seen comes at least k x 100 ms after `started`.
    // An admission ahead of the pace from the start fails this whatever the delays, and none
    // fails it falsely. (A burst after a lag would pass: that takes sluice's decision times.)
    for (k, &t) in admitted.iter().enumerate() {
        let earliest = Duration::from_millis(100) * k as u32;
        assert!(
            t >= earliest,
            "admission {} seen {t:?} after the start, before the {earliest:?} the pace allows",
            k + 1
        );
    }
    let closest = admitted
        .windows(11)
        .map(|w| w[10] - w[0])
        .min()
        .unwrap_or_default();
    eprintln!(
        "acquire: 50 callers at 10/s took {total:.3} s (ideal 4.9 s); 11 admissions seen \
         within {closest:?} at the closest (decided 1 s apart at least)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_gives_up_at_the_deadline_and_on_never() {
    let _serial = serial_async().await;
    let (_sluice, client) = start_with_client().await;
    let slow = Throttle::key("slow", Limit::per_minute(1));
    client
        .acquire(slow.clone(), Duration::from_secs(1))
        .await
        .expect("the first is free");
    let started = Instant::now();
    let late = client.acquire(slow, Duration::from_secs(1)).await;
    assert!(
        matches!(late, Err(sluice_client::AcquireError::Deadline { .. })),
        "{late:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "gave up at once, without waiting"
    );
    let too_big = Throttle::key("big", Limit::per_second(10).max_burst(4)).quantity(6);
    let never = client.acquire(too_big, Duration::from_secs(5)).await;
    assert!(
        matches!(never, Err(sluice_client::AcquireError::Never(_))),
        "{never:?}"
    );
}

struct Ca {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new() -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().expect("a key");
        Ca {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).expect("a CA"),
        }
    }

    fn leaf(&self, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .signed_by(&key, &self.issuer)
            .expect("a certificate");
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_services_over_mtls() {
    let _serial = serial_async().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (server_ca, client_ca) = (Ca::new(), Ca::new());
    let (cert, key) = server_ca.leaf("localhost");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let env = [
        ("SLUICE_TLS__CERT_FILE", write("server.pem", &cert)),
        ("SLUICE_TLS__KEY_FILE", write("server.key", &key)),
        (
            "SLUICE_TLS__CLIENT_CA_FILE",
            write("client-ca.pem", &client_ca.issuer.pem()),
        ),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sluice = start_sluice(&env);
    let url = format!("https://localhost:{}", sluice.port);
    let tls = sluice_client::ClientTlsConfig::new()
        .ca_certificate(sluice_client::Certificate::from_pem(server_ca.issuer.pem()))
        .domain_name("localhost");
    let (client_cert, client_key) = client_ca.leaf("caller");
    let with_identity = tls
        .clone()
        .identity(sluice_client::Identity::from_pem(client_cert, client_key));
    let client = Client::builder(url.clone())
        .tls(with_identity)
        .connect()
        .await
        .expect("mTLS");
    let verdict = client
        .throttle(Throttle::key("tls", Limit::per_second(1)))
        .await
        .expect("an answer over mTLS");
    assert!(!verdict.limited);
    assert_eq!(verdict.keys[0].limit, 1);
    let rls = client
        .should_rate_limit(RateLimit::domain("demo").descriptor([("path", "/login")]))
        .await
        .expect("RLS over mTLS");
    assert_eq!(rls.descriptors.len(), 1);
    assert_eq!(
        rls.descriptors[0].requests_per_unit,
        Some(5),
        "the demo rules' /login limit"
    );
    let anonymous = Client::builder(url)
        .tls(tls)
        .timeout(Duration::from_secs(2))
        .connect_lazy()
        .expect("a client");
    let refused = anonymous
        .throttle(Throttle::key("tls", Limit::per_second(1)))
        .await;
    assert!(
        refused.is_err(),
        "a client without a certificate is refused: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_limits_a_tonic_server_with_resource_exhausted() {
    let _serial = serial_async().await;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let (_sluice, client) = start_with_client().await;
    // Two calls at once, then one a minute.
    let layer = sluice_client::ThrottleLayer::new(
        client,
        |_: &tonic::codegen::http::Request<tonic::body::Body>| {
            Some(Throttle::key(
                "grpc-health",
                Limit::per_minute(1).max_burst(1),
            ))
        },
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let stop = tokio_util::sync::CancellationToken::new();
    let shutdown = stop.clone().cancelled_owned();
    let server = tonic::transport::Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        );
    let served = tokio::spawn(server);
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connect to the tonic server");
    let mut health = HealthClient::new(channel);
    for _ in 0..2 {
        let answer = health.check(HealthCheckRequest::default()).await;
        let answer = answer.expect("admitted");
        assert_eq!(
            answer
                .metadata()
                .get("ratelimit-limit")
                .map(|v| v.to_str().ok()),
            Some(Some("2"))
        );
    }
    let refused = health
        .check(HealthCheckRequest::default())
        .await
        .expect_err("limited");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let retry: u64 = refused
        .metadata()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((59..=60).contains(&retry), "Retry-After {retry}");
    stop.cancel();
    served.await.expect("the server task").expect("the server");
}
