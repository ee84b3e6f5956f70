//! The Istio recipe `deploy/istio/`, checked offline: the manifests parse and agree with each
//! other and with the chart; the Envoy pieces the EnvoyFilters patch in (HTTP filter, cluster,
//! virtual-host rate_limits) are assembled into a gateway-like bootstrap that passes
//! `envoy --mode validate`; and that bootstrap, run by a real Envoy 1.40 against the real
//! sluice serving the recipe's rules ConfigMap, limits as the rules say.

use crate::support::envoy;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::upstream::Upstream;
use crate::support::yaml::{self, Doc, at, int_at, named, seq_at, str_at, string_map, to_json};
use crate::support::{sluice_check, start_sluice};
use saphyr::Yaml;
use serde_json::{Value, json};
use sluice::testing::process::{loopback, run_ok};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn istio(file: &str) -> PathBuf {
    root().join("deploy/istio").join(file)
}

fn docs(file: &str) -> Vec<Doc> {
    let text = std::fs::read_to_string(istio(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    yaml::documents(&text)
}

fn one(file: &str) -> Yaml<'static> {
    let mut docs = docs(file);
    assert_eq!(docs.len(), 1, "{file} holds one manifest");
    docs.remove(0).yaml
}

/// The patch of `filter` that applies to `apply_to`.
fn patch<'a>(filter: &'a Yaml<'static>, apply_to: &str) -> &'a Yaml<'static> {
    let patches: Vec<&Yaml<'static>> = seq_at(filter, "spec.configPatches")
        .iter()
        .filter(|p| str_at(p, "applyTo") == apply_to)
        .collect();
    assert_eq!(patches.len(), 1, "one {apply_to} patch");
    patches[0]
}

struct Recipe {
    gateway: Yaml<'static>,
    vhost: Yaml<'static>,
    rules: Yaml<'static>,
}

impl Recipe {
    fn load() -> Recipe {
        Recipe {
            gateway: one("envoyfilter-gateway.yaml"),
            vhost: one("envoyfilter-vhost.yaml"),
            rules: one("rules-configmap.yaml"),
        }
    }

    fn http_filter(&self) -> &Yaml<'static> {
        at(patch(&self.gateway, "HTTP_FILTER"), "patch.value")
    }

    fn cluster(&self) -> &Yaml<'static> {
        at(patch(&self.gateway, "CLUSTER"), "patch.value")
    }

    fn vhost_merge(&self) -> &Yaml<'static> {
        at(patch(&self.vhost, "VIRTUAL_HOST"), "patch.value")
    }

    /// The rules files of the ConfigMap, written into a directory as the volume would hold them.
    fn rules_dir(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for (file, text) in string_map(&self.rules, "data") {
            std::fs::write(dir.path().join(file), text).expect("write a rules file");
        }
        dir
    }

    /// A gateway-like bootstrap: one listener whose HTTP connection manager has the patched-in
    /// filter before the router and a `*:80` virtual host merged with the vhost patch, the
    /// patched-in cluster, and an upstream cluster. With `loopback`, the listener, admin,
    /// upstream and sluice addresses are those ports and the RPC deadline is relaxed.
    fn bootstrap(&self, loopback: Option<Ports>) -> Value {
        let mut filter = to_json(self.http_filter());
        let mut cluster = to_json(self.cluster());
        let ports = loopback.unwrap_or(Ports {
            listen: 8080,
            admin: 15000,
            upstream: 9080,
            sluice: None,
        });
        if let Some(sluice) = ports.sluice {
            let address = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            address["address"] = json!("127.0.0.1");
            address["port_value"] = json!(sluice);
            filter["typed_config"]["timeout"] = json!("5s");
        }
        let mut vhost = json!({
            "name": "*:80",
            "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app"}}],
        });
        let merge = to_json(self.vhost_merge());
        for (key, value) in merge.as_object().expect("a mapping") {
            vhost[key] = value.clone();
        }
        let address =
            |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
        json!({
            "admin": {"address": address(ports.admin)},
            "static_resources": {
                "listeners": [{
                    "name": "gateway",
                    "address": address(ports.listen),
                    "filter_chains": [{"filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "gateway",
                            "use_remote_address": true,
                            "route_config": {"name": "http.80", "virtual_hosts": [vhost]},
                            "http_filters": [filter, {
                                "name": "envoy.filters.http.router",
                                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                            }],
                        },
                    }]}],
                }],
                "clusters": [cluster, {
                    "name": "app",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {"cluster_name": "app", "endpoints": [{"lb_endpoints": [{
                        "endpoint": {"address": address(ports.upstream)},
                    }]}]},
                }],
            },
        })
    }
}

#[derive(Clone, Copy)]
struct Ports {
    listen: u16,
    admin: u16,
    upstream: u16,
    sluice: Option<u16>,
}

#[test]
fn the_envoy_filters_patch_the_gateway_as_the_usual_recipe_does() {
    let recipe = Recipe::load();
    for filter in [&recipe.gateway, &recipe.vhost] {
        assert_eq!(str_at(filter, "apiVersion"), "networking.istio.io/v1alpha3");
        assert_eq!(str_at(filter, "kind"), "EnvoyFilter");
        assert_eq!(str_at(filter, "metadata.namespace"), "istio-system");
        assert_eq!(
            str_at(filter, "spec.workloadSelector.labels.istio"),
            "ingressgateway"
        );
    }
    let http = patch(&recipe.gateway, "HTTP_FILTER");
    assert_eq!(str_at(http, "match.context"), "GATEWAY");
    assert_eq!(
        str_at(http, "match.listener.filterChain.filter.subFilter.name"),
        "envoy.filters.http.router"
    );
    assert_eq!(str_at(http, "patch.operation"), "INSERT_BEFORE");
    let filter = recipe.http_filter();
    assert_eq!(str_at(filter, "name"), "envoy.filters.http.ratelimit");
    assert_eq!(
        str_at(
            filter,
            "typed_config.rate_limit_service.grpc_service.envoy_grpc.cluster_name"
        ),
        str_at(recipe.cluster(), "name")
    );
    assert_eq!(
        str_at(patch(&recipe.gateway, "CLUSTER"), "patch.operation"),
        "ADD"
    );
    assert_eq!(
        str_at(patch(&recipe.vhost, "VIRTUAL_HOST"), "patch.operation"),
        "MERGE"
    );
    assert!(
        at(recipe.cluster(), "typed_extension_protocol_options")
            .as_mapping()
            .is_some_and(|m| !m.is_empty()),
        "the sluice cluster must speak HTTP/2"
    );
    // The descriptors' keys are the rules' keys, in the filter's domain.
    let rules_text = &string_map(&recipe.rules, "data")[0].1;
    let domain = str_at(filter, "typed_config.domain");
    assert!(rules_text.contains(&format!("domain: {domain}\n")));
    for entry in seq_at(recipe.vhost_merge(), "rate_limits") {
        let action = at(entry, "actions.0");
        let key = yaml::opt(action, "request_headers.descriptor_key")
            .and_then(Yaml::as_str)
            .unwrap_or("remote_address");
        assert!(
            rules_text.contains(&format!("key: {key}\n")),
            "no rule for {key}"
        );
    }
}

#[test]
fn the_cluster_points_at_the_charts_service_and_the_chart_mounts_the_rules() {
    let recipe = Recipe::load();
    let endpoint = at(
        recipe.cluster(),
        "load_assignment.endpoints.0.lb_endpoints.0.endpoint.address.socket_address",
    );
    let host = str_at(endpoint, "address");
    let port = int_at(endpoint, "port_value");
    let (service, namespace) = host
        .strip_suffix(".svc.cluster.local")
        .and_then(|s| s.split_once('.'))
        .unwrap_or_else(|| panic!("{host} is not a Service's DNS name"));
    assert_eq!(str_at(&recipe.rules, "metadata.namespace"), namespace);

    // The chart installed as its values file says: the Service and the ConfigMap meet.
    let helm = root().join(".tools/helm/helm");
    assert!(helm.is_file(), "helm is missing: run ./tests/run");
    let out = run_ok(
        Command::new(helm)
            .args(["template", "sluice", "--namespace", namespace])
            .arg(root().join("deploy/helm/sluice"))
            .arg("-f")
            .arg(istio("sluice-values.yaml")),
        "helm template",
    );
    let rendered = yaml::documents(&String::from_utf8(out.stdout).expect("UTF-8"));
    let find = |kind: &str| {
        &rendered
            .iter()
            .find(|d| d.kind() == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
            .yaml
    };
    let svc = find("Service");
    assert_eq!(str_at(svc, "metadata.name"), service);
    assert_eq!(str_at(svc, "metadata.namespace"), namespace);
    assert_eq!(int_at(named(svc, "spec.ports", "grpc"), "port"), port);
    let pod = at(find("Deployment"), "spec.template.spec");
    assert_eq!(
        str_at(named(pod, "volumes", "rules"), "configMap.name"),
        str_at(&recipe.rules, "metadata.name")
    );
    assert!(rendered.iter().all(|d| d.kind() != "ConfigMap"));
}

#[test]
fn the_rules_config_map_is_valid() {
    let validate = root().join(".venv/bin/kubernetes-validate");
    assert!(
        validate.is_file(),
        "kubernetes-validate is missing: run ./tests/run"
    );
    let out = Command::new(validate)
        .args(["--strict", "--quiet"])
        .arg(istio("rules-configmap.yaml"))
        .output()
        .expect("run kubernetes-validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let dir = Recipe::load().rules_dir();
    sluice_check(dir.path());
}

#[test]
fn every_istio_file_parses() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/istio"))
        .expect("deploy/istio")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!docs(&name).is_empty(), "{name} holds no manifest");
    }
}

#[test]
fn the_patched_envoy_pieces_pass_envoy_validate() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("gateway.json");
    let bootstrap = Recipe::load().bootstrap(None);
    std::fs::write(&file, serde_json::to_string_pretty(&bootstrap).unwrap()).expect("write");
    envoy::validate(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipe_limits_through_a_real_envoy() {
    let recipe = Recipe::load();
    let rules = recipe.rules_dir();
    let upstream = Upstream::start().await;
    let mut sluice = start_sluice(rules.path(), &[]).await;
    // Envoy's listener and admin on ports from the kernel, read back once it runs.
    let ports = Ports {
        listen: 0,
        admin: 0,
        upstream: upstream.port,
        sluice: Some(sluice.port),
    };
    let config = serde_json::to_string_pretty(&recipe.bootstrap(Some(ports))).unwrap();
    // Envoy reads JSON as YAML.
    let envoy = envoy::EnvoyProcess::start(&config).await;
    let gateway = loopback(envoy.port("gateway"));

    // /login: 2 per minute (one every 30 s).
    for left in ["1", "0"] {
        let answer = sluice::testing::http::get(gateway, "/login").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.header("x-ratelimit-remaining"), Some(left));
    }
    let over = sluice::testing::http::get(gateway, "/login").await;
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(over.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(over.header("x-ratelimit-reset"), Some("30"));
    // A path without a rule passes (only the client address limit applies).
    for _ in 0..4 {
        let answer = sluice::testing::http::get(gateway, "/about").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.header("x-ratelimit-limit"), Some("20, 20;w=1"));
    }
    // failure_mode_deny: true, as in the recipe.
    sluice.stop();
    assert_eq!(
        sluice::testing::http::get(gateway, "/about").await.status,
        500
    );
}
