//! The loader on limitador limits files: the model it builds and every error, with its line.

use std::path::PathBuf;

use super::*;
use crate::config::model::Algorithm;

fn load(text: &str) -> Result<RulesModel, Vec<String>> {
    from_sources(&[(PathBuf::from("l.yaml"), text.to_owned())])
        .map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

fn errors(text: &str) -> Vec<String> {
    load(text).expect_err("expected errors")
}

/// limitador-server/examples/limits.yaml, as it is.
const EXAMPLE: &str = include_str!("../../../../tests/fixtures/limitador/limits.yaml");

#[test]
fn limitadors_example_loads_as_namespace_limits() {
    let model = load(EXAMPLE).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(model.domains.is_empty());
    let [a, b] = &model.namespaces[..] else {
        panic!("two limits: {:?}", model.namespaces);
    };
    assert_eq!(
        (a.namespace.as_str(), a.max_value, a.seconds.get()),
        ("test_namespace", 1_000_000, 60)
    );
    assert!(a.conditions.is_empty() && a.variables.is_empty());
    assert_eq!(a.algorithm, Algorithm::FixedWindow);
    assert_eq!(a.location.line, 2);
    assert_eq!(
        b.conditions[0].source(),
        "descriptors[0]['req.method'] == 'POST'"
    );
    assert_eq!(b.variables[0].source(), "descriptors[0]['user_id']");
    assert_eq!(b.location.line, 7);
    assert_ne!(a.key_id(), b.key_id());
}

#[test]
fn every_field_limitador_knows_and_the_algorithm_extension() {
    let text = "- {namespace: n, max_value: 3, seconds: 10, name: per_user, id: lim-1, conditions: ['true'], variables: ['descriptors[0].u'], algorithm: funnel}\n";
    let model = load(text).unwrap_or_else(|e| panic!("{e:?}"));
    let l = &model.namespaces[0];
    assert_eq!(l.name.as_deref(), Some("per_user"));
    assert_eq!(l.id.as_deref(), Some("lim-1"));
    assert_eq!(l.key_id(), "id:lim-1");
    assert_eq!(l.algorithm, Algorithm::Funnel);
    let rule = l.rule();
    assert_eq!(
        (rule.requests_per_unit, rule.unit_multiplier.get()),
        (3, 10)
    );
}

#[test]
fn the_identity_ignores_max_value_and_name_and_the_order_of_expressions() {
    let one = "- {namespace: n, max_value: 3, seconds: 10, conditions: ['1 == 1', '2 == 2'], variables: [a, b]}\n";
    let two = "- {namespace: n, max_value: 9, seconds: 10, name: x, conditions: ['2 == 2', '1 == 1', '1 == 1'], variables: [b, a]}\n";
    let (a, b) = (load(one).unwrap(), load(two).unwrap());
    assert_eq!(a.namespaces[0].key_id(), b.namespaces[0].key_id());
    assert_eq!(b.namespaces[0].conditions.len(), 2, "repeats dropped");
    let three = "- {namespace: n, max_value: 3, seconds: 11, conditions: ['1 == 1', '2 == 2'], variables: [a, b]}\n";
    assert_ne!(
        a.namespaces[0].key_id(),
        load(three).unwrap().namespaces[0].key_id()
    );
}

#[test]
fn errors_name_file_line_and_key() {
    let text = "\
- namespace: n
  max_value: 1
  seconds: 60
  colour: red
- namespace: n
  max_value: -1
  seconds: 0
- max_value: 1
  seconds: 1
- namespace: n
  max_value: 1
  seconds: 1
  conditions:
    - \"descriptors[0].x ==\"
  variables: descriptors[0].y
- namespace: n
  max_value: 1
  seconds: 1
  algorithm: leaky
- namespace: ''
  max_value: 1
  seconds: 5000000000
";
    let e = errors(text);
    assert_eq!(e[0], "l.yaml:4: [0]: unknown key 'colour'");
    assert_eq!(
        e[1],
        "l.yaml:6: [1].max_value: must not be negative, got -1"
    );
    assert_eq!(e[2], "l.yaml:7: [1].seconds: must be at least 1");
    assert_eq!(e[3], "l.yaml:8: [2]: missing namespace");
    assert!(
        e[4].starts_with(
            "l.yaml:14: [3].conditions[0]: invalid CEL expression 'descriptors[0].x =='"
        ),
        "{}",
        e[4]
    );
    assert_eq!(
        e[5],
        "l.yaml:15: [3].variables: expected a sequence, got a string ('descriptors[0].y')"
    );
    assert!(
        e[6].starts_with("l.yaml:19: [4].algorithm: unknown algorithm 'leaky'"),
        "{}",
        e[6]
    );
    assert_eq!(e[7], "l.yaml:20: [5].namespace: must not be empty");
    assert_eq!(
        e[8],
        "l.yaml:22: [5].seconds: must be at most 4294967295, got 5000000000"
    );
    assert_eq!(e.len(), 9, "{e:#?}");
}

#[test]
fn the_same_limit_twice_and_a_namespace_that_is_a_domain_are_errors() {
    let text = "- {namespace: n, max_value: 1, seconds: 1, variables: [a]}\n- {namespace: n, max_value: 2, seconds: 1, variables: [a]}\n";
    let e = errors(text);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("l.yaml:2: the same limit as the one at l.yaml:1"),
        "{}",
        e[0]
    );
    let sources = [
        (
            PathBuf::from("a.yaml"),
            "- {namespace: d, max_value: 1, seconds: 1}\n".to_owned(),
        ),
        (PathBuf::from("b.yaml"), "domain: d\n".to_owned()),
    ];
    let e = from_sources(&sources).expect_err("a clash").to_string();
    assert_eq!(
        e,
        "a.yaml:1: namespace 'd' is also a domain of a rules file (at b.yaml:1)"
    );
}

#[test]
fn a_window_over_100_years_and_sliding_log_over_its_cap_are_errors() {
    let e = errors("- {namespace: n, max_value: 1, seconds: 3200000000}\n");
    assert_eq!(
        e,
        ["l.yaml:1: [0].seconds: a window of 3200000000 seconds is longer than 100 years"]
    );
    let e = errors("- {namespace: n, max_value: 10001, seconds: 1, algorithm: sliding_log}\n");
    assert!(
        e[0].starts_with("l.yaml:1: [0].algorithm: sliding_log keeps"),
        "{}",
        e[0]
    );
}

#[test]
fn ratelimit_domains_and_limitador_files_load_side_by_side() {
    let sources = [
        (PathBuf::from("a.yaml"), EXAMPLE.to_owned()),
        (PathBuf::from("b.yaml"), "domain: d\n".to_owned()),
    ];
    let model = from_sources(&sources).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((model.domains.len(), model.namespaces.len()), (1, 2));
}

#[test]
fn only_a_sequence_of_limitador_limits_is_a_limits_file() {
    assert_eq!(load("[]\n").unwrap().namespaces.len(), 0);
    assert_eq!(
        errors("- domain: d\n"),
        ["l.yaml:1: expected a mapping, got a sequence"]
    );
    assert_eq!(
        errors("- 5\n"),
        ["l.yaml:1: expected a mapping, got a sequence"]
    );
    // Once the first limit says it is limitador's, every item is read as a limit.
    let e = errors("- {namespace: n, max_value: 1, seconds: 1}\n- 5\n");
    assert_eq!(e, ["l.yaml:2: [1]: expected a mapping, got an integer (5)"]);
}
