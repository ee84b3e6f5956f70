//! The rules-file validator, seen from outside: every invalid fixture (one per validation
//! rule) against its exact error lines, every valid fixture against the model it builds, and
//! how `load_paths` finds, reads and combines files.

use crate::support::invalid_rules::{INVALID, INVALID_DIR, every_line};
use sluice::config::model::{DescriptorRule, LimitRule, Policy, RulesModel, ValueMatch};
use sluice::config::rules_file::{from_sources, load_paths};
use sluice::testing::process::sluice_command;
use std::fs;
use std::path::{Path, PathBuf};

const VALID_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rules/valid");

/// The errors of one file of `dir`, loaded as `sluice check` loads it, with the directory
/// left out of the file names.
fn error_lines(dir: &str, name: &str) -> Vec<String> {
    match load_paths(&[Path::new(dir).join(name)]) {
        Ok(_) => vec!["<loaded without errors>".to_owned()],
        Err(errors) => errors
            .0
            .iter()
            .map(|e| e.to_string().replace(&format!("{dir}/"), ""))
            .collect(),
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

/// `sluice check` (the real binary) on the invalid fixtures prints exactly the errors the
/// loader gives for each file above, in file order, then their count, and exits 1.
#[test]
fn check_reports_every_error_with_file_and_line() {
    let out = sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--rules", INVALID_DIR])
        .output()
        .expect("run the sluice binary");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let prefix = format!("{INVALID_DIR}/");
    let printed: Vec<String> = stderr.lines().map(|l| l.replace(&prefix, "")).collect();
    let mut expected: Vec<String> = every_line().map(str::to_owned).collect();
    expected.push(format!("{} error(s)", expected.len()));
    assert_eq!(printed, expected);
}
