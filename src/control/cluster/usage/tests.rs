//! The sums the store keeps by state equal a recount over the view, whatever the watch did.

use std::sync::Arc;

use proptest::prelude::*;

use crate::control::cluster::fixtures::{queue_policies, record, team_pod};
use crate::control::cluster::records::{HeldClaim, HeldClaims};
use crate::control::cluster::usage::{
    Gate, GateGauge, RequestsByState, UsageState, recount_gate_gauges, recount_requests_by_state,
};
use crate::control::cluster::{ClusterState, PodRecord};
use crate::model::quantity::Quantity;

const NAMESPACES: [&str; 2] = ["ml", "vision"];
const RESOURCES: [&str; 3] = ["nvidia.com/gpu", "cpu", "deviceclass.allot.dev/gpu.nvidia.com"];

/// Where a generated pod stands.
#[derive(Debug, Clone, Copy)]
enum Stand {
    Bound,
    Pending,
    GangGated,
    QuotaQueued,
    BothGates,
    Finished,
}

/// A pod as one watch event shows it.
#[derive(Debug, Clone)]
struct Spec {
    namespace: usize,
    name: usize,
    /// Made again under its name (another uid) when 1.
    generation: u8,
    /// Amount (units, 0 included) of each of [`RESOURCES`] it asks, if any.
    requests: Vec<(usize, i64)>,
    stand: Stand,
    terminating: bool,
    /// Shared claims it names (a name twice possible): (claim, GPUs its devices count).
    claims: Vec<(usize, i64)>,
    /// Created this many seconds after [`CREATED`] (ties included: the oldest is a multiset).
    created: i64,
}

/// The creation of the generated pods' oldest possible, and the fixed `now` the gate gauges are
/// read at (some pods created after it: their age counts as 0).
const CREATED: i64 = 1_795_000_000;
const NOW: i64 = CREATED + 15;

#[derive(Debug, Clone)]
enum Step {
    Upsert(Spec),
    Remove(usize, usize),
    MarkReleased(usize, usize),
    MarkQuotaReleased(usize, usize),
    MarkDeleting(usize, usize, bool),
    /// A relist applied pod by pod; the store's pods it does not name are dropped at its end.
    Relist(Vec<Spec>),
    Replace(Vec<Spec>),
}

fn arb_spec() -> impl Strategy<Value = Spec> {
    let stand = prop_oneof![
        Just(Stand::Bound),
        Just(Stand::Pending),
        Just(Stand::GangGated),
        Just(Stand::QuotaQueued),
        Just(Stand::BothGates),
        Just(Stand::Finished),
    ];
    (
        0..NAMESPACES.len(),
        0..4usize,
        0..2u8,
        prop::collection::vec((0..RESOURCES.len(), 0..3i64), 0..3),
        stand,
        any::<bool>(),
        prop::collection::vec((0..3usize, 0..3i64), 0..3),
        prop_oneof![Just(0i64), Just(10), Just(20)],
    )
        .prop_map(|(namespace, name, generation, requests, stand, terminating, claims, created)| Spec {
            namespace,
            name,
            generation,
            requests,
            stand,
            terminating,
            claims,
            created,
        })
}

fn arb_step() -> impl Strategy<Value = Step> {
    let pod = (0..NAMESPACES.len(), 0..4usize);
    prop_oneof![
        4 => arb_spec().prop_map(Step::Upsert),
        1 => pod.clone().prop_map(|(ns, n)| Step::Remove(ns, n)),
        1 => pod.clone().prop_map(|(ns, n)| Step::MarkReleased(ns, n)),
        1 => pod.clone().prop_map(|(ns, n)| Step::MarkQuotaReleased(ns, n)),
        1 => (pod, any::<bool>()).prop_map(|((ns, n), d)| Step::MarkDeleting(ns, n, d)),
        1 => prop::collection::vec(arb_spec(), 0..6).prop_map(Step::Relist),
        1 => prop::collection::vec(arb_spec(), 0..6).prop_map(Step::Replace),
    ]
}

fn pod_name(name: usize) -> String {
    format!("p{name}")
}

/// A record as the watch would make it, from a plain pod's.
fn make(spec: &Spec) -> PodRecord {
    let mut r = record(&team_pod("base", 1, false, "2026-11-22T01:00:00Z"), &queue_policies());
    r.namespace = Arc::from(NAMESPACES[spec.namespace]);
    r.name = Arc::from(pod_name(spec.name));
    r.uid = Some(Arc::from(format!("uid-{}-{}", spec.name, spec.generation)));
    r.requests = spec.requests.iter().map(|&(i, n)| (Arc::from(RESOURCES[i]), Quantity::from_units(n))).collect();
    let (node, gang, quota) = match spec.stand {
        Stand::Bound => (true, false, false),
        Stand::GangGated => (false, true, false),
        Stand::QuotaQueued => (false, false, true),
        Stand::BothGates => (false, true, true),
        Stand::Pending | Stand::Finished => (false, false, false),
    };
    r.node_name = node.then(|| Arc::from("n1"));
    r.quota_gate_index = quota.then_some(0);
    r.gate_index = gang.then_some(usize::from(quota));
    r.finished = matches!(spec.stand, Stand::Finished);
    r.terminating = spec.terminating && !r.finished;
    r.created = CREATED + spec.created;
    let held = spec.claims.iter().map(|&(c, gpus)| HeldClaim {
        name: Arc::from(format!("claim-{c}/uid-{c}")),
        devices: Box::new([(Arc::from(RESOURCES[2]), Quantity::from_units(gpus))]),
    });
    r.shared_claims = (!spec.claims.is_empty()).then(|| Box::new(HeldClaims(held.collect())));
    r
}

fn apply(state: &ClusterState, step: &Step) {
    let at = |ns: &usize, n: &usize| (NAMESPACES[*ns], pod_name(*n));
    match step {
        Step::Upsert(spec) => state.upsert_pod(make(spec)),
        Step::Remove(ns, n) => state.remove_pod(at(ns, n).0, &at(ns, n).1),
        Step::MarkReleased(ns, n) => state.mark_released(at(ns, n).0, &[at(ns, n).1], 5),
        Step::MarkQuotaReleased(ns, n) => state.mark_quota_released(at(ns, n).0, &at(ns, n).1, 5),
        Step::MarkDeleting(ns, n, d) => state.mark_deleting(at(ns, n).0, &at(ns, n).1, None, *d),
        Step::Relist(specs) => {
            state.begin_relist();
            for spec in specs {
                state.upsert_pod(make(spec));
            }
            state.finish_relist();
        }
        Step::Replace(specs) => state.replace_pods(specs.iter().map(make).collect()),
    }
}

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
            drop(view);
            prop_assert_eq!(state.requests_by_state(), recount);
            prop_assert_eq!(state.gate_gauges(NOW), gates, "after step {}: {:?}", i, step);
        }
    }
}

fn holder(name: &str, stand: Stand) -> Spec {
    let name = name.strip_prefix('p').and_then(|n| n.parse().ok()).expect("pN");
    let claims = vec![(0, 2)];
    Spec { namespace: 0, name, generation: 0, requests: vec![], stand, terminating: false, claims, created: 0 }
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
