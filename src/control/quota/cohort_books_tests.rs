//! Deny-mode borrowing in the single-process books: [`LiveQuota`] (one replica over its cluster
//! view) and [`StaticUsage`] (`allot check --state`, `allot test`'s usage), with the cohort's
//! arithmetic the shared ledger uses ([`crate::admission::quota::check_in_cohort`]).

use std::sync::Arc;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::LiveQuota;
use crate::admission::quota::{QuotaBook, QuotaRequest, StaticUsage};
use crate::control::cluster::{ClusterState, PodRecord};
use crate::model::namespaces::NoNamespaces;
use crate::model::policy::{PolicySet, Source, compile};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

/// vision and nlp, 4 GPUs each, in deny-mode cohort research; vision may borrow 3.
fn research() -> PolicySet {
    let team = |name: &str, extra: &str| {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: \
             [{name}]}}\n  quota: {{mode: Deny, cohort: research, limits: {{nvidia.com/gpu: 4}}{extra}}}\n---\n"
        )
    };
    let text = format!("{}{}", team("vision", ", borrowingLimit: {nvidia.com/gpu: 3}"), team("nlp", ""));
    compile(&[Source { name: "teams.yaml".into(), text }]).unwrap()
}

fn gpus(n: i64) -> ResourceList {
    ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(n))])
}

/// Admits one-GPU pod `pod` of `team` (its namespace is its name), as the validating webhook does.
fn admit(book: &dyn QuotaBook, p: &PolicySet, team: &str, pod: &str) -> Result<(), String> {
    let quota = p.teams.iter().find(|t| t.name == team).and_then(|t| t.quota.clone()).unwrap();
    let request = QuotaRequest {
        uid: pod,
        team,
        namespace: team,
        pod,
        pod_uid: "",
        created: 0,
        charge: quota.charge(&gpus(1)),
        requests: gpus(1),
        gang: None,
        shared_claims: Default::default(),
        dry_run: false,
        cohort: p.cohorts.of_team(team),
    };
    book.admit(&quota, &request).map_err(|r| r.message(team))
}

fn running(p: &PolicySet, namespace: &str, name: &str) -> PodRecord {
    let pod: Value = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-12-07T01:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}
    });
    let pod: Pod = serde_json::from_value(pod).unwrap();
    PodRecord::from_pod(&pod, p, &NoNamespaces).unwrap()
}

#[test]
fn one_replica_lends_an_idle_teams_quota_and_never_refuses_the_lender() {
    let p = research();
    let state = Arc::new(ClusterState::default());
    let book = LiveQuota::new(state.clone(), Arc::new(ArcSwap::from_pointee(research())), Arc::new(NoNamespaces));
    // vision runs 5 (1 borrowed), seen by the watch; nlp runs 1.
    for i in 0..5 {
        state.upsert_pod(running(&p, "vision", &format!("v{i}")));
    }
    state.upsert_pod(running(&p, "nlp", "r0"));
    // vision borrows 2 more (its borrowing limit is 3), from admissions the watch has not seen.
    admit(&book, &p, "vision", "v5").unwrap();
    admit(&book, &p, "vision", "v6").unwrap();
    let refused = admit(&book, &p, "vision", "v7").unwrap_err();
    assert_eq!(
        refused,
        "team vision uses 7 of 4 nvidia.com/gpu (3 borrowed from cohort research, borrowing limit 3); this asks 1"
    );
    // nlp's 3 idle GPUs are lent: its own next 3 are admitted all the same (reclaimed later).
    for i in 1..4 {
        admit(&book, &p, "nlp", &format!("r{i}")).unwrap();
    }
    let refused = admit(&book, &p, "nlp", "r4").unwrap_err();
    assert!(refused.starts_with("team nlp uses 4 of 4 nvidia.com/gpu (0 borrowed"), "{refused}");
}

#[test]
fn the_dry_run_models_the_cohort_from_the_usage_file() {
    let p = research();
    let usage = "teams: {vision: {nvidia.com/gpu: 6}, nlp: {nvidia.com/gpu: 1}}";
    let book = StaticUsage::parse("usage.yaml", usage).unwrap();
    admit(&book, &p, "vision", "a").unwrap();
    let refused = admit(&book, &p, "vision", "b").unwrap_err();
    assert_eq!(
        refused,
        "team vision uses 7 of 4 nvidia.com/gpu (3 borrowed from cohort research, borrowing limit 3); this asks 1"
    );
    // With nlp using its 4, the cohort has nothing unused for vision: the message says so.
    let usage = "teams: {vision: {nvidia.com/gpu: 4}, nlp: {nvidia.com/gpu: 4}}";
    let book = StaticUsage::parse("usage.yaml", usage).unwrap();
    let refused = admit(&book, &p, "vision", "c").unwrap_err();
    assert_eq!(
        refused,
        "team vision uses 4 of 4 nvidia.com/gpu (0 borrowed from cohort research); this asks 1; the cohort has 0 unused"
    );
    // A pod larger than the team could ever have.
    let quota = p.teams[0].quota.clone().unwrap();
    let big = QuotaRequest {
        uid: "big",
        team: "vision",
        namespace: "vision",
        pod: "big",
        pod_uid: "",
        created: 0,
        charge: quota.charge(&gpus(9)),
        requests: gpus(9),
        gang: None,
        shared_claims: Default::default(),
        dry_run: false,
        cohort: p.cohorts.of_team("vision"),
    };
    let refused = crate::admission::quota::NoUsage.admit(&quota, &big).unwrap_err().message("vision");
    assert_eq!(
        refused,
        "team vision can use at most 7 nvidia.com/gpu in cohort research (its nominal quota and what it may borrow); \
         this asks 9, which can never be admitted"
    );
}
