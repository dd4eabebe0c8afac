//! The gang snapshot's words, and the snapshot from the view's kept indexes against a walk over
//! every pod.

use std::sync::Arc;

use super::{Terms, first_disagreement};

/// Members (name, terms) and the words expected for them.
type Case<'a> = (&'a [(&'a str, Terms)], Option<&'a str>);

fn terms(size: u32, scheduler: &str) -> Terms {
    Terms { size: Some(size), priority_class: None, scheduler_name: Some(Arc::from(scheduler)) }
}

/// Every order the watch could list the members in gives the same words: the member that
/// stands out, or (no value shared by most) the first two by name that differ; none when
/// all agree.
#[test]
fn the_words_do_not_depend_on_the_order_members_come_in() {
    let cases: [Case<'_>; 5] = [
        (
            &[
                ("a", terms(4, "default")),
                ("b", terms(4, "volcano")),
                ("c", terms(4, "default")),
                ("d", terms(4, "default")),
            ],
            Some("member b has schedulerName volcano, 3 others have default"),
        ),
        (
            &[("a", terms(4, "volcano")), ("b", terms(4, "default")), ("c", terms(4, "default"))],
            Some("member a has schedulerName volcano, 2 others have default"),
        ),
        (
            &[("a", terms(2, "default")), ("b", terms(4, "default")), ("c", terms(4, "volcano")), ("d", terms(2, "x"))],
            Some("members a and b disagree on size (2 and 4)"),
        ),
        (&[("a", terms(4, "default")), ("b", terms(4, "default"))], None),
        // The size is compared first, whichever member differs on it.
        (
            &[("a", terms(4, "default")), ("b", terms(4, "volcano")), ("c", terms(5, "default"))],
            Some("member c has size 5, 2 others have 4"),
        ),
    ];
    for (members, expected) in cases {
        let mut orders = vec![members.to_vec()];
        // Every rotation and its reverse.
        for k in 1..members.len() {
            let mut rotated = members.to_vec();
            rotated.rotate_left(k);
            orders.push(rotated);
        }
        for order in orders.clone() {
            orders.push(order.into_iter().rev().collect());
        }
        for order in orders {
            let mut list: Vec<(Arc<str>, Terms)> = order.iter().map(|(n, t)| (Arc::from(*n), t.clone())).collect();
            assert_eq!(first_disagreement(&mut list).as_deref(), expected, "{order:?}");
        }
    }
}

mod kept_against_walked {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::super::{GangFacts, GangSnapshot, snapshot_by_walking};
    use crate::control::cluster::ClusterState;
    use crate::control::cluster::fixtures::{node, policies};
    use crate::control::cluster::watch_events::{NOW, apply, arb_step};
    use crate::control::gang::decision::{GangKey, Snapshot};
    use crate::model::namespaces::NoNamespaces;

    fn debug(x: &impl std::fmt::Debug) -> String {
        format!("{x:?}")
    }

    /// The snapshot with every order the walk does not fix sorted (the watch's order is not
    /// stable; what the decision reads of these lists does not depend on it).
    fn normalized((mut s, facts): (Snapshot, HashMap<GangKey, GangFacts>)) -> String {
        // A node whose bound pods ask nothing: the walk lists it empty, the kept loads not at
        // all; the fit reads both as nothing used.
        s.bound.retain(|(_, used)| !used.is_empty());
        s.in_flight.sort_by_key(debug);
        s.strays.sort_by_key(debug);
        let mut facts: Vec<(String, String)> = facts
            .into_iter()
            .map(|(k, mut gf)| {
                gf.gated.sort_by_key(debug);
                gf.terms.sort_by_key(debug);
                gf.peer_nodes.sort();
                gf.peer_selectors.sort();
                (debug(&k), debug(&gf))
            })
            .collect();
        facts.sort();
        format!("{s:#?}\n{facts:#?}")
    }

    const GANG_POLICIES: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Queue, limits: {nvidia.com/gpu: 4}}\n";

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// After any sequence of watch events, the snapshot the controller builds from the
        /// view's kept indexes (pods in play, gang members, node loads) is the one a walk over
        /// every pod builds. With one node known, pods are also bound to `n2`, whose Node the
        /// store does not have: its load is in neither.
        #[test]
        fn the_snapshot_from_the_kept_indexes_equals_the_walk(
            steps in prop::collection::vec(arb_step(), 1..30),
            known in 1..=2usize,
        ) {
            let p = policies(GANG_POLICIES);
            let state = ClusterState::default();
            state.replace_nodes([node("n1", 2), node("n2", 2)].into_iter().take(known).collect());
            for (i, step) in steps.iter().enumerate() {
                apply(&state, step);
                let kept = normalized(state.snapshot(&p, &NoNamespaces, NOW));
                let walked = normalized(snapshot_by_walking(&state, &p, &NoNamespaces, NOW));
                prop_assert_eq!(kept, walked, "after step {}: {:?}", i, step);
                let (s, _) = state.snapshot(&p, &NoNamespaces, NOW);
                prop_assert!(s.bound.iter().all(|(n, _)| s.nodes.iter().any(|k| &k.name == n)), "{:?}", s.bound);
            }
        }
    }
}
