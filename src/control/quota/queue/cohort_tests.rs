//! The queues of a cohort's teams: borrowing what the others leave unused, in fair order,
//! within the limits, and saying why a unit waits.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::*;
use crate::control::cluster::fixtures::{cluster, member, policies, team_pod};
use crate::model::namespaces::NoNamespaces;

fn team(name: &str, quota: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: [{name}]}}\n  quota: {quota}\n---\n"
    )
}

/// A 1-GPU pod of `namespace`, queued or running, created at second `at`.
fn pod(namespace: &str, name: &str, queued: bool, at: u32) -> Value {
    let mut pod = team_pod(name, 1, queued, &format!("2026-12-07T01:00:{at:02}Z"));
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(format!("uid-{namespace}-{name}"));
    pod
}

/// Released pods as (namespace/pod, cohort borrowed from).
fn released(actions: &[ControllerAction]) -> Vec<(String, Option<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            ControllerAction::ReleaseQuota { namespace, pod, borrowed_from, .. } => {
                Some((format!("{namespace}/{pod}"), borrowed_from.clone()))
            }
            _ => None,
        })
        .collect()
}

fn waiting(actions: &[ControllerAction]) -> HashMap<String, String> {
    actions
        .iter()
        .filter_map(|a| match a {
            ControllerAction::Queued { namespace, pod, message } => {
                Some((format!("{namespace}/{pod}"), message.clone()))
            }
            _ => None,
        })
        .collect()
}

fn plan(p: &PolicySet, pods: &[Value]) -> Vec<ControllerAction> {
    cluster(p, pods).quota_plan(p, &NoNamespaces, &mut HashMap::new(), 0)
}

/// The cluster: vision and nlp, 4 GPUs each, in cohort research.
fn research(vision_extra: &str) -> PolicySet {
    policies(&format!(
        "{}{}",
        team("vision", &format!("{{mode: Queue, cohort: research, limits: {{nvidia.com/gpu: 4}}{vision_extra}}}")),
        team("nlp", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}")
    ))
}

#[test]
fn an_idle_teams_quota_is_lent_and_the_borrowed_pods_are_marked() {
    let p = research("");
    let pods: Vec<Value> = (0..9).map(|i| pod("vision", &format!("v{i}"), true, i)).collect();
    let actions = plan(&p, &pods);
    let borrowed = |i: u32| (format!("vision/v{i}"), (i >= 4).then(|| "research".to_string()));
    assert_eq!(released(&actions), (0..8).map(borrowed).collect::<Vec<_>>());
    assert_eq!(
        waiting(&actions)["vision/v8"],
        "team vision uses 8 of 4 nvidia.com/gpu (4 borrowed from cohort research); this asks 1; the cohort has 0 unused"
    );
    // The same team alone (no cohort) stops at its 4.
    let alone = policies(&team("vision", "{mode: Queue, limits: {nvidia.com/gpu: 4}}"));
    assert_eq!(released(&plan(&alone, &pods)).len(), 4);
}

#[test]
fn a_lender_gets_the_unused_rest_and_is_told_its_quota_is_on_loan() {
    let p = research("");
    let mut pods: Vec<Value> = (0..6).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((0..3).map(|i| pod("nlp", &format!("n{i}"), true, 10 + i)));
    let actions = plan(&p, &pods);
    assert_eq!(released(&actions), [("nlp/n0".to_string(), None), ("nlp/n1".to_string(), None)]);
    let told = &waiting(&actions)["nlp/n2"];
    assert!(
        told.starts_with("team nlp uses 2 of 4 nvidia.com/gpu (0 borrowed from cohort research); this asks 1; the cohort has 0 unused; this is within team nlp's nominal quota, which is lent"),
        "{told}"
    );
}

#[test]
fn work_within_the_nominal_quota_goes_before_borrowing() {
    let p = research("");
    // vision's pods are older, but nlp's first 2 are within its nominal and vision would borrow.
    let mut pods: Vec<Value> = (0..4).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    pods.extend((4..8).map(|i| pod("vision", &format!("v{i}"), true, i)));
    pods.extend((0..2).map(|i| pod("nlp", &format!("n{i}"), true, 20 + i)));
    let actions = plan(&p, &pods);
    let names: Vec<String> = released(&actions).into_iter().map(|r| r.0).collect();
    assert_eq!(names, ["nlp/n0", "nlp/n1", "vision/v4", "vision/v5"]);
}

#[test]
fn borrowers_share_by_weight() {
    let cohort = |b_weight: u32| {
        policies(&format!(
            "{}{}{}",
            team("a", "{mode: Queue, cohort: c, limits: {nvidia.com/gpu: 0}}"),
            team("b", &format!("{{mode: Queue, cohort: c, limits: {{nvidia.com/gpu: 0}}, weight: {b_weight}}}")),
            team("lender", "{mode: Queue, cohort: c, limits: {nvidia.com/gpu: 4}}")
        ))
    };
    // a's pods all arrived first: arrival alone would give a all four.
    let mut pods: Vec<Value> = (0..4).map(|i| pod("a", &format!("a{i}"), true, i)).collect();
    pods.extend((0..4).map(|i| pod("b", &format!("b{i}"), true, 10 + i)));
    let count = |actions: &[ControllerAction], ns: &str| {
        released(actions).iter().filter(|(name, from)| name.starts_with(ns) && from.as_deref() == Some("c")).count()
    };
    let equal = plan(&cohort(1), &pods);
    assert_eq!((count(&equal, "a/"), count(&equal, "b/")), (2, 2), "{equal:?}");
    let weighted = plan(&cohort(3), &pods);
    assert_eq!((count(&weighted, "a/"), count(&weighted, "b/")), (1, 3), "{weighted:?}");
}

#[test]
fn a_borrowing_limit_stops_the_borrower_and_says_so() {
    let p = research(", borrowingLimit: {nvidia.com/gpu: 1}");
    let pods: Vec<Value> = (0..6).map(|i| pod("vision", &format!("v{i}"), true, i)).collect();
    let actions = plan(&p, &pods);
    assert_eq!(released(&actions).len(), 5);
    assert_eq!(
        waiting(&actions)["vision/v5"],
        "team vision uses 5 of 4 nvidia.com/gpu (1 borrowed from cohort research, borrowing limit 1); this asks 1"
    );
    let never = policies(&format!(
        "{}{}",
        team(
            "vision",
            "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}, borrowingLimit: {nvidia.com/gpu: 1}}"
        ),
        team("nlp", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}")
    ));
    let mut big = team_pod("big", 6, true, "2026-12-07T01:00:00Z");
    big["metadata"]["namespace"] = json!("vision");
    let actions = plan(&never, &[big, pod("vision", "small", true, 1)]);
    assert_eq!(released(&actions), [("vision/small".to_string(), None)]);
    assert!(
        waiting(&actions)["vision/big"]
            .starts_with("asks 6 nvidia.com/gpu, more than team vision can use in cohort research (5)")
    );
}

#[test]
fn a_gang_borrows_whole_and_every_member_is_marked() {
    let p = research("");
    let mut pods: Vec<Value> = (0..3).map(|i| pod("vision", &format!("v{i}"), false, i)).collect();
    for i in 0..2 {
        let mut m = member(&format!("g{i}"), "ddp", 2, "2026-12-07T01:00:10Z", json!({}));
        m["metadata"]["namespace"] = json!("vision");
        m["spec"]["schedulingGates"] = json!([{"name": "allot.dev/quota"}]);
        pods.push(m);
    }
    let mut members = released(&plan(&p, &pods));
    members.sort(); // (a gang's members are lifted together, in no order)
    let research = Some("research".to_string());
    assert_eq!(members, [("vision/g0".to_string(), research.clone()), ("vision/g1".to_string(), research)]);
}
