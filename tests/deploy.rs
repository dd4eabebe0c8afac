//! `deploy/` (kustomize) and the Containerfile, checked against the code they deploy.
//!
//! - `kubectl kustomize deploy/` (certificates from cert-manager) and
//!   `deploy/overlays/allot-certs` (after its `certs.sh`, in a copy of the tree) render; every
//!   object parses as its Kubernetes type without losing a field (a misspelt field fails), and
//!   an unexpected kind fails.
//! - The Deployment meets the restricted Pod Security profile, runs `allot serve` with the
//!   paths its volumes provide, and its probes and Services name the ports `allot serve` listens
//!   on by default.
//! - The policies ConfigMap is exactly `policies/` and loads; the webhook configurations are
//!   exactly what `allot webhooks` prints (modulo caBundle and cert-manager's annotation);
//!   `components/native-covers` is exactly `allot compile` plus `allot webhooks --native-covers`.
//! - RBAC both ways: the real controller code (gang controller, Namespace watch) runs against a
//!   fake API server that records every request; each request must be granted by the rendered
//!   roles, and each granted (verb, resource) must have been requested.
//! - With the envtest binaries: the rendered objects apply to a real kube-apiserver without a
//!   warning, and its RBAC authorizer grants every recorded request.
//! - A certificate and policy update delivered the way the kubelet updates Secret and ConfigMap
//!   volumes (the `..data` symlink swap) reaches a running `allot serve` without a restart.
//!
//! The kustomize binary is `$KUBECTL` (a kubectl with built-in kustomize) or `kubectl` on PATH;
//! without one the rendering tests print SKIPPED. `.ci/run` installs one.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use allot::control::gang::controller::{ControllerConfig, OWNER_APIS};
use allot::model::gang::membership::InferredKind;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Secret, Service, ServiceAccount, ServicePort,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::cluster::{ControlPlane, binaries_from_env};
use support::fake_api::{self, Call, FakeApi, classify, gated_pod};
use support::skipped;

const NAMESPACE: &str = "allot-system";
const SERVICE_ACCOUNT: &str = "allot";
const LEASE: &str = "allot-gang-controller";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn allot_bin() -> &'static str {
    env!("CARGO_BIN_EXE_allot")
}

// ---------------------------------------------------------------------------------------------
// Rendering

/// `$KUBECTL`, or `kubectl` on PATH. A `KUBECTL` that does not run is an error, not a skip.
fn kubectl() -> Option<PathBuf> {
    static KUBECTL: OnceLock<Option<PathBuf>> = OnceLock::new();
    KUBECTL
        .get_or_init(|| {
            let runs =
                |p: &Path| Command::new(p).args(["version", "--client"]).output().is_ok_and(|o| o.status.success());
            if let Some(p) = std::env::var_os("KUBECTL").filter(|p| !p.is_empty()) {
                let p = PathBuf::from(p);
                assert!(runs(&p), "KUBECTL={} does not run `kubectl version --client`", p.display());
                return Some(p);
            }
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path).map(|d| d.join("kubectl")).find(|p| p.is_file() && runs(p))
        })
        .clone()
}

fn kubectl_or_skip(test: &str) -> Option<PathBuf> {
    let k = kubectl();
    if k.is_none() {
        skipped(
            test,
            "needs kubectl with built-in kustomize: set KUBECTL or put kubectl on PATH (.ci/run installs one)",
        );
    }
    k
}

fn kustomize(kubectl: &Path, dir: &Path) -> String {
    let out = Command::new(kubectl).arg("kustomize").arg(dir).output().expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Copies `deploy/` into a temporary directory without anything certs.sh writes, runs the
/// overlay's certs.sh there with the allot binary under test, and returns the copy's root.
fn allot_certs_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&root().join("deploy"), &dir.path().join("deploy"), &|from, name| {
        from.ends_with("overlays/allot-certs") && (name == "certs" || name == "webhooks-ca.yaml")
    });
    let script = dir.path().join("deploy/overlays/allot-certs/certs.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("ALLOT", allot_bin())
        .current_dir(dir.path())
        .output()
        .expect("run certs.sh");
    assert!(
        out.status.success(),
        "certs.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Copies the directory `from` to `to`, leaving out the entries `skip(dir, name)` names.
fn copy_tree(from: &Path, to: &Path, skip: &dyn Fn(&Path, &std::ffi::OsStr) -> bool) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if skip(from, &name) {
            continue;
        }
        let ty = entry.file_type().unwrap();
        if ty.is_dir() {
            copy_tree(&entry.path(), &to.join(&name), skip);
        } else if ty.is_file() {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// `kubectl kustomize deploy/`, parsed (once per test binary).
fn root_render(kubectl: &Path) -> &'static Rendered {
    static R: OnceLock<Rendered> = OnceLock::new();
    R.get_or_init(|| Rendered::parse(&kustomize(kubectl, &root().join("deploy")), "deploy/"))
}

/// The allot-certs overlay rendered in a copy of the tree after its certs.sh, with the CA.
struct OverlayRender {
    rendered: Rendered,
    text: String,
    ca_crt: Vec<u8>,
    tls_crt: Vec<u8>,
    tls_key: Vec<u8>,
}

fn overlay_render(kubectl: &Path) -> &'static OverlayRender {
    static R: OnceLock<OverlayRender> = OnceLock::new();
    R.get_or_init(|| {
        let tree = allot_certs_tree();
        let overlay = tree.path().join("deploy/overlays/allot-certs");
        let text = kustomize(kubectl, &overlay);
        let read = |f: &str| std::fs::read(overlay.join("certs").join(f)).unwrap();
        OverlayRender {
            rendered: Rendered::parse(&text, "deploy/overlays/allot-certs"),
            text,
            ca_crt: read("ca.crt"),
            tls_crt: read("tls.crt"),
            tls_key: read("tls.key"),
        }
    })
}

/// `deploy/` with the cert-manager and native-covers components, as a user's kustomization
/// names them (rendered in a copy of the tree: kustomize takes no absolute paths).
fn native_render(kubectl: &Path) -> &'static Rendered {
    static R: OnceLock<Rendered> = OnceLock::new();
    R.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&root().join("deploy"), &dir.path().join("deploy"), &|_, _| false);
        let user = dir.path().join("deploy/native");
        std::fs::create_dir_all(&user).unwrap();
        std::fs::write(
            user.join("kustomization.yaml"),
            "resources: [../base]\ncomponents: [../components/cert-manager, ../components/native-covers]\n",
        )
        .unwrap();
        Rendered::parse(&kustomize(kubectl, &user), "deploy/ + components/native-covers")
    })
}

/// `allot compile --policies policies/`: the native objects, by (kind, name).
fn allot_compile() -> BTreeMap<(String, String), Value> {
    let out = Command::new(allot_bin()).args(["compile", "--policies"]).arg(root().join("policies")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).map(|d| (kind_and_name(&d), d)).collect()
}

fn kind_and_name(o: &Value) -> (String, String) {
    (o["kind"].as_str().unwrap_or_default().to_string(), o["metadata"]["name"].as_str().unwrap_or_default().to_string())
}

/// The objects of one rendering, each already checked against its Kubernetes type.
struct Rendered {
    what: String,
    objects: Vec<Value>,
}

impl Rendered {
    fn parse(text: &str, what: &str) -> Rendered {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{what}: YAML: {e}"));
        let objects: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        assert!(!objects.is_empty(), "{what} rendered nothing");
        for o in &objects {
            check_typed(o, what);
        }
        Rendered { what: what.to_string(), objects }
    }

    fn raw(&self, api_version: &str, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["apiVersion"] == api_version && o["kind"] == kind).collect()
    }

    fn all<T: k8s_openapi::Resource + DeserializeOwned>(&self) -> Vec<T> {
        self.raw(T::API_VERSION, T::KIND).into_iter().map(|o| from_value(o)).collect()
    }

    fn one<T: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta> + DeserializeOwned>(
        &self,
        name: &str,
    ) -> T {
        let mut found: Vec<T> =
            self.all::<T>().into_iter().filter(|o| o.metadata().name.as_deref() == Some(name)).collect();
        assert_eq!(found.len(), 1, "{}: expected one {} {name}", self.what, T::KIND);
        found.remove(0)
    }

    /// (kind, namespace, name) of every object.
    fn inventory(&self) -> BTreeSet<(String, String, String)> {
        self.objects
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap_or_default().to_string(),
                    o["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                    o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}

/// Kustomize wraps long base64 values over several lines (the API server's decoder skips the
/// newlines, k8s-openapi's does not).
fn normalize(o: &Value) -> Value {
    let mut o = o.clone();
    if o["kind"] == "Secret"
        && let Some(data) = o.get_mut("data").and_then(Value::as_object_mut)
    {
        for v in data.values_mut() {
            if let Some(s) = v.as_str() {
                *v = Value::String(s.split_whitespace().collect());
            }
        }
    }
    o
}

fn from_value<T: DeserializeOwned>(o: &Value) -> T {
    serde_json::from_value(normalize(o)).unwrap_or_else(|e| panic!("{}: {e}", describe(o)))
}

fn describe(o: &Value) -> String {
    format!(
        "{} {}/{}",
        o["kind"].as_str().unwrap_or("?"),
        o["metadata"]["namespace"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Parses `o` as `T` and back: a field `T` does not know (a typo, a field of another version)
/// would be dropped on the way, and fails the test.
fn round_trip<T: DeserializeOwned + Serialize>(o: &Value, what: &str) {
    let o = normalize(o);
    let typed: T = serde_json::from_value(o.clone()).unwrap_or_else(|e| panic!("{what}: {}: {e}", describe(&o)));
    let back = serde_json::to_value(&typed).unwrap();
    let mut lost = Vec::new();
    lost_fields(&o, &back, String::new(), &mut lost);
    assert!(lost.is_empty(), "{what}: {}: fields its Kubernetes type does not have: {lost:?}", describe(&o));
}

fn lost_fields(original: &Value, back: &Value, path: String, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => lost_fields(va, vb, format!("{path}.{k}"), out),
                    None if va.is_null() => {}
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                lost_fields(va, vb, format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        _ => out.push(format!("{path} ({original} became {back})")),
    }
}

/// The NetworkPolicy selects Allot's pods, admits exactly the webhook and metrics container
/// ports (an address block on the webhook port: the API server is not a pod; Prometheus by
/// namespace and pod labels on the metrics port), and nothing else.
fn check_network_policy(r: &Rendered, deployment: &Deployment) {
    let what = &r.what;
    let policy: NetworkPolicy = r.one("allot");
    let spec = policy.spec.expect("NetworkPolicy spec");
    let pod_labels = deployment.spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    let selector = spec.pod_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
    assert!(
        !selector.is_empty() && labels_match(&selector, &pod_labels),
        "{what}: selects {selector:?}, pods have {pod_labels:?}"
    );
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string()][..]), "{what}");
    let container = &deployment.spec.template.spec.as_ref().unwrap().containers[0];
    let port_named = |name: &str| {
        container.ports.iter().flatten().find(|p| p.name.as_deref() == Some(name)).map(|p| p.container_port)
    };
    let (https, metrics) = (port_named("https").unwrap(), port_named("metrics").unwrap());
    let rules = spec.ingress.unwrap_or_default();
    assert_eq!(rules.len(), 2, "{what}: one rule for the API server, one for Prometheus");
    let mut seen = Vec::new();
    for rule in &rules {
        let ports: Vec<i32> =
            rule.ports.iter().flatten().map(|p| container_port(container, p.port.as_ref().unwrap())).collect();
        let from = rule.from.clone().unwrap_or_default();
        assert_eq!(from.len(), 1, "{what}: {rule:?}");
        if ports == [https] {
            assert!(
                from[0].ip_block.is_some() && from[0].pod_selector.is_none(),
                "{what}: the API server is matched by address"
            );
        } else if ports == [metrics] {
            assert!(
                from[0].namespace_selector.is_some() && from[0].pod_selector.is_some() && from[0].ip_block.is_none(),
                "{what}: Prometheus is matched by namespace and pod labels"
            );
        } else {
            panic!("{what}: a rule for ports {ports:?}; the container listens on {https} and {metrics}");
        }
        seen.extend(ports);
    }
    seen.sort();
    let mut want = vec![https, metrics];
    want.sort();
    assert_eq!(seen, want, "{what}");
}

/// Every rendered object is one of the kinds Allot ships, and parses as its type.
fn check_typed(o: &Value, what: &str) {
    let api_version = o["apiVersion"].as_str().unwrap_or_default();
    let kind = o["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<Namespace>(o, what),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(o, what),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(o, what),
        ("v1", "Secret") => round_trip::<Secret>(o, what),
        ("v1", "Service") => round_trip::<Service>(o, what),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(o, what),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => round_trip::<ClusterRoleBinding>(o, what),
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(o, what),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(o, what),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(o, what),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<PodDisruptionBudget>(o, what),
        ("networking.k8s.io/v1", "NetworkPolicy") => round_trip::<NetworkPolicy>(o, what),
        ("scheduling.k8s.io/v1", "PriorityClass") => round_trip::<PriorityClass>(o, what),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            round_trip::<MutatingWebhookConfiguration>(o, what)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            round_trip::<ValidatingWebhookConfiguration>(o, what)
        }
        ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy") => {
            round_trip::<MutatingAdmissionPolicy>(o, what)
        }
        ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding") => {
            round_trip::<MutatingAdmissionPolicyBinding>(o, what)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            round_trip::<ValidatingAdmissionPolicy>(o, what)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            round_trip::<ValidatingAdmissionPolicyBinding>(o, what)
        }
        ("cert-manager.io/v1", "Issuer" | "Certificate") => {
            let d: kube::api::DynamicObject =
                serde_json::from_value(o.clone()).unwrap_or_else(|e| panic!("{what}: {}: {e}", describe(o)));
            assert!(d.metadata.name.is_some(), "{what}: {} has no name", describe(o));
            check_cert_manager_fields(o, what);
        }
        _ => panic!("{what}: unexpected object {api_version} {kind} ({})", describe(o)),
    }
}

/// cert-manager has no Rust types here: its fields are checked against the v1 API by name.
fn check_cert_manager_fields(o: &Value, what: &str) {
    let spec = o["spec"].as_object().unwrap_or_else(|| panic!("{what}: {} has no spec", describe(o)));
    let allowed: &[&str] = match o["kind"].as_str() {
        Some("Issuer") => &["selfSigned", "ca", "acme", "vault", "venafi"],
        _ => &[
            "secretName",
            "secretTemplate",
            "commonName",
            "literalSubject",
            "subject",
            "dnsNames",
            "ipAddresses",
            "uris",
            "emailAddresses",
            "otherNames",
            "duration",
            "renewBefore",
            "renewBeforePercentage",
            "isCA",
            "usages",
            "privateKey",
            "issuerRef",
            "keystores",
            "encodeUsagesInRequest",
            "revisionHistoryLimit",
            "additionalOutputFormats",
            "nameConstraints",
        ],
    };
    for key in spec.keys() {
        assert!(allowed.contains(&key.as_str()), "{what}: {}: unknown field spec.{key}", describe(o));
    }
    if let Some(pk) = spec.get("privateKey").and_then(Value::as_object) {
        for key in pk.keys() {
            assert!(
                ["algorithm", "size", "encoding", "rotationPolicy"].contains(&key.as_str()),
                "{what}: {}: unknown field spec.privateKey.{key}",
                describe(o)
            );
        }
    }
    if let Some(usages) = spec.get("usages").and_then(Value::as_array) {
        for u in usages {
            assert!(
                ["digital signature", "key encipherment", "server auth", "client auth", "cert sign"]
                    .contains(&u.as_str().unwrap_or_default()),
                "{what}: {}: unknown usage {u}",
                describe(o)
            );
        }
    }
}

fn labels_match(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

// ---------------------------------------------------------------------------------------------
// The install: objects, Deployment, Services

/// The default of one `allot serve` flag, as `allot serve --help` prints it.
fn serve_default(flag: &str) -> String {
    let out = Command::new(allot_bin()).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let at = help.find(flag).unwrap_or_else(|| panic!("no {flag} in allot serve --help:\n{help}"));
    let rest = &help[at..];
    let start = rest.find("[default: ").unwrap_or_else(|| panic!("no default for {flag}")) + "[default: ".len();
    rest[start..start + rest[start..].find(']').unwrap()].to_string()
}

fn port_of(addr: &str) -> i32 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// A probe's or Service's port, resolved against the container's ports.
fn container_port(container: &Container, port: &IntOrString) -> i32 {
    let ports = container.ports.clone().unwrap_or_default();
    match port {
        IntOrString::Int(n) => {
            assert!(ports.iter().any(|p| p.container_port == *n), "port {n} is not a container port");
            *n
        }
        IntOrString::String(name) => {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

fn check_install(r: &Rendered) {
    let what = &r.what;
    // What is shipped, and nothing else (cert-manager objects and the Secret vary by variant).
    for (kind, ns, name) in [
        ("Namespace", "", NAMESPACE),
        ("ServiceAccount", NAMESPACE, SERVICE_ACCOUNT),
        ("ClusterRole", "", "allot"),
        ("ClusterRoleBinding", "", "allot"),
        ("Role", NAMESPACE, "allot"),
        ("RoleBinding", NAMESPACE, "allot"),
        ("Deployment", NAMESPACE, "allot"),
        ("PodDisruptionBudget", NAMESPACE, "allot"),
        ("Service", NAMESPACE, "allot"),
        ("Service", NAMESPACE, "allot-metrics"),
        ("NetworkPolicy", NAMESPACE, "allot"),
        ("PriorityClass", "", "low-priority"),
        ("PriorityClass", "", "high-priority"),
        ("MutatingWebhookConfiguration", "", "allot"),
        ("ValidatingWebhookConfiguration", "", "allot"),
    ] {
        assert!(
            r.inventory().contains(&(kind.to_string(), ns.to_string(), name.to_string())),
            "{what}: no {kind} {ns}/{name}"
        );
    }
    // Every namespaced object is in Allot's namespace, and everything but the two webhook
    // configurations (which are `allot webhooks` verbatim) carries part-of=allot, so that
    // `kubectl apply -k … -l app.kubernetes.io/part-of=allot` installs Allot before its webhooks.
    for o in &r.objects {
        let kind = o["kind"].as_str().unwrap();
        // The native policies of components/native-covers are `allot compile` verbatim: like
        // the webhook configurations, applied in the second step.
        let verbatim = kind.ends_with("WebhookConfiguration") || kind.contains("AdmissionPolicy");
        let cluster_scoped =
            verbatim || matches!(kind, "Namespace" | "ClusterRole" | "ClusterRoleBinding" | "PriorityClass");
        if cluster_scoped {
            assert!(o["metadata"]["namespace"].is_null(), "{what}: {} has a namespace", describe(o));
        } else {
            assert_eq!(o["metadata"]["namespace"], NAMESPACE, "{what}: {}", describe(o));
        }
        let part_of = &o["metadata"]["labels"]["app.kubernetes.io/part-of"];
        if verbatim {
            assert!(part_of.is_null(), "{what}: {} must stay as `allot webhooks` prints it", describe(o));
        } else {
            assert_eq!(part_of, "allot", "{what}: {} lacks app.kubernetes.io/part-of=allot", describe(o));
        }
    }
    let ns: Namespace = r.one(NAMESPACE);
    let ns_labels = ns.metadata.labels.unwrap_or_default();
    assert_eq!(ns_labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("restricted"));

    let deployment: Deployment = r.one("allot");
    check_network_policy(r, &deployment);
    let spec = deployment.spec.clone();
    assert_eq!(spec.replicas, Some(2), "{what}: two replicas: both webhooks fail closed");
    let rolling = spec.strategy.as_ref().and_then(|s| s.rolling_update.clone()).expect("a rolling update strategy");
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)), "{what}: never fewer replicas during an upgrade");
    let template_labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    assert!(labels_match(&spec.selector.match_labels.clone().unwrap_or_default(), &template_labels));
    let pod = spec.template.spec.clone().unwrap();
    check_pod_security(&pod, what);
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    assert_eq!(pod.automount_service_account_token, Some(true), "{what}: the controller needs its token");
    let sa: ServiceAccount = r.one(SERVICE_ACCOUNT);
    assert_ne!(sa.automount_service_account_token, Some(false));
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
    let spread = pod.topology_spread_constraints.clone().unwrap_or_default();
    let keys: BTreeSet<&str> = spread.iter().map(|c| c.topology_key.as_str()).collect();
    assert_eq!(keys, BTreeSet::from(["kubernetes.io/hostname", "topology.kubernetes.io/zone"]), "{what}");
    for c in &spread {
        let sel = c.label_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
        assert!(labels_match(&sel, &template_labels), "{what}: spread selector {sel:?} selects no replica");
        if c.topology_key == "topology.kubernetes.io/zone" {
            assert_eq!(c.when_unsatisfiable, "ScheduleAnyway", "{what}: single-zone clusters must still schedule");
        }
    }

    let [container] = pod.containers.as_slice() else { panic!("{what}: one container") };
    let image = container.image.clone().unwrap_or_default();
    assert_eq!(image, format!("allot:{}", env!("CARGO_PKG_VERSION")), "{what}: image tag = crate version");
    let args = container.args.clone().unwrap_or_default();
    assert!(container.command.is_none(), "{what}: the image's ENTRYPOINT is allot");
    assert_eq!(
        args,
        [
            "serve",
            "--policies",
            "/etc/allot/policies",
            "--tls-cert",
            "/etc/allot/tls/tls.crt",
            "--tls-key",
            "/etc/allot/tls/tls.key",
        ],
        "{what}"
    );
    // No identity is written down: `allot serve` asks the API server who it is (the Pod's
    // ServiceAccount), so an overlay that moves or renames it needs no flag.
    assert!(!args.iter().any(|a| a.contains("allot-username")), "{what}: {args:?}");
    assert!(!container.env.iter().flatten().any(|e| e.name == "ALLOT_USERNAME"), "{what}");
    let env: BTreeMap<String, String> = container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| Some((e.name, e.value_from?.field_ref?.field_path)))
        .collect();
    assert_eq!(env.get("POD_NAMESPACE").map(String::as_str), Some("metadata.namespace"), "{what}");
    assert_eq!(env.get("POD_NAME").map(String::as_str), Some("metadata.name"), "{what}");

    // Ports and probes against what `allot serve` listens on.
    let https = port_of(&serve_default("--addr"));
    let metrics = port_of(&serve_default("--metrics-addr"));
    assert_eq!((https, metrics), (8443, 9090));
    assert_eq!(container_port(container, &IntOrString::String("https".into())), https);
    assert_eq!(container_port(container, &IntOrString::String("metrics".into())), metrics);
    for (probe, path) in [(&container.readiness_probe, "/readyz"), (&container.liveness_probe, "/healthz")] {
        let get = probe.as_ref().and_then(|p| p.http_get.clone()).unwrap_or_else(|| panic!("{what}: {path} probe"));
        assert_eq!(get.path.as_deref(), Some(path), "{what}");
        assert_eq!(container_port(container, &get.port), metrics, "{what}: {path} is served on the metrics port");
        assert!(get.scheme.is_none() || get.scheme.as_deref() == Some("HTTP"), "{what}: the metrics port is HTTP");
    }
    let resources = container.resources.clone().unwrap_or_default();
    for name in ["cpu", "memory"] {
        let request = resources.requests.as_ref().and_then(|r| r.get(name)).map(|q| q.0.clone());
        let limit = resources.limits.as_ref().and_then(|r| r.get(name)).map(|q| q.0.clone());
        assert!(request.is_some() && limit.is_some(), "{what}: {name} request and limit");
    }

    // Volumes: the paths in the arguments come from the ConfigMap and the Secret.
    let mounts: BTreeMap<String, String> =
        container.volume_mounts.clone().unwrap_or_default().into_iter().map(|m| (m.name, m.mount_path)).collect();
    assert_eq!(mounts.get("policies").map(String::as_str), Some("/etc/allot/policies"), "{what}");
    assert_eq!(mounts.get("tls").map(String::as_str), Some("/etc/allot/tls"), "{what}");
    let volumes = pod.volumes.clone().unwrap_or_default();
    let policies = volumes.iter().find(|v| v.name == "policies").and_then(|v| v.config_map.clone()).unwrap();
    let config_maps: Vec<ConfigMap> = r.all();
    assert_eq!(config_maps.len(), 1, "{what}: one ConfigMap");
    assert_eq!(config_maps[0].metadata.name, Some(policies.name.clone()), "{what}: the volume names the ConfigMap");
    assert!(policies.name.starts_with("allot-policies-"), "{what}: the generated name carries a content hash");
    let tls = volumes.iter().find(|v| v.name == "tls").and_then(|v| v.secret.clone()).unwrap();
    assert_eq!(tls.secret_name.as_deref(), Some("allot-tls"), "{what}");

    // Services and the PDB select the replicas; the webhook Service reaches the HTTPS port.
    let svc: Service = r.one("allot");
    let svc_spec = svc.spec.unwrap();
    assert!(labels_match(&svc_spec.selector.clone().unwrap_or_default(), &template_labels), "{what}");
    let ports: Vec<ServicePort> = svc_spec.ports.unwrap_or_default();
    let p443 = ports.iter().find(|p| p.port == 443).expect("Service allot port 443");
    assert_eq!(container_port(container, p443.target_port.as_ref().unwrap()), https, "{what}");
    let metrics_svc: Service = r.one("allot-metrics");
    let metrics_spec = metrics_svc.spec.unwrap();
    assert!(labels_match(&metrics_spec.selector.clone().unwrap_or_default(), &template_labels), "{what}");
    let ports = metrics_spec.ports.unwrap_or_default();
    assert!(
        ports.iter().any(|p| p.target_port.as_ref().is_some_and(|t| container_port(container, t) == metrics)),
        "{what}: allot-metrics reaches the metrics port"
    );
    let pdb: PodDisruptionBudget = r.one("allot");
    let pdb_spec = pdb.spec.unwrap();
    assert_eq!(pdb_spec.min_available, Some(IntOrString::Int(1)), "{what}");
    let pdb_sel = pdb_spec.selector.and_then(|s| s.match_labels).unwrap_or_default();
    assert!(labels_match(&pdb_sel, &template_labels), "{what}: the PDB selects the replicas");

    // The webhooks call that Service on port 443.
    let m: MutatingWebhookConfiguration = r.one("allot");
    let v: ValidatingWebhookConfiguration = r.one("allot");
    let services = m
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config.service)
        .chain(v.webhooks.unwrap_or_default().into_iter().map(|w| w.client_config.service));
    for s in services {
        let s = s.expect("an in-cluster service reference");
        assert_eq!((s.namespace.as_str(), s.name.as_str(), s.port), (NAMESPACE, "allot", Some(443)), "{what}");
    }

    // The PriorityClasses the shipped policies name exist.
    let classes: BTreeMap<String, PriorityClass> =
        r.all::<PriorityClass>().into_iter().map(|p| (p.metadata.name.clone().unwrap(), p)).collect();
    assert_eq!(classes["low-priority"].value, Some(0));
    assert_eq!(classes["low-priority"].global_default, Some(true));
    assert_eq!(classes["high-priority"].value, Some(1_000_000));
    assert_ne!(classes["high-priority"].global_default, Some(true));
    for class in priority_classes_in_policies() {
        assert!(classes.contains_key(&class), "{what}: policies/ name PriorityClass {class}, which deploy/ lacks");
    }
}

/// Every PriorityClass name the shipped policies mention (`priority:` blocks).
fn priority_classes_in_policies() -> BTreeSet<String> {
    fn walk(v: &Value, in_priority: bool, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if in_priority && matches!(k.as_str(), "default" | "globalDefault") {
                        out.extend(v.as_str().map(String::from));
                    } else if in_priority && k == "allowed" {
                        out.extend(v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(String::from)));
                    } else {
                        walk(v, k == "priority", out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, false, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for (_, text) in policy_files() {
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        docs.iter().for_each(|d| walk(d, false, &mut out));
    }
    assert!(out.contains("low-priority"), "the shipped policies use low-priority: {out:?}");
    out
}

/// The restricted Pod Security Standard, and the fixed non-root uid of the image.
fn check_pod_security(pod: &PodSpec, what: &str) {
    let psc = pod.security_context.clone().unwrap_or_default();
    assert_eq!(psc.run_as_non_root, Some(true), "{what}: pod runAsNonRoot");
    assert_eq!(psc.run_as_user, Some(65532), "{what}: pod runAsUser (the image's USER)");
    let pod_seccomp = psc.seccomp_profile.as_ref().map(|s| s.type_.clone());
    assert_eq!(pod_seccomp.as_deref(), Some("RuntimeDefault"), "{what}: pod seccompProfile");
    assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none(), "{what}");
    let containers = pod.containers.iter().chain(pod.init_containers.iter().flatten());
    for c in containers {
        let sc = c.security_context.clone().unwrap_or_else(|| panic!("{what}: container {} securityContext", c.name));
        assert_ne!(sc.run_as_non_root, Some(false), "{what}: {}", c.name);
        assert!(sc.run_as_user.is_none_or(|u| u == 65532), "{what}: {} runAsUser", c.name);
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}: {} readOnlyRootFilesystem", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}: {} allowPrivilegeEscalation", c.name);
        assert_ne!(sc.privileged, Some(true), "{what}: {} privileged", c.name);
        let caps = sc.capabilities.clone().unwrap_or_default();
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{what}: {} drops ALL capabilities", c.name);
        assert!(caps.add.unwrap_or_default().is_empty(), "{what}: {} adds no capability", c.name);
        let seccomp = sc.seccomp_profile.map(|s| s.type_).or(pod_seccomp.clone());
        assert_eq!(seccomp.as_deref(), Some("RuntimeDefault"), "{what}: {} seccompProfile", c.name);
        for p in c.ports.iter().flatten() {
            assert!(p.host_port.is_none(), "{what}: {} hostPort", c.name);
        }
    }
    for v in pod.volumes.iter().flatten() {
        assert!(v.host_path.is_none(), "{what}: hostPath volume {}", v.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Policies and webhooks: one source of truth

/// (file name, content) of the shipped policies/.
fn policy_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root().join("policies")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        assert!(path.is_file(), "policies/{name}: a ConfigMap holds no directories (see deploy/sync.sh)");
        if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
            files.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
    files.sort();
    files
}

fn check_policies_config_map(r: &Rendered) {
    let cms: Vec<ConfigMap> = r.all();
    let data = cms[0].data.clone().unwrap_or_default();
    assert!(cms[0].binary_data.is_none());
    let shipped: BTreeMap<String, String> = policy_files().into_iter().collect();
    let keys: BTreeSet<&String> = data.keys().collect();
    assert_eq!(
        keys,
        shipped.keys().collect(),
        "{}: the policies ConfigMap holds other files than policies/; run deploy/sync.sh",
        r.what
    );
    for (name, text) in &shipped {
        assert!(
            data[name] == *text,
            "{}: {name} in the policies ConfigMap differs from policies/{name}; run deploy/sync.sh",
            r.what
        );
    }
    // What the pods will mount loads as a policy set.
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &data {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let set = allot::model::policy::load_dir(dir.path())
        .unwrap_or_else(|e| panic!("{}: the ConfigMap's policies: {e}", r.what));
    assert_eq!(
        set.summary(),
        allot::model::policy::load_dir(&root().join("policies")).unwrap().summary(),
        "{}",
        r.what
    );
}

/// `allot webhooks --service allot-system/allot` with `ca` as the bundle.
fn allot_webhooks(ca: &Path) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let out = Command::new(allot_bin())
        .args(["webhooks", "--service", &format!("{NAMESPACE}/allot"), "--ca-bundle"])
        .arg(ca)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(docs.len(), 2);
    (from_value(&docs[0]), from_value(&docs[1]))
}

/// The configurations with caBundle and annotations cleared.
fn without_ca(mut m: MutatingWebhookConfiguration, mut v: ValidatingWebhookConfiguration) -> (Value, Value) {
    m.metadata.annotations = None;
    v.metadata.annotations = None;
    for w in m.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = None;
    }
    for w in v.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = None;
    }
    (serde_json::to_value(m).unwrap(), serde_json::to_value(v).unwrap())
}

fn check_webhooks_match_allot_webhooks(r: &Rendered, ca: &Path) {
    let rendered = without_ca(r.one("allot"), r.one("allot"));
    let (m, v) = allot_webhooks(ca);
    let expected = without_ca(m, v);
    assert!(
        rendered == expected,
        "{}: the webhook configurations differ from `allot webhooks`; run deploy/sync.sh\nrendered: {:#}\nexpected: {:#}",
        r.what,
        json!([rendered.0, rendered.1]),
        json!([expected.0, expected.1])
    );
    for (name, fp) in [
        ("mutating", r.one::<MutatingWebhookConfiguration>("allot").webhooks.unwrap()[0].failure_policy.clone()),
        ("validating", r.one::<ValidatingWebhookConfiguration>("allot").webhooks.unwrap()[0].failure_policy.clone()),
    ] {
        assert_eq!(fp.as_deref(), Some("Fail"), "{}: the {name} webhook fails closed", r.what);
    }
}

// ---------------------------------------------------------------------------------------------
// The tests that render

#[test]
fn root_renders_with_cert_manager() {
    let Some(kubectl) = kubectl_or_skip("root_renders_with_cert_manager") else { return };
    let r = root_render(&kubectl);
    check_install(r);
    assert!(r.raw("v1", "Secret").is_empty(), "deploy/: cert-manager writes allot-tls; the root ships no Secret");

    // cert-manager: self-signed Issuer → CA Certificate → CA Issuer → serving Certificate into
    // the Secret the Deployment mounts, for the name the API server calls.
    let by_name = |kind: &str, name: &str| -> Value {
        let found: Vec<&Value> =
            r.raw("cert-manager.io/v1", kind).into_iter().filter(|o| o["metadata"]["name"] == name).collect();
        assert_eq!(found.len(), 1, "deploy/: one {kind} {name}");
        assert_eq!(found[0]["metadata"]["namespace"], NAMESPACE);
        found[0].clone()
    };
    let certificates = r.raw("cert-manager.io/v1", "Certificate");
    let issuers = r.raw("cert-manager.io/v1", "Issuer");
    assert_eq!((certificates.len(), issuers.len()), (2, 2), "deploy/: two Certificates and two Issuers");
    let selfsigned = by_name("Issuer", "allot-selfsigned");
    assert_eq!(selfsigned["spec"], json!({"selfSigned": {}}));
    let ca = by_name("Certificate", "allot-ca");
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(ca["spec"]["issuerRef"]["name"], "allot-selfsigned");
    assert_eq!(ca["spec"]["issuerRef"]["kind"], "Issuer");
    let ca_issuer = by_name("Issuer", "allot-ca");
    assert_eq!(ca_issuer["spec"]["ca"]["secretName"], ca["spec"]["secretName"], "the CA Issuer signs with the CA");
    let serving = by_name("Certificate", "allot-serving");
    assert_eq!(serving["spec"]["secretName"], "allot-tls");
    assert_eq!(serving["spec"]["issuerRef"]["name"], "allot-ca");
    assert_eq!(serving["spec"]["issuerRef"]["kind"], "Issuer");
    assert_ne!(serving["spec"]["isCA"], true);
    let dns: Vec<&str> = serving["spec"]["dnsNames"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(dns.contains(&"allot.allot-system.svc"), "the API server calls allot.allot-system.svc: {dns:?}");
    assert!(serving["spec"]["usages"].as_array().unwrap().contains(&json!("server auth")));
    let hours = |v: &Value| v.as_str().and_then(|s| s.strip_suffix('h')).and_then(|s| s.parse::<u64>().ok()).unwrap();
    for cert in [&ca, &serving] {
        assert!(hours(&cert["spec"]["renewBefore"]) < hours(&cert["spec"]["duration"]));
    }
    let annotation = format!("{NAMESPACE}/allot-serving");
    let m: MutatingWebhookConfiguration = r.one("allot");
    let v: ValidatingWebhookConfiguration = r.one("allot");
    for annotations in [m.metadata.annotations, v.metadata.annotations] {
        let annotations = annotations.unwrap_or_default();
        assert_eq!(annotations.get("cert-manager.io/inject-ca-from"), Some(&annotation));
    }
    for w in m.webhooks.unwrap() {
        assert!(w.client_config.ca_bundle.is_none(), "cainjector fills the caBundle");
    }
}

#[test]
fn allot_certs_overlay_renders_with_its_own_certificates() {
    let Some(kubectl) = kubectl_or_skip("allot_certs_overlay_renders_with_its_own_certificates") else { return };
    let o = overlay_render(&kubectl);
    let r = &o.rendered;
    check_install(r);
    assert!(r.raw("cert-manager.io/v1", "Certificate").is_empty() && r.raw("cert-manager.io/v1", "Issuer").is_empty());
    let secret: Secret = r.one("allot-tls");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.unwrap_or_default();
    assert_eq!(data.keys().map(String::as_str).collect::<Vec<_>>(), ["tls.crt", "tls.key"]);
    assert_eq!(data["tls.crt"].0, o.tls_crt);
    assert_eq!(data["tls.key"].0, o.tls_key);
    // The caBundle is the CA that signed the serving certificate, in both configurations.
    let m: MutatingWebhookConfiguration = r.one("allot");
    let v: ValidatingWebhookConfiguration = r.one("allot");
    let bundles = m
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| w.client_config.ca_bundle)
        .chain(v.webhooks.unwrap().into_iter().map(|w| w.client_config.ca_bundle));
    for b in bundles {
        assert_eq!(b.map(|b| b.0), Some(o.ca_crt.clone()), "the caBundle is certs/ca.crt");
    }
    assert!(!o.text.contains("cert-manager.io"), "no cert-manager annotation without cert-manager");
}

#[test]
fn the_policies_config_map_is_the_shipped_policies() {
    let Some(kubectl) = kubectl_or_skip("the_policies_config_map_is_the_shipped_policies") else { return };
    check_policies_config_map(root_render(&kubectl));
    check_policies_config_map(&overlay_render(&kubectl).rendered);
}

#[test]
fn the_webhook_configurations_are_allot_webhooks_output() {
    let Some(kubectl) = kubectl_or_skip("the_webhook_configurations_are_allot_webhooks_output") else { return };
    let dir = tempfile::tempdir().unwrap();
    let dummy = dir.path().join("ca.crt");
    std::fs::write(&dummy, "not a certificate").unwrap();
    check_webhooks_match_allot_webhooks(root_render(&kubectl), &dummy);
    let o = overlay_render(&kubectl);
    std::fs::write(&dummy, &o.ca_crt).unwrap();
    check_webhooks_match_allot_webhooks(&o.rendered, &dummy);
    // In the overlay the caBundle is part of what `allot webhooks --ca-bundle` printed.
    let (m, v) = allot_webhooks(&dummy);
    assert_eq!(o.rendered.one::<MutatingWebhookConfiguration>("allot"), m);
    assert_eq!(o.rendered.one::<ValidatingWebhookConfiguration>("allot"), v);
}

/// components/native-covers adds exactly what `allot compile` prints, and points the webhooks
/// at the paths `allot webhooks --native-covers` prints; the rest of the install is unchanged.
#[test]
fn the_native_covers_component_is_allot_compile_with_its_webhooks() {
    let Some(kubectl) = kubectl_or_skip("the_native_covers_component_is_allot_compile_with_its_webhooks") else {
        return;
    };
    let r = native_render(&kubectl);
    check_install(r);
    let compiled = allot_compile();
    let native: BTreeMap<(String, String), Value> = r
        .objects
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.contains("AdmissionPolicy")))
        .map(|o| (kind_and_name(o), o.clone()))
        .collect();
    assert_eq!(native.keys().collect::<Vec<_>>(), compiled.keys().collect::<Vec<_>>(), "the compiled objects");
    for (key, object) in &native {
        assert!(object == &compiled[key], "{key:?} differs from `allot compile`: run deploy/sync.sh");
    }
    let kinds: BTreeSet<&str> = native.keys().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ])
    );
    // The webhooks: `allot webhooks --native-covers policies/`, cert-manager's annotation kept.
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "").unwrap();
    let out = Command::new(allot_bin())
        .args(["webhooks", "--service", &format!("{NAMESPACE}/allot"), "--ca-bundle"])
        .arg(&ca)
        .arg("--native-covers")
        .arg(root().join("policies"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let expected = without_ca(from_value(&docs[0]), from_value(&docs[1]));
    let m: MutatingWebhookConfiguration = r.one("allot");
    let v: ValidatingWebhookConfiguration = r.one("allot");
    assert!(m.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("cert-manager.io/inject-ca-from")));
    let rendered = without_ca(m, v);
    assert!(
        rendered == expected,
        "the native-covers webhooks differ from `allot webhooks --native-covers`: run deploy/sync.sh\nrendered: \
         {:#}\nexpected: {:#}",
        json!([rendered.0, rendered.1]),
        json!([expected.0, expected.1])
    );
    // The Pod webhooks (the first of each configuration) leave the native half out.
    for config in [&rendered.0, &rendered.1] {
        let path = config["webhooks"][0]["clientConfig"]["service"]["path"].as_str().unwrap_or_default();
        assert!(path.contains("/native/"), "{} answers the native half too: {path}", config["webhooks"][0]["name"]);
    }
    // Everything else is the plain install's.
    let plain: BTreeSet<_> = root_render(&kubectl).inventory();
    let here: BTreeSet<_> = r.inventory().into_iter().filter(|(k, _, _)| !k.contains("AdmissionPolicy")).collect();
    assert_eq!(here, plain);
}

/// deploy/overlays/other-namespace (namespace `platform`, ServiceAccount `gpu-allot`), with and
/// without the native-covers component: no `allot-system` and no `:allot` identity is left
/// anywhere, and what kustomize's own transformers do not reach (the webhooks' and native
/// policies' exclusion of Allot's namespace and identity, cert-manager's names) follows.
#[test]
fn an_overlay_in_another_namespace_leaves_no_trace_of_allot_system() {
    let Some(kubectl) = kubectl_or_skip("an_overlay_in_another_namespace_leaves_no_trace_of_allot_system") else {
        return;
    };
    let text = kustomize(&kubectl, &root().join("deploy/overlays/other-namespace"));
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&root().join("deploy"), &dir.path().join("deploy"), &|_, _| false);
    let user = dir.path().join("deploy/overlays/native");
    std::fs::create_dir_all(&user).unwrap();
    let overlay = std::fs::read_to_string(root().join("deploy/overlays/other-namespace/kustomization.yaml")).unwrap();
    let overlay = overlay.replace(
        "  - ../../components/cert-manager\n",
        "  - ../../components/cert-manager\n  - ../../components/native-covers\n",
    );
    std::fs::write(user.join("kustomization.yaml"), overlay).unwrap();
    let native_text = kustomize(&kubectl, &user);
    for (what, text) in [("other-namespace", &text), ("other-namespace + native-covers", &native_text)] {
        assert!(!text.contains("allot-system"), "{what} still names allot-system:\n{text}");
        let r = Rendered::parse(text, what);
        let sa: ServiceAccount = r.one("gpu-allot");
        assert_eq!(sa.metadata.namespace.as_deref(), Some("platform"), "{what}");
        let deployment: Deployment = r.one("allot");
        let spec = deployment.spec.template.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("gpu-allot"), "{what}");
        // Every `not-allot-itself` condition and namespace exclusion, evaluated as written.
        let mut conditions = 0;
        let mut exclusions = 0;
        for object in &r.objects {
            let webhooks = object["webhooks"].as_array().cloned().unwrap_or_default();
            let specs: Vec<Value> = if webhooks.is_empty() { vec![object["spec"].clone()] } else { webhooks };
            for spec in specs {
                let selector =
                    spec.get("namespaceSelector").or_else(|| spec.pointer("/matchConstraints/namespaceSelector"));
                if let Some(values) = selector.and_then(|s| s.pointer("/matchExpressions/0/values")) {
                    assert_eq!(values, &json!(["kube-system", "platform"]), "{what}: {}", describe(object));
                    exclusions += 1;
                }
                for c in spec["matchConditions"].as_array().into_iter().flatten() {
                    if c["name"] == "not-allot-itself" {
                        let expression = c["expression"].as_str().unwrap();
                        let rhs = expression.strip_prefix("request.userInfo.username != ").unwrap();
                        let value = kube::core::cel::cel::Program::compile(rhs)
                            .unwrap()
                            .execute(&kube::core::cel::cel::Context::default())
                            .unwrap();
                        assert_eq!(
                            value,
                            kube::core::cel::cel::Value::String(std::sync::Arc::new(
                                "system:serviceaccount:platform:gpu-allot".into()
                            )),
                            "{what}: {}",
                            describe(object)
                        );
                        conditions += 1;
                    }
                }
            }
        }
        assert!(conditions >= 3 && exclusions >= 3, "{what}: {conditions} conditions, {exclusions} exclusions");
        let certificate =
            r.raw("cert-manager.io/v1", "Certificate").into_iter().find(|c| c["metadata"]["name"] == "allot-serving");
        assert_eq!(
            certificate.unwrap()["spec"]["dnsNames"],
            json!(["allot.platform.svc", "allot.platform.svc.cluster.local"]),
            "{what}"
        );
    }
    // The plain install is what it was: the transformer changes nothing where nothing moved.
    let plain = root_render(&kubectl);
    assert!(plain.objects.iter().any(|o| o["metadata"]["namespace"] == NAMESPACE));
}

/// The two copies deploy/sync.sh maintains are up to date (checked on the files, so this runs
/// without kubectl too).
#[test]
fn deploy_copies_are_in_sync() {
    let base = root().join("deploy/base");
    let copied: BTreeMap<String, String> = std::fs::read_dir(base.join("policies"))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&path).unwrap())
        })
        .collect();
    let shipped: BTreeMap<String, String> = policy_files().into_iter().collect();
    assert!(copied == shipped, "deploy/base/policies/ is not a copy of policies/: run deploy/sync.sh");
    let generator: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(base.join("policies.yaml")).unwrap()).unwrap();
    let listed: Vec<&str> = generator["files"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    let expected: Vec<String> = shipped.keys().map(|f| format!("policies/{f}")).collect();
    assert_eq!(listed, expected, "deploy/base/policies.yaml does not list policies/: run deploy/sync.sh");
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(base.join("webhooks.yaml")).unwrap()).unwrap();
    let docs: Vec<&Value> = docs.iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 2);
    let in_base = without_ca(from_value(docs[0]), from_value(docs[1]));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), "").unwrap();
    let (m, v) = allot_webhooks(&dir.path().join("ca.crt"));
    assert!(
        in_base == without_ca(m, v),
        "deploy/base/webhooks.yaml is not `allot webhooks --service allot-system/allot`: run deploy/sync.sh"
    );
    for d in docs {
        let text = serde_json::to_string(d).unwrap();
        assert!(!text.contains("caBundle"), "deploy/base/webhooks.yaml carries a caBundle");
    }
    let native = root().join("deploy/components/native-covers/native-policies.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&std::fs::read_to_string(native).unwrap()).unwrap();
    let shipped: BTreeMap<(String, String), Value> =
        docs.into_iter().filter(|d| !d.is_null()).map(|d| (kind_and_name(&d), d)).collect();
    assert!(
        shipped == allot_compile(),
        "deploy/components/native-covers/native-policies.yaml is not `allot compile --policies policies/`: run \
         deploy/sync.sh"
    );
}

/// The image's user is the Deployment's, and the build context cannot carry keys.
#[test]
fn the_containerfile_matches_the_deployment() {
    let containerfile = std::fs::read_to_string(root().join("Containerfile")).unwrap();
    let lines: Vec<&str> = containerfile.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    let final_stage = &lines[last_from..];
    assert!(
        final_stage[0].contains("distroless/static") || final_stage[0].contains("scratch"),
        "a static base: {}",
        final_stage[0]
    );
    assert!(final_stage.contains(&"USER 65532:65532"), "{final_stage:?}");
    assert!(final_stage.iter().any(|l| l.starts_with("ENTRYPOINT [") && l.contains("/allot\"]")));
    assert!(containerfile.contains("linux-musl"), "a static musl build");
    // The Deployment runs as that user (read from the file: no kustomize needed).
    let deployment: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(root().join("deploy/base/deployment.yaml")).unwrap())
            .unwrap();
    assert_eq!(deployment[0]["spec"]["template"]["spec"]["securityContext"]["runAsUser"], 65532);
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    let rules: Vec<&str> = ignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert_eq!(rules.first(), Some(&"*"), ".dockerignore is an allowlist");
    for allowed in &rules[1..] {
        assert!(allowed.starts_with('!'), "{allowed}");
        assert!(!allowed.contains("certs") && !allowed.contains("deploy") && !allowed.contains("target"), "{allowed}");
    }
}

/// The shipped (release) binary keeps overflow checks: a sum over tenant-written numbers must
/// panic rather than wrap around and admit a pod past its quota.
#[test]
fn release_builds_keep_overflow_checks() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let release: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .skip_while(|l| *l != "[profile.release]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        release.iter().any(|l| l.replace(' ', "") == "overflow-checks=true"),
        "[profile.release] must set overflow-checks = true: {release:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// RBAC: record the calls the real code makes

/// A replica whose Lease cannot be created at first (e.g. its namespace is not there yet) keeps
/// trying (it reads the Lease again every 0.5 s) and becomes leader once it can.
#[test]
fn leader_election_is_retried_until_the_lease_can_be_created() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let fake = world();
        let refused = |r: &support::fake_api::Request| {
            r.method == "POST" && r.call.group == "coordination.k8s.io" && r.call.resource == "leases"
        };
        fake.fail(3, 404, refused);
        let metrics = allot::control::gang::metrics::ControllerMetrics::default();
        let controller = allot::control::gang::controller::spawn(
            fake.client("allot-late"),
            Arc::new(allot::control::cluster::ClusterState::default()),
            Arc::new(arc_swap::ArcSwap::from_pointee(recording_policies())),
            Arc::new(allot::model::namespaces::NoNamespaces),
            ControllerConfig {
                lease_namespace: NAMESPACE.into(),
                lease_name: LEASE.into(),
                identity: "allot-late".into(),
                resync: Duration::from_secs(1),
                initial_list: Default::default(),
            },
            metrics.clone(),
            Box::new(|| {}),
        );
        // Three refusals, 0.5 s apart, before the fourth attempt.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let holder = fake.lease_holder(NAMESPACE, LEASE);
            if holder.as_deref() == Some("allot-late") && metrics.leader.get() == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "no leader after refused Lease creates; lease: {holder:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let creates = fake.requests().into_iter().filter(|r| refused(r)).map(|r| r.status).collect::<Vec<_>>();
        assert_eq!(&creates[..3], &[404, 404, 404], "the first three Lease creates were refused: {creates:?}");
        assert!(creates[3..].contains(&201), "a later create went through: {creates:?}");
        controller.shutdown(Duration::from_secs(5)).await;
    });
}

/// The cluster the controller sees: one 8-GPU node and pods that make it do everything it can.
fn world() -> FakeApi {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let long_ago = "2020-01-01T00:00:00Z";
    let namespaces: Vec<Value> = ["ml", "ml-timeout", "ml-infer", "ml-queue", "ml-native", NAMESPACE]
        .iter()
        .map(|n| fake_api::namespace(n))
        .collect();
    let nodes = vec![fake_api::gpu_node("gpu-1", 8)];
    let mut pods = Vec::new();
    // A complete gang that fits: released (pod JSON Patch), explained (pods/status, Event).
    for i in 0..2 {
        pods.push(gated_pod(
            "ml",
            &format!("train-{i}"),
            "allot.dev/gang",
            &now,
            json!({"allot.dev/gang-name": "train"}),
            json!({"allot.dev/gang-size": "2"}),
            None,
        ));
    }
    // A gang that never assembled, under `onTimeout: Fail`: its member is deleted (retried).
    pods.push(gated_pod(
        "ml-timeout",
        "lonely-0",
        "allot.dev/gang",
        long_ago,
        json!({"allot.dev/gang-name": "lonely"}),
        json!({"allot.dev/gang-size": "3"}),
        None,
    ));
    // A pod queued behind its team's quota, which has room: its quota gate is lifted.
    pods.push(gated_pod("ml-queue", "queued-0", "allot.dev/quota", &now, json!({}), json!({}), None));
    // One inferred gang per owner kind the controller reads: each makes it GET its owner.
    for api in OWNER_APIS {
        for kind in api.kinds {
            let owner = format!("{}-1", kind.to_lowercase());
            let pod = format!("{owner}-worker-0");
            let api_version = format!("{}/{}", api.group, api.version);
            // Exhaustive on purpose: a new InferredKind needs its pods here.
            let (labels, owner_ref) = match api.kind {
                InferredKind::Job => (
                    json!({"batch.kubernetes.io/job-name": owner, "batch.kubernetes.io/job-completion-index": "0"}),
                    Some(("batch/v1", *kind, owner.as_str())),
                ),
                InferredKind::JobSet => {
                    (json!({"jobset.sigs.k8s.io/jobset-name": owner}), Some(("batch/v1", "Job", "child")))
                }
                InferredKind::KubeflowJob => (
                    json!({"training.kubeflow.org/job-name": owner, "training.kubeflow.org/replica-type": "worker"}),
                    Some((api_version.as_str(), *kind, owner.as_str())),
                ),
                InferredKind::MPIJob => (
                    json!({"training.kubeflow.org/job-name": owner, "training.kubeflow.org/replica-type": "worker"}),
                    Some((api_version.as_str(), *kind, owner.as_str())),
                ),
                InferredKind::LeaderWorkerSet => (
                    json!({"leaderworkerset.sigs.k8s.io/name": owner, "leaderworkerset.sigs.k8s.io/group-index": "0",
                           "leaderworkerset.sigs.k8s.io/worker-index": "1"}),
                    Some(("apps/v1", "StatefulSet", "group-0")),
                ),
            };
            pods.push(gated_pod("ml-infer", &pod, "allot.dev/gang", &now, labels, json!({}), owner_ref));
        }
    }
    // An inferred gang handed to the scheduler (GangPolicy `nativeScheduling`): its member names
    // the PodGroup and carries no gate; the leader GETs the Job and creates Workload and PodGroup.
    let mut handed = gated_pod(
        "ml-native",
        "native-0",
        "allot.dev/gang",
        &now,
        json!({"batch.kubernetes.io/job-name": "native", "batch.kubernetes.io/job-completion-index": "0"}),
        json!({}),
        Some(("batch/v1", "Job", "native")),
    );
    handed["spec"]["schedulingGates"] = json!([]);
    handed["spec"]["schedulingGroup"] = json!({"podGroupName": "allot-job-native"});
    pods.push(handed);
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
                     "metadata": {"name": "native", "namespace": "ml-native", "uid": "uid-native"},
                     "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed"}});
    let fake = FakeApi::new();
    fake.add(namespaces);
    fake.add(nodes);
    fake.add(pods);
    fake.add(vec![job]);
    fake
}

/// The policies of the run: a timeout that fails, inference of every kind, a queue-mode quota.
fn recording_policies() -> allot::model::policy::PolicySet {
    let infer: Vec<Value> = OWNER_APIS.iter().map(|a| serde_json::to_value(a.kind).unwrap()).collect();
    let text = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {{name: timeout}}\nspec:\n  match: {{namespaces: [ml-timeout]}}\n  assemblyTimeout: 1m\n  onTimeout: Fail\n---\n\
         apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {{name: infer}}\nspec:\n  match: {{namespaces: [ml-infer]}}\n  infer: {}\n---\n\
         apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {{name: native}}\nspec:\n  match: {{namespaces: [ml-native]}}\n  infer: [Job]\n  nativeScheduling: true\n---\n\
         apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: queue}}\nspec:\n  namespaces: {{names: [ml-queue]}}\n  quota: {{mode: Queue, limits: {{nvidia.com/gpu: 4}}}}\n---\n\
         apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: cluster}}\nspec:\n  dra: {{deviceClasses: {{gpu.nvidia.com: {{countsAs: nvidia.com/gpu}}}}}}\n",
        Value::Array(infer)
    );
    allot::model::policy::compile(&[allot::model::policy::Source { name: "recording.yaml".into(), text }])
        .unwrap_or_else(|e| panic!("recording policies: {e}"))
}

/// What the scenario makes the code do, as (verb, group, resource): the run lasts until all of
/// it has been seen (or 30 s).
fn scenario() -> BTreeSet<(String, String, String)> {
    let mut s: BTreeSet<(String, String, String)> = [
        ("list", "", "namespaces"),
        ("watch", "", "namespaces"),
        ("list", "resource.k8s.io", "resourceclaims"),
        ("watch", "resource.k8s.io", "resourceclaims"),
        ("list", "resource.k8s.io", "resourceclaimtemplates"),
        ("watch", "resource.k8s.io", "resourceclaimtemplates"),
        ("list", "scheduling.k8s.io", "podgroups"),
        ("watch", "scheduling.k8s.io", "podgroups"),
        ("create", "scheduling.k8s.io", "podgroups"),
        ("create", "scheduling.k8s.io", "workloads"),
        ("list", "resource.k8s.io", "deviceclasses"),
        ("watch", "resource.k8s.io", "deviceclasses"),
        ("list", "resource.k8s.io", "resourceslices"),
        ("watch", "resource.k8s.io", "resourceslices"),
        ("list", "", "nodes"),
        ("watch", "", "nodes"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("patch", "", "pods"),
        ("delete", "", "pods"),
        ("patch", "", "pods/status"),
        ("create", "events.k8s.io", "events"),
        ("get", "coordination.k8s.io", "leases"),
        ("create", "coordination.k8s.io", "leases"),
        ("patch", "coordination.k8s.io", "leases"),
        ("get", "", "configmaps"),
        ("list", "", "configmaps"),
        ("watch", "", "configmaps"),
        ("create", "", "configmaps"),
        ("update", "", "configmaps"),
    ]
    .iter()
    .map(|(v, g, r)| (v.to_string(), g.to_string(), r.to_string()))
    .collect();
    for api in OWNER_APIS {
        for kind in api.kinds {
            s.insert(("get".into(), api.group.into(), api.plural(kind)));
        }
    }
    s
}

/// Runs the gang controller and the Namespace watch against the fake API server and returns
/// every request they made (once per test binary).
fn recorded_calls() -> &'static Vec<Call> {
    static CALLS: OnceLock<Vec<Call>> = OnceLock::new();
    CALLS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let calls = runtime.block_on(async {
            let world = world();
            // The first deletion of a timed-out member fails: the retry repeats its Warning Event,
            // a new Event, never a patch (nothing else repeats one: explanations are written once).
            world.fail(1, 500, |r| r.method == "DELETE" && r.call.resource == "pods");
            let client = world.client("allot-0");
            let caches = Arc::new(allot::server::startup::Caches::default());
            let namespaces = allot::server::reload::watch_namespaces(client.clone(), caches.clone());
            let cluster = Arc::new(allot::control::cluster::ClusterState::default());
            let _claims = allot::server::reload::watch_claims(client.clone(), cluster.clone());
            let policies = Arc::new(arc_swap::ArcSwap::from_pointee(recording_policies()));
            let controller = allot::control::gang::controller::spawn(
                client,
                cluster,
                policies,
                namespaces,
                ControllerConfig {
                    lease_namespace: NAMESPACE.into(),
                    lease_name: LEASE.into(),
                    identity: "allot-0".into(),
                    resync: Duration::from_secs(1),
                    // Paged: the scenario then holds both verbs the two ways ask for (`list`,
                    // and `watch`, which is all a streaming list needs).
                    initial_list: allot::control::gang::controller::InitialList::Paged,
                },
                allot::control::gang::metrics::ControllerMetrics::default(),
                Box::new(|| {}),
            );
            let want = scenario();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let calls = world.calls();
                let seen: BTreeSet<(String, String, String)> =
                    calls.iter().map(|c| (c.verb.clone(), c.group.clone(), c.resource.clone())).collect();
                let deletions = calls.iter().filter(|c| c.verb == "delete" && c.name.as_deref() == Some("lonely-0"));
                if (want.is_subset(&seen) && deletions.count() >= 2) || Instant::now() > deadline {
                    break;
                }
            }
            // The deny-mode ledger: the leader creates and reconciles it, admission charges it.
            record_ledger_calls(&world).await;
            // Shutdown gives the Lease up: its calls must be granted too.
            controller.shutdown(Duration::from_secs(5)).await;
            world.calls()
        });
        runtime.shutdown_timeout(Duration::from_millis(100));
        calls
    })
}

/// What the deny-mode ledger asks of the API server: the reconciler creates a team's ledger (get,
/// create) and brings it up to date (get, update); an admission reads it and commits its charge (get, update).
async fn record_ledger_calls(world: &FakeApi) {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: deny}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}\n";
    let policies =
        allot::model::policy::compile(&[allot::model::policy::Source { name: "deny.yaml".into(), text: text.into() }])
            .unwrap_or_else(|e| panic!("deny policies: {e}"));
    let quota = policies.teams[0].quota.clone().unwrap();
    let leader = allot::control::quota::SharedLedger::new(world.client("allot-0"), NAMESPACE, Duration::from_secs(5));
    leader.reconcile("deny", &[]).await.expect("ledger created");
    let running = allot::control::quota::ledger::SeenPod {
        namespace: "ml".into(),
        name: "running".into(),
        created: 1,
        finished: false,
        terminating: false,
        requests: [("nvidia.com/gpu".to_string(), allot::model::quantity::Quantity::from_units(1))].into(),
        gang: None,
        claims: Default::default(),
    };
    leader.reconcile("deny", &[running]).await.expect("ledger reconciled");
    let requests: allot::model::resources::ResourceList =
        [("nvidia.com/gpu".to_string(), allot::model::quantity::Quantity::from_units(1))].into();
    let request = allot::admission::quota::QuotaRequest {
        uid: "review",
        team: "deny",
        namespace: "ml",
        pod: "new",
        pod_uid: "uid-new",
        created: 2,
        charge: quota.charge(&requests),
        requests,
        gang: None,
        shared_claims: Default::default(),
        dry_run: false,
        cohort: None,
    };
    let replica =
        Arc::new(allot::control::quota::SharedLedger::new(world.client("allot-1"), NAMESPACE, Duration::from_secs(5)));
    // Every replica watches the ledgers, so that its rounds start from the newest copy.
    replica.watch();
    replica.admit_async(&quota, &request).await.expect("charged");
    // The watch lists first, then watches: wait for the second call before the replica (and its
    // watch) is dropped, however fast the admission was.
    let started = std::time::Instant::now();
    while !world.calls().iter().any(|c| c.verb == "watch" && c.resource == "configmaps") {
        assert!(started.elapsed() < Duration::from_secs(10), "the ledger watch never started watching");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A rule of the rendered RBAC, with where it applies (`None`: every namespace).
#[derive(Debug, Clone)]
struct Grant {
    namespace: Option<String>,
    rule: PolicyRule,
    from: String,
}

fn is_our_subject(subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>) -> bool {
    subjects
        .iter()
        .flatten()
        .any(|s| s.kind == "ServiceAccount" && s.name == SERVICE_ACCOUNT && s.namespace.as_deref() == Some(NAMESPACE))
}

/// The rules bound to Allot's ServiceAccount.
fn grants(r: &Rendered) -> Vec<Grant> {
    let cluster_roles: BTreeMap<String, ClusterRole> =
        r.all::<ClusterRole>().into_iter().map(|c| (c.metadata.name.clone().unwrap(), c)).collect();
    let roles: BTreeMap<(String, String), Role> = r
        .all::<Role>()
        .into_iter()
        .map(|c| ((c.metadata.namespace.clone().unwrap(), c.metadata.name.clone().unwrap()), c))
        .collect();
    let mut out = Vec::new();
    for b in r.all::<ClusterRoleBinding>().into_iter().filter(|b| is_our_subject(&b.subjects)) {
        assert_eq!(b.role_ref.kind, "ClusterRole");
        let role = &cluster_roles[&b.role_ref.name];
        for rule in role.rules.iter().flatten() {
            out.push(Grant { namespace: None, rule: rule.clone(), from: format!("ClusterRole {}", b.role_ref.name) });
        }
    }
    for b in r.all::<RoleBinding>().into_iter().filter(|b| is_our_subject(&b.subjects)) {
        let ns = b.metadata.namespace.clone().unwrap();
        let rules = match b.role_ref.kind.as_str() {
            "Role" => roles[&(ns.clone(), b.role_ref.name.clone())].rules.clone(),
            _ => cluster_roles[&b.role_ref.name].rules.clone(),
        };
        for rule in rules.into_iter().flatten() {
            out.push(Grant {
                namespace: Some(ns.clone()),
                rule,
                from: format!("{} {} in {ns}", b.role_ref.kind, b.role_ref.name),
            });
        }
    }
    out
}

fn allows(g: &Grant, c: &Call) -> bool {
    let has = |list: &Option<Vec<String>>, x: &str| list.iter().flatten().any(|v| v == x);
    (g.namespace.is_none() || g.namespace == c.namespace)
        && g.rule.verbs.contains(&c.verb)
        && has(&g.rule.api_groups, &c.group)
        && has(&g.rule.resources, &c.resource)
        && match &g.rule.resource_names {
            Some(names) if !names.is_empty() => c.name.as_ref().is_some_and(|n| names.contains(n)),
            _ => true,
        }
}

/// The rendered RBAC, or (without kubectl) the base's rbac.yaml as written.
fn rbac_objects() -> Rendered {
    match kubectl() {
        Some(k) => Rendered { what: "deploy/".into(), objects: root_render(&k).objects.clone() },
        None => Rendered::parse(
            &std::fs::read_to_string(root().join("deploy/base/rbac.yaml")).unwrap(),
            "deploy/base/rbac.yaml",
        ),
    }
}

#[test]
fn rbac_grants_exactly_the_calls_the_code_makes() {
    let grants = grants(&rbac_objects());
    assert!(!grants.is_empty(), "no rules bound to the allot ServiceAccount");
    for g in &grants {
        let wild =
            g.rule.verbs.iter().chain(g.rule.api_groups.iter().flatten()).chain(g.rule.resources.iter().flatten());
        for w in wild {
            assert!(!w.contains('*'), "{}: wildcard {w:?} in {:?}", g.from, g.rule);
        }
        assert!(g.rule.non_resource_urls.is_none(), "{}: nonResourceURLs", g.from);
    }
    let calls = recorded_calls();

    // Everything the scenario was built to trigger happened (else the run proves little).
    let seen: BTreeSet<(String, String, String)> =
        calls.iter().map(|c| (c.verb.clone(), c.group.clone(), c.resource.clone())).collect();
    let missing: Vec<_> = scenario().difference(&seen).cloned().collect();
    assert!(missing.is_empty(), "the recorded run never made {missing:?}; recorded: {seen:?}");
    let deletions = calls.iter().filter(|c| c.verb == "delete" && c.name.as_deref() == Some("lonely-0")).count();
    assert!(deletions >= 2, "the failed deletion was never retried, its Event repeated: {deletions}");
    // The leader election lease is the one the binary uses, in the Role's namespace.
    assert!(std::fs::read_to_string(root().join("src/cli/mod.rs")).unwrap().contains(&format!("\"{LEASE}\"")));
    for c in calls.iter().filter(|c| c.resource == "leases") {
        assert_eq!(c.namespace.as_deref(), Some(NAMESPACE), "{}", c.request);
    }

    // 1. Every call is granted.
    let denied: Vec<&Call> = calls.iter().filter(|c| !grants.iter().any(|g| allows(g, c))).collect();
    assert!(
        denied.is_empty(),
        "the RBAC in deploy/ denies calls the code makes:\n{}",
        denied
            .iter()
            .map(|c| format!("  {} {} {} ({})", c.verb, c.group, c.resource, c.request))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // 2. Every grant is used: each (verb, group, resource[, name]) of each rule by some call.
    let mut unused = Vec::new();
    for g in &grants {
        for verb in &g.rule.verbs {
            for group in g.rule.api_groups.iter().flatten() {
                for resource in g.rule.resources.iter().flatten() {
                    let names = g.rule.resource_names.clone().filter(|n| !n.is_empty());
                    let used = calls.iter().any(|c| {
                        c.verb == *verb
                            && c.group == *group
                            && c.resource == *resource
                            && (g.namespace.is_none() || g.namespace == c.namespace)
                            && names.as_ref().is_none_or(|n| c.name.as_ref().is_some_and(|x| n.contains(x)))
                    });
                    if !used {
                        unused.push(format!("{}: {verb} {group}/{resource} {names:?}", g.from));
                    }
                }
            }
        }
    }
    assert!(unused.is_empty(), "RBAC grants that no call uses (least privilege):\n  {}", unused.join("\n  "));

    // 3. Where the recorded run could have missed a kind: every owner the controller can read
    // (its own table) was read.
    for api in OWNER_APIS {
        for kind in api.kinds {
            assert!(
                calls.iter().any(|c| c.verb == "get" && c.group == api.group && c.resource == api.plural(kind)),
                "no GET of a {kind} owner was recorded"
            );
        }
    }
    // The evaluator is not vacuous: what the code never does is denied.
    for (verb, group, resource, ns) in [
        ("get", "", "pods", "ml"),
        ("list", "", "secrets", "ml"),
        ("update", "", "pods", "ml"),
        ("patch", "coordination.k8s.io", "leases", "ml"),
    ] {
        let c = Call {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: Some(ns.into()),
            name: Some("x".into()),
            request: String::new(),
        };
        assert!(!grants.iter().any(|g| allows(g, &c)), "{verb} {resource} should be denied");
    }
}

#[test]
fn classify_matches_the_api_servers_request_info() {
    let c = classify("GET", "/api/v1/pods", "limit=500");
    assert_eq!((c.verb.as_str(), c.resource.as_str(), c.namespace), ("list", "pods", None));
    let c = classify("GET", "/api/v1/pods", "watch=true&resourceVersion=1");
    assert_eq!(c.verb, "watch");
    let c = classify("GET", "/api/v1/namespaces", "");
    assert_eq!((c.verb.as_str(), c.resource.as_str()), ("list", "namespaces"));
    let c = classify("GET", "/api/v1/namespaces/ml", "");
    assert_eq!((c.verb.as_str(), c.resource.as_str(), c.name.as_deref()), ("get", "namespaces", Some("ml")));
    let c = classify("PATCH", "/api/v1/namespaces/ml/pods/p/status", "");
    assert_eq!((c.verb.as_str(), c.resource.as_str(), c.namespace.as_deref()), ("patch", "pods/status", Some("ml")));
    let c = classify("POST", "/apis/events.k8s.io/v1/namespaces/ml/events", "");
    assert_eq!((c.verb.as_str(), c.group.as_str(), c.resource.as_str()), ("create", "events.k8s.io", "events"));
    let c = classify("DELETE", "/api/v1/namespaces/ml/pods/p", "");
    assert_eq!(c.verb, "delete");
}

// ---------------------------------------------------------------------------------------------
// A real kube-apiserver (envtest binaries)

/// Server-side applies `objects` in order, with strict field validation (an unknown or
/// duplicate field is an error, not a silent drop).
async fn apply(client: &kube::Client, objects: &[Value], dry_run: bool) -> Vec<String> {
    use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let discovery = kube::discovery::Discovery::new(client.clone()).run().await.expect("discovery");
    let mut failures = Vec::new();
    for o in objects {
        let api_version = o["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, o["kind"].as_str().unwrap());
        let (resource, caps) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("the API server has no {gvk:?}"));
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), o["metadata"]["namespace"].as_str().unwrap(), &resource)
            }
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let mut params = PatchParams::apply("allot-deploy-test").validation_strict();
        if dry_run {
            params = params.dry_run();
        }
        let name = o["metadata"]["name"].as_str().unwrap();
        if let Err(e) = api.patch(name, &params, &Patch::Apply(&normalize(o))).await {
            failures.push(format!("{}: {e}", describe(o)));
        }
    }
    failures
}

#[test]
fn the_rendered_install_applies_to_a_real_apiserver_whose_rbac_agrees() {
    const TEST: &str = "the_rendered_install_applies_to_a_real_apiserver_whose_rbac_agrees";
    let Some(kubectl) = kubectl_or_skip(TEST) else { return };
    let Some([etcd, apiserver]) = binaries_from_env(TEST, ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"]) else {
        return;
    };
    // (Before this test's own runtime: the recording runs on one of its own.)
    let calls = recorded_calls().clone();
    let overlay = overlay_render(&kubectl);
    let root = root_render(&kubectl);
    allot::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        use k8s_openapi::api::authorization::v1::SubjectAccessReview;
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, PostParams};

        let server = ControlPlane::start(&etcd, &apiserver).await;
        let client = server.client.clone();
        // The allot-certs install, for real (it needs no CRD).
        let failures = apply(&client, &overlay.rendered.objects, false).await;
        assert!(failures.is_empty(), "the allot-certs install does not apply:\n  {}", failures.join("\n  "));
        // The cert-manager variant, dry-run, without the cert-manager objects (no CRDs here).
        let without_cert_manager: Vec<Value> =
            root.objects.iter().filter(|o| o["apiVersion"] != "cert-manager.io/v1").cloned().collect();
        let failures = apply(&client, &without_cert_manager, true).await;
        assert!(failures.is_empty(), "deploy/ does not apply:\n  {}", failures.join("\n  "));
        // The same with components/native-covers: the native policies are served by 1.36.
        let native: Vec<Value> = native_render(&kubectl)
            .objects
            .iter()
            .filter(|o| o["apiVersion"] != "cert-manager.io/v1")
            .cloned()
            .collect();
        let failures = apply(&client, &native, true).await;
        assert!(failures.is_empty(), "deploy/ with native-covers does not apply:\n  {}", failures.join("\n  "));

        // A replica as the API server admits it: Pod Security `restricted` (enforced on
        // allot-system), the system-cluster-critical class outside kube-system, the
        // ServiceAccount, and no call to its own fail-closed webhooks (allot-system is
        // excluded; no replica runs here to answer them).
        let deployment: Deployment = overlay.rendered.one("allot");
        let template = deployment.spec.template.clone();
        let mut pod = Pod { metadata: template.metadata.unwrap_or_default(), spec: template.spec, ..Default::default() };
        pod.metadata.name = Some("allot-replica".into());
        pod.metadata.namespace = Some(NAMESPACE.into());
        let dry_run = PostParams { dry_run: true, ..Default::default() };
        if let Err(e) = Api::<Pod>::namespaced(client.clone(), NAMESPACE).create(&dry_run, &pod).await {
            panic!("the API server refuses a replica of the Deployment: {e}");
        }
        // Elsewhere the webhooks are live and fail closed.
        let mut other = pod.clone();
        other.metadata.namespace = Some("default".into());
        other.spec.as_mut().unwrap().service_account_name = Some("default".into());
        // (No controller-manager here makes the namespace's default ServiceAccount.)
        let default_sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &default_sa)
            .await
            .expect("default ServiceAccount");
        let err = Api::<Pod>::namespaced(client.clone(), "default").create(&dry_run, &other).await.unwrap_err();
        assert!(err.to_string().contains("allot.dev"), "{err}");

        // The real RBAC authorizer grants every recorded call to Allot's ServiceAccount, and
        // not what the code never does.
        let mut reviews: Vec<(Call, bool)> = Vec::new();
        let mut seen = BTreeSet::new();
        for c in &calls {
            if seen.insert((c.verb.clone(), c.group.clone(), c.resource.clone(), c.namespace.clone(), c.name.clone())) {
                reviews.push((c.clone(), true));
            }
        }
        for (verb, resource, ns, name) in [
            ("get", "pods", "ml", "p"),
            ("list", "secrets", NAMESPACE, ""),
            ("update", "pods", "ml", "p"),
            ("create", "pods", "ml", ""),
        ] {
            let c = Call {
                verb: verb.into(),
                group: String::new(),
                resource: resource.into(),
                namespace: Some(ns.into()),
                name: Some(name.to_string()).filter(|n| !n.is_empty()),
                request: format!("{verb} {resource} (never made)"),
            };
            reviews.push((c, false));
        }
        let lease_elsewhere = Call {
            verb: "patch".into(),
            group: "coordination.k8s.io".into(),
            resource: "leases".into(),
            namespace: Some(NAMESPACE.into()),
            name: Some("someone-elses-lease".into()),
            request: "patch another lease (never made)".into(),
        };
        reviews.push((lease_elsewhere, false));
        let sars: Api<SubjectAccessReview> = Api::all(client.clone());
        let mut disagreements = Vec::new();
        for (c, expected) in &reviews {
            let (resource, subresource) = c.resource.split_once('/').unwrap_or((c.resource.as_str(), ""));
            let review: SubjectAccessReview = serde_json::from_value(json!({
                "spec": {
                    "user": format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"),
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NAMESPACE}"), "system:authenticated"],
                    "resourceAttributes": {
                        "verb": c.verb, "group": c.group, "resource": resource, "subresource": subresource,
                        "namespace": c.namespace.clone().unwrap_or_default(), "name": c.name.clone().unwrap_or_default()
                    }
                }
            }))
            .unwrap();
            let answer = sars.create(&PostParams::default(), &review).await.expect("SubjectAccessReview");
            let allowed = answer.status.is_some_and(|s| s.allowed);
            if allowed != *expected {
                disagreements.push(format!("{}: allowed={allowed}, expected {expected}", c.request));
            }
        }
        assert!(disagreements.is_empty(), "the API server's RBAC disagrees:\n  {}", disagreements.join("\n  "));
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
}

// ---------------------------------------------------------------------------------------------
// Another namespace, for real

/// A kubeconfig for the API server of `admin_kubeconfig` that authenticates with `token`.
fn kubeconfig_with_token(admin_kubeconfig: &Path, token: &str, out: &Path) {
    let text = std::fs::read_to_string(admin_kubeconfig).unwrap();
    let server = text.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap().to_string();
    std::fs::write(
        out,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: sa}}\ncurrent-context: e2e\n"
        ),
    )
    .unwrap();
}

/// `allot serve` on loopback with `kubeconfig` and `extra` flags: (process, https, metrics), or
/// the process's exit status and stderr when it stops before serving.
fn serve_with(
    dir: &Path,
    kubeconfig: &Path,
    extra: &[&str],
) -> Result<(support::KilledOnDrop, String, String), String> {
    let certs = dir.join("certs");
    if !certs.join("tls.crt").exists() {
        let out = Command::new(allot_bin())
            .args(["certs", "--out", certs.to_str().unwrap(), "--dns-name", "127.0.0.1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let stderr = dir.join(format!("allot-{}.log", extra.len()));
    let mut child = Command::new(allot_bin())
        .args(["serve", "--policies", root().join("policies").to_str().unwrap()])
        .args([
            "--tls-cert",
            certs.join("tls.crt").to_str().unwrap(),
            "--tls-key",
            certs.join("tls.key").to_str().unwrap(),
        ])
        .args(["--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--lease-namespace", "platform"])
        .args(["--identity", "e2e", "--resync-secs", "2"])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut child = support::KilledOnDrop::new(child);
    match support::first_line(stdout, Duration::from_secs(60)).filter(|l| !l.is_empty()) {
        Some(line) => {
            let (https, metrics) = support::serving_addresses(&line).expect("address line");
            Ok((child, https, metrics))
        }
        None => {
            let status = child.wait().unwrap();
            Err(format!("{status}: {}", std::fs::read_to_string(&stderr).unwrap_or_default()))
        }
    }
}

/// deploy/overlays/other-namespace (namespace `platform`, ServiceAccount `gpu-allot`) applied to a
/// real API server, Allot running with that ServiceAccount's token and no identity flag: it asks
/// who it is, releases a tenant's gang (its own webhook lets its lifts through) and still
/// refuses the tenant's own gate lift, naming the identity it allows. A flag that contradicts
/// the API server stops `allot serve` (exit 2, both names).
#[test]
fn an_install_in_another_namespace_releases_gangs_as_its_own_service_account() {
    const TEST: &str = "an_install_in_another_namespace_releases_gangs_as_its_own_service_account";
    let Some(kubectl) = kubectl_or_skip(TEST) else { return };
    let Some([etcd, apiserver]) = binaries_from_env(TEST, ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"]) else {
        return;
    };
    let rendered =
        Rendered::parse(&kustomize(&kubectl, &root().join("deploy/overlays/other-namespace")), "other-namespace");
    allot::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, Patch, PatchParams, PostParams};
        use support::cluster::{
            add_gpu_node, gang_gated as gated, gang_member as member, grant_role, impersonating, wait_for,
        };

        let server = ControlPlane::start(&etcd, &apiserver).await;
        let admin = server.client.clone();
        let (webhooks, rest): (Vec<Value>, Vec<Value>) = rendered
            .objects
            .iter()
            .filter(|o| o["apiVersion"] != "cert-manager.io/v1")
            .cloned()
            .partition(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")));
        let failures = apply(&admin, &rest, false).await;
        assert!(failures.is_empty(), "the overlay does not apply:\n  {}", failures.join("\n  "));
        let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}})).unwrap();
        let token = Api::<ServiceAccount>::namespaced(admin.clone(), "platform")
            .create_token_request("gpu-allot", &PostParams::default(), &request)
            .await
            .expect("a token for platform/gpu-allot")
            .status
            .and_then(|s| s.token)
            .expect("the token");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("gpu-allot.kubeconfig");
        kubeconfig_with_token(&server.kubeconfig, &token, &kubeconfig);
        let identity = "system:serviceaccount:platform:gpu-allot";

        // A flag that the API server contradicts: refused at start, both names said.
        let refused = serve_with(dir.path(), &kubeconfig, &["--allot-username", "admin"]).err().expect("allot serve refuses");
        assert!(refused.contains("exit status: 2"), "{refused}");
        assert!(refused.contains("\"admin\"") && refused.contains(identity), "{refused}");

        let (_allot, https, metrics) = serve_with(dir.path(), &kubeconfig, &[]).expect("allot serve as gpu-allot");
        wait_for("allot ready", Duration::from_secs(60), || async { support::cluster::ready(&metrics) }).await;
        let info = http_get(&metrics, "/metrics");
        assert!(
            info.contains(&format!("allot_identity_info{{username=\"{identity}\",source=\"api-server\"}} 1")),
            "{info}"
        );
        // The overlay's webhooks, pointed at this process (no Service endpoint here).
        let ca = base64(&std::fs::read(dir.path().join("certs/ca.crt")).unwrap());
        let pointed: Vec<Value> = webhooks
            .into_iter()
            .map(|mut config| {
                for webhook in config["webhooks"].as_array_mut().unwrap() {
                    let path = webhook["clientConfig"]["service"]["path"].as_str().unwrap().to_string();
                    webhook["clientConfig"] = json!({"url": format!("https://{https}{path}"), "caBundle": ca});
                }
                config
            })
            .collect();
        let failures = apply(&admin, &pointed, false).await;
        assert!(failures.is_empty(), "the webhooks do not apply:\n  {}", failures.join("\n  "));

        // A tenant of team vision, two GPU nodes.
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": "vision"}})).unwrap();
        Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &namespace).await.unwrap();
        let default_sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        Api::<ServiceAccount>::namespaced(admin.clone(), "vision").create(&PostParams::default(), &default_sa).await.unwrap();
        grant_role(&admin, "vision", "tenant", "alice", json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]}])).await;
        for node in ["gpu-node-1", "gpu-node-2"] {
            add_gpu_node(&admin, node, 2).await;
        }
        let alice = impersonating(&server.kubeconfig, "alice").await;
        let pods: Api<Pod> = Api::namespaced(alice, "vision");
        for name in ["train-0", "train-1"] {
            let pod = pods.create(&PostParams::default(), &member(name, "train", 2)).await.expect("alice creates a member");
            assert!(gated(&pod), "{name} is gated at CREATE");
        }
        wait_for("the gang released by Allot as gpu-allot", Duration::from_secs(60), || async {
            let a = pods.get("train-0").await.unwrap();
            let b = pods.get("train-1").await.unwrap();
            !gated(&a) && !gated(&b)
        })
        .await;
        let metrics_text = http_get(&metrics, "/metrics");
        assert!(metrics_text.contains("allot_gang_controller_refused_lifts_total{kind=\"gate\"} 0"), "{metrics_text}");

        // Alice's own lift of a gate is still refused, naming the identity that may.
        pods.create(&PostParams::default(), &member("solo-0", "solo", 2)).await.expect("a lone member");
        let lift = json!([{"op": "test", "path": "/spec/schedulingGates/0/name", "value": "allot.dev/gang"},
                          {"op": "remove", "path": "/spec/schedulingGates/0"}]);
        let patch: json_patch::Patch = serde_json::from_value(lift).unwrap();
        let err = pods.patch("solo-0", &PatchParams::default(), &Patch::Json::<()>(patch)).await.expect_err("alice cannot lift the gate");
        let text = err.to_string();
        assert!(text.contains("tenant/allot-gates") && text.contains(identity), "{text}");
        assert!(gated(&pods.get("solo-0").await.unwrap()));
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ---------------------------------------------------------------------------------------------
// Volume updates reach a running server

/// Lays out `files` the way the kubelet's AtomicWriter does for Secret and ConfigMap volumes
/// (`..<timestamp>/` with the files, `..data` → it, and `name` → `..data/name`), or swaps in a
/// new version: a new timestamped directory, `..data_tmp` renamed over `..data`, the old
/// directory removed, symlinks for new names added.
fn kubelet_write(dir: &Path, version: &str, files: &[(String, Vec<u8>)]) {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(dir).unwrap();
    let ts = format!("..2026_01_01_00_00_0{version}.000000001");
    std::fs::create_dir(dir.join(&ts)).unwrap();
    for (name, content) in files {
        std::fs::write(dir.join(&ts).join(name), content).unwrap();
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    symlink(&ts, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    for (name, _) in files {
        if std::fs::symlink_metadata(dir.join(name)).is_err() {
            symlink(Path::new("..data").join(name), dir.join(name)).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Whether the server at `addr` presents a certificate signed by `ca` (PEM).
fn trusted_by(addr: &str, ca: &[u8]) -> bool {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while conn.is_handshaking() {
        if conn.complete_io(&mut sock).is_err() {
            return false;
        }
    }
    true
}

fn metric(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn secret_and_config_map_volume_updates_reload_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let certs = |out: &str| {
        let o = Command::new(allot_bin())
            .args(["certs", "--out"])
            .arg(d.join(out))
            .args(["--dns-name", "localhost"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let read = |f: &str| std::fs::read(d.join(out).join(f)).unwrap();
        (read("ca.crt"), vec![("tls.crt".to_string(), read("tls.crt")), ("tls.key".to_string(), read("tls.key"))])
    };
    let (ca1, pair1) = certs("one");
    let (ca2, pair2) = certs("two");
    let tls = d.join("tls");
    kubelet_write(&tls, "1", &pair1);
    let policies = d.join("policies");
    let shipped: Vec<(String, Vec<u8>)> = policy_files().into_iter().map(|(n, t)| (n, t.into_bytes())).collect();
    kubelet_write(&policies, "1", &shipped);

    // The poll interval is long: only the file events can make the reload happen in time.
    let mut child = Command::new(allot_bin())
        .args(["serve", "--no-kube", "--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .args(["--reload-interval-secs", "3600", "--policies"])
        .arg(&policies)
        .arg("--tls-cert")
        .arg(tls.join("tls.crt"))
        .arg("--tls-key")
        .arg(tls.join("tls.key"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let child = Kill(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let addr = line.split("https://").nth(1).and_then(|s| s.split_whitespace().next()).expect(&line).to_string();
    let metrics_addr = line.split("http://").nth(1).map(str::trim).expect(&line).to_string();

    // The probes the Deployment uses answer on the metrics port.
    assert!(http_get(&metrics_addr, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(http_get(&metrics_addr, "/readyz").starts_with("HTTP/1.1 200"));
    assert!(trusted_by(&addr, &ca1) && !trusted_by(&addr, &ca2));
    let version =
        |m: &str| m.lines().find(|l| l.starts_with("allot_policy_set_info{")).map(str::to_string).unwrap_or_default();
    let before = version(&http_get(&metrics_addr, "/metrics"));

    // The reloader starts after the serving line is printed and takes its certificate baseline
    // from the files then (src/server/reload.rs): give it a moment, or an update landing in
    // between would be taken for the baseline and never served.
    std::thread::sleep(Duration::from_secs(1));
    // The update: a new certificate (another CA) and one more policy file.
    kubelet_write(&tls, "2", &pair2);
    let mut updated = shipped.clone();
    updated.push((
        "zz-extra.yaml".into(),
        b"apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: extra}\nspec:\n  expression: 'true'\n  message: m\n"
            .to_vec(),
    ));
    kubelet_write(&policies, "2", &updated);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let m = http_get(&metrics_addr, "/metrics");
        let certs_ok = metric(&m, "allot_certificate_reloads_total{result=\"success\"}") == Some(1.0);
        let policies_ok = metric(&m, "allot_policy_reloads_total{result=\"success\"}") == Some(1.0);
        if certs_ok && policies_ok && trusted_by(&addr, &ca2) {
            assert_ne!(version(&m), before, "a new policy set is in force");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a kubelet-style volume update was not reloaded within 15 s (certificates: {certs_ok}, policies: {policies_ok})\n{m}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(child);
}
