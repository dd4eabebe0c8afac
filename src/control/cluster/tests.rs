//! The cluster view's own tests: usage sums, gauges, and the gang directory admission reads.

use serde_json::json;

use super::fixtures::{cluster, member, policies, queue_policies, team_pod, two_gangs};
use super::{QuotaGauge, UsageState};
use crate::admission::directory::GangDirectory;
use crate::model::quantity::Quantity;

#[test]
fn quota_usage_counts_live_and_terminating_pods_and_whole_gangs_but_not_finished_ones() {
    let p = policies("");
    let mut running = member("r", "g1", 1, "2026-11-22T01:00:00Z", json!({"spec": {"nodeName": "n1"}}));
    running["metadata"]["labels"] = json!({});
    let mut done = running.clone();
    done["metadata"]["name"] = json!("done");
    done["status"]["phase"] = json!("Succeeded");
    let mut terminating = running.clone();
    terminating["metadata"]["name"] = json!("terminating");
    terminating["metadata"]["deletionTimestamp"] = json!("2026-11-22T01:05:00Z");
    // One member present of a gang of 3 (2 GPUs each): the gang is charged whole.
    let mut gang_member = member("m-0", "big", 3, "2026-11-22T01:00:00Z", json!({}));
    gang_member["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
    let state = cluster(&p, &[running, done, terminating, gang_member]);
    let (usage, namespaces) = state.usage_where(&mut |ns| ns == "ml");
    // The terminating pod holds its GPU until it is gone.
    assert_eq!(usage["nvidia.com/gpu"], Quantity::from_units(1 + 1 + 3 * 2));
    assert_eq!(namespaces, ["ml"]);
    let (usage, _) = state.usage_where(&mut |_| false);
    assert!(usage.is_empty());
}

#[test]
fn accelerator_gauges_split_each_team_by_state_and_quota_units_count_mig_slices() {
    let p = queue_policies();
    let mut mig = team_pod("mig", 0, false, "2026-11-22T01:00:00Z");
    mig["spec"]["containers"][0]["resources"]["limits"] = json!({"nvidia.com/mig-1g.10gb": "7"});
    let mut pending = team_pod("pending", 1, false, "2026-11-22T01:00:00Z");
    pending["spec"].as_object_mut().unwrap().remove("nodeName");
    let mut elsewhere = team_pod("elsewhere", 4, false, "2026-11-22T01:00:00Z");
    elsewhere["metadata"]["namespace"] = json!("scratch");
    let mut done = team_pod("done", 8, false, "2026-11-22T01:00:00Z");
    done["status"]["phase"] = json!("Failed");
    let pods = [
        team_pod("running", 1, false, "2026-11-22T01:00:00Z"),
        team_pod("queued", 2, true, "2026-11-22T01:00:01Z"),
        member("g-0", "g", 2, "2026-11-22T01:00:00Z", json!({})),
        mig,
        pending,
        elsewhere,
        done,
    ];
    let state = cluster(&p, &pods);
    let usage = state.accelerator_usage(&p, &crate::model::namespaces::NoNamespaces);
    let get = |team: &str, resource: &str, s: UsageState| {
        usage.requested.iter().find(|g| g.team == team && g.resource == resource && g.state == s).map(|g| g.amount)
    };
    assert_eq!(get("ml", "nvidia.com/gpu", UsageState::Bound), Some(1.0));
    assert_eq!(get("ml", "nvidia.com/gpu", UsageState::QuotaQueued), Some(2.0));
    assert_eq!(get("ml", "nvidia.com/gpu", UsageState::GangGated), Some(1.0));
    assert_eq!(get("ml", "nvidia.com/gpu", UsageState::Pending), Some(1.0));
    assert_eq!(get("ml", "nvidia.com/mig-1g.10gb", UsageState::Bound), Some(7.0));
    assert_eq!(get("", "nvidia.com/gpu", UsageState::Bound), Some(4.0), "namespaces of no team");
    assert_eq!(usage.requested.len(), 6, "no cpu, no pods, nothing finished: {:?}", usage.requested);
    // Quota: 1 running + 1 gang-gated + 1 pending + 7/7 MIG = 4 GPU-equivalents; queued excluded.
    let (team, resource) = ("ml".into(), "nvidia.com/gpu".into());
    assert_eq!(usage.quotas, [QuotaGauge { team, resource, used: 4.0, limit: 2.0, borrowed_lent: None }]);
}

/// Label values never come from a Pod: names the policies do not write out (pods asking
/// `nvidia.com/mig-x0001` … in a team without a quota; they never start, but they exist) are
/// summed under the prefix they match, so a tenant cannot make a series of each.
#[test]
fn accelerator_gauges_label_unlisted_names_by_their_prefix() {
    let p = queue_policies();
    let mut pods: Vec<_> = (0..300)
        .map(|i| {
            let mut pod = team_pod(&format!("odd-{i}"), 0, false, "2026-11-22T01:00:00Z");
            pod["spec"]["containers"][0]["resources"]["limits"] = json!({format!("nvidia.com/mig-x{i:04}"): "1"});
            pod
        })
        .collect();
    let mut listed = team_pod("listed", 0, false, "2026-11-22T01:00:00Z");
    listed["spec"]["containers"][0]["resources"]["limits"] = json!({"nvidia.com/mig-1g.10gb": "7"});
    pods.push(listed);
    let state = cluster(&p, &pods);
    let usage = state.accelerator_usage(&p, &crate::model::namespaces::NoNamespaces);
    let resources: std::collections::BTreeSet<&str> = usage.requested.iter().map(|g| g.resource.as_str()).collect();
    assert_eq!(resources, ["nvidia.com/mig-*", "nvidia.com/mig-1g.10gb"].into(), "{:?}", usage.requested);
    let odd = usage.requested.iter().find(|g| g.resource == "nvidia.com/mig-*").map(|g| g.amount);
    assert_eq!(odd, Some(300.0), "summed, not dropped");
}

#[test]
fn the_directory_serves_admission_from_the_watch() {
    let p = policies("");
    let state = cluster(&p, &two_gangs());
    let peers = state.peers("ml", "a");
    assert_eq!(peers.len(), 4);
    assert_eq!(peers[0].size, Some(4));
    state.remove_pod("ml", "a-0");
    assert_eq!(state.peers("ml", "a").len(), 3);
    assert!(state.peers("ml", "nope").is_empty());
}

/// A typical pod: one GPU, pending, the tolerations the mutating webhook and the API server add.
fn typical_pod(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": "5f0c3c2e-8a4b-4d3e-9c1a-2b7e6f1d0a93",
            "creationTimestamp": "2026-11-22T01:00:00Z"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}],
            "priorityClassName": "low-priority", "priority": 0,
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Pending"}
    })
}

/// Pins what a pod costs the cluster view (issue 18): a field added to `PodRecord` shows up
/// here as a number to justify, not later as an OOM at 100,000 pods. Per pod the store holds
/// the record (boxed), its table slot (key: two `Arc<str>` = 32 bytes, the box pointer: 8) and
/// what the record owns alone on the heap; namespaces, resource names and placements are
/// shared.
#[test]
fn a_typical_pod_record_stays_small() {
    use super::records::PodRecord;
    let p = policies("");
    let a = super::fixtures::record(&typical_pod("trainer-7f9c2-00001"), &p);
    let b = super::fixtures::record(&typical_pod("trainer-7f9c2-00002"), &p);
    // 152 bytes at issue 18's measurement; + 32 for the queue's arrival order and the two
    // condition fingerprints (issue 12): 3 MiB at 100,000 pods, inside docs/src/sizing.md's figure;
    // + 8 for the shared claims' pointer (issue 15): 0.8 MB more at 100,000 pods; + 16 for the
    // uid the gate lifts test (a pod made again under its name is not released in its
    // predecessor's place), with its 16 + 36 heap bytes: 6.8 MB more at 100,000 pods; + 8 for
    // that uid kept in 16 bytes of the record instead of on the heap (issue 49, below).
    assert_eq!(std::mem::size_of::<PodRecord>(), 216, "size_of::<PodRecord>() changed: update docs/src/sizing.md");
    // Name (16 + 19 bytes), two requests (32 bytes each); the API server's uid takes no heap.
    assert_eq!(a.owned_heap_bytes(), 16 + 19 + 2 * 32);
    assert_eq!(a.uid.as_ref().map(ToString::to_string).as_deref(), Some("5f0c3c2e-8a4b-4d3e-9c1a-2b7e6f1d0a93"));
    // A plain pod keeps no placement (no decision reads it); a gated gang member keeps one,
    // and the placement (three tolerations) and the namespace are one shared copy, not one a pod.
    assert!(a.placement.is_none() && b.placement.is_none(), "a plain pod keeps no placement");
    let gated = |name: &str| {
        let mut pod = typical_pod(name);
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": "trainer"});
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
        pod["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}]);
        super::fixtures::record(&pod, &p)
    };
    let (a, b) = (gated("trainer-7f9c2-00001"), gated("trainer-7f9c2-00002"));
    let (pa, pb) = (a.placement.as_ref().expect("gated: placement kept"), b.placement.as_ref().expect("placement"));
    assert!(std::sync::Arc::ptr_eq(pa, pb), "pods of one template share their placement");
    assert_eq!(pa.tolerations.len(), 3);
    assert!(std::sync::Arc::ptr_eq(&a.namespace, &b.namespace), "namespaces are interned");
    // A bound pod keeps no placement at all.
    let mut bound = typical_pod("bound");
    bound["spec"]["nodeName"] = json!("n1");
    assert!(super::fixtures::record(&bound, &p).placement.is_none());
    // A member's shape for the simulation is whole.
    let shape = a.shape();
    assert_eq!(shape.tolerations().len(), 3);
    assert!(std::sync::Arc::ptr_eq(&shape.placement, pa), "a shape shares its record's placement");
    assert_eq!(shape.requests["nvidia.com/gpu"], Quantity::from_units(1));
    assert_eq!(shape.requests["pods"], Quantity::from_units(1));
}

/// A pod that never binds (a selector no node matches) with thousands of distinct tolerations:
/// Kubernetes bounds neither list, and the view once kept both for every unbound pod, several
/// MB of each such pod in every replica. A plain pod keeps none of it; a gang member over the
/// bounds keeps a marker. What each costs is what a typical pod costs.
fn hostile_pod(name: &str, tolerations: usize, gang: bool) -> serde_json::Value {
    let mut pod = typical_pod(name);
    pod["spec"]["tolerations"] =
        (0..tolerations).map(|i| json!({"key": format!("{name}-k{i}"), "operator": "Exists"})).collect();
    pod["spec"]["nodeSelector"] = json!({"nowhere": name});
    pod["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "10m"}});
    if gang {
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": name});
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
        pod["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}]);
    }
    pod
}

/// Heap bytes of a record with its placement counted whole (as if nothing were shared).
fn heap_with_placement(r: &super::PodRecord) -> usize {
    r.owned_heap_bytes() + r.placement.as_ref().map_or(0, |p| std::mem::size_of_val(&**p) + p.heap_bytes())
}

#[test]
fn a_plain_unbound_pod_keeps_no_placement_however_large() {
    let p = policies("");
    let plain = super::fixtures::record(&hostile_pod("h-0", 5_000, false), &p);
    assert!(plain.placement.is_none(), "a plain pod keeps no placement");
    // Name, uid and two requests (cpu, pods): about what a typical pod costs.
    assert!(heap_with_placement(&plain) < 256, "{} heap bytes", heap_with_placement(&plain));
    let member = super::fixtures::record(&hostile_pod("h-1", 5_000, true), &p);
    assert!(member.placement_excess().is_some(), "a gang member over the bounds keeps the marker");
    assert!(heap_with_placement(&member) < 1024, "{} heap bytes", heap_with_placement(&member));
}

/// N hostile pods upserted into the store cost what N typical pods do: the approximate heap of
/// the view (records and the placements they hold) grows by well under a kilobyte a pod.
#[test]
fn hostile_pods_do_not_grow_the_view() {
    let p = policies("");
    let state = super::ClusterState::default();
    let per_pod = |state: &super::ClusterState| {
        let view = state.view();
        let (n, bytes) = view.pods().fold((0, 0), |(n, b), r| (n + 1, b + heap_with_placement(r)));
        bytes / n.max(1)
    };
    for i in 0..50 {
        state.upsert_pod(super::fixtures::record(&hostile_pod(&format!("h-{i}"), 2_000, i % 2 == 0), &p));
    }
    let hostile = per_pod(&state);
    assert_eq!(state.tracked().pods, 50);
    assert!(hostile < 1024, "{hostile} bytes a pod");
}

/// A pod asking thousands of made-up resources (over `tenant::MAX_RESOURCE_NAMES`, admitted
/// before admission bounded them) keeps that many in its record, those decisions read first;
/// and a namespace's usage forgets a name once no pod asks it (a loop of such pods created and
/// deleted grew it for good).
#[test]
fn made_up_resource_names_are_bounded_and_forgotten() {
    let p = policies("");
    let mut pod = typical_pod("many");
    let mut limits = serde_json::Map::new();
    for i in 0..5_000 {
        limits.insert(format!("example.com/r{i:05}"), json!("1"));
    }
    limits.insert("nvidia.com/gpu".into(), json!("1"));
    limits.insert("cpu".into(), json!("2"));
    pod["spec"]["containers"][0]["resources"] = json!({"limits": limits.clone(), "requests": limits});
    let r = super::fixtures::record(&pod, &p);
    assert_eq!(r.requests.len(), crate::admission::tenant::MAX_RESOURCE_NAMES);
    assert!(r.requests.iter().any(|(n, _)| &**n == "nvidia.com/gpu") && r.requests.iter().any(|(n, _)| &**n == "cpu"));
    assert!(r.owned_heap_bytes() < 8 * 1024, "{}", r.owned_heap_bytes());

    let state = super::ClusterState::default();
    for i in 0..20 {
        let mut p2 = typical_pod(&format!("odd-{i}"));
        p2["spec"]["containers"][0]["resources"] = json!({"requests": {format!("example.com/once-{i}"): "1"}});
        state.upsert_pod(super::fixtures::record(&p2, &p));
        state.remove_pod("ml", &format!("odd-{i}"));
    }
    let (usage, namespaces) = state.usage_where(&mut |_| true);
    assert!(usage.is_empty() && namespaces.is_empty(), "{usage:?}");
}

/// Names a tenant writes without a bound of the API server's (an owner reference's name and
/// kind, Kueue's pod-group name as an annotation) are not kept beyond an object name's length.
#[test]
fn unbounded_names_are_not_kept() {
    let p = policies(
        "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [Job, KubeflowJob]\n",
    );
    let long = "x".repeat(100_000);
    let mut pod = typical_pod("w-0");
    pod["metadata"]["labels"] = json!({"training.kubeflow.org/job-name": "t"});
    pod["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": long, "uid": "o"}]);
    let r = super::fixtures::record(&pod, &p);
    let gang = r.gang.as_ref().expect("an inferred member");
    assert!(gang.owner.is_none(), "no owner kept for a name no object has");
    assert!(r.owned_heap_bytes() < 512, "{}", r.owned_heap_bytes());
    pod["metadata"]["ownerReferences"][0]["name"] = json!("t");
    pod["metadata"]["ownerReferences"][0]["kind"] = json!(long);
    assert!(super::fixtures::record(&pod, &p).gang.is_some_and(|g| g.owner.is_none()), "nor for such a kind");
    pod["metadata"]["ownerReferences"][0]["kind"] = json!("PyTorchJob");
    assert!(super::fixtures::record(&pod, &p).gang.is_some_and(|g| g.owner.is_some_and(|o| &*o.name == "t")));
    // Kueue's group name from an annotation: invalid gang metadata (admission denies it), no gang.
    let mut kueue = typical_pod("k-0");
    kueue["metadata"]["annotations"] =
        json!({"kueue.x-k8s.io/pod-group-name": long, "kueue.x-k8s.io/pod-group-total-count": "2"});
    assert!(super::fixtures::record(&kueue, &p).gang.is_none());
}

/// The controller decides nothing until Pods and Nodes have each been listed once, and not
/// while a relist is half applied (CI saw a pass with the pods in and no node yet write
/// "InsufficientResources: 0 free" on a gang that fits).
#[test]
fn the_view_is_complete_only_once_pods_and_nodes_are_listed_and_no_relist_is_under_way() {
    let state = super::ClusterState::default();
    assert!(!state.complete(), "nothing listed");
    state.begin_relist();
    state.finish_relist();
    assert!(!state.complete(), "pods listed, nodes not");
    state.replace_nodes(Vec::new());
    assert!(state.complete(), "both listed (an empty cluster is a complete view)");
    state.begin_relist();
    assert!(!state.complete(), "a relist under way");
    state.finish_relist();
    assert!(state.complete());
    let nodes_first = super::ClusterState::default();
    nodes_first.replace_nodes(Vec::new());
    assert!(!nodes_first.complete(), "nodes listed, pods not");
}

/// `spec.nodeName` is judged against the nodes only once they are listed: before, nothing
/// can be said; after, a name no node has is unknown (admission refuses it), a node's taints
/// are its own.
#[test]
fn a_node_is_unknown_only_once_the_nodes_are_listed() {
    use crate::admission::directory::NodeLookup;
    let state = super::ClusterState::default();
    assert_eq!(state.node("gpu-1"), NodeLookup::NotWatched);
    let taint = k8s_openapi::api::core::v1::Taint {
        key: "nvidia.com/gpu".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    state.replace_nodes(vec![super::records::NodeInfo {
        name: "gpu-1".into(),
        labels: Default::default(),
        taints: vec![taint.clone()],
        unschedulable: false,
        allocatable: Default::default(),
    }]);
    assert_eq!(state.node("gpu-1"), NodeLookup::Taints(vec![taint]));
    assert_eq!(state.node("gpu-9"), NodeLookup::Unknown);
}

/// A member the controller is deleting stops counting for its gang's quorum at once (the next
/// pass must not delete it twice), keeps its devices in the tallies until the watch says it is
/// gone, and counts again if the deletion failed.
#[test]
fn a_member_marked_deleting_leaves_the_quorum_but_not_the_usage_until_it_is_gone() {
    let p = policies("");
    let state = cluster(&p, &two_gangs());
    let before = state.gang_tally("ml", "a");
    assert_eq!((before.members, before.live), (4, 4));
    let (usage, _) = state.usage_where(&mut |ns| ns == "ml");
    state.mark_deleting("ml", "a-0", None, true);
    state.mark_deleting("ml", "a-0", None, true);
    let marked = state.gang_tally("ml", "a");
    assert_eq!((marked.members, marked.live), (4, 3), "no longer live, still holding its devices");
    assert_eq!(state.usage_where(&mut |ns| ns == "ml").0, usage);
    assert!(state.view().pod("ml", "a-0").is_some_and(|r| r.terminating));
    state.mark_deleting("ml", "a-0", None, false);
    let back = state.gang_tally("ml", "a");
    assert_eq!((back.members, back.live), (4, 4), "a failed deletion: a member again");
    state.mark_deleting("ml", "missing", None, true);
    assert_eq!(state.tracked().pods, 8);
    // A deletion meant for another pod of that name (a uid the record does not carry) marks
    // nothing: the pod made again since is a member.
    let uid = state.view().pod("ml", "a-0").and_then(|r| r.uid.clone());
    assert!(uid.is_some(), "the fixture's pods carry uids");
    state.mark_deleting("ml", "a-0", Some("the-uid-of-an-earlier-a-0"), true);
    assert!(state.view().pod("ml", "a-0").is_some_and(|r| !r.terminating));
    state.mark_deleting("ml", "a-0", uid.map(|u| u.to_string()).as_deref(), true);
    assert!(state.view().pod("ml", "a-0").is_some_and(|r| r.terminating));
}

/// A relist applies pods one by one into the live view and, when done, drops those it did not
/// contain (deleted while the watch was down), with their usage.
#[test]
fn a_relist_replaces_the_pods_in_place_and_drops_the_ones_it_did_not_see() {
    let p = policies("");
    let state = cluster(&p, &[typical_pod("stays"), typical_pod("gone")]);
    assert_eq!(state.tracked().pods, 2);
    state.begin_relist();
    state.upsert_pod(super::fixtures::record(&typical_pod("stays"), &p));
    state.upsert_pod(super::fixtures::record(&typical_pod("new"), &p));
    // Until the relist ends, the view still counts what it had (no pod vanishes half-way),
    // and says it is partial: the controller and the ledger reconciler wait for the end.
    assert_eq!(state.tracked().pods, 3);
    assert!(state.relisting());
    state.finish_relist();
    assert!(!state.relisting());
    let view = state.view();
    let mut names: Vec<&str> = view.pods().map(|p| &*p.name).collect();
    names.sort();
    assert_eq!(names, ["new", "stays"]);
    drop(view);
    let (usage, _) = state.usage_where(&mut |ns| ns == "ml");
    assert_eq!(usage["nvidia.com/gpu"], Quantity::from_units(2));
    // A second relist that sees everything drops nothing.
    state.begin_relist();
    state.upsert_pod(super::fixtures::record(&typical_pod("stays"), &p));
    state.upsert_pod(super::fixtures::record(&typical_pod("new"), &p));
    state.finish_relist();
    assert_eq!(state.tracked().pods, 2);
}

#[test]
fn gate_gauges_count_each_gate_and_age_its_oldest_live_pod() {
    use super::{Gate, GateGauge};
    let p = queue_policies();
    // 2026-11-22T01:00:00Z is 1_795_309_200 s since the epoch.
    let created = 1_795_309_200;
    let mut deleting = member("going", "g", 2, "2026-11-21T00:00:00Z", json!({}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-22T01:05:00Z");
    let pods = [
        member("g-0", "g", 2, "2026-11-22T01:00:00Z", json!({})),
        member("g-1", "g", 2, "2026-11-22T01:00:30Z", json!({})),
        team_pod("queued", 2, true, "2026-11-22T01:00:10Z"),
        team_pod("running", 1, false, "2026-11-21T00:00:00Z"),
        deleting,
    ];
    let state = cluster(&p, &pods);
    assert_eq!(
        state.gate_gauges(created + 100),
        [
            GateGauge { gate: Gate::Gang, pods: 2, oldest_seconds: 100 },
            GateGauge { gate: Gate::Quota, pods: 1, oldest_seconds: 90 },
        ]
    );
    // Nothing gated: both gates still reported, at zero.
    let empty = cluster(&p, &[team_pod("running", 1, false, "2026-11-21T00:00:00Z")]);
    assert_eq!(
        empty.gate_gauges(created),
        [
            GateGauge { gate: Gate::Gang, pods: 0, oldest_seconds: 0 },
            GateGauge { gate: Gate::Quota, pods: 0, oldest_seconds: 0 },
        ]
    );
    // A clock behind a creation time never makes an age negative.
    assert_eq!(state.gate_gauges(created - 1000)[0].oldest_seconds, 0);
}

/// GangPolicy `nativeScheduling`: the record of a member of the PodGroup Allot hands its
/// inferred gang to keeps the gang's owner, so the leader can create that PodGroup
/// ([`super::ClusterState::hand_offs`]); a PodGroup of another name, or a policy without the
/// switch, gives the leader nothing to create.
#[test]
fn handed_off_gangs_are_listed_once_with_their_owner() {
    let native = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [Job]\n  nativeScheduling: true\n";
    let worker = |name: &str, pod_group: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "ml",
                            "labels": {"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"},
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u"}]},
               "spec": {"containers": [{"name": "c"}], "schedulingGroup": {"podGroupName": pod_group}},
               "status": {"phase": "Pending"}})
    };
    let p = policies(native);
    let state =
        cluster(&p, &[worker("w-0", "allot-job-train"), worker("w-1", "allot-job-train"), worker("x-0", "mine")]);
    let owner = super::Owner {
        kind: crate::model::gang::membership::InferredKind::Job,
        api_kind: "Job".into(),
        name: "train".into(),
    };
    assert_eq!(state.hand_offs(), vec![("ml".to_string(), "allot-job-train".to_string(), owner)]);
    let off = policies(&native.replace("nativeScheduling: true", "nativeScheduling: false"));
    assert_eq!(cluster(&off, &[worker("w-0", "allot-job-train")]).hand_offs(), vec![]);
}

/// A PodGroup seen after its members sizes their quota group in place (its tally then charges
/// `minCount`); gone, the members count alone again; a gated pod is an Allot gang member
/// whatever PodGroup it names (the webhook gated it because the cluster does not gang them).
#[test]
fn a_native_groups_size_follows_its_pod_group_and_allots_gate_wins() {
    let team = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Deny, limits: {nvidia.com/gpu: 8}}\n";
    let p = policies(team);
    let member = |name: &str| {
        let mut pod = team_pod(name, 1, false, "2026-11-22T01:00:00Z");
        pod["spec"]["schedulingGroup"] = json!({"podGroupName": "ddp"});
        pod
    };
    let state = cluster(&p, &[member("m-0"), member("m-1")]);
    let used =
        || state.usage_where(&mut |ns| ns == "ml").0.get("nvidia.com/gpu").map_or(0, |q| q.nanos() / 1_000_000_000);
    assert_eq!(used(), 2, "size unknown: each member alone");
    let generation = state.generation();
    state.set_native_group_size("ml", "ddp", Some(4));
    assert_eq!(used(), 4, "the group whole");
    assert!(state.generation() > generation, "the controller is woken");
    state.set_native_group_size("ml", "other", Some(100));
    assert_eq!(used(), 4);
    state.set_native_group_size("ml", "ddp", None);
    assert_eq!(used(), 2);

    let mut gated = member("g-0");
    gated["metadata"]["labels"] = json!({"allot.dev/gang-name": "mine"});
    gated["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
    gated["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}]);
    assert_eq!(crate::model::gang::membership::native_pod_group_of(&gated), None);
    let record = super::fixtures::record(&gated, &p);
    let gang = record.gang.as_deref().expect("a gang");
    assert_eq!((gang.name.as_str(), gang.native), ("mine", false));
}

/// The watch's records of a claim-template pod: one event while its template exists, the next
/// after it is gone (or before the claim cache knows it).
mod watched_claim_records {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    use crate::control::cluster::{ClusterState, PodRecord};
    use crate::model::dra::{ClaimObjects, ClaimSource, class_resource};
    use crate::model::namespaces::StaticNamespaces;
    use crate::model::quantity::Quantity;

    fn policies() -> crate::model::policy::PolicySet {
        let cluster = "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n";
        crate::model::policy::compile(&[crate::model::policy::Source { name: "c.yaml".into(), text: cluster.into() }])
            .expect("policies")
    }

    /// A source holding `templates` (name, GPUs) in namespace ml.
    fn templates(templates: &[(&str, u64)]) -> ClaimObjects {
        let mut source = ClaimObjects::new("not found");
        for (name, gpus) in templates {
            let template: Value = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [{"name": "r",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": gpus}}]}}}
            });
            assert!(source.insert(&template, "ml"));
        }
        source
    }

    fn template_pod(name: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four"}], "containers": [{"name": "c"}]},
            "status": {"phase": phase}
        }))
        .expect("a Pod")
    }

    fn claim_devices(state: &ClusterState, name: &str) -> Option<Quantity> {
        let view = state.view();
        let record = view.pod("ml", name)?;
        record.requests.iter().find(|(n, _)| n.as_ref() == class_resource("gpu.nvidia.com")).map(|(_, q)| *q)
    }

    #[test]
    fn claim_devices_once_counted_stay_counted_while_the_pod_lives() {
        let policies = policies();
        let labels = StaticNamespaces::default();
        let (with_template, without) = (templates(&[("four", 4)]), templates(&[]));
        let state = ClusterState::default();
        let record = |pod: &Pod, claims: &dyn ClaimSource| {
            PodRecord::from_pod_with_claims(pod, &policies, &labels, claims).expect("a record")
        };

        state.upsert_pod(record(&template_pod("p", "Pending"), &with_template));
        assert_eq!(claim_devices(&state, "p"), Some(Quantity::from_units(4)));
        // The tenant deletes the template; the pod's next event cannot resolve it.
        let unresolved = record(&template_pod("p", "Running"), &without);
        assert!(unresolved.claims_unresolved);
        state.upsert_pod(unresolved);
        assert_eq!(claim_devices(&state, "p"), Some(Quantity::from_units(4)), "still charged");
        // Once deleted, the name is free: a new pod of that name starts from its own claims.
        state.remove_pod("ml", "p");
        state.upsert_pod(record(&template_pod("p", "Pending"), &without));
        assert_eq!(claim_devices(&state, "p"), None);
        // A resolved record replaces the devices (claims cannot change, so they are the same).
        state.upsert_pod(record(&template_pod("q", "Pending"), &with_template));
        state.upsert_pod(record(&template_pod("q", "Running"), &with_template));
        assert_eq!(claim_devices(&state, "q"), Some(Quantity::from_units(4)));
    }

    /// The tenant deletes template `four` of her running pod and makes it again asking 1 GPU,
    /// then touches the pod: its record still counts the 4 GPUs of the claim made from the old
    /// template (named in its status, controlled by it), not the new template's 1.
    #[test]
    fn a_template_made_again_smaller_does_not_shrink_a_running_pods_count() {
        let policies = policies();
        let labels = StaticNamespaces::default();
        let made = |pod: &Pod| {
            let mut pod = pod.clone();
            pod.metadata.uid = Some("pod-uid".into());
            let status = pod.status.get_or_insert_with(Default::default);
            status.resource_claim_statuses = Some(vec![k8s_openapi::api::core::v1::PodResourceClaimStatus {
                name: "gpus".into(),
                resource_claim_name: Some("p-gpus-x7k2q".into()),
            }]);
            pod
        };
        let with_claim = |template_gpus: u64| {
            let mut source = templates(&[("four", template_gpus)]);
            let claim = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "p-gpus-x7k2q", "namespace": "ml",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": true}]},
                "spec": {"devices": {"requests": [{"name": "r",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4}}]}}
            });
            assert!(source.insert(&claim, "ml"));
            source
        };
        let state = ClusterState::default();
        let record = |pod: &Pod, claims: &dyn ClaimSource| {
            PodRecord::from_pod_with_claims(pod, &policies, &labels, claims).expect("a record")
        };
        state.upsert_pod(record(&made(&template_pod("p", "Running")), &with_claim(4)));
        assert_eq!(claim_devices(&state, "p"), Some(Quantity::from_units(4)));
        // Template `four` deleted and made again with 1 GPU; the pod is relabelled.
        let touched = record(&made(&template_pod("p", "Running")), &with_claim(1));
        assert!(!touched.claims_unresolved);
        state.upsert_pod(touched);
        assert_eq!(claim_devices(&state, "p"), Some(Quantity::from_units(4)), "the 4 GPUs it holds");
        // The template gone and the status naming a 1-GPU claim (a tenant's own, owned by the
        // pod): the same pod (uid) keeps what its claims counted, since they cannot change.
        let mut small = crate::model::dra::ClaimObjects::new("x");
        assert!(small.insert(
            &json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "p-gpus-x7k2q", "namespace": "ml",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": true}]},
                "spec": {"devices": {"requests": [{"name": "r",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}
            }),
            "ml"
        ));
        let forged = record(&made(&template_pod("p", "Running")), &small);
        state.upsert_pod(forged.clone());
        assert_eq!(claim_devices(&state, "p"), Some(Quantity::from_units(4)), "never fewer for the same pod");
        // Another pod under the name (another uid) counts its own.
        let mut other = forged;
        other.uid = Some("another-uid".into());
        state.upsert_pod(other);
        assert_eq!(claim_devices(&state, "p"), Some(Quantity::from_units(1)));
    }
}

/// A pod's shape reads only the fields of the scheduler's formula (containers' and init
/// containers' resources, sidecars, overhead) and gets what the formula gets from the whole
/// spec: limits standing in for requests, the init peak, sidecars added to the app containers.
#[test]
fn a_pods_shape_counts_what_the_whole_spec_counts() {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "vision"},
        "spec": {
            "overhead": {"cpu": "250m"},
            "initContainers": [
                {"name": "sidecar", "image": "x", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
                {"name": "warmup", "image": "x", "resources": {"requests": {"cpu": "6"}, "limits": {"nvidia.com/gpu": "3"}}}
            ],
            "containers": [
                {"name": "a", "image": "x", "env": [{"name": "E", "value": "v"}],
                 "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "image": "x"}
            ]
        }
    }))
    .unwrap();
    let shape = super::shape_of(&pod);
    let whole = crate::model::resources::pod_requests(&serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap());
    let mut expected = whole.clone();
    expected.insert("pods".into(), Quantity::from_units(1));
    assert_eq!(shape.requests, expected);
    // max(app 2 + sidecar 1, warmup 6 + sidecar 1) + 0.25 overhead = 7.25 cpu;
    // max(2 + 1, 3 + 1) = 4 GPUs.
    assert_eq!(whole.get("cpu"), Some(&Quantity::parse("7250m").unwrap()));
    assert_eq!(whole.get("nvidia.com/gpu"), Some(&Quantity::from_units(4)));

    // Pod-level requests (`spec.resources`) replace the containers' cpu: 64 + 0.25 overhead,
    // in the shape as in the whole spec, and through the watch's slim decoding too.
    let mut pod_level = serde_json::to_value(&pod).unwrap();
    pod_level["spec"]["resources"] = json!({"requests": {"cpu": "64"}});
    let pod_level: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod_level).unwrap();
    let shape = super::shape_of(&pod_level);
    assert_eq!(shape.requests.get("cpu"), Some(&Quantity::parse("64250m").unwrap()));
    let watched: super::WatchedPod = serde_json::from_value(serde_json::to_value(&pod_level).unwrap()).unwrap();
    let watched = watched.0;
    assert_eq!(super::shape_of(&watched).requests, shape.requests);
}

/// A condition write that failed is unmarked, unless a newer one was marked for the pod since:
/// that one is on its way.
#[test]
fn a_failed_write_unmarks_only_its_own_condition() {
    let p = policies("");
    let state = cluster(&p, &[member("w-0", "g", 2, "2026-11-22T01:00:00Z", json!({}))]);
    let condition = |state: &super::ClusterState| state.view().pod("ml", "w-0").map(|r| r.gang_condition);
    state.mark_condition("ml", "w-0", false, 5);
    state.mark_condition("ml", "w-0", false, 7);
    state.unmark_condition("ml", "w-0", false, 5);
    assert_eq!(condition(&state), Some(7), "the newer one stays marked");
    state.unmark_condition("ml", "w-0", false, 7);
    assert_eq!(condition(&state), Some(0));
    state.unmark_condition("ml", "gone", false, 7);
}

/// A condition the controller is writing stays marked through watch events of the pod that
/// predate the write (kube-scheduler's `PodScheduled` on a new gated pod), also those the watch
/// delivers after the write completed, until the watch echoes the condition; from then on the
/// record follows the watch again. Before, such an event dropped the mark and the next pass told
/// the pod again (a duplicate write and Event).
#[test]
fn a_condition_in_flight_survives_watch_events_until_the_watch_echoes_it() {
    let p = policies("");
    let pod = member("w-0", "g", 2, "2026-11-22T01:00:00Z", json!({}));
    let state = cluster(&p, std::slice::from_ref(&pod));
    let condition =
        |state: &super::ClusterState| state.view().pod("ml", "w-0").map(|r| (r.gang_condition, r.quota_condition));
    let event = |state: &super::ClusterState| state.upsert_pod(super::fixtures::record(&pod, &p));
    let told = |reason: &str| {
        let fingerprint = super::records::condition_fingerprint(false, reason, "m");
        let mut told = pod.clone();
        told["status"] = json!({"conditions": [
            {"type": super::action::CONDITION, "status": "False", "reason": reason, "message": "m"}
        ]});
        (fingerprint, told)
    };
    let (five, told_five) = told("Five");
    let (seven, told_seven) = told("Seven");

    state.mark_condition("ml", "w-0", false, five);
    event(&state);
    assert_eq!(condition(&state), Some((five, 0)), "an event while the write is under way keeps the mark");
    state.mark_condition("ml", "w-0", true, 9);
    event(&state);
    assert_eq!(condition(&state), Some((five, 9)), "both conditions in flight");
    state.condition_landed("ml", "w-0", false, five);
    state.unmark_condition("ml", "w-0", true, 9);
    assert_eq!(condition(&state), Some((five, 0)), "the failed one unmarked at once");
    event(&state);
    assert_eq!(condition(&state), Some((five, 0)), "an event older than the landed write keeps the mark");
    state.upsert_pod(super::fixtures::record(&told_five, &p));
    assert_eq!(condition(&state), Some((five, 0)), "the echo");
    event(&state);
    assert_eq!(condition(&state), Some((0, 0)), "after the echo, the record follows the watch (here: no condition)");

    // A newer condition marked while an older one flies: neither the older one's completion
    // nor its echo ends the newer one's flight.
    state.mark_condition("ml", "w-0", false, five);
    state.mark_condition("ml", "w-0", false, seven);
    state.condition_landed("ml", "w-0", false, five);
    state.upsert_pod(super::fixtures::record(&told_five, &p));
    assert_eq!(condition(&state), Some((seven, 0)));
    state.condition_landed("ml", "w-0", false, seven);
    state.upsert_pod(super::fixtures::record(&told_seven, &p));
    event(&state);
    assert_eq!(condition(&state), Some((0, 0)), "the newer one echoed: the watch again");

    // A pod made again under the name while its predecessor's condition flies, its deletion
    // not seen (a relist): it starts untold.
    state.mark_condition("ml", "w-0", false, five);
    let mut again = pod.clone();
    again["metadata"]["uid"] = json!("another-uid");
    state.upsert_pod(super::fixtures::record(&again, &p));
    assert_eq!(condition(&state), Some((0, 0)));

    // A pod deleted while its condition flies: a pod made again under the name starts untold.
    state.mark_condition("ml", "w-0", false, five);
    state.remove_pod("ml", "w-0");
    event(&state);
    assert_eq!(condition(&state), Some((0, 0)));
}

/// Arrival stamps go to queued pods without one, and only to them.
#[test]
fn only_queued_pods_without_a_stamp_are_stamped() {
    let p = queue_policies();
    let running = team_pod("running", 1, false, "2026-11-22T01:00:00Z");
    let queued = team_pod("queued", 1, true, "2026-11-22T01:00:01Z");
    let mut stamped = team_pod("stamped", 1, true, "2026-11-22T01:00:02Z");
    stamped["metadata"]["annotations"]["allot.dev/arrival"] = json!("2026-11-22T01:00:02.000000001Z");
    let state = cluster(&p, &[running.clone(), queued, stamped]);
    let names = |state: &super::ClusterState| -> Vec<String> {
        state.arrivals_to_stamp().into_iter().map(|(ns, name, _)| format!("{ns}/{name}")).collect()
    };
    assert_eq!(names(&state), ["ml/queued"]);
    state.mark_arrival_stamped("ml", "queued", true);
    assert!(names(&state).is_empty(), "marked as being written");
    state.mark_arrival_stamped("ml", "queued", false);
    assert_eq!(names(&state), ["ml/queued"], "the write failed: again");
    state.mark_quota_released("ml", "queued", 0);
    assert!(names(&state).is_empty(), "released: no place in the queue to keep");
    assert_eq!(state.gated().1, 1, "the stamped one still waits");
    let nothing_queued = cluster(&p, &[running]);
    assert_eq!(nothing_queued.gated().1, 0);
    assert!(names(&nothing_queued).is_empty());
}
