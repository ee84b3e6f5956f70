//! Hot reload over real files: a Kubernetes ConfigMap-style `..data` symlink swap is seen
//! within 2 s (and moves the loaded-at time), a broken file keeps the old rules answering
//! and counts a failed reload, and the reload trigger (SIGHUP in the binary) reloads without
//! a watcher. With the real binary: a failed reload logs each error with file and line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sluice::app::{App, Listeners};
use sluice::config::settings::Settings;
use sluice::limiter::{Limiter, MemoryLimiter};
use sluice::reload::ReloadTrigger;
use sluice::testing::eventually;
use sluice::testing::grpc::*;
use sluice::testing::http::{get, sample};
use sluice::testing::process::{Served, logged_listener, sluice_command};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

fn rules(requests_per_unit: u32) -> String {
    format!(
        "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {requests_per_unit}}}\n"
    )
}

/// A ConfigMap volume: `<mount>/..<version>/rules.yaml`, `..data -> ..<version>`, and
/// `rules.yaml -> ..data/rules.yaml`, updated the way the kubelet does it.
struct ConfigMap {
    mount: PathBuf,
    version: usize,
}

impl ConfigMap {
    fn new(mount: &Path, text: &str) -> ConfigMap {
        let mut map = ConfigMap {
            mount: mount.to_path_buf(),
            version: 0,
        };
        map.update(text);
        std::os::unix::fs::symlink("..data/rules.yaml", mount.join("rules.yaml")).unwrap();
        map
    }

    /// New timestamped directory, `..data_tmp` pointing to it, renamed over `..data`, old
    /// directory removed.
    fn update(&mut self, text: &str) {
        self.version += 1;
        let dir = format!("..2026_01_01_00_00_0{}", self.version);
        std::fs::create_dir(self.mount.join(&dir)).unwrap();
        std::fs::write(self.mount.join(&dir).join("rules.yaml"), text).unwrap();
        let tmp = self.mount.join("..data_tmp");
        std::os::unix::fs::symlink(&dir, &tmp).unwrap();
        std::fs::rename(&tmp, self.mount.join("..data")).unwrap();
        if self.version > 1 {
            let old = format!("..2026_01_01_00_00_0{}", self.version - 1);
            std::fs::remove_dir_all(self.mount.join(old)).unwrap();
        }
    }
}

struct Running {
    grpc: String,
    admin: SocketAddr,
    trigger: ReloadTrigger,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    _guard: DropGuard,
}

async fn start(settings: Settings) -> Running {
    let model = sluice::reload::load(&settings.rules.paths, (&settings.limits).into())
        .expect("valid rules at start");
    let limiter: Arc<dyn Limiter> = Arc::new(MemoryLimiter::new(1000));
    let app = App::from_parts(&settings, sluice::rules::RuleSet::compile(model), limiter);
    let trigger = app.reload_trigger();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc_addr, admin_addr) = (grpc.local_addr().unwrap(), admin.local_addr().unwrap());
    let stop = CancellationToken::new();
    let listeners = Listeners {
        grpc: grpc.into(),
        admin: Some(admin),
    };
    let task = tokio::spawn(app.run(listeners, stop.clone().cancelled_owned()));
    Running {
        grpc: format!("http://{grpc_addr}"),
        admin: admin_addr,
        trigger,
        _guard: stop.clone().drop_guard(),
        stop,
        task,
    }
}

impl Running {
    /// The `requests_per_unit` the server applies to `k` now.
    async fn limit(&self) -> u32 {
        let mut c = RateLimitServiceClient::connect(self.grpc.clone())
            .await
            .unwrap();
        let r = call(&mut c, req("test", vec![desc(&[("k", "v")])])).await;
        limit_of(&r.statuses[0]).expect("a limit").0
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        sample(&get(self.admin, "/metrics").await.body, name, labels)
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Now, in Unix seconds (whole, as the gauge).
fn unix_now() -> f64 {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    now.expect("a clock after 1970").as_secs() as f64
}

fn watching(paths: Vec<PathBuf>) -> Settings {
    let mut settings = Settings::default();
    settings.rules.paths = paths;
    settings.reload.debounce_ms = 50;
    settings
}

async fn configmap_swap_then_broken_file(rules_path: impl Fn(&Path) -> PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mut map = ConfigMap::new(dir.path(), &rules(1));
    let server = start(watching(vec![rules_path(dir.path())])).await;
    assert_eq!(server.limit().await, 1);
    let loaded_at = "sluice_config_loaded_timestamp_seconds";
    let started = server.metric(loaded_at, &[]).await.expect("a load time");
    assert!((unix_now() - started).abs() <= 5.0, "{started}");
    // The gauge is in whole seconds: let one pass so that the reload moves it.
    while unix_now() <= started {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    map.update(&rules(7));
    let swapped = Instant::now();
    eventually(Duration::from_secs(2), "the new rules", || async {
        server.limit().await == 7
    })
    .await;
    assert!(swapped.elapsed() < Duration::from_secs(2));
    let success = [("outcome", "success")];
    assert_eq!(
        server.metric("sluice_config_reloads_total", &success).await,
        Some(1.0)
    );
    assert_eq!(server.metric("sluice_config_version", &[]).await, Some(2.0));
    let reloaded = server.metric(loaded_at, &[]).await.expect("a load time");
    assert!(
        reloaded > started && reloaded <= unix_now(),
        "{started} -> {reloaded}"
    );

    map.update("domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n");
    let failure = [("outcome", "failure")];
    eventually(
        Duration::from_secs(2),
        "the failed reload counted",
        || async { server.metric("sluice_config_reloads_total", &failure).await == Some(1.0) },
    )
    .await;
    assert_eq!(server.limit().await, 7, "the last good rules still answer");
    assert_eq!(server.metric("sluice_config_version", &[]).await, Some(2.0));
    let kept = server.metric(loaded_at, &[]).await;
    assert_eq!(kept, Some(reloaded), "a failed reload keeps the load time");
    let dump = get(server.admin, "/rlconfig").await.body;
    assert!(dump.starts_with("# version 2,"), "{dump}");
    assert!(dump.contains("# last failed reload at "), "{dump}");
    server.stop().await;
}

#[tokio::test]
async fn configmap_directory_swap_is_seen_and_a_broken_file_keeps_the_old_rules() {
    configmap_swap_then_broken_file(|mount| mount.to_path_buf()).await;
}

#[tokio::test]
async fn configmap_file_swap_is_seen_through_its_parent_directory() {
    configmap_swap_then_broken_file(|mount| mount.join("rules.yaml")).await;
}

#[tokio::test]
async fn the_trigger_reloads_without_a_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, rules(1)).unwrap();
    let mut settings = watching(vec![file.clone()]);
    settings.reload.watch = false;
    let server = start(settings).await;
    std::fs::write(&file, rules(3)).unwrap();
    server.trigger.reload();
    eventually(Duration::from_secs(2), "the triggered reload", || async {
        server.limit().await == 3
    })
    .await;
    // Unchanged files: the version stays.
    server.trigger.reload();
    let unchanged = [("outcome", "unchanged")];
    eventually(Duration::from_secs(2), "the unchanged reload", || async {
        server
            .metric("sluice_config_reloads_total", &unchanged)
            .await
            == Some(1.0)
    })
    .await;
    assert_eq!(server.metric("sluice_config_version", &[]).await, Some(2.0));
    server.stop().await;
}

#[tokio::test]
async fn a_reload_keeps_the_default_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, rules(1)).unwrap();
    let mut settings = watching(vec![file.clone()]);
    settings.reload.watch = false;
    settings.limits.default_algorithm = sluice::config::model::Algorithm::FixedWindow;
    let server = start(settings).await;
    let dump = get(server.admin, "/rlconfig").await.body;
    assert!(
        dump.contains("fixed_window") && !dump.contains("funnel"),
        "{dump}"
    );
    std::fs::write(&file, rules(3)).unwrap();
    server.trigger.reload();
    eventually(Duration::from_secs(2), "the triggered reload", || async {
        server.limit().await == 3
    })
    .await;
    let dump = get(server.admin, "/rlconfig").await.body;
    assert!(
        dump.contains("fixed_window") && !dump.contains("funnel"),
        "{dump}"
    );
    server.stop().await;
}

/// Two errors, on lines 4 and 6.
const BROKEN: &str = "domain: test\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}\n";

#[tokio::test]
async fn the_binary_logs_every_error_of_a_failed_reload_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("rules");
    std::fs::create_dir(&mount).unwrap();
    let mut map = ConfigMap::new(&mount, &rules(1));
    let log = dir.path().join("stderr.log");
    // Ports of the child's choosing (0), read from its log: one chosen here could be taken
    // before it binds it.
    let child = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--rules", mount.to_str().unwrap()])
        .args(["--grpc-listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .env("SLUICE_RELOAD__DEBOUNCE_MS", "50")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _served = Served(child);
    let (grpc, admin) = (
        logged_listener(&log, "gRPC"),
        logged_listener(&log, "admin HTTP"),
    );
    connect_within(&format!("http://{grpc}"), Duration::from_secs(20)).await;
    let metric = |name: &'static str, labels: &'static [(&'static str, &'static str)]| async move {
        sample(&get(admin, "/metrics").await.body, name, labels)
    };

    // A real process watching files on a shared machine: how soon it reloads is not under
    // test here (the in-process tests above bound it), so the waits are generous.
    map.update(&rules(7));
    eventually(Duration::from_secs(10), "the new rules", || async {
        metric("sluice_config_version", &[]).await == Some(2.0)
    })
    .await;
    map.update(BROKEN);
    let failure = &[("outcome", "failure")];
    eventually(Duration::from_secs(10), "the failed reload", || async {
        metric("sluice_config_reloads_total", failure).await == Some(1.0)
    })
    .await;

    let text = std::fs::read_to_string(&log).unwrap();
    let file = mount.join("rules.yaml");
    let errors = [
        format!(
            "{}:4: descriptors[0].rate_limit.unit: unknown unit 'fortnight'",
            file.display()
        ),
        format!(
            "{}:6: descriptors[1].rate_limit.algorithm: unknown algorithm 'gcra' (expected \
             funnel, token_bucket, fixed_window, sliding_window, sliding_log or concurrency)",
            file.display()
        ),
    ];
    for error in &errors {
        let logged = text
            .lines()
            .any(|l| l.contains(" ERROR ") && l.ends_with(error.as_str()));
        assert!(logged, "not logged as an error: {error}\n{text}");
    }
    let summary = "rules reload failed; the last good rules stay active errors=2";
    assert!(text.contains(summary), "{text}");
    assert!(
        text.contains("rules reloaded version=2 domains=1"),
        "{text}"
    );
    // Plain text in a file, without the file watcher's info line on each ConfigMap swap.
    assert!(!text.contains('\u{1b}'), "ANSI escapes in a file:\n{text}");
    assert!(!text.contains("notify"), "{text}");
}
