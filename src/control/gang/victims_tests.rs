//! The running units read from the view's running pods by namespace and priority equal those
//! a walk over every pod groups, whatever the watch did, for any priority bound and reach.

use proptest::prelude::*;

use super::*;
use crate::control::cluster::ClusterState;
use crate::control::cluster::fixtures::policies;
use crate::control::cluster::watch_events::{NOW, Spec, Stand, Step, apply, arb_spec, arb_step};
use crate::model::namespaces::NoNamespaces;

/// `ml` is a team with a minRuntime; `vision` is a namespace of no team.
fn teams() -> PolicySet {
    policies(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  preemption: {minRuntime: 5s}\n",
    )
}

fn read(
    view: &ClusterView<'_>,
    p: &PolicySet,
    below: i32,
    in_reach: &dyn Fn(Option<&str>) -> bool,
) -> Vec<RunningUnit> {
    let mut units = running_units(view, p, &NoNamespaces, below, in_reach, NOW);
    units.sort_by(|a, b| a.key.cmp(&b.key));
    units
}

/// Any watch event, or often a running gang member asking a GPU (running gangs of mixed
/// priorities are rare among any events).
fn arb_running_step() -> impl Strategy<Value = Step> {
    let member = (arb_spec(), 0..2usize).prop_map(|(spec, gang)| Spec {
        stand: Stand::Bound,
        terminating: false,
        requests: vec![(0, 1)],
        gang: Some((gang, 2)),
        ..spec
    });
    prop_oneof![2 => arb_step(), 1 => member.prop_map(Step::Upsert)]
}

const REACHES: [fn(Option<&str>) -> bool; 3] = [|_| true, |t| t == Some("ml"), |t| t.is_none()];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// After any sequence of watch events (pods of every stand and of three priorities, gang
    /// members among them, some terminating or disrupted; deletes, marks, relists), the units
    /// read from the kept index are the walk's, below every bound and for every reach.
    #[test]
    fn the_units_read_from_the_index_equal_the_walk(steps in prop::collection::vec(arb_running_step(), 1..40)) {
        let p = teams();
        let state = ClusterState::default();
        for (i, step) in steps.iter().enumerate() {
            apply(&state, step);
            let view = state.view();
            for below in [0, 100, 1_000, i32::MAX] {
                for (r, reach) in REACHES.iter().enumerate() {
                    prop_assert_eq!(read(&view, &p, below, reach), running_units_by_walking(&view, &p, &NoNamespaces, below, reach, NOW), "below {} reach {} after step {}: {:?}", below, r, i, step);
                }
            }
        }
    }
}

fn gpu_pod(name: usize, stand: Stand, priority: i32, gang: Option<(usize, u32)>) -> Spec {
    Spec { requests: vec![(0, 1)], priority, gang, ..Spec::plain(name, stand) }
}

/// A released gang with one member at the preemptor's priority is no victim: none of its
/// members is, though the others are below it (a gang is never evicted in part). Below a
/// higher bound it is one unit of both, with the higher priority.
#[test]
fn a_gang_with_a_member_at_the_preemptors_priority_is_no_victim() {
    let p = teams();
    let state = ClusterState::default();
    for spec in [gpu_pod(0, Stand::Bound, 0, Some((0, 2))), gpu_pod(1, Stand::Bound, 100, Some((0, 2)))] {
        apply(&state, &Step::Upsert(spec));
    }
    apply(&state, &Step::Upsert(gpu_pod(2, Stand::Bound, 0, None)));
    let view = state.view();
    let keys = |below| read(&view, &p, below, &|_| true).into_iter().map(|u| u.key.to_string()).collect::<Vec<_>>();
    assert_eq!(keys(100), ["pod ml/p2"]);
    let units = read(&view, &p, 1_000, &|_| true);
    assert_eq!(units.iter().map(|u| u.key.to_string()).collect::<Vec<_>>(), ["pod ml/p2", "gang ml/g0"]);
    assert_eq!((units[1].priority, units[1].pods.len()), (100, 2));
    // minRuntime counts from the gang's release (the fixture releases it at its creation).
    assert_eq!(units[1].evictable_from, units[1].started + 5);
}

/// A gang with a member starting (released, not bound yet) is no victim; one out of reach is
/// not read at all.
#[test]
fn a_starting_gang_and_work_out_of_reach_are_no_victims() {
    let p = teams();
    let state = ClusterState::default();
    apply(&state, &Step::Upsert(gpu_pod(0, Stand::Bound, 0, Some((0, 2)))));
    apply(&state, &Step::Upsert(gpu_pod(1, Stand::Pending, 0, Some((0, 2)))));
    apply(&state, &Step::Upsert(Spec { namespace: 1, ..gpu_pod(2, Stand::Bound, 0, None) }));
    let view = state.view();
    let keys = |reach: &dyn Fn(Option<&str>) -> bool| {
        read(&view, &p, 100, reach).into_iter().map(|u| u.key.to_string()).collect::<Vec<_>>()
    };
    assert_eq!(keys(&|_| true), ["pod vision/p2"]);
    assert!(keys(&|t| t == Some("ml")).is_empty());
}
