//! Redis failures under load: a real `redis-server` is killed while clients keep calling, then
//! restarted on the same port, or paused (SIGSTOP: it hangs) and resumed. With
//! `on_error = "error"` every answer is `UNAVAILABLE` within the time-out; with `"local"`
//! answers keep coming, decided by the local limiter; after the restart decisions come from
//! Redis again within 2 s, without restarting sluice. Also: sluice starts with Redis down, and
//! readiness follows Redis only with `on_error = "error"`.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice::config::settings::{LeaseMode, OnError, RedisSettings, Settings};
use sluice::limiter::RedisLimiter;
use sluice::testing::grpc::*;
use sluice::testing::process::{HeldPort, SluiceProcess};
use sluice::testing::redis::RedisServer;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const RULES: &str = include_str!("../fixtures/rules/suites/faults.yaml");

const TIMEOUT: Duration = Duration::from_millis(100);
/// What a loaded 2-core machine may add to the time-out (gRPC on loopback, scheduling).
const SLACK: Duration = Duration::from_millis(400);
const CLIENTS: usize = 8;

#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Ok,
    OverLimit,
    Unavailable,
    Other(String),
}

#[derive(Debug, Clone)]
struct Event {
    start: Instant,
    took: Duration,
    answer: Answer,
}

fn settings(url: String, on_error: OnError) -> RedisSettings {
    RedisSettings {
        url,
        on_error,
        timeout_ms: TIMEOUT.as_millis() as u64,
        connect_timeout_ms: 200,
        breaker_failures: 3,
        breaker_cooldown_ms: 200,
        ..sluice::testing::redis::default_settings()
    }
}

/// `settings` with leases off, for a test of what `on_error` answers while Redis is away: with
/// leases on, a request may be answered from a lease taken before the outage (a right answer:
/// Redis counted its units) until the first failed call drops the leases, so not every answer
/// during the outage comes from `on_error`.
fn without_leases(settings: RedisSettings) -> RedisSettings {
    RedisSettings {
        leases: LeaseMode::Off,
        ..settings
    }
}

async fn serve(settings: RedisSettings) -> (TestServer, Arc<RedisLimiter>) {
    let limiter = Arc::new(RedisLimiter::new(&settings, 10_000).expect("valid redis settings"));
    let server = TestServer::start_over(Settings::default(), RULES, limiter.clone()).await;
    (server, limiter)
}

/// Clients calling in a loop until stopped; every answer is recorded.
struct Load {
    events: Arc<Mutex<Vec<Event>>>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// One load at a time: tests run in parallel, and loads sharing two cores would time each
/// other's answers.
static LOAD_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Load {
    async fn start(server: &TestServer) -> Load {
        let turn = LOAD_TURN.lock().await;
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..CLIENTS {
            let mut c = client(server).await;
            let (events, stop) = (events.clone(), stop.clone());
            tasks.spawn(async move {
                let value = format!("client{n}");
                while !stop.is_cancelled() {
                    let start = Instant::now();
                    let r = c
                        .should_rate_limit(req("f", vec![desc(&[("k", &value)])]))
                        .await;
                    let answer = match r {
                        Ok(r) if overall(r.get_ref()) == Code::Ok => Answer::Ok,
                        Ok(_) => Answer::OverLimit,
                        Err(s) if s.code() == tonic::Code::Unavailable => Answer::Unavailable,
                        Err(s) => Answer::Other(s.to_string()),
                    };
                    events.lock().push(Event {
                        start,
                        took: start.elapsed(),
                        answer,
                    });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        }
        Load {
            events,
            stop,
            tasks,
            _turn: turn,
        }
    }

    async fn finish(mut self) -> Vec<Event> {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        self.events.lock().clone()
    }
}

fn between(events: &[Event], from: Instant, to: Instant) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| e.start >= from && e.start < to)
        .collect()
}

/// When Redis went away and came back, under load.
struct Outage {
    /// Just before Redis went away.
    going: Instant,
    /// Redis is away from here...
    down: Instant,
    /// ...at least until here (just before it was started or resumed)...
    coming: Instant,
    /// ...and back from here.
    up: Instant,
}

/// Runs the clients against `server` for 400 ms, then `stop`s Redis for 1 s, `start`s it
/// again and keeps going for 2.5 s; returns every answer and when Redis was away.
async fn under_load(
    server: &TestServer,
    redis: &mut RedisServer,
    stop: fn(&mut RedisServer),
    start: fn(&mut RedisServer),
) -> (Vec<Event>, Outage) {
    let load = Load::start(server).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let going = Instant::now();
    stop(redis);
    let down = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let coming = Instant::now();
    start(redis);
    let up = Instant::now();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let outage = Outage {
        going,
        down,
        coming,
        up,
    };
    (load.finish().await, outage)
}

/// With `on_error = "error"`: OK before the outage, only UNAVAILABLE during it, no answer
/// slower than the time-out (plus slack), OK again within 2 s of Redis coming back, and OK
/// from then on. Returns the slowest answer.
fn assert_unavailable_then_back(events: &[Event], outage: &Outage, what: &str) -> Duration {
    let before = between(
        events,
        outage.going - Duration::from_millis(300),
        outage.going - TIMEOUT,
    );
    assert!(!before.is_empty());
    for e in &before {
        assert_eq!(e.answer, Answer::Ok, "{e:?}");
    }
    // A request sent less than a time-out before Redis is back may be answered by Redis.
    let down = between(events, outage.down, outage.coming - TIMEOUT);
    assert!(down.len() > 20, "load kept calling: {}", down.len());
    for e in &down {
        assert_eq!(e.answer, Answer::Unavailable, "{e:?}");
    }
    let slowest = events.iter().map(|e| e.took).max().unwrap_or_default();
    assert!(slowest <= TIMEOUT + SLACK, "an answer took {slowest:?}");
    let back = first_ok_after(events, outage.up);
    eprintln!(
        "on_error=error, {what}: {} answers, slowest {slowest:?}, Redis again after {back:?}",
        events.len()
    );
    assert!(
        back <= Duration::from_secs(2),
        "decisions from Redis again after {back:?}"
    );
    let settled = between(
        events,
        outage.up + back + Duration::from_millis(100),
        Instant::now(),
    );
    let failed = settled.iter().find(|e| e.answer != Answer::Ok);
    assert!(failed.is_none(), "stays healthy: {failed:?}");
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_error_answers_unavailable_within_the_timeout_then_recovers() {
    let _serial = crate::serial_async().await;
    let mut redis = RedisServer::start();
    let (server, _) = serve(without_leases(settings(redis.url(), OnError::Error))).await;
    let (events, outage) =
        under_load(&server, &mut redis, RedisServer::kill, RedisServer::restart).await;
    assert_unavailable_then_back(&events, &outage, "killed");
}

/// A paused Redis (SIGSTOP) accepts commands and answers none: every call waits for the
/// time-out, not for a refused connection. The breaker opens after a few, so most answers
/// come at once; after SIGCONT, Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_error_answers_within_the_timeout_when_redis_hangs() {
    let _serial = crate::serial_async().await;
    let mut redis = RedisServer::start();
    let (server, limiter) = serve(without_leases(settings(redis.url(), OnError::Error))).await;
    let (events, outage) = under_load(&server, &mut redis, |r| r.pause(), |r| r.resume()).await;
    for e in &events {
        assert!(
            matches!(e.answer, Answer::Ok | Answer::Unavailable),
            "{e:?}"
        );
    }
    let slowest = assert_unavailable_then_back(&events, &outage, "paused");
    assert!(slowest >= TIMEOUT, "the time-out was hit: {slowest:?}");
    let down = between(&events, outage.down, outage.coming - TIMEOUT);
    let waited = down.iter().filter(|e| e.took >= TIMEOUT / 2).count();
    eprintln!("paused: {waited} of {} answers waited", down.len());
    assert!(
        waited * 4 < down.len(),
        "the breaker answers most at once: {waited} of {} waited",
        down.len()
    );
    let breaker_open = limiter
        .events()
        .into_iter()
        .find(|(name, _)| *name == "breaker_open")
        .map(|(_, n)| n);
    assert!(breaker_open > Some(0), "breaker opened: {breaker_open:?}");
}

fn first_ok_after(events: &[Event], t: Instant) -> Duration {
    events
        .iter()
        .filter(|e| e.start >= t && e.answer == Answer::Ok)
        .map(|e| e.start - t)
        .min()
        .unwrap_or(Duration::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_local_keeps_answering_and_returns_to_redis() {
    let _serial = crate::serial_async().await;
    let mut redis = RedisServer::start();
    let (server, _) = serve(settings(redis.url(), OnError::Local)).await;
    let load = Load::start(&server).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.kill();
    let killed = Instant::now();
    // The local limiter really limits (`allow` would admit all 7).
    let mut c = client(&server).await;
    let mut codes = Vec::new();
    for _ in 0..7 {
        let r = call(&mut c, req("f", vec![desc(&[("small", "x")])])).await;
        codes.push(overall(&r));
    }
    assert_eq!(codes[..5], [Code::Ok; 5], "{codes:?}");
    assert_eq!(codes[5..], [Code::OverLimit; 2], "{codes:?}");
    tokio::time::sleep(Duration::from_millis(1_000).saturating_sub(killed.elapsed())).await;
    redis.restart();
    let restarted = Instant::now();
    let mut back = None;
    while restarted.elapsed() < Duration::from_secs(3) {
        if redis.script_calls() > 0 {
            back = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let events = load.finish().await;

    assert!(
        events.iter().all(|e| e.answer == Answer::Ok),
        "always answered"
    );
    assert!(between(&events, killed, restarted).len() > 20);
    let slowest = events.iter().map(|e| e.took).max().unwrap_or_default();
    assert!(slowest <= TIMEOUT + SLACK, "an answer took {slowest:?}");
    let back = back.expect("Redis is called again");
    eprintln!(
        "on_error=local: {} answers, slowest {slowest:?}, Redis again after {back:?}",
        events.len()
    );
    assert!(
        back <= Duration::from_secs(2),
        "back to Redis after {back:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_starts_with_redis_down_and_uses_it_once_it_is_up() {
    let _serial = crate::serial_async().await;
    // Redis comes later on a port from the kernel, held (refusing connections) until then.
    let port = HeldPort::new();
    let (server, _) = serve(settings(
        format!("redis://127.0.0.1:{}", port.port()),
        OnError::Error,
    ))
    .await;
    let mut c = client(&server).await;
    for _ in 0..5 {
        let started = Instant::now();
        let err = c
            .should_rate_limit(req("f", vec![desc(&[("k", "v")])]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(started.elapsed() <= TIMEOUT + SLACK);
    }
    let _redis = RedisServer::start_on(port);
    let up = Instant::now();
    loop {
        if c.should_rate_limit(req("f", vec![desc(&[("k", "v")])]))
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(2),
            "still failing after 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn on_error_allow_and_deny_answer_when_redis_is_down() {
    let _serial = crate::serial_async().await;
    // Nothing listens there: a port from the kernel, held and refusing connections.
    let down = HeldPort::new();
    let url = format!("redis://127.0.0.1:{}", down.port());
    for (on_error, expected) in [(OnError::Allow, Code::Ok), (OnError::Deny, Code::OverLimit)] {
        let (server, _) = serve(settings(url.clone(), on_error)).await;
        let mut c = client(&server).await;
        for _ in 0..5 {
            let started = Instant::now();
            let r = call(&mut c, req("f", vec![desc(&[("k", "v")])])).await;
            assert_eq!(overall(&r), expected, "{on_error:?}");
            assert!(started.elapsed() <= TIMEOUT + SLACK);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_with_redis_down_and_decides_once_it_is_up() {
    let _serial = crate::serial_async().await;
    // Redis comes later on a port from the kernel, held (refusing connections) until then.
    let port = HeldPort::new();
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(rules.path(), RULES).expect("write rules");
    let url = format!("redis://127.0.0.1:{}", port.port());
    let sluice = SluiceProcess::over_redis(env!("CARGO_BIN_EXE_sluice"), rules.path(), &url, &[]);
    let mut c = RateLimitServiceClient::connect(sluice.url())
        .await
        .expect("connect");
    let ask = || req("f", vec![desc(&[("k", "v")])]);
    let err = c.should_rate_limit(ask()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    // Not ready while Redis is down: /readyz says why, gRPC health says NOT_SERVING.
    let ready = sluice::testing::http::get(sluice.admin(), "/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(ready.body.contains("redis"), "{}", ready.body);
    wait_for(|| async { health(&sluice).await == ServingStatus::NotServing }).await;

    let _redis = RedisServer::start_on(port);
    let up = Instant::now();
    while c.should_rate_limit(ask()).await.is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(2),
            "still failing after 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(|| async {
        sluice::testing::http::get(sluice.admin(), "/readyz")
            .await
            .status
            == 200
    })
    .await;
    wait_for(|| async { health(&sluice).await == ServingStatus::Serving }).await;
}

/// What gRPC health says about the whole service.
async fn health(sluice: &SluiceProcess) -> ServingStatus {
    let channel = tonic::transport::Channel::from_shared(sluice.url())
        .expect("a URL")
        .connect()
        .await
        .expect("connect");
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("a health answer")
        .into_inner()
        .status;
    ServingStatus::try_from(status).expect("a known status")
}

/// With `on_error` = `allow`, `deny` or `local` sluice answers while Redis is down, so it
/// stays ready; with `error` it is not ready (Kubernetes then routes to other replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_ignores_redis_down_unless_on_error_is_error() {
    let _serial = crate::serial_async().await;
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    std::fs::write(rules.path(), RULES).expect("write rules");
    // Nothing listens there: a port from the kernel, held and refusing connections.
    let down = HeldPort::new();
    let url = format!("redis://127.0.0.1:{}", down.port());
    let cases = [
        ("error", Err(tonic::Code::Unavailable), 503),
        ("allow", Ok(Code::Ok), 200),
        ("deny", Ok(Code::OverLimit), 200),
        ("local", Ok(Code::Ok), 200),
    ];
    let processes: Vec<_> = cases
        .iter()
        .map(|(on_error, _, _)| {
            let env = [("SLUICE_REDIS__ON_ERROR", *on_error)];
            SluiceProcess::over_redis(env!("CARGO_BIN_EXE_sluice"), rules.path(), &url, &env)
        })
        .collect();
    // Long enough for the PING probe (at start, then every second) to have failed.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for ((on_error, answer, ready), sluice) in cases.iter().zip(&processes) {
        let mut c = RateLimitServiceClient::connect(sluice.url())
            .await
            .expect("connect");
        let got = c
            .should_rate_limit(req("f", vec![desc(&[("k", "v")])]))
            .await
            .map(|r| overall(r.get_ref()))
            .map_err(|s| s.code());
        assert_eq!(&got, answer, "{on_error}");
        let readyz = sluice::testing::http::get(sluice.admin(), "/readyz").await;
        assert_eq!(readyz.status, *ready, "{on_error}: {}", readyz.body);
        let serving = if *ready == 200 {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        assert_eq!(health(sluice).await, serving, "{on_error}");
    }
}

/// Waits up to 3 s for `ready` (the probe runs every second).
async fn wait_for<F: std::future::Future<Output = bool>>(mut ready: impl FnMut() -> F) {
    let start = Instant::now();
    while !ready().await {
        assert!(start.elapsed() < Duration::from_secs(3), "not within 3 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_app_builds_a_redis_backend_without_connecting() {
    let _serial = crate::serial();
    let mut settings = Settings::default();
    settings.limiter.backend = sluice::config::settings::Backend::Redis;
    // Never connected to: a port from the kernel, held and refusing connections.
    let down = HeldPort::new();
    settings.redis.url = format!("redis://127.0.0.1:{}", down.port());
    let model = sluice::config::rules_file::from_sources(&[("r.yaml".into(), RULES.to_owned())])
        .expect("valid rules");
    let app = sluice::app::App::build(&settings, sluice::rules::RuleSet::compile(model));
    assert!(app.is_ok());
    settings.redis.prefix = "bad{".to_owned();
    let model = sluice::config::rules_file::from_sources(&[("r.yaml".into(), RULES.to_owned())])
        .expect("valid rules");
    assert!(sluice::app::App::build(&settings, sluice::rules::RuleSet::compile(model)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_events_reach_the_metrics() {
    let _serial = crate::serial_async().await;
    let redis = RedisServer::start();
    let rules = tempfile::NamedTempFile::new().expect("a rules file");
    let one_per_minute = "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    std::fs::write(rules.path(), one_per_minute).expect("write rules");
    let sluice = SluiceProcess::over_redis(
        env!("CARGO_BIN_EXE_sluice"),
        rules.path(),
        &redis.url(),
        &[("SLUICE_REDIS__TIMEOUT_MS", "2000")],
    );
    let mut c = RateLimitServiceClient::connect(sluice.url())
        .await
        .expect("connect");
    let ask = || req("f", vec![desc(&[("k", "hot")])]);
    let mut codes = Vec::new();
    for _ in 0..7 {
        codes.push(overall(&call(&mut c, ask()).await));
    }
    let over = codes.iter().filter(|c| **c == Code::OverLimit).count();
    assert_eq!(over, 6, "{codes:?}");
    // The first denial comes from Redis and is learned; every later one is a cache hit.
    let metrics = sluice::testing::http::get(sluice.admin(), "/metrics")
        .await
        .body;
    let expected = format!(
        "sluice_backend_events_total{{backend=\"redis\",event=\"deny_cache_hit\"}} {}",
        over - 1
    );
    assert!(metrics.contains(&expected), "{expected} not in:\n{metrics}");
    assert!(metrics.contains("sluice_backend_events_total{backend=\"redis\",event=\"failure\"} 0"));
}
