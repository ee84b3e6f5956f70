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
fn ignored_keys_are_noted_and_unsupported_ones_refused_with_file_line_and_key() {
    let yaml = "mappings:\n  - match: a.*\n    name: a\n    ttl: 1m\n    scale: 0.001\n";
    let (_, notes) = parse(yaml, "m.yaml").unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("m.yaml:4: mappings[0].ttl ignored"),
        "{notes:?}"
    );
    for (yaml, want) in [
        (
            "mappings:\n  - match: a.*\n    name: a\n    buckets: [1, 2]\n",
            "m.yaml:4: mappings[0].buckets: not supported",
        ),
        (
            "mappings:\n  - match: a.*\n    name: a\n    timer_type: summary\n",
            "m.yaml:4: mappings[0].timer_type: not supported",
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
            "defaults:\n  glob_disable_ordering: true\nmappings: []\n",
            "m.yaml:2: defaults.glob_disable_ordering: not supported",
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
