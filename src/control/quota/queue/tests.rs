use std::collections::HashMap;

use serde_json::{Value, json};

use super::*;
use crate::control::cluster::action::COUNT_REFRESH_SECS;
use crate::control::cluster::fixtures::{cluster, policies, queue_policies, team_pod};

fn queued_messages(actions: &[ControllerAction]) -> Vec<(String, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            ControllerAction::Queued { pod, message, .. } => Some((pod.clone(), message.clone())),
            _ => None,
        })
        .collect()
}

/// A unit asking more than the team's whole quota can never go: it is told so, and holds
/// up no one (a strict queue behind it would wait for ever).
#[test]
fn a_unit_larger_than_the_whole_quota_holds_up_no_one() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let pods = [team_pod("huge", 3, true, "2026-11-22T01:00:01Z"), team_pod("small", 1, true, "2026-11-22T01:00:02Z")];
    let state = cluster(&p, &pods);
    let actions = state.quota_plan(&p, &labels, &mut HashMap::new(), 0);
    assert_eq!(released(&actions), ["small"], "{actions:?}");
    assert_eq!(
        queued_messages(&actions),
        [(
            "huge".to_string(),
            "asks 3 nvidia.com/gpu, more than team ml's whole quota (2): it is never released (meanwhile it \
                 holds up no one); delete it, or raise the quota"
                .to_string()
        )]
    );
}

#[test]
fn queued_pods_are_told_why_once_and_in_order() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let pods = [
        team_pod("running", 1, false, "2026-11-22T01:00:00Z"),
        team_pod("big", 2, true, "2026-11-22T01:00:01Z"),
        team_pod("small", 1, true, "2026-11-22T01:00:02Z"),
    ];
    let state = cluster(&p, &pods);
    let mut previous = HashMap::new();
    let actions = state.quota_plan(&p, &labels, &mut previous, 0);
    assert!(!actions.iter().any(|a| matches!(a, ControllerAction::ReleaseQuota { .. })), "{actions:?}");
    // Strict order: "small" would fit, but waits behind "big".
    assert_eq!(
        queued_messages(&actions),
        [
            ("big".to_string(), "team ml uses 1 of 2 nvidia.com/gpu; this asks 2".to_string()),
            (
                "small".to_string(),
                "queued behind 1 earlier pod(s) or gang(s) of team ml: team ml uses 1 of 2 nvidia.com/gpu; this asks 2"
                    .to_string()
            ),
        ]
    );
    // Nothing changed: nothing is written again.
    assert!(state.quota_plan(&p, &labels, &mut previous, 0).is_empty());
    // The running pod finishes: both fit in order (2, then... no: 2 + 1 > 2, so only big).
    state.remove_pod("ml", "running");
    let actions = state.quota_plan(&p, &labels, &mut previous, 0);
    let released: Vec<_> = actions
        .iter()
        .filter_map(|a| if let ControllerAction::ReleaseQuota { pod, .. } = a { Some(pod.as_str()) } else { None })
        .collect();
    assert_eq!(released, ["big"]);
    assert_eq!(
        queued_messages(&actions),
        [("small".to_string(), "team ml uses 2 of 2 nvidia.com/gpu; this asks 1".to_string())]
    );
    assert!(!previous.contains_key(&("ml".to_string(), "big".to_string())));
}

/// Pods released from the queue in [`draining_writes`].
const DRAINED: i64 = 15;

/// A queue of 40 one-GPU pods draining one per second behind a limit of 2: writes (each a
/// condition and its Event), the conditions marked as the controller marks them, and
/// whether every pod still queued at the end carries its current explanation.
fn draining_writes(passes_after: i64) -> (usize, bool) {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let mut pods =
        vec![team_pod("run-a", 1, false, "2026-11-22T01:00:00Z"), team_pod("run-b", 1, false, "2026-11-22T01:00:00Z")];
    let created = |i: usize| format!("2026-11-22T01:{:02}:{:02}Z", 1 + i / 60, i % 60);
    pods.extend((0..40).map(|i| team_pod(&format!("q-{i:02}"), 1, true, &created(i))));
    let state = cluster(&p, &pods);
    let mut running: std::collections::VecDeque<String> = ["run-a".into(), "run-b".into()].into();
    let mut previous = HashMap::new();
    let mut writes = 0;
    let mut pass = |now: i64, running: &mut std::collections::VecDeque<String>| {
        for action in state.quota_plan(&p, &labels, &mut previous, now) {
            match action {
                ControllerAction::Queued { namespace, pod, message } => {
                    writes += 1;
                    let written = condition_fingerprint(false, QUEUED_REASON, &message);
                    state.mark_condition(&namespace, &pod, true, written);
                }
                ControllerAction::ReleaseQuota { pod, .. } => {
                    let i: usize = pod[2..].parse().unwrap();
                    state.upsert_pod(crate::control::cluster::fixtures::record(
                        &team_pod(&pod, 1, false, &created(i)),
                        &p,
                    ));
                    running.push_back(pod);
                }
                other => panic!("{other:?}"),
            }
        }
        // When the controller is asked to look again for a place held back.
        previous.values().filter_map(Told::refresh_at).min()
    };
    let mut refresh = pass(0, &mut running);
    // One running pod finishes every second: the head of the queue goes, everyone moves up.
    for now in 1..=DRAINED {
        let done = running.pop_front().unwrap();
        state.remove_pod("ml", &done);
        refresh = pass(now, &mut running);
    }
    pass(DRAINED + passes_after, &mut running);
    if passes_after == 0 {
        // Held back at the last release: the controller is asked to look again at the refresh.
        assert!(refresh.is_some_and(|at| at > DRAINED && at <= DRAINED + COUNT_REFRESH_SECS), "{refresh:?}");
    }
    // A fresh plan (a new leader) finds nothing to write once every pod carries its current explanation.
    let fresh = state.quota_plan(&p, &labels, &mut HashMap::new(), 0);
    (writes, fresh.iter().all(|a| !matches!(a, ControllerAction::Queued { .. })))
}

/// A queued pod's place (`queued behind N …`), which every release ahead changes, is
/// rewritten at most every COUNT_REFRESH_SECS: draining 15 of a queue of 40 one per second
/// wrote 40 + 39 + … + 25 explanations before (520), far fewer now; the pods still queued
/// carry their current place once the refresh is due.
#[test]
fn a_draining_queue_rewrites_places_at_most_every_refresh() {
    let (writes, current) = draining_writes(COUNT_REFRESH_SECS);
    eprintln!("a queue of 40 draining {DRAINED}, one per second: {writes} writes");
    assert!(writes < 40 + 3 * 40, "{writes} writes");
    assert!(current, "every pod still queued carries its current place");
    // Right after the last release the places may lag behind, not for longer.
    let (_, current) = draining_writes(0);
    assert!(!current, "within the refresh period the places lag");
}

fn released(actions: &[ControllerAction]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| if let ControllerAction::ReleaseQuota { pod, .. } = a { Some(pod.as_str()) } else { None })
        .collect()
}

/// Issue 12, defect 1, as seen on a real API server: p1 and p2 run, p3 waits, and a gang
/// with 1 of 3 members is created in the same second as p3 (ordered first by its name).
/// Once p1 goes, p3 must go: a gang that has not assembled holds up no one.
#[test]
fn an_incomplete_gang_ordered_first_holds_up_no_one() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let mut gang = crate::control::cluster::fixtures::member("a-0", "a", 3, "2026-11-22T01:00:02Z", json!({}));
    gang["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]);
    let pods = [
        team_pod("p1", 1, false, "2026-11-22T01:00:00Z"),
        team_pod("p2", 1, false, "2026-11-22T01:00:01Z"),
        gang,
        team_pod("p3", 1, true, "2026-11-22T01:00:02Z"),
    ];
    let state = cluster(&p, &pods);
    let mut previous = HashMap::new();
    let actions = state.quota_plan(&p, &labels, &mut previous, 0);
    assert!(released(&actions).is_empty(), "{actions:?}");
    assert_eq!(
        queued_messages(&actions),
        [
            (
                "a-0".to_string(),
                "gang has 1/3 members; charged whole once all exist (meanwhile it holds up no one)".to_string()
            ),
            ("p3".to_string(), "team ml uses 2 of 2 nvidia.com/gpu; this asks 1".to_string()),
        ]
    );
    state.remove_pod("ml", "p1");
    let actions = state.quota_plan(&p, &labels, &mut previous, 0);
    assert_eq!(released(&actions), ["p3"], "{actions:?}");
}

/// A gang goes in its team's line when it became complete (its newest member, queued or
/// not), not when its first member came: gang a's placeholder a-0, created a month
/// before the rest, does not put it ahead of pod v, queued at 10:50 while a is complete
/// only since 11:06 (its last GPU member, or a CPU launcher the quota does not gate). The
/// team's 2 GPUs go to v. (Before, a went.)
#[test]
fn a_placeholder_member_does_not_put_its_gang_ahead_in_the_queue() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let queued = |name: &str, created: &str| {
        let mut m = crate::control::cluster::fixtures::member(name, "a", 2, created, json!({}));
        m["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]);
        m
    };
    let cpu_launcher = crate::control::cluster::fixtures::member(
        "a-launcher",
        "a",
        2,
        "2026-11-18T11:06:00Z",
        json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}}),
    );
    let v = team_pod("v", 2, true, "2026-11-18T10:50:00Z");
    for last in [queued("a-1", "2026-11-18T11:06:00Z"), cpu_launcher] {
        let pods = [queued("a-0", "2026-10-18T11:00:00Z"), last, v.clone()];
        for order in [pods.to_vec(), pods.iter().rev().cloned().collect()] {
            let state = cluster(&p, &order);
            let actions = state.quota_plan(&p, &labels, &mut HashMap::new(), 0);
            assert_eq!(released(&actions), ["v"], "{actions:?}");
        }
    }
}

/// A gang whose launcher asks nothing the quota counts (an MPI launcher on CPUs: no quota
/// gate) is complete once all its members exist, gated or not: its workers go. Before, the
/// queue counted only its quota-gated members and the gang assembled for ever.
#[test]
fn a_gang_with_a_member_asking_no_quota_is_complete_when_all_exist() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let created = "2026-11-22T01:00:00Z";
    let launcher = crate::control::cluster::fixtures::member(
        "mpi-launcher",
        "mpi",
        3,
        created,
        json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}]}}),
    );
    let worker = |name: &str| {
        let mut w = crate::control::cluster::fixtures::member(name, "mpi", 3, created, json!({}));
        w["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]);
        w
    };
    let state = cluster(&p, &[worker("mpi-0"), worker("mpi-1")]);
    let mut previous = HashMap::new();
    let actions = state.quota_plan(&p, &labels, &mut previous, 0);
    assert!(released(&actions).is_empty(), "two of three members: {actions:?}");
    state.upsert_pod(crate::control::cluster::fixtures::record(&launcher, &p));
    let actions = state.quota_plan(&p, &labels, &mut previous, 0);
    let mut workers = released(&actions);
    workers.sort_unstable();
    assert_eq!(workers, ["mpi-0", "mpi-1"], "{actions:?}");
}

/// A native PodGroup in a queue-mode team waits whole for its `minCount`, even when its
/// first member was recorded before the PodGroup was known (no size on that record).
#[test]
fn a_native_group_waits_whole_for_its_min_count_whoever_knew_the_size() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let member = |name: &str, created: &str| {
        let mut pod = team_pod(name, 1, true, created);
        pod["spec"]["schedulingGroup"] = json!({"podGroupName": "ddp"});
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(pod).unwrap()
    };
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    let group = json!({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                           "metadata": {"name": "ddp", "namespace": "ml"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}});
    assert!(objects.insert(&group, "ml"));
    let unknown = crate::model::dra::NoClaims;
    // The view walks its pods in a random order (a new one per store): either may come first.
    for _ in 0..16 {
        let state = cluster(&p, &[]);
        for (pod, source) in [
            (member("m-0", "2026-11-22T01:00:00Z"), &unknown as &dyn crate::model::dra::ClaimSource),
            (member("m-1", "2026-11-22T01:00:01Z"), &objects),
        ] {
            state.upsert_pod(
                crate::control::cluster::PodRecord::from_pod_with_claims(&pod, &p, &labels, source).unwrap(),
            );
        }
        let actions = state.quota_plan(&p, &labels, &mut HashMap::new(), 0);
        assert!(released(&actions).is_empty(), "{actions:?}");
        let expected = "gang has 2/3 members; charged whole once all exist (meanwhile it holds up no one)";
        assert!(queued_messages(&actions).iter().all(|(_, m)| m == expected), "{actions:?}");
    }
}

/// Pods created in the same second (creationTimestamp has one-second resolution) go in the
/// order Allot saw them — the watch's order, or the `allot.dev/arrival` stamp a leader
/// wrote — never by name.
#[test]
fn pods_created_in_the_same_second_go_in_arrival_order_not_name_order() {
    let p = queue_policies();
    let labels = crate::model::namespaces::NoNamespaces;
    let running = team_pod("running", 1, false, "2026-11-22T01:00:00Z");
    let first = team_pod("zz-first", 1, true, "2026-11-22T01:00:01Z");
    let second = team_pod("aa-second", 1, true, "2026-11-22T01:00:01Z");
    // The watch delivers them in creation order.
    let state = ClusterState::default();
    for pod in [&running, &first, &second] {
        state.upsert_pod(crate::control::cluster::fixtures::record(pod, &p));
    }
    assert_eq!(released(&state.quota_plan(&p, &labels, &mut HashMap::new(), 0)), ["zz-first"]);

    // A new leader that lists them (in name order) reads the arrival the old one stamped.
    let stamp = |mut pod: Value, at: &str| {
        pod["metadata"]["annotations"] = json!({"allot.dev/arrival": at});
        pod
    };
    let state = cluster(
        &p,
        &[running, stamp(second, "2026-11-22T01:00:01.700000000Z"), stamp(first, "2026-11-22T01:00:01.200000000Z")],
    );
    assert_eq!(released(&state.quota_plan(&p, &labels, &mut HashMap::new(), 0)), ["zz-first"]);
}

/// An arrival stamp orders pods only within their creation second: one that claims an
/// earlier time (however it got there) does not jump ahead of older pods.
#[test]
fn an_arrival_stamp_never_reorders_pods_of_different_seconds() {
    let p = queue_policies();
    let mut late = team_pod("late", 1, true, "2026-11-22T01:00:05Z");
    late["metadata"]["annotations"] = json!({"allot.dev/arrival": "2020-01-01T00:00:00Z"});
    let pods = [
        team_pod("running", 1, false, "2026-11-22T01:00:00Z"),
        late,
        team_pod("older", 1, true, "2026-11-22T01:00:01Z"),
    ];
    let state = cluster(&p, &pods);
    assert_eq!(
        released(&state.quota_plan(&p, &crate::model::namespaces::NoNamespaces, &mut HashMap::new(), 0)),
        ["older"]
    );
}

/// A queue explanation the pod already carries is not written again (a new leader starts
/// with empty memory: it must not rewrite every queued pod's condition).
#[test]
fn a_queue_explanation_the_pod_carries_is_not_written_again() {
    let p = queue_policies();
    let mut waiting = team_pod("waiting", 1, true, "2026-11-22T01:00:01Z");
    waiting["status"]["conditions"] = json!([{"type": "allot.dev/QuotaReady", "status": "False",
            "reason": "QuotaQueued", "message": "team ml uses 2 of 2 nvidia.com/gpu; this asks 1"}]);
    let pods = [team_pod("running", 2, false, "2026-11-22T01:00:00Z"), waiting];
    let state = cluster(&p, &pods);
    let actions = state.quota_plan(&p, &crate::model::namespaces::NoNamespaces, &mut HashMap::new(), 0);
    assert!(actions.is_empty(), "{actions:?}");
}

/// Issue 15: a shared ResourceClaim takes its team's quota once. Two queued pods sharing a
/// claim of 2 (quota 2) both go; a queued pod naming a claim a running pod holds goes even
/// with the team full; the gauges count the claim once, as in use.
#[test]
fn a_shared_claim_is_charged_once_in_the_queue_and_the_gauges() {
    let p = policies(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Queue, limits: {nvidia.com/gpu: 2}}\n",
    );
    let labels = crate::model::namespaces::NoNamespaces;
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    for (name, n) in [("pair", 2), ("other", 1)] {
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                               "metadata": {"name": name, "namespace": "ml"},
                               "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": n}}]}}});
        assert!(objects.insert(&claim, "ml"));
    }
    let sharer = |name: &str, claim: &str, queued: bool, created: &str| {
        let mut pod = team_pod(name, 0, queued, created);
        pod["spec"]["containers"][0]["resources"] = json!({});
        pod["spec"]["resourceClaims"] = json!([{"name": "g", "resourceClaimName": claim}]);
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).unwrap();
        crate::control::cluster::PodRecord::from_pod_with_claims(&pod, &p, &labels, &objects).unwrap()
    };
    let state = ClusterState::default();
    state.upsert_pod(sharer("q1", "pair", true, "2026-11-22T01:00:00Z"));
    state.upsert_pod(sharer("q2", "pair", true, "2026-11-22T01:00:01Z"));
    let mut released_now = released(&state.quota_plan(&p, &labels, &mut HashMap::new(), 0))
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    released_now.sort();
    assert_eq!(released_now, ["q1", "q2"], "the claim's 2 GPUs once, not 4");

    // Running now (released): the team is full; a sharer of `pair` still goes, a pod of
    // another claim waits.
    let state = ClusterState::default();
    state.upsert_pod(sharer("r1", "pair", false, "2026-11-22T01:00:00Z"));
    state.upsert_pod(sharer("q3", "pair", true, "2026-11-22T01:00:02Z"));
    state.upsert_pod(sharer("q4", "other", true, "2026-11-22T01:00:03Z"));
    let actions = state.quota_plan(&p, &labels, &mut HashMap::new(), 0);
    assert_eq!(released(&actions), ["q3"], "{actions:?}");
    assert_eq!(
        queued_messages(&actions),
        [("q4".to_string(), "team ml uses 2 of 2 nvidia.com/gpu; this asks 1".to_string())]
    );
    let sums = requests_by_state(&state.view());
    let claim_devices: Vec<_> = sums.iter().filter(|((_, _, r), _)| r.starts_with("deviceclass")).collect();
    assert_eq!(claim_devices.len(), 2, "{claim_devices:?}");
    let bound = sums
        .iter()
        .find(|((_, s, r), _)| *s == crate::control::cluster::usage::UsageState::Bound && r.starts_with("deviceclass"));
    assert_eq!(bound.map(|(_, n)| *n), Some(2_000_000_000), "pair counted once, as bound");
}

/// Regression: a pod gated while its team was in queue mode kept its gate for ever once
/// the team left queue mode (or had no quota), because only queue-mode teams were looked at.
#[test]
fn a_quota_gate_nothing_queues_any_more_is_lifted() {
    let mut waiting = team_pod("waiting", 1, true, "2026-11-22T01:00:01Z");
    waiting["metadata"]["uid"] = serde_json::json!("u-waiting");
    let queued = [waiting];
    let deny = policies(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  quota:\n    mode: Deny\n    limits: {nvidia.com/gpu: 2}\n",
    );
    for p in [deny, policies("")] {
        let state = cluster(&p, &queued);
        let actions = state.quota_plan(&p, &crate::model::namespaces::NoNamespaces, &mut HashMap::new(), 0);
        assert_eq!(
            actions,
            [ControllerAction::ReleaseQuota {
                namespace: "ml".into(),
                pod: "waiting".into(),
                uid: Some("u-waiting".into()),
                gate_index: 0,
                has_annotations: true,
                borrowed_from: None,
            }],
            "the lift tests the uid of the pod the plan saw"
        );
    }
}
