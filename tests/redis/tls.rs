//! `rediss://` with an ACL user: a real `redis-server` serving TLS with a certificate from a
//! test CA (made with `openssl`), which the `sluice` binary trusts through `SSL_CERT_FILE`
//! (rustls reads the system roots, and that variable names them).

use std::path::Path;
use std::process::Command;

use sluice::testing::grpc::*;
use sluice::testing::process::{SluiceProcess, free_port};
use sluice::testing::redis::RedisServer;

const RULES: &str = "
domain: t
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}); run: apt-get install -y openssl"));
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, and a certificate for 127.0.0.1 signed by it, in `dir`.
fn certificates(dir: &Path) {
    let ca = "req -x509 -newkey rsa:2048 -nodes -days 1 -keyout ca.key -out ca.crt";
    let csr = "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr";
    let sign = "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                -out server.crt -days 1 -extfile san.ext";
    let words = |line: &'static str| line.split_whitespace().collect::<Vec<_>>();
    openssl(
        dir,
        &[words(ca), vec!["-subj", "/CN=sluice test CA"]].concat(),
    );
    openssl(dir, &[words(csr), vec!["-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write san.ext");
    openssl(dir, &words(sign));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_an_acl_user_through_the_binary() {
    let certs = tempfile::tempdir().expect("a temporary directory");
    certificates(certs.path());
    let file = |name: &str| certs.path().join(name).display().to_string();
    let tls_port = free_port().to_string();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let _: () = redis.cmd(&[
        "ACL",
        "SETUSER",
        "sluice",
        "on",
        ">s3cret",
        "~sluice:*",
        "+@all",
    ]);
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(rules.path(), RULES).expect("write rules");
    let ca = file("ca.crt");
    let url = format!("rediss://sluice:s3cret@127.0.0.1:{tls_port}");
    let sluice = SluiceProcess::over_redis(
        env!("CARGO_BIN_EXE_sluice"),
        rules.path(),
        &url,
        // The first request also pays the TLS handshake; give it room on a loaded machine.
        &[("SSL_CERT_FILE", &ca), ("SLUICE_REDIS__TIMEOUT_MS", "3000")],
    );
    let mut c = RateLimitServiceClient::connect(sluice.url())
        .await
        .expect("connect");
    assert_eq!(
        overall(&call(&mut c, req("t", vec![desc(&[("k", "v")])])).await),
        Code::Ok
    );
    assert_eq!(
        overall(&call(&mut c, req("t", vec![desc(&[("k", "v")])])).await),
        Code::OverLimit
    );
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|k=v}:funnel:60"]);
    assert_eq!(exists, 1, "the state is in the TLS server");

    // A wrong password is a backend failure: UNAVAILABLE, never a decision.
    let bad = format!("rediss://sluice:wrong@127.0.0.1:{tls_port}");
    let denied = SluiceProcess::over_redis(
        env!("CARGO_BIN_EXE_sluice"),
        rules.path(),
        &bad,
        &[("SSL_CERT_FILE", &ca)],
    );
    let mut c = RateLimitServiceClient::connect(denied.url())
        .await
        .expect("connect");
    let err = c
        .should_rate_limit(req("t", vec![desc(&[("k", "w")])]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
}
