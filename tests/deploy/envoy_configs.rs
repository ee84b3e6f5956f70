//! Every Envoy config shipped under `deploy/` passes `envoy --mode validate` (the real Envoy
//! 1.40), and its sluice rules pass `sluice check`.

use crate::support::envoy;
use crate::support::sluice_check;
use std::path::{Path, PathBuf};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Every `*.yaml` under `dir`, recursively, in a stable order.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            found.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path);
        }
    }
    found
}

/// An Envoy bootstrap has a top-level `static_resources:` (or `dynamic_resources:`).
fn is_envoy_bootstrap(text: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with("static_resources:") || l.starts_with("dynamic_resources:"))
}

#[test]
fn every_envoy_config_in_deploy_passes_envoy_validate() {
    let configs: Vec<PathBuf> = yaml_files(&deploy_dir())
        .into_iter()
        .filter(|p| is_envoy_bootstrap(&std::fs::read_to_string(p).expect("read a YAML file")))
        .collect();
    let names: Vec<String> = configs.iter().map(|p| p.display().to_string()).collect();
    assert!(
        names.iter().any(|n| n.ends_with("deploy/envoy/envoy.yaml")),
        "deploy/envoy/envoy.yaml not found among {names:?}"
    );
    for config in &configs {
        envoy::validate(config);
    }
}

#[test]
fn the_envoy_rules_pass_sluice_check() {
    sluice_check(&deploy_dir().join("envoy/rules.yaml"));
}

#[test]
fn the_concurrency_rules_pass_sluice_check() {
    sluice_check(&deploy_dir().join("envoy/concurrency-rules.yaml"));
}

/// deploy/envoy/concurrency.yaml takes a hold at the start and releases it at stream done,
/// both under the request's id (x-request-id, which Envoy generates), in the domain of its
/// rules, whose limit names that entry (`hold_id`), and its route ends before the lease does.
#[test]
fn the_concurrency_recipe_holds_and_releases_in_its_rules_domain() {
    let config =
        std::fs::read_to_string(deploy_dir().join("envoy/concurrency.yaml")).expect("read");
    let rules =
        std::fs::read_to_string(deploy_dir().join("envoy/concurrency-rules.yaml")).expect("read");
    assert!(config.contains("domain: inflight") && rules.contains("\ndomain: inflight\n"));
    for line in [
        "hits_addend: { number: 1 }",
        "apply_on_stream_done: true",
        "hits_addend: { number: 1, is_negative_hits: true }",
        "descriptor_key: tenant",
        "- request_headers: { header_name: x-request-id, descriptor_key: request_id, skip_if_absent: true }",
        "generate_request_id: true",
        "timeout: 240s",
    ] {
        assert!(
            config.contains(line),
            "{line} missing from concurrency.yaml"
        );
    }
    assert!(rules.contains("algorithm: concurrency") && rules.contains("unit_multiplier: 5"));
    assert!(rules.contains("hold_id: request_id"));
}

#[test]
fn the_envoy_config_sends_the_domain_of_its_rules() {
    let config = std::fs::read_to_string(deploy_dir().join("envoy/envoy.yaml")).expect("read");
    let rules = std::fs::read_to_string(deploy_dir().join("envoy/rules.yaml")).expect("read");
    assert!(config.contains("domain: edge") && rules.contains("\ndomain: edge\n"));
    for key in [
        "remote_address: {}",
        "descriptor_key: api_key",
        "descriptor_key: path",
    ] {
        assert!(config.contains(key), "{key} missing from envoy.yaml");
    }
}
