use super::*;

fn series(m: &Mapper, stat: &str, kind: Kind) -> (String, Vec<(String, String)>) {
    match m.map(stat, kind) {
        Mapping::Series { name, labels, .. } => (name, labels),
        Mapping::Drop => panic!("{stat} dropped"),
    }
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn the_builtin_mapping_names_as_envoy_gateways() {
    let (m, notes) = parse(DEFAULT_YAML, "default").unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    let c = Kind::Counter;
    assert_eq!(
        series(&m, "ratelimit.service.rate_limit.d.k_v.total_hits", c),
        (
            "ratelimit_service_rate_limit_total_hits".into(),
            pairs(&[("domain", "d"), ("key1", "k_v")])
        )
    );
    assert_eq!(
        series(&m, "ratelimit.service.rate_limit.d.a.b.c.over_limit", c),
        (
            "ratelimit_service_rate_limit_over_limit".into(),
            pairs(&[("domain", "d"), ("key1", "a"), ("key2", "b")])
        )
    );
    // The built-in regexes are anchored: a deep key's local-cache stat keeps its own name.
    assert_eq!(
        series(
            &m,
            "ratelimit.service.rate_limit.d.a.b.over_limit_with_local_cache",
            c
        )
        .0,
        "ratelimit_service_rate_limit_d_a_b_over_limit_with_local_cache"
    );
    // A regex as written is not anchored (statsd_exporter's are not): Envoy Gateway's file
    // puts that stat in over_limit.
    let unanchored = "mappings:\n  - match: 'rate_limit\\.([^.]*)\\.([^.]*)\\.([^.]*)(\\..*)?\\.over_limit'\n    match_type: regex\n    name: over\n";
    let (eg, _) = parse(unanchored, "eg.yaml").unwrap();
    assert_eq!(
        series(
            &eg,
            "ratelimit.service.rate_limit.d.a.b.over_limit_with_local_cache",
            c
        )
        .0,
        "over"
    );
    // Unmatched: the default name.
    assert_eq!(
        series(
            &m,
            "ratelimit.service.rate_limit.d.k.over_limit_with_local_cache",
            c
        ),
        (
            "ratelimit_service_rate_limit_d_k_over_limit_with_local_cache".into(),
            vec![]
        )
    );
    assert_eq!(
        series(&m, "ratelimit.service.global_shadow_mode", c).0,
        "ratelimit_service_global_shadow_mode"
    );
    assert_eq!(
        series(
            &m,
            "ratelimit_server.ShouldRateLimit.response_time",
            Kind::Observer
        ),
        (
            "ratelimit_service_response_time_seconds".into(),
            pairs(&[("grpc_method", "ShouldRateLimit")])
        )
    );
    // match_metric_type: a counter rule does not take a timer.
    assert_eq!(
        series(&m, "ratelimit_server.X.total_requests", Kind::Observer).0,
        "ratelimit_server_X_total_requests"
    );
}

#[test]
fn globs_before_regexes_first_match_wins_drop_and_captures() {
    let yaml = "\
mappings:
  - match: 'a\\.(.*)'
    match_type: regex
    name: from_regex
  - match: a.*.c
    name: first_$1
    labels: {x: \"${1}-y\"}
    help: the first
  - match: a.b.*
    name: second
  - match: a.drop.*
    action: drop
";
    let (m, _) = parse(yaml, "m.yaml").unwrap();
    match m.map("a.b.c", Kind::Counter) {
        Mapping::Series { name, labels, help } => {
            assert_eq!(name, "first_b");
            assert_eq!(labels, pairs(&[("x", "b-y")]));
            assert_eq!(help, Some("the first"));
        }
        Mapping::Drop => panic!("dropped"),
    }
    assert_eq!(series(&m, "a.b.d", Kind::Counter).0, "second");
    assert_eq!(m.map("a.drop.x", Kind::Counter), Mapping::Drop);
    // `*` stays within a segment: the glob does not take it, the regex does.
    assert_eq!(series(&m, "a.x.y.c", Kind::Counter).0, "from_regex");
    assert_eq!(series(&m, "other.9", Kind::Counter).0, "other_9");
    assert_eq!(escape("9a.b-c"), "_9a_b_c");
}

#[test]
fn defaults_match_type_applies_to_every_mapping() {
    let yaml = "defaults:\n  match_type: regex\nmappings:\n  - match: '^x\\.(\\d+)$'\n    name: n\n    labels: {i: $1}\n";
    let (m, _) = parse(yaml, "m.yaml").unwrap();
    assert_eq!(series(&m, "x.42", Kind::Counter).1, pairs(&[("i", "42")]));
}

#[test]
fn ignored_keys_are_noted_and_bad_ones_refused_with_file_line_and_key() {
    let yaml = "mappings:\n  - match: a.*\n    name: a\n    ttl: 1m\n    scale: 0.001\n";
    let (_, notes) = parse(yaml, "m.yaml").unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("m.yaml:4: mappings[0].ttl ignored"),
        "{notes:?}"
    );
    for (yaml, want) in [
        (
            "mappings:\n  - match: a.*\n    name: a\n    buckets: [2, 1]\n",
            "m.yaml:4: mappings[0].buckets: buckets must be finite and increase",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    timer_type: gauge\n",
            "m.yaml:4: mappings[0].timer_type: expected histogram or summary",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    observer_type: histogram\n    summary_options: {max_age: 1m}\n",
            "m.yaml:2: mappings[0].summary_options: a histogram takes no summary options",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    observer_type: summary\n    histogram_options: {buckets: [1]}\n",
            "m.yaml:2: mappings[0].histogram_options: a summary takes no histogram options",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    buckets: [1]\n    histogram_options: {buckets: [2]}\n",
            "m.yaml:2: mappings[0].buckets: buckets given both",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    summary_options:\n      quantiles: [{quantile: 1.5, error: 0.1}]\n",
            "m.yaml:5: mappings[0].summary_options.quantiles[0].quantile: 1.5 is not between 0 and 1",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    summary_options: {max_age: soon}\n",
            "m.yaml:4: mappings[0].summary_options.max_age: expected a duration",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    summary_options: {window: 1m}\n",
            "m.yaml:4: mappings[0].summary_options.window: unknown key",
        ),
        (
            "mappings:\n  - match: a.*\n    nmae: a\n",
            "m.yaml:3: mappings[0].nmae: unknown key",
        ),
        (
            "mappings:\n  - name: a\n",
            "m.yaml:2: mappings[0].match: missing",
        ),
        (
            "mappings:\n  - match: a\n    name: a-b\n",
            "m.yaml:3: mappings[0].name: 'a-b' is not",
        ),
        (
            "mappings:\n  - match: '('\n    match_type: regex\n    name: a\n",
            "m.yaml:2: mappings[0].match: regex parse error",
        ),
        (
            "mappings:\n  - match: a\n    name: a\n    labels: {1x: v}\n",
            "m.yaml:4: mappings[0].labels.1x: not a Prometheus label name",
        ),
        (
            "mappings:\n  - match: a\n    name: a\n    action: keep\n",
            "m.yaml:4: mappings[0].action: expected map or drop",
        ),
        (
            "defaults:\n  glob_disable_ordering: maybe\nmappings: []\n",
            "m.yaml:2: defaults.glob_disable_ordering: expected true or false",
        ),
        ("mappings: [\n", "m.yaml:"),
        ("other: 1\n", "m.yaml:1: other: unknown key"),
    ] {
        let err = parse(yaml, "m.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with(want),
            "{yaml}: got `{err}`, want `{want}...`"
        );
    }
}

#[test]
fn envoy_gateways_file_shape_is_accepted() {
    // Double-quoted regexes with escaped backslashes, timer_type on counters,
    // match_metric_type: the constructs of the file Envoy Gateway mounts.
    let yaml = r#"
mappings:
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.over_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels:
      domain: "$1"
      key1: "$2"
      key2: "$3"
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels:
      err_type: "$1"
"#;
    let (m, notes) = parse(yaml, "conf.yaml").unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(
        series(
            &m,
            "ratelimit.service.rate_limit.d.a.b.c.over_limit",
            Kind::Counter
        ),
        (
            "ratelimit_service_rate_limit_over_limit".into(),
            pairs(&[("domain", "d"), ("key1", "a"), ("key2", "b")])
        )
    );
    assert_eq!(
        series(
            &m,
            "ratelimit.service.call.should_rate_limit.redis_error",
            Kind::Counter
        )
        .1,
        pairs(&[("err_type", "redis_error")])
    );
}

/// statsd_exporter 0.26's observer types: a timer is a summary unless its mapping or the
/// defaults say histogram; buckets and quantiles from the mapping, else the defaults, else
/// the built-in ones; the older top-level keys read as the options.
#[test]
fn timers_are_histograms_or_summaries_as_the_file_types_them() {
    let rt = "ratelimit_server.ShouldRateLimit.response_time";
    let observer = |yaml: &str| parse(yaml, "m.yaml").unwrap().0.observer(rt).clone();
    let default_quantiles = vec![0.5, 0.9, 0.99];
    let summary = |quantiles: Vec<f64>, max_age: u64, age_buckets: u32| Observer::Summary {
        quantiles,
        max_age: Duration::from_secs(max_age),
        age_buckets,
    };
    // Untyped, matched or not: a summary of 10 minutes in 5 steps.
    assert_eq!(
        observer("mappings: []\n"),
        summary(default_quantiles.clone(), 600, 5)
    );
    assert_eq!(
        observer("mappings:\n  - match: ratelimit_server.*.response_time\n    name: rt\n"),
        summary(default_quantiles.clone(), 600, 5)
    );
    // Typed histogram: the mapping's buckets, the older key's, the defaults', the built-in.
    let histogram = |yaml: &str| match observer(yaml) {
        Observer::Histogram { buckets } => buckets,
        other => panic!("{yaml}: {other:?}"),
    };
    let m = "mappings:\n  - match: ratelimit_server.*.response_time\n    name: rt\n";
    assert_eq!(
        histogram(&format!("{m}    timer_type: histogram\n")),
        DEFAULT_BUCKETS.to_vec()
    );
    assert_eq!(
        histogram(&format!(
            "{m}    observer_type: histogram\n    histogram_options: {{buckets: [0.001, 0.01, .inf]}}\n"
        )),
        vec![0.001, 0.01]
    );
    assert_eq!(
        histogram(&format!(
            "{m}    timer_type: histogram\n    buckets: [1, 2]\n"
        )),
        vec![1.0, 2.0]
    );
    let defaults = "defaults:\n  observer_type: histogram\n  buckets: [0.5]\n";
    assert_eq!(histogram(&format!("{defaults}{m}")), vec![0.5]);
    assert_eq!(
        parse(&format!("{defaults}mappings: []\n"), "m.yaml")
            .unwrap()
            .0
            .observer(rt),
        &Observer::Histogram { buckets: vec![0.5] },
        "an unmatched timer takes the defaults"
    );
    // observer_type wins over timer_type.
    assert!(matches!(
        observer(&format!(
            "{m}    timer_type: histogram\n    observer_type: summary\n"
        )),
        Observer::Summary { .. }
    ));
    // Typed summary: its options completed by the defaults'.
    let yaml = format!(
        "defaults:\n  summary_options: {{max_age: 30s, age_buckets: 3}}\n{m}    observer_type: summary\n    \
         summary_options:\n      quantiles: [{{quantile: 0.99, error: 0.001}}, {{quantile: 0.5, error: 0.05}}]\n"
    );
    assert_eq!(observer(&yaml), summary(vec![0.5, 0.99], 30, 3));
    // The older top-level quantiles of the defaults replace their summary options whole.
    let yaml = format!(
        "defaults:\n  quantiles: [{{quantile: 0.75, error: 0.01}}]\n  summary_options: {{max_age: 30s}}\n{m}    timer_type: summary\n"
    );
    assert_eq!(observer(&yaml), summary(vec![0.75], 600, 5));
    // Untyped with options of its own: those whole (their zeros as the Go client's).
    let yaml = format!(
        "defaults:\n  summary_options: {{max_age: 30s, age_buckets: 3}}\n{m}    summary_options: {{max_age: 2m}}\n"
    );
    assert_eq!(observer(&yaml), summary(default_quantiles, 120, 5));
}

/// `glob_disable_ordering: true`: the glob whose segments are literal furthest to the left
/// wins, whatever the file order (statsd_exporter's matcher prefers a literal transition to
/// `*` at each segment); without it, the first in file order.
#[test]
fn without_ordering_the_most_literal_glob_wins() {
    let globs = "mappings:\n  - match: a.*.*\n    name: any\n  - match: a.*.c\n    name: star_c\n  \
                 - match: a.b.*\n    name: b_star\n  - match: a.b.*\n    name: b_star_again\n";
    let (ordered, _) = parse(globs, "m.yaml").unwrap();
    let unordered_yaml = format!("defaults:\n  glob_disable_ordering: true\n{globs}");
    let (unordered, _) = parse(&unordered_yaml, "m.yaml").unwrap();
    for (stat, in_order, literal_first) in [
        ("a.b.c", "any", "b_star"),
        ("a.x.c", "any", "star_c"),
        ("a.x.y", "any", "any"),
    ] {
        assert_eq!(series(&ordered, stat, Kind::Counter).0, in_order, "{stat}");
        assert_eq!(
            series(&unordered, stat, Kind::Counter).0,
            literal_first,
            "{stat}"
        );
    }
}
