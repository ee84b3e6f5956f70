//! envoyproxy/ratelimit's stats as Prometheus series named as Envoy Gateway's
//! statsd-exporter mapping renders them, in the Prometheus text format (0.0.4), so its
//! dashboard and alerts keep working:
//!
//! | series | from |
//! |---|---|
//! | `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}{domain,key1}` | a stats key of one rule segment (`<domain>.<key1>`) |
//! | the same with `{domain,key1,key2}` | a stats key of two or more segments (deeper ones summed into their first two, as the mapping does) |
//! | `ratelimit_service_should_rate_limit_error{err_type="redis_error"\|"service_error"}` | backend failures, invalid requests |
//! | `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}` | requests |
//! | `ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"}` | a histogram of the engine's time per request |
//! | `ratelimit_service_config_load_success`, `ratelimit_service_config_load_error` | rules loads (files or xDS) |
//! | `process_resident_memory_bytes`, `process_virtual_memory_bytes` | the process (Linux `/proc`) |
//! | `go_memstats_gc_cpu_fraction` | always 0: sluice has no garbage collector; kept for the dashboard's panel |
//!
//! Counter names carry no `_total` suffix (statsd_exporter's do not).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::stats::{LATENCY_BUCKETS, RULE_STATS, RatelimitStats};

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every series.
pub fn render(stats: &RatelimitStats) -> String {
    let mut out = String::new();
    let mut per_stat: [BTreeMap<Vec<(&'static str, String)>, u64>; 5] = Default::default();
    let rules = stats.rules();
    for (key, counts) in &rules {
        let labels = labels(key);
        for (i, n) in counts.iter().enumerate() {
            *per_stat[i].entry(labels.clone()).or_default() += n;
        }
    }
    for (name, series) in RULE_STATS.iter().zip(&per_stat) {
        let metric = format!("ratelimit_service_rate_limit_{name}");
        head(
            &mut out,
            &metric,
            "counter",
            &format!("envoyproxy/ratelimit's {name}, per domain and first two descriptor keys"),
        );
        for (labels, n) in series {
            line(&mut out, &metric, labels, &n.to_string());
        }
    }
    let service = stats.service();
    let m = "ratelimit_service_should_rate_limit_error";
    head(&mut out, m, "counter", "ShouldRateLimit errors by type");
    line(
        &mut out,
        m,
        &[("err_type", "redis_error".into())],
        &service[2].to_string(),
    );
    line(
        &mut out,
        m,
        &[("err_type", "service_error".into())],
        &service[3].to_string(),
    );
    let method = [("grpc_method", "ShouldRateLimit".to_owned())];
    let m = "ratelimit_service_total_requests";
    head(&mut out, m, "counter", "ShouldRateLimit requests");
    line(&mut out, m, &method, &service[4].to_string());
    let m = "ratelimit_service_response_time_seconds";
    head(&mut out, m, "histogram", "Time to answer ShouldRateLimit");
    let (buckets, sum, count) = stats.latency();
    let mut cumulative = 0;
    for (i, n) in buckets.iter().enumerate() {
        cumulative += n;
        let le = LATENCY_BUCKETS
            .get(i)
            .map_or("+Inf".to_owned(), |b| b.to_string());
        let labels = [method[0].clone(), ("le", le)];
        line(
            &mut out,
            &format!("{m}_bucket"),
            &labels,
            &cumulative.to_string(),
        );
    }
    line(&mut out, &format!("{m}_sum"), &method, &sum.to_string());
    line(&mut out, &format!("{m}_count"), &method, &count.to_string());
    for (m, i, help) in [
        (
            "ratelimit_service_config_load_success",
            0,
            "Rules loads that succeeded",
        ),
        (
            "ratelimit_service_config_load_error",
            1,
            "Rules loads that failed",
        ),
    ] {
        head(&mut out, m, "counter", help);
        line(&mut out, m, &[], &service[i].to_string());
    }
    let (rss, vsz) = process_memory();
    for (m, v, help) in [
        (
            "process_resident_memory_bytes",
            rss,
            "Resident memory size in bytes",
        ),
        (
            "process_virtual_memory_bytes",
            vsz,
            "Virtual memory size in bytes",
        ),
    ] {
        if let Some(v) = v {
            head(&mut out, m, "gauge", help);
            line(&mut out, m, &[], &v.to_string());
        }
    }
    let m = "go_memstats_gc_cpu_fraction";
    head(
        &mut out,
        m,
        "gauge",
        "Always 0: sluice has no garbage collector (kept for dashboards built for envoyproxy/ratelimit)",
    );
    line(&mut out, m, &[], "0");
    out
}

/// `domain`, `key1` and (for two segments or more) `key2` of a stats key, split on dots as
/// the mapping's patterns do.
fn labels(key: &str) -> Vec<(&'static str, String)> {
    let mut parts = key.split('.');
    let mut labels = vec![("domain", parts.next().unwrap_or_default().to_owned())];
    if let Some(k1) = parts.next() {
        labels.push(("key1", k1.to_owned()));
    }
    if let Some(k2) = parts.next() {
        labels.push(("key2", k2.to_owned()));
    }
    labels
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn line(out: &mut String, name: &str, labels: &[(&'static str, String)], value: &str) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Resident and virtual memory, in bytes, from `/proc/self/status` (Linux; `None` elsewhere).
fn process_memory() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (None, None);
    };
    let field = |name: &str| {
        status.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.trim().strip_suffix("kB")?;
            rest.trim().parse::<u64>().ok().map(|kb| kb * 1024)
        })
    };
    (field("VmRSS:"), field("VmSize:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_into_domain_key1_key2_as_the_mapping_does() {
        assert_eq!(
            labels("d.k"),
            vec![("domain", "d".into()), ("key1", "k".into())]
        );
        assert_eq!(
            labels("d.a_b.c.e"),
            vec![
                ("domain", "d".into()),
                ("key1", "a_b".into()),
                ("key2", "c".into())
            ]
        );
        let mut out = String::new();
        line(&mut out, "m", &[("k", "a\"b\\c".into())], "1");
        assert_eq!(out, "m{k=\"a\\\"b\\\\c\"} 1\n");
    }
}
