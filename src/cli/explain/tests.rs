use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, Taint};
use serde_json::{Value, json};

use super::*;
use crate::control::cluster::fixtures::{member, node, policies, queue_policies, record, team_pod};
use crate::control::cluster::{ClusterState, ControllerAction};
use crate::control::gang::fit::NodeRefusal;
use crate::control::gang::plan::plan;
use crate::model::namespaces::NoNamespaces;

fn state_of(p: &PolicySet, pods: &[Value], nodes: Vec<crate::control::cluster::NodeInfo>) -> ClusterState {
    let state = ClusterState::default();
    state.replace_nodes(nodes);
    state.replace_pods(pods.iter().map(|pod| record(pod, p)).collect());
    state
}

fn statuses(pods: &[Value]) -> HashMap<(String, String), PodStatus> {
    pods.iter()
        .map(|v| {
            let pod: Pod = serde_json::from_value(v.clone()).unwrap();
            let key = (pod.metadata.namespace.clone().unwrap(), pod.metadata.name.clone().unwrap());
            (key, PodStatus::of(&pod))
        })
        .collect()
}

fn created(state: &ClusterState, pod: &str) -> i64 {
    state.view().pod("ml", pod).unwrap().created
}

/// Runs `f` over inputs made of these parts.
fn with_inputs<T>(
    p: &PolicySet,
    state: &ClusterState,
    pods: &[Value],
    now: i64,
    visibility: Visibility,
    f: impl FnOnce(&Inputs<'_>) -> T,
) -> T {
    let statuses = statuses(pods);
    let inputs = Inputs { state, policies: p, labels: &NoNamespaces, now, pods: &statuses, visibility: &visibility };
    f(&inputs)
}

fn gang_report(p: &PolicySet, state: &ClusterState, pods: &[Value], now: i64, gang: &str) -> GangReport {
    with_inputs(p, state, pods, now, Visibility::default(), |i| explain_gang(i, "ml", gang).unwrap())
}

/// The message the controller's plan would write on the gang's members now.
fn controller_message(p: &PolicySet, state: &ClusterState, now: i64, gang: &str) -> (&'static str, String) {
    let (snapshot, facts) = state.snapshot(p, &NoNamespaces, now);
    let actions = plan(&snapshot, &facts, &mut HashMap::new()).actions;
    actions
        .into_iter()
        .find_map(|a| match a {
            ControllerAction::Explain { pod, reason, message, .. } if pod.starts_with(&format!("{gang}-")) => {
                Some((reason, message))
            }
            _ => None,
        })
        .expect("the plan explains the gang")
}

#[test]
fn a_gang_short_of_a_member_says_so_with_the_controllers_own_words() {
    let p = policies("");
    let pods = [
        member("a-0", "a", 3, "2026-11-22T01:00:00Z", json!({})),
        member("a-1", "a", 3, "2026-11-22T01:00:00Z", json!({})),
    ];
    let state = state_of(&p, &pods, vec![node("n1", 2), node("n2", 2)]);
    let now = created(&state, "a-0") + 100;
    let report = gang_report(&p, &state, &pods, now, "a");
    assert_eq!((report.declared, report.present), (Some(3), 2));
    let d = report.decision.as_ref().unwrap();
    assert_eq!(d.reason, "WaitingForMembers");
    assert_eq!(d.message, "2/3 members present; needs 3 nvidia.com/gpu on any node, 4 free");
    assert_eq!(controller_message(&p, &state, now, "a"), ("WaitingForMembers", d.message.clone()));
    let nodes: Vec<(&str, u64)> = report.nodes.iter().map(|n| (n.name.as_str(), n.members)).collect();
    assert_eq!(nodes, [("n1", 2), ("n2", 2)]);
    let a = report.assembly.as_ref().unwrap();
    assert_eq!((a.timeout_seconds, a.remaining_seconds, a.applies), (600, 500, true));
    assert_eq!(a.on_timeout, "Warn");
    assert!(report.members.iter().all(|m| m.state == "gated"), "{:?}", report.members);

    // Past the timeout: the reason the controller writes then.
    let late = created(&state, "a-0") + 601;
    let report = gang_report(&p, &state, &pods, late, "a");
    let d = report.decision.unwrap();
    assert_eq!(d.reason, "AssemblyTimeout");
    assert_eq!(controller_message(&p, &state, late, "a"), ("AssemblyTimeout", d.message.clone()));
    assert_eq!(report.assembly.unwrap().remaining_seconds, -1);
}

#[test]
fn nodes_say_how_many_members_each_takes_and_why_not() {
    let p = policies("");
    // Three 2-GPU members; n1 has 2 free, n2 is full (a bound pod), n3 is tainted for
    // someone else, n4 is labelled for another pool and the members select theirs.
    let select = json!({"spec": {"nodeSelector": {"node-type": "my-precious"}}});
    let mut pods: Vec<Value> = (0..3)
        .map(|i| {
            let mut m = member(&format!("b-{i}"), "b", 3, "2026-11-22T01:00:00Z", select.clone());
            m["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
            m
        })
        .collect();
    let mut running = team_pod("running", 2, false, "2026-11-22T00:00:00Z");
    running["spec"]["nodeName"] = json!("n2");
    pods.push(running);
    let mut tainted = node("n3", 8);
    tainted.taints.push(Taint {
        key: "dedicated".into(),
        value: Some("other".into()),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    let mut elsewhere = node("n4", 8);
    elsewhere.labels.insert("node-type".into(), "cheap".into());
    let state = state_of(&p, &pods, vec![node("n1", 2), node("n2", 2), tainted, elsewhere]);
    let now = created(&state, "b-0") + 5;
    let report = gang_report(&p, &state, &pods, now, "b");
    let d = report.decision.as_ref().unwrap();
    assert_eq!(d.reason, "InsufficientResources");
    assert_eq!(
        d.message,
        "3/3 members present; needs 6 nvidia.com/gpu on nodes matching node-type=my-precious, 2 free"
    );
    assert_eq!(controller_message(&p, &state, now, "b").1, d.message);
    assert_eq!(d.needs.len(), 1);
    assert_eq!((d.needs[0].needed.as_str(), d.needs[0].free.as_str()), ("6", "2"));
    let by_name: HashMap<&str, &NodeReport> = report.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    assert_eq!((by_name["n1"].members, by_name["n1"].why_not.as_deref()), (1, None));
    assert_eq!(by_name["n2"].members, 0);
    assert_eq!(by_name["n2"].why_not.as_deref(), Some("nvidia.com/gpu free 0 < 2 asked"));
    assert_eq!(by_name["n3"].why_not.as_deref(), Some("taint dedicated=other:NoSchedule not tolerated"));
    assert_eq!(by_name["n4"].why_not.as_deref(), Some("nodeSelector node-type=my-precious, node has node-type=cheap"));
    assert!(matches!(by_name["n4"].refusal, Some(NodeRefusal::Selector { .. })));
    // Complete: the timeout no longer applies.
    assert!(!report.assembly.unwrap().applies);
}

#[test]
fn a_gang_behind_another_sees_what_the_one_ahead_leaves() {
    let p = policies("");
    let pods = crate::control::cluster::fixtures::two_gangs();
    let state = state_of(&p, &pods, vec![node("n1", 2), node("n2", 2)]);
    let now = created(&state, "b-0") + 5;
    let a = gang_report(&p, &state, &pods, now, "a");
    assert_eq!(a.decision.as_ref().unwrap().reason, "Released");
    assert_eq!(a.decision.as_ref().unwrap().position, 0);
    assert_eq!(a.nodes.iter().map(|n| n.members).sum::<u64>(), 4);
    let b = gang_report(&p, &state, &pods, now, "b");
    let d = b.decision.as_ref().unwrap();
    assert_eq!((d.reason.as_str(), d.position), ("InsufficientResources", 1));
    assert!(b.nodes.iter().all(|n| n.members == 0), "a took them: {:?}", b.nodes);
}

#[test]
fn without_nodes_placement_is_not_guessed() {
    let p = policies("");
    let pods: Vec<Value> =
        (0..2).map(|i| member(&format!("c-{i}"), "c", 2, "2026-11-22T01:00:00Z", json!({}))).collect();
    let state = state_of(&p, &pods, Vec::new());
    let visibility = Visibility { nodes: Some("nodes is forbidden".into()), ..Default::default() };
    let now = created(&state, "c-0") + 5;
    let report = with_inputs(&p, &state, &pods, now, visibility, |i| explain_gang(i, "ml", "c").unwrap());
    let d = report.decision.unwrap();
    assert_eq!(d.reason, "Unknown");
    assert_eq!(d.message, "2/2 members present; placement not evaluated (nodes cannot be listed)");
    assert!(report.nodes.is_empty() && d.needs.is_empty());
    assert!(report.notes.iter().any(|n| n.contains("cannot list nodes (nodes is forbidden)")), "{:?}", report.notes);
}

#[test]
fn a_queued_pod_gives_its_place_and_the_reason() {
    let p = queue_policies();
    let mut waiting = team_pod("small", 1, true, "2026-11-22T01:00:02Z");
    waiting["status"]["conditions"] = json!([{"type": "allot.dev/QuotaReady", "status": "False",
        "reason": "QuotaQueued", "message": "old words"}]);
    let pods = [
        team_pod("running", 1, false, "2026-11-22T01:00:00Z"),
        team_pod("big", 2, true, "2026-11-22T01:00:01Z"),
        waiting,
    ];
    let state = state_of(&p, &pods, vec![node("n1", 2), node("n2", 2)]);
    let report = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_pod(i, "ml", "small").unwrap());
    assert_eq!(report.team.as_deref(), Some("ml"));
    assert_eq!(report.gates, ["allot.dev/quota"]);
    let q = report.quota.as_ref().unwrap();
    assert_eq!((q.position, q.releasable), (2, false));
    assert_eq!(
        report.waiting_for,
        [
            "quota queue (#2): queued behind 1 earlier pod(s) or gang(s) of team ml: team ml uses 1 of 2 nvidia.com/gpu; this asks 2"
        ]
    );
    assert_eq!(report.conditions[0].message.as_deref(), Some("old words"));
    assert!(report.gang.is_none());

    let bound = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_pod(i, "ml", "running").unwrap());
    assert_eq!(bound.waiting_for, ["nothing of Allot's: bound to node n1"]);
    let missing = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_pod(i, "ml", "nope"));
    assert_eq!(missing.unwrap_err().to_string(), "pod ml/nope not found");
}

#[test]
fn a_gang_member_pod_carries_its_gang() {
    let p = policies("");
    let pods = [member("a-0", "a", 2, "2026-11-22T01:00:00Z", json!({}))];
    let state = state_of(&p, &pods, vec![node("n1", 2)]);
    let now = created(&state, "a-0");
    let report = with_inputs(&p, &state, &pods, now, Visibility::default(), |i| explain_pod(i, "ml", "a-0").unwrap());
    assert_eq!(
        report.waiting_for,
        [
            "gang gate allot.dev/gang (WaitingForMembers): 1/2 members present; needs 2 nvidia.com/gpu on any node, 2 free"
        ]
    );
    assert_eq!(report.gang.as_ref().map(|g| g.name.as_str()), Some("a"));
    let text = render::text(&Report::Pod(report));
    assert!(text.contains("  gang:    a (1/2 members present)"), "{text}");
    assert!(text.contains("Gang ml/a: 1 present, 2 declared"), "{text}");
    assert!(text.contains("    n1  2\n"), "{text}");
    assert!(text.contains("assembly timeout: 600s, 600s left; on timeout: Warn"), "{text}");
    assert!(text.contains("condition allot.dev/GangReady: not written yet"), "{text}");
}

#[test]
fn a_team_shows_its_quota_who_uses_it_and_its_queue() {
    let p = queue_policies();
    let mut other = team_pod("other", 1, false, "2026-11-22T01:00:00Z");
    other["metadata"]["namespace"] = json!("elsewhere");
    let pods = [
        team_pod("running", 1, false, "2026-11-22T01:00:00Z"),
        team_pod("big", 2, true, "2026-11-22T01:00:01Z"),
        team_pod("small", 1, true, "2026-11-22T01:00:02Z"),
        other,
    ];
    let state = state_of(&p, &pods, vec![node("n1", 2), node("n2", 2)]);
    let report = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_team(i, "ml").unwrap());
    assert_eq!(report.namespaces, ["ml"]);
    let quota = report.quota.as_ref().unwrap();
    assert_eq!(quota.mode, "Queue");
    assert_eq!(
        quota.limits.iter().map(|l| (l.resource.as_str(), l.used.as_str(), l.limit.as_str())).collect::<Vec<_>>(),
        [("nvidia.com/gpu", "1", "2")]
    );
    // Every request of the namespace (queued ones too), then the pods by size.
    assert_eq!(report.usage_by_namespace[0].requests["nvidia.com/gpu"], "4");
    let top: Vec<(&str, &str)> = report.top_pods.iter().map(|p| (p.pod.as_str(), p.state)).collect();
    assert_eq!(top, [("big", "quotaQueued"), ("running", "bound"), ("small", "quotaQueued")]);
    let queue: Vec<(usize, &str, bool)> =
        report.queue.iter().map(|q| (q.position, q.unit.as_str(), q.releasable)).collect();
    assert_eq!(queue, [(1, "pod/ml/big", false), (2, "pod/ml/small", false)]);
    assert_eq!(report.queue[0].message.as_deref(), Some("team ml uses 1 of 2 nvidia.com/gpu; this asks 2"));
    assert_eq!(report.queue[0].asks["nvidia.com/gpu"], "2");

    let json: Value = serde_json::from_str(&render::json(&Report::Team(report.clone()))).unwrap();
    assert_eq!(json["kind"], "Team");
    assert_eq!(json["quota"]["limits"][0]["used"], "1");
    assert_eq!(json["queue"][1]["unit"], "pod/ml/small");
    assert_eq!(json["topPods"][0]["state"], "quotaQueued");
    let text = render::text(&Report::Team(report));
    assert!(text.contains("    nvidia.com/gpu: 1 of 2 used\n"), "{text}");
    assert!(
        text.contains("    #1 pod/ml/big (priority 0, asks 2 nvidia.com/gpu): waits: team ml uses 1 of 2"),
        "{text}"
    );

    let missing = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_team(i, "nope"));
    assert_eq!(missing.unwrap_err().to_string(), "no team nope in the policies; teams: ml");
}

#[test]
fn gang_json_is_the_documented_shape() {
    let p = policies("");
    let pods = [member("a-0", "a", 2, "2026-11-22T01:00:00Z", json!({}))];
    let state = state_of(&p, &pods, vec![node("n1", 2)]);
    let now = created(&state, "a-0") + 10;
    let report = gang_report(&p, &state, &pods, now, "a");
    let json: Value = serde_json::from_str(&render::json(&Report::Gang(report))).unwrap();
    assert_eq!(json["kind"], "Gang");
    assert_eq!(json["declared"], 2);
    assert_eq!(json["present"], 1);
    assert_eq!(json["decision"]["reason"], "WaitingForMembers");
    assert_eq!(json["decision"]["needs"][0], json!({"resource": "nvidia.com/gpu", "needed": "2", "free": "2"}));
    assert_eq!(json["nodes"][0]["name"], "n1");
    assert_eq!(json["nodes"][0]["members"], 2);
    assert_eq!(json["assembly"]["remainingSeconds"], 590);
    assert_eq!(json["members"][0], json!({"name": "a-0", "state": "gated", "node": null}));
    let missing = with_inputs(&p, &state, &pods, now, Visibility::default(), |i| explain_gang(i, "ml", "zz"));
    assert!(missing.unwrap_err().to_string().starts_with("no pod of gang ml/zz found"));
}

/// A released gang whose members are not all bound shows its start timeout: how long is left,
/// what happens then, and which members the scheduler has not bound yet.
#[test]
fn a_released_gang_not_yet_bound_shows_its_start_timeout() {
    let p = policies("");
    let released = |name: &str, node: Option<&str>| {
        let mut pod = member(name, "a", 2, "2026-11-22T01:00:00Z", json!({}));
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        pod["metadata"]["annotations"]["allot.dev/gang-released"] = json!("2026-11-22T01:01:00Z");
        if let Some(node) = node {
            pod["spec"]["nodeName"] = json!(node);
        }
        pod
    };
    let pods = [released("a-0", Some("n1")), released("a-1", None)];
    let state = state_of(&p, &pods, vec![node("n1", 2)]);
    let now = created(&state, "a-0") + 60 + 100;
    let report = gang_report(&p, &state, &pods, now, "a");
    let start = report.start.as_ref().expect("a start timeout");
    assert_eq!((start.timeout_seconds, start.remaining_seconds), (600, 500));
    assert_eq!((start.on_start_timeout.as_str(), start.unbound.as_slice()), ("Fail", &["a-1".to_string()][..]));
    assert!(report.decision.is_none());
    let text = render::text(&Report::Gang(report));
    assert!(
        text.contains(
            "start timeout: 600s, 500s left; on start timeout: Fail (every member deleted); not bound yet: a-1"
        ),
        "{text}"
    );
    assert!(text.contains("released members wait to be bound"), "{text}");
}

#[test]
fn a_team_in_a_cohort_shows_what_it_borrows_and_lends_and_who_borrows_next() {
    let team = |name: &str| {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: [{name}]}}\n  quota: {{mode: Queue, cohort: research, limits: {{nvidia.com/gpu: 4}}}}\n---\n"
        )
    };
    let p = policies(&format!("{}{}", team("vision"), team("nlp")));
    let pod = |name: &str, queued: bool| {
        let mut pod = team_pod(name, 1, queued, "2026-12-07T01:00:00Z");
        pod["metadata"]["namespace"] = json!("vision");
        pod
    };
    let mut pods: Vec<Value> = (0..6).map(|i| pod(&format!("v{i}"), false)).collect();
    pods.push(pod("next", true));
    let state = state_of(&p, &pods, vec![node("n1", 8)]);
    let report = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_team(i, "nlp").unwrap());
    let cohort = report.quota.as_ref().and_then(|q| q.cohort.as_ref()).expect("a cohort report");
    assert_eq!(cohort.unused["nvidia.com/gpu"], "2");
    let rows: Vec<(&str, &str, &str, &str)> = cohort
        .teams
        .iter()
        .map(|t| {
            let gpu = "nvidia.com/gpu";
            (t.team.as_str(), t.used[gpu].as_str(), t.borrowed[gpu].as_str(), t.lent[gpu].as_str())
        })
        .collect();
    assert_eq!(rows, [("nlp", "0", "0", "2"), ("vision", "6", "2", "0")]);
    let text = render::text(&Report::Team(report));
    assert!(
        text.contains("  cohort research (2 nvidia.com/gpu unused); its teams, the next to borrow first:\n"),
        "{text}"
    );
    assert!(
        text.contains("    vision (share 0.250):\n      nvidia.com/gpu: nominal 4, uses 6, borrowed 2, lent 0\n"),
        "{text}"
    );
    // vision's queue: the 7th pod goes on borrowed quota.
    let vision = with_inputs(&p, &state, &pods, 0, Visibility::default(), |i| explain_team(i, "vision").unwrap());
    assert_eq!(vision.queue[0].borrows_from.as_deref(), Some("research"));
    assert!(vision.queue[0].releasable);
    let text = render::text(&Report::Team(vision));
    assert!(text.contains("on its next pass, on quota borrowed from cohort research"), "{text}");
}
