//! Running a load: connections, the closed- and open-loop workers, progress on stderr.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use super::report::Summary;
use super::request::{Rng, Template, ThrottleTemplate};
use crate::proto::RateLimitRequest;
use crate::proto::rate_limit_response::Code;
use crate::proto::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::sluice::v1::ThrottleRequest;
use crate::proto::sluice::v1::throttle_client::ThrottleClient;

/// One connection's clients of the two services.
#[derive(Clone)]
struct Client {
    rls: RateLimitServiceClient<Channel>,
    throttle: ThrottleClient<Channel>,
}

impl Client {
    fn new(channel: Channel) -> Client {
        Client {
            rls: RateLimitServiceClient::new(channel.clone()),
            throttle: ThrottleClient::new(channel),
        }
    }
}

/// What to load, how, and for how long.
#[derive(Debug)]
pub struct Plan {
    pub target: String,
    pub connections: usize,
    pub concurrency: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Open loop at this many requests per second; closed loop when `None`.
    pub rate: Option<f64>,
    pub timeout: Duration,
    pub template: Template,
    /// Load `sluice.v1.Throttle` with this request instead of RLS with the template.
    pub throttle: Option<ThrottleTemplate>,
    pub seed: u64,
    /// Print progress on stderr once a second.
    pub progress: bool,
}

/// The measured window: after the warm-up, for the duration.
#[derive(Debug, Clone, Copy)]
struct Window {
    origin: Instant,
    start: Instant,
    end: Instant,
}

impl Window {
    fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
}

/// Counts of every request since the start (warm-up included), for progress.
#[derive(Debug, Default)]
struct Live {
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
}

/// What one request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    OverLimit,
    Error(String),
}

/// One worker's measurements (merged at the end).
pub(super) struct Tally {
    /// Nanoseconds: closed loop from send to answer, open loop from the due time to answer.
    pub latency: Histogram<u64>,
    /// Open loop only: nanoseconds from the actual send to the answer.
    pub service: Histogram<u64>,
    pub ok: u64,
    pub over_limit: u64,
    pub errors: BTreeMap<String, u64>,
}

impl Tally {
    fn new() -> anyhow::Result<Tally> {
        Ok(Tally {
            latency: Histogram::new_with_bounds(1, MAX_NANOS, 3)?,
            service: Histogram::new_with_bounds(1, MAX_NANOS, 3)?,
            ok: 0,
            over_limit: 0,
            errors: BTreeMap::new(),
        })
    }

    fn record(&mut self, outcome: Outcome, latency: Duration, service: Option<Duration>) {
        self.latency.saturating_record(nanos(latency));
        if let Some(service) = service {
            self.service.saturating_record(nanos(service));
        }
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::OverLimit => self.over_limit += 1,
            Outcome::Error(kind) => *self.errors.entry(kind).or_default() += 1,
        }
    }

    fn merge(&mut self, other: Tally) -> anyhow::Result<()> {
        self.latency.add(&other.latency)?;
        self.service.add(&other.service)?;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        for (kind, n) in other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
        Ok(())
    }

    pub(super) fn requests(&self) -> u64 {
        self.ok + self.over_limit + self.errors.values().sum::<u64>()
    }
}

/// The largest latency recorded as such (an hour); longer ones count as an hour.
const MAX_NANOS: u64 = 3_600_000_000_000;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs the load of `plan` and summarises it.
pub async fn run_load(plan: Plan) -> anyhow::Result<Summary> {
    let channels = connect(&plan.target, plan.connections).await?;
    let plan = Arc::new(plan);
    let origin = Instant::now();
    let start = origin + plan.warmup;
    let window = Window {
        origin,
        start,
        end: start + plan.duration,
    };
    let live = Arc::new(Live::default());
    let progress = plan
        .progress
        .then(|| tokio::spawn(progress(live.clone(), window)));
    let clients: Vec<Client> = channels.into_iter().map(Client::new).collect();
    let total = match plan.rate {
        None => closed_loop(&clients, &plan, window, &live).await,
        Some(rate) => open_loop(&clients, &plan, window, &live, rate).await,
    };
    if let Some(p) = progress {
        p.abort();
        let _ = p.await;
    }
    let mut total = total?;
    if let Some(rate) = plan.rate {
        let missing = due_in_window(&plan, rate).saturating_sub(total.requests());
        if missing > 0 {
            total.errors.insert("not_sent".to_owned(), missing);
        }
    }
    Ok(Summary::new(&plan, total))
}

async fn connect(target: &str, n: usize) -> anyhow::Result<Vec<Channel>> {
    let endpoint = Endpoint::from_shared(target.to_owned())
        .with_context(|| format!("invalid --target {target:?}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {target}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// One request of a load, to either service.
enum Request {
    Rls(RateLimitRequest),
    Throttle(ThrottleRequest),
}

/// The next request of `plan`.
fn make(plan: &Plan, rng: &mut Rng) -> Request {
    match &plan.throttle {
        Some(t) => Request::Throttle(t.make(rng)),
        None => Request::Rls(plan.template.make(rng)),
    }
}

/// Sends one request; what it came to.
async fn call(client: &mut Client, request: Request, timeout: Duration, live: &Live) -> Outcome {
    let outcome = match request {
        Request::Throttle(t) => throttle_call(&mut client.throttle, t, timeout).await,
        Request::Rls(r) => rls_call(&mut client.rls, r, timeout).await,
    };
    let counter = match outcome {
        Outcome::Ok => &live.ok,
        Outcome::OverLimit => &live.over,
        Outcome::Error(_) => &live.errors,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    outcome
}

async fn rls_call(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(timeout, client.should_rate_limit(request)).await {
        Err(_) => Outcome::Error("timeout".to_owned()),
        Ok(Err(status)) => Outcome::Error(format!("{:?}", status.code())),
        Ok(Ok(answer)) => match Code::try_from(answer.get_ref().overall_code) {
            Ok(Code::Ok) => Outcome::Ok,
            Ok(Code::OverLimit) => Outcome::OverLimit,
            _ => Outcome::Error("unknown_overall_code".to_owned()),
        },
    }
}

/// A Throttle call: limited counts as over the limit.
async fn throttle_call(
    client: &mut ThrottleClient<Channel>,
    request: ThrottleRequest,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(timeout, client.throttle(request)).await {
        Err(_) => Outcome::Error("timeout".to_owned()),
        Ok(Err(status)) => Outcome::Error(format!("{:?}", status.code())),
        Ok(Ok(answer)) if answer.get_ref().limited => Outcome::OverLimit,
        Ok(Ok(_)) => Outcome::Ok,
    }
}

/// Closed loop: `concurrency` workers over the connections.
async fn closed_loop(
    clients: &[Client],
    plan: &Arc<Plan>,
    window: Window,
    live: &Arc<Live>,
) -> anyhow::Result<Tally> {
    let mut workers = JoinSet::new();
    for i in 0..plan.concurrency {
        let client = clients[i % clients.len()].clone();
        let rng = Rng::new(plan.seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
        let (plan, live) = (plan.clone(), live.clone());
        workers.spawn(async move { closed_worker(client, &plan, rng, window, &live).await });
    }
    let mut total = Tally::new()?;
    while let Some(done) = workers.join_next().await {
        total.merge(done.context("a load worker panicked")??)?;
    }
    Ok(total)
}

/// One closed-loop worker: the next request as soon as the last is answered. Counts what
/// completes in the window.
async fn closed_worker(
    mut client: Client,
    plan: &Plan,
    mut rng: Rng,
    window: Window,
    live: &Live,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new()?;
    loop {
        if Instant::now() >= window.end {
            return Ok(tally);
        }
        let request = make(plan, &mut rng);
        let sent = Instant::now();
        let outcome = call(&mut client, request, plan.timeout, live).await;
        let done = Instant::now();
        if window.contains(done) {
            tally.record(outcome, done - sent, None);
        }
    }
}

/// Open loop: a pacer thread releases request `k` at its due time `origin + k / rate`; a
/// dispatcher sends each released request as soon as fewer than `concurrency` are in flight,
/// on the connections in turn. Latency runs from the due time. Counts what is due in the
/// window; gives up on requests it could not even send by `end + timeout`.
async fn open_loop(
    clients: &[Client],
    plan: &Arc<Plan>,
    window: Window,
    live: &Arc<Live>,
    rate: f64,
) -> anyhow::Result<Tally> {
    let (due_tx, mut due_rx) = mpsc::unbounded_channel();
    let pacer = std::thread::spawn(move || pace(window, rate, &due_tx));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Answered>();
    let collect = tokio::spawn(async move {
        let mut tally = Tally::new()?;
        while let Some(a) = done_rx.recv().await {
            if window.contains(a.due) {
                tally.record(a.outcome, a.done - a.due, Some(a.done - a.sent));
            }
        }
        anyhow::Ok(tally)
    });
    let slots = Arc::new(Semaphore::new(plan.concurrency));
    let mut in_flight = JoinSet::new();
    let mut rng = Rng::new(plan.seed);
    let mut sent = 0usize;
    while let Some(due) = due_rx.recv().await {
        if Instant::now() > window.end + plan.timeout {
            break;
        }
        let slot = slots.clone().acquire_owned().await?;
        let request = make(plan, &mut rng);
        let mut client = clients[sent % clients.len()].clone();
        sent += 1;
        let (timeout, live, done_tx) = (plan.timeout, live.clone(), done_tx.clone());
        in_flight.spawn(async move {
            let sent = Instant::now();
            let outcome = call(&mut client, request, timeout, &live).await;
            let done = Instant::now();
            drop(slot);
            let _ = done_tx.send(Answered {
                due,
                sent,
                done,
                outcome,
            });
        });
        while in_flight.try_join_next().is_some() {}
    }
    drop(due_rx);
    while in_flight.join_next().await.is_some() {}
    drop(done_tx);
    let tally = collect.await.context("the collector panicked")??;
    pacer
        .join()
        .map_err(|_| anyhow::anyhow!("the pacer panicked"))?;
    Ok(tally)
}

/// One answered open-loop request.
struct Answered {
    due: Instant,
    sent: Instant,
    done: Instant,
    outcome: Outcome,
}

/// Releases the due times of the open loop, from a thread of its own: a thread's sleep wakes
/// within tens of microseconds, where tokio's timer rounds up to the next millisecond (which
/// would add up to 1-2 ms to every latency measured from the due time). Stops at the end of
/// the window or when nobody listens.
fn pace(window: Window, rate: f64, due_tx: &mpsc::UnboundedSender<Instant>) {
    for k in 0u64.. {
        let due = window.origin + Duration::from_secs_f64(k as f64 / rate);
        if due >= window.end {
            return;
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if due_tx.send(due).is_err() {
            return;
        }
    }
}

/// How many requests of an open loop are due in the measured window.
fn due_in_window(plan: &Plan, rate: f64) -> u64 {
    let due_before = |secs: f64| (secs * rate).ceil() as u64;
    let warmup = plan.warmup.as_secs_f64();
    due_before(warmup + plan.duration.as_secs_f64()) - due_before(warmup)
}

/// Once a second on stderr: the phase, the rate over the last second, and counts so far.
async fn progress(live: Arc<Live>, window: Window) {
    let mut tick = tokio::time::interval_at(
        window.origin + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut last = 0;
    loop {
        let now = tick.tick().await;
        let (ok, over, errors) = (
            live.ok.load(Ordering::Relaxed),
            live.over.load(Ordering::Relaxed),
            live.errors.load(Ordering::Relaxed),
        );
        let total = ok + over + errors;
        let phase = if now <= window.start {
            "warm-up"
        } else {
            "measure"
        };
        eprintln!(
            "[{:>4.0}s] {phase:<7} {:>9} req/s  ok {ok}  over_limit {over}  errors {errors}",
            (now - window.origin).as_secs_f64(),
            total - last,
        );
        last = total;
    }
}
