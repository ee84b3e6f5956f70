//! Stats (statsd, DogStatsD, Prometheus) and tracing.

use super::server::{ip, resolve};
use super::{Reader, Unsupported};

impl Reader<'_> {
    pub(super) fn stats(&mut self) -> Result<(), Unsupported> {
        if self.flag("DISABLE_STATS", false)? {
            return Ok(());
        }
        let statsd = self.flag("USE_STATSD", true)?;
        let dog = self.flag("USE_DOG_STATSD", false)?;
        let prometheus = self.flag("USE_PROMETHEUS", false)?;
        if [statsd, dog, prometheus].iter().filter(|on| **on).count() > 1 {
            let name = if prometheus {
                "USE_PROMETHEUS"
            } else {
                "USE_DOG_STATSD"
            };
            return Err(self.unsupported(
                name,
                "only one of USE_STATSD (on by default), USE_DOG_STATSD and USE_PROMETHEUS may be on, as in envoyproxy/ratelimit",
            ));
        }
        if statsd || dog {
            if dog {
                self.mogrifiers()?;
            } else if let Some(v) = self.get("USE_DOG_STATSD_MOGRIFIERS") {
                let why =
                    format!("{v}: mogrifiers rewrite DogStatsD names only (USE_DOG_STATSD is off)");
                self.out
                    .ignored
                    .push(("USE_DOG_STATSD_MOGRIFIERS".to_owned(), why));
            }
            let host = self.or("STATSD_HOST", "localhost").to_owned();
            let port = self.or("STATSD_PORT", "8125").to_owned();
            self.set("STATSD__ADDRESS", format!("{host}:{port}"));
            if dog {
                self.set("STATSD__DOGSTATSD", "true");
            } else {
                // envoyproxy/ratelimit's plain statsd sink speaks TCP; DogStatsD, UDP.
                self.set("STATSD__PROTOCOL", "tcp");
            }
            if let Some(tags) = self.get("EXTRA_TAGS").map(str::to_owned) {
                self.set("STATSD__TAGS", tags);
            }
            if let Some(ms) = self.duration_ms("STATS_FLUSH_INTERVAL")? {
                self.set("STATSD__FLUSH_INTERVAL_MS", ms.max(1).to_string());
            }
        }
        if prometheus {
            let addr = self.or("PROMETHEUS_ADDR", ":9090").to_owned();
            let (host, port) = addr
                .rsplit_once(':')
                .ok_or_else(|| self.unsupported("PROMETHEUS_ADDR", "expected [host]:port"))?;
            let host = if host.is_empty() { "0.0.0.0" } else { host };
            let listen = ip(host)
                .or_else(|| resolve(host))
                .zip(port.parse::<u16>().ok())
                .map(|(ip, port)| std::net::SocketAddr::new(ip, port).to_string())
                .ok_or_else(|| {
                    self.unsupported(
                        "PROMETHEUS_ADDR",
                        "expected [host]:port, the host resolving",
                    )
                })?;
            self.set("RATELIMIT_METRICS__LISTEN", listen);
            if let Some(path) = self.get("PROMETHEUS_PATH").map(str::to_owned) {
                self.set("RATELIMIT_METRICS__PATH", path);
            }
            if let Some(file) = self.get("PROMETHEUS_MAPPER_YAML").map(str::to_owned) {
                self.set("RATELIMIT_METRICS__MAPPER_FILE", file);
            }
        } else if let Some(file) = self.env.get("PROMETHEUS_MAPPER_YAML") {
            self.out.ignored.push((
                "PROMETHEUS_MAPPER_YAML".to_owned(),
                format!("{file}: USE_PROMETHEUS is off"),
            ));
        }
        Ok(())
    }

    /// `TRACING_ENABLED`, `TRACING_EXPORTER_PROTOCOL` (http by default) and the collector
    /// as that project's OpenTelemetry exporters read it: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// as given, else `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces` added over HTTP), else
    /// the local collector.
    /// `USE_DOG_STATSD_MOGRIFIERS=A,B`: each key's `DOG_STATSD_MOGRIFIER_<KEY>_PATTERN`,
    /// `_NAME` and `_TAGS` (the key upper-cased; a variable unset falls back to the bare
    /// `PATTERN`, `NAME` or `TAGS`, as envoyproxy/ratelimit's envconfig reads them), as
    /// `statsd.mogrifiers` in a JSON string.
    fn mogrifiers(&mut self) -> Result<(), Unsupported> {
        let Some(keys) = self.get("USE_DOG_STATSD_MOGRIFIERS").map(str::to_owned) else {
            return Ok(());
        };
        let mut list = Vec::new();
        for key in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            let key = key.to_ascii_uppercase();
            let var = |part: &str| format!("DOG_STATSD_MOGRIFIER_{key}_{part}");
            let read = |part: &str| {
                self.env
                    .get(&var(part))
                    .or_else(|| self.env.get(part))
                    .cloned()
                    .unwrap_or_default()
            };
            let m = crate::config::settings::Mogrifier {
                id: key.clone(),
                pattern: read("PATTERN"),
                name: read("NAME"),
                tags: read("TAGS"),
            };
            for (part, value) in [("PATTERN", &m.pattern), ("NAME", &m.name)] {
                if value.is_empty() {
                    let why = format!("mogrifier {key} needs {}", var(part));
                    return Err(self.unsupported("USE_DOG_STATSD_MOGRIFIERS", &why));
                }
            }
            if let Err(e) = regex::Regex::new(&m.pattern) {
                return Err(self.unsupported(&var("PATTERN"), &format!("not a valid pattern: {e}")));
            }
            if let Err(e) = m.tag_pairs() {
                return Err(self.unsupported(&var("TAGS"), &e));
            }
            list.push(m);
        }
        if !list.is_empty() {
            let json = serde_json::to_string(&list).unwrap_or_default();
            self.set("STATSD__MOGRIFIERS", json);
        }
        Ok(())
    }

    pub(super) fn tracing(&mut self) -> Result<(), Unsupported> {
        let ratio = self.sampling_rate()?;
        if !self.flag("TRACING_ENABLED", false)? {
            for name in TRACING_NAMES.iter().chain(&["TRACING_SAMPLING_RATE"]) {
                if let Some(v) = self.get(name) {
                    let why = format!("{v}: no spans are exported (TRACING_ENABLED is not true)");
                    self.out.ignored.push(((*name).to_owned(), why));
                }
            }
            return Ok(());
        }
        // ratelimit's default name, so that traces keep the service they were filed under.
        let service = self.or("TRACING_SERVICE_NAME", "RateLimit").to_owned();
        self.set("LOG__OTLP_SERVICE_NAME", service);
        for (name, key) in [
            ("TRACING_SERVICE_NAMESPACE", "LOG__OTLP_SERVICE_NAMESPACE"),
            (
                "TRACING_SERVICE_INSTANCE_ID",
                "LOG__OTLP_SERVICE_INSTANCE_ID",
            ),
        ] {
            if let Some(v) = self.get(name) {
                let v = v.to_owned();
                self.set(key, v);
            }
        }
        self.set("LOG__OTLP_SAMPLING_RATIO", ratio.to_string());
        let protocol = self
            .or("TRACING_EXPORTER_PROTOCOL", "http")
            .to_ascii_lowercase();
        let http = match protocol.as_str() {
            "http" => true,
            "grpc" => false,
            _ => return Err(self.unsupported("TRACING_EXPORTER_PROTOCOL", "expected http or grpc")),
        };
        let endpoint = match (
            self.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            self.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(traces), _) => with_scheme(traces),
            (None, Some(base)) if http => {
                format!("{}/v1/traces", with_scheme(base).trim_end_matches('/'))
            }
            (None, Some(base)) => with_scheme(base),
            (None, None) if http => "http://localhost:4318/v1/traces".to_owned(),
            (None, None) => "http://localhost:4317".to_owned(),
        };
        self.set("LOG__OTLP_ENDPOINT", endpoint);
        self.set("LOG__OTLP_PROTOCOL", if http { "http" } else { "grpc" });
        Ok(())
    }
}

/// The service-naming variables of tracing, listed as ignored when tracing is off.
const TRACING_NAMES: [&str; 3] = [
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
];

impl Reader<'_> {
    /// `TRACING_SAMPLING_RATE` (default 1) as ratelimit applies it: a number, where 1 and
    /// above keep every trace and 0 and below none. Not a number (or NaN) is refused.
    fn sampling_rate(&self) -> Result<f64, Unsupported> {
        let Some(text) = self.get("TRACING_SAMPLING_RATE") else {
            return Ok(1.0);
        };
        match text.trim().parse::<f64>() {
            Ok(rate) if !rate.is_nan() => Ok(rate.clamp(0.0, 1.0)),
            _ => Err(self.unsupported(
                "TRACING_SAMPLING_RATE",
                "expected a number from 0 to 1, such as 0.1",
            )),
        }
    }
}

/// `endpoint` with `http://` in front when it names no scheme (`collector:4318`).
fn with_scheme(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}
