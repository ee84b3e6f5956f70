//! The rules-file validator, seen from outside: every invalid fixture (one per validation
//! rule) against its exact error lines, every valid fixture against the model it builds, and
//! how `load_paths` finds, reads and combines files.

use std::fs;
use std::path::{Path, PathBuf};

use sluice::config::model::{DescriptorRule, LimitRule, Policy, RulesModel, ValueMatch};
use sluice::config::rules::{from_sources, load_paths};

const INVALID_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rules/invalid");
const VALID_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rules/valid");

/// Each invalid fixture and the errors it must give, as `file:line: path: message`.
#[rustfmt::skip]
const INVALID: &[(&str, &[&str])] = &[
    ("algorithm_unknown.yaml", &[
        "algorithm_unknown.yaml:8: descriptors[0].rate_limit.algorithm: unknown algorithm 'leaky_bucket' (expected funnel, token_bucket, fixed_window, sliding_window or sliding_log)",
        "algorithm_unknown.yaml:13: descriptors[1].rate_limits[0].algorithm: unknown algorithm 'Funnel' (expected funnel, token_bucket, fixed_window, sliding_window or sliding_log)",
        "algorithm_unknown.yaml:16: descriptors[1].rate_limits[1].algorithm: unknown algorithm 'gcra' (expected funnel, token_bucket, fixed_window, sliding_window or sliding_log)",
    ]),
    ("borrow_without_capacity.yaml", &[
        "borrow_without_capacity.yaml:9: descriptors[0].rate_limit.borrow: borrow only applies to funnel and token_bucket, whose debt is paid back at their rate (a window forgets it when the window passes); this limit's algorithm is fixed_window",
    ]),
    ("burst_without_capacity.yaml", &[
        "burst_without_capacity.yaml:9: descriptors[0].rate_limit.burst: burst only applies to funnel and token_bucket; this limit's algorithm is fixed_window",
        "burst_without_capacity.yaml:13: descriptors[1].rate_limits[1].burst: burst only applies to funnel and token_bucket; this limit's algorithm is fixed_window",
    ]),
    ("burst_zero.yaml", &[
        "burst_zero.yaml:8: descriptors[0].rate_limit.burst: must be at least 1",
    ]),
    ("capacity_too_long.yaml", &[
        "capacity_too_long.yaml:10: descriptors[0].rate_limit.burst: a burst of 6 at 1 per period takes 600 years to drain (burst x period / requests_per_unit must be at most 100 years)",
        "capacity_too_long.yaml:22: descriptors[2].rate_limit.burst: a burst of 3 at 1 per period takes 150 years to drain (burst x period / requests_per_unit must be at most 100 years)",
    ]),
    ("charge_unknown.yaml", &[
        "charge_unknown.yaml:8: descriptors[0].rate_limit.charge: unknown charge 'denied' (expected admitted or always)",
    ]),
    ("descriptor_duplicate.yaml", &[
        "descriptor_duplicate.yaml:9: descriptors[3]: duplicate descriptor 'k_v' (first defined at line 4)",
        "descriptor_duplicate.yaml:11: descriptors[4]: duplicate descriptor 'k' (first defined at line 6)",
        "descriptor_duplicate.yaml:17: descriptors[5].descriptors[1]: duplicate descriptor 'child_x*' (first defined at line 15)",
    ]),
    ("descriptor_key_missing.yaml", &[
        "descriptor_key_missing.yaml:4: descriptors[0]: missing key",
        "descriptor_key_missing.yaml:8: descriptors[1].key: must not be empty",
        "descriptor_key_missing.yaml:9: descriptors[2].key: must not be empty",
        "descriptor_key_missing.yaml:11: descriptors[2].descriptors[0]: missing key",
    ]),
    ("domain_duplicate.yaml", &[
        "domain_duplicate.yaml:6: domain: duplicate domain 'twice' (first defined at domain_duplicate.yaml:2)",
    ]),
    ("domain_missing.yaml", &[
        "domain_missing.yaml:2: missing domain",
        "domain_missing.yaml:5: domain: must not be empty",
        "domain_missing.yaml:7: domain: must not be empty",
    ]),
    ("integer_invalid.yaml", &[
        "integer_invalid.yaml:7: descriptors[0].rate_limit.requests_per_unit: must not be negative, got -5",
        "integer_invalid.yaml:11: descriptors[1].rate_limit.requests_per_unit: must be at most 4294967295, got 4294967296",
        "integer_invalid.yaml:15: descriptors[2].rate_limit.requests_per_unit: must be at most 4294967295, got 99999999999999999999",
        "integer_invalid.yaml:19: descriptors[3].rate_limit.requests_per_unit: expected an integer, got a number (1.5)",
        "integer_invalid.yaml:23: descriptors[4].rate_limit.requests_per_unit: expected an integer, got a string ('10')",
    ]),
    ("limits_share_state.yaml", &[
        "limits_share_state.yaml:8: descriptors[0].rate_limits[1]: same algorithm (funnel) and period (60s) as descriptors[0].rate_limits[0]: the two limits would share one state",
        "limits_share_state.yaml:13: descriptors[0].rate_limits[3]: same algorithm (funnel) and period (60s) as descriptors[0].rate_limits[0]: the two limits would share one state",
    ]),
    ("metadata_not_mapping.yaml", &[
        "metadata_not_mapping.yaml:5: descriptors[0].metadata: expected a mapping, got a sequence",
        "metadata_not_mapping.yaml:7: descriptors[1].metadata: expected a mapping, got a string ('owner')",
    ]),
    ("nesting_too_deep.yaml", &[
        "nesting_too_deep.yaml:103: nested too deeply (at most 100 columns of indentation and 50 nested collections on one line)",
    ]),
    ("period_too_long.yaml", &[
        "period_too_long.yaml:7: descriptors[0].rate_limit.unit_multiplier: a period of 101 x year is longer than 100 years",
        "period_too_long.yaml:17: descriptors[2].rate_limit.unit_multiplier: a period of 4294967295 x second is longer than 100 years",
    ]),
    ("rate_limit_and_rate_limits.yaml", &[
        "rate_limit_and_rate_limits.yaml:8: descriptors[0]: rate_limit and rate_limits cannot be used together; use one of them",
    ]),
    ("rate_limits_empty.yaml", &[
        "rate_limits_empty.yaml:5: descriptors[0].rate_limits: must list at least one limit",
        "rate_limits_empty.yaml:7: descriptors[1].rate_limits: must list at least one limit",
    ]),
    ("replaces_empty_name.yaml", &[
        "replaces_empty_name.yaml:9: descriptors[0].rate_limit.replaces[0].name: must not be empty",
        "replaces_empty_name.yaml:10: descriptors[0].rate_limit.replaces[1]: missing name of the limit to replace",
    ]),
    ("replaces_self.yaml", &[
        "replaces_self.yaml:11: descriptors[0].rate_limit.replaces[1].name: a limit cannot replace itself ('per_a')",
    ]),
    ("share_threshold_without_wildcard.yaml", &[
        "share_threshold_without_wildcard.yaml:6: descriptors[0].share_threshold: share_threshold needs a wildcard value (containing '*'), got 'path_/exact'",
        "share_threshold_without_wildcard.yaml:11: descriptors[1].share_threshold: share_threshold needs a wildcard value (containing '*'), got 'path'",
    ]),
    ("sliding_log_over_cap.yaml", &[
        "sliding_log_over_cap.yaml:7: descriptors[0].rate_limit.requests_per_unit: sliding_log keeps one entry per admitted request: requests_per_unit must be at most 10000 with it, got 10001 (sliding_window needs two counters whatever the quota); this limit's algorithm is sliding_log",
        "sliding_log_over_cap.yaml:12: descriptors[1].descriptors[0].rate_limit.borrow: borrow only applies to funnel and token_bucket, whose debt is paid back at their rate (a window forgets it when the window passes); this limit's algorithm is sliding_log",
    ]),
    ("unit_missing.yaml", &[
        "unit_missing.yaml:5: descriptors[0].rate_limit: missing unit (second, minute, hour, day, week, month or year)",
        "unit_missing.yaml:11: descriptors[1].rate_limits[1]: missing unit (second, minute, hour, day, week, month or year)",
        "unit_missing.yaml:13: descriptors[2].rate_limit: missing unit (second, minute, hour, day, week, month or year)",
    ]),
    ("unit_multiplier_zero.yaml", &[
        "unit_multiplier_zero.yaml:7: descriptors[0].rate_limit.unit_multiplier: must be at least 1",
    ]),
    ("unit_unknown.yaml", &[
        "unit_unknown.yaml:6: descriptors[0].rate_limit.unit: unknown unit 'minutes'",
        "unit_unknown.yaml:14: descriptors[2].rate_limit.unit: unknown unit '1'",
    ]),
    ("unknown_key.yaml", &[
        "unknown_key.yaml:3: unknown key 'descriptor'",
        "unknown_key.yaml:7: descriptors[0]: unknown key 'unit'",
        "unknown_key.yaml:9: descriptors[0].rate_limit: unknown key 'unti'",
        "unknown_key.yaml:14: descriptors[0].rate_limit.replaces[0]: unknown key 'key'",
        "unknown_key.yaml:17: descriptors[1]: unknown key 'domain'",
    ]),
    ("unlimited_in_list.yaml", &[
        "unlimited_in_list.yaml:8: descriptors[0].rate_limits[1].unlimited: an unlimited limit must be the only limit of its descriptor",
    ]),
    ("unlimited_with_unit.yaml", &[
        "unlimited_with_unit.yaml:7: descriptors[0].rate_limit.unit: unit must not be set on an unlimited limit",
        "unlimited_with_unit.yaml:12: descriptors[1].rate_limit.burst: burst must not be set on an unlimited limit",
        "unlimited_with_unit.yaml:13: descriptors[1].rate_limit.algorithm: algorithm must not be set on an unlimited limit",
    ]),
    ("wrong_type.yaml", &[
        "wrong_type.yaml:2: domain: expected a string, got a sequence",
        "wrong_type.yaml:5: descriptors: expected a sequence, got a mapping",
        "wrong_type.yaml:10: descriptors[0]: expected a mapping, got a string ('plain string')",
        "wrong_type.yaml:11: descriptors[1].key: expected a string, got a mapping",
        "wrong_type.yaml:12: descriptors[1].shadow_mode: expected true or false, got a string ('maybe')",
        "wrong_type.yaml:13: descriptors[1].rate_limit: expected a mapping, got a string ('second')",
        "wrong_type.yaml:15: descriptors[2].quota_mode: expected true or false, got a string ('true')",
        "wrong_type.yaml:16: descriptors[2].rate_limits: expected a sequence, got a mapping",
        "wrong_type.yaml:18: descriptors[3].value: expected a string, got a node tagged !custom",
        "wrong_type.yaml:20: descriptors[3].rate_limit.unit: expected a string, got a sequence",
        "wrong_type.yaml:21: descriptors[3].rate_limit.replaces: expected a sequence, got a string ('x')",
        "wrong_type.yaml:26: descriptors[4].metadata.nested.tagged: expected plain YAML data, got a node tagged !weird",
    ]),
    ("yaml_duplicate_key.yaml", &[
        "yaml_duplicate_key.yaml:7: invalid YAML: duplicated key in mapping (column 7)",
    ]),
    ("yaml_syntax.yaml", &[
        "yaml_syntax.yaml:5: invalid YAML: while parsing a block collection, did not find expected '-' indicator (column 4)",
    ]),
];

/// The errors of one file, loaded under its bare file name.
fn error_lines(dir: &str, name: &str) -> Vec<String> {
    let text = fs::read_to_string(Path::new(dir).join(name)).expect("fixture readable");
    match from_sources(&[(PathBuf::from(name), text)]) {
        Ok(_) => vec!["<loaded without errors>".to_owned()],
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

fn yaml_names(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("fixture directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn every_invalid_fixture_gives_exactly_its_errors() {
    let mut failures = Vec::new();
    for (name, expected) in INVALID {
        let actual = error_lines(INVALID_DIR, name);
        if actual != *expected {
            failures.push(format!(
                "{name}:\n  expected {expected:#?}\n  actual   {actual:#?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_invalid_fixture_is_asserted() {
    let listed: Vec<&str> = INVALID.iter().map(|(name, _)| *name).collect();
    assert_eq!(yaml_names(INVALID_DIR), listed);
}

#[test]
fn the_invalid_directory_reports_every_file_in_order() {
    let errors = load_paths(&[PathBuf::from(INVALID_DIR)]).expect_err("invalid rules");
    let mut files: Vec<String> = errors
        .0
        .iter()
        .map(|e| e.file.display().to_string())
        .collect();
    files.dedup();
    let expected: Vec<String> = INVALID
        .iter()
        .map(|(n, _)| format!("{INVALID_DIR}/{n}"))
        .collect();
    assert_eq!(files, expected);
}

/// A compact, exact rendering of a model: one line per domain and per descriptor rule.
fn render(model: &RulesModel) -> Vec<String> {
    let mut lines = Vec::new();
    for d in &model.domains {
        lines.push(format!("domain {} @{}", d.domain, d.location));
        for rule in &d.descriptors {
            render_rule(rule, 1, &mut lines);
        }
    }
    lines
}

fn render_rule(rule: &DescriptorRule, depth: usize, lines: &mut Vec<String>) {
    let value = match &rule.value {
        ValueMatch::Any => String::new(),
        ValueMatch::Exact(v) => format!("={v}"),
        ValueMatch::Wildcard(v) => format!("~{v}"),
    };
    let flags = [
        (rule.shadow_mode, " shadow"),
        (rule.quota_mode, " quota"),
        (rule.detailed_metric, " detailed"),
        (rule.value_to_metric, " value_to_metric"),
        (rule.share_threshold, " shared"),
    ];
    let flags: String = flags
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| *f)
        .collect();
    let metadata = rule
        .metadata
        .as_ref()
        .map(|m| format!(" metadata={}", serde_json::Value::Object(m.clone())));
    let policy = match &rule.policy {
        Policy::None => "none".to_owned(),
        Policy::Unlimited { name, replaces } => {
            format!("unlimited name={name:?} replaces={replaces:?}")
        }
        Policy::Limited(limits) => limits
            .iter()
            .map(render_limit)
            .collect::<Vec<_>>()
            .join(" & "),
    };
    let line = rule.location.line;
    let indent = "  ".repeat(depth);
    lines.push(format!(
        "{indent}{}{value} @{line}{flags}{}: {policy}",
        rule.key,
        metadata.unwrap_or_default()
    ));
    for child in &rule.children {
        render_rule(child, depth + 1, lines);
    }
}

fn render_limit(l: &LimitRule) -> String {
    let unit = l.unit.as_str().to_ascii_lowercase();
    let borrow = if l.borrow { " borrow" } else { "" };
    format!(
        "{}/{}x{unit} burst={} {} {:?}{borrow} name={:?} replaces={:?}",
        l.requests_per_unit,
        l.unit_multiplier,
        l.burst,
        l.algorithm.as_str(),
        l.charge,
        l.name,
        l.replaces
    )
}

fn load_valid(name: &str) -> Vec<String> {
    let text = fs::read_to_string(Path::new(VALID_DIR).join(name)).expect("fixture readable");
    let model = from_sources(&[(PathBuf::from(name), text)]).unwrap_or_else(|e| panic!("{e}"));
    render(&model)
}

#[test]
fn envoy_format_builds_the_model() {
    let f = "envoy_compatible.yaml";
    assert_eq!(load_valid(f), [
        format!("domain envoy @{f}:2"),
        "  remote_address @5: 10/1xsecond burst=10 funnel Admitted name=None replaces=[]".to_owned(),
        "  path=/login @11 shadow detailed: 5/1xminute burst=5 funnel Admitted name=Some(\"login\") replaces=[]".to_owned(),
        "  path~/files/* @21 value_to_metric shared metadata={\"extra\":{\"none\":null,\"on\":true,\"ratio\":0.5},\"tags\":[\"a\",\"b\"],\"team\":\"storage\",\"tier\":2}: 1000/1xhour burst=1000 funnel Admitted name=None replaces=[]".to_owned(),
        "  version=1.10 @35: 0/1xday burst=0 funnel Admitted name=None replaces=[]".to_owned(),
        "  user @41 quota: none".to_owned(),
        "    plan=premium @44: unlimited name=Some(\"premium\") replaces=[\"login\"]".to_owned(),
        "    plan @51: 7/1xweek burst=7 funnel Admitted name=None replaces=[\"login\"]".to_owned(),
        "  healthz @59: unlimited name=None replaces=[]".to_owned(),
    ]);
}

#[test]
fn extensions_build_the_model() {
    let f = "extensions.yaml";
    assert_eq!(load_valid(f), [
        format!("domain extensions @{f}:2"),
        "  api_key @4: 10/1xsecond burst=20 funnel Admitted name=None replaces=[] & 1000/1xday burst=1000 funnel Admitted name=Some(\"daily\") replaces=[]".to_owned(),
        "  llm_tokens @12: 100000/5xminute burst=100000 funnel Always borrow name=None replaces=[]".to_owned(),
        "  export @20: unlimited name=None replaces=[]".to_owned(),
        "  blocked @23: 0/100xyear burst=0 funnel Admitted name=None replaces=[]".to_owned(),
        "  bucket @29: 10/1xminute burst=15 token_bucket Admitted borrow name=None replaces=[] & 100/1xhour burst=100 token_bucket Admitted name=None replaces=[]".to_owned(),
        "  window @33: 100/1xweek burst=100 fixed_window Always name=None replaces=[]".to_owned(),
        "  sliding @35: 50/10xminute burst=50 sliding_window Admitted name=None replaces=[]".to_owned(),
        "  log @37: 10000/1xhour burst=10000 sliding_log Always name=None replaces=[]".to_owned(),
    ]);
}

#[test]
fn several_domains_per_file() {
    let f = "multi_domain.yaml";
    assert_eq!(
        load_valid(f),
        [
            format!("domain first @{f}:3"),
            format!("domain second @{f}:9"),
            format!("domain third @{f}:12"),
        ]
    );
}

#[test]
fn the_valid_directory_loads_in_path_order() {
    let model = load_paths(&[PathBuf::from(VALID_DIR)]).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = model.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(names, ["envoy", "extensions", "first", "second", "third"]);
}

#[test]
fn a_domain_defined_in_two_files_names_both() {
    let sources = [
        (PathBuf::from("a.yaml"), "domain: shared\n".to_owned()),
        (
            PathBuf::from("b.yaml"),
            "# again\ndomain: shared\n".to_owned(),
        ),
    ];
    let errors = from_sources(&sources).expect_err("duplicate domain");
    assert_eq!(
        errors.to_string(),
        "b.yaml:2: domain: duplicate domain 'shared' (first defined at a.yaml:1)"
    );
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, text).expect("write");
}

#[test]
fn directories_are_walked_like_a_configmap_mount() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    // Kubernetes mounts a ConfigMap as symlinks into a timestamped directory via `..data`.
    write(
        &root.join("..2024_01_01_00_00_00.123/b.yaml"),
        "domain: b\n",
    );
    write(&root.join("..2024_01_01_00_00_00.123/a.yml"), "domain: a\n");
    std::os::unix::fs::symlink("..2024_01_01_00_00_00.123", root.join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/b.yaml", root.join("b.yaml")).expect("symlink");
    std::os::unix::fs::symlink("..data/a.yml", root.join("a.yml")).expect("symlink");
    write(&root.join("sub/c.YAML"), "domain: c\n");
    write(&root.join("sub/.hidden.yaml"), "not: [valid\n");
    write(&root.join("sub/notes.txt"), "not: [valid\n");
    std::os::unix::fs::symlink("..", root.join("sub/loop")).expect("symlink");
    let model = load_paths(&[root.to_path_buf()]).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = model.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(*model.domains[2].location.file, root.join("sub/c.YAML"));
}

#[test]
fn an_explicit_file_loads_whatever_its_extension() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rules.conf");
    write(&file, "domain: conf\n");
    let model = load_paths(&[file]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(model.domains[0].domain, "conf");
}

#[test]
fn missing_and_non_utf8_files_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    fs::write(&bad, b"domain: x\ndescriptors:\n  - key: \xff\n").expect("write");
    let missing = dir.path().join("missing.yaml");
    let errors = load_paths(&[missing.clone(), bad.clone()]).expect_err("errors");
    let lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            format!(
                "{}:0: No such file or directory (os error 2)",
                missing.display()
            ),
            format!(
                "{}:3: not valid UTF-8 (rules files must be UTF-8)",
                bad.display()
            ),
        ]
    );
}

#[test]
fn no_files_is_an_empty_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(
        load_paths(&[dir.path().to_path_buf()])
            .expect("empty")
            .domains
            .is_empty()
    );
}
