//! `allot explain` end to end on a real kube-apiserver (skipped without the envtest binaries):
//! nodes with GPUs (one cordoned, one without GPUs), a gang short of a member, a queue-mode team
//! at its quota with a pod waiting; the `allot explain` binary answers for a pod, a gang and a
//! team, in text and JSON, as the admin (policies from the ConfigMap `deploy/` ships), through a
//! link named `kubectl-allot` (the kubectl plugin), and as a tenant whose namespaced Role lets
//! it list pods and nothing else.
//!
//! Only etcd and kube-apiserver run: `explain` only reads, so no scheduler or Allot is needed
//! (pods are created with Allot's gates, and "running" pods with their `nodeName`).

mod support;

use std::path::Path;
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::cluster::{ControlPlane, binaries_from_env};

const POLICIES: &str = "apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: ml}
spec:
  namespaces: {names: [ml]}
  quota:
    mode: Queue
    limits: {nvidia.com/gpu: 2}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: vision}
spec:
  namespaces: {names: [vision]}
  quota:
    mode: Deny
    limits: {nvidia.com/gpu: 2}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: claims}
spec:
  namespaces: {names: [claims]}
  quota:
    mode: Deny
    limits: {nvidia.com/gpu: 8}
---
apiVersion: allot.dev/v1alpha1
kind: Cluster
metadata: {name: cluster}
spec:
  dra:
    deviceClasses:
      gpu.nvidia.com: {countsAs: nvidia.com/gpu}
---
apiVersion: allot.dev/v1alpha1
kind: GangPolicy
metadata: {name: e2e}
spec:
  assemblyTimeout: 10m
";

async fn create<K>(api: &Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).expect("object");
    api.create(&PostParams::default(), &object).await.expect("create")
}

/// A Node with `gpus` allocatable (none: a CPU node without the GPU taint).
async fn add_node(client: &kube::Client, name: &str, gpus: u32, cordoned: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    let taints = if gpus > 0 {
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    create(&nodes, json!({"metadata": {"name": name}, "spec": {"unschedulable": cordoned}})).await;
    let mut resources = json!({"cpu": "32", "memory": "128Gi", "pods": "110"});
    if gpus > 0 {
        resources["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let status = json!({"status": {"capacity": resources, "allocatable": resources}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.expect("node status");
    // The API server taints new nodes not-ready; with no kubelet nothing lifts it.
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": taints}})))
        .await
        .expect("taints");
}

fn pod(name: &str, gpus: u32, gates: &[&str], node: Option<&str>, gang: Option<(&str, u32)>) -> Value {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "busybox:1.36",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }
    });
    if !gates.is_empty() {
        pod["spec"]["schedulingGates"] = gates.iter().map(|g| json!({"name": g})).collect();
    }
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    if let Some((gang, size)) = gang {
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": gang});
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": size.to_string()});
    }
    pod
}

async fn namespace(client: &kube::Client, name: &str) {
    create(&Api::<Namespace>::all(client.clone()), json!({"metadata": {"name": name}})).await;
    // No controller-manager: the ServiceAccount admission plugin wants the default account.
    create(&Api::<ServiceAccount>::namespaced(client.clone(), name), json!({"metadata": {"name": "default"}})).await;
}

fn run(program: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "error")
        .output()
        .expect("run allot explain")
}

fn ok_stdout(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn json_of(out: &Output, what: &str) -> Value {
    let stdout = ok_stdout(out, what);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_on_a_real_api_server() {
    allot::install_crypto_provider();
    let Some([etcd, apiserver]) =
        binaries_from_env("explain_on_a_real_api_server", ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"])
    else {
        return;
    };
    let plane = ControlPlane::start(&etcd, &apiserver).await;
    let client = plane.client.clone();
    let dir = plane.dir.path();
    let policies = dir.join("explain-policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("policies.yaml"), POLICIES).unwrap();

    add_node(&client, "gpu-1", 4, false).await;
    add_node(&client, "gpu-2", 2, false).await;
    add_node(&client, "gpu-3", 8, true).await;
    add_node(&client, "cpu-1", 0, false).await;
    for ns in ["ml", "research", "vision", "claims", "allot-system"] {
        namespace(&client, ns).await;
    }
    // The policies where deploy/ puts them: what `explain` reads without --policies.
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), "allot-system"),
        json!({"metadata": {"name": "allot-policies"}, "data": {"policies.yaml": POLICIES, "README": "not a policy"}}),
    )
    .await;
    // Team ml: 2 GPUs running on gpu-1 (its whole quota), one pod queued.
    let ml: Api<Pod> = Api::namespaced(client.clone(), "ml");
    create(&ml, pod("running", 2, &[], Some("gpu-1"), None)).await;
    create(&ml, pod("waiting", 1, &["allot.dev/quota"], None, None)).await;
    // Team vision (deny mode) over its quota: pods bound before the quota existed (on the
    // cordoned node, where they change nothing for the gang below).
    let vision: Api<Pod> = Api::namespaced(client.clone(), "vision");
    create(&vision, pod("old-a", 2, &[], Some("gpu-3"), None)).await;
    create(&vision, pod("old-b", 1, &[], Some("gpu-3"), None)).await;
    // Gang train in research (no team): 2 of 3 members of 2 GPUs each, behind the gang gate.
    let research: Api<Pod> = Api::namespaced(client.clone(), "research");
    for name in ["train-0", "train-1"] {
        create(&research, pod(name, 2, &["allot.dev/gang"], None, Some(("train", 3)))).await;
    }
    // Team claims: a pod whose 4 GPUs come from a DRA claim template (bound before the quota).
    let templates: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "claims",
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceClaimTemplate"),
            "resourceclaimtemplates",
        ),
    );
    create(
        &templates,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "four"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus",
                "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4}}]}}}}),
    )
    .await;
    create(
        &Api::<Pod>::namespaced(client.clone(), "claims"),
        json!({"metadata": {"name": "claimer"}, "spec": {"nodeName": "gpu-3",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four"}],
            "containers": [{"name": "w", "image": "busybox:1.36", "resources": {"claims": [{"name": "gpus"}]}}]}}),
    )
    .await;
    // What the controller wrote on a member (no controller runs here): explain shows it.
    let condition = json!({"status": {"conditions": [{"type": "allot.dev/GangReady", "status": "False",
        "reason": "WaitingForMembers", "message": "2/3 members present; needs 6 nvidia.com/gpu on any node, 4 free",
        "lastTransitionTime": "2026-11-23T00:00:00Z"}]}});
    research.patch_status("train-0", &PatchParams::default(), &Patch::Merge(condition)).await.expect("condition");

    let allot = Path::new(env!("CARGO_BIN_EXE_allot"));
    let kc = plane.kubeconfig.as_path();
    let dir_flag = policies.to_str().unwrap();

    // The gang, in text: members, decision, nodes one by one, the timeout, the condition.
    let text = ok_stdout(&run(allot, kc, &["explain", "gang", "train", "-n", "research"]), "explain gang");
    eprintln!("$ allot explain gang train -n research\n{text}");
    for line in [
        "Gang research/train: 2 present, 3 declared",
        "  member train-0 gated",
        "  decision: WaitingForMembers (gang #1 in the controller's order)",
        "    2/3 members present; needs 6 nvidia.com/gpu on any node, 4 free",
        "    gpu-1  1\n",
        "    gpu-2  1\n",
        "    gpu-3  0  (cordoned)",
        "    cpu-1  0  (nvidia.com/gpu free 0 < 2 asked)",
        "  assembly timeout: 600s, ",
        "  condition allot.dev/GangReady=False (WaitingForMembers): 2/3 members present",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }

    // The same in JSON, with the policies from a directory.
    let gang = json_of(
        &run(allot, kc, &["explain", "gang", "train", "-n", "research", "-o", "json", "--policies", dir_flag]),
        "explain gang -o json",
    );
    assert_eq!(gang["kind"], "Gang");
    assert_eq!((gang["declared"].as_u64(), gang["present"].as_u64()), (Some(3), Some(2)));
    assert_eq!(gang["decision"]["reason"], "WaitingForMembers");
    assert_eq!(gang["decision"]["needs"][0], json!({"resource": "nvidia.com/gpu", "needed": "6", "free": "4"}));
    let nodes: Vec<(String, u64)> = gang["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap().to_string(), n["members"].as_u64().unwrap()))
        .collect();
    let expected: Vec<(String, u64)> =
        [("cpu-1", 0), ("gpu-1", 1), ("gpu-2", 1), ("gpu-3", 0)].iter().map(|(n, m)| (n.to_string(), *m)).collect();
    assert_eq!(nodes, expected);
    assert_eq!(gang["nodes"][3]["refusal"], json!({"reason": "cordoned"}));
    let remaining = gang["assembly"]["remainingSeconds"].as_i64().unwrap();
    assert!((540..=600).contains(&remaining), "{remaining}");
    assert_eq!(gang["condition"]["reason"], "WaitingForMembers");

    // A pod: its gates, gang and decision.
    let pod_json = json_of(&run(allot, kc, &["explain", "pod", "train-1", "-n", "research", "-o", "json"]), "pod");
    assert_eq!(pod_json["gates"], json!(["allot.dev/gang"]));
    assert_eq!(pod_json["gang"]["name"], "train");
    assert_eq!(pod_json["team"], Value::Null);
    assert_eq!(
        pod_json["waitingFor"][0],
        "gang gate allot.dev/gang (WaitingForMembers): 2/3 members present; needs 6 nvidia.com/gpu on any node, 4 free"
    );
    let text = ok_stdout(&run(allot, kc, &["explain", "pod", "waiting", "-n", "ml"]), "explain pod waiting");
    eprintln!("$ allot explain pod waiting -n ml\n{text}");
    assert!(text.contains("  team:    ml\n"), "{text}");
    assert!(text.contains("    - quota queue (#1): team ml uses 2 of 2 nvidia.com/gpu; this asks 1"), "{text}");

    // The team: its quota, who uses it, its queue.
    let team = json_of(&run(allot, kc, &["explain", "team", "ml", "-o", "json"]), "explain team");
    assert_eq!(team["quota"]["mode"], "Queue");
    assert_eq!(
        team["quota"]["limits"][0],
        json!({"resource": "nvidia.com/gpu", "limit": "2", "used": "2", "over": false})
    );
    assert_eq!(team["topPods"][0]["pod"], "running");
    assert_eq!(team["topPods"][0]["state"], "bound");
    assert_eq!(team["usageByNamespace"][0], json!({"namespace": "ml", "requests": {"nvidia.com/gpu": "3"}}));
    assert_eq!(team["queue"][0]["unit"], "pod/ml/waiting");
    assert_eq!(team["queue"][0]["releasable"], false);
    assert_eq!(team["queue"][0]["message"], "team ml uses 2 of 2 nvidia.com/gpu; this asks 1");
    let text = ok_stdout(&run(allot, kc, &["explain", "team", "ml"]), "explain team text");
    eprintln!("$ allot explain team ml\n{text}");
    assert!(text.contains("    nvidia.com/gpu: 2 of 2 used"), "{text}");
    assert!(text.contains("    ml/running bound: 2 nvidia.com/gpu"), "{text}");

    let over = json_of(&run(allot, kc, &["explain", "team", "vision", "-o", "json"]), "explain team vision");
    assert_eq!(
        over["quota"],
        json!({"mode": "Deny", "limits": [{"resource": "nvidia.com/gpu", "limit": "2", "used": "3", "over": true}]})
    );
    let top: Vec<&str> = over["topPods"].as_array().unwrap().iter().map(|p| p["pod"].as_str().unwrap()).collect();
    assert_eq!(top, ["old-a", "old-b"]);
    assert_eq!(over["queue"], json!([]));
    let text = ok_stdout(&run(allot, kc, &["explain", "team", "vision"]), "explain team vision text");
    assert!(text.contains("    nvidia.com/gpu: 3 of 2 used (over the limit)\n"), "{text}");
    assert!(text.contains("  queue: empty\n"), "{text}");

    // The claim's devices count towards the team's usage, as they do at admission.
    let claims = json_of(&run(allot, kc, &["explain", "team", "claims", "-o", "json"]), "explain team claims");
    assert_eq!(
        claims["quota"]["limits"][0],
        json!({"resource": "nvidia.com/gpu", "limit": "8", "used": "4", "over": false}),
        "{claims}"
    );

    // Not found: a clear error, exit 2.
    let out = run(allot, kc, &["explain", "pod", "nope", "-n", "ml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pod ml/nope not found"), "{out:?}");

    // The kubectl plugin: the same binary through a link named kubectl-allot.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = bin.join("kubectl-allot");
    std::os::unix::fs::symlink(allot, &plugin).expect("symlink");
    let help = ok_stdout(&run(&plugin, kc, &["explain", "--help"]), "plugin help");
    assert!(help.contains("Usage: kubectl allot explain"), "{help}");
    let via_plugin =
        json_of(&run(&plugin, kc, &["explain", "gang", "train", "-n", "research", "-o", "json"]), "plugin");
    assert_eq!(via_plugin["decision"], gang["decision"]);

    // A tenant: alice may list pods in research, nothing else.
    let rules = json!([{"apiGroups": [""], "verbs": ["get", "list"], "resources": ["pods"]}]);
    support::cluster::grant_role(&client, "research", "reader", "alice", rules).await;
    let admin = std::fs::read_to_string(kc).unwrap();
    let mut alice = String::new();
    for line in admin.lines() {
        alice.push_str(line);
        alice.push('\n');
        if line.trim_start().starts_with("token:") {
            let indent = &line[..line.len() - line.trim_start().len()];
            alice.push_str(&format!("{indent}as: alice\n"));
        }
    }
    let alice_kc = dir.join("alice.kubeconfig");
    std::fs::write(&alice_kc, alice).unwrap();
    // Without --policies it cannot read the cluster's ConfigMap: it says so and what to do.
    let out = run(allot, &alice_kc, &["explain", "gang", "train", "-n", "research"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the policies Allot uses from ConfigMap allot-system/allot-policies")
            && stderr.contains("give --policies DIR"),
        "{stderr}"
    );
    // With them: what it can see, and a note on what it cannot.
    let text = ok_stdout(
        &run(allot, &alice_kc, &["explain", "gang", "train", "-n", "research", "--policies", dir_flag]),
        "tenant explain gang",
    );
    for line in [
        "Gang research/train: 2 present, 3 declared",
        "  decision: WaitingForMembers",
        "    2/3 members present\n",
        "  condition allot.dev/GangReady=False (WaitingForMembers): 2/3 members present; needs 6 nvidia.com/gpu",
        "  note: cannot list nodes (",
        "placement is not evaluated",
        "  note: cannot list pods in all namespaces (",
        "  note: DRA claims not fully listed (",
    ] {
        assert!(text.contains(line), "missing {line:?} in the tenant's answer:\n{text}");
    }
    assert!(!text.contains("gpu-1"), "a tenant sees no node: {text}");
    eprintln!("$ allot explain gang train -n research --policies DIR   # as alice\n{text}");
    let tenant = json_of(
        &run(allot, &alice_kc, &["explain", "pod", "train-0", "-n", "research", "-o", "json", "--policies", dir_flag]),
        "tenant explain pod",
    );
    assert_eq!(tenant["gang"]["nodes"], json!([]));
    assert!(tenant["notes"][0].as_str().unwrap().starts_with("cannot list pods in all namespaces"), "{tenant}");
    // Outside its namespace it can list nothing: a clear error, not a crash.
    let out = run(allot, &alice_kc, &["explain", "pod", "running", "-n", "ml", "--policies", dir_flag]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot list pods in namespace ml"), "{out:?}");
}

/// Without a usable cluster: clear errors and exit 2, never a hang (no control plane needed).
#[test]
fn explain_fails_clearly_without_a_cluster() {
    let allot = Path::new(env!("CARGO_BIN_EXE_allot"));
    let dir = tempfile::tempdir().unwrap();
    let stderr_of = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let out = run(allot, &dir.path().join("none"), &["explain", "pod", "p", "--policies-configmap", "just-a-name"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr_of(&out).contains("--policies-configmap must be NAMESPACE/NAME"), "{out:?}");

    let missing = dir.path().join("missing.kubeconfig");
    let out = run(allot, &missing, &["explain", "pod", "p", "--kubeconfig", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr_of(&out).contains("kubeconfig: "), "{out:?}");

    // An API server that accepts connections and never answers: the timeout ends it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let kubeconfig = dir.path().join("silent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: s\n  context: {{cluster: s, user: u}}\ncurrent-context: s\n"
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = run(allot, &kubeconfig, &["explain", "team", "ml", "--timeout-secs", "2"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr_of(&out).contains("the cluster did not answer within 2s"), "{out:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
}
