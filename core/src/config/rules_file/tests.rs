//! Unit tests of the loader: the embedded rules, the model it builds, and robustness against
//! hostile input (no input may panic or exhaust the stack).

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;
use crate::config::model::{Policy, Unit, ValueMatch};

/// Loads one text as file `t.yaml`, returning the model or the error lines.
fn load(text: &str) -> Result<RulesModel, Vec<String>> {
    from_sources(&[(PathBuf::from("t.yaml"), text.to_owned())])
        .map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

fn errors(text: &str) -> Vec<String> {
    load(text).expect_err("expected errors")
}

#[test]
fn embedded_rules_load() {
    let model = from_sources(&[(PathBuf::from(EMBEDDED_NAME), EMBEDDED_RULES.to_owned())])
        .unwrap_or_else(|e| panic!("embedded rules are invalid:\n{e}"));
    assert_eq!(model.domains.len(), 1);
    assert_eq!(model.domains[0].domain, "demo");
    assert!(!model.domains[0].descriptors.is_empty());
}

#[test]
fn embedded_rules_load_whatever_the_default_algorithm() {
    for default_algorithm in crate::config::model::Algorithm::ALL {
        let options = LoadOptions {
            default_algorithm,
            ..LoadOptions::default()
        };
        let sources = [(PathBuf::from(EMBEDDED_NAME), EMBEDDED_RULES.to_owned())];
        if let Err(e) = from_sources_with(&sources, options) {
            panic!("embedded rules are invalid with {default_algorithm:?}:\n{e}");
        }
    }
}

#[test]
fn a_limit_without_algorithm_takes_the_default() {
    use crate::config::model::Algorithm;
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: minute, requests_per_unit: 1, algorithm: funnel}\n";
    let options = LoadOptions {
        default_algorithm: Algorithm::TokenBucket,
        ..LoadOptions::default()
    };
    let model = from_sources_with(&[(PathBuf::from("t.yaml"), text.to_owned())], options)
        .unwrap_or_else(|e| panic!("{e}"));
    let Policy::Limited(limits) = &model.domains[0].descriptors[0].policy else {
        panic!("limited");
    };
    let algorithms: Vec<Algorithm> = limits.iter().map(|l| l.algorithm).collect();
    assert_eq!(algorithms, [Algorithm::TokenBucket, Algorithm::Funnel]);
}

#[test]
fn burst_on_a_default_window_names_the_setting() {
    use crate::config::model::Algorithm;
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2, borrow: true}\n";
    let options = LoadOptions {
        default_algorithm: Algorithm::FixedWindow,
        ..LoadOptions::default()
    };
    let errors = from_sources_with(&[(PathBuf::from("t.yaml"), text.to_owned())], options)
        .expect_err("burst on a window");
    let lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "t.yaml:4: descriptors[0].rate_limit.burst: burst only applies to funnel and token_bucket; this limit's algorithm is fixed_window (limits.default_algorithm)",
            "t.yaml:4: descriptors[0].rate_limit.borrow: borrow only applies to funnel and token_bucket, whose debt is paid back at their rate (a window forgets it when the window passes); this limit's algorithm is fixed_window (limits.default_algorithm)",
        ]
    );
}

#[test]
fn builds_the_model() {
    let model = load("domain: d\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n    rate_limit: {unit: Minute, requests_per_unit: 3}\n").unwrap();
    let domain = &model.domains[0];
    assert_eq!(domain.location.line, 1);
    let rule = &domain.descriptors[0];
    assert_eq!(rule.location.line, 3);
    assert_eq!(rule.value, ValueMatch::Wildcard("a*".into()));
    assert!(rule.share_threshold);
    let Policy::Limited(limits) = &rule.policy else {
        panic!("expected limits, got {:?}", rule.policy)
    };
    assert_eq!(limits[0].unit, Unit::Minute);
    assert_eq!((limits[0].requests_per_unit, limits[0].burst), (3, 3));
}

#[test]
fn scalars_are_taken_as_written() {
    let model = load(
        "domain: 0x1F\ndescriptors:\n  - {key: 12, value: 1.10}\n  - {key: true, value: ''}\n",
    )
    .unwrap();
    let domain = &model.domains[0];
    assert_eq!(domain.domain, "0x1F");
    assert_eq!(domain.descriptors[0].key, "12");
    assert_eq!(
        domain.descriptors[0].value,
        ValueMatch::Exact("1.10".into())
    );
    assert_eq!(domain.descriptors[1].key, "true");
    assert_eq!(domain.descriptors[1].value, ValueMatch::Any);
}

#[test]
fn scalars_are_found_in_non_ascii_text() {
    // Parser markers count characters, not bytes; 70 two-byte characters cross a checkpoint.
    let text = format!(
        "# {}\ndomain: d\ndescriptors:\n  - {{key: é, value: 0x1F}}\n",
        "é".repeat(70)
    );
    let model = load(&text).unwrap();
    let rule = &model.domains[0].descriptors[0];
    assert_eq!(rule.key, "é");
    assert_eq!(rule.value, ValueMatch::Exact("0x1F".into()));
}

#[test]
fn metadata_keys_must_differ_as_text() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    metadata: {1: a, \"1\": b}\n";
    assert_eq!(
        errors(text),
        ["t.yaml:4: descriptors[0].metadata: duplicate key '1'"]
    );
}

#[test]
fn aliases_are_expanded() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &l {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: *l\n";
    let model = load(text).unwrap();
    assert_eq!(
        model.domains[0].descriptors[1].policy,
        model.domains[0].descriptors[0].policy
    );
}

#[test]
fn empty_input_is_an_empty_model() {
    for text in ["", "\n", "# nothing\n", "---\n---\n", "~\n"] {
        assert!(load(text).unwrap().domains.is_empty(), "{text:?}");
    }
    assert!(load_paths(&[]).unwrap().domains.is_empty());
}

#[test]
fn errors_are_sorted_by_line_and_all_reported() {
    let text = "domain: d\nextra: 1\ndescriptors:\n  - key: a\n    rate_limit: {unit: parsec}\n  - value: x\n";
    assert_eq!(
        errors(text),
        [
            "t.yaml:2: unknown key 'extra'",
            "t.yaml:5: descriptors[0].rate_limit.unit: unknown unit 'parsec'",
            "t.yaml:6: descriptors[1]: missing key",
        ]
    );
}

#[test]
fn a_bad_limit_does_not_hide_the_list_checks() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: parsec}\n      - {unlimited: true}\n";
    assert_eq!(
        errors(text),
        [
            "t.yaml:5: descriptors[0].rate_limits[0].unit: unknown unit 'parsec'",
            "t.yaml:6: descriptors[0].rate_limits[1].unlimited: an unlimited limit must be the only limit of its descriptor",
        ]
    );
}

#[test]
fn parse_file_reports_its_own_duplicates() {
    let err = parse_file(Path::new("a.yaml"), "domain: x\n---\ndomain: x\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "a.yaml:3: domain: duplicate domain 'x' (first defined at a.yaml:1)"
    );
}

/// Two files of domain `d` under `rules.merge_domains`.
fn merged(a: &str, b: &str) -> Result<RulesModel, Vec<String>> {
    let options = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let sources = [
        (PathBuf::from("a.yaml"), a.to_owned()),
        (PathBuf::from("b.yaml"), b.to_owned()),
    ];
    from_sources_with(&sources, options).map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

#[test]
fn merge_domains_joins_the_descriptors_of_one_domain_across_files() {
    let a = "domain: d\ndescriptors:\n  - key: k\n    value: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: e\n---\ndomain: d\ndescriptors:\n  - key: k\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: j\n";
    let model = merged(a, b).unwrap_or_else(|e| panic!("{e:?}"));
    let names: Vec<&str> = model.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(names, ["d", "e"]);
    let d = &model.domains[0];
    assert_eq!(d.location.to_string(), "a.yaml:1");
    let keys: Vec<(String, String)> = d
        .descriptors
        .iter()
        .map(|r| (r.key.clone(), r.location.to_string()))
        .collect();
    let want = [("k", "a.yaml:3"), ("k", "b.yaml:5"), ("j", "b.yaml:8")];
    assert_eq!(keys, want.map(|(k, l)| (k.to_owned(), l.to_owned())));
    // Without the option, the second definition is the error it always was.
    let sources = [
        (PathBuf::from("a.yaml"), a.to_owned()),
        (PathBuf::from("b.yaml"), b.to_owned()),
    ];
    let err = from_sources(&sources).unwrap_err().to_string();
    assert_eq!(
        err,
        "b.yaml:3: domain: duplicate domain 'd' (first defined at a.yaml:1)"
    );
}

#[test]
fn merge_domains_still_refuses_a_descriptor_defined_twice_naming_both_places() {
    let a = "domain: d\ndescriptors:\n  - key: k\n    value: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: j\n";
    let b = "domain: d\ndescriptors:\n  - key: j\n    value: x\n  - key: k\n    value: a\n";
    assert_eq!(
        merged(a, b).unwrap_err(),
        [
            "b.yaml:5: descriptors[1]: duplicate descriptor 'k_a' of domain 'd' (first defined at a.yaml:3)"
        ]
    );
    // Within one file the rule is unchanged.
    let same = "domain: d\ndescriptors:\n  - key: k\n  - key: k\n";
    assert_eq!(
        merged(same, "").unwrap_err(),
        ["a.yaml:4: descriptors[1]: duplicate descriptor 'k' (first defined at line 3)"]
    );
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let seq = "- ".repeat(100_000) + "x\n";
    let indented: String = (0..2_000).map(|i| " ".repeat(i) + "a:\n").collect();
    let flow = "[".repeat(10_000);
    let keys = "? ".repeat(100_000) + "x\n";
    for text in [seq, indented, flow, keys] {
        assert_eq!(errors(&text).len(), 1);
    }
}

#[test]
fn just_below_the_nesting_guard_parses() {
    // The deepest nesting the guard lets through (two block levels per indentation step, the
    // most compact indicators, then the parser's own cap of 254 flow levels) must still parse
    // on a test thread's stack.
    let mut text = String::new();
    for i in 0..tree::MAX_INDENT / 2 {
        text += &format!("{}- a:\n", "  ".repeat(i));
    }
    let compact = "- ".repeat(tree::MAX_INDICATORS - 1);
    let flow = "[".repeat(254) + &"]".repeat(254);
    text += &format!("{}{compact}{flow}\n", " ".repeat(tree::MAX_INDENT));
    assert_eq!(
        errors(&text),
        ["t.yaml:1: expected a mapping, got a sequence"]
    );
}

#[test]
fn strange_yaml_gives_errors() {
    let cases = [
        "? [a, b]\n: c\n",
        "domain: !foo d\n",
        "domain: d\ndescriptors: !seq [1]\n",
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {? [x] : 1}\n",
        "domain: !!int x\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1e400}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -99999999999999999999}\n",
        "\u{0}\u{1}\u{feff}domain: \u{7f}\n",
        "domain: \"\\ud800\"\n",
        "- a\n- b\n",
        "plain text\n",
    ];
    for text in cases {
        assert!(!errors(text).is_empty(), "{text:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = load(&text);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = load(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn yaml_like_text_never_panics(
        parts in prop::collection::vec(prop::sample::select(FRAGMENTS), 0..40)
    ) {
        let _ = load(&parts.concat());
    }
}

/// Pieces of rules files and YAML syntax, shuffled together by the property test.
#[rustfmt::skip]
const FRAGMENTS: &[&str] = &[
    "domain: d\n", "descriptors:\n", "  - key: k\n", "    value: v*\n", "    rate_limit:\n",
    "      unit: second\n", "      requests_per_unit: 5\n", "      unlimited: true\n",
    "    rate_limits:\n", "      - unit: minute\n", "      - unlimited: true\n",
    "        burst: 0\n", "      replaces:\n", "        - name: x\n", "    metadata:\n",
    "      a: [1, {b: c}]\n", "---\n", "...\n", "&a ", "*a ", "!t ", "!!str ", "? ", ": ",
    "- ", "[", "]", "{", "}", ",", "'", "\"", "|\n", ">-\n", "#c\n", "\t", "\n", "  ",
    "\u{feff}", "\r", "%YAML 1.2\n", "%TAG ! tag:x,2000:\n", "é", "\\u0000", "1e999", "-1",
    "99999999999999999999", "0x", "~", "null", "True",
];

/// The charge and algorithm of a limit that names neither: the domain's own entry of
/// `limits.domains`, else the global defaults; a limit's own keys win over both.
#[test]
fn a_domains_defaults_win_over_the_global_ones_and_a_limits_own_keys_over_both() {
    use crate::config::model::{Algorithm, Charge};
    use crate::config::settings::DomainLimits;
    let text = "domain: budget\ndescriptors:\n  - key: user\n    rate_limits:\n      \
                - {unit: hour, requests_per_unit: 1000}\n      \
                - {unit: day, requests_per_unit: 9000, charge: admitted, algorithm: funnel}\n\
                ---\ndomain: api\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
    let mut domains = std::collections::BTreeMap::new();
    domains.insert(
        "budget".to_owned(),
        DomainLimits {
            algorithm: Some(Algorithm::FixedWindow),
            charge: Some(Charge::Always),
            scope: None,
        },
    );
    let options = LoadOptions {
        default_algorithm: Algorithm::TokenBucket,
        default_charge: Charge::Admitted,
        domains: std::sync::Arc::new(domains),
        fixed_windows_only: false,
        merge_domains: false,
        global_url: false,
    };
    let model = from_sources_with(&[(PathBuf::from("t.yaml"), text.to_owned())], options)
        .unwrap_or_else(|e| panic!("{e}"));
    let limits = |d: usize| match &model.domains[d].descriptors[0].policy {
        Policy::Limited(l) => l
            .iter()
            .map(|l| (l.algorithm, l.charge))
            .collect::<Vec<_>>(),
        _ => panic!("limited"),
    };
    assert_eq!(
        limits(0),
        [
            (Algorithm::FixedWindow, Charge::Always),
            (Algorithm::Funnel, Charge::Admitted)
        ]
    );
    assert_eq!(model.domains[0].defaults.charge, Charge::Always);
    assert_eq!(limits(1), [(Algorithm::TokenBucket, Charge::Admitted)]);
    assert_eq!(model.domains[1].defaults.algorithm, Algorithm::TokenBucket);
}

#[test]
fn burst_on_a_domains_default_window_names_the_domains_setting() {
    use crate::config::model::Algorithm;
    use crate::config::settings::DomainLimits;
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n";
    let mut domains = std::collections::BTreeMap::new();
    domains.insert(
        "d".to_owned(),
        DomainLimits {
            algorithm: Some(Algorithm::SlidingWindow),
            charge: None,
            scope: None,
        },
    );
    let options = LoadOptions {
        domains: std::sync::Arc::new(domains),
        ..LoadOptions::default()
    };
    let errors = from_sources_with(&[(PathBuf::from("t.yaml"), text.to_owned())], options)
        .unwrap_err()
        .to_string();
    assert!(
        errors
            .contains("this limit's algorithm is sliding_window (limits.domains.\"d\".algorithm)"),
        "{errors}"
    );
}

#[test]
fn on_deny_gives_the_body_and_headers_of_the_429() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      on_deny:\n        body: '{\"error\": \"slow down\"}'\n        content_type: application/json\n        headers: {X-Upgrade-At: https://example.com/plans, Retry-Policy: 3}\n";
    let model = load(text).unwrap_or_else(|e| panic!("{e:?}"));
    let Policy::Limited(limits) = &model.domains[0].descriptors[0].policy else {
        panic!("limited");
    };
    let d = limits[0].on_deny.as_deref().expect("on_deny");
    assert_eq!(d.body, "{\"error\": \"slow down\"}");
    assert_eq!(
        d.all_headers().collect::<Vec<_>>(),
        [
            ("content-type", "application/json"),
            ("retry-policy", "3"),
            ("x-upgrade-at", "https://example.com/plans"),
        ]
    );
}

#[test]
fn a_bad_on_deny_names_its_line_and_key() {
    let at = |on_deny: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      on_deny: {on_deny}\n"
        )
    };
    let big = "x".repeat(4097);
    let many: Vec<String> = (0..17).map(|i| format!("h{i}: v")).collect();
    for (on_deny, want) in [
        ("{colour: red}".to_owned(), "t.yaml:7: descriptors[0].rate_limit.on_deny: unknown key 'colour'".to_owned()),
        (format!("{{body: {big}}}"), "t.yaml:7: descriptors[0].rate_limit.on_deny.body: at most 4096 bytes".to_owned()),
        ("{headers: {\"bad name\": v}}".to_owned(), "t.yaml:7: descriptors[0].rate_limit.on_deny.headers.bad name: not a valid header name".to_owned()),
        ("{headers: {Content-Type: text/html}}".to_owned(), "t.yaml:7: descriptors[0].rate_limit.on_deny.headers.Content-Type: set content_type instead".to_owned()),
        ("{headers: {content-length: \"3\"}}".to_owned(), "t.yaml:7: descriptors[0].rate_limit.on_deny.headers.content-length: a header Envoy sets itself".to_owned()),
        ("{content_type: \"a\\nb\"}".to_owned(), "t.yaml:7: descriptors[0].rate_limit.on_deny.content_type: a header value cannot hold a line break or NUL".to_owned()),
        (format!("{{headers: {{{}}}}}", many.join(", ")), "t.yaml:7: descriptors[0].rate_limit.on_deny.headers: at most 16 headers".to_owned()),
    ] {
        assert_eq!(errors(&at(&on_deny)), [want], "{on_deny}");
    }
    let unlimited = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, on_deny: {body: x}}\n";
    assert_eq!(
        errors(unlimited),
        [
            "t.yaml:4: descriptors[0].rate_limit.on_deny: on_deny must not be set on an unlimited limit"
        ]
    );
}

#[test]
fn block_for_and_time_zone_are_read_into_the_limit() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1, block_for: 10m}\n      - {unit: month, requests_per_unit: 9, algorithm: fixed_window, time_zone: Europe/Berlin, block_for: 90}\n";
    let model = load(text).unwrap_or_else(|e| panic!("{e:?}"));
    let Policy::Limited(limits) = &model.domains[0].descriptors[0].policy else {
        panic!("limited");
    };
    assert_eq!(limits[0].block_nanos, 600_000_000_000);
    assert_eq!(limits[0].time_zone, None);
    assert_eq!(limits[1].block_nanos, 90_000_000_000);
    assert_eq!(limits[1].time_zone.map(|z| z.name()), Some("Europe/Berlin"));
    let calendar = limits[1].calendar().expect("a calendar");
    assert_eq!(calendar.unit, crate::config::calendar::CalendarUnit::Month);
    // Without a time zone, a month is still 30 days.
    assert_eq!(limits[0].calendar(), None);
}

#[test]
fn time_zone_checks_its_algorithm_even_when_it_is_the_default() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, time_zone: UTC}\n";
    assert_eq!(
        errors(text),
        [
            "t.yaml:4: descriptors[0].rate_limit.time_zone: time_zone only applies to fixed_window (calendar windows); this limit's algorithm is funnel"
        ]
    );
}

#[test]
fn hold_id_is_read_into_a_concurrency_limit() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency, hold_id: request_id}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}\n";
    let model = load(text).unwrap_or_else(|e| panic!("{e:?}"));
    let hold_ids: Vec<Option<String>> = model.domains[0]
        .descriptors
        .iter()
        .map(|d| match &d.policy {
            Policy::Limited(limits) => limits[0].hold_id.clone(),
            other => panic!("limited, not {other:?}"),
        })
        .collect();
    assert_eq!(hold_ids, [Some("request_id".to_owned()), None]);
}

/// On the memcache backend, a limit of another algorithm (written, or from the defaults) and
/// `block_for` are errors naming the line and the reason; fixed windows load.
#[test]
fn the_memcache_backend_refuses_all_but_fixed_windows() {
    let text = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: c
    rate_limit:
      unit: minute
      requests_per_unit: 1
      algorithm: token_bucket
  - key: e
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window, block_for: 10s}
";
    let options = LoadOptions {
        fixed_windows_only: true,
        ..LoadOptions::default()
    };
    let errors = from_sources_with(&[(PathBuf::from("m.yaml"), text.to_owned())], options)
        .unwrap_err()
        .0;
    let found: Vec<(usize, bool)> = errors
        .iter()
        .map(|e| (e.line, e.message.contains("memcache backend")))
        .collect();
    assert_eq!(found, [(6, true), (11, true), (13, true)], "{errors:?}");
    assert!(
        errors[0]
            .message
            .contains("funnel (limits.default_algorithm)"),
        "{}",
        errors[0]
    );
    let fixed = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}\n";
    let options = LoadOptions {
        fixed_windows_only: true,
        ..LoadOptions::default()
    };
    assert!(from_sources_with(&[(PathBuf::from("m.yaml"), fixed.to_owned())], options).is_ok());
}

/// `scope: global`: parsed, the domain's `scope = "global"` taken as the default; refused
/// without a home Redis, and on algorithms that cannot be shared exactly, naming the line,
/// the key and the reason.
#[test]
fn a_global_limit_needs_a_home_redis_and_a_shareable_algorithm() {
    use crate::config::model::Scope;
    use crate::config::settings::DomainLimits;
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n      \
                requests_per_unit: 600\n      algorithm: fixed_window\n      scope: global\n  \
                - key: b\n    rate_limit: {unit: second, requests_per_unit: 5, scope: local}\n  \
                - key: c\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, scope: global}\n  \
                - key: f\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: funnel, scope: global}\n";
    let home = LoadOptions {
        global_url: true,
        ..LoadOptions::default()
    };
    let model = from_sources_with(&[(PathBuf::from("g.yaml"), text.to_owned())], home.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let global: Vec<bool> = model.domains[0]
        .descriptors
        .iter()
        .map(|d| match &d.policy {
            Policy::Limited(l) => l[0].global,
            _ => panic!("limited"),
        })
        .collect();
    assert_eq!(global, [true, false, true, true]);

    // No home Redis: the error names the file, the line of the key, the key and the setting.
    let errors = from_sources_with(
        &[(PathBuf::from("g.yaml"), text.to_owned())],
        LoadOptions::default(),
    )
    .unwrap_err()
    .0;
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert_eq!(errors[0].line, 8, "{}", errors[0]);
    assert!(
        errors[0].path.ends_with("rate_limit.scope"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].message.contains("redis.global_url"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].to_string().starts_with("g.yaml:8: "),
        "{}",
        errors[0]
    );

    // Algorithms that cannot be shared, with the reason.
    for (algorithm, extra, why) in [
        ("sliding_log", "", "sliding log"),
        ("concurrency", "", "concurrency"),
        ("fixed_window", ", charge: always", "charge: always"),
        ("fixed_window", ", block_for: 10s", "block_for"),
    ] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: day, requests_per_unit: 5, \
             algorithm: {algorithm}, scope: global{extra}}}\n"
        );
        let errors = from_sources_with(&[(PathBuf::from("g.yaml"), text)], home.clone())
            .unwrap_err()
            .0;
        let e = errors
            .iter()
            .find(|e| e.message.contains("cannot be shared exactly"))
            .unwrap_or_else(|| panic!("{algorithm}{extra}: {errors:?}"));
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains(why), "{e}");
    }
    let calendar = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 5, \
                    algorithm: fixed_window, time_zone: Europe/Paris, scope: global}\n";
    let errors = from_sources_with(
        &[(PathBuf::from("g.yaml"), calendar.to_owned())],
        home.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(errors.contains("calendar window"), "{errors}");
    let unknown = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 5, scope: planet}\n";
    let errors = from_sources_with(
        &[(PathBuf::from("g.yaml"), unknown.to_owned())],
        home.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(errors.contains("unknown scope 'planet'"), "{errors}");

    // The domain's scope makes every limit global; a limit's own `scope: local` wins.
    let mut domains = std::collections::BTreeMap::new();
    domains.insert(
        "d".to_owned(),
        DomainLimits {
            scope: Some(Scope::Global),
            ..DomainLimits::default()
        },
    );
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 6}\n  \
                - key: b\n    rate_limit: {unit: minute, requests_per_unit: 6, scope: local}\n";
    let options = LoadOptions {
        domains: std::sync::Arc::new(domains),
        ..home.clone()
    };
    let model = from_sources_with(
        &[(PathBuf::from("g.yaml"), text.to_owned())],
        options.clone(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let global: Vec<bool> = model.domains[0]
        .descriptors
        .iter()
        .map(|d| match &d.policy {
            Policy::Limited(l) => l[0].global,
            _ => panic!("limited"),
        })
        .collect();
    assert_eq!(global, [true, false]);
    let errors = from_sources_with(
        &[(PathBuf::from("g.yaml"), text.to_owned())],
        LoadOptions {
            global_url: false,
            ..options
        },
    )
    .unwrap_err()
    .0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.contains("limits.domains.\"d\".scope"),
        "{}",
        errors[0]
    );
}
