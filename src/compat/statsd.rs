//! The statsd sink: every `statsd.flush_interval_ms`, the counters that moved since the last
//! flush are sent as `name:delta|c` lines, and the response times observed as
//! `ratelimit_server.ShouldRateLimit.response_time:<ms>|ms` lines. Tags (`statsd.tags`) go in
//! the name as `.__k=v` (plain statsd, as envoyproxy/ratelimit's statsd library writes them)
//! or after `|#` (DogStatsD).
//!
//! Over UDP (`statsd.protocol = udp`, the default), lines go in datagrams of at most 1432
//! bytes; a send that fails is logged and its counts are not sent again. Over TCP ([`tcp`]),
//! one connection carries newline-terminated lines, reconnected with backoff; lines wait in
//! a bounded buffer while it is down. Either way the request path only bumps counters: all
//! sending happens in this task.

mod tcp;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::stats::{RESPONSE_TIME, RatelimitStats};
use crate::config::settings::{StatsdProtocol, StatsdSettings};

/// The largest datagram sent (fits an Ethernet MTU with room for headers).
const DATAGRAM: usize = 1432;

/// What was sent already, by statsd name, to send deltas.
type Sent = HashMap<String, u64>;

/// Where lines go.
enum Sink {
    Udp { socket: UdpSocket, target: String },
    Tcp(tcp::TcpSender),
}

impl Sink {
    async fn new(settings: &StatsdSettings) -> std::io::Result<Sink> {
        let target = settings.address.trim().to_owned();
        Ok(match settings.protocol {
            StatsdProtocol::Udp => Sink::Udp {
                socket: UdpSocket::bind(("0.0.0.0", 0)).await?,
                target,
            },
            StatsdProtocol::Tcp => Sink::Tcp(tcp::TcpSender::new(target)),
        })
    }

    async fn send(&mut self, lines: &[String], stats: &RatelimitStats) {
        match self {
            Sink::Udp { socket, target } => {
                for datagram in pack(lines) {
                    if let Err(e) = socket.send_to(datagram.as_bytes(), target.as_str()).await {
                        tracing::warn!(target = %target, "statsd: cannot send: {e}");
                        break;
                    }
                }
            }
            Sink::Tcp(sender) => {
                let dropped = sender.send(lines).await;
                if dropped > 0 {
                    stats.count_statsd_dropped(dropped);
                    tracing::warn!(
                        dropped,
                        total = stats.statsd_dropped(),
                        "statsd: lines dropped, the TCP buffer is full while the connection is down"
                    );
                }
            }
        }
    }
}

/// Sends the stats until `stop` (and once more then).
pub async fn run(
    stats: Arc<RatelimitStats>,
    settings: StatsdSettings,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut sink = Sink::new(&settings).await?;
    let suffix = Suffix::new(&settings);
    let mut sent = Sent::default();
    let mut tick = tokio::time::interval(Duration::from_millis(settings.flush_interval_ms.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        let stopping = tokio::select! {
            () = stop.cancelled() => true,
            _ = tick.tick() => false,
        };
        let lines = lines(&stats, &mut sent, &suffix);
        sink.send(&lines, &stats).await;
        if stopping {
            return Ok(());
        }
    }
}

/// How tags are written.
struct Suffix {
    /// Appended to the name (plain statsd).
    name: String,
    /// Appended to the line (DogStatsD).
    line: String,
}

impl Suffix {
    fn new(settings: &StatsdSettings) -> Suffix {
        let tags = settings.tag_pairs();
        if tags.is_empty() {
            return Suffix {
                name: String::new(),
                line: String::new(),
            };
        }
        if settings.dogstatsd {
            let list: Vec<String> = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            Suffix {
                name: String::new(),
                line: format!("|#{}", list.join(",")),
            }
        } else {
            let name: String = tags.iter().map(|(k, v)| format!(".__{k}={v}")).collect();
            Suffix {
                name,
                line: String::new(),
            }
        }
    }

    fn counter(&self, name: &str, delta: u64) -> String {
        format!("{name}{}:{delta}|c{}", self.name, self.line)
    }
}

/// The lines of one flush: counters that moved, then the response times.
fn lines(stats: &RatelimitStats, sent: &mut Sent, suffix: &Suffix) -> Vec<String> {
    let mut out = Vec::new();
    for (name, total) in stats.counters() {
        let delta = total.saturating_sub(sent.get(&name).copied().unwrap_or(0));
        if delta > 0 {
            out.push(suffix.counter(&name, delta));
            sent.insert(name, total);
        }
    }
    for t in stats.take_samples() {
        let ms = t.as_secs_f64() * 1000.0;
        out.push(format!(
            "{RESPONSE_TIME}{}:{ms:.3}|ms{}",
            suffix.name, suffix.line
        ));
    }
    out
}

/// Lines joined by newlines into datagrams of at most [`DATAGRAM`] bytes (a longer line goes
/// alone).
fn pack(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + 1 + line.len() > DATAGRAM {
            out.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(line);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_plain_and_dogstatsd() {
        let mut s = StatsdSettings {
            tags: "env:prod, team:a".into(),
            ..StatsdSettings::default()
        };
        assert_eq!(
            Suffix::new(&s).counter("x.y", 2),
            "x.y.__env=prod.__team=a:2|c"
        );
        s.dogstatsd = true;
        assert_eq!(
            Suffix::new(&s).counter("x.y", 2),
            "x.y:2|c|#env:prod,team:a"
        );
        s.tags.clear();
        assert_eq!(Suffix::new(&s).counter("x.y", 2), "x.y:2|c");
    }

    #[test]
    fn datagrams_stay_under_the_limit() {
        let lines: Vec<String> = (0..200).map(|i| format!("ratelimit.a.b.{i}:1|c")).collect();
        let packed = pack(&lines);
        assert!(packed.len() > 1);
        assert!(packed.iter().all(|d| d.len() <= DATAGRAM));
        let back: Vec<&str> = packed.iter().flat_map(|d| d.split('\n')).collect();
        assert_eq!(back, lines.iter().map(String::as_str).collect::<Vec<_>>());
    }
}
