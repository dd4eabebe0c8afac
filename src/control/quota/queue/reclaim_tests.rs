//! Reclaims over small clusters: who is chosen, and when nothing is.

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::control::cluster::fixtures::{cluster, member, policies, team_pod};
use crate::control::gang::decision::UnitKey;
use crate::model::namespaces::NoNamespaces;

/// Far past every pod's creation: `minRuntime` is no bar unless it is long.
const NOW: i64 = 1_900_000_000;

fn team(name: &str, quota: &str, extra: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: [{name}]}}\n  quota: {quota}\n{extra}---\n"
    )
}

fn research(vision_extra: &str) -> PolicySet {
    policies(&format!(
        "{}{}{}",
        team("vision", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}", vision_extra),
        team("nlp", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}", ""),
        team("audio", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 2}}", "")
    ))
}

/// A 1-GPU pod of `namespace`, running or queued, created at second `at`, of `priority`.
fn pod(namespace: &str, name: &str, queued: bool, at: u32, priority: i32) -> Value {
    let mut pod = team_pod(name, 1, queued, &format!("2026-12-07T01:00:{at:02}Z"));
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(format!("uid-{namespace}-{name}"));
    pod["spec"]["priority"] = json!(priority);
    pod
}

fn reclaims_of(p: &PolicySet, pods: &[Value]) -> Vec<Reclaim> {
    reclaims_with(p, pods, &ReclaimMemory::default())
}

fn reclaims_with(p: &PolicySet, pods: &[Value], memory: &ReclaimMemory) -> Vec<Reclaim> {
    cluster(p, pods).quota_pass(p, &NoNamespaces, &mut HashMap::new(), memory, NOW).1
}

/// `pod` being deleted; `by_allot`: with the condition Allot's evictions write.
fn terminating(pod: &mut Value, by_allot: bool) {
    pod["metadata"]["deletionTimestamp"] = json!("2026-12-07T01:01:00Z");
    if by_allot {
        pod["status"]["conditions"] = json!([{"type": "DisruptionTarget", "status": "True",
            "reason": crate::control::cluster::action::PREEMPTED_REASON}]);
    }
}

fn victims(reclaims: &[Reclaim]) -> Vec<String> {
    reclaims.iter().flat_map(|r| r.victims.iter().map(|u| u.key.to_string())).collect()
}

/// vision runs 8 (4 borrowed: nlp's 4 lent, audio's 2 in use); nlp runs `nlp_running`, and
/// queues `nlp_queued` more.
fn borrowed_cluster(nlp_running: u32, nlp_queued: u32) -> Vec<Value> {
    let mut pods: Vec<Value> = (0..6).map(|i| pod("vision", &format!("v{i}"), false, i, 0)).collect();
    pods.extend((0..2).map(|i| pod("audio", &format!("a{i}"), false, 10 + i, 0)));
    pods.extend((0..nlp_running).map(|i| pod("nlp", &format!("r{i}"), false, 20 + i, 0)));
    pods.extend((0..nlp_queued).map(|i| pod("nlp", &format!("n{i}"), true, 30 + i, 0)));
    pods
}

#[test]
fn a_lender_reclaims_the_newest_borrowed_pod_and_no_more() {
    let p = research("");
    // vision uses 6 of 4; audio 2 of 2; nlp 2 of 4: the cohort's 10 are used. nlp asks 1 more.
    let reclaims = reclaims_of(&p, &borrowed_cluster(2, 2));
    assert_eq!(victims(&reclaims), ["pod vision/v5"]);
    let r = &reclaims[0];
    assert_eq!((r.team.as_str(), r.unit.as_str(), r.asks.as_str()), ("nlp", "pod/nlp/n0", "1 nvidia.com/gpu"));
    assert_eq!(r.first_member, Some(("nlp".to_string(), "n0".to_string())));
    assert_eq!(
        r.victim_message(&r.victims[0]),
        "reclaimed by team nlp of cohort research: team vision ran this on quota borrowed from the cohort, and \
         pod/nlp/n0 asks 1 nvidia.com/gpu within team nlp's nominal quota: this pod is evicted"
    );
}

#[test]
fn the_lowest_priority_goes_first_then_the_newest() {
    let p = research("");
    let mut pods = borrowed_cluster(2, 1);
    pods[2]["spec"]["priority"] = json!(-5); // v2: old, but the lowest priority
    assert_eq!(victims(&reclaims_of(&p, &pods)), ["pod vision/v2"]);
}

#[test]
fn pods_made_in_the_same_second_go_newest_first() {
    let p = research("");
    let mut pods = borrowed_cluster(2, 1);
    // All of vision's pods were made in one second; Allot saw them in the order of their names
    // but v1's the latest.
    for (i, v) in pods.iter_mut().take(6).enumerate() {
        v["metadata"]["creationTimestamp"] = json!("2026-12-07T01:00:00Z");
        let nanos = if i == 1 { 900 } else { 100 + i };
        v["metadata"]["annotations"] = json!({"allot.dev/arrival": format!("2026-12-07T01:00:00.000000{nanos:03}Z")});
    }
    assert_eq!(victims(&reclaims_of(&p, &pods)), ["pod vision/v1"]);
}

#[test]
fn a_borrowing_gang_is_evicted_whole() {
    let p = research("");
    let mut pods = borrowed_cluster(2, 1);
    // vision's newest work is a gang of 2 (released, running): both members go, for 1 GPU.
    pods.truncate(6);
    pods.extend(borrowed_cluster(2, 1).into_iter().skip(6));
    for (i, name) in ["g0", "g1"].into_iter().enumerate() {
        let mut m = member(name, "ddp", 2, "2026-12-07T01:00:09Z", json!({}));
        m["metadata"]["namespace"] = json!("vision");
        m["metadata"]["annotations"]["allot.dev/gang-released"] = json!("2026-12-07T01:00:09Z");
        m["spec"].as_object_mut().unwrap().remove("schedulingGates");
        m["spec"]["nodeName"] = json!(format!("n{}", i + 1));
        pods.push(m);
    }
    pods.remove(5); // vision: v0..v4 and the gang: 7, 3 borrowed
    let reclaims = reclaims_of(&p, &pods);
    assert_eq!(victims(&reclaims), ["gang vision/ddp"]);
    assert_eq!(reclaims[0].victims[0].pods.len(), 2);
}

#[test]
fn nothing_is_evicted_within_min_runtime_nor_while_a_reclaim_is_in_flight() {
    let young = research("  preemption: {minRuntime: 1000000h}\n");
    assert!(reclaims_of(&young, &borrowed_cluster(2, 1)).is_empty(), "vision's work is protected by minRuntime");
    let p = research("");
    let mut pods = borrowed_cluster(2, 1);
    terminating(&mut pods[5], false);
    // This leader evicted v5: nlp waits for it.
    let mut memory = ReclaimMemory::default();
    memory.begin_pass(NOW);
    memory.evicted("vision", "v5", Some("uid-vision-v5".into()), NOW);
    assert!(reclaims_with(&p, &pods, &memory).is_empty(), "v5 is leaving already: nlp waits for it");
    // A new leader sees Allot's condition on v5, early in its leadership: the same.
    terminating(&mut pods[5], true);
    assert!(reclaims_of(&p, &pods).is_empty(), "a previous leader's victim is leaving too");
}

#[test]
fn a_tenants_own_pod_kept_terminating_does_not_hold_the_lender_off() {
    let p = research("");
    let mut pods = borrowed_cluster(2, 1);
    // vision deleted v5 itself, with a grace period of a year (or a finalizer): it still holds
    // its GPU, and it is no reclaim's victim. nlp's reclaim takes the next newest.
    pods[5]["spec"]["terminationGracePeriodSeconds"] = json!(31_536_000);
    terminating(&mut pods[5], false);
    assert_eq!(victims(&reclaims_of(&p, &pods)), ["pod vision/v4"]);
    // Allot's condition, forged (a tenant who may write pod status), long into a leadership: the same.
    terminating(&mut pods[5], true);
    let mut memory = ReclaimMemory::default();
    memory.begin_pass(NOW - 10_000);
    assert_eq!(victims(&reclaims_with(&p, &pods, &memory)), ["pod vision/v4"]);
    // This leader's own victim, evicted longer ago than a preemption may stay in flight: the same.
    memory.evicted("vision", "v5", Some("uid-vision-v5".into()), NOW - 10_000);
    memory.begin_pass(NOW);
    assert_eq!(victims(&reclaims_with(&p, &pods, &memory)), ["pod vision/v4"]);
}

#[test]
fn only_borrowed_work_is_taken() {
    let p = research("");
    // vision uses exactly its 4, audio its 2, nlp 4 of 4: nobody borrows, nothing lent.
    let mut pods: Vec<Value> = (0..4).map(|i| pod("vision", &format!("v{i}"), false, i, 0)).collect();
    pods.extend((0..4).map(|i| pod("nlp", &format!("r{i}"), false, 20 + i, 0)));
    pods.push(pod("nlp", "over", true, 30, 0));
    assert!(reclaims_of(&p, &pods).is_empty(), "nlp asks beyond its nominal: it borrows, it does not reclaim");
    // A team of no cohort is never touched, whatever it uses.
    let mut pods = borrowed_cluster(2, 1);
    pods.push(pod("elsewhere", "x", false, 59, -100));
    assert_eq!(victims(&reclaims_of(&p, &pods)), ["pod vision/v5"]);
}

#[test]
fn a_spared_unit_is_passed_over() {
    let p = research("");
    let mut memory = ReclaimMemory::default();
    memory.spare(UnitKey::Pod { namespace: "vision".into(), name: "v5".into() }, NOW + 60);
    assert_eq!(victims(&reclaims_with(&p, &borrowed_cluster(2, 1), &memory)), ["pod vision/v4"]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Over random clusters of the three teams: victims are whole units of teams that borrow,
    /// never the lender's; once they are gone the lender's unit fits; and no victim could have
    /// been spared. When the borrowed work could free enough, a reclaim is found.
    #[test]
    fn a_reclaim_frees_enough_takes_only_borrowed_work_and_no_more(
        vision in proptest::collection::vec((0i32..3, 1u32..3), 0..8),
        audio in 0u32..4,
        nlp_running in 0u32..4,
        asks in 1u32..3,
    ) {
        let p = research("");
        let mut pods = Vec::new();
        for (i, (priority, gpus)) in vision.iter().enumerate() {
            let mut v = pod("vision", &format!("v{i}"), false, i as u32, *priority);
            v["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(gpus.to_string());
            pods.push(v);
        }
        pods.extend((0..audio).map(|i| pod("audio", &format!("a{i}"), false, 20 + i, 0)));
        pods.extend((0..nlp_running).map(|i| pod("nlp", &format!("r{i}"), false, 30 + i, 0)));
        let mut queued = pod("nlp", "n0", true, 40, 0);
        queued["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(asks.to_string());
        pods.push(queued);
        let state = cluster(&p, &pods);
        let (actions, reclaims) = state.quota_pass(&p, &NoNamespaces, &mut HashMap::new(), &ReclaimMemory::default(), NOW);
        let released = actions.iter().any(|a| matches!(a, ControllerAction::ReleaseQuota { pod, .. } if pod == "n0"));
        let vision_used: u32 = vision.iter().map(|v| v.1).sum();
        let cohort_used = vision_used + audio + nlp_running;
        let within_nominal = nlp_running + asks <= 4;
        let borrowed = vision_used.saturating_sub(4) + audio.saturating_sub(2);
        prop_assert!(reclaims.len() <= 1);
        if let Some(r) = reclaims.first() {
            prop_assert!(!released && within_nominal);
            let mut sizes = Vec::new();
            for unit in &r.victims {
                let team = unit.team.as_deref().unwrap_or_default();
                prop_assert!(
                    (team == "vision" && vision_used > 4) || (team == "audio" && audio > 2),
                    "{} does not borrow", team
                );
                sizes.push(unit.pods.iter().map(|p| (p.requests["nvidia.com/gpu"].nanos() / 1_000_000_000) as u32).sum::<u32>());
            }
            let freed: u32 = sizes.iter().sum();
            prop_assert!(cohort_used - freed + asks <= 10, "freed {} of {}", freed, cohort_used);
            // No victim could be spared: without any one of them, not enough.
            for size in &sizes {
                prop_assert!(cohort_used - freed + size + asks > 10, "victims {:?} free more than needed", sizes);
            }
        } else if within_nominal && !released {
            // Not enough borrowed work to free.
            prop_assert!(cohort_used - borrowed + asks > 10, "a reclaim was possible: {} used, {} borrowed", cohort_used, borrowed);
        }
    }
}
