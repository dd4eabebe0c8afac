//! The recount read from the kept groups equals the walk over every pod, whatever the watch did.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::super::reconciler::recount_by_team_at;
use super::super::unix_now;
use super::*;
use crate::admission::quota::QuotaRequest;
use crate::control::cluster::ClusterState;
use crate::control::cluster::watch_events::{NAMESPACES, Spec, Stand, Step, apply_made, arb_step, make, pod_name};
use crate::control::quota::ledger::Ledger;
use crate::model::namespaces::NoNamespaces;
use crate::model::policy::{Source, compile};

/// Two deny-mode teams: `ml` counts GPUs and claimed GPU devices, `vision` claimed devices only
/// (its pods' `nvidia.com/gpu` requests and CPU count nothing there).
fn policies() -> PolicySet {
    let team = |name: &str, limits: &str| {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: \
             [{name}]}}\n  quota: {{mode: Deny, limits: {{{limits}}}}}\n"
        )
    };
    let text = [
        team("ml", "nvidia.com/gpu: 4, deviceclass.allot.dev/gpu.nvidia.com: 4"),
        team("vision", "deviceclass.allot.dev/gpu.nvidia.com: 8"),
    ]
    .join("---\n");
    compile(&[Source { name: "teams.yaml".into(), text }]).expect("the test's teams compile")
}

/// A generated pod with its creation time near `now`: long ago (not indexed as recent), ten
/// seconds ago (indexed, old enough to fold) or now (too young to fold); and a claim's devices
/// the same in every pod that holds it (holders that disagree make the walk's choice depend on
/// its order).
fn made(now: i64) -> impl Fn(&Spec) -> PodRecord {
    move |spec: &Spec| {
        let mut spec = spec.clone();
        spec.claims = spec.claims.iter().map(|&(c, _)| (c, c as i64)).collect();
        let mut record = make(&spec);
        record.created = match spec.created {
            0 => now - 100,
            10 => now - 10,
            _ => now,
        };
        record
    }
}

/// Every pod name the generator uses in every namespace, and one it never uses.
fn every_name() -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> =
        NAMESPACES.iter().flat_map(|ns| (0..4).map(move |n| (ns.to_string(), pod_name(n)))).collect();
    names.push(("ml".into(), "absent".into()));
    names
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// After any sequence of watch events (adds, updates of state, requests, claims and gangs,
    /// deletes, the controller's local marks, relists), with pods too young to fold among them,
    /// each deny-mode team's recount from the kept groups has the walk's totals, the same young
    /// pods, and finds every pod it was asked for as the walk does.
    #[test]
    fn the_kept_recount_equals_the_walk(steps in prop::collection::vec(arb_step(), 1..40)) {
        let (p, now) = (policies(), unix_now());
        let state = ClusterState::default();
        let asked: BTreeMap<String, Vec<(String, String)>> =
            ["ml", "vision"].iter().map(|t| (t.to_string(), every_name())).collect();
        for (i, step) in steps.iter().enumerate() {
            apply_made(&state, step, &made(now));
            let view = state.view();
            let walk = recount_by_team_at(&view, &p, &NoNamespaces, now);
            let kept = recount_kept(&view, &p, &NoNamespaces, &asked, now);
            prop_assert_eq!(walk.keys().collect::<Vec<_>>(), kept.keys().collect::<Vec<_>>());
            for (team, w) in &walk {
                let k = &kept[team];
                prop_assert_eq!(w.by_namespace(), k.by_namespace(), "{} after step {}: {:?}", team, i, step);
                prop_assert_eq!(w.young(), k.young(), "{} after step {}: {:?}", team, i, step);
                for (ns, name) in every_name() {
                    prop_assert!(k.knows(&ns, &name));
                    prop_assert_eq!(w.find(&ns, &name), k.find(&ns, &name), "{} {}/{} after step {}", team, ns, name, i);
                }
            }
        }
    }
}

/// The generator does make pods too young to fold, and groups a quota does not count: the
/// property above compares more than empty recounts.
#[test]
fn the_property_sees_young_pods_and_uncounted_groups() {
    let (p, now) = (policies(), unix_now());
    let state = ClusterState::default();
    let young = Spec { namespace: 0, requests: vec![(0, 1)], created: 20, ..Spec::plain(0, Stand::Bound) };
    let old = Spec { namespace: 0, requests: vec![(0, 2)], ..Spec::plain(1, Stand::Bound) };
    let gpu_in_vision = Spec { namespace: 1, requests: vec![(0, 2)], ..Spec::plain(2, Stand::Bound) };
    for spec in [young, old, gpu_in_vision] {
        apply_made(&state, &Step::Upsert(spec), &made(now));
    }
    let kept = recount_kept(&state.view(), &p, &NoNamespaces, &BTreeMap::new(), now);
    assert_eq!(kept["ml"].young(), 1);
    let ml = &kept["ml"].by_namespace()["ml"];
    assert_eq!((ml.pods, ml.plain["nvidia.com/gpu"]), (1, Quantity::from_units(2)), "the young pod is not folded");
    assert!(kept["vision"].by_namespace().is_empty(), "vision's quota counts no nvidia.com/gpu");
}

/// A kept recount leaves a pending charge it was not asked for as it is (the ledger was read
/// again since the leader asked): neither folded, released nor expired, and the reconcile says
/// so, so the leader looks again soon. The charge it was asked for, whose pod is not there,
/// expires as with a walk.
#[test]
fn a_charge_the_recount_was_not_asked_for_stays() {
    let p = policies();
    let quota = p.teams.iter().find(|t| t.name == "ml").and_then(|t| t.quota.clone()).expect("ml has a quota");
    let now = unix_now();
    let mut ledger = Ledger::default();
    ledger.reconcile_with(&Recount::default(), now, &|_| false);
    let requests = ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(1))]);
    for pod in ["asked", "new"] {
        let request = QuotaRequest {
            uid: "review",
            team: "ml",
            namespace: "ml",
            pod,
            pod_uid: pod,
            created: now - 500,
            charge: quota.charge(&requests),
            requests: requests.clone(),
            gang: None,
            shared_claims: Default::default(),
            dry_run: false,
            cohort: None,
        };
        ledger.charge(&quota, &request, pod, now - 500).expect("within the quota");
    }
    let mut recount = Recount::kept(now);
    recount.sighted("ml", "asked", None);
    let report = ledger.reconcile_with(&recount, now, &|_| false);
    assert_eq!((report.expired, report.not_looked_up), (1, 1));
    assert_eq!(ledger.entries().map(|(k, _)| k).collect::<Vec<_>>(), ["new"]);
    let again = ledger.reconcile_with(&Recount::kept(now), now, &|_| false);
    assert_eq!((again.expired, again.not_looked_up, again.changed()), (0, 1, false), "not looked up is no change");
}
