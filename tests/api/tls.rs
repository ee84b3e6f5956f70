//! TLS and mTLS on the gRPC port, with certificates generated here: a client without a
//! certificate is refused, one with a certificate the client CA signed is served, and
//! changed files are picked up without a restart: a new client CA, a new server certificate,
//! and a broken key that keeps the active certificates.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use sluice::app::{App, Listeners};
use sluice::config::settings::Settings;
use sluice::limiter::{Limiter, MemoryLimiter};
use sluice::testing::eventually;
use sluice::testing::grpc::*;
use sluice::tls::TlsFiles;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const FIVE_SECONDS: Duration = Duration::from_secs(5);

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

/// Server files in `dir` for `localhost` signed by `ca`, without a client CA.
fn server_files(dir: &Path, ca: &Ca) -> TlsFiles {
    let (cert, key) = ca.leaf("localhost");
    TlsFiles {
        cert: write(dir, "server.pem", &cert),
        key: write(dir, "server.key", &key),
        client_ca: None,
        client_san: None,
    }
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

/// A server with TLS from `files` on a loopback port (no admin server), files reloaded
/// after 50 ms of quiet; stopped when the guard drops.
struct TlsServer {
    addr: String,
    stop: CancellationToken,
    running: JoinHandle<anyhow::Result<()>>,
    _guard: DropGuard,
}

impl TlsServer {
    async fn start(files: &TlsFiles) -> TlsServer {
        let model =
            sluice::config::rules_file::from_sources(&[("t.yaml".into(), RULES.to_owned())])
                .unwrap();
        let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::new(100));
        let mut settings = Settings::default();
        settings.reload.debounce_ms = 50;
        let app = App::from_parts(&settings, sluice::rules::RuleSet::compile(model), limiter)
            .with_tls(files.clone())
            .unwrap();
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = grpc.local_addr().unwrap().to_string();
        let stop = CancellationToken::new();
        let running = tokio::spawn(app.run(
            Listeners {
                grpc: grpc.into(),
                admin: None,
            },
            stop.clone().cancelled_owned(),
        ));
        TlsServer {
            addr,
            _guard: stop.clone().drop_guard(),
            stop,
            running,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_and_reloads_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca, other_ca) = (Ca::new(), Ca::new(), Ca::new());
    let files = TlsFiles {
        client_ca: Some(write(dir.path(), "clients.pem", &client_ca.pem())),
        ..server_files(dir.path(), &server_ca)
    };
    let server = TlsServer::start(&files).await;
    let addr = server.addr.clone();

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
    eventually(FIVE_SECONDS, "the new client CA loaded", || {
        served(&addr, &server_ca, Some(&untrusted))
    })
    .await;
    assert!(
        !served(&addr, &server_ca, Some(&trusted)).await,
        "the old CA is no longer trusted"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_new_server_certificate_is_served_and_a_broken_key_keeps_the_active_one() {
    // The failed reload is only visible in the log: capture it (this runtime's tasks all run
    // on this thread).
    let log = tempfile::NamedTempFile::new().unwrap();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.reopen().unwrap())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let (first_ca, second_ca) = (Ca::new(), Ca::new());
    let files = server_files(dir.path(), &first_ca);
    let server = TlsServer::start(&files).await;
    let addr = server.addr.clone();
    assert!(served(&addr, &first_ca, None).await);

    // A certificate from another CA: clients trusting only that CA are served.
    let (cert, key) = second_ca.leaf("localhost");
    std::fs::write(&files.key, key).unwrap();
    std::fs::write(&files.cert, cert).unwrap();
    eventually(FIVE_SECONDS, "the new server certificate served", || {
        served(&addr, &second_ca, None)
    })
    .await;
    assert!(!served(&addr, &first_ca, None).await, "the old one is gone");
    let logged = || std::fs::read_to_string(log.path()).unwrap();
    assert!(
        logged().contains("TLS certificates reloaded"),
        "{}",
        logged()
    );

    // A key that cannot be read: the reload fails and the active certificates stay.
    std::fs::write(&files.key, "not a key").unwrap();
    let failed = "TLS reload failed, keeping the active certificates";
    eventually(FIVE_SECONDS, "the failed reload logged", || async {
        logged().contains(failed)
    })
    .await;
    assert!(logged().contains("server.key"), "{}", logged());
    assert!(served(&addr, &second_ca, None).await, "still served");
    assert!(!served(&addr, &first_ca, None).await);
    server.stop().await;
}

#[tokio::test]
async fn plain_tls_without_client_ca_and_bad_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let files = server_files(dir.path(), &ca);
    let server = TlsServer::start(&files).await;
    assert!(served(&server.addr, &ca, None).await);
    server.stop().await;

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
