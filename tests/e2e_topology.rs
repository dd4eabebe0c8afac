//! Gangs inside one topology domain on a real control plane (API server, scheduler,
//! controller-manager; skipped without the envtest binaries), as a tenant: two racks of two
//! 2-GPU nodes, a GangPolicy requiring `topology.kubernetes.io/rack`. A 4-GPU gang lands wholly
//! in one rack and its members carry the rack in their node selector (added in the patch that
//! lifts the gate, which the API server accepts on a gated pod); with one GPU busy in each rack
//! a 4-GPU gang waits although 6 GPUs are free, and says so; a 5-GPU gang is told no rack can
//! ever hold it; a member asking for a level its policy does not have is refused.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::cluster::{
    Assets, Cluster, gang_condition, gang_gated, gang_member, impersonating, metric, tenant_namespace, wait_for,
};

const RACK: &str = "topology.kubernetes.io/rack";

const POLICY: &str = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: racks}\nspec:\n  match: {namespaces: [vision]}\n  topology:\n    required: topology.kubernetes.io/rack\n";

async fn members(pods: &Api<Pod>, gang: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("allot.dev/gang-name={gang}"))).await.expect("list").items
}

async fn create_gang(pods: &Api<Pod>, gang: &str, size: u32) {
    for i in 0..size {
        pods.create(&PostParams::default(), &gang_member(&format!("{gang}-{i}"), gang, size))
            .await
            .expect("alice creates a member");
    }
}

/// A plain 1-GPU pod pinned to `node`.
fn busy(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

async fn waiting_message(pods: &Api<Pod>, gang: &str, size: usize) -> Option<String> {
    let all = members(pods, gang).await;
    let messages: BTreeSet<String> = all.iter().filter_map(gang_condition).map(|(_, _, m)| m).collect();
    (all.len() == size && all.iter().all(gang_gated) && messages.len() == 1)
        .then(|| messages.into_iter().next().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangs_land_in_one_rack_or_wait_and_say_why() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("gangs_land_in_one_rack_or_wait_and_say_why") else { return };
    let cluster = Cluster::start_with(&assets, &[("00-racks.yaml", POLICY)]).await;
    let admin = cluster.client.clone();
    // gpu-node-1 and -2 (the harness's) in rack-a, two more in rack-b.
    cluster.add_gpu_node("gpu-node-3", 2).await;
    cluster.add_gpu_node("gpu-node-4", 2).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    for (node, rack) in
        [("gpu-node-1", "rack-a"), ("gpu-node-2", "rack-a"), ("gpu-node-3", "rack-b"), ("gpu-node-4", "rack-b")]
    {
        let patch = json!({"metadata": {"labels": {RACK: rack}}});
        nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)).await.expect("rack label");
    }
    let rack_of = |node: &str| if node == "gpu-node-1" || node == "gpu-node-2" { "rack-a" } else { "rack-b" };
    tenant_namespace(
        &admin,
        "vision",
        "alice",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]}]),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(impersonating(&cluster.kubeconfig, "alice").await, "vision");

    // --- A 4-GPU gang lands wholly in one rack, pinned there. ---
    create_gang(&pods, "fits", 4).await;
    wait_for("the gang bound in one rack", Duration::from_secs(60), || async {
        let all = members(&pods, "fits").await;
        all.len() == 4 && all.iter().all(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
    })
    .await;
    let all = members(&pods, "fits").await;
    let racks: BTreeSet<&str> =
        all.iter().map(|p| rack_of(p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap())).collect();
    assert_eq!(racks.len(), 1, "members in {racks:?}");
    let rack = racks.into_iter().next().unwrap();
    for p in &all {
        let selector = p.spec.as_ref().and_then(|s| s.node_selector.clone()).unwrap_or_default();
        assert_eq!(selector.get(RACK).map(String::as_str), Some(rack), "{:?} carries its rack", p.metadata.name);
    }
    let names: Vec<String> = all.iter().filter_map(|p| p.metadata.name.clone()).collect();
    for name in &names {
        pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    }
    wait_for("the gang gone", Duration::from_secs(60), || async { members(&pods, "fits").await.is_empty() }).await;

    // --- One GPU busy in each rack: 6 free, but no rack has 4. ---
    for (name, node) in [("busy-a", "gpu-node-1"), ("busy-b", "gpu-node-3")] {
        pods.create(&PostParams::default(), &busy(name, node)).await.expect("a busy pod");
    }
    wait_for("the busy pods bound", Duration::from_secs(60), || async {
        let mut bound = 0;
        for name in ["busy-a", "busy-b"] {
            bound += usize::from(pods.get(name).await.is_ok_and(|p| p.spec.is_some_and(|s| s.node_name.is_some())));
        }
        bound == 2
    })
    .await;
    create_gang(&pods, "waits", 4).await;
    let expected = "4/4 members present; needs 4 nvidia.com/gpu within one topology.kubernetes.io/rack; most free \
                    in one rack: 3 (rack-a); 6 free in all";
    wait_for("the waiting gang's explanation", Duration::from_secs(60), || async {
        waiting_message(&pods, "waits", 4).await.as_deref() == Some(expected)
    })
    .await;
    let level = format!("allot_gangs_waiting_for_topology{{level=\"{RACK}\"}}");
    wait_for("the per-level gauge", Duration::from_secs(30), || async {
        metric(&cluster.allot_metrics, &level) == Some(1.0)
    })
    .await;

    // --- A 5-GPU gang: no rack of 4 GPUs can ever hold it. ---
    create_gang(&pods, "huge", 5).await;
    wait_for("the too-large gang told", Duration::from_secs(60), || async {
        waiting_message(&pods, "huge", 5).await.is_some_and(|m| m.contains("no rack can ever hold it"))
    })
    .await;
    // It holds nobody back, and the 4-GPU gang still waits only for room in one rack.
    assert!(members(&pods, "waits").await.iter().all(gang_gated));

    // --- A member asking for a level its policy does not have is refused. ---
    let mut looser = gang_member("loose-0", "loose", 1);
    looser
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("allot.dev/topology".into(), "topology.kubernetes.io/zone".into());
    let err = pods.create(&PostParams::default(), &looser).await.expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("gang/metadata") && text.contains("topology.kubernetes.io/zone"), "{text}");
    // Asking for the level it has is fine.
    let mut tight = gang_member("tight-0", "tight", 1);
    tight.metadata.annotations.get_or_insert_default().insert("allot.dev/topology".into(), RACK.into());
    pods.create(&PostParams::default(), &tight).await.expect("a level the policy has");
}
