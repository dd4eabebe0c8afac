//! Deny-mode reclaims over small clusters: a lender's unscheduled pod within its nominal quota
//! takes back what is lent; nothing else does.

use serde_json::{Value, json};

use crate::control::cluster::ControllerAction;
use crate::control::cluster::fixtures::{cluster, member, policies, team_pod};
use crate::control::gang::decision::GangKey;
use crate::control::quota::reclaim::{Memory, Reclaim, deny_pass};
use crate::model::namespaces::NoNamespaces;
use crate::model::policy::PolicySet;

const NOW: i64 = 1_900_000_000;

fn research(mode: &str) -> PolicySet {
    let team = |name: &str| {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: \
             [{name}]}}\n  quota: {{mode: {mode}, cohort: research, limits: {{nvidia.com/gpu: 4}}}}\n---\n"
        )
    };
    policies(&format!("{}{}", team("vision"), team("nlp")))
}

/// A 1-GPU pod of `namespace` created at second `at`: running, or (`pending`) admitted and not
/// scheduled (no node, no gate).
fn pod(namespace: &str, name: &str, pending: bool, at: u32) -> Value {
    let mut pod = team_pod(name, 1, false, &format!("2026-12-07T01:00:{at:02}Z"));
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(format!("uid-{namespace}-{name}"));
    if pending {
        pod["spec"].as_object_mut().unwrap().remove("nodeName");
    }
    pod
}

fn reclaims_of(p: &PolicySet, pods: &[Value]) -> Vec<Reclaim> {
    deny_pass(&cluster(p, pods).view(), p, &NoNamespaces, &Memory::default(), NOW).0
}

fn victims(reclaims: &[Reclaim]) -> Vec<String> {
    reclaims.iter().flat_map(|r| r.victims.iter().map(|u| u.key.to_string())).collect()
}

/// vision runs 6 of its 4 (2 borrowed from nlp); nlp runs 2.
fn borrowed() -> Vec<Value> {
    let mut pods: Vec<Value> = (0..6).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..2).map(|i| pod("nlp", &format!("r{i}"), false, 10 + i)));
    pods
}

#[test]
fn a_lenders_unscheduled_pod_reclaims_the_newest_borrowed_pod() {
    let p = research("Deny");
    let mut pods = borrowed();
    pods.push(pod("nlp", "n0", true, 20));
    let reclaims = reclaims_of(&p, &pods);
    assert_eq!(victims(&reclaims), ["pod vision/v5"]);
    let r = &reclaims[0];
    assert_eq!((r.team.as_str(), r.unit.as_str(), r.cohort.as_str()), ("nlp", "pod/nlp/n0", "research"));
    assert_eq!(r.first_member, Some(("nlp".into(), "n0".into())));
    // Two waiting: two taken back, the newest first.
    pods.push(pod("nlp", "n1", true, 21));
    assert_eq!(victims(&reclaims_of(&p, &pods)), ["pod vision/v5", "pod vision/v4"]);
}

#[test]
fn only_what_the_nominal_quota_guarantees_is_reclaimed() {
    let p = research("Deny");
    // nlp runs 3 of its 4 and waits with 2: one is its own, the other would borrow.
    let mut pods: Vec<Value> = (0..5).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..3).map(|i| pod("nlp", &format!("r{i}"), false, 10 + i)));
    pods.push(pod("nlp", "n0", true, 20));
    pods.push(pod("nlp", "n1", true, 21));
    let reclaims = reclaims_of(&p, &pods);
    assert_eq!(victims(&reclaims), ["pod vision/v4"]);
    assert_eq!(reclaims[0].unit, "pod/nlp/n0", "the older waiting pod, within the nominal quota");
}

#[test]
fn the_borrowers_own_waiting_pods_go_first_so_the_room_is_not_taken_by_them() {
    let p = research("Deny");
    let mut pods = borrowed();
    // vision's pod admitted on the loan before nlp came back; it waits for a node.
    pods.push(pod("vision", "q", true, 9));
    pods.push(pod("nlp", "n0", true, 20));
    // vision 7 (3 borrowed), nlp 2 + 1: the cohort needs 2 back for nlp's pod, q among them.
    assert_eq!(victims(&reclaims_of(&p, &pods)), ["pod vision/q", "pod vision/v5"]);
}

#[test]
fn nothing_is_reclaimed_for_a_pod_beyond_its_nominal_nor_one_the_cohort_has_room_for() {
    let p = research("Deny");
    // nlp runs its 4: its next pod would borrow, and the cohort has nothing unused.
    let mut pods: Vec<Value> = (0..4).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..4).map(|i| pod("nlp", &format!("r{i}"), false, 10 + i)));
    pods.push(pod("nlp", "n0", true, 20));
    assert!(reclaims_of(&p, &pods).is_empty());
    // vision borrows 1; nlp runs 2 and waits with 1: 3 + 5 = 8, the cohort has room.
    let mut pods: Vec<Value> = (0..5).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..2).map(|i| pod("nlp", &format!("r{i}"), false, 10 + i)));
    pods.push(pod("nlp", "n0", true, 20));
    assert!(reclaims_of(&p, &pods).is_empty());
    // A queue-mode cohort's unscheduled pods are not deny-mode lenders.
    let p = research("Queue");
    let mut pods = borrowed();
    pods.push(pod("nlp", "n0", true, 20));
    assert!(!super::any(&p));
    assert!(reclaims_of(&p, &pods).is_empty());
}

#[test]
fn room_the_schedulers_preemption_makes_is_not_made_twice() {
    let p = research("Deny");
    let mut pods = borrowed();
    pods.push(pod("nlp", "n0", true, 20));
    // The scheduler preempts v2 for n0 (of a higher priority): that is the room.
    pods[2]["metadata"]["deletionTimestamp"] = json!("2026-12-07T01:01:00Z");
    pods[2]["status"]["conditions"] =
        json!([{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]);
    assert!(reclaims_of(&p, &pods).is_empty());
    // A pod its owner deletes (no condition) still holds its GPU: the reclaim goes on.
    pods[2]["status"]["conditions"] = json!([]);
    assert_eq!(victims(&reclaims_of(&p, &pods)).len(), 1);
}

/// Member `name` of gang `gang` (of `size`) of `namespace`, created at second `at`, behind
/// Allot's gang gate.
fn gated_member(namespace: &str, name: &str, gang: &str, size: u32, at: u32) -> Value {
    let created = format!("2026-12-07T01:00:{at:02}Z");
    let extra = json!({"metadata": {"namespace": namespace, "uid": format!("uid-{namespace}-{name}")}});
    member(name, gang, size, &created, extra)
}

#[test]
fn a_lenders_complete_gang_waiting_for_the_nodes_reclaims_for_all_its_members() {
    let p = research("Deny");
    let mut pods = borrowed();
    pods.push(gated_member("nlp", "g-1", "g", 2, 21));
    // One member of two: the gang does not wait for the nodes yet, nothing is reclaimed.
    assert!(reclaims_of(&p, &pods).is_empty());
    pods.push(gated_member("nlp", "g-0", "g", 2, 22));
    let reclaims = reclaims_of(&p, &pods);
    assert_eq!(victims(&reclaims), ["pod vision/v5", "pod vision/v4"]);
    let r = &reclaims[0];
    assert_eq!((r.team.as_str(), r.unit.as_str(), r.asks.as_str()), ("nlp", "gang/nlp/g", "2 nvidia.com/gpu"));
    assert_eq!(r.first_member, Some(("nlp".into(), "g-0".into())));
    assert!(r.victim_message(&r.victims[0]).contains("gang/nlp/g asks 2 nvidia.com/gpu"));
    // A gang of three would take nlp past its nominal 4: it borrows, and reclaims nothing.
    let mut pods = borrowed();
    pods.extend((0..3).map(|i| gated_member("nlp", &format!("g-{i}"), "g", 3, 21 + i)));
    assert!(reclaims_of(&p, &pods).is_empty());
}

#[test]
fn a_borrowers_complete_gang_waiting_for_the_nodes_goes_first_and_whole() {
    let p = research("Deny");
    // vision runs its 4 and its gang of 2 beyond them waits for the nodes, complete; nlp runs 2.
    let mut pods: Vec<Value> = (0..4).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..2).map(|i| gated_member("vision", &format!("w-{i}"), "w", 2, 8 + i)));
    pods.extend((0..2).map(|i| pod("nlp", &format!("r{i}"), false, 10 + i)));
    pods.push(pod("nlp", "n0", true, 20));
    // 6 + 3 of 8: one GPU back for n0. The waiting gang goes, whole, before any running pod.
    let reclaims = reclaims_of(&p, &pods);
    assert_eq!(victims(&reclaims), ["gang vision/w"]);
    assert_eq!(reclaims[0].victims[0].pods.len(), 2);
}

#[test]
fn a_gang_a_reclaim_makes_room_for_is_remembered_until_its_victims_are_gone() {
    let p = research("Deny");
    let mut pods = borrowed();
    pods.extend((0..2).map(|i| gated_member("nlp", &format!("g-{i}"), "g", 2, 21 + i)));
    let state = cluster(&p, &pods);
    let mut memory = Memory::default();
    memory.begin_pass(NOW);
    for victim in ["v5", "v4"] {
        memory.evicted_for("vision", victim, Some(format!("uid-vision-{victim}").into()), NOW, Some("gang/nlp/g"));
    }
    memory.evicted_for("vision", "v3", Some("uid-vision-v3".into()), NOW, Some("pod/nlp/n0"));
    let gang = GangKey { namespace: "nlp".into(), name: "g".into() };
    assert_eq!(memory.reclaiming(&state.view()), [gang]);
    // While they terminate the reclaim is in flight, and nothing more is reclaimed.
    assert!(deny_pass(&state.view(), &p, &NoNamespaces, &memory, NOW).0.is_empty());
    // Gone (or another pod under the name): the gang is no longer waited for.
    let state = cluster(
        &p,
        &pods
            .iter()
            .filter(|p| !["v4", "v5"].contains(&p["metadata"]["name"].as_str().unwrap()))
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert!(memory.reclaiming(&state.view()).is_empty());
}

/// The borrowed marks the pass writes: (pod, the cohort it sets, or None: removed).
fn marks_of(p: &PolicySet, pods: &[Value]) -> Vec<(String, Option<String>)> {
    let (_, marks) = deny_pass(&cluster(p, pods).view(), p, &NoNamespaces, &Memory::default(), NOW);
    let mut out: Vec<(String, Option<String>)> = marks
        .into_iter()
        .filter_map(|a| match a {
            ControllerAction::MarkBorrowed { pod, cohort, .. } => Some((pod, cohort)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

fn marked(mut pod: Value) -> Value {
    pod["metadata"]["annotations"]["allot.dev/borrowed-from"] = json!("research");
    pod
}

#[test]
fn the_pods_beyond_the_nominal_quota_carry_the_borrowed_mark_and_only_they() {
    let p = research("Deny");
    let research = Some("research".to_string());
    // vision runs 6 of its 4: its two newest are borrowed.
    let mut pods = borrowed();
    assert_eq!(marks_of(&p, &pods), [("v4".into(), research.clone()), ("v5".into(), research.clone())]);
    // Marked: nothing to write.
    pods[4] = marked(pods[4].clone());
    pods[5] = marked(pods[5].clone());
    assert!(marks_of(&p, &pods).is_empty());
    // v0 finishes: vision uses 5, v4 is its own again; a stale mark on v1 goes too.
    pods[0]["status"]["phase"] = json!("Succeeded");
    pods[1] = marked(pods[1].clone());
    assert_eq!(marks_of(&p, &pods), [("v1".into(), None), ("v4".into(), None)]);
    // A pod being deleted keeps what it has.
    pods[1]["metadata"]["deletionTimestamp"] = json!("2026-12-07T01:01:00Z");
    assert_eq!(marks_of(&p, &pods), [("v4".into(), None)]);
}

#[test]
fn a_higher_priority_pod_is_the_teams_own_before_older_ones() {
    let p = research("Deny");
    let mut pods = borrowed();
    pods[5]["spec"]["priority"] = json!(1000);
    let research = Some("research".to_string());
    assert_eq!(marks_of(&p, &pods), [("v3".into(), research.clone()), ("v4".into(), research)]);
    // Lenders are no borrowers: nlp's waiting pod and its running ones carry nothing.
    pods.push(pod("nlp", "n0", true, 20));
    assert!(marks_of(&p, &pods).iter().all(|(pod, _)| pod.starts_with('v')));
}

/// A pod's GPUs in a reclaim's unit.
fn gpus_of(unit: &crate::control::gang::decision::RunningUnit) -> u32 {
    unit.pods.iter().map(|p| (p.requests["nvidia.com/gpu"].nanos() / 1_000_000_000) as u32).sum()
}

/// A released gang `name` of 2 running members of `gpus` GPUs each, created at second `at`.
fn running_gang(name: &str, gpus: u32, priority: i32, at: u32) -> Vec<Value> {
    (0..2)
        .map(|i| {
            let mut m = gated_member("vision", &format!("{name}-{i}"), name, 2, at);
            m["spec"].as_object_mut().unwrap().remove("schedulingGates");
            m["spec"]["nodeName"] = json!("n1");
            m["spec"]["priority"] = json!(priority);
            m["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(gpus.to_string());
            m["status"]["phase"] = json!("Running");
            m
        })
        .collect()
}

/// A unit's pods: (name, GPUs).
type UnitPods = Vec<(String, u32)>;

/// vision's random units as pods: (name, priority, GPUs, gang?) → pods, and each unit's pods'
/// names with their GPUs, in the order a team's pods are its own (priority, then the oldest).
fn vision_units(vision: &[(i32, u32, bool)]) -> (Vec<Value>, Vec<UnitPods>) {
    let mut pods = Vec::new();
    let mut units: Vec<(i32, usize, UnitPods)> = Vec::new();
    for (i, (priority, gpus, gang)) in vision.iter().enumerate() {
        if *gang {
            let name = format!("g{i}");
            pods.extend(running_gang(&name, *gpus, *priority, i as u32));
            units.push((*priority, i, (0..2).map(|m| (format!("{name}-{m}"), *gpus)).collect()));
        } else {
            let mut v = pod("vision", &format!("v{i}"), false, i as u32);
            v["spec"]["priority"] = json!(priority);
            v["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(gpus.to_string());
            pods.push(v);
            units.push((*priority, i, vec![(format!("v{i}"), *gpus)]));
        }
    }
    units.sort_by_key(|(priority, i, _)| (-priority, *i));
    (pods, units.into_iter().map(|(_, _, pods)| pods).collect())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]

    /// Over random deny-mode cohorts of vision (plain pods and running gangs of 2) and nlp, 4
    /// GPUs each: a reclaim is only for a pod within nlp's nominal quota, takes only vision's
    /// work while vision borrows, gangs whole, frees enough for it in one go and no victim could
    /// be spared; when none is found, the cohort has room or the borrowed work could not free
    /// enough. The marks are what runs past vision's nominal quota in priority order, the
    /// oldest first (a gang whole).
    #[test]
    fn a_deny_reclaim_frees_enough_in_one_go_from_borrowed_work_and_the_marks_say_which(
        vision in proptest::collection::vec((0i32..3, 1u32..3, proptest::bool::weighted(0.3)), 0..6),
        nlp_running in 0u32..4,
        asks in 1u32..3,
    ) {
        let p = research("Deny");
        let (mut pods, units) = vision_units(&vision);
        pods.extend((0..nlp_running).map(|i| pod("nlp", &format!("r{i}"), false, 30 + i)));
        let mut waiting = pod("nlp", "n0", true, 40);
        waiting["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(asks.to_string());
        pods.push(waiting);
        let (reclaims, marks) = deny_pass(&cluster(&p, &pods).view(), &p, &NoNamespaces, &Memory::default(), NOW);
        let vision_used: u32 = units.iter().flatten().map(|(_, g)| g).sum();
        let cohort_used = vision_used + nlp_running;
        let within_nominal = nlp_running + asks <= 4;
        proptest::prop_assert!(reclaims.len() <= 1);
        if let Some(r) = reclaims.first() {
            proptest::prop_assert!(within_nominal && vision_used > 4);
            proptest::prop_assert!(r.victims.iter().all(|u| u.team.as_deref() == Some("vision")));
            for unit in &r.victims {
                let whole = units.iter().any(|u| {
                    let mut names: Vec<&str> = unit.pods.iter().map(|p| p.name.as_str()).collect();
                    names.sort();
                    names == u.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
                });
                proptest::prop_assert!(whole, "{} is not a whole unit", unit.key);
            }
            let sizes: Vec<u32> = r.victims.iter().map(gpus_of).collect();
            let freed: u32 = sizes.iter().sum();
            proptest::prop_assert!(cohort_used - freed + asks <= 8, "freed {} of {}", freed, cohort_used);
            for size in &sizes {
                proptest::prop_assert!(cohort_used - freed + size + asks > 8, "{:?} free more than needed", sizes);
            }
        } else if within_nominal {
            let borrowed = vision_used.saturating_sub(4);
            proptest::prop_assert!(cohort_used + asks <= 8 || cohort_used - borrowed + asks > 8);
        }
        // Pod by pod, vision's own up to 4 GPUs; then a gang is borrowed whole if any member is.
        let (mut used, mut wanted) = (0, Vec::new());
        for unit in &units {
            let mut any = false;
            for (_, gpus) in unit {
                used += gpus;
                any |= used > 4;
            }
            if any {
                wanted.extend(unit.iter().map(|(n, _)| n.clone()));
            }
        }
        wanted.sort();
        let mut got: Vec<String> = marks
            .iter()
            .filter_map(|a| match a {
                ControllerAction::MarkBorrowed { pod, cohort: Some(_), .. } if pod != "n0" => Some(pod.clone()),
                _ => None,
            })
            .collect();
        got.sort();
        proptest::prop_assert_eq!(got, wanted);
        let n0_marked = marks.iter().any(|a| matches!(a, ControllerAction::MarkBorrowed { pod, .. } if pod == "n0"));
        proptest::prop_assert_eq!(n0_marked, !within_nominal, "a lender's pod is its own, one beyond is borrowed");
    }
}

#[test]
fn an_inferred_gang_is_a_lender_once_its_owner_says_its_size() {
    use crate::model::gang::membership::{InferredKind, owner_gang};
    let jobs = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: jobs}\nspec:\n  match: \
                {namespaces: [nlp]}\n  infer: [Job]\n";
    let team = |name: &str| {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: \
             [{name}]}}\n  quota: {{mode: Deny, cohort: research, limits: {{nvidia.com/gpu: 4}}}}\n---\n"
        )
    };
    let p = policies(&format!("{}{}{jobs}", team("vision"), team("nlp")));
    let mut pods = borrowed();
    for i in 0..2 {
        let mut worker = gated_member("nlp", &format!("train-{i}"), "-", 2, 21 + i);
        worker["metadata"]["labels"] = json!({"batch.kubernetes.io/job-name": "train",
                                             "batch.kubernetes.io/job-completion-index": i.to_string()});
        worker["metadata"]["annotations"] = json!({});
        worker["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u", "controller": true}]);
        pods.push(worker);
    }
    let state = cluster(&p, &pods);
    let reclaims = |state: &crate::control::cluster::ClusterState| {
        deny_pass(&state.view(), &p, &NoNamespaces, &Memory::default(), NOW).0
    };
    // Its size unknown (the Job not read yet): not complete, no lender.
    assert!(reclaims(&state).is_empty());
    let owner = owner_gang(InferredKind::Job, &json!({"spec": {"parallelism": 2}})).unwrap();
    state.set_owner_gang("nlp", "job-train", owner);
    let found = reclaims(&state);
    assert_eq!(victims(&found), ["pod vision/v5", "pod vision/v4"]);
    assert_eq!(found[0].unit, "gang/nlp/job-train");
}

#[test]
fn the_walk_runs_only_while_someone_borrows_or_a_mark_is_left() {
    let p = research("Deny");
    let needed = |pods: &[Value]| super::walk_needed(&cluster(&p, pods).view(), &p, &NoNamespaces);
    // vision 4 of 4, nlp 2 and one waiting: nobody borrows, no reclaim, no mark: no walk.
    let mut pods: Vec<Value> = (0..4).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..2).map(|i| pod("nlp", &format!("r{i}"), false, 10 + i)));
    pods.push(pod("nlp", "n0", true, 20));
    assert!(!needed(&pods));
    assert!(marks_of(&p, &pods).is_empty() && reclaims_of(&p, &pods).is_empty(), "the walk agrees");
    // A mark left (a pod that borrowed once): walked, to take it off.
    let mut left = pods.clone();
    left[3] = marked(left[3].clone());
    assert!(needed(&left));
    assert_eq!(marks_of(&p, &left), [("v3".into(), None)]);
    // vision borrows one.
    pods.push(pod("vision", "v4", false, 5));
    assert!(needed(&pods));
    // A queue-mode cohort is not this walk's.
    let q = research("Queue");
    assert!(!super::walk_needed(&cluster(&q, &borrowed()).view(), &q, &NoNamespaces));
}

#[test]
fn marks_go_out_a_batch_per_pass() {
    let p = research("Deny");
    // vision runs 300 past its nominal 4 (a cluster Allot's new leader finds unmarked).
    let pods: Vec<Value> = (0..304).map(|i| pod("vision", &format!("v{i:03}"), false, i % 60)).collect();
    let state = cluster(&p, &pods);
    let pass = |state: &crate::control::cluster::ClusterState| {
        deny_pass(&state.view(), &p, &NoNamespaces, &Memory::default(), NOW).1
    };
    let first = pass(&state);
    assert_eq!(first.len(), super::MARKS_PER_PASS);
    // Sent: marked on their records (as the controller does at hand-off); the next pass sends the rest.
    for action in &first {
        if let ControllerAction::MarkBorrowed { namespace, pod, cohort, .. } = action {
            state.mark_borrowed(namespace, pod, cohort.is_some());
        }
    }
    assert_eq!(pass(&state).len(), 300 - super::MARKS_PER_PASS);
}
