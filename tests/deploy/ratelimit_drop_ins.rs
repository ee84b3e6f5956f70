//! envoyproxy/ratelimit settings that once stopped the start, now served by the binary
//! started as `ratelimit`: `GRPC_UDS` (gRPC on a Unix socket, reached by a real Envoy whose
//! rate-limit cluster's address is a `pipe`), `MERGE_DOMAIN_CONFIG` (one domain's
//! descriptors from two files), `REDIS_SENTINEL_AUTH` (sentinels with `requirepass`),
//! `GRPC_CLIENT_TLS_SAN` (mTLS clients must also name it among their SANs) and
//! `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` with `REDIS_TYPE=sentinel` (a TLS sentinel and
//! master whose certificates name another host).

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::testing::http::get;
use sluice::testing::process::{HeldPort, loopback};
use sluice::testing::redis::RedisServer;
use tokio::time::Instant;

use crate::support::certs::Ca;
use crate::support::ratelimit::{
    Ratelimit, RlsFilter, WITHIN, clear_of_window_end, envoy_to, healthy, plain_client,
    ratelimit_link, runtime_root, write,
};
use crate::support::upstream::Upstream;

/// One request per hour to `/limited` (fixed windows, as envoyproxy/ratelimit counts).
const PATH_RULES: &str = "domain: rl\ndescriptors:\n  - key: PATH\n    value: /limited\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// The env of a deployment reading `RUNTIME_ROOT=root` (rules in `root/ratelimit/config`)
/// with Redis over TCP at `redis` (`host:port`), its listeners on loopback port 0, and `more`
/// (which wins).
fn env(root: &str, redis: &str, more: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = [
        ("RUNTIME_ROOT", root.to_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", redis.to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("GRPC_HOST", "127.0.0.1".to_owned()),
        ("GRPC_PORT", "0".to_owned()),
        ("HOST", "127.0.0.1".to_owned()),
        ("PORT", "0".to_owned()),
        ("DEBUG_HOST", "127.0.0.1".to_owned()),
        ("DEBUG_PORT", "0".to_owned()),
        // A loaded test machine must not turn these behaviour tests into latency tests (a
        // first request through sentinels asks them for the master).
        ("SLUICE_REDIS__TIMEOUT_MS", "5000".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(more.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    env
}

/// `ratelimit` with `env`, once it says where it serves.
fn start(link: &Path, env: &HashMap<String, String>) -> Ratelimit {
    Ratelimit::start(link, env)
}

/// Once `rl` is healthy, two requests for `a` (a limit of one): OK, then OVER_LIMIT.
async fn ok_then_over_limit(rl: &Ratelimit) {
    let ports = rl.ports;
    healthy(&ports).await;
    let mut client = plain_client(&ports).await;
    let mut codes = Vec::new();
    for _ in 0..2 {
        let answer = client
            .should_rate_limit(request("a"))
            .await
            .unwrap()
            .into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(codes, [Code::Ok, Code::OverLimit]);
}

/// The process's umask, from /proc (what the child inherits).
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line["Umask:".len()..].trim(), 8).unwrap()
}

/// SIGTERM, then its exit code (within `WITHIN`).
async fn terminate(rl: &mut Ratelimit) -> Option<i32> {
    let served = &mut rl.process;
    let pid = served.0.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(status) = served.0.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_uds_serves_envoy_over_a_unix_socket_and_removes_it_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let root = runtime_root(
        dir.path(),
        "ratelimit/config",
        &[("rules.yaml", PATH_RULES)],
    );
    let socket = dir.path().join("ratelimit.sock");
    // A socket file left by a process that died: removed, not a reason to fail the start.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let path = socket.display().to_string();
    // GRPC_UDS replaces GRPC_HOST:GRPC_PORT, as there: with GRPC_PORT held here (a port the
    // kernel gave this listener), a start that bound it would fail.
    let held = std::net::TcpListener::bind(loopback(0)).unwrap();
    let taken = held.local_addr().unwrap().port().to_string();
    let env = env(
        &root,
        &redis.addr(),
        &[("GRPC_UDS", &path), ("GRPC_PORT", &taken)],
    );
    clear_of_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let mut rl = start(&link, &env);
    let ports = rl.ports;
    healthy(&ports).await;

    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o777 & !umask(),
        "bind(2)'s mode, as Go's net.Listen"
    );

    let filter = RlsFilter {
        name: "envoy.filters.http.ratelimit",
        domain: "rl",
        settings: "failure_mode_deny: true, timeout: 5s,",
    };
    let actions = "[{ request_headers: { header_name: \":path\", descriptor_key: PATH } }]";
    let route = format!(
        "{{ match: {{ prefix: \"/\" }}, route: {{ cluster: upstream, rate_limits: [{{ actions: {actions} }}] }} }}"
    );
    let pipe = format!("{{ pipe: {{ path: \"{path}\" }} }}");
    let (_envoy, port) = envoy_to(&filter, &[route], &pipe, None, upstream.port).await;
    let first = get(loopback(port), "/limited").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, "upstream"),
        "{first:?}"
    );
    let second = get(loopback(port), "/limited").await;
    assert_eq!(second.status, 429, "{second:?}");
    let other = get(loopback(port), "/other").await;
    assert_eq!(other.status, 200, "{other:?}");

    assert_eq!(terminate(&mut rl).await, Some(0));
    assert!(!socket.exists(), "the socket file is removed at shutdown");
}

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

const FILE_A: &str = "domain: rl\ndescriptors:\n  - key: k\n    value: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const FILE_B: &str = "domain: rl\ndescriptors:\n  - key: k\n    value: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/// The stderr of a start that must stop with exit 64.
fn refused(link: &Path, env: &HashMap<String, String>) -> String {
    let out = Command::new(link)
        .env_clear()
        .envs(env)
        .output()
        .expect("run ratelimit");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{err}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_domain_config_serves_one_domains_limits_from_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let root = runtime_root(
        dir.path(),
        "ratelimit/config",
        &[("a.yaml", FILE_A), ("b.yaml", FILE_B)],
    );

    // Without it, the domain defined twice stops the start, as in envoyproxy/ratelimit.
    let err = refused(&link, &env(&root, &redis.addr(), &[]));
    assert!(
        err.contains("b.yaml:1: domain: duplicate domain 'rl' (first defined at"),
        "{err}"
    );

    clear_of_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let mut rl = start(
        &link,
        &env(&root, &redis.addr(), &[("MERGE_DOMAIN_CONFIG", "true")]),
    );
    let ports = rl.ports;
    healthy(&ports).await;
    let mut client = plain_client(&ports).await;
    let mut codes = Vec::new();
    for value in ["a", "a", "b", "b", "b"] {
        let answer = client
            .should_rate_limit(request(value))
            .await
            .unwrap()
            .into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    use Code::{Ok, OverLimit};
    assert_eq!(
        codes,
        [Ok, OverLimit, Ok, Ok, OverLimit],
        "a.yaml's 1 and b.yaml's 2 per hour"
    );
    let rlconfig = get(loopback(ports.debug), "/rlconfig").await.body;
    assert!(
        rlconfig.contains("rl.k_a: ") && rlconfig.contains("rl.k_b: "),
        "{rlconfig}"
    );
    assert_eq!(terminate(&mut rl).await, Some(0));

    // A descriptor defined in both files is still an error, naming both places.
    let dup = dir.path().join("dup");
    let root = runtime_root(
        &dup,
        "ratelimit/config",
        &[("a.yaml", FILE_A), ("c.yaml", FILE_A)],
    );
    let err = refused(
        &link,
        &env(&root, &redis.addr(), &[("MERGE_DOMAIN_CONFIG", "true")]),
    );
    let a = dup.join("data/ratelimit/config/a.yaml");
    let says = format!(
        "c.yaml:3: descriptors[0]: duplicate descriptor 'k_a' of domain 'rl' (first defined at {}:3)",
        a.display()
    );
    assert!(err.contains(&says), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_auth_reaches_sentinels_that_require_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let (master, sentinel) = RedisServer::guarded_sentinel("master-pw", "sentinel-pw");
    let root = runtime_root(dir.path(), "ratelimit/config", &[("a.yaml", FILE_A)]);
    let sentinels = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_AUTH", "master-pw"),
        ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
    ];
    let url = format!("mymaster,{}", sentinel.addr());
    let env = env(&root, &url, &sentinels);
    clear_of_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let rl = start(&link, &env);
    ok_then_over_limit(&rl).await;
    let on_master = redis::Client::open(format!("redis://:master-pw@{}", master.addr())).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut on_master.get_connection().unwrap())
        .unwrap();
    assert!(!keys.is_empty(), "counted on the master the sentinel names");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tls_skip_hostname_verification_with_tls_sentinels() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let ca = Ca::new();
    // Certificates for a name that is not the address ratelimit connects to (127.0.0.1).
    let (cert, key) = ca.leaf(&["redis.internal"]);
    let ca_file = write(dir.path(), "ca.crt", &ca.0.pem());
    let cert_file = write(dir.path(), "redis.crt", &cert);
    let key_file = write(dir.path(), "redis.key", &key);
    let tls_args = |port: u16| -> Vec<String> {
        [
            ("--tls-port", port.to_string()),
            ("--tls-cert-file", cert_file.clone()),
            ("--tls-key-file", key_file.clone()),
            ("--tls-ca-cert-file", ca_file.clone()),
            ("--tls-auth-clients", "no".to_owned()),
        ]
        .into_iter()
        .flat_map(|(name, value)| [name.to_owned(), value])
        .collect()
    };
    let held = HeldPort::new();
    let master_tls = held.port();
    let args = tls_args(master_tls);
    let mut master = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    master.hold(held);
    let held = HeldPort::new();
    let sentinel_tls = held.port();
    // The sentinel watches the master's TLS port, so it names that one.
    let mut args = tls_args(sentinel_tls);
    args.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
    let mut sentinel = RedisServer::sentinel_with("mymaster", master_tls, 1, &args);
    sentinel.hold(held);

    let root = runtime_root(dir.path(), "ratelimit/config", &[("a.yaml", FILE_A)]);
    let url = format!("mymaster,127.0.0.1:{sentinel_tls}");
    let tls = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", ca_file.as_str()),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ];
    let env = env(&root, &url, &tls);
    clear_of_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let rl = start(&link, &env);
    ok_then_over_limit(&rl).await;
    let keys: Vec<String> = master.cmd(&["KEYS", "*"]);
    assert!(!keys.is_empty(), "counted on the master the sentinel names");
}

/// Whether a ShouldRateLimit call over a new TLS connection to `port`, trusting `ca` and
/// presenting `identity`, is answered.
async fn served_over_tls(port: u16, ca: &str, identity: &(String, String)) -> bool {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
        .identity(Identity::from_pem(&identity.0, &identity.1));
    let Ok(endpoint) = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
    else {
        return false;
    };
    let Ok(channel) = endpoint.connect().await else {
        return false;
    };
    let mut client = sluice::testing::grpc::RateLimitServiceClient::new(channel);
    client.should_rate_limit(request("a")).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_client_tls_san_serves_only_client_certificates_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let redis = RedisServer::start();
    let root = runtime_root(dir.path(), "ratelimit/config", &[("a.yaml", FILE_A)]);
    let ca = Ca::new();
    let ca_pem = ca.0.pem();
    let (cert, key) = ca.leaf(&["localhost"]);
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (ca_file, cert_file, key_file) = (
        write("ca.crt", &ca_pem),
        write("tls.crt", &cert),
        write("tls.key", &key),
    );
    let mut rl = start(
        &link,
        &env(
            &root,
            &redis.addr(),
            &[
                ("GRPC_SERVER_USE_TLS", "true"),
                ("GRPC_SERVER_TLS_CERT", &cert_file),
                ("GRPC_SERVER_TLS_KEY", &key_file),
                ("GRPC_CLIENT_TLS_CACERT", &ca_file),
                ("GRPC_CLIENT_TLS_SAN", "envoy.mesh.internal"),
            ],
        ),
    );
    let ports = rl.ports;
    healthy(&ports).await;

    let named = ca.leaf(&["envoy.mesh.internal"]);
    let wildcard = ca.leaf(&["other", "*.mesh.internal"]);
    let other = ca.leaf(&["gateway.mesh.internal"]);
    let common_name_only = ca.leaf(&["envoy.mesh.internal.example"]);
    let unknown_ca = Ca::new().leaf(&["envoy.mesh.internal"]);
    assert!(
        served_over_tls(ports.grpc, &ca_pem, &named).await,
        "a certificate naming the SAN is served"
    );
    assert!(
        served_over_tls(ports.grpc, &ca_pem, &wildcard).await,
        "a wildcard SAN covering it is served, as Go's verification matches it"
    );
    assert!(
        !served_over_tls(ports.grpc, &ca_pem, &other).await,
        "another name of the same CA is refused"
    );
    assert!(
        !served_over_tls(ports.grpc, &ca_pem, &common_name_only).await,
        "a name that only starts the same is refused"
    );
    assert!(
        !served_over_tls(ports.grpc, &ca_pem, &unknown_ca).await,
        "the right name from another CA is refused"
    );
    assert_eq!(terminate(&mut rl).await, Some(0));
}

/// `REDIS_SOCKET_TYPE=unix` with `REDIS_AUTH`: the password goes to a redis-server that
/// listens on a Unix socket only and requires it (`requirepass`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_auth_reaches_a_password_guarded_redis_over_its_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let socket = dir.path().join("redis.sock").display().to_string();
    let redis = RedisServer::start_with(&[
        "--unixsocket",
        &socket,
        "--unixsocketperm",
        "700",
        "--requirepass",
        "s3cret pw",
    ]);
    let root = runtime_root(dir.path(), "ratelimit/config", &[("a.yaml", FILE_A)]);
    clear_of_window_end(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let mut rl = start(
        &link,
        &env(
            &root,
            &socket,
            &[("REDIS_SOCKET_TYPE", "unix"), ("REDIS_AUTH", "s3cret pw")],
        ),
    );
    ok_then_over_limit(&rl).await;
    assert_eq!(terminate(&mut rl).await, Some(0));
    drop(redis);
}

/// `REDIS_PERSECOND_SENTINEL_AUTH`: the per-second Redis behind sentinels of its own with a
/// password of their own, other than the main sentinels' `REDIS_SENTINEL_AUTH`; per-second
/// limits are counted on the master the per-second sentinel names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_second_sentinels_take_a_password_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let link = ratelimit_link(dir.path());
    let (master, sentinel) = RedisServer::guarded_sentinel("master-pw", "sentinel-pw");
    let (fast, fast_sentinel) = RedisServer::guarded_sentinel("fast-pw", "fast-sentinel-pw");
    const RULES: &str = "domain: rl\ndescriptors:\n  - key: k\n    value: a\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: s\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
    let root = runtime_root(dir.path(), "ratelimit/config", &[("a.yaml", RULES)]);
    let fast_url = format!("mymaster,{}", fast_sentinel.addr());
    let more = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_AUTH", "master-pw"),
        ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_TYPE", "sentinel"),
        ("REDIS_PERSECOND_URL", fast_url.as_str()),
        ("REDIS_PERSECOND_AUTH", "fast-pw"),
        ("REDIS_PERSECOND_SENTINEL_AUTH", "fast-sentinel-pw"),
    ];
    let url = format!("mymaster,{}", sentinel.addr());
    let mut rl = start(&link, &env(&root, &url, &more));
    let ports = rl.ports;
    healthy(&ports).await;
    let mut client = plain_client(&ports).await;
    let keys = |server: &RedisServer, pw: &str| -> Vec<String> {
        let c = redis::Client::open(format!("redis://:{pw}@{}", server.addr())).unwrap();
        redis::cmd("KEYS")
            .arg("*")
            .query(&mut c.get_connection().unwrap())
            .unwrap()
    };
    let answer = client
        .should_rate_limit(request("a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(Code::try_from(answer.overall_code).unwrap(), Code::Ok);
    // A one-second window's key lives about a second: read it right after its request.
    let mut per_second = request("x");
    per_second.descriptors[0].entries[0].key = "s".into();
    let mut quick = Vec::new();
    for _ in 0..10 {
        let answer = client
            .should_rate_limit(per_second.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(Code::try_from(answer.overall_code).unwrap(), Code::Ok);
        quick = keys(&fast, "fast-pw");
        if quick.iter().any(|k| k.contains("s=x")) {
            break;
        }
    }
    assert!(quick.iter().any(|k| k.contains("s=x")), "{quick:?}");
    assert!(!quick.iter().any(|k| k.contains("k=a")), "{quick:?}");
    let slow = keys(&master, "master-pw");
    assert!(slow.iter().any(|k| k.contains("k=a")), "{slow:?}");
    assert!(!slow.iter().any(|k| k.contains("s=x")), "{slow:?}");
    assert_eq!(terminate(&mut rl).await, Some(0));
}
