//! The sums the store keeps by state equal a recount over the view, whatever the watch did.

use std::sync::Arc;

use proptest::prelude::*;

use crate::control::cluster::usage::{
    Gate, GateGauge, RequestsByState, UsageState, recount_gate_gauges, recount_requests_by_state,
};
use crate::control::cluster::watch_events::{NOW, RESOURCES, Spec, Stand, apply, arb_step, make};
use crate::control::cluster::{ClusterState, PodRecord};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// After any sequence of watch events (adds, updates of state, requests and claims, deletes,
    /// the controller's local marks, relists), the sums and gate gauges kept match a walk over
    /// every pod.
    #[test]
    fn the_kept_sums_equal_a_recount(steps in prop::collection::vec(arb_step(), 1..40)) {
        let state = ClusterState::default();
        for (i, step) in steps.iter().enumerate() {
            apply(&state, step);
            let view = state.view();
            let recount = recount_requests_by_state(&view);
            prop_assert_eq!(&view.requests_by_state(), &recount, "after step {}: {:?}", i, step);
            let gates = recount_gate_gauges(&view, NOW);
            let mut marked: Vec<(String, u32)> = view.borrowed_marks().map(|(ns, n)| (ns.to_string(), n)).collect();
            marked.sort();
            prop_assert_eq!(marked, recount_borrowed_marks(&view), "after step {}: {:?}", i, step);
            drop(view);
            prop_assert_eq!(state.requests_by_state(), recount);
            prop_assert_eq!(state.gate_gauges(NOW), gates, "after step {}: {:?}", i, step);
        }
    }
}

/// The pods carrying the borrowed mark per namespace, by a walk over every pod.
fn recount_borrowed_marks(view: &crate::control::cluster::ClusterView<'_>) -> Vec<(String, u32)> {
    let mut out = std::collections::BTreeMap::<String, u32>::new();
    for p in view.pods().filter(|p| !p.finished && p.borrowed_mark) {
        *out.entry(p.namespace.to_string()).or_default() += 1;
    }
    out.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// After any sequence of watch events, the pods the view keeps for the controller's passes
    /// are those a filter over every pod finds.
    #[test]
    fn the_kept_pods_in_play_equal_a_filter(steps in prop::collection::vec(arb_step(), 1..40)) {
        use crate::control::cluster::store::{preempted_on_node, queued, runs, takes_part};
        let state = ClusterState::default();
        for (i, step) in steps.iter().enumerate() {
            apply(&state, step);
            let view = state.view();
            let names = |pods: &mut dyn Iterator<Item = &PodRecord>| {
                let mut n: Vec<String> = pods.map(|p| format!("{}/{}", p.namespace, p.name)).collect();
                n.sort();
                n
            };
            let filtered = |f: fn(&PodRecord) -> bool| names(&mut view.pods().filter(|p| f(p)));
            prop_assert_eq!(names(&mut view.gang_pass_pods()), filtered(takes_part), "after step {}: {:?}", i, step);
            prop_assert_eq!(names(&mut view.quota_queue_pods()), filtered(queued), "after step {}: {:?}", i, step);
            prop_assert_eq!(names(&mut view.preempted_pods()), filtered(preempted_on_node), "after step {}: {:?}", i, step);
            prop_assert_eq!(names(&mut view.disrupting_pods()), filtered(PodRecord::disrupts_gang), "after step {}: {:?}", i, step);
            // The running pods below each priority the generator draws, and none at or above it.
            for below in [0, 100, 1_000, i32::MAX] {
                let kept = names(&mut view.running_namespaces().flat_map(|ns| view.running_below(ns, below)));
                let walked = names(&mut view.pods().filter(|p| runs(p) && p.priority < below));
                prop_assert_eq!(kept, walked, "below {} after step {}: {:?}", below, i, step);
            }
            prop_assert!(view.running_namespaces().all(|ns| view.running_below(ns, i32::MAX).next().is_some()));
            // The pods by namespace are the pods, each found by name.
            let by_namespace = names(&mut view.pod_namespaces().flat_map(|ns| view.pods_in(ns)));
            prop_assert_eq!(&by_namespace, &names(&mut view.pods()), "after step {}: {:?}", i, step);
            prop_assert!(view.pods().all(|p| view.pod(&p.namespace, &p.name).is_some_and(|q| q == p)));
            prop_assert!(view.pod_namespaces().all(|ns| view.pods_in(ns).all(|p| &*p.namespace == ns)));
            prop_assert!(view.pod_namespaces().all(|ns| view.pods_in(ns).next().is_some()), "no namespace left empty");
            let count = view.pods().count();
            drop(view);
            prop_assert_eq!(count, state.tracked().pods, "the table counts its pods");
        }
    }
}

fn holder(name: &str, stand: Stand) -> Spec {
    let name = name.strip_prefix('p').and_then(|n| n.parse().ok()).expect("pN");
    Spec { claims: vec![(0, 2)], ..Spec::plain(name, stand) }
}

fn claim_only(state: UsageState) -> RequestsByState {
    RequestsByState::from([((Arc::from("ml"), state, Arc::from(RESOURCES[2])), 2_000_000_000)])
}

/// Two pods of a namespace holding one claim count its devices once, in the more advanced
/// state; then in the other's once that one goes; then not at all.
#[test]
fn a_shared_claim_counts_once_in_its_most_advanced_holders_state() {
    let state = ClusterState::default();
    state.upsert_pod(make(&holder("p1", Stand::QuotaQueued)));
    state.upsert_pod(make(&holder("p2", Stand::Bound)));
    assert_eq!(state.requests_by_state(), claim_only(UsageState::Bound));
    state.remove_pod("ml", "p2");
    assert_eq!(state.requests_by_state(), claim_only(UsageState::QuotaQueued));
    state.remove_pod("ml", "p1");
    assert_eq!(state.requests_by_state(), RequestsByState::new());
}

/// Holders that disagree on a claim's devices: those of the holder whose name sorts first
/// count, whichever came first, in the kept sums as in the recount.
#[test]
fn disagreeing_holders_count_the_devices_of_the_first_by_name() {
    let state = ClusterState::default();
    let mut big = holder("p3", Stand::Bound);
    big.claims = vec![(0, 5)];
    state.upsert_pod(make(&big));
    state.upsert_pod(make(&holder("p1", Stand::Pending)));
    assert_eq!(state.requests_by_state(), claim_only(UsageState::Bound), "p1's 2, in p3's state");
    assert_eq!(state.requests_by_state(), recount_requests_by_state(&state.view()));
}

/// Two gang-gated pods: the gauge ages the older; once it is deleted, the younger.
#[test]
fn the_oldest_gated_pod_gone_the_gauge_moves_to_the_next() {
    let state = ClusterState::default();
    let mut older = holder("p1", Stand::GangGated);
    let mut younger = holder("p2", Stand::GangGated);
    (older.created, younger.created) = (0, 10);
    state.upsert_pod(make(&younger));
    state.upsert_pod(make(&older));
    let gang = |pods, oldest_seconds| GateGauge { gate: Gate::Gang, pods, oldest_seconds };
    let quota = GateGauge { gate: Gate::Quota, pods: 0, oldest_seconds: 0 };
    assert_eq!(state.gate_gauges(NOW), [gang(2, 15), quota.clone()]);
    state.remove_pod("ml", "p1");
    assert_eq!(state.gate_gauges(NOW), [gang(1, 5), quota.clone()]);
    state.remove_pod("ml", "p2");
    assert_eq!(state.gate_gauges(NOW), [gang(0, 0), quota]);
}
