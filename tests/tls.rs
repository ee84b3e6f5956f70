//! TLS and mTLS on the gRPC port, with certificates generated here: a client without a
//! certificate is refused, one with a certificate the client CA signed is served, and a
//! changed client CA file is picked up without a restart.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use sluice::app::{App, Listeners};
use sluice::config::settings::Settings;
use sluice::limiter::{Limiter, MemoryLimiter};
use sluice::tls::TlsFiles;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const RULES: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate for `name`, and its key, in PEM.
    fn leaf(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A channel to `addr` trusting `server_ca`, presenting `identity` if any.
async fn connect(
    addr: &str,
    server_ca: &Ca,
    identity: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca.pem()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await
}

/// Whether a ShouldRateLimit call over a new connection succeeds.
async fn served(addr: &str, server_ca: &Ca, identity: Option<&(String, String)>) -> bool {
    let Ok(channel) = connect(addr, server_ca, identity).await else {
        return false;
    };
    let mut c = RateLimitServiceClient::new(channel);
    c.should_rate_limit(req("test", vec![desc(&[("k", "v")])]))
        .await
        .is_ok()
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_and_reloads_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca, other_ca) = (Ca::new(), Ca::new(), Ca::new());
    let (cert, key) = server_ca.leaf("localhost");
    let files = TlsFiles {
        cert: write(dir.path(), "server.pem", &cert),
        key: write(dir.path(), "server.key", &key),
        client_ca: Some(write(dir.path(), "clients.pem", &client_ca.pem())),
    };
    let model =
        sluice::config::rules::from_sources(&[("t.yaml".into(), RULES.to_owned())]).unwrap();
    let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::new(100));
    let mut settings = Settings::default();
    settings.reload.debounce_ms = 50;
    let app = App::from_parts(&settings, sluice::rules::RuleSet::compile(model), limiter)
        .with_tls(files.clone())
        .unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let running = tokio::spawn(app.run(
        Listeners { grpc, admin: None },
        stop.clone().cancelled_owned(),
    ));

    let trusted = client_ca.leaf("client-a");
    let untrusted = other_ca.leaf("client-b");
    assert!(
        !served(&addr, &server_ca, None).await,
        "no client certificate: refused"
    );
    assert!(
        !served(&addr, &server_ca, Some(&untrusted)).await,
        "unknown CA: refused"
    );
    assert!(
        served(&addr, &server_ca, Some(&trusted)).await,
        "a trusted client is served"
    );

    // Trust the other CA instead: picked up from the file, no restart.
    std::fs::write(files.client_ca.as_ref().unwrap(), other_ca.pem()).unwrap();
    let start = Instant::now();
    while !served(&addr, &server_ca, Some(&untrusted)).await {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the new client CA was not loaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !served(&addr, &server_ca, Some(&trusted)).await,
        "the old CA is no longer trusted"
    );

    stop.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn plain_tls_without_client_ca_and_bad_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let (cert, key) = ca.leaf("localhost");
    let files = TlsFiles {
        cert: write(dir.path(), "server.pem", &cert),
        key: write(dir.path(), "server.key", &key),
        client_ca: None,
    };
    let model =
        sluice::config::rules::from_sources(&[("t.yaml".into(), RULES.to_owned())]).unwrap();
    let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::new(100));
    let app = App::from_parts(
        &Settings::default(),
        sluice::rules::RuleSet::compile(model),
        limiter,
    );
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let app = app.with_tls(files.clone()).unwrap();
    let running = tokio::spawn(app.run(
        Listeners { grpc, admin: None },
        stop.clone().cancelled_owned(),
    ));
    assert!(served(&addr, &ca, None).await);
    stop.cancel();
    running.await.unwrap().unwrap();

    let missing = TlsFiles {
        key: dir.path().join("missing.key"),
        ..files.clone()
    };
    let e = missing.load().unwrap_err().to_string();
    assert!(e.contains("missing.key"), "{e}");
    let mismatched = TlsFiles {
        key: write(
            dir.path(),
            "other.key",
            &KeyPair::generate().unwrap().serialize_pem(),
        ),
        ..files
    };
    assert!(mismatched.load().is_err());
}
