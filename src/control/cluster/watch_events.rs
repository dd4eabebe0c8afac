//! Generated watch events for the property tests of the store's kept sums and indexes (and of
//! the passes that read them): pods of two namespaces in every stand, gang members among them,
//! on two nodes, with shared claims; updates, deletions, the controller's local marks, relists.

use std::sync::Arc;

use proptest::prelude::*;

use super::fixtures::{queue_policies, record, team_pod};
use super::records::{GangRef, HeldClaim, HeldClaims, PodUid};
use super::{ClusterState, DisruptionCause, PodRecord};
use crate::model::quantity::Quantity;

pub(crate) const NAMESPACES: [&str; 2] = ["ml", "vision"];
pub(crate) const RESOURCES: [&str; 3] = ["nvidia.com/gpu", "cpu", "deviceclass.allot.dev/gpu.nvidia.com"];

/// Where a generated pod stands.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stand {
    Bound,
    Pending,
    GangGated,
    QuotaQueued,
    BothGates,
    Finished,
}

/// A pod as one watch event shows it.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) namespace: usize,
    pub(crate) name: usize,
    /// Made again under its name (another uid) when 1.
    pub(crate) generation: u8,
    /// Amount (units, 0 included) of each of [`RESOURCES`] it asks, if any.
    pub(crate) requests: Vec<(usize, i64)>,
    pub(crate) stand: Stand,
    pub(crate) terminating: bool,
    /// Shared claims it names (a name twice possible): (claim, GPUs its devices count).
    pub(crate) claims: Vec<(usize, i64)>,
    /// Created this many seconds after [`CREATED`] (ties included: the oldest is a multiset).
    pub(crate) created: i64,
    /// A member of gang `g{0}` declaring size `{1}` (ungated members count as released).
    pub(crate) gang: Option<(usize, u32)>,
    /// Bound to `n1` (0) or `n2` (1).
    pub(crate) node: usize,
    /// Its condition says its gang did not start in time.
    pub(crate) told_late: bool,
    /// A victim of Allot's preemption (matters while terminating).
    pub(crate) preempted: bool,
    /// It carries `allot.dev/borrowed-from`.
    pub(crate) borrowed: bool,
    /// Its priority (a gang's members may differ, as a tenant may make them).
    pub(crate) priority: i32,
}

impl Spec {
    /// A plain pod of `ml`: no requests, no claims, no gang, on `n1` if bound.
    pub(crate) fn plain(name: usize, stand: Stand) -> Spec {
        Spec {
            namespace: 0,
            name,
            generation: 0,
            requests: vec![],
            stand,
            terminating: false,
            claims: vec![],
            created: 0,
            gang: None,
            node: 0,
            told_late: false,
            preempted: false,
            borrowed: false,
            priority: 0,
        }
    }
}

/// The creation of the generated pods' oldest possible, and the fixed `now` the gate gauges are
/// read at (some pods created after it: their age counts as 0).
pub(crate) const CREATED: i64 = 1_795_000_000;
pub(crate) const NOW: i64 = CREATED + 15;

#[derive(Debug, Clone)]
pub(crate) enum Step {
    Upsert(Spec),
    Remove(usize, usize),
    MarkReleased(usize, usize),
    MarkQuotaReleased(usize, usize),
    MarkDeleting(usize, usize, bool),
    MarkBorrowed(usize, usize, bool),
    /// A relist applied pod by pod; the store's pods it does not name are dropped at its end.
    Relist(Vec<Spec>),
    Replace(Vec<Spec>),
}

pub(crate) fn arb_spec() -> impl Strategy<Value = Spec> {
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
        (
            prop::option::of((0..3usize, 1..4u32)),
            0..2usize,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop_oneof![Just(0i32), Just(100), Just(1_000)],
        ),
    )
        .prop_map(
            |(
                namespace,
                name,
                generation,
                requests,
                stand,
                terminating,
                claims,
                created,
                (gang, node, told_late, preempted, borrowed, priority),
            )| {
                Spec {
                    namespace,
                    name,
                    generation,
                    requests,
                    stand,
                    terminating,
                    claims,
                    created,
                    gang,
                    node,
                    told_late,
                    preempted,
                    borrowed,
                    priority,
                }
            },
        )
}

pub(crate) fn arb_step() -> impl Strategy<Value = Step> {
    let pod = (0..NAMESPACES.len(), 0..4usize);
    prop_oneof![
        4 => arb_spec().prop_map(Step::Upsert),
        1 => pod.clone().prop_map(|(ns, n)| Step::Remove(ns, n)),
        1 => pod.clone().prop_map(|(ns, n)| Step::MarkReleased(ns, n)),
        1 => pod.clone().prop_map(|(ns, n)| Step::MarkQuotaReleased(ns, n)),
        1 => (pod.clone(), any::<bool>()).prop_map(|((ns, n), d)| Step::MarkDeleting(ns, n, d)),
        1 => (pod, any::<bool>()).prop_map(|((ns, n), b)| Step::MarkBorrowed(ns, n, b)),
        1 => prop::collection::vec(arb_spec(), 0..6).prop_map(Step::Relist),
        1 => prop::collection::vec(arb_spec(), 0..6).prop_map(Step::Replace),
    ]
}

pub(crate) fn pod_name(name: usize) -> String {
    format!("p{name}")
}

/// A record as the watch would make it, from a plain pod's.
pub(crate) fn make(spec: &Spec) -> PodRecord {
    let mut r = record(&team_pod("base", 1, false, "2026-11-22T01:00:00Z"), &queue_policies());
    r.namespace = Arc::from(NAMESPACES[spec.namespace]);
    r.name = Arc::from(pod_name(spec.name));
    // The API server's form (kept in 16 bytes) for even generations, any string for odd ones.
    let uid = match spec.generation % 2 {
        0 => format!("{:08x}-0000-4000-8000-{:012x}", spec.name, spec.generation),
        _ => format!("uid-{}-{}", spec.name, spec.generation),
    };
    r.uid = Some(PodUid::new(&uid));
    r.requests = spec.requests.iter().map(|&(i, n)| (Arc::from(RESOURCES[i]), Quantity::from_units(n))).collect();
    let (node, gang, quota) = match spec.stand {
        Stand::Bound => (true, false, false),
        Stand::GangGated => (false, true, false),
        Stand::QuotaQueued => (false, false, true),
        Stand::BothGates => (false, true, true),
        Stand::Pending | Stand::Finished => (false, false, false),
    };
    r.node_name = node.then(|| Arc::from(["n1", "n2"][spec.node]));
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
    r.gang = spec.gang.map(|(g, size)| {
        Box::new(GangRef {
            name: format!("g{g}"),
            size: Some(size),
            owner: None,
            leader: false,
            priority_class: None,
            scheduler_name: None,
            native: false,
            topology: None,
        })
    });
    if r.gang.is_some() && r.gate_index.is_none() {
        (r.gang_released, r.released_at) = (true, Some(CREATED + spec.created));
    }
    r.told_start_timeout = spec.told_late;
    r.disruption = spec.preempted.then_some(DisruptionCause::PreemptionByAllot);
    r.borrowed_mark = spec.borrowed;
    r.priority = spec.priority;
    r
}

pub(crate) fn apply(state: &ClusterState, step: &Step) {
    apply_made(state, step, &make);
}

/// [`apply`], with the records made by `make` (a test that needs other creation times).
pub(crate) fn apply_made(state: &ClusterState, step: &Step, make: &dyn Fn(&Spec) -> PodRecord) {
    let at = |ns: &usize, n: &usize| (NAMESPACES[*ns], pod_name(*n));
    match step {
        Step::Upsert(spec) => state.upsert_pod(make(spec)),
        Step::Remove(ns, n) => state.remove_pod(at(ns, n).0, &at(ns, n).1),
        Step::MarkReleased(ns, n) => state.mark_released(at(ns, n).0, &[at(ns, n).1], 5),
        Step::MarkQuotaReleased(ns, n) => state.mark_quota_released(at(ns, n).0, &at(ns, n).1, 5),
        Step::MarkDeleting(ns, n, d) => state.mark_deleting(at(ns, n).0, &at(ns, n).1, None, *d),
        Step::MarkBorrowed(ns, n, b) => state.mark_borrowed(at(ns, n).0, &at(ns, n).1, *b),
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
