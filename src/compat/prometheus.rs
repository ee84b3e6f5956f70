//! envoyproxy/ratelimit's stats as Prometheus series, named by a statsd_exporter mapping
//! ([`Mapper`]: the built-in one renders them as Envoy Gateway's statsd-exporter mapping
//! does, so its dashboard and alerts keep working; an operator's file replaces it), in the
//! Prometheus text format (0.0.4). With the built-in mapping:
//!
//! | series | from |
//! |---|---|
//! | `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}{domain,key1}` | a stats key of one rule segment (`<domain>.<key1>`) |
//! | the same with `{domain,key1,key2}` | a stats key of two or more segments (deeper ones summed into their first two, as the mapping does) |
//! | `ratelimit_service_should_rate_limit_error{err_type="redis_error"\|"service_error"}` | backend failures, invalid requests |
//! | `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}` | requests |
//! | `ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"}` | a histogram of the engine's time per request (under an operator's file, a histogram or a summary as its mapping types it: [`crate::compat::mapper::Observer`]) |
//! | `ratelimit_service_config_load_success`, `ratelimit_service_config_load_error` | rules loads (files or xDS) |
//! | default names (dots as `_`): `ratelimit_service_global_shadow_mode`, `ratelimit_service_rate_limit_<domain>_domain_not_found`, `ratelimit_service_rate_limit_<domain>_<key>_over_limit_with_local_cache` | the stats the mapping does not name |
//!
//! Always, whatever the mapping: `process_resident_memory_bytes`, `process_virtual_memory_bytes`
//! (Linux `/proc`) and `go_memstats_gc_cpu_fraction` (always 0: sluice has no garbage
//! collector; kept for the dashboard's panel).
//!
//! Counter names carry no `_total` suffix (statsd_exporter's do not). Every counter is
//! rendered from the first request on, zeros included, except a rule's
//! `over_limit_with_local_cache`, rendered once it counted (it would otherwise add a name
//! per rule under the default naming). Series a mapping gives the same name and labels add
//! up; a series whose name another kind (counter, histogram) already took is left out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::mapper::{Kind, Mapper, Mapping};
use super::stats::{LatencyView, RESPONSE_TIME, RatelimitStats};

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

type Labels = Vec<(String, String)>;

/// One metric name's series.
#[derive(Default)]
struct Family {
    kind: &'static str,
    help: String,
    series: BTreeMap<Labels, u64>,
}

/// Every series.
pub fn render(stats: &RatelimitStats, mapper: &Mapper) -> String {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (stat, n) in stats.counters() {
        if n == 0 && stat.ends_with(".over_limit_with_local_cache") {
            continue;
        }
        let Mapping::Series { name, labels, help } = mapper.map(&stat, Kind::Counter) else {
            continue;
        };
        let family = families.entry(name).or_insert_with(|| Family {
            kind: "counter",
            help: help.map_or_else(|| format!("envoyproxy/ratelimit's {stat}"), str::to_owned),
            series: BTreeMap::new(),
        });
        if family.kind == "counter" {
            *family.series.entry(labels).or_default() += n;
        }
    }
    let mut out = String::new();
    let response_time = mapper.map(RESPONSE_TIME, Kind::Observer);
    for (name, family) in &families {
        head(&mut out, name, family.kind, &family.help);
        for (labels, n) in &family.series {
            line(&mut out, name, labels, &n.to_string());
        }
    }
    if let Mapping::Series { name, labels, help } = response_time
        && !families.contains_key(&name)
    {
        timer(&mut out, stats, &name, &labels, help);
    }
    process(&mut out);
    out
}

/// The response time under `name` and `labels`: a histogram or a summary.
fn timer(
    out: &mut String,
    stats: &RatelimitStats,
    name: &str,
    labels: &Labels,
    help: Option<&str>,
) {
    let help = help.unwrap_or("Time to answer ShouldRateLimit");
    let with = |key: &str, value: String| {
        let mut all = labels.clone();
        all.push((key.to_owned(), value));
        all
    };
    let (sum, count) = match stats.latency() {
        LatencyView::Histogram {
            buckets,
            sum,
            count,
        } => {
            head(out, name, "histogram", help);
            for (le, cumulative) in buckets {
                let le = if le.is_infinite() {
                    "+Inf".to_owned()
                } else {
                    le.to_string()
                };
                let bucket = format!("{name}_bucket");
                line(out, &bucket, &with("le", le), &cumulative.to_string());
            }
            (sum, count)
        }
        LatencyView::Summary {
            quantiles,
            sum,
            count,
        } => {
            head(out, name, "summary", help);
            for (q, value) in quantiles {
                line(out, name, &with("quantile", q.to_string()), &number(value));
            }
            (sum, count)
        }
    };
    line(out, &format!("{name}_sum"), labels, &sum.to_string());
    line(out, &format!("{name}_count"), labels, &count.to_string());
}

/// A sample value as the text format writes it (`NaN` included).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else {
        v.to_string()
    }
}

/// The process's series (not stats, so not mapped).
fn process(out: &mut String) {
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
            head(out, m, "gauge", help);
            line(out, m, &[], &v.to_string());
        }
    }
    let m = "go_memstats_gc_cpu_fraction";
    head(
        out,
        m,
        "gauge",
        "Always 0: sluice has no garbage collector (kept for dashboards built for envoyproxy/ratelimit)",
    );
    line(out, m, &[], "0");
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn line(out: &mut String, name: &str, labels: &[(String, String)], value: &str) {
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
    use crate::engine::{DescriptorReport, Observer};
    use crate::rules::Entry;

    #[test]
    fn the_mapper_names_the_series_and_unmapped_stats_keep_default_names() {
        let stats = RatelimitStats::new(0.8, 10);
        let entries = [Entry::new("a", "x"), Entry::new("b", "y")];
        let report = DescriptorReport {
            local_cache: true,
            ..DescriptorReport::denied("d", &entries)
        };
        stats.descriptor(&report);
        stats.unknown_domain("nowhere", 2);
        stats.global_shadow();
        let text = render(&stats, &Mapper::builtin());
        for want in [
            "ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"a_x\",key2=\"b_y\"} 1\n",
            "ratelimit_service_rate_limit_d_a_x_b_y_over_limit_with_local_cache 1\n",
            "ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"a_x\",key2=\"b_y\"} 1\n",
            "ratelimit_service_rate_limit_nowhere_domain_not_found 2\n",
            "ratelimit_service_global_shadow_mode 1\n",
            "# TYPE ratelimit_service_response_time_seconds histogram\n",
            "go_memstats_gc_cpu_fraction 0\n",
        ] {
            assert!(text.contains(want), "no `{want}` in:\n{text}");
        }
        let yaml = "mappings:\n  - match: ratelimit.service.rate_limit.*.*.*.*\n    name: rl_$4\n    labels: {d: $1}\n    help: mine\n  \
                    - match: ratelimit.service.*\n    action: drop\n";
        let (custom, _) = crate::compat::mapper::parse(yaml, "m.yaml").unwrap();
        let text = render(&stats, &custom);
        assert!(text.contains("# HELP rl_over_limit mine\n"), "{text}");
        assert!(text.contains("rl_over_limit{d=\"d\"} 1\n"), "{text}");
        assert!(
            text.contains("rl_over_limit_with_local_cache{d=\"d\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("global_shadow_mode"), "dropped: {text}");
        assert!(
            text.contains("ratelimit_server_ShouldRateLimit_total_requests 0\n"),
            "{text}"
        );
    }

    #[test]
    fn the_response_time_is_a_histogram_with_the_files_buckets_or_a_summary() {
        use crate::engine::RequestResult;
        use std::time::Duration;
        let rt = "  - match: ratelimit_server.*.response_time\n    name: rt\n    labels: {m: $1}\n";
        let stats = RatelimitStats::new(0.8, 10);
        let observe = |stats: &RatelimitStats, ms: u64| {
            stats.request(RequestResult::Ok, Duration::from_millis(ms));
        };
        let yaml = format!(
            "mappings:\n{rt}    observer_type: histogram\n    histogram_options: {{buckets: [0.002, 0.02]}}\n"
        );
        let (mapper, _) = crate::compat::mapper::parse(&yaml, "m.yaml").unwrap();
        stats.observe_as(mapper.observer(RESPONSE_TIME));
        for ms in [1, 10, 100] {
            observe(&stats, ms);
        }
        let text = render(&stats, &mapper);
        for want in [
            "# TYPE rt histogram\n",
            "rt_bucket{m=\"ShouldRateLimit\",le=\"0.002\"} 1\n",
            "rt_bucket{m=\"ShouldRateLimit\",le=\"0.02\"} 2\n",
            "rt_bucket{m=\"ShouldRateLimit\",le=\"+Inf\"} 3\n",
            "rt_count{m=\"ShouldRateLimit\"} 3\n",
        ] {
            assert!(text.contains(want), "no `{want}` in:\n{text}");
        }
        // Untyped: a summary; its quantiles NaN until something is observed.
        let (mapper, _) =
            crate::compat::mapper::parse(&format!("mappings:\n{rt}"), "m.yaml").unwrap();
        stats.observe_as(mapper.observer(RESPONSE_TIME));
        let text = render(&stats, &mapper);
        assert!(text.contains("# TYPE rt summary\n"), "{text}");
        assert!(
            text.contains("rt{m=\"ShouldRateLimit\",quantile=\"0.5\"} NaN\n"),
            "{text}"
        );
        for ms in 1..=100 {
            observe(&stats, ms);
        }
        let text = render(&stats, &mapper);
        let value = |q: &str| -> f64 {
            let prefix = format!("rt{{m=\"ShouldRateLimit\",quantile=\"{q}\"}} ");
            let line = text.lines().find_map(|l| l.strip_prefix(&prefix));
            line.and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no quantile {q} in:\n{text}"))
        };
        for (q, ms) in [("0.5", 50.0), ("0.9", 90.0), ("0.99", 99.0)] {
            let v = value(q);
            assert!((v - ms / 1000.0).abs() <= ms / 1000.0 * 0.002, "{q}: {v}");
        }
        assert!(
            text.contains("rt_count{m=\"ShouldRateLimit\"} 100\n"),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        line(&mut out, "m", &[("k".into(), "a\"b\\c".into())], "1");
        assert_eq!(out, "m{k=\"a\\\"b\\\\c\"} 1\n");
    }
}
