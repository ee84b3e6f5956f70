//! The `Dockerfile`, read structurally (no Docker engine runs here): a multi-stage build with
//! `cargo build --release --locked`, a small non-root runtime, and a default command, ports,
//! user and tag that agree with the Helm chart's defaults.

use std::path::Path;

use crate::support::sluice_check;
use crate::support::yaml::{self, int_at, str_at};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Dockerfile's instructions: (KEYWORD, arguments), continuation lines joined, comments
/// and blank lines dropped.
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("a Dockerfile");
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    joined
        .into_iter()
        .map(|l| {
            let (keyword, args) = l.split_once(' ').unwrap_or((l.as_str(), ""));
            (keyword.to_ascii_uppercase(), args.trim().to_owned())
        })
        .collect()
}

/// The instructions of the last stage (after the last FROM).
fn runtime_stage(all: &[(String, String)]) -> &[(String, String)] {
    let last = all.iter().rposition(|(k, _)| k == "FROM").expect("a FROM");
    &all[last..]
}

fn args_of<'a>(stage: &'a [(String, String)], keyword: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter(|(k, _)| k == keyword)
        .map(|(_, a)| a.as_str())
        .collect()
}

/// A JSON-array (exec form) instruction's words.
fn exec_form(args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("not an exec-form array ({e}): {args}"))
}

fn chart_values() -> saphyr::Yaml<'static> {
    let text = std::fs::read_to_string(root().join("deploy/helm/sluice/values.yaml"))
        .expect("the chart's values.yaml");
    yaml::documents(&text).remove(0).yaml
}

fn chart_meta() -> saphyr::Yaml<'static> {
    let text =
        std::fs::read_to_string(root().join("deploy/helm/sluice/Chart.yaml")).expect("Chart.yaml");
    yaml::documents(&text).remove(0).yaml
}

#[test]
fn the_build_is_multi_stage_and_locked() {
    let all = instructions();
    let froms = args_of(&all, "FROM");
    assert!(
        froms.len() >= 2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(
        froms[0].contains("rust:") && froms[0].ends_with(" AS build"),
        "{froms:?}"
    );
    let build = args_of(&all, "RUN").join("\n");
    assert!(build.contains("cargo build --release --locked"), "{build}");
    // The builder is at least the crate's minimum Rust version.
    let rust = args_of(&all, "ARG")
        .iter()
        .find_map(|a| a.strip_prefix("RUST_VERSION="))
        .expect("ARG RUST_VERSION");
    let minimum = std::fs::read_to_string(root().join("Cargo.toml"))
        .expect("Cargo.toml")
        .lines()
        .find_map(|l| {
            l.strip_prefix("rust-version = ")
                .map(|v| v.trim_matches('"').to_owned())
        })
        .expect("rust-version in Cargo.toml");
    let version = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap()).collect() };
    assert!(version(rust) >= version(&minimum), "{rust} < {minimum}");
}

#[test]
fn the_runtime_is_small_non_root_and_serves_the_rules_directory() {
    let all = instructions();
    let runtime = runtime_stage(&all);
    let base = &runtime[0].1;
    assert!(
        base.starts_with("gcr.io/distroless/") && base.ends_with(":nonroot"),
        "a distroless non-root base: {base}"
    );
    // Only the binary and the demo rules come in; the binary from the build stage.
    let copies = args_of(runtime, "COPY");
    assert!(
        copies
            .iter()
            .any(|c| c.starts_with("--from=build ") && c.ends_with(" /usr/local/bin/sluice"))
    );
    for copy in copies.iter().filter(|c| !c.starts_with("--from=")) {
        let source = copy.split_whitespace().next().expect("a source");
        assert!(
            root().join(source).exists(),
            "COPY source {source} is missing"
        );
    }

    let user = args_of(runtime, "USER");
    assert_eq!(user.len(), 1);
    let uid: i64 = user[0]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric user");
    assert_ne!(uid, 0);
    let values = chart_values();
    assert_eq!(uid, int_at(&values, "podSecurityContext.runAsUser"));

    let entrypoint = exec_form(args_of(runtime, "ENTRYPOINT")[0]);
    assert_eq!(entrypoint, ["/usr/local/bin/sluice"]);
    let cmd = exec_form(args_of(runtime, "CMD")[0]);
    let mount = str_at(&values, "rules.mountPath");
    assert_eq!(cmd, ["serve", "--rules", mount]);
    assert!(
        copies
            .iter()
            .any(|c| c.ends_with(&format!(" {mount}/demo.yaml"))),
        "the image carries rules in {mount}"
    );
}

#[test]
fn ports_and_listen_addresses_match_the_chart() {
    let all = instructions();
    let runtime = runtime_stage(&all);
    let mut exposed: Vec<u16> = args_of(runtime, "EXPOSE")
        .iter()
        .flat_map(|a| a.split_whitespace())
        .map(|p| p.parse().expect("a port"))
        .collect();
    exposed.sort_unstable();
    assert_eq!(exposed, [8080, 8081]);
    let env = args_of(runtime, "ENV").join(" ");
    assert!(
        env.contains("SLUICE_SERVER__GRPC_LISTEN=0.0.0.0:8081"),
        "{env}"
    );
    assert!(
        env.contains("SLUICE_SERVER__ADMIN_LISTEN=0.0.0.0:8080"),
        "{env}"
    );
    let values = chart_values();
    assert_eq!(int_at(&values, "service.grpcPort"), 8081);
    assert_eq!(int_at(&values, "service.httpPort"), 8080);
}

#[test]
fn the_charts_default_image_is_this_one() {
    let values = chart_values();
    let meta = chart_meta();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(str_at(&meta, "appVersion"), version);
    assert_eq!(str_at(&values, "image.tag"), "");
    let repository = str_at(&values, "image.repository");
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(
        text.contains(&format!("docker build -t {repository}:{version} .")),
        "the Dockerfile documents the tag the chart pulls ({repository}:{version})"
    );
}

#[test]
fn the_build_context_leaves_out_local_outputs() {
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).expect(".dockerignore");
    let lines: Vec<&str> = ignore.lines().map(str::trim).collect();
    for needed in ["target/", ".venv/", ".tools/", ".git/"] {
        assert!(lines.contains(&needed), "{needed} not in .dockerignore");
    }
}

#[test]
fn the_images_demo_rules_pass_sluice_check() {
    sluice_check(&root().join("examples/rules/demo.yaml"));
}
