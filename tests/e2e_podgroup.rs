//! Kubernetes' own gang scheduling (alpha in 1.36: the `GenericWorkload` and `GangScheduling`
//! gates, `scheduling.k8s.io/v1alpha2` PodGroups) with Allot in front, on a real control plane
//! whose API server, scheduler and controller-manager have the gates on (skipped without the
//! envtest binaries). As a tenant with a namespaced Role: a PodGroup's members get no
//! `allot.dev/gang` gate and the scheduler binds them all or nothing; their team's deny-mode
//! quota is charged for the whole group (`minCount`) from the first member on, once (also when
//! the PodGroup comes after its first member), and a member beyond `minCount` is charged like
//! any pod, not refused as one too many.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use support::cluster::{Assets, Cluster, wait_for};

const TEAM: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-team}
spec:
  namespaces: {names: [quota-deny]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 5}}
"#;

const NS: &str = "quota-deny";
const TENANT: &str = "alice";

fn pod_group_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("scheduling.k8s.io", "v1alpha2", "PodGroup"), "podgroups")
}

fn pod_group(name: &str, min_count: u32) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    }))
    .expect("pod group")
}

/// A one-pod-per-GPU member of native PodGroup `group` (none: a plain pod).
fn gpu_pod(name: &str, gpus: u32, group: Option<&str>) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36",
                                 "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    });
    if let Some(group) = group {
        pod["spec"]["schedulingGroup"] = json!({"podGroupName": group});
    }
    serde_json::from_value(pod).expect("pod")
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_pod_groups_are_charged_whole_and_ganged_by_the_scheduler() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("native_pod_groups_are_charged_whole_and_ganged_by_the_scheduler") else {
        return;
    };
    let cluster = Cluster::start_with_features(&assets, &[("team-e2e.yaml", TEAM)], &[], true).await;
    let admin = cluster.client.clone();
    let rules = json!([
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups"], "verbs": ["create", "get"]}
    ]);
    support::cluster::tenant_namespace(&admin, NS, TENANT, rules.clone()).await;
    let alice = support::cluster::impersonating(&cluster.kubeconfig, TENANT).await;
    let groups: Api<DynamicObject> = Api::namespaced_with(alice.clone(), NS, &pod_group_resource());
    let pods: Api<Pod> = Api::namespaced(alice.clone(), NS);
    let create = PostParams::default();

    // A PodGroup created after its first member: the member was charged alone (the group's size
    // unknown), and the group is charged whole once Allot's watch sees it (team vision, 16 GPUs).
    support::cluster::tenant_namespace(&admin, "vision", TENANT, rules.clone()).await;
    let vision: Api<Pod> = Api::namespaced(alice.clone(), "vision");
    vision.create(&create, &gpu_pod("late-0", 1, Some("late"))).await.expect("a member before its PodGroup");
    let dry = PostParams { dry_run: true, ..Default::default() };
    vision.create(&dry, &gpu_pod("probe", 5, None)).await.expect("1 + 5 of 16");
    Api::<DynamicObject>::namespaced_with(alice.clone(), "vision", &pod_group_resource())
        .create(&create, &pod_group("late", 12))
        .await
        .expect("pod group late");
    // (Until the leader folds late-0's own admission charge into the ledger, it counts beside
    // the group: 13, over, never under.)
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let answer = vision.create(&dry, &gpu_pod("probe", 5, None)).await.map(drop).map_err(|e| e.to_string());
        if answer.as_ref().is_err_and(|e| e.contains("team vision uses 12 of 16 nvidia.com/gpu")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the late PodGroup never sized its group: {answer:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // `allot explain` reads the PodGroups too: the pod's group, sized by its PodGroup.
    let pod = explain_json(&cluster, &["pod", "late-0", "-n", "vision"]);
    assert_eq!((&pod["gang"]["name"], &pod["gang"]["declared"]), (&json!("PodGroup/late"), &json!(12)), "{pod}");
    // And the team uses what admission checks against: the whole group, not its one pod.
    let team = explain_json(&cluster, &["team", "vision"]);
    let gpus = team["quota"]["limits"].as_array().into_iter().flatten().find(|l| l["resource"] == "nvidia.com/gpu");
    assert_eq!(gpus.map(|l| &l["used"]), Some(&json!("12")), "{team}");

    // A group that can never fit the quota is refused at its first member, whole.
    groups.create(&create, &pod_group("huge", 6)).await.expect("pod group huge");
    let refusal = once_sized(&pods, "huge", 1).await;
    assert!(
        refusal.contains("team deny-team") && refusal.contains("gang PodGroup/huge of 6 asks 6 in all"),
        "{refusal}"
    );
    let refused = pods.create(&create, &gpu_pod("huge-0", 1, Some("huge"))).await.expect_err("6 of 5");
    assert!(refused.to_string().contains("gang PodGroup/huge of 6 asks 6"), "{refused}");
    // The largest minCount the API server takes: refused as promptly, with the number, no
    // overflow and no stall.
    groups.create(&create, &pod_group("absurd", i32::MAX as u32)).await.expect("pod group absurd");
    let started = std::time::Instant::now();
    let absurd = once_sized(&pods, "absurd", 1).await;
    assert!(absurd.contains("gang PodGroup/absurd of 2147483647 asks 2147483647 in all"), "{absurd}");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());

    // A group of 4 that fits: its first member reserves all 4 at once.
    groups.create(&create, &pod_group("ddp", 4)).await.expect("pod group ddp");
    let probe = once_sized(&pods, "ddp", 2).await;
    assert!(probe.contains("gang PodGroup/ddp of 4 asks 8 in all"), "{probe}");
    let first = pods.create(&create, &gpu_pod("ddp-0", 1, Some("ddp"))).await.expect("the first member");
    assert!(!gates(&first).contains(&"allot.dev/gang".to_string()), "no Allot gang gate: {:?}", gates(&first));
    let solo = pods.create(&create, &gpu_pod("solo", 2, None)).await.expect_err("the group holds 4 of 5");
    assert!(solo.to_string().contains("team deny-team uses 4 of 5 nvidia.com/gpu"), "{solo}");

    // The scheduler waits for minCount: one member alone is not even tried (it sits before the
    // scheduling queue, no condition to wait for), so it is watched for a while, never bound.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let alone = pods.get("ddp-0").await.expect("ddp-0");
        assert_eq!(alone.spec.as_ref().and_then(|s| s.node_name.clone()), None, "bound before its group was whole");
    }

    // The other members fill the group's places: charged once, not 4 × 4.
    for i in 1..4 {
        let member = pods.create(&create, &gpu_pod(&format!("ddp-{i}"), 1, Some("ddp"))).await.expect("member");
        assert!(!gates(&member).contains(&"allot.dev/gang".to_string()), "ddp-{i}: {:?}", gates(&member));
    }
    // Whole, the scheduler binds them together (2 nodes × 2 GPUs).
    wait_for("the scheduler to bind the whole group", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let mut bound = 0;
            for i in 0..4 {
                let pod = pods.get(&format!("ddp-{i}")).await.expect("member");
                bound += usize::from(pod.spec.and_then(|s| s.node_name).is_some());
            }
            bound == 4
        }
    })
    .await;

    // A member beyond minCount is the scheduler's to place and is charged in full, not refused
    // as one too many (an Allot gang's declared size is a maximum; minCount is a minimum).
    pods.create(&create, &gpu_pod("ddp-4", 1, Some("ddp"))).await.expect("a fifth member, 5 of 5");
    let over = pods.create(&create, &gpu_pod("ddp-5", 1, Some("ddp"))).await.expect_err("a sixth member, 6 of 5");
    let over = over.to_string();
    assert!(over.contains("team deny-team uses 5 of 5 nvidia.com/gpu") && !over.contains("declares"), "{over}");
}

/// Waits until Allot's PodGroup watch has `group` (it learns PodGroups from the cluster, not from
/// the pods): a dry-run member asking `gpus` is then charged for the whole group and refused,
/// where a pod alone would fit. Returns the refusal.
async fn once_sized(pods: &Api<Pod>, group: &str, gpus: u32) -> String {
    let params = PostParams { dry_run: true, ..Default::default() };
    let mut refusal = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while refusal.is_empty() {
        match pods.create(&params, &gpu_pod("probe", gpus, Some(group))).await {
            Err(e) if e.to_string().contains(&format!("PodGroup/{group}")) => refusal = e.to_string(),
            Err(e) => panic!("probe of {group}: {e}"),
            Ok(_) => {
                assert!(std::time::Instant::now() < deadline, "Allot never sized PodGroup {group}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    refusal
}

/// Where native gang scheduling is off (the default in 1.36) the API server drops
/// `spec.schedulingGroup` after the mutating webhooks have seen it: naming a PodGroup must not
/// take an Allot gang member out from behind its gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_native_gang_scheduling_a_pod_group_name_avoids_no_gate() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("without_native_gang_scheduling_a_pod_group_name_avoids_no_gate") else {
        return;
    };
    let cluster = Cluster::start(&assets).await;
    let admin = cluster.client.clone();
    let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}]);
    support::cluster::tenant_namespace(&admin, "vision", TENANT, rules).await;
    let alice = support::cluster::impersonating(&cluster.kubeconfig, TENANT).await;
    let pods: Api<Pod> = Api::namespaced(alice, "vision");
    let mut member = gpu_pod("sneaky-0", 1, Some("anything"));
    member.metadata.labels = Some([("allot.dev/gang-name".to_string(), "sneaky".to_string())].into());
    member.metadata.annotations = Some([("allot.dev/gang-size".to_string(), "2".to_string())].into());
    let created = pods.create(&PostParams::default(), &member).await.expect("a gang member");
    let spec = created.spec.expect("spec");
    assert_eq!(spec.scheduling_group, None, "the API server dropped the field");
    assert!(
        gates(&Pod { spec: Some(spec), ..Default::default() }).contains(&"allot.dev/gang".to_string()),
        "a gang member of a cluster without native gangs must be gated"
    );
    // Nor can she borrow a native group's name for a Kueue pod group (the one gang name a `/`
    // fits in) to share its tally.
    let mut forged = gpu_pod("forged-0", 1, None);
    forged.metadata.annotations = Some(
        [
            ("kueue.x-k8s.io/pod-group-name".to_string(), "PodGroup/ddp".to_string()),
            ("kueue.x-k8s.io/pod-group-total-count".to_string(), "1".to_string()),
        ]
        .into(),
    );
    let refused = pods.create(&PostParams::default(), &forged).await.expect_err("a native group's name");
    assert!(refused.to_string().contains("are native PodGroups'"), "{refused}");
}

const HAND_OFF: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-team}
spec:
  namespaces: {names: [quota-deny]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 8}}
---
apiVersion: allot.dev/v1alpha1
kind: GangPolicy
metadata: {name: hand-off}
spec:
  match: {namespaces: [quota-deny]}
  infer: [Job]
  nativeScheduling: true
"#;

/// GangPolicy `nativeScheduling`: the gang Allot infers for an Indexed Job is handed to the
/// scheduler. Its pods name the PodGroup `allot-job-NAME` instead of getting Allot's gate,
/// Allot's leader creates the Workload and PodGroup (`minCount` = parallelism, owned by the
/// Job), and the scheduler binds the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inferred_gang_is_handed_to_the_scheduler() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("an_inferred_gang_is_handed_to_the_scheduler") else {
        return;
    };
    // (Named to load before the rig's own `gangs.yaml`: the first GangPolicy that matches wins.)
    let cluster = Cluster::start_with_features(&assets, &[("a-hand-off.yaml", HAND_OFF)], &[], true).await;
    let admin = cluster.client.clone();
    let rules = json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]);
    support::cluster::tenant_namespace(&admin, NS, TENANT, rules).await;
    let alice = support::cluster::impersonating(&cluster.kubeconfig, TENANT).await;
    let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(json!({
        "metadata": {"name": "train"},
        "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed",
                 "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "busybox:1.36",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .expect("job");
    let created = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(alice, NS)
        .create(&PostParams::default(), &job)
        .await
        .expect("the Job");
    let job_uid = created.metadata.uid.expect("uid");

    // The leader creates the group, owned by the Job.
    let groups: Api<DynamicObject> = Api::namespaced_with(admin.clone(), NS, &pod_group_resource());
    wait_for("Allot's leader to create PodGroup allot-job-train", Duration::from_secs(60), || {
        let groups = groups.clone();
        async move { groups.get_opt("allot-job-train").await.expect("get PodGroup").is_some() }
    })
    .await;
    let group = serde_json::to_value(groups.get("allot-job-train").await.expect("the PodGroup")).expect("json");
    assert_eq!(group["spec"]["schedulingPolicy"]["gang"]["minCount"], 4, "{group}");
    assert_eq!(group["metadata"]["ownerReferences"][0]["uid"], job_uid.as_str(), "{group}");
    let workloads = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("scheduling.k8s.io", "v1alpha2", "Workload"),
        "workloads",
    );
    let workload = Api::<DynamicObject>::namespaced_with(admin.clone(), NS, &workloads)
        .get("allot-job-train")
        .await
        .expect("the Workload");
    assert_eq!(workload.data["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"], 4);

    // Its pods name it, carry no Allot gate, and the scheduler binds all four.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    wait_for("the scheduler to bind the handed-off gang", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&Default::default()).await.expect("pods");
            list.items.len() == 4
                && list.items.iter().all(|p| {
                    let spec = p.spec.as_ref();
                    let group =
                        spec.and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.as_deref());
                    assert_eq!(group, Some("allot-job-train"), "{:?}", p.metadata.name);
                    assert!(!gates(p).contains(&"allot.dev/gang".to_string()), "{:?}", p.metadata.name);
                    spec.and_then(|s| s.node_name.as_ref()).is_some()
                })
        }
    })
    .await;
}

/// `allot explain ARGS -o json` against `cluster` as its admin, with its policies.
fn explain_json(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let explained = std::process::Command::new(env!("CARGO_BIN_EXE_allot"))
        .arg("explain")
        .args(args)
        .args(["-o", "json", "--policies"])
        .arg(cluster.dir.path().join("policies"))
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "error")
        .output()
        .expect("allot explain");
    serde_json::from_slice(&explained.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&explained.stderr)))
}
