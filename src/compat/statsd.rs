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
//!
//! With DogStatsD, `statsd.mogrifiers` rewrite names as envoyproxy/ratelimit's
//! `USE_DOG_STATSD_MOGRIFIERS` does ([`Mogrifiers`]): the first whose pattern matches a
//! name gives the name sent and tags added after `statsd.tags`.

mod tcp;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::stats::{RESPONSE_TIME, RatelimitStats};
use crate::config::settings::{StatsdProtocol, StatsdSettings};

/// `statsd.mogrifiers`, compiled: for each, its pattern, its name template and its tags'
/// (key, value template) pairs, tried in order.
pub(crate) struct Mogrifiers(Vec<Compiled>);

/// One mogrifier: its pattern, its name template, its tags' (key, value template) pairs.
type Compiled = (regex::Regex, String, Vec<(String, String)>);

impl Mogrifiers {
    /// Compiles them; an error names the setting and what is wrong.
    pub(crate) fn new(settings: &StatsdSettings) -> Result<Mogrifiers, String> {
        let mut out = Vec::new();
        for (i, m) in settings.mogrifiers.iter().enumerate() {
            let at = format!("statsd.mogrifiers[{i}] ({})", m.id);
            let re = regex::Regex::new(&m.pattern)
                .map_err(|e| format!("{at}: pattern {:?}: {e}", m.pattern))?;
            let tags = m.tag_pairs().map_err(|e| format!("{at}: tags: {e}"))?;
            out.push((re, m.name.clone(), tags));
        }
        Ok(Mogrifiers(out))
    }

    /// The name to send and the tags to add, from the first mogrifier matching `name`; none
    /// matching, `name` as it is and no tags.
    fn apply<'a>(&self, name: &'a str) -> (std::borrow::Cow<'a, str>, Vec<String>) {
        for (re, template, tags) in &self.0 {
            let Some(caps) = re.captures(name) else {
                continue;
            };
            let groups: Vec<&str> = caps.iter().map(|g| g.map_or("", |g| g.as_str())).collect();
            let tags = tags
                .iter()
                .map(|(k, v)| format!("{k}:{}", substitute(v, &groups)))
                .collect();
            return (substitute(template, &groups).into(), tags);
        }
        (name.into(), Vec::new())
    }
}

/// `template` with each `$N` (a `$` and the digits after it) replaced by group N; a group
/// beyond `groups` leaves the `$N` as written.
fn substitute(template: &str, groups: &[&str]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let group = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| groups.get(n));
        match group {
            Some(g) => out.push_str(g),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

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
    let suffix = Suffix::new(&settings).map_err(std::io::Error::other)?;
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
    /// DogStatsD only: `statsd.tags` as `k:v`, and the mogrifiers (none: `line` says it all).
    dog: Option<(Vec<String>, Mogrifiers)>,
}

impl Suffix {
    fn new(settings: &StatsdSettings) -> Result<Suffix, String> {
        let tags = settings.tag_pairs();
        let mogrifiers = Mogrifiers::new(settings)?;
        let dog = (settings.dogstatsd && !mogrifiers.0.is_empty()).then(|| {
            let list = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            (list, mogrifiers)
        });
        if tags.is_empty() {
            return Ok(Suffix {
                name: String::new(),
                line: String::new(),
                dog,
            });
        }
        Ok(if settings.dogstatsd {
            let list: Vec<String> = tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            Suffix {
                name: String::new(),
                line: format!("|#{}", list.join(",")),
                dog,
            }
        } else {
            let name: String = tags.iter().map(|(k, v)| format!(".__{k}={v}")).collect();
            Suffix {
                name,
                line: String::new(),
                dog,
            }
        })
    }

    /// `name:value|kind` with the tags.
    fn line(&self, name: &str, value: &str, kind: &str) -> String {
        match &self.dog {
            Some((tags, mogrifiers)) => {
                let (name, added) = mogrifiers.apply(name);
                let all: Vec<&str> = tags.iter().chain(&added).map(String::as_str).collect();
                if all.is_empty() {
                    format!("{name}:{value}|{kind}")
                } else {
                    format!("{name}:{value}|{kind}|#{}", all.join(","))
                }
            }
            None => format!("{name}{}:{value}|{kind}{}", self.name, self.line),
        }
    }

    fn counter(&self, name: &str, delta: u64) -> String {
        self.line(name, &delta.to_string(), "c")
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
        out.push(suffix.line(RESPONSE_TIME, &format!("{ms:.3}"), "ms"));
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
        let counter = |s: &StatsdSettings| Suffix::new(s).unwrap().counter("x.y", 2);
        assert_eq!(counter(&s), "x.y.__env=prod.__team=a:2|c");
        s.dogstatsd = true;
        assert_eq!(counter(&s), "x.y:2|c|#env:prod,team:a");
        s.tags.clear();
        assert_eq!(counter(&s), "x.y:2|c");
    }

    #[test]
    fn mogrifiers_rewrite_the_first_match_with_its_groups() {
        use crate::config::settings::Mogrifier;
        let m = |id: &str, pattern: &str, name: &str, tags: &str| Mogrifier {
            id: id.into(),
            pattern: pattern.into(),
            name: name.into(),
            tags: tags.into(),
        };
        let s = StatsdSettings {
            dogstatsd: true,
            tags: "env:prod".into(),
            mogrifiers: vec![
                m(
                    "HITS",
                    r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
                    "ratelimit.service.rate_limit.$3",
                    "domain:$1,descriptor:$2",
                ),
                m(
                    "ANY",
                    r"service\.(x)?(\w+)",
                    "s.$2.$9$",
                    "whole:$0,opt:<$1>",
                ),
            ],
            ..StatsdSettings::default()
        };
        let suffix = Suffix::new(&s).unwrap();
        assert_eq!(
            suffix.counter("ratelimit.service.rate_limit.api.path_/a.total_hits", 3),
            "ratelimit.service.rate_limit.total_hits:3|c|#env:prod,domain:api,descriptor:path_/a"
        );
        assert_eq!(
            suffix.counter("ratelimit.service.config_load_success", 1),
            "s.config_load_success.$9$:1|c|#env:prod,whole:service.config_load_success,opt:<>"
        );
        assert_eq!(suffix.counter("other", 1), "other:1|c|#env:prod");
        let bad = StatsdSettings {
            mogrifiers: vec![m("BAD", "(", "n", "")],
            ..s
        };
        let e = Suffix::new(&bad).err().unwrap();
        assert!(
            e.starts_with("statsd.mogrifiers[0] (BAD): pattern \"(\""),
            "{e}"
        );
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
