//! Redis over TLS through the `sluice` binary, against a real `redis-server` serving TLS with
//! certificates from a test CA (made here with `openssl`):
//!
//! - `rediss://` with an ACL user, the CA trusted through `SSL_CERT_FILE` (the system's roots,
//!   which rustls reads and that variable names);
//! - mTLS (`--tls-auth-clients yes`): the CA in `redis.tls_ca_file` and a client certificate
//!   in `redis.tls_cert_file`/`tls_key_file`; without the certificate Redis refuses sluice,
//!   which answers `UNAVAILABLE` and is not ready;
//! - the same mTLS through a Sentinel (TLS to it and to the master) and to a Cluster (TLS
//!   on its bus too);
//! - `redis.tls_skip_hostname_verification`: a certificate for another name is accepted
//!   when the CA signed it, one from another CA never; the same through a Sentinel whose
//!   sentinel and master both serve such a certificate;
//! - files that are missing or do not parse stop the start (exit 64) naming setting and file;
//! - the same mTLS set up from envoyproxy/ratelimit's `REDIS_TLS*` variables, the binary
//!   started as `ratelimit`.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use sluice::testing::grpc::*;
use sluice::testing::http::try_get;
use sluice::testing::process::{
    HeldPort, Served, SluiceProcess, exit_within, serving_grpc, serving_log, sluice_command,
};
use sluice::testing::ratelimit_env::{ENVOY_GATEWAY_REDIS_TLS, ISTIO};
use sluice::testing::redis::{RedisCluster, RedisServer};

const RULES: &str = "
domain: t
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
";

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}); run: apt-get install -y openssl"));
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Certificates in a temporary directory: CAs `ca` and `other`, and leaves signed by `ca`.
struct Certs(tempfile::TempDir);

impl Certs {
    /// `ca`; `server` for 127.0.0.1; `named` for `redis.invalid` only; `client`;
    /// `other`, a CA of its own.
    fn new() -> Certs {
        let certs = Certs(tempfile::tempdir().expect("a temporary directory"));
        certs.ca("ca");
        certs.ca("other");
        certs.leaf("server", "subjectAltName=IP:127.0.0.1");
        certs.leaf("named", "subjectAltName=DNS:redis.invalid");
        certs.leaf("client", "extendedKeyUsage=clientAuth");
        certs
    }

    fn dir(&self) -> &Path {
        self.0.path()
    }

    /// `<name>.crt` (or any file name) as a string.
    fn file(&self, name: &str) -> String {
        self.dir().join(name).display().to_string()
    }

    fn ca(&self, name: &str) {
        let line =
            format!("req -x509 -newkey rsa:2048 -nodes -days 1 -keyout {name}.key -out {name}.crt");
        let subject = format!("/CN=sluice test {name}");
        openssl(
            self.dir(),
            &[words(&line), vec!["-subj", &subject]].concat(),
        );
    }

    /// `<name>.crt` and `<name>.key`, signed by `ca`, with the X.509 v3 extension `ext`.
    fn leaf(&self, name: &str, ext: &str) {
        let csr = format!("req -newkey rsa:2048 -nodes -keyout {name}.key -out {name}.csr");
        let subject = format!("/CN={name}");
        openssl(self.dir(), &[words(&csr), vec!["-subj", &subject]].concat());
        let sign = format!(
            "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out {name}.crt -days 1"
        );
        let file = format!("{name}.ext");
        std::fs::write(self.dir().join(&file), format!("{ext}\n")).expect("write {file}");
        openssl(
            self.dir(),
            &[words(&sign), vec!["-extfile", &file]].concat(),
        );
    }

    /// A `redis-server` with a TLS port serving `<leaf>.crt`, trusting `ca` for clients
    /// (`auth_clients`: `yes` requires a client certificate). The server and its TLS port.
    /// (redis-server cannot bind port 0 for its TLS port and report it: one from the kernel,
    /// held by the server.)
    fn redis(&self, leaf: &str, auth_clients: &str) -> (RedisServer, u16) {
        let tls = HeldPort::new();
        let tls_port = tls.port();
        let args = self.tls_args(leaf, tls_port, auth_clients);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut server = RedisServer::start_with(&args);
        server.hold(tls);
        (server, tls_port)
    }

    /// `redis-server`'s arguments for a TLS port as [`Certs::redis`] describes it.
    fn tls_args(&self, leaf: &str, tls_port: u16, auth_clients: &str) -> Vec<String> {
        let (cert, key) = (format!("{leaf}.crt"), format!("{leaf}.key"));
        [
            ("--tls-port", tls_port.to_string()),
            ("--tls-cert-file", self.file(&cert)),
            ("--tls-key-file", self.file(&key)),
            ("--tls-ca-cert-file", self.file("ca.crt")),
            ("--tls-auth-clients", auth_clients.to_owned()),
        ]
        .into_iter()
        .flat_map(|(name, value)| [name.to_owned(), value])
        .collect()
    }

    /// `redis.tls_*` settings with `ca.crt` and the client certificate (the CA first).
    fn mtls_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SLUICE_REDIS__TLS_CA_FILE", self.file("ca.crt")),
            ("SLUICE_REDIS__TLS_CERT_FILE", self.file("client.crt")),
            ("SLUICE_REDIS__TLS_KEY_FILE", self.file("client.key")),
        ]
    }
}

/// `pairs` as the `(&str, &str)` a process takes, with [`ROOMY`].
fn roomy<'a>(pairs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    let mut env: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(ROOMY);
    env
}

fn rules_file() -> tempfile::NamedTempFile {
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(rules.path(), RULES).expect("write rules");
    rules
}

/// Two requests for `k=value` at `url`: OK, then OVER_LIMIT.
async fn ok_then_over(url: String, value: &str) {
    let mut c = RateLimitServiceClient::connect(url).await.expect("connect");
    let request = || req("t", vec![desc(&[("k", value)])]);
    assert_eq!(overall(&call(&mut c, request()).await), Code::Ok);
    assert_eq!(overall(&call(&mut c, request()).await), Code::OverLimit);
}

/// One request for `k=value` at `url`: the gRPC status code of its failure.
async fn failure(url: String, value: &str) -> tonic::Code {
    let mut c = RateLimitServiceClient::connect(url).await.expect("connect");
    let answer = c
        .should_rate_limit(req("t", vec![desc(&[("k", value)])]))
        .await;
    answer.expect_err("no answer without Redis").code()
}

// The first request also pays the TLS handshake; give it room on a loaded machine.
const ROOMY: (&str, &str) = ("SLUICE_REDIS__TIMEOUT_MS", "3000");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_an_acl_user_through_the_binary() {
    let certs = Certs::new();
    let (redis, tls_port) = certs.redis("server", "no");
    let _: () = redis.cmd(&[
        "ACL",
        "SETUSER",
        "sluice",
        "on",
        ">s3cret",
        "~sluice:*",
        "+@all",
    ]);
    let rules = rules_file();
    let ca = certs.file("ca.crt");
    let url = format!("rediss://sluice:s3cret@127.0.0.1:{tls_port}");
    let sluice =
        SluiceProcess::over_redis(BIN, rules.path(), &url, &[("SSL_CERT_FILE", &ca), ROOMY]);
    ok_then_over(sluice.url(), "v").await;
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|k=v}:funnel:60"]);
    assert_eq!(exists, 1, "the state is in the TLS server");

    // A wrong password is a backend failure: UNAVAILABLE, never a decision.
    let bad = format!("rediss://sluice:wrong@127.0.0.1:{tls_port}");
    let denied = SluiceProcess::over_redis(BIN, rules.path(), &bad, &[("SSL_CERT_FILE", &ca)]);
    assert_eq!(failure(denied.url(), "w").await, tonic::Code::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_a_ca_file_and_a_client_certificate() {
    let certs = Certs::new();
    let (redis, tls_port) = certs.redis("server", "yes");
    let rules = rules_file();
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let mtls = certs.mtls_env();
    let env = roomy(&mtls);
    let sluice = SluiceProcess::over_redis(BIN, rules.path(), &url, &env)
        .ready()
        .await;
    ok_then_over(sluice.url(), "v").await;
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|k=v}:funnel:60"]);
    assert_eq!(exists, 1, "the state is in the TLS server");

    // The CA alone: Redis refuses the connection, sluice answers nothing and is not ready.
    let anonymous = SluiceProcess::over_redis(BIN, rules.path(), &url, &[env[0], ROOMY]);
    assert_eq!(
        failure(anonymous.url(), "w").await,
        tonic::Code::Unavailable
    );
    let ready = try_get(anonymous.admin(), "/readyz")
        .await
        .expect("/readyz answers");
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(ready.body.contains("backend not ready"), "{ready:?}");
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|k=w}:funnel:60"]);
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_to_a_cluster() {
    let certs = Certs::new();
    let mut tls_ports = Vec::new();
    // Each node's TLS port from the kernel, held while the cluster runs.
    let mut held = Vec::new();
    // TLS on the cluster bus too: nodes then give TLS clients their TLS ports.
    let cluster = RedisCluster::start_with(|| {
        let tls = HeldPort::new();
        let port = tls.port();
        held.push(tls);
        tls_ports.push(format!("127.0.0.1:{port}"));
        let mut args = certs.tls_args("server", port, "yes");
        args.extend(["--tls-cluster".to_owned(), "yes".to_owned()]);
        args
    });
    let rules = rules_file();
    let url = format!("rediss+cluster://{}", tls_ports.join(","));
    let mtls = certs.mtls_env();
    let sluice = SluiceProcess::over_redis(BIN, rules.path(), &url, &roomy(&mtls));
    ok_then_over(sluice.url(), "v").await;
    assert!(cluster.script_calls() > 0, "decided in the cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_through_a_sentinel() {
    let certs = Certs::new();
    let (master, master_tls) = certs.redis("server", "yes");
    let tls = HeldPort::new();
    let sentinel_tls = tls.port();
    // The sentinel watches the master's TLS port, so it reports that one.
    let mut args = certs.tls_args("server", sentinel_tls, "yes");
    args.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
    let mut sentinel = RedisServer::sentinel_with("mymaster", master_tls, 1, &args);
    sentinel.hold(tls);
    let rules = rules_file();
    let url = format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/mymaster");
    let mtls = certs.mtls_env();
    let sluice = SluiceProcess::over_redis(BIN, rules.path(), &url, &roomy(&mtls));
    ok_then_over(sluice.url(), "v").await;
    let exists: i64 = master.cmd(&["EXISTS", "sluice:{t|k=v}:funnel:60"]);
    assert_eq!(exists, 1, "the state is in the master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_the_name_check_still_needs_the_ca() {
    let certs = Certs::new();
    // A certificate for redis.invalid, not for the address sluice connects to.
    let (_redis, tls_port) = certs.redis("named", "no");
    let rules = rules_file();
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let (ca, other) = (certs.file("ca.crt"), certs.file("other.crt"));
    let skip = ("SLUICE_REDIS__TLS_SKIP_HOSTNAME_VERIFICATION", "true");

    let checked = SluiceProcess::over_redis(
        BIN,
        rules.path(),
        &url,
        &[("SLUICE_REDIS__TLS_CA_FILE", &ca), ROOMY],
    );
    assert_eq!(
        failure(checked.url(), "a").await,
        tonic::Code::Unavailable,
        "the name is checked"
    );
    let skipped = [("SLUICE_REDIS__TLS_CA_FILE", ca.as_str()), skip, ROOMY];
    let skipping = SluiceProcess::over_redis(BIN, rules.path(), &url, &skipped);
    ok_then_over(skipping.url(), "b").await;
    let stranger = [("SLUICE_REDIS__TLS_CA_FILE", other.as_str()), skip, ROOMY];
    let stranger = SluiceProcess::over_redis(BIN, rules.path(), &url, &stranger);
    assert_eq!(
        failure(stranger.url(), "c").await,
        tonic::Code::Unavailable,
        "another CA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_the_name_check_through_a_sentinel() {
    let certs = Certs::new();
    // The master and the sentinel serve certificates for redis.invalid, not for the
    // addresses sluice connects to (127.0.0.1).
    let (master, master_tls) = certs.redis("named", "no");
    let tls = HeldPort::new();
    let sentinel_tls = tls.port();
    let mut args = certs.tls_args("named", sentinel_tls, "no");
    args.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
    let mut sentinel = RedisServer::sentinel_with("mymaster", master_tls, 1, &args);
    sentinel.hold(tls);
    let rules = rules_file();
    let url = format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/mymaster");
    let (ca, other) = (certs.file("ca.crt"), certs.file("other.crt"));
    let skip = ("SLUICE_REDIS__TLS_SKIP_HOSTNAME_VERIFICATION", "true");

    let skipped = [("SLUICE_REDIS__TLS_CA_FILE", ca.as_str()), skip, ROOMY];
    let skipping = SluiceProcess::over_redis(BIN, rules.path(), &url, &skipped);
    ok_then_over(skipping.url(), "a").await;
    let exists: i64 = master.cmd(&["EXISTS", "sluice:{t|k=a}:funnel:60"]);
    assert_eq!(exists, 1, "the state is in the master");

    let checked = [("SLUICE_REDIS__TLS_CA_FILE", ca.as_str()), ROOMY];
    let checked = SluiceProcess::over_redis(BIN, rules.path(), &url, &checked);
    assert_eq!(
        failure(checked.url(), "b").await,
        tonic::Code::Unavailable,
        "the name is checked"
    );
    let ready = try_get(checked.admin(), "/readyz")
        .await
        .expect("/readyz answers");
    assert_eq!(ready.status, 503, "{ready:?}");
    assert!(
        ready.body.contains("certificate not valid for name"),
        "the reason is given: {ready:?}"
    );
    let stranger = [("SLUICE_REDIS__TLS_CA_FILE", other.as_str()), skip, ROOMY];
    let stranger = SluiceProcess::over_redis(BIN, rules.path(), &url, &stranger);
    assert_eq!(
        failure(stranger.url(), "c").await,
        tonic::Code::Unavailable,
        "another CA"
    );
    let ready = try_get(stranger.admin(), "/readyz")
        .await
        .expect("/readyz answers");
    assert!(ready.body.contains("UnknownIssuer"), "{ready:?}");
    for value in ["b", "c"] {
        let key = format!("sluice:{{t|k={value}}}:funnel:60");
        let exists: i64 = master.cmd(&["EXISTS", &key]);
        assert_eq!(exists, 0, "{value}: no decision reached the master");
    }
}

/// `sluice serve` over `rediss://` with `env`: it must exit 64 within 20 s; its standard
/// error.
fn refused_start(env: &[(&str, &str)]) -> String {
    let rules = rules_file();
    let mut command = sluice_command(BIN);
    command
        .args([
            "serve",
            "--backend",
            "redis",
            "--redis-url",
            "rediss://127.0.0.1:1",
        ])
        .arg("--rules")
        .arg(rules.path())
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .envs(env.iter().copied());
    let out = exit_within(&mut command, std::time::Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{env:?}: {err}");
    err
}

#[test]
fn tls_files_missing_or_unparsable_stop_the_start_naming_setting_and_file() {
    let certs = Certs::new();
    let missing = certs.file("missing.crt");
    let key = certs.file("client.key");
    let err = refused_start(&[("SLUICE_REDIS__TLS_CA_FILE", &missing)]);
    assert!(
        err.contains("redis.tls_ca_file") && err.contains(&missing),
        "{err}"
    );
    // A key where a certificate belongs.
    let err = refused_start(&[("SLUICE_REDIS__TLS_CA_FILE", &key)]);
    assert!(
        err.contains("redis.tls_ca_file") && err.contains("no certificate found"),
        "{err}"
    );
    // A client certificate with another certificate's key.
    let err = refused_start(&[
        ("SLUICE_REDIS__TLS_CERT_FILE", &certs.file("client.crt")),
        ("SLUICE_REDIS__TLS_KEY_FILE", &certs.file("server.key")),
    ]);
    assert!(
        err.contains("redis.tls_cert_file") && err.contains("is not the key of"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// `ratelimit` (the binary under that name) started with Istio's and Envoy Gateway's
/// variables, Redis at `127.0.0.1:<tls_port>`, the rules in the certificates' directory, and
/// `swaps` over them (a `None` value unsets the variable).
fn ratelimit(certs: &Certs, tls_port: u16, swaps: &[(&str, Option<String>)]) -> Served {
    let data = certs.dir().join("data");
    let config = data.join("ratelimit/config");
    std::fs::create_dir_all(&config).expect("create the rules directory");
    std::fs::write(config.join("config.yaml"), RULES).expect("write rules");
    let link = certs.dir().join("ratelimit");
    if !link.exists() {
        std::os::unix::fs::symlink(BIN, &link).expect("symlink");
    }
    let mut env: HashMap<String, String> = ISTIO
        .iter()
        .chain(ENVOY_GATEWAY_REDIS_TLS)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    // The ports are the child's to choose (0): one chosen here could be taken before it
    // binds them.
    let ours: [(&str, String); 9] = [
        ("REDIS_URL", format!("127.0.0.1:{tls_port}")),
        ("RUNTIME_ROOT", data.display().to_string()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", "0".into()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", "0".into()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", "0".into()),
        ("REDIS_TIMEOUT", "3s".into()),
    ];
    env.extend(ours.map(|(k, v)| (k.to_owned(), v)));
    env.insert("SLUICE_REDIS__TIMEOUT_MS".into(), "3000".into());
    for (k, v) in swaps {
        match v {
            Some(v) => env.insert((*k).to_owned(), v.clone()),
            None => env.remove(*k),
        };
    }
    // `LOG_LEVEL` (ISTIO's `debug`) logs where it serves gRPC.
    let child = Command::new(&link)
        .env_clear()
        .envs(&env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratelimit");
    Served(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_ratelimit_with_its_redis_tls_variables() {
    let certs = Certs::new();
    let (redis, tls_port) = certs.redis("server", "yes");
    // Envoy Gateway's files are mounted at /redis-certs; here they are the test's.
    let files = [
        ("REDIS_TLS_CACERT", Some(certs.file("ca.crt"))),
        ("REDIS_TLS_CLIENT_CERT", Some(certs.file("client.crt"))),
        ("REDIS_TLS_CLIENT_KEY", Some(certs.file("client.key"))),
    ];
    let mut ratelimit = ratelimit(&certs, tls_port, &files);
    let grpc = serving_grpc(&mut ratelimit.0);
    ok_then_over(format!("http://{grpc}"), "v").await;
    // envoyproxy/ratelimit's counting: a fixed window (docs/ratelimit-compat.md).
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|k=v}:fixed_window:60"]);
    assert_eq!(exists, 1, "the state is in the TLS server");
}

/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` without `REDIS_TLS_CACERT`, as envoyproxy/ratelimit
/// takes it: the chain checked against the system's roots (here the test's CA, through
/// `SSL_CERT_FILE`), the name not, and a warning that says so; a certificate those roots did
/// not sign is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_ratelimit_skipping_names_without_a_ca_file() {
    let certs = Certs::new();
    // A certificate for redis.invalid, not for the address sluice connects to.
    let (redis, tls_port) = certs.redis("named", "no");
    let run = |roots: &str| {
        let swaps = [
            ("REDIS_TLS_CLIENT_CERT", None),
            ("REDIS_TLS_CLIENT_KEY", None),
            (
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                Some("true".to_owned()),
            ),
            ("SSL_CERT_FILE", Some(certs.file(roots))),
        ];
        ratelimit(&certs, tls_port, &swaps)
    };
    let mut trusted = run("ca.crt");
    let ([grpc], log) = serving_log(&mut trusted.0, ["gRPC"]);
    ok_then_over(format!("http://{grpc}"), "v").await;
    let exists: i64 = redis.cmd(&["EXISTS", "sluice:{t|k=v}:fixed_window:60"]);
    assert_eq!(exists, 1, "the state is in the TLS server");
    drop(trusted);
    let log = log.until_closed();
    assert!(
        log.contains("WARN")
            && log.contains("redis.tls_skip_hostname_verification without redis.tls_ca_file"),
        "the start warns that any name passes:\n{log}"
    );

    let mut stranger = run("other.crt");
    let grpc = serving_grpc(&mut stranger.0);
    assert_eq!(
        failure(format!("http://{grpc}"), "w").await,
        tonic::Code::Unavailable,
        "a certificate the system's roots did not sign"
    );
}
