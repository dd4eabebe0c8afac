//! Test fixtures for the cluster view: policies from YAML, Pods as JSON, records and a store
//! over two 2-GPU nodes. Shared by the tests of `cluster`, `gang` and `quota`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};
use serde_json::{Value, json};

use super::{ClusterState, NodeInfo, Placement, PodRecord, PodShape};
use crate::model::policy::{PolicySet, Source, compile};
use crate::model::quantity::Quantity;

pub(crate) fn node(name: &str, gpus: i64) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        labels: BTreeMap::from([("node-type".into(), "my-precious".into())]),
        taints: vec![Taint { key: "nvidia.com/gpu".into(), effect: "NoSchedule".into(), ..Default::default() }],
        unschedulable: false,
        allocatable: BTreeMap::from([
            ("nvidia.com/gpu".into(), Quantity::from_units(gpus)),
            ("cpu".into(), Quantity::from_units(64)),
            ("pods".into(), Quantity::from_units(110)),
        ]),
    }
}

/// The shape of a gang member asking `gpus` GPUs, one CPU and a pod slot, tolerating the GPU
/// taint of [`node`].
pub(crate) fn gpu_shape(gpus: i64) -> PodShape {
    let requests = BTreeMap::from([
        ("nvidia.com/gpu".into(), Quantity::from_units(gpus)),
        ("cpu".into(), Quantity::from_units(1)),
        ("pods".into(), Quantity::from_units(1)),
    ]);
    let tolerations =
        vec![Toleration { key: Some("nvidia.com/gpu".into()), operator: Some("Exists".into()), ..Default::default() }];
    PodShape::new(requests, Placement { tolerations, ..Default::default() })
}

pub(crate) fn policies(extra: &str) -> PolicySet {
    compile(&[Source { name: "p.yaml".into(), text: extra.into() }]).unwrap()
}

pub(crate) fn member(name: &str, gang: &str, size: u32, created: &str, extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"), "creationTimestamp": created,
            "labels": {"allot.dev/gang-name": gang}, "annotations": {"allot.dev/gang-size": size.to_string()}},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "schedulingGates": [{"name": "allot.dev/gang"}]},
        "status": {"phase": "Pending"}
    });
    json_patch::merge(&mut pod, &extra);
    pod
}

/// The record of `pod`, checked to be the same from the watch's slim decoding
/// ([`super::WatchedPod`]) as from the whole Pod.
pub(crate) fn record(pod: &Value, p: &PolicySet) -> PodRecord {
    let full: Pod = serde_json::from_value(pod.clone()).unwrap();
    let super::WatchedPod(slim) = serde_json::from_value(pod.clone()).unwrap();
    let record = PodRecord::from_pod(&full, p, &crate::model::namespaces::NoNamespaces).unwrap();
    assert_eq!(PodRecord::from_pod(&slim, p, &crate::model::namespaces::NoNamespaces).as_ref(), Some(&record));
    record
}

pub(crate) fn cluster(p: &PolicySet, pods: &[Value]) -> ClusterState {
    let state = ClusterState::default();
    state.replace_nodes(vec![node("n1", 2), node("n2", 2)]);
    state.replace_pods(pods.iter().map(|pod| record(pod, p)).collect());
    state
}

pub(crate) fn queue_policies() -> PolicySet {
    policies(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  quota:\n    mode: Queue\n    limits: {nvidia.com/gpu: 2}\n    equivalents:\n      nvidia.com/mig-1g.10gb: {countsAs: nvidia.com/gpu, weight: 1/7}\n",
    )
}

/// A plain pod (no gang) asking `gpus`, behind the quota gate or running on n1.
pub(crate) fn team_pod(name: &str, gpus: u32, queued: bool, created: &str) -> Value {
    let mut pod = member(name, "-", 1, created, json!({}));
    pod["metadata"]["labels"] = json!({});
    pod["metadata"]["annotations"] = json!({});
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(gpus.to_string());
    if queued {
        pod["spec"]["schedulingGates"] = json!([{"name": "allot.dev/quota"}]);
    } else {
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        pod["spec"]["nodeName"] = json!("n1");
    }
    pod
}

/// Two gangs of four 1-GPU members, `a` older than `b`.
pub(crate) fn two_gangs() -> Vec<Value> {
    let mut pods = Vec::new();
    for i in 0..4 {
        pods.push(member(&format!("a-{i}"), "a", 4, "2026-11-22T01:00:00Z", json!({})));
        pods.push(member(&format!("b-{i}"), "b", 4, "2026-11-22T01:00:05Z", json!({})));
    }
    pods
}

/// Team vision (deny, `limit` GPUs) in a cluster that maps `gpu.nvidia.com` to `nvidia.com/gpu`.
pub(crate) fn dra_policies(limit: u32) -> crate::model::policy::PolicySet {
    let cluster = "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      \
                   gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n";
    let team = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  \
         quota: {{mode: Deny, limits: {{nvidia.com/gpu: {limit}}}}}\n"
    );
    use crate::model::policy::{Source, compile};
    compile(&[
        Source { name: "cluster.yaml".into(), text: cluster.into() },
        Source { name: "teams.yaml".into(), text: team },
    ])
    .unwrap()
}
