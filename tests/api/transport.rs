//! The gRPC port's connection limits (src/transport/): a connection that has not sent its whole
//! HTTP/2 preface is closed after `server.preface_timeout_ms`, one with no request open after
//! `server.idle_timeout_secs`, and one beyond `server.max_connections` is refused while the
//! open ones keep being served. Real sockets on loopback, the timeouts set short; every wait
//! is bounded by [`WITHIN`].

use std::net::SocketAddr;
use std::time::Duration;

use sluice::config::settings::{ServerSettings, Settings};
use sluice::testing::eventually;
use sluice::testing::grpc::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codegen::Bytes;

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n";

/// Far beyond every timeout here: only a connection the server failed to close reaches it.
const WITHIN: Duration = Duration::from_secs(5);

/// How late a close may come after its timeout, on a loaded machine.
const SLACK: Duration = Duration::from_secs(2);

/// The HTTP/2 client preface's magic, without the SETTINGS frame that completes it.
const MAGIC: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn settings(server: impl FnOnce(&mut ServerSettings)) -> Settings {
    let mut settings = Settings::default();
    server(&mut settings.server);
    settings
}

/// A bare HTTP/2 client connection (tonic's channel would reconnect behind a closed one).
struct H2 {
    send: h2::client::SendRequest<Bytes>,
    /// Its driver; ends when the connection does, with the instant it did.
    ended: JoinHandle<(Instant, Result<(), h2::Error>)>,
}

impl H2 {
    async fn open(addr: SocketAddr) -> Result<H2, h2::Error> {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (send, connection) = h2::client::handshake(tcp).await?;
        let ended = tokio::spawn(async move {
            let result = connection.await;
            (Instant::now(), result)
        });
        Ok(H2 { send, ended })
    }

    /// One `ShouldRateLimit` for `k=v`; the answer's `grpc-status`, none when the connection
    /// failed it.
    async fn should_rate_limit(&mut self) -> Option<String> {
        let request = http::Request::builder()
            .method("POST")
            .uri("http://sluice/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("request");
        let frame = grpc_frame(&req("test", vec![desc(&[("k", "v")])]));
        let mut send = self.send.clone().ready().await.ok()?;
        let (answer, mut body) = send.send_request(request, false).ok()?;
        body.send_data(frame.into(), true).ok()?;
        let mut body = answer.await.ok()?.into_body();
        while let Some(data) = body.data().await {
            data.ok()?;
        }
        let trailers = body.trailers().await.ok()??;
        Some(trailers.get("grpc-status")?.to_str().ok()?.to_owned())
    }

    fn is_open(&self) -> bool {
        !self.ended.is_finished()
    }

    /// When the connection ended (waiting for it), and how.
    async fn ended(self) -> (Instant, Result<(), h2::Error>) {
        tokio::time::timeout(WITHIN, self.ended)
            .await
            .expect("the server closes the connection")
            .expect("the driver task")
    }
}

/// Reads `tcp` until the server closes it; how long after `since`, and the bytes it wrote.
async fn closed(mut tcp: TcpStream, since: Instant) -> (Duration, usize) {
    let mut buf = [0; 1024];
    let mut written = 0;
    loop {
        let read = tokio::time::timeout(WITHIN, tcp.read(&mut buf)).await;
        match read.expect("the server closes the connection") {
            Ok(0) | Err(_) => return (since.elapsed(), written),
            Ok(n) => written += n,
        }
    }
}

/// A connection closed `after` its start, for a `timeout`: not before it, nor long after.
fn assert_closed_after(after: Duration, timeout: Duration, what: &str) {
    assert!(
        after >= timeout,
        "{what}: closed after {after:?}, before {timeout:?}"
    );
    assert!(
        after < timeout + SLACK,
        "{what}: closed only after {after:?}"
    );
}

#[tokio::test]
async fn connections_without_a_whole_preface_are_closed_after_the_preface_timeout() {
    let timeout = Duration::from_millis(200);
    let server = TestServer::start_with(settings(|s| s.preface_timeout_ms = 200), RULES).await;
    let mut served = H2::open(server.addr).await.expect("HTTP/2 handshake");
    let start = Instant::now();
    let mut waits = Vec::new();
    for sent in [&b""[..], b"", b"", b"PRI * HTTP", MAGIC] {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(sent).await.expect("send");
        waits.push(tokio::spawn(closed(tcp, start)));
    }
    for wait in waits {
        let (after, _) = wait.await.expect("the reader");
        assert_closed_after(after, timeout, "without a whole preface");
    }
    assert!(served.is_open(), "a whole preface keeps its connection");
    assert_eq!(served.should_rate_limit().await.as_deref(), Some("0"));
}

#[tokio::test]
async fn a_connection_beyond_max_connections_is_refused_while_the_open_ones_are_served() {
    let server = TestServer::start_with(settings(|s| s.max_connections = 3), RULES).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut h2 = H2::open(server.addr).await.expect("HTTP/2 handshake");
        assert_eq!(h2.should_rate_limit().await.as_deref(), Some("0"));
        open.push(h2);
    }
    let mut extra = TcpStream::connect(server.addr).await.expect("connect");
    // The server may have closed it before this is sent.
    let _ = extra.write_all(MAGIC).await;
    let (_, written) = closed(extra, Instant::now()).await;
    assert_eq!(written, 0, "refused without a byte written");
    for h2 in &mut open {
        assert!(h2.is_open());
        assert_eq!(h2.should_rate_limit().await.as_deref(), Some("0"));
    }
    // A connection that closes gives its place to a new one.
    open.pop().expect("three").ended.abort();
    eventually(WITHIN, "a new connection served", || async {
        match H2::open(server.addr).await {
            Ok(mut h2) => h2.should_rate_limit().await.as_deref() == Some("0"),
            Err(_) => false,
        }
    })
    .await;
}

#[tokio::test]
async fn a_connection_without_requests_is_closed_after_the_idle_timeout() {
    let timeout = Duration::from_secs(1);
    let server = TestServer::start_with(settings(|s| s.idle_timeout_secs = 1), RULES).await;
    let start = Instant::now();
    let idle = H2::open(server.addr).await.expect("HTTP/2 handshake");
    let mut busy = H2::open(server.addr).await.expect("HTTP/2 handshake");
    // A request every 100 ms for 1.5 idle timeouts keeps `busy` open.
    let mut last = Instant::now();
    while start.elapsed() < timeout * 3 / 2 {
        last = Instant::now();
        assert_eq!(busy.should_rate_limit().await.as_deref(), Some("0"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(busy.is_open(), "requests keep a connection open");
    let (ended, how) = idle.ended().await;
    assert_closed_after(ended - start, timeout, "idle from the start");
    assert!(how.is_ok(), "a graceful GOAWAY: {how:?}");
    let (ended, how) = busy.ended().await;
    assert_closed_after(ended - last, timeout, "idle from its last request");
    assert!(how.is_ok(), "a graceful GOAWAY: {how:?}");
}
