//! A limitador limits file reloads like a rules file: a change swaps in the new limits (and
//! `/rlconfig` would list them), a broken file keeps the last good ones.

use sluice::config::rules_file::LoadOptions;
use sluice::reload::{ActiveRules, Reloaded, load};
use sluice::rules::RuleSet;

fn limits(max_value: u32, condition: &str) -> String {
    format!(
        "- {{namespace: ns, max_value: {max_value}, seconds: 60, conditions: [\"{condition}\"]}}\n"
    )
}

fn max_value(active: &ActiveRules) -> u32 {
    let set = active.load_full();
    let ns = set.namespaces().get("ns").expect("the namespace");
    ns.limits()[0].limit.max_value
}

#[test]
fn a_limits_file_reloads_and_a_broken_one_keeps_the_last_good_limits() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, limits(5, "descriptors[0].m == 'POST'")).unwrap();
    let paths = vec![file.clone()];
    let set = RuleSet::compile(load(&paths, LoadOptions::default()).unwrap());
    let active = ActiveRules::new(set, paths, LoadOptions::default());
    assert!(matches!(active.reload(), Reloaded::Unchanged));
    std::fs::write(&file, limits(9, "descriptors[0].m == 'POST'")).unwrap();
    assert!(matches!(active.reload(), Reloaded::Updated { version: 2 }));
    assert_eq!(max_value(&active), 9);
    std::fs::write(&file, limits(3, "descriptors[0].m ==")).unwrap();
    let Reloaded::Failed(errors) = active.reload() else {
        panic!("a bad expression must fail the reload");
    };
    let text = errors.to_string();
    assert!(
        text.contains("limits.yaml:1: [0].conditions[0]: invalid CEL expression"),
        "{text}"
    );
    assert_eq!(max_value(&active), 9, "the last good limits stay");
}
