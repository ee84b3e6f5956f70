//! `sluice bench`: a load generator for any Envoy RLS v3 server, and a no-op RLS server that
//! gives the ceiling of gRPC on the machine.
//!
//! # Load
//!
//! `--connections N` HTTP/2 connections (one tonic `Channel` each) carry `--concurrency C`
//! workers (worker `i` uses connection `i mod N`). After `--warmup`, requests are measured
//! for `--duration`:
//!
//! - **closed loop** (default): each worker sends its next request when the previous one is
//!   answered, so `C` requests are always in flight. A request counts when it completes inside
//!   the measured window; its latency runs from its send to its answer.
//! - **open loop** (`--rate R`): request `k` is due at `start + k/R`. A pacer thread releases
//!   each request at its due time (a thread's sleep is precise to tens of microseconds, where
//!   tokio's timer rounds up to the next millisecond); a dispatcher sends it at once, or as
//!   soon as fewer than `C` are in flight. Latency runs from the due time (no coordinated
//!   omission: a slow server cannot slow the schedule down and hide its own queueing); the
//!   time from the actual send is reported apart as the service time. A request counts when
//!   it is due inside the measured window.
//!
//! The request comes from `--request FILE` (the proto3-JSON form of `RateLimitRequest`, in JSON
//! or YAML) or from flags (`--domain`, `--descriptor k=v,k2=v2` repeated, `--hits`).
//! `--spread KEY=N` replaces the value of every entry whose key is `KEY` by `KEY-n`, `n` drawn
//! per entry from `0..N` (uniformly, seeded by `--seed`; or in sequence from `--seed` with
//! `--spread-order sequential`), to exercise many keys.
//!
//! `--throttle KEY` loads `sluice.v1.Throttle` instead: every request throttles KEY with
//! `--throttle-limit COUNT/PERIOD_MS[/MAX_BURST]` (default a limit no load reaches) and
//! `--hits` as its quantity (default 1); `--spread KEY=N` spreads it over `KEY-0` ..
//! `KEY-(N-1)`; a limited answer counts as over the limit.
//!
//! Progress goes to stderr once a second; the result (requests/s, latency percentiles from an
//! HDR histogram, OK / OVER_LIMIT / error counts) to stdout as a table or, with `--json`, as one
//! JSON object.
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | `request` | the request template: from a file or flags, the spread |
//! | `load` | connections, closed- and open-loop workers, progress |
//! | `report` | the result: counts, percentiles, table and JSON |
//! | `noop` | the no-op RLS server |

mod load;
mod noop;
mod report;
mod request;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

pub use load::{Plan, run_load};
pub use noop::serve_noop;
pub use report::{Percentiles, Summary};
pub use request::{Rng, Spread, SpreadOrder, Template, ThrottleTemplate};

/// The options of `sluice bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Serve a no-op RLS server (answers OK to everything) on ADDR instead of generating load;
    /// until Ctrl-C, or for `--duration` when given.
    #[arg(long, value_name = "ADDR", conflicts_with = "target")]
    pub noop_server: Option<SocketAddr>,
    /// The RLS server to load, e.g. http://127.0.0.1:8081.
    #[arg(long, value_name = "URL", required_unless_present = "noop_server")]
    pub target: Option<String>,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub connections: usize,
    /// Requests in flight (workers); with `--rate`, the most in flight.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub concurrency: usize,
    /// How long to measure (e.g. 10s, 500ms, 1m) [default: 10s].
    #[arg(long, value_parser = parse_duration, value_name = "TIME")]
    pub duration: Option<Duration>,
    /// Load sent before measuring.
    #[arg(long, value_parser = parse_duration, default_value = "2s", value_name = "TIME")]
    pub warmup: Duration,
    /// Open loop: this many requests per second, on a fixed schedule.
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<f64>,
    /// The request: proto3 JSON of a RateLimitRequest, in a .json or .yaml file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["domain", "descriptors"])]
    pub request: Option<PathBuf>,
    /// The request's domain (with `--descriptor`).
    #[arg(long)]
    pub domain: Option<String>,
    /// One descriptor, `key=value[,key2=value2...]` (repeatable).
    #[arg(long = "descriptor", value_name = "K=V,...")]
    pub descriptors: Vec<String>,
    /// The request's `hits_addend`.
    #[arg(long, value_name = "N")]
    pub hits: Option<u32>,
    /// Spread the value of every entry with this key over N values: `KEY-0` .. `KEY-(N-1)`.
    #[arg(long, value_name = "KEY=N")]
    pub spread: Option<String>,
    /// How spread values are drawn.
    #[arg(long, value_enum, default_value_t = SpreadOrder::Random)]
    pub spread_order: SpreadOrder,
    /// Seed of the random spread (each worker derives its own); the first value of the
    /// sequential one.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Load sluice.v1.Throttle instead of RLS: every request throttles this key.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["request", "domain", "descriptors"])]
    pub throttle: Option<String>,
    /// The Throttle key's limit: COUNT/PERIOD_MS[/MAX_BURST] (with `--throttle`).
    #[arg(
        long,
        value_name = "COUNT/PERIOD_MS[/MAX_BURST]",
        requires = "throttle"
    )]
    pub throttle_limit: Option<String>,
    /// A request not answered within this time counts as an error.
    #[arg(long, value_parser = parse_duration, default_value = "5s", value_name = "TIME")]
    pub timeout: Duration,
    /// Threads of the load generator's runtime, or of the no-op server's with
    /// `--noop-server` [default: the number of CPUs].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// With `--noop-server`: each gRPC stream on a task of its own, as
    /// `server.stream_tasks = true` serves sluice's.
    #[arg(long, requires = "noop_server")]
    pub stream_tasks: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// The default measured time.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// Runs `sluice bench`: the no-op server, or a load and its report on stdout.
pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.noop_server {
        // Served on sluice's own runtime; `--threads` sets its workers as
        // `server.worker_threads` sets sluice's.
        let runtime =
            crate::runtime::build(args.threads.unwrap_or(0)).context("cannot start the runtime")?;
        return runtime.block_on(noop(addr, args.duration, args.stream_tasks));
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        builder.worker_threads(threads.max(1));
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let plan = plan_of(&args)?;
    let summary = runtime.block_on(run_load(plan))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.table());
    }
    Ok(())
}

async fn noop(
    addr: SocketAddr,
    duration: Option<Duration>,
    stream_tasks: bool,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    eprintln!("no-op RLS server on {bound}");
    let stop = async move {
        match duration {
            Some(d) => tokio::select! {
                () = tokio::time::sleep(d) => {}
                () = crate::signal::shutdown() => {}
            },
            None => crate::signal::shutdown().await,
        }
    };
    serve_noop(listener, stop, stream_tasks).await;
    Ok(())
}

/// The plan of a load from the command line.
fn plan_of(args: &BenchArgs) -> anyhow::Result<Plan> {
    let target = args.target.clone().context("--target is required")?;
    let throttle = match &args.throttle {
        Some(key) => Some(ThrottleTemplate {
            base: throttle_request(key, args.throttle_limit.as_deref(), args.hits)?,
            spread: match &args.spread {
                Some(s) => Some(throttle_spread(key, s, args)?),
                None => None,
            },
        }),
        None => None,
    };
    let mut template = match (&args.request, &throttle) {
        (_, Some(_)) => Template::new(crate::proto::RateLimitRequest::default()),
        (Some(path), None) => Template::from_file(path)?,
        (None, None) => Template::from_flags(args.domain.as_deref(), &args.descriptors)?,
    };
    if let Some(hits) = args.hits {
        template.set_hits(hits);
    }
    if let (Some(spread), None) = (&args.spread, &throttle) {
        template.set_spread(Spread::parse(spread, args.spread_order)?.starting_at(args.seed))?;
    }
    if let Some(rate) = args.rate {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "--rate must be a positive number"
        );
    }
    anyhow::ensure!(args.connections >= 1, "--connections must be at least 1");
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    Ok(Plan {
        target,
        connections: args.connections,
        concurrency: args.concurrency,
        duration: args.duration.unwrap_or(DEFAULT_DURATION),
        warmup: args.warmup,
        rate: args.rate,
        timeout: args.timeout,
        template,
        throttle,
        seed: args.seed,
        progress: !args.quiet,
    })
}

/// `--spread KEY=N` with `--throttle KEY`: the key must be the throttled one.
fn throttle_spread(key: &str, text: &str, args: &BenchArgs) -> anyhow::Result<Spread> {
    let spread = Spread::parse(text, args.spread_order)?.starting_at(args.seed);
    anyhow::ensure!(
        spread.key == key,
        "--spread {text}: with --throttle {key}, spread the throttled key ({key}=N)"
    );
    Ok(spread)
}

/// The Throttle request of `--throttle KEY --throttle-limit COUNT/PERIOD_MS[/MAX_BURST]`; the
/// default limit (a billion per second) is one no load reaches.
fn throttle_request(
    key: &str,
    limit: Option<&str>,
    hits: Option<u32>,
) -> anyhow::Result<crate::proto::sluice::v1::ThrottleRequest> {
    use crate::proto::sluice::v1::{ThrottleKey, ThrottleRequest, throttle_key::Id};
    let text = limit.unwrap_or("1000000000/1000/1000000000");
    let numbers: Vec<u64> = text
        .split('/')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| {
            anyhow::anyhow!("--throttle-limit {text:?}: expected COUNT/PERIOD_MS[/MAX_BURST]")
        })?;
    let (count, period_ms, max_burst) = match numbers[..] {
        [c, p] => (c, p, 0),
        [c, p, b] => (c, p, b),
        _ => anyhow::bail!("--throttle-limit {text:?}: expected COUNT/PERIOD_MS[/MAX_BURST]"),
    };
    Ok(ThrottleRequest {
        keys: vec![ThrottleKey {
            id: Some(Id::Key(key.to_owned())),
            max_burst: u32::try_from(max_burst).context("--throttle-limit: MAX_BURST too large")?,
            count: u32::try_from(count).context("--throttle-limit: COUNT too large")?,
            period_ms,
            quantity: Some(i64::from(hits.unwrap_or(1))),
            ..Default::default()
        }],
        name: "bench".to_owned(),
    })
}

/// `10s`, `500ms`, `2m`, `1.5s`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (e.g. 10s, 500ms, 1m)"))?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1e3,
        "us" | "µs" => number / 1e6,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        other => return Err(format!("unknown time unit {other:?} in {text:?}")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_limits() {
        let r = throttle_request("k", Some("30/60000/15"), Some(2)).expect("valid");
        let k = &r.keys[0];
        assert_eq!(
            (k.count, k.period_ms, k.max_burst, k.quantity),
            (30, 60_000, 15, Some(2))
        );
        let r = throttle_request("k", Some("10/1000"), None).expect("valid");
        assert_eq!((r.keys[0].max_burst, r.keys[0].quantity), (0, Some(1)));
        assert!(throttle_request("k", Some("10"), None).is_err());
        assert!(throttle_request("k", Some("a/b"), None).is_err());
        assert!(throttle_request("k", Some("1/1/99999999999"), None).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }
}
