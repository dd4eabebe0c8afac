//! `allot compile` on a real kube-apiserver (skipped without the envtest binaries): only the
//! compiled MutatingAdmissionPolicies and ValidatingAdmissionPolicies are installed — no
//! webhook is registered at all — and for each case the server-side dry-run create gives the
//! engine's verdict (`allot check`'s `admit_manifest`) and, when admitted, the engine's
//! tolerations, nodeSelector and priority class. Cases cover the reinvocation path (two
//! mutating policies changing one Pod: nothing added twice), the default priority class with
//! the Priority plugin's second pass, team-scoped CEL rules, and a Kubeflow CRD's templates.

mod support;

use std::time::{Duration, Instant};

use allot::admission::engine::Engine;
use allot::admission::native::NativeObject;
use allot::cli::check::{Manifest, admit_manifest};
use allot::model::namespaces::NoNamespaces;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::{Value, json};
use support::cluster::{ControlPlane, binaries_from_env};

/// Policies besides the shipped ones: a team whose default class differs from the cluster's
/// globalDefault (so the default-priority patch must drop `spec.priority`), a team-scoped
/// placement with a nodeSelector, one with node affinity, and team-scoped CEL rules (one reading
/// an entry of `acceleratorRequests()`).
const EXTRA: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: speech}
spec:
  namespaces: {names: [speech]}
  priority: {default: high-priority, allowed: [low-priority, high-priority]}
---
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: speech-pool}
spec:
  appliesTo: AllPods
  match: {teams: [speech]}
  nodeSelector: {example.com/pool: a100}
  tolerations: [{key: example.com/pool, operator: Equal, value: a100, effect: NoSchedule}]
  onConflict: Deny
---
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: speech-zones}
spec:
  appliesTo: AllPods
  match: {teams: [speech]}
  nodeAffinity:
    - {key: topology.kubernetes.io/zone, operator: In, values: [zone-a, zone-b]}
    - {key: example.com/spot, operator: DoesNotExist}
---
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: speech-pins-images}
spec:
  match: {teams: [speech]}
  expression: "object.spec.containers.all(c, !c.image.endsWith(':latest'))"
  message: speech pods pin their images
---
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: speech-at-most-four-gpus}
spec:
  match: {teams: [speech]}
  expression: "accelerators(object) == 0 || acceleratorRequests(object)['nvidia.com/gpu'] <= 4"
  message: speech pods ask at most 4 GPUs
"#;

/// Engine findings the compiled policies cover (the test's cases avoid the others).
const COVERED: &[&str] = &[
    "accelerators/requests-equal-limits",
    "accelerators/whole-numbers",
    "accelerators/init-containers",
    "team/priority-class",
    "placement/speech-pool",
    "speech-pins-images",
    "accelerators/max-per-pod",
    "gpu-pods-belong-to-a-team",
    "speech-at-most-four-gpus",
];

/// A native sidecar (an init container with `restartPolicy: Always`) holding `gpus`.
fn sidecar(gpus: &str) -> Value {
    json!([{"name": "sidecar", "image": "busybox:1.36", "restartPolicy": "Always",
        "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}}])
}

/// Two app containers holding `a` and `b` GPUs.
fn two_gpu_containers(a: &str, b: &str) -> Value {
    let mut containers = gpu("nvidia.com/gpu", a, a);
    let mut second = gpu("nvidia.com/gpu", b, b);
    second[0]["name"] = json!("d");
    if let (Some(list), Some(more)) = (containers.as_array_mut(), second.as_array_mut()) {
        list.append(more);
    }
    containers
}

/// Cases of the rules and checks that count a whole Pod's accelerators (sidecars, init
/// containers and app containers, as the scheduler adds them up): `(case, object, admitted?)`.
fn pod_count_cases() -> Vec<(&'static str, Value, bool)> {
    vec![
        (
            "sidecar-and-app-gpu",
            pod("s1", "vision", json!({"initContainers": sidecar("1"), "containers": gpu("nvidia.com/gpu", "1", "1")})),
            true,
        ),
        (
            "sidecar-pushes-pod-over-max",
            pod("s2", "vision", json!({"initContainers": sidecar("2"), "containers": gpu("nvidia.com/gpu", "7", "7")})),
            false,
        ),
        ("two-containers-at-max", pod("s3", "vision", json!({"containers": two_gpu_containers("4", "4")})), true),
        ("two-containers-over-max", pod("s4", "vision", json!({"containers": two_gpu_containers("5", "4")})), false),
        ("gpu-pod-without-team", pod("s5", "scratch", json!({"containers": gpu("nvidia.com/gpu", "1", "1")})), false),
        ("sidecar-gpu-pod-without-team", pod("s6", "scratch", json!({"initContainers": sidecar("1")})), false),
        ("cpu-pod-without-team", pod("s7", "scratch", json!({})), true),
        (
            "high-priority-gpu-pod-audited-not-denied",
            pod(
                "s8",
                "vision",
                json!({"priorityClassName": "high-priority", "containers": gpu("nvidia.com/gpu", "2", "2")}),
            ),
            true,
        ),
    ]
}

fn pod(name: &str, namespace: &str, spec: Value) -> Value {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "busybox:1.36"}]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn gpu(resource: &str, request: &str, limit: &str) -> Value {
    json!([{"name": "c", "image": "busybox:1.36", "resources": {"requests": {resource: request}, "limits": {resource: limit}}}])
}

fn pytorchjob(name: &str, worker: Value) -> Value {
    json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": "nlp"},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "m", "image": "busybox:1.36"}]}}},
            "Worker": {"replicas": 2, "template": {"spec": {"containers": worker}}}}}})
}

/// (case, object, admitted natively?) — the expectation is also checked against the engine.
fn cases() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("gpu-pod-gets-toleration", pod("a", "vision", json!({"containers": gpu("nvidia.com/gpu", "1", "1")})), true),
        (
            "toleration-already-there",
            pod(
                "b",
                "vision",
                json!({"containers": gpu("nvidia.com/gpu", "1", "1"),
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}),
            ),
            true,
        ),
        (
            "wildcard-toleration-covers",
            pod(
                "c",
                "vision",
                json!({"containers": gpu("nvidia.com/gpu", "1", "1"), "tolerations": [{"operator": "Exists"}]}),
            ),
            true,
        ),
        ("amd-gpu", pod("d", "vision", json!({"containers": gpu("amd.com/gpu", "2", "2")})), true),
        ("cpu-pod-untouched", pod("e", "vision", json!({})), true),
        ("nlp-may-not-use-high", pod("f", "nlp", json!({"priorityClassName": "high-priority"})), false),
        ("speech-default-class-replaces-global-default", pod("g", "speech", json!({})), true),
        (
            "speech-gpu-pod-two-policies-reinvoked",
            pod("h", "speech", json!({"containers": gpu("nvidia.com/gpu", "1", "1")})),
            true,
        ),
        (
            "speech-five-gpus-over-the-rule",
            pod("o", "speech", json!({"initContainers": sidecar("2"), "containers": gpu("nvidia.com/gpu", "3", "3")})),
            false,
        ),
        (
            "speech-nodeselector-conflict",
            pod("i", "speech", json!({"nodeSelector": {"example.com/pool": "h100"}})),
            false,
        ),
        (
            "speech-latest-image",
            pod("j", "speech", json!({"containers": [{"name": "c", "image": "busybox:latest"}]})),
            false,
        ),
        (
            "vision-latest-image-not-in-scope",
            pod("k", "vision", json!({"containers": [{"name": "c", "image": "busybox:latest"}]})),
            true,
        ),
        (
            "gpu-init-container",
            pod(
                "l",
                "vision",
                json!({"initContainers": [{"name": "init", "image": "busybox:1.36",
                "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}),
            ),
            false,
        ),
        (
            "speech-affinity-added-to-every-term-once",
            pod(
                "m",
                "speech",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a", "zone-b"]}]},
                    {"matchExpressions": [{"key": "example.com/spot", "operator": "DoesNotExist"}, {"key": "gpu", "operator": "Exists"}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}}}}),
            ),
            true,
        ),
        (
            "speech-affinity-beside-preferred-and-pod-affinity",
            pod(
                "n",
                "speech",
                json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [{"key": "fast", "operator": "Exists"}]}}]},
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm":
                        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}}]}}}),
            ),
            true,
        ),
        ("pytorchjob-fine", pytorchjob("p1", gpu("nvidia.com/gpu", "2", "2")), true),
        ("pytorchjob-request-over-limit", pytorchjob("p2", gpu("nvidia.com/gpu", "2", "1")), false),
        ("pytorchjob-fraction", pytorchjob("p3", gpu("nvidia.com/gpu", "500m", "500m")), false),
    ]
}

/// Kinds the test API server serves (the PyTorchJob CRD is installed by [`set_up`]), with
/// their plural.
const SERVED: &[(&str, &str, &str)] = &[
    ("", "Pod", "pods"),
    ("batch", "Job", "jobs"),
    ("batch", "CronJob", "cronjobs"),
    ("apps", "Deployment", "deployments"),
    ("apps", "StatefulSet", "statefulsets"),
    ("apps", "DaemonSet", "daemonsets"),
    ("apps", "ReplicaSet", "replicasets"),
    ("kubeflow.org", "PyTorchJob", "pytorchjobs"),
];

fn served(object: &Value) -> Option<ApiResource> {
    let api_version = object["apiVersion"].as_str()?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str()?;
    let (_, _, plural) = SERVED.iter().find(|(g, k, _)| *g == group && *k == kind)?;
    Some(ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural))
}

fn api_for(client: &kube::Client, object: &Value) -> Api<DynamicObject> {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or("default");
    let resource = served(object).unwrap_or_else(|| panic!("not served here: {object}"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// A server-side dry-run create: the object as admitted, or the refusal.
async fn dry_run(client: &kube::Client, object: &Value) -> Result<Value, String> {
    let dynamic: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let params = PostParams { dry_run: true, ..Default::default() };
    match api_for(client, object).create(&params, &dynamic).await {
        Ok(created) => serde_json::to_value(created).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// What the placement and priority mutations decide, for comparison: tolerations (without the
/// API server's own `node.kubernetes.io/*` defaults, in a canonical order), nodeSelector and
/// priority class.
fn placement_fields(pod: &Value) -> Value {
    let tolerations: Vec<Value> = pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| !t["key"].as_str().is_some_and(|k| k.starts_with("node.kubernetes.io/")))
        .cloned()
        .collect();
    // Order-insensitive: the API server runs mutating policies in no fixed order (seen on
    // 1.36), where the webhook applies placements in file order; the scheduler reads a set.
    let mut tolerations = tolerations;
    tolerations.sort_by_key(Value::to_string);
    json!({
        "tolerations": tolerations,
        "nodeSelector": pod["spec"].get("nodeSelector").cloned().unwrap_or(json!({})),
        "priorityClassName": pod["spec"]["priorityClassName"].as_str().unwrap_or("low-priority"),
        "affinity": pod["spec"].get("affinity").cloned().unwrap_or(Value::Null),
    })
}

/// The `Warning` headers of a server-side dry-run create of a Pod (kube's typed client drops
/// them).
async fn dry_run_warnings(client: &kube::Client, pod: &Value) -> Vec<String> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let request = axum::http::Request::post(format!("/api/v1/namespaces/{namespace}/pods?dryRun=All"))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(pod).expect("json")))
        .expect("request");
    let response = client.send(request).await.expect("the API server answers");
    assert!(response.status().is_success(), "{pod}: {}", response.status());
    response.headers().get_all("warning").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect()
}

async fn create_all(client: &kube::Client, objects: &[NativeObject]) {
    let pp = PostParams::default();
    for object in objects {
        // The machine is shared and etcd can time out under load: retry server errors.
        let mut attempt = 0;
        loop {
            let result = match object {
                NativeObject::MutatingPolicy(o) => {
                    Api::<MutatingAdmissionPolicy>::all(client.clone()).create(&pp, o).await.map(drop)
                }
                NativeObject::MutatingBinding(o) => {
                    Api::<MutatingAdmissionPolicyBinding>::all(client.clone()).create(&pp, o).await.map(drop)
                }
                NativeObject::ValidatingPolicy(o) => {
                    Api::<ValidatingAdmissionPolicy>::all(client.clone()).create(&pp, o).await.map(drop)
                }
                NativeObject::ValidatingBinding(o) => {
                    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone()).create(&pp, o).await.map(drop)
                }
            };
            match result {
                Ok(()) => break,
                Err(kube::Error::Api(e)) if e.code == 409 && attempt > 0 => break,
                Err(kube::Error::Api(e)) if e.code >= 500 && attempt < 5 => attempt += 1,
                Err(e) => panic!("the API server refused {}: {e}", object.name()),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn set_up(client: &kube::Client) {
    let pp = PostParams::default();
    for (name, value, global) in [("low-priority", 100, true), ("high-priority", 1000, false)] {
        let class: PriorityClass =
            serde_json::from_value(json!({"metadata": {"name": name}, "value": value, "globalDefault": global}))
                .unwrap();
        Api::<PriorityClass>::all(client.clone()).create(&pp, &class).await.expect("priority class");
    }
    for ns in ["vision", "nlp", "speech", "nlp-research", "scratch", "default"] {
        // As in examples/cluster/namespaces.yaml, which the policy tests read.
        let labels = if ns == "nlp-research" { json!({"team": "nlp"}) } else { json!({}) };
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns, "labels": labels}})).unwrap();
        if ns != "default" {
            Api::<Namespace>::all(client.clone()).create(&pp, &namespace).await.expect("namespace");
        }
        // No controller-manager here: the ServiceAccount admission plugin needs `default`.
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), ns).create(&pp, &sa).await.expect("service account");
    }
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "pytorchjobs.kubeflow.org"},
        "spec": {"group": "kubeflow.org", "scope": "Namespaced",
            "names": {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(client.clone()).create(&pp, &crd).await.expect("crd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_policies_alone_give_the_engines_verdicts_and_mutations() {
    let test = "e2e_native::compiled_policies_alone_give_the_engines_verdicts_and_mutations";
    let Some([etcd, apiserver]) = binaries_from_env(test, ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"]) else {
        return;
    };
    allot::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for file in std::fs::read_dir(&shipped).expect("policies/") {
        let path = file.expect("entry").path();
        std::fs::copy(&path, dir.path().join(path.file_name().expect("name"))).expect("copy");
    }
    std::fs::write(dir.path().join("zz-extra.yaml"), EXTRA).expect("extra policies");
    let policies = allot::model::policy::load_dir(dir.path()).expect("policies load");
    let compiled = allot::admission::native::compile(&policies);
    for covered in [
        "Placement/speech-pool",
        "Placement/speech-zones",
        "Rule/speech-pins-images",
        "Rule/speech-at-most-four-gpus",
        "default priority class",
    ] {
        let status = compiled.coverage.iter().find(|c| c.policy.to_string() == covered).map(|c| c.status());
        assert_eq!(status, Some("compiled"), "{covered}\n{}", compiled.report_text());
    }

    let plane = ControlPlane::start(&etcd, &apiserver).await;
    let client = plane.client.clone();
    set_up(&client).await;
    create_all(&client, &compiled.objects).await;
    // No webhook at all: whatever is denied below, the native policies denied.
    let lp = ListParams::default();
    assert!(Api::<MutatingWebhookConfiguration>::all(client.clone()).list(&lp).await.expect("list").items.is_empty());
    assert!(Api::<ValidatingWebhookConfiguration>::all(client.clone()).list(&lp).await.expect("list").items.is_empty());

    let engine = Engine::new(&policies, &NoNamespaces);
    let expectations = engine_expectations(&engine, cases());
    assert_native_agrees(&client, &expectations).await;

    // The same for a tenant: alice, impersonated, with a namespaced Role on pods only, sets what
    // a tenant can write to something hostile; the native policies answer her as the engine does.
    // Whole-Pod accelerator counts (sidecars, app containers): the verdicts, and the engine's
    // message with the engine's numbers.
    let counted = engine_expectations(&engine, pod_count_cases());
    assert_native_agrees(&client, &counted).await;
    for (name, object, admitted, _) in &counted {
        if *admitted {
            let warnings = dry_run_warnings(&client, object).await;
            assert!(warnings.is_empty(), "{name}: no warning, no evaluation error: {warnings:?}");
            continue;
        }
        let engine_messages: Vec<String> = engine_denials(&engine, name, object).map(|f| f.message).collect();
        let refusal = dry_run(&client, object).await.expect_err("denied");
        assert!(
            engine_messages.iter().any(|m| refusal.contains(m.as_str())),
            "{name}: native {refusal}, engine {engine_messages:?}"
        );
    }
    let over = dry_run(&client, &counted[1].1).await.expect_err("denied");
    assert!(over.contains("pod asks 9 nvidia.com/gpu in all; at most 8 per pod"), "{over}");

    let alice = tenant_client(&plane, &["vision", "nlp", "speech"]).await;
    let hostile = engine_expectations(&engine, hostile_cases());
    assert_native_agrees(&alice, &hostile).await;
    // Her refusals name what and where as the engine's do (path included): a class her team may
    // not use, a GPU in an init container, a sidecar over the per-pod maximum.
    for (name, object, _, _) in hostile.iter().filter(|c| {
        ["tenant-class-not-allowed", "tenant-gpu-in-init-container", "tenant-gpus-in-a-sidecar-over-max"].contains(&c.0)
    }) {
        let engine_words: Vec<String> =
            engine_denials(&engine, name, object).map(|f| format!("[{}] {}", f.rule, f.describe())).collect();
        let refusal = dry_run(&alice, object).await.expect_err("denied");
        assert!(
            engine_words.iter().any(|m| refusal.contains(m.as_str())),
            "{name}: native {refusal}, engine {engine_words:?}"
        );
    }

    // A Warn rule whose count of a container's accelerators is expanded into quantity CEL:
    // the warning is the engine's message, and only where the engine warns.
    let latest = pod(
        "w1",
        "vision",
        json!({"containers": [{"name": "c", "image": "busybox:latest",
        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
    );
    let pinned = pod("w2", "vision", json!({"containers": gpu("nvidia.com/gpu", "1", "1")}));
    let cpu_latest = cases().into_iter().find(|c| c.0 == "vision-latest-image-not-in-scope").expect("case").1;
    let message = "GPU containers should pin an image tag";
    for (object, warns) in [(&latest, true), (&pinned, false), (&cpu_latest, false)] {
        let engine_warns =
            admit_manifest(&engine, &Manifest { source: "w".into(), document: 1, line: 0, object: object.clone() })
                .report
                .findings
                .iter()
                .any(|f| f.message.contains(message));
        assert_eq!(engine_warns, warns, "{object}");
        let warnings = dry_run_warnings(&client, object).await;
        let native_warns = warnings.iter().any(|w| w.contains(message));
        assert_eq!(native_warns, warns, "{object}: {warnings:?}");
        assert!(
            warnings.iter().all(|w| !w.contains("expression") || w.contains(message)),
            "no evaluation error: {warnings:?}"
        );
    }

    // The Priority plugin's second pass saw the class the policy set: the priority is its value.
    let speech = dry_run(&client, &cases().into_iter().find(|c| c.0.starts_with("speech-default")).expect("case").1)
        .await
        .expect("admitted");
    assert_eq!(speech["spec"]["priority"], json!(1000), "{speech}");
    // Reinvoked (the priority policy changed the Pod after the placements ran): one toleration each.
    let both = dry_run(&client, &cases().into_iter().find(|c| c.0.starts_with("speech-gpu")).expect("case").1)
        .await
        .expect("admitted");
    let fields = placement_fields(&both);
    assert_eq!(fields["tolerations"].as_array().map(Vec::len), Some(2), "{fields}");
    assert_eq!(fields["nodeSelector"], json!({"example.com/pool": "a100"}));
}

/// The engine's verdict and mutated object for each case; every denial must be one the
/// compiler covers.
fn engine_expectations(
    engine: &Engine<'_>,
    cases: Vec<(&'static str, Value, bool)>,
) -> Vec<(&'static str, Value, bool, Value)> {
    let mut expectations = Vec::new();
    for (name, object, admitted) in cases {
        let manifest = Manifest { source: name.to_string(), document: 1, line: 0, object: object.clone() };
        let expected = admit_manifest(engine, &manifest);
        let uncovered: Vec<_> = expected
            .report
            .findings
            .iter()
            .filter(|f| f.action == allot::model::policy::Action::Deny && !COVERED.contains(&f.rule.as_str()))
            .collect();
        assert!(uncovered.is_empty(), "{name}: the engine denies for a webhook-only reason: {uncovered:?}");
        assert_eq!(expected.report.allowed, admitted, "{name}: the engine says {:?}", expected.report.findings);
        expectations.push((name, object, admitted, expected.mutated));
    }
    expectations
}

/// Server-side dry-run creates through `client` give the engine's verdicts and placements.
async fn assert_native_agrees(client: &kube::Client, expectations: &[(&'static str, Value, bool, Value)]) {
    // The API server loads the policies and the CRD asynchronously, each on its own: compare
    // until every case agrees, or fail with the disagreements after a minute.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut failures = Vec::new();
        for (name, object, admitted, mutated) in expectations {
            let native = dry_run(client, object).await;
            match (&native, admitted) {
                (Ok(created), true) if object["kind"] == "Pod" => {
                    let (got, want) = (placement_fields(created), placement_fields(mutated));
                    if got != want {
                        failures.push(format!("{name}: native {got} engine {want}"));
                    }
                }
                (Ok(_), true) => {}
                (Err(e), false) if e.contains("ValidatingAdmissionPolicy") => {}
                (Ok(created), false) => {
                    failures.push(format!("{name}: admitted natively as {}", placement_fields(created)))
                }
                (Err(e), _) => failures.push(format!("{name}: native {e}, engine allowed={admitted}")),
            }
        }
        if failures.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "native and engine disagree:\n{}", failures.join("\n"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What a tenant can write, set to something hostile and not already refused by the API
/// server's own checks (a forged `priority`, a request above an extended resource's limit and
/// fractional GPUs never reach a policy): a class her team may not use, a toleration of
/// everything, another pool's nodeSelector, a GPU held by an init container, an unpinned image.
fn hostile_cases() -> Vec<(&'static str, Value, bool)> {
    let gpu_pod = |extra: Value| {
        let mut spec = json!({"containers": gpu("nvidia.com/gpu", "1", "1")});
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        spec
    };
    vec![
        ("tenant-class-not-allowed", pod("t1", "nlp", gpu_pod(json!({"priorityClassName": "high-priority"}))), false),
        (
            "tenant-tolerates-everything",
            pod("t2", "vision", gpu_pod(json!({"tolerations": [{"operator": "Exists"}]}))),
            true,
        ),
        (
            "tenant-other-pool",
            pod("t3", "speech", gpu_pod(json!({"nodeSelector": {"example.com/pool": "cheap"}}))),
            false,
        ),
        (
            "tenant-gpu-in-init-container",
            pod(
                "t4",
                "vision",
                gpu_pod(json!({"initContainers": [{"name": "init", "image": "busybox:1.36",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]})),
            ),
            false,
        ),
        (
            "tenant-gpus-in-a-sidecar-over-max",
            pod("t6", "vision", gpu_pod(json!({"initContainers": sidecar("8")}))),
            false,
        ),
        (
            "tenant-unpinned-image",
            pod("t5", "speech", json!({"containers": [{"name": "c", "image": "busybox:latest"}]})),
            false,
        ),
    ]
}

/// What the engine denies `object` (named `name`) for, as `allot check` reports it.
fn engine_denials(
    engine: &allot::admission::engine::Engine<'_>,
    name: &str,
    object: &Value,
) -> impl Iterator<Item = allot::admission::finding::Finding> {
    let manifest = Manifest { source: name.to_string(), document: 1, line: 0, object: object.clone() };
    admit_manifest(engine, &manifest)
        .report
        .findings
        .into_iter()
        .filter(|f| f.action == allot::model::policy::Action::Deny)
}

/// The admin's kubeconfig impersonating `alice`, who holds a Role on pods (all verbs) in
/// `namespaces` and nothing else.
async fn tenant_client(plane: &ControlPlane, namespaces: &[&str]) -> kube::Client {
    for ns in namespaces {
        let rules = json!([{"apiGroups": [""], "verbs": ["*"], "resources": ["pods"]}]);
        support::cluster::grant_role(&plane.client, ns, "tenant", "alice", rules).await;
    }
    support::cluster::impersonating(&plane.kubeconfig, "alice").await
}

/// `count` sequential server-side dry-run creates of a GPU Pod in `vision`: the time taken.
async fn time_creates(client: &kube::Client, count: usize) -> Duration {
    let start = Instant::now();
    for i in 0..count {
        let object = pod(&format!("t{i}"), "vision", json!({"containers": gpu("nvidia.com/gpu", "1", "1")}));
        dry_run(client, &object).await.expect("a GPU pod in vision is admitted");
    }
    start.elapsed()
}

fn gpu_tolerations(pod: &Value) -> usize {
    pod["spec"]["tolerations"].as_array().into_iter().flatten().filter(|t| t["key"] == "nvidia.com/gpu").count()
}

/// Both forms installed: the webhook's mutations are idempotent and the mutating policies run
/// before the mutating webhook, so a Pod gets each toleration once; with the webhooks
/// removed the native checks still deny. Also the pod-create throughput of both (one run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_policies_beside_the_webhook_and_without_it() {
    let Some(assets) =
        support::cluster::Assets::from_env("e2e_native::native_policies_beside_the_webhook_and_without_it")
    else {
        return;
    };
    allot::install_crypto_provider();
    let cluster = support::cluster::Cluster::start(&assets).await;
    let client = cluster.client.clone();
    let policies = allot::model::policy::load_dir(&cluster.dir.path().join("policies")).expect("policies load");
    let compiled = allot::admission::native::compile(&policies);
    const CREATES: usize = 60;

    time_creates(&client, 5).await; // warm-up: connections, caches
    let webhook_only = time_creates(&client, CREATES).await;

    create_all(&client, &compiled.objects).await;
    let high = pod("x", "nlp", json!({"priorityClassName": "high-priority"}));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The validating policies run before the validating webhook: their message shows first.
        match dry_run(&client, &high).await {
            Err(e) if e.contains("ValidatingAdmissionPolicy") => break,
            other => assert!(Instant::now() < deadline, "native policies never took effect: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gpu_pod = pod("y", "vision", json!({"containers": gpu("nvidia.com/gpu", "1", "1")}));
    let both = dry_run(&client, &gpu_pod).await.expect("admitted with both");
    assert_eq!(gpu_tolerations(&both), 1, "webhook and native policy together: {}", both["spec"]["tolerations"]);
    let both_installed = time_creates(&client, CREATES).await;

    // A gang member: the webhook gates it (webhook-only, cluster state), the native policies
    // cannot — the probe for "the API server has dropped the webhooks" below.
    let mut gang_member = pod("g", "vision", json!({}));
    gang_member["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
    gang_member["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
    let gated = |p: &Value| {
        p["spec"]["schedulingGates"].as_array().into_iter().flatten().any(|g| g["name"] == "allot.dev/gang")
    };
    let with_webhook = dry_run(&client, &gang_member).await.expect("a gang member is admitted");
    assert!(gated(&with_webhook), "the webhook gates a gang member: {}", with_webhook["spec"]);

    // Webhook gone (as in an outage with failurePolicy Ignore, or before it is installed).
    let dp = kube::api::DeleteParams::default();
    Api::<MutatingWebhookConfiguration>::all(client.clone()).delete("allot", &dp).await.expect("delete mutating");
    Api::<ValidatingWebhookConfiguration>::all(client.clone()).delete("allot", &dp).await.expect("delete validating");
    let deadline = Instant::now() + Duration::from_secs(60);
    while dry_run(&client, &gang_member).await.is_ok_and(|p| gated(&p)) {
        assert!(Instant::now() < deadline, "the webhooks were never dropped");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A GPU Pod in a namespace of no team: the shipped rule that counts a Pod's accelerators
    // is native now, so it is still denied, with the rule's message.
    let stray = pod("z", "quota-deny", json!({"containers": gpu("nvidia.com/gpu", "1", "1")}));
    assert!(allot::model::namespaces::team_of(&policies, "quota-deny", &NoNamespaces).team.is_none());
    // (The API server loads each policy on its own, asynchronously: the priority-class one
    // answering above says nothing of this one, which was seen to answer a few seconds later.)
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let refused = dry_run(&client, &stray).await;
        if refused.as_ref().is_err_and(|e| e.contains("ValidatingAdmissionPolicy") && e.contains("belongs to no team"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{refused:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let native = dry_run(&client, &gpu_pod).await.expect("admitted natively");
    assert_eq!(gpu_tolerations(&native), 1, "{}", native["spec"]["tolerations"]);
    let denied = dry_run(&client, &high).await;
    assert!(denied.as_ref().is_err_and(|e| e.contains("team nlp may use priority classes")), "{denied:?}");
    let native_only = time_creates(&client, CREATES).await;

    let rate = |d: Duration| CREATES as f64 / d.as_secs_f64();
    println!(
        "pod-create (server-side dry-run, {CREATES} sequential GPU Pods) per second: webhook only {:.1}, \
         webhook + native {:.1}, native only {:.1}; native-only / webhook-only = {:.2}",
        rate(webhook_only),
        rate(both_installed),
        rate(native_only),
        rate(native_only) / rate(webhook_only)
    );
}

/// Engine findings that a refusal by the native policies (or by the API server's own
/// validation, which the engine predicts as `api-server/validation`) stands for.
fn natively_covered(rule: &str, compiled: &allot::admission::native::Compiled) -> bool {
    const CHECKS: &[&str] = &[
        "accelerators/requests-equal-limits",
        "accelerators/whole-numbers",
        "accelerators/init-containers",
        "accelerators/max-per-pod",
        "team/priority-class",
        "api-server/validation",
    ];
    CHECKS.contains(&rule)
        || compiled.coverage.iter().any(|c| {
            c.webhook_only.is_empty()
                && (c.policy.to_string() == format!("Rule/{rule}")
                    || rule
                        .strip_prefix("placement/")
                        .is_some_and(|p| c.policy.to_string() == format!("Placement/{p}")))
        })
}

/// Every case of the shipped `policy-tests/` that runs on the shipped policies, whose object
/// this API server serves and whose denials (per the engine) all come from compiled checks:
/// the native policies alone give the engine's verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_policy_test_cases_the_compiler_covers_get_the_same_verdict() {
    let test = "e2e_native::shipped_policy_test_cases_the_compiler_covers_get_the_same_verdict";
    let Some([etcd, apiserver]) = binaries_from_env(test, ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"]) else {
        return;
    };
    allot::install_crypto_provider();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let policies = allot::model::policy::load_dir(&root.join("policies")).expect("policies load");
    let labels = allot::model::namespaces::from_manifests(
        "namespaces.yaml",
        &std::fs::read_to_string(root.join("examples/cluster/namespaces.yaml")).expect("namespaces"),
    )
    .expect("namespaces parse");
    let engine = Engine::new(&policies, &labels);
    let compiled = allot::admission::native::compile(&policies);

    // (case, object, engine verdict)
    let mut cases = Vec::new();
    let mut skipped = std::collections::BTreeMap::<&str, usize>::new();
    let mut files: Vec<_> =
        std::fs::read_dir(root.join("policy-tests")).expect("policy-tests").map(|e| e.expect("entry").path()).collect();
    files.sort();
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(file).expect("test file");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("test file parses");
        for doc in docs.iter().filter(|d| d["kind"] == "Test") {
            if doc["policies"] != json!("../policies") || doc.get("usage").is_some_and(|u| !u.is_null()) {
                *skipped.entry("other policies or usage").or_default() += doc["cases"].as_array().map_or(0, Vec::len);
                continue;
            }
            for case in doc["cases"].as_array().into_iter().flatten() {
                let name = format!(
                    "{}: {}",
                    file.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
                    case["name"].as_str().unwrap_or("?")
                );
                let object = match (case.get("resource"), case["path"].as_str()) {
                    (Some(r), _) if !r.is_null() => r.clone(),
                    (_, Some(path)) if case.get("select").is_none_or(Value::is_null) => {
                        let text = std::fs::read_to_string(file.parent().expect("dir").join(path)).expect("case path");
                        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("case manifest");
                        match docs.as_slice() {
                            [one] => one.clone(),
                            _ => {
                                *skipped.entry("several objects in a file").or_default() += 1;
                                continue;
                            }
                        }
                    }
                    _ => {
                        *skipped.entry("selected from a file").or_default() += 1;
                        continue;
                    }
                };
                if case.get("usage").is_some_and(|u| !u.is_null()) {
                    *skipped.entry("other policies or usage").or_default() += 1;
                    continue;
                }
                if served(&object).is_none() {
                    *skipped.entry("kind not served by the test API server").or_default() += 1;
                    continue;
                }
                let admitted = admit_manifest(
                    &engine,
                    &Manifest { source: name.clone(), document: 1, line: 0, object: object.clone() },
                );
                let denials: Vec<_> = admitted
                    .report
                    .findings
                    .iter()
                    .filter(|f| f.action == allot::model::policy::Action::Deny)
                    .collect();
                if denials.iter().any(|f| !natively_covered(f.rule.as_str(), &compiled)) {
                    *skipped.entry("denied by a webhook-only check").or_default() += 1;
                    continue;
                }
                cases.push((name, object, admitted.report.allowed));
            }
        }
    }
    eprintln!("policy-tests cases compared: {}; skipped: {skipped:?}", cases.len());
    assert!(cases.len() >= 10, "too few covered cases to mean anything: {}", cases.len());
    assert!(cases.iter().any(|c| c.2) && cases.iter().any(|c| !c.2), "both verdicts occur");

    let plane = ControlPlane::start(&etcd, &apiserver).await;
    let client = plane.client.clone();
    set_up(&client).await;
    create_all(&client, &compiled.objects).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut failures = Vec::new();
        // Refused by the API server's own validation where the engine (its `api-server/validation`
        // port) predicted an admission: not the native policies' doing, reported, not failed.
        let mut api_server_only = Vec::new();
        for (name, object, allowed) in &cases {
            match (dry_run(&client, object).await, allowed) {
                (Ok(_), true) | (Err(_), false) => {}
                (Err(e), true) if !e.contains("ValidatingAdmissionPolicy") => {
                    api_server_only.push(format!("{name}: {e}"))
                }
                (result, _) => failures.push(format!("{name}: native {result:?}, engine allowed={allowed}")),
            }
        }
        if failures.is_empty() {
            if !api_server_only.is_empty() {
                eprintln!(
                    "refused by the API server's own validation, admitted by the engine:\n{}",
                    api_server_only.join("\n")
                );
            }
            // The one known: an extended resource outside the accelerator list whose request
            // differs from its limit (the engine's API-server port does not check that yet).
            assert!(api_server_only.iter().all(|r| r.contains("google.com/tpu limit")), "{api_server_only:?}");
            break;
        }
        assert!(Instant::now() < deadline, "native and engine disagree:\n{}", failures.join("\n"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
