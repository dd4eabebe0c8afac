use std::collections::BTreeMap;

use proptest::prelude::*;

use super::decision::*;
use super::fit::node_admits;
use crate::control::cluster::NodeInfo;
use crate::control::cluster::fixtures::node;
use crate::model::quantity::Quantity;
use crate::model::resources::{ResourceList, ResourceMatcher};

fn q(n: i64) -> Quantity {
    Quantity::from_units(n)
}

use crate::control::cluster::fixtures::gpu_shape as shape;

fn gang(name: &str, expected: u32, present: u32, gpus: i64, priority: i32, created: i64) -> WaitingGang {
    WaitingGang {
        key: GangKey { namespace: "ml".into(), name: name.into() },
        expected: Some(expected),
        members: (0..present).map(|i| Member { name: format!("{name}-{i}"), shape: shape(gpus) }).collect(),
        priority,
        created,
        ready: (created, 0),
        held_by: None,
        disagreement: None,
        unplaceable: None,
        starvation_after: None,
        phantoms: None,
        topology: None,
        joins: None,
        preemptor: None,
    }
}

fn snapshot(nodes: Vec<NodeInfo>, gangs: Vec<WaitingGang>) -> Snapshot {
    Snapshot { now: 1_000, nodes, gangs, accelerators: ResourceMatcher::new(["nvidia.com/gpu"]), ..Default::default() }
}

fn verdict_of<'a>(decisions: &'a [Decision], name: &str) -> &'a Decision {
    decisions.iter().find(|d| d.gang.name == name).unwrap()
}

#[test]
fn the_two_by_four_deadlock_cannot_happen() {
    // 4 GPUs on 2 nodes; two gangs of 4 × 1 GPU, interleaved.
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("b", 4, 4, 1, 0, 20), gang("a", 4, 4, 1, 0, 10)]);
    let d = decide(&s);
    assert!(matches!(&verdict_of(&d, "a").verdict, Verdict::Release { placements, .. } if placements.len() == 4));
    let b = verdict_of(&d, "b");
    assert_eq!(b.verdict, Verdict::DoesNotFit);
    assert_eq!(b.message, "4/4 members present; needs 4 nvidia.com/gpu on any node, 0 free");
}

#[test]
fn a_released_gang_keeps_its_reservation_until_bound() {
    let mut s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("b", 4, 4, 1, 0, 20)]);
    s.in_flight = vec![shape(1); 4];
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
    // Once A's pods are bound, their usage counts as bound instead: still no room.
    s.in_flight.clear();
    s.bound = vec![("n1".into(), shape(2).requests), ("n2".into(), shape(2).requests)];
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
    // A finished: B goes.
    s.bound.clear();
    assert!(matches!(decide(&s)[0].verdict, Verdict::Release { .. }));
}

#[test]
fn incomplete_gangs_wait_and_say_why() {
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("a", 4, 3, 1, 0, 10)]);
    let d = decide(&s);
    assert_eq!(d[0].verdict, Verdict::Incomplete);
    assert_eq!(d[0].message, "3/4 members present; needs 4 nvidia.com/gpu on any node, 4 free");
    let mut unknown = gang("u", 4, 2, 1, 0, 10);
    unknown.expected = None;
    let d = decide(&snapshot(vec![node("n1", 8)], vec![unknown]));
    assert_eq!(d[0].verdict, Verdict::Incomplete);
    assert!(d[0].message.starts_with("2 members present, gang size not known yet"), "{}", d[0].message);
}

#[test]
fn priority_then_age() {
    let s = snapshot(vec![node("n1", 4)], vec![gang("old", 4, 4, 1, 0, 1), gang("urgent", 4, 4, 1, 100, 50)]);
    let d = decide(&s);
    assert_eq!(d[0].gang.name, "urgent");
    assert!(matches!(d[0].verdict, Verdict::Release { .. }));
    assert_eq!(d[1].verdict, Verdict::DoesNotFit);
}

#[test]
fn members_spread_across_nodes_and_respect_per_node_capacity() {
    // 9 GPUs free, but 2-GPU members fit 2 + 1 + 1 = 4 times: exactly the gang.
    let s = snapshot(vec![node("n1", 4), node("n2", 3), node("n3", 2)], vec![gang("a", 4, 4, 2, 0, 1)]);
    let d = decide(&s);
    let Verdict::Release { placements, .. } = &d[0].verdict else { panic!("{d:?}") };
    let mut per_node: BTreeMap<&str, i64> = BTreeMap::new();
    for (_, n) in placements {
        *per_node.entry(n).or_default() += 2;
    }
    assert_eq!(per_node.values().sum::<i64>(), 8);
    assert_eq!(per_node, BTreeMap::from([("n1", 4), ("n2", 2), ("n3", 2)]));
    // With one GPU less on n1 the 8 free GPUs are fragmented: 3 members fit, so none is released.
    let s = snapshot(vec![node("n1", 3), node("n2", 3), node("n3", 2)], vec![gang("a", 4, 4, 2, 0, 1)]);
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
}

#[test]
fn selectors_taints_and_cordons_count() {
    let mut cordoned = node("n1", 8);
    cordoned.unschedulable = true;
    let mut other_pool = node("n2", 8);
    other_pool.labels.insert("node-type".into(), "cheap".into());
    let mut g = gang("a", 2, 2, 1, 0, 1);
    for m in &mut g.members {
        m.shape.placement_mut().node_selector.insert("node-type".into(), "my-precious".into());
    }
    let d = decide(&snapshot(vec![cordoned, other_pool], vec![g.clone()]));
    assert_eq!(d[0].verdict, Verdict::DoesNotFit);
    assert_eq!(
        d[0].message,
        "2/2 members present; needs 2 nvidia.com/gpu on nodes matching node-type=my-precious, 0 free"
    );
    // Without the toleration the tainted pool is out of reach too.
    for m in &mut g.members {
        m.shape.placement_mut().tolerations.clear();
    }
    assert_eq!(decide(&snapshot(vec![node("n3", 8)], vec![g])).first().unwrap().verdict, Verdict::DoesNotFit);
}

#[test]
fn backfill_until_the_big_gang_starves() {
    let big = gang("big", 2, 2, 4, 0, 0); // needs 8: the node has them, but only 4 free
    let small = gang("small", 2, 2, 1, 0, 500);
    let mut s = snapshot(vec![node("n1", 8)], vec![big.clone(), small.clone()]);
    s.bound = vec![("n1".into(), shape(4).requests)];
    let d = decide(&s);
    assert_eq!(verdict_of(&d, "big").verdict, Verdict::DoesNotFit);
    assert!(matches!(verdict_of(&d, "small").verdict, Verdict::Release { .. }), "backfill");

    let mut starving = big;
    starving.starvation_after = Some(600);
    s.gangs = vec![starving, small];
    let d = decide(&s);
    assert_eq!(
        verdict_of(&d, "small").verdict,
        Verdict::Blocked { by: GangKey { namespace: "ml".into(), name: "big".into() } }
    );
    assert!(verdict_of(&d, "small").message.contains("waiting behind higher-priority gang ml/big"));
}

/// A node of the pool `pool` (label `pool=<pool>`) with `gpus` GPUs.
fn pool_node(name: &str, pool: &str, gpus: i64) -> NodeInfo {
    let mut n = node(name, gpus);
    n.labels.insert("pool".into(), pool.into());
    n
}

/// The gang, its members kept to the nodes of `pool`.
fn in_pool(mut g: WaitingGang, pool: &str) -> WaitingGang {
    for m in &mut g.members {
        m.shape.placement_mut().node_selector.insert("pool".into(), pool.into());
    }
    g
}

/// A gang past its starvation limit that could not fit even if every node were empty (a
/// selector no node matches, asking nothing; more GPUs than any node has) holds nobody back:
/// a tenant's one impossible pod no longer stalls every later gang of the cluster. It is told
/// why waiting will not help.
#[test]
fn a_starving_gang_that_can_never_fit_blocks_no_one() {
    let mut nowhere = gang("hog", 1, 1, 0, 0, 0);
    nowhere.members[0].shape.requests = BTreeMap::from([("pods".into(), q(1))]);
    nowhere.members[0].shape.placement_mut().node_selector.insert("nope".into(), "nope".into());
    let mut too_big = gang("whale", 1, 1, 16, 0, 0);
    for hog in [&mut nowhere, &mut too_big] {
        hog.starvation_after = Some(600);
    }
    let mut later = gang("later", 2, 2, 1, 0, 500);
    later.key.namespace = "other-team".into();
    for hog in [nowhere, too_big] {
        let s = snapshot(vec![node("n1", 8)], vec![hog.clone(), later.clone()]);
        let d = decide(&s);
        assert!(matches!(verdict_of(&d, "later").verdict, Verdict::Release { .. }), "{d:?}");
        let told = verdict_of(&d, &hog.key.name);
        assert_eq!(told.verdict, Verdict::DoesNotFit);
        assert!(told.message.ends_with(NEVER_FITS), "{}", told.message);
    }
}

/// A starving gang holds back only gangs that may use its nodes: one in another pool goes on
/// backfilling there, one that may use its pool (a smaller gang of the same pool, a gang that
/// may go anywhere) waits behind it.
#[test]
fn a_starving_gang_blocks_only_gangs_that_compete_for_its_nodes() {
    let nodes = vec![pool_node("a1", "a", 8), pool_node("b1", "b", 4)];
    let mut big = in_pool(gang("big", 2, 2, 4, 0, 0), "a"); // 8 of a's 8, 4 free now
    big.starvation_after = Some(600);
    let elsewhere = in_pool(gang("elsewhere", 2, 2, 1, 0, 500), "b");
    let same_pool = in_pool(gang("same-pool", 2, 2, 1, 0, 500), "a");
    let anywhere = gang("anywhere", 1, 1, 1, 0, 500);
    let mut s = snapshot(nodes, vec![big, elsewhere, same_pool, anywhere]);
    s.bound = vec![("a1".into(), shape(4).requests)];
    let d = decide(&s);
    let behind_big = Verdict::Blocked { by: GangKey { namespace: "ml".into(), name: "big".into() } };
    assert_eq!(verdict_of(&d, "big").verdict, Verdict::DoesNotFit);
    assert!(!verdict_of(&d, "big").message.contains(NEVER_FITS), "it can fit its pool empty");
    assert!(matches!(verdict_of(&d, "elsewhere").verdict, Verdict::Release { .. }), "{d:?}");
    assert_eq!(verdict_of(&d, "same-pool").verdict, behind_big);
    assert_eq!(verdict_of(&d, "anywhere").verdict, behind_big);
}

fn arb_nodes() -> impl Strategy<Value = Vec<NodeInfo>> {
    prop::collection::vec((0i64..9, any::<bool>(), any::<bool>()), 1..8).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (gpus, cordoned, cheap))| {
                let mut n = node(&format!("n{i}"), gpus);
                n.unschedulable = cordoned;
                if cheap {
                    n.labels.insert("node-type".into(), "cheap".into());
                }
                n
            })
            .collect()
    })
}

fn arb_gangs() -> impl Strategy<Value = Vec<WaitingGang>> {
    prop::collection::vec((1u32..6, 0u32..6, 0i64..4, -1i32..2, 0i64..100, any::<bool>()), 0..8).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (expected, present, gpus, priority, created, selector))| {
                let mut g = gang(&format!("g{i}"), expected, present.min(expected + 1), gpus, priority, created);
                if selector {
                    for m in &mut g.members {
                        m.shape.placement_mut().node_selector.insert("node-type".into(), "my-precious".into());
                    }
                }
                g
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn never_overcommits_never_releases_partial_gangs_and_is_deterministic(
        nodes in arb_nodes(),
        gangs in arb_gangs(),
        bound_gpus in prop::collection::vec(0i64..3, 0..4),
    ) {
        let mut s = snapshot(nodes.clone(), gangs.clone());
        s.bound = bound_gpus.iter().enumerate().map(|(i, g)| (nodes[i % nodes.len()].name.clone(), shape(*g).requests)).collect();
        let d = decide(&s);
        prop_assert_eq!(d.len(), gangs.len());

        let mut used: BTreeMap<String, ResourceList> = BTreeMap::new();
        let add = |used: &mut BTreeMap<String, ResourceList>, node: &str, r: &ResourceList| {
            let slot = used.entry(node.to_string()).or_default();
            for (k, v) in r {
                let e = slot.entry(k.clone()).or_default();
                *e = e.saturating_add(*v);
            }
        };
        for (node, r) in &s.bound {
            add(&mut used, node, r);
        }
        for decision in &d {
            if let Verdict::Release { placements, .. } = &decision.verdict {
                let gang = gangs.iter().find(|g| g.key == decision.gang).unwrap();
                prop_assert!(gang.members.len() >= gang.expected.unwrap() as usize, "released an incomplete gang");
                prop_assert_eq!(placements.len(), gang.members.len());
                for (member, node_name) in placements {
                    let m = gang.members.iter().find(|m| &m.name == member).unwrap();
                    let n = nodes.iter().find(|n| &n.name == node_name).unwrap();
                    prop_assert!(node_admits(n, &m.shape), "placed on a node that does not admit it");
                    add(&mut used, node_name, &m.shape.requests);
                }
            }
        }
        for n in &nodes {
            // Bound pods may already exceed a node (they are facts); releases must not add to it.
            let bound_only: i64 = s.bound.iter().filter(|(b, _)| b == &n.name).map(|(_, r)| r["nvidia.com/gpu"].ceil_units()).sum();
            let total = used.get(&n.name).and_then(|u| u.get("nvidia.com/gpu")).map_or(0, |q| q.ceil_units());
            let cap = n.allocatable["nvidia.com/gpu"].ceil_units();
            prop_assert!(total <= cap.max(bound_only), "node {} over-committed: {} > {}", n.name, total, cap);
            if total > bound_only {
                prop_assert!(total <= cap);
            }
        }

        // Deterministic, whatever order the gangs come in.
        let mut reversed = s.clone();
        reversed.gangs.reverse();
        prop_assert_eq!(decide(&reversed), d);
    }

    /// `allot explain` runs the same pass: the decision it reports is `decide`'s, its message is
    /// built from the same `Need`, and its node table agrees with the verdict (members of one
    /// shape: the gang fits exactly when the nodes' counts add up to its members).
    #[test]
    fn explain_is_the_decision_and_its_node_table_agrees_with_the_verdict(
        nodes in arb_nodes(),
        gangs in arb_gangs(),
    ) {
        let s = snapshot(nodes.clone(), gangs.clone());
        for decision in decide(&s) {
            let (explained, detail) = explain(&s, &decision.gang).unwrap();
            prop_assert_eq!(&explained, &decision);
            let gang = gangs.iter().find(|g| g.key == decision.gang).unwrap();
            if matches!(decision.verdict, Verdict::Incomplete | Verdict::DoesNotFit) {
                prop_assert_eq!(detail.need.message(), decision.message.clone());
            }
            let Some(first) = gang.members.first() else {
                prop_assert!(detail.nodes.is_empty());
                continue;
            };
            prop_assert_eq!(detail.nodes.len(), nodes.len());
            for (fit, node) in detail.nodes.iter().zip(&nodes) {
                prop_assert_eq!(fit.refusal.is_none(), node_admits(node, &first.shape));
                if fit.refusal.is_some() {
                    prop_assert_eq!(fit.members, 0);
                }
            }
            let capacity: u64 = detail.nodes.iter().map(|n| n.members).sum();
            let members = gang.members.len() as u64;
            match decision.verdict {
                Verdict::Release { .. } => prop_assert!(capacity >= members, "released with room for {capacity} < {members}"),
                Verdict::DoesNotFit => prop_assert!(capacity < members, "does not fit with room for {capacity} >= {members}"),
                _ => {}
            }
        }
    }
}

mod controller_state {
    use std::collections::HashMap;

    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    use super::*;
    use crate::control::cluster::fixtures::{cluster, member, policies, record, two_gangs};
    use crate::control::cluster::records::condition_fingerprint;
    use crate::control::cluster::{ClusterState, ControllerAction, PodRecord};
    use crate::control::gang::controller::release_patch;
    use crate::control::gang::plan::plan;
    use crate::control::gang::snapshot::GangSnapshot;
    use crate::model::policy::PolicySet;

    fn releases(actions: &[ControllerAction]) -> Vec<String> {
        let mut out: Vec<String> = actions
            .iter()
            .filter_map(|a| if let ControllerAction::Release { pod, .. } = a { Some(pod.clone()) } else { None })
            .collect();
        out.sort();
        out
    }

    const NOW: i64 = 1_795_000_000; // after the pods' creation times

    /// A time as the controller writes it into `allot.dev/gang-released`.
    fn rfc3339(seconds: i64) -> String {
        k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap().to_string()
    }

    /// The `allot.dev/gang-released` annotation reserves capacity only as the controller
    /// writes it: on an ungated, unbound gang member, from its release (never before its pod
    /// was created) until its gang's start timeout. One a user wrote (any value, an old or a
    /// future time) cannot hold nodes for long.
    #[test]
    fn a_release_reserves_capacity_until_the_start_timeout_and_only_for_a_gang_member() {
        let warn = policies(START_WARN);
        let released = |name: &str, value: &str, gang: bool| {
            let mut pod = released_member(name, "a", 4, 0, None);
            pod["metadata"]["annotations"]["allot.dev/gang-released"] = json!(value);
            if !gang {
                pod["metadata"]["labels"] = json!({});
            }
            pod
        };
        let in_flight = |p: &PolicySet, pods: &[Value], now: i64| {
            let state = cluster(p, pods);
            state.snapshot(p, &crate::model::namespaces::NoNamespaces, now).0.in_flight.len()
        };
        assert_eq!(in_flight(&warn, &[released("fresh", &rfc3339(RELEASED), true)], RELEASED + 10), 1);
        // Past the two minutes a release used to hold: held until the start timeout (5m here).
        assert_eq!(in_flight(&warn, &[released("slow", &rfc3339(RELEASED), true)], RELEASED + 121), 1);
        assert_eq!(in_flight(&warn, &[released("slow", &rfc3339(RELEASED), true)], RELEASED + 299), 1);
        assert_eq!(in_flight(&warn, &[released("expired", &rfc3339(RELEASED), true)], RELEASED + 300), 0);
        // Under Fail, a minute longer while its members are being deleted.
        let fail = policies(START_FAIL);
        assert_eq!(in_flight(&fail, &[released("failing", &rfc3339(RELEASED), true)], RELEASED + 359), 1);
        assert_eq!(in_flight(&fail, &[released("failed", &rfc3339(RELEASED), true)], RELEASED + 360), 0);
        assert_eq!(in_flight(&warn, &[released("future", &rfc3339(RELEASED + 86_400), true)], RELEASED), 0);
        assert_eq!(in_flight(&warn, &[released("no-time", "true", true)], RELEASED), 0);
        assert_eq!(in_flight(&warn, &[released("not-a-member", &rfc3339(RELEASED), false)], RELEASED), 0);
        // The controller's own mark counts from the moment it releases.
        let state = cluster(&warn, &[member("m", "a", 1, CREATED, json!({}))]);
        state.mark_released("ml", &["m".into()], RELEASED);
        assert_eq!(state.awaiting_bind(), 1, "the pass runs for it with nothing gated");
        assert_eq!(state.snapshot(&warn, &crate::model::namespaces::NoNamespaces, RELEASED + 299).0.in_flight.len(), 1);
        assert_eq!(state.snapshot(&warn, &crate::model::namespaces::NoNamespaces, RELEASED + 300).0.in_flight.len(), 0);
    }

    /// A running gang whose replacement cannot bind: at the start timeout only the replacement
    /// (released long after the others) is deleted; the members that have run for an hour keep
    /// running (before, a late replacement took the whole job down).
    #[test]
    fn a_late_replacement_fails_alone_not_the_gang_that_runs() {
        let fail = policies(START_FAIL);
        let mut pods: Vec<Value> = (0..3)
            .map(|i| released_member(&format!("r-{i}"), "r", 4, -3_600, Some(if i == 0 { "n1" } else { "n2" })))
            .collect();
        pods.push(released_member("r-3", "r", 4, 0, None));
        let state = cluster(&fail, &pods);
        let (snapshot, facts) = state.snapshot(&fail, &crate::model::namespaces::NoNamespaces, RELEASED + 300);
        let mut explained = HashMap::new();
        let pass = plan(&snapshot, &facts, &mut explained);
        let deleted = deletions(&pass.actions);
        assert_eq!(deleted.len(), 1, "{deleted:?}");
        assert_eq!(deleted[0].0, "ml/r-3");
        assert!(
            deleted[0]
                .2
                .contains("deleting the 1 members released with them or after (the 3 that ran before keep running)"),
            "{}",
            deleted[0].2
        );
    }

    /// A gang member only its team's quota queue released (Allot never held it behind the gang
    /// gate: coscheduling's, a native PodGroup's) waits unbound for its own gang scheduler: it
    /// reserves nothing, runs no start clock, and is never deleted at a start timeout.
    #[test]
    fn a_quota_release_alone_starts_no_clock_and_reserves_nothing() {
        let fail = policies(START_FAIL);
        let mut pod = released_member("q-0", "q", 2, 0, None);
        let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.remove("allot.dev/gang-released");
        annotations.insert("allot.dev/quota-released".into(), json!(rfc3339(RELEASED)));
        let state = cluster(&fail, &[pod]);
        assert_eq!(state.awaiting_bind(), 0, "nothing for the pass to time");
        for now in [RELEASED + 10, RELEASED + 3_600] {
            let (snapshot, facts) = state.snapshot(&fail, &crate::model::namespaces::NoNamespaces, now);
            assert!(snapshot.in_flight.is_empty(), "{now}");
            let mut explained = HashMap::new();
            let pass = plan(&snapshot, &facts, &mut explained);
            assert!(deletions(&pass.actions).is_empty(), "{:?}", pass.actions);
        }
    }

    /// Start timeout 5 minutes, deleting the gang (the default `onStartTimeout`).
    const START_FAIL: &str =
        "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  startTimeout: 5m\n";
    /// Start timeout 5 minutes, a Warning only.
    const START_WARN: &str = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  startTimeout: 5m\n  onStartTimeout: Warn\n";
    /// When the members of the start-timeout tests were created, and when gang a was released.
    const CREATED: &str = "2026-11-18T10:00:00Z";
    const RELEASED: i64 = 1_794_999_660; // 2026-11-18T11:01:00Z

    /// A member of `gang` (`size`, 1 GPU) Allot released at [`RELEASED`] plus `after` seconds:
    /// ungated, on `node` or not bound.
    fn released_member(name: &str, gang: &str, size: u32, after: i64, node: Option<&str>) -> Value {
        let mut pod = member(name, gang, size, CREATED, json!({}));
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        pod["metadata"]["annotations"]["allot.dev/gang-released"] = json!(rfc3339(RELEASED + after));
        if let Some(node) = node {
            pod["spec"]["nodeName"] = json!(node);
            pod["status"]["phase"] = json!("Running");
        }
        pod
    }

    /// Gang a: four 1-GPU members released at [`RELEASED`], none bound (a PVC that does not
    /// exist, say), which fill both nodes; gang b: four gated members needing the same GPUs.
    fn stuck_gang_and_a_waiting_one() -> Vec<Value> {
        let mut pods: Vec<Value> = (0..4).map(|i| released_member(&format!("a-{i}"), "a", 4, 0, None)).collect();
        pods.extend((0..4).map(|i| member(&format!("b-{i}"), "b", 4, "2026-11-18T10:00:05Z", json!({}))));
        pods
    }

    fn deletions(actions: &[ControllerAction]) -> Vec<(String, &'static str, String)> {
        let mut out: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                ControllerAction::Delete { namespace, pod, event_reason, reason, .. } => {
                    Some((format!("{namespace}/{pod}"), *event_reason, reason.clone()))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// (a) A released gang whose members do not bind keeps the GPUs it was released onto past
    /// the two minutes a release used to hold them: the next gang needing them is not released
    /// onto them until the first gang's start timeout, and the loop is told to wake then.
    #[test]
    fn a_released_gang_that_does_not_bind_blocks_the_next_until_its_start_timeout() {
        let p = policies(START_FAIL);
        let state = cluster(&p, &stuck_gang_and_a_waiting_one());
        for after in [10, 121, 299] {
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + after);
            assert_eq!(snapshot.in_flight.len(), 4, "+{after}s: all four still reserved");
            let pass = plan(&snapshot, &facts, &mut HashMap::new());
            assert!(releases(&pass.actions).is_empty(), "+{after}s: {:?}", pass.actions);
            assert!(deletions(&pass.actions).is_empty(), "+{after}s: {:?}", pass.actions);
            assert_eq!(pass.next_deadline, Some(RELEASED + 300), "+{after}s: wakes at the start timeout");
        }
    }

    /// (b) At the start timeout under `Fail`, every present member of the gang that did not
    /// start is deleted, the bound ones too, each with a message saying bare pods are not
    /// recreated; nothing of another namespace's gang of the same name. The next gang is not
    /// released in that pass (the members are still there), nor while bound members still
    /// terminate, and goes in the pass after they are gone.
    #[test]
    fn at_the_start_timeout_fail_deletes_every_member_then_the_next_gang_goes() {
        let p = policies(START_FAIL);
        let mut pods = vec![
            released_member("a-0", "a", 4, 0, Some("n1")),
            released_member("a-1", "a", 4, 0, Some("n1")),
            released_member("a-2", "a", 4, 0, None),
            released_member("a-3", "a", 4, 0, None),
        ];
        pods.extend((0..4).map(|i| member(&format!("b-{i}"), "b", 4, "2026-11-18T10:00:05Z", json!({}))));
        // Another team's gang named a, waiting in its own namespace: none of the first gang's.
        pods.push(member("a-0", "a", 2, CREATED, json!({"metadata": {"namespace": "other"}})));
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 299);
        assert!(deletions(&plan(&snapshot, &facts, &mut HashMap::new()).actions).is_empty());

        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 300);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        let deleted = deletions(&pass.actions);
        let names: Vec<&str> = deleted.iter().map(|(pod, _, _)| pod.as_str()).collect();
        assert_eq!(names, ["ml/a-0", "ml/a-1", "ml/a-2", "ml/a-3"], "{:?}", pass.actions);
        for (_, event_reason, message) in &deleted {
            assert_eq!(*event_reason, "StartTimeout");
            assert_eq!(
                message,
                "the gang did not start: 2/4 released members not bound within 300s of their release (first: a-2); \
                 deleting all 4 members (their controllers recreate them; bare pods are not recreated)"
            );
        }
        assert!(releases(&pass.actions).is_empty(), "not onto GPUs a member being deleted may still take");
        assert_eq!(pass.next_deadline, Some(RELEASED + 360), "wakes when the reservation ends at the latest");

        // As the controller does: the members it deletes are no members for the next pass.
        for pod in ["a-0", "a-1", "a-2", "a-3"] {
            state.mark_deleting("ml", pod, None, true);
        }
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 301);
        assert!(snapshot.in_flight.is_empty());
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(deletions(&pass.actions).is_empty(), "deleted once");
        assert!(releases(&pass.actions).is_empty(), "a-0 and a-1 still hold n1 while they terminate");

        // They are gone: b goes, whole.
        let remaining: Vec<Value> =
            pods.into_iter().filter(|p| !p["metadata"]["name"].as_str().unwrap().starts_with("a-")).collect();
        let after = cluster(&p, &remaining);
        let (snapshot, facts) = after.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 302);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions), ["b-0", "b-1", "b-2", "b-3"]);
    }

    /// (c) Under `onStartTimeout: Warn` nothing is deleted: the released members are told with a
    /// Warning (once), and their reservation ends, so the next gang may go.
    #[test]
    fn at_the_start_timeout_warn_ends_the_reservation_with_a_warning() {
        let p = policies(START_WARN);
        let state = cluster(&p, &stuck_gang_and_a_waiting_one());
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 300);
        assert!(snapshot.in_flight.is_empty(), "the reservation has ended");
        let mut explained = HashMap::new();
        let pass = plan(&snapshot, &facts, &mut explained);
        assert!(deletions(&pass.actions).is_empty(), "{:?}", pass.actions);
        assert_eq!(releases(&pass.actions), ["b-0", "b-1", "b-2", "b-3"]);
        let warned: Vec<(&str, &str)> = pass
            .actions
            .iter()
            .filter_map(|a| match a {
                ControllerAction::Explain { pod, reason, message, warning: true, ready: false, .. }
                    if *reason == "StartTimeout" =>
                {
                    Some((pod.as_str(), message.as_str()))
                }
                _ => None,
            })
            .collect();
        let expected = "the gang did not start: 4/4 released members not bound within 300s of their release \
                        (first: a-0); their reservation has ended: other gangs may be released onto the capacity \
                        they would take";
        assert_eq!(warned, [("a-0", expected), ("a-1", expected), ("a-2", expected), ("a-3", expected)]);
        // Counted for the metrics (allot_gangs_waiting{reason="StartTimeout"}, an alert).
        assert_eq!(pass.waiting.get("StartTimeout"), Some(&1), "{:?}", pass.waiting);
        // Told once: the conditions the controller wrote are not written again.
        for (pod, message) in &warned {
            state.mark_condition("ml", pod, false, condition_fingerprint(false, "StartTimeout", message));
        }
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 400);
        let pass = plan(&snapshot, &facts, &mut explained);
        assert!(
            !pass.actions.iter().any(|a| matches!(a, ControllerAction::Explain { pod, .. } if pod.starts_with("a-"))),
            "{:?}",
            pass.actions
        );
        assert_eq!(pass.waiting.get("StartTimeout"), Some(&1), "still past its start timeout");
    }

    /// (c2) Under `Warn`, a gang past its start timeout that also has a gated replacement is
    /// counted once, as StartTimeout (it was counted under two reasons). When its members bind
    /// after all, the condition that said it did not start is set right ("StartedLate", True),
    /// once, and the pass runs for them although nothing is gated or unbound.
    #[test]
    fn under_warn_a_late_gang_is_counted_once_and_told_when_it_starts() {
        let p = policies(START_WARN);
        let told = |name: &str, node: Option<&str>, message: &str| {
            let mut pod = released_member(name, "a", 3, 0, node);
            pod["status"]["conditions"] = json!([{
                "type": "allot.dev/GangReady", "status": "False", "reason": "StartTimeout", "message": message
            }]);
            pod
        };
        let mut pods = vec![released_member("a-0", "a", 3, 0, None), released_member("a-1", "a", 3, 0, Some("n1"))];
        pods.push(member("a-2", "a", 3, CREATED, json!({})));
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 300);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        let expected: BTreeMap<&str, u64> = BTreeMap::from([("StartTimeout", 1)]);
        assert_eq!(pass.waiting, expected, "counted once: {:?}", pass.actions);
        let message = |a: &ControllerAction| match a {
            ControllerAction::Explain { pod, reason, .. } if *reason == "StartTimeout" => Some(pod.clone()),
            _ => None,
        };
        let told_now: Vec<String> = pass.actions.iter().filter_map(message).collect();
        assert_eq!(told_now, ["a-0", "a-1"], "{:?}", pass.actions);

        // Later every member is bound; two still carry the condition the pass wrote.
        let old = "the gang did not start: …";
        let bound = vec![
            told("a-0", Some("n1"), old),
            told("a-1", Some("n1"), old),
            released_member("a-2", "a", 3, 60, Some("n2")),
        ];
        let state = cluster(&p, &bound);
        assert_eq!((state.gated().0, state.awaiting_bind()), (0, 0));
        assert_eq!(state.told_late(), 2, "the pass runs for them");
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 400);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        let started: Vec<(&str, bool, &str)> = pass
            .actions
            .iter()
            .filter_map(|a| match a {
                ControllerAction::Explain { pod, ready, reason, warning: false, .. } => {
                    Some((pod.as_str(), *ready, *reason))
                }
                _ => None,
            })
            .collect();
        assert_eq!(started, [("a-0", true, "StartedLate"), ("a-1", true, "StartedLate")], "{:?}", pass.actions);
        assert!(pass.waiting.is_empty(), "{:?}", pass.waiting);
        // Told once: written, the conditions are not written again.
        for pod in ["a-0", "a-1"] {
            let written = condition_fingerprint(
                true,
                crate::control::gang::plan::STARTED_LATE_REASON,
                crate::control::gang::plan::STARTED_LATE_MESSAGE,
            );
            state.mark_condition("ml", pod, false, written);
        }
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 410);
        assert!(plan(&snapshot, &facts, &mut HashMap::new()).actions.is_empty());

        // While one is still unbound past the timeout, or was deleted and its replacement waits
        // gated, or is being deleted or gone with no replacement made yet, the bound ones keep
        // the StartTimeout words: the gang has not started.
        let unbound = [told("a-0", None, old), told("a-1", Some("n1"), old)];
        let replaced = [member("a-0", "a", 3, CREATED, json!({})), told("a-1", Some("n1"), old)];
        let mut deleting = told("a-0", None, old);
        deleting["metadata"]["deletionTimestamp"] = json!(rfc3339(RELEASED + 390));
        let leaving = [deleting, told("a-1", Some("n1"), old), released_member("a-2", "a", 3, 60, Some("n2"))];
        let gone = [told("a-1", Some("n1"), old), released_member("a-2", "a", 3, 60, Some("n2"))];
        for pods in [&unbound[..], &replaced[..], &leaving[..], &gone[..]] {
            let state = cluster(&p, pods);
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 400);
            let pass = plan(&snapshot, &facts, &mut HashMap::new());
            assert!(
                !pass.actions.iter().any(|a| matches!(a, ControllerAction::Explain { reason: "StartedLate", .. })),
                "{:?}",
                pass.actions
            );
        }
    }

    /// (d) A member that binds ends its own reservation at once; a gang all of whose members
    /// bound in time has started, and its start timeout never fires.
    #[test]
    fn a_member_that_binds_ends_its_reservation_and_a_started_gang_never_times_out() {
        let p = policies(START_FAIL);
        let mut pods = stuck_gang_and_a_waiting_one();
        pods[0] = released_member("a-0", "a", 4, 0, Some("n1"));
        let state = cluster(&p, &pods);
        let (snapshot, _) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 10);
        assert_eq!(snapshot.in_flight.len(), 3, "a-0 takes its GPU as a bound pod instead");
        let bound: Vec<Value> = (0..4)
            .map(|i| released_member(&format!("a-{i}"), "a", 4, 0, Some(if i < 2 { "n1" } else { "n2" })))
            .collect();
        let state = cluster(&p, &bound);
        assert_eq!(state.awaiting_bind(), 0);
        for after in [10, 300, 100_000] {
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + after);
            assert!(snapshot.in_flight.is_empty());
            assert!(plan(&snapshot, &facts, &mut HashMap::new()).actions.is_empty(), "+{after}s");
        }
    }

    /// (e) Release times a user forged. One from the future is no release: it holds nothing
    /// and deletes nothing. One from long ago counts from the pod's creation (set by the API
    /// server): it neither drops the reservation nor fails the gang before a real release at
    /// its creation would. Either way a reservation ends, and only the gang's own members are
    /// deleted.
    #[test]
    fn forged_release_times_neither_hold_capacity_for_long_nor_fail_a_gang_early() {
        let p = policies(START_FAIL);
        let forged = |value: &str| {
            let mut pods = stuck_gang_and_a_waiting_one();
            for pod in pods.iter_mut().take(4) {
                pod["metadata"]["annotations"]["allot.dev/gang-released"] = json!(value);
                pod["metadata"]["creationTimestamp"] = json!(rfc3339(RELEASED));
            }
            cluster(&p, &pods)
        };
        // From the future: b goes now, and a is never timed out before its time comes.
        let future = forged(&rfc3339(RELEASED + 86_400));
        let (snapshot, facts) = future.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 10);
        assert!(snapshot.in_flight.is_empty());
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(deletions(&pass.actions).is_empty());
        assert_eq!(releases(&pass.actions).len(), 4);
        // From 1970: held from the creation on, for the start timeout, and no longer.
        let old = forged("1970-01-01T00:00:01Z");
        let (snapshot, facts) = old.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 299);
        assert_eq!(snapshot.in_flight.len(), 4, "held as if released at its creation");
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(deletions(&pass.actions).is_empty(), "not failed before its time: {:?}", pass.actions);
        assert!(releases(&pass.actions).is_empty());
        let (snapshot, facts) = old.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 300);
        let names: Vec<String> =
            deletions(&plan(&snapshot, &facts, &mut HashMap::new()).actions).into_iter().map(|d| d.0).collect();
        assert_eq!(names, ["ml/a-0", "ml/a-1", "ml/a-2", "ml/a-3"], "only its own members");
        let (snapshot, _) = old.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 360);
        assert!(snapshot.in_flight.is_empty(), "the reservation ends even if the deletions never land");
        // Just within the clock skew: held from then, and for no longer.
        let skewed = forged(&rfc3339(RELEASED + 70));
        for (now, held) in [(RELEASED + 10, 4), (RELEASED + 70 + 359, 4), (RELEASED + 70 + 360, 0)] {
            let (snapshot, _) = skewed.snapshot(&p, &crate::model::namespaces::NoNamespaces, now);
            assert_eq!(snapshot.in_flight.len(), held, "at {now}");
        }
    }

    #[test]
    fn one_gang_goes_whole_the_other_waits_whole_then_follows() {
        let p = policies("");
        let state = cluster(&p, &two_gangs());
        let mut explained = HashMap::new();
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let actions = plan(&snapshot, &facts, &mut explained).actions;
        assert_eq!(releases(&actions), ["a-0", "a-1", "a-2", "a-3"]);
        let b_explained: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                ControllerAction::Explain { pod, reason, message, ready: false, .. } if pod.starts_with("b-") => {
                    Some((*reason, message.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(b_explained.len(), 4, "every member is told");
        assert_eq!(b_explained[0].0, "InsufficientResources");
        assert_eq!(b_explained[0].1, "4/4 members present; needs 4 nvidia.com/gpu on any node, 0 free");

        // Released locally: a's reservation holds until bound; b is not released onto it, and
        // an unchanged explanation is not written again.
        state.mark_released("ml", &["a-0".into(), "a-1".into(), "a-2".into(), "a-3".into()], NOW);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let actions = plan(&snapshot, &facts, &mut explained).actions;
        assert!(releases(&actions).is_empty());
        assert!(actions.is_empty(), "{actions:?}");

        // After a restart, the reservation is rebuilt from the released annotation alone.
        let mut pods = two_gangs();
        for pod in pods.iter_mut().filter(|p| p["metadata"]["name"].as_str().unwrap().starts_with("a-")) {
            pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
            pod["metadata"]["annotations"]["allot.dev/gang-released"] = json!(rfc3339(NOW - 10));
        }
        let restarted = cluster(&p, &pods);
        let (snapshot, facts) = restarted.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(snapshot.in_flight.len(), 4);
        assert!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions).is_empty());

        // a finished (its pods are gone): b goes, whole.
        let remaining: Vec<Value> =
            pods.into_iter().filter(|p| p["metadata"]["name"].as_str().unwrap().starts_with("b-")).collect();
        let after = cluster(&p, &remaining);
        let (snapshot, facts) = after.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions), ["b-0", "b-1", "b-2", "b-3"]);
    }

    /// The controller reads pods without knowing who wrote them: labels, annotations and owner
    /// references that admission once took for exemptions (Kueue, Volcano, DaemonSet) change
    /// nothing here. A member carrying Allot's gate is a member like any other: counted, held
    /// until its whole gang fits, released with it — once all its members agree on their
    /// scheduler (the Volcano disguise holds the whole gang until it is replaced).
    #[test]
    fn labels_alone_exempt_nothing_in_the_controller() {
        let p = policies("");
        let disguises = [
            json!({"metadata": {"labels": {"kueue.x-k8s.io/managed": "true"}}}),
            json!({"metadata": {"annotations": {"scheduling.k8s.io/group-name": "pg"}}}),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]}}),
            json!({"spec": {"schedulerName": "volcano"}}),
        ];
        let pods: Vec<Value> = disguises
            .iter()
            .enumerate()
            .map(|(i, extra)| member(&format!("d-{i}"), "d", 5, "2026-11-22T01:00:00Z", extra.clone()))
            .collect();
        for pod in &pods {
            let r = record(pod, &p);
            assert!(r.gate_index.is_some() && r.gang.is_some() && !r.foreign_gates(), "{r:?}");
        }
        // 4 of 5 members: all wait, none is released or skipped.
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(snapshot.gangs.len(), 1);
        assert_eq!(snapshot.gangs[0].members.len(), 4);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty(), "{:?}", pass.actions);
        // The fifth arrives and the gang fits, but d-3 names another scheduler: none goes.
        let mut all = pods.clone();
        all.push(member("d-4", "d", 5, "2026-11-22T01:00:00Z", json!({})));
        let state = ClusterState::default();
        state.replace_nodes(vec![node("n1", 8)]);
        state.replace_pods(all.iter().map(|pod| record(pod, &p)).collect());
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty(), "{:?}", pass.actions);
        assert_eq!(pass.waiting.get("MembersDisagree"), Some(&1));
        assert_eq!(
            snapshot.gangs[0].disagreement.as_deref(),
            Some("member d-3 has schedulerName volcano, 4 others have (unset)"),
            "the one that stands out is named"
        );
        // d-3 deleted and made again on the default scheduler: all five go together.
        all[3] = member("d-3", "d", 5, "2026-11-22T01:00:00Z", json!({}));
        state.replace_pods(all.iter().map(|pod| record(pod, &p)).collect());
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(
            releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions),
            ["d-0", "d-1", "d-2", "d-3", "d-4"]
        );
        // And in deny mode they are charged like any member.
        let (usage, _) = state.usage_where(&mut |_| true);
        assert_eq!(usage["nvidia.com/gpu"], Quantity::from_units(5));
    }

    /// Admission denies a member that disagrees with the members the watch has shown, so two
    /// created at the same moment pass it unseen by each other. The controller compares the
    /// members it holds again: a gang whose members disagree on size, priority class or
    /// scheduler is never released (half of it would hold GPUs for a peer another scheduler, or
    /// nobody, places). It is explained with a Warning naming the two members, in the same
    /// words whatever order the watch delivered them in, and it holds up no other gang.
    #[test]
    fn a_gang_whose_members_disagree_is_never_released() {
        let p = policies("");
        let cases = [
            (json!({"spec": {"schedulerName": "volcano"}}), "schedulerName (default-scheduler and volcano)"),
            (json!({"spec": {"priorityClassName": "urgent"}}), "priorityClassName (low and urgent)"),
            (json!({"metadata": {"annotations": {"allot.dev/gang-size": "3"}}}), "size (2 and 3)"),
        ];
        for (odd, words) in cases {
            let agreed = json!({"spec": {"schedulerName": "default-scheduler", "priorityClassName": "low"}});
            let mut pods = vec![member("w-0", "ring", 2, "2026-11-22T01:00:00Z", agreed.clone())];
            let mut second = member("w-1", "ring", 2, "2026-11-22T01:00:00Z", agreed.clone());
            json_patch::merge(&mut second, &odd);
            pods.push(second);
            // A later gang that fits, and enough GPUs for both.
            pods.extend(
                (0..2).map(|i| member(&format!("next-{i}"), "next", 2, "2026-11-22T01:00:09Z", agreed.clone())),
            );
            let mut messages = Vec::new();
            for order in [pods.clone(), pods.iter().rev().cloned().collect()] {
                let state = cluster(&p, &order);
                let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
                let pass = plan(&snapshot, &facts, &mut HashMap::new());
                assert_eq!(releases(&pass.actions), ["next-0", "next-1"], "{words}: {:?}", pass.actions);
                assert_eq!(pass.waiting.get("MembersDisagree"), Some(&1), "{words}");
                let explained: Vec<(&str, &str, bool)> = pass
                    .actions
                    .iter()
                    .filter_map(|a| match a {
                        ControllerAction::Explain { pod, reason, message, warning, ready: false, .. }
                            if pod.starts_with("w-") =>
                        {
                            Some((*reason, message.as_str(), *warning))
                        }
                        _ => None,
                    })
                    .collect();
                assert_eq!(explained.len(), 2, "{words}: {:?}", pass.actions);
                for (reason, message, warning) in &explained {
                    assert_eq!((*reason, *warning), ("MembersDisagree", true));
                    messages.push(message.to_string());
                }
            }
            let expected = format!(
                "2 members present; members w-0 and w-1 disagree on {words}: all members of a gang must agree, \
                 delete the member that differs and create it again as the others are"
            );
            assert_eq!(messages, vec![expected; 4], "{words}");
        }
        // Members that agree (the same fixture without the odd one out) are released.
        let agreed = json!({"spec": {"schedulerName": "default-scheduler", "priorityClassName": "low"}});
        let pods: Vec<Value> =
            (0..2).map(|i| member(&format!("w-{i}"), "ring", 2, "2026-11-22T01:00:00Z", agreed.clone())).collect();
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(snapshot.gangs[0].disagreement, None);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions), ["w-0", "w-1"]);
    }

    /// A gated member whose placement is over the bounds (admitted before the admission check,
    /// or while the webhook was bypassed) keeps only a marker in the view: its gang is never
    /// released (where it may go is not known), its members are told why with a Warning, the
    /// same words whatever order the watch delivered them in, and a later gang still goes.
    #[test]
    fn a_member_over_the_placement_bounds_is_never_placed_and_is_told_why() {
        let p = policies("");
        let many: Vec<Value> = (0..5_000).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect();
        let mut huge = member("w-1", "ring", 2, "2026-11-22T01:00:00Z", json!({}));
        huge["spec"]["tolerations"] = Value::Array(many);
        let r = record(&huge, &p);
        let excess = r.placement_excess().expect("a marker, not the placement");
        assert_eq!(excess.to_string(), "spec.tolerations has 5000 tolerations; at most 64");
        assert!(r.placement.as_ref().is_some_and(|p| p.tolerations.is_empty() && p.heap_bytes() == 0));
        let mut pods = vec![member("w-0", "ring", 2, "2026-11-22T01:00:00Z", json!({})), huge];
        pods.extend((0..2).map(|i| member(&format!("next-{i}"), "next", 2, "2026-11-22T01:00:09Z", json!({}))));
        let mut messages = Vec::new();
        for order in [pods.clone(), pods.iter().rev().cloned().collect()] {
            let state = cluster(&p, &order);
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
            let pass = plan(&snapshot, &facts, &mut HashMap::new());
            assert_eq!(releases(&pass.actions), ["next-0", "next-1"], "{:?}", pass.actions);
            assert_eq!(pass.waiting.get("PlacementTooLarge"), Some(&1));
            for action in &pass.actions {
                if let ControllerAction::Explain { pod, reason, message, warning, ready: false, .. } = action
                    && pod.starts_with("w-")
                {
                    assert_eq!((*reason, *warning), ("PlacementTooLarge", true));
                    messages.push(message.clone());
                }
            }
        }
        let expected = "2 members present; member w-1: spec.tolerations has 5000 tolerations; at most 64, more \
                        than Allot keeps for a pod it holds, so this gang can never be placed: delete its members \
                        and create them again within the bound";
        assert_eq!(messages, vec![expected.to_string(); 4]);
        // Its assembly timeout applies, as to a gang that has not assembled.
        assert!(crate::control::gang::decision::Verdict::Unplaceable.awaits_assembly());
    }

    /// A member released with a placement over the bounds (by an older version) still holds a
    /// reservation until it binds: on some node with room (where it may go is not known), not
    /// nowhere, so the next gang is not released onto the GPUs it will take.
    #[test]
    fn a_released_member_over_the_bounds_still_reserves() {
        let p = policies("");
        let many: Vec<Value> = (0..100).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect();
        let at = k8s_openapi::jiff::Timestamp::from_second(NOW - 5).map(|t| t.to_string()).unwrap_or_default();
        let mut released = member("r-0", "r", 1, "2026-11-22T01:00:00Z", json!({}));
        released["spec"]["tolerations"] = Value::Array(many);
        released["spec"]["schedulingGates"] = json!([]);
        released["metadata"]["annotations"]["allot.dev/gang-released"] = json!(at);
        released["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
        let state = cluster(&p, &[released]);
        let (snapshot, _) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(snapshot.in_flight.len(), 1);
        assert!(snapshot.nodes.iter().any(|n| node_admits(n, &snapshot.in_flight[0])), "reserved somewhere");
    }

    /// A gang whose members disagree never becomes the gang the others wait behind: here it
    /// would not fit now (2 GPUs a member, nodes of 2, one GPU of n1 taken), could fit the empty
    /// nodes, and has waited past its starvation limit, which makes a gang that merely does not
    /// fit hold up every later one that competes for its nodes.
    #[test]
    fn a_gang_whose_members_disagree_holds_up_no_one() {
        let p = policies("");
        let big = json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        let mut odd = big.clone();
        json_patch::merge(&mut odd, &json!({"spec": {"schedulerName": "volcano"}}));
        let long_ago = "2026-11-01T00:00:00Z";
        let mut pods = vec![member("w-0", "ring", 2, long_ago, big.clone()), member("w-1", "ring", 2, long_ago, odd)];
        pods.extend((0..2).map(|i| member(&format!("next-{i}"), "next", 2, "2026-11-17T00:00:00Z", json!({}))));
        pods.push(crate::control::cluster::fixtures::team_pod("running", 1, false, long_ago));
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert_eq!(releases(&pass.actions), ["next-0", "next-1"], "{:?}", pass.actions);
        // The same gang agreeing does block the later one: the check above can fail.
        pods[1] = member("w-1", "ring", 2, long_ago, big);
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty(), "{:?}", pass.actions);
        assert_eq!(pass.waiting.get("WaitingForHigherPriority"), Some(&1));
    }

    /// The review's trigger: one tenant's gang of one pod asking no GPU, whose nodeSelector no
    /// node matches, past its starvation limit. A later gang of another namespace that fits
    /// goes; nobody is told to wait behind the impossible gang, which is told it cannot fit.
    #[test]
    fn one_impossible_pod_past_its_starvation_limit_holds_up_no_one() {
        let p = policies("");
        let long_ago = "2026-11-01T00:00:00Z";
        let nowhere = json!({"spec": {"nodeSelector": {"nope": "nope"}, "containers": [{"name": "c", "image": "i"}]}});
        let mut pods = vec![member("hog-0", "hog", 1, long_ago, nowhere)];
        let other = json!({"metadata": {"namespace": "other"}});
        pods.extend((0..2).map(|i| member(&format!("next-{i}"), "next", 2, "2026-11-17T00:00:00Z", other.clone())));
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert_eq!(releases(&pass.actions), ["next-0", "next-1"], "{:?}", pass.actions);
        assert_eq!(pass.waiting.get("WaitingForHigherPriority"), None);
        let hog = pass.actions.iter().find_map(|a| match a {
            ControllerAction::Explain { pod, reason, message, .. } if pod == "hog-0" => Some((*reason, message)),
            _ => None,
        });
        let (reason, message) = hog.expect("the hog is told");
        assert_eq!(reason, "InsufficientResources");
        assert!(message.ends_with(NEVER_FITS), "{message}");
    }

    /// Members that disagree are a gang that has not assembled: its assembly timeout applies
    /// (here `onTimeout: Fail`, so its members are deleted at the deadline, not before).
    #[test]
    fn a_gang_whose_members_disagree_times_out_like_an_unassembled_one() {
        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  assemblyTimeout: 10s\n  onTimeout: Fail\n",
        );
        let pods = [
            member("w-0", "ring", 2, "2026-11-22T01:00:00Z", json!({})),
            member("w-1", "ring", 2, "2026-11-22T01:00:00Z", json!({"spec": {"schedulerName": "volcano"}})),
        ];
        let state = cluster(&p, &pods);
        let deleted = |now: &str| {
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, snapshot_time(now));
            let pass = plan(&snapshot, &facts, &mut HashMap::new());
            assert!(releases(&pass.actions).is_empty(), "{:?}", pass.actions);
            let deleted: Vec<String> = pass
                .actions
                .iter()
                .filter_map(|a| if let ControllerAction::Delete { pod, .. } = a { Some(pod.clone()) } else { None })
                .collect();
            (deleted, pass.next_deadline)
        };
        assert_eq!(deleted("2026-11-22T01:00:09Z"), (vec![], Some(snapshot_time("2026-11-22T01:00:10Z"))));
        let (mut gone, _) = deleted("2026-11-22T01:00:10Z");
        gone.sort();
        assert_eq!(gone, ["w-0", "w-1"]);
    }

    #[test]
    fn running_members_count_towards_the_quorum_of_a_replacement() {
        let p = policies("");
        let mut pods: Vec<Value> = (0..3)
            .map(|i| {
                let mut pod =
                    member(&format!("w-{i}"), "w", 4, "2026-11-22T01:00:00Z", json!({"spec": {"nodeName": "n1"}}));
                pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
                pod["status"]["phase"] = json!("Running");
                pod
            })
            .collect();
        let mut n1 = node("n1", 8);
        n1.name = "n1".into();
        pods.push(member("w-3-replacement", "w", 4, "2026-11-22T02:00:00Z", json!({})));
        let state = ClusterState::default();
        state.replace_nodes(vec![n1]);
        state.replace_pods(pods.iter().map(|pod| record(pod, &p)).collect());
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions), ["w-3-replacement"]);
    }

    /// Members already running count towards a new member's quorum only while they and the
    /// gated ones fit in the declared size: 4 tiny CPU pods of gang g running, a fifth pod
    /// labelled g (size 4, asking a GPU) is a new gang of 1/4, not a replacement released
    /// alone (before, each of 4 such GPU pods was released one by one).
    #[test]
    fn a_reused_gang_name_does_not_count_the_old_members() {
        let p = policies("");
        let cpu = json!({"spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]}});
        let mut pods: Vec<Value> = (0..4)
            .map(|i| {
                let mut pod = member(&format!("old-{i}"), "g", 4, "2026-11-18T10:00:00Z", cpu.clone());
                pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
                pod["status"]["phase"] = json!("Running");
                pod
            })
            .collect();
        pods.push(member("new-0", "g", 4, "2026-11-18T11:00:00Z", json!({})));
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty(), "{:?}", pass.actions);
        let told = pass.actions.iter().find_map(|a| match a {
            ControllerAction::Explain { pod, reason, message, .. } if pod == "new-0" => {
                Some((*reason, message.clone()))
            }
            _ => None,
        });
        let (reason, message) = told.expect("new-0 is told");
        assert_eq!(reason, "WaitingForMembers");
        assert!(message.starts_with("1/4 members present"), "{message}");
    }

    #[test]
    fn assembly_timeouts_warn_or_fail() {
        let incomplete: Vec<Value> =
            (0..3).map(|i| member(&format!("x-{i}"), "x", 4, "2026-11-22T01:00:00Z", json!({}))).collect();
        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  assemblyTimeout: 5m\n",
        );
        let state = cluster(&p, &incomplete);
        let created = 1_795_000_000 - 10_000;
        let _ = created;
        let (snapshot, facts) =
            state.snapshot(&p, &crate::model::namespaces::NoNamespaces, snapshot_time("2026-11-22T01:04:00Z"));
        let actions = plan(&snapshot, &facts, &mut HashMap::new()).actions;
        assert!(
            actions
                .iter()
                .all(|a| matches!(a, ControllerAction::Explain { reason: "WaitingForMembers", warning: false, .. })),
            "{actions:?}"
        );
        let (snapshot, facts) =
            state.snapshot(&p, &crate::model::namespaces::NoNamespaces, snapshot_time("2026-11-22T01:06:00Z"));
        let actions = plan(&snapshot, &facts, &mut HashMap::new()).actions;
        let ControllerAction::Explain { reason, message, warning, .. } = &actions[0] else { panic!("{actions:?}") };
        assert_eq!((*reason, *warning), ("AssemblyTimeout", true));
        assert!(
            message.starts_with("3/4 members present;") && message.ends_with("not assembled within 300s"),
            "{message}"
        );
        assert!(!actions.iter().any(|a| matches!(a, ControllerAction::Delete { .. })));

        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  assemblyTimeout: 5m\n  onTimeout: Fail\n",
        );
        let state = cluster(&p, &incomplete);
        let (snapshot, facts) =
            state.snapshot(&p, &crate::model::namespaces::NoNamespaces, snapshot_time("2026-11-22T01:06:00Z"));
        let actions = plan(&snapshot, &facts, &mut HashMap::new()).actions;
        assert_eq!(actions.iter().filter(|a| matches!(a, ControllerAction::Delete { .. })).count(), 3);
    }

    fn snapshot_time(t: &str) -> i64 {
        t.parse::<k8s_openapi::jiff::Timestamp>().unwrap().as_second()
    }

    #[test]
    fn the_release_patch_removes_only_our_gate_from_that_very_pod() {
        let mut pod = member("m", "g", 1, "2026-11-22T01:00:00Z", json!({}));
        pod["metadata"]["uid"] = json!("u-1");
        pod["spec"]["schedulingGates"] = json!([{"name": "example.com/other"}, {"name": "allot.dev/gang"}]);
        let release = |index, uid, has_annotations| -> json_patch::Patch {
            serde_json::from_value(release_patch(index, uid, has_annotations, "now")).unwrap()
        };
        let mut released = pod.clone();
        json_patch::patch(&mut released, &release(1, Some("u-1"), true)).unwrap();
        assert_eq!(released["spec"]["schedulingGates"], json!([{"name": "example.com/other"}]));
        assert_eq!(released["metadata"]["annotations"]["allot.dev/gang-released"], "now");
        let _: Pod = serde_json::from_value(released).unwrap();
        // A stale index fails the test op instead of removing someone else's gate.
        assert!(json_patch::patch(&mut pod.clone(), &release(0, Some("u-1"), true)).is_err());
        // A pod made again under the name since the pass decided (another uid, maybe asking
        // more) keeps its gate: the pass decided on its predecessor.
        let mut made_again = pod.clone();
        made_again["metadata"]["uid"] = json!("u-2");
        assert!(json_patch::patch(&mut made_again, &release(1, Some("u-1"), true)).is_err());
        // Pods without annotations get the whole map.
        let mut bare = pod.clone();
        bare["metadata"].as_object_mut().unwrap().remove("annotations");
        json_patch::patch(&mut bare, &release(1, Some("u-1"), false)).unwrap();
        assert_eq!(bare["metadata"]["annotations"], json!({"allot.dev/gang-released": "now"}));
    }

    /// Each release names the uid of the pod the pass decided on, which the lift tests.
    #[test]
    fn a_release_carries_the_uid_the_pass_saw() {
        let p = policies("");
        let pods: Vec<Value> = (0..2)
            .map(|i| {
                let mut pod = member(&format!("w-{i}"), "ring", 2, "2026-11-22T01:00:00Z", json!({}));
                pod["metadata"]["uid"] = json!(format!("u-{i}"));
                pod
            })
            .collect();
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let uids = action_uids(plan(&snapshot, &facts, &mut HashMap::new()).actions, false);
        assert_eq!(uids, [("w-0".into(), Some("u-0".into())), ("w-1".into(), Some("u-1".into()))]);
    }

    /// `(pod, uid)` of the releases (or, with `deletes`, the deletions) among `actions`, sorted.
    fn action_uids(actions: Vec<ControllerAction>, deletes: bool) -> Vec<(String, Option<String>)> {
        let mut uids: Vec<(String, Option<String>)> = actions
            .into_iter()
            .filter_map(|a| match a {
                ControllerAction::Release { pod, uid, .. } if !deletes => Some((pod, uid)),
                ControllerAction::Delete { pod, uid, .. } if deletes => Some((pod, uid)),
                _ => None,
            })
            .map(|(pod, uid)| (pod, uid.map(|u| u.to_string())))
            .collect();
        uids.sort();
        uids
    }

    /// Each deletion (assembly timeout, start timeout) names the uid of the pod the pass
    /// decided on, which the delete takes as its precondition: a same-name successor made since
    /// (a LeaderWorkerSet's stable names) is not deleted by a retry.
    #[test]
    fn a_deletion_carries_the_uid_the_pass_saw() {
        let with_uid = |mut pod: Value, i: usize| {
            pod["metadata"]["uid"] = json!(format!("u-{i}"));
            pod
        };
        let deleted_uids = |actions: Vec<ControllerAction>| action_uids(actions, true);
        // Start timeout: one bound member released with the stuck one, one gated replacement.
        let p = policies(START_FAIL);
        let pods = vec![
            with_uid(released_member("a-0", "a", 3, 0, Some("n1")), 0),
            with_uid(released_member("a-1", "a", 3, 0, None), 1),
            with_uid(member("a-2", "a", 3, CREATED, json!({})), 2),
        ];
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, RELEASED + 300);
        let expected: Vec<(String, Option<String>)> =
            (0..3).map(|i| (format!("a-{i}"), Some(format!("u-{i}")))).collect();
        assert_eq!(deleted_uids(plan(&snapshot, &facts, &mut HashMap::new()).actions), expected);
        // Assembly timeout: the gated members of a gang that never assembled.
        let p = policies(QUEUE_TIMEOUT);
        let state = cluster(&p, &[with_uid(member("g-0", "g", 3, "2026-11-22T01:00:00Z", json!({})), 7)]);
        let (snapshot, facts) =
            state.snapshot(&p, &crate::model::namespaces::NoNamespaces, snapshot_time("2026-11-22T01:00:10Z"));
        let uids = deleted_uids(plan(&snapshot, &facts, &mut HashMap::new()).actions);
        assert_eq!(uids, [("g-0".to_string(), Some("u-7".to_string()))]);
    }

    /// The delete's precondition is the uid when known, none otherwise (a pod seen without one).
    #[test]
    fn delete_params_hold_the_uid_as_precondition() {
        let with = crate::control::gang::controller::delete_params(Some("u-1"));
        let preconditions = with.preconditions.expect("a precondition");
        assert_eq!(preconditions.uid.as_deref(), Some("u-1"));
        assert_eq!(preconditions.resource_version, None);
        assert!(crate::control::gang::controller::delete_params(None).preconditions.is_none());
    }

    /// The leader (worker index 0) of LeaderWorkerSet `llm`'s group 0, gated, asking 1 GPU.
    fn lws_leader() -> Value {
        let mut leader = member("llm-0", "unused", 1, "2026-11-22T01:00:00Z", json!({}));
        leader["metadata"]["labels"] = json!({
            "leaderworkerset.sigs.k8s.io/name": "llm",
            "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": "0"
        });
        leader["metadata"]["annotations"] = json!({});
        leader
    }

    #[test]
    fn a_leader_ready_group_releases_its_leader_when_the_whole_group_would_fit() {
        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [LeaderWorkerSet]\n",
        );
        let leader = lws_leader();
        let owner = crate::model::gang::membership::owner_gang(
            crate::model::gang::membership::InferredKind::LeaderWorkerSet,
            &json!({"spec": {"startupPolicy": "LeaderReady", "leaderWorkerTemplate": {"size": 4, "workerTemplate": {"spec": {
                "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}}),
        )
        .unwrap();
        // 4 GPUs free: leader + 3 workers fit, the leader goes (alone: the workers do not exist).
        let state = cluster(&p, std::slice::from_ref(&leader));
        state.set_owner_gang("ml", "lws-llm-0", owner.clone());
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions), ["llm-0"]);
        // Only 3 GPUs free: the group would not fit, the leader waits.
        let small = ClusterState::default();
        small.replace_nodes(vec![node("n1", 3)]);
        small.replace_pods(vec![record(&leader, &p)]);
        small.set_owner_gang("ml", "lws-llm-0", owner);
        let (snapshot, facts) = small.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions).is_empty());
    }

    /// A declared size is a number a tenant writes: the controller's pass must cost what exists
    /// (members, nodes), not what is declared. Today's loop over missing members took minutes
    /// for `gang-size: "4294967295"`; the bound is generous, it catches hangs, not slowness.
    #[test]
    fn a_gang_declaring_u32_max_members_costs_what_exists() {
        // Admission refuses such sizes (maxGangSize, default 1024), but pods admitted under an
        // older or looser policy, or while the webhook was bypassed, reach the controller: lift
        // the bound here so the controller's own safety is what is tested.
        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [LeaderWorkerSet]\n  maxGangSize: 4294967295\n",
        );
        let huge = member("huge-0", "huge", u32::MAX, "2026-11-22T01:00:00Z", json!({}));
        let small = member("small-0", "small", 1, "2026-11-22T01:00:05Z", json!({}));
        let leader = lws_leader();
        let state = cluster(&p, &[huge, small, leader]);
        // A LeaderWorkerSet whose group size is u32::MAX, tiny workers: every copy would fit a
        // node on its own, so only the bound by capacity stops the phantom loop.
        let owner = crate::model::gang::membership::owner_gang(
            crate::model::gang::membership::InferredKind::LeaderWorkerSet,
            &json!({"spec": {"startupPolicy": "LeaderReady", "leaderWorkerTemplate": {"size": u32::MAX, "workerTemplate": {"spec": {
                "containers": [{"name": "w", "resources": {"requests": {"cpu": "1m"}}}]}}}}}),
        )
        .unwrap();
        state.set_owner_gang("ml", "lws-llm-0", owner);
        let started = std::time::Instant::now();
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        let (usage, _) = state.usage_where(&mut |_| true);
        let elapsed = started.elapsed();
        assert!(elapsed < std::time::Duration::from_secs(1), "one pass took {elapsed:?}");
        // The small gang is not held up by the huge one; the huge one says what it needs.
        assert_eq!(releases(&pass.actions), ["small-0"]);
        let explained = |pod: &str| {
            pass.actions.iter().find_map(|a| match a {
                ControllerAction::Explain { pod: p, message, .. } if p == pod => Some(message.clone()),
                _ => None,
            })
        };
        assert_eq!(
            explained("huge-0").as_deref(),
            Some("1/4294967295 members present; needs 4294967295 nvidia.com/gpu on any node, 4 free")
        );
        assert!(explained("llm-0").is_some_and(|m| m.starts_with("4294967295/4294967295 members present")));
        assert_eq!(usage["nvidia.com/gpu"], Quantity::from_units(i64::from(u32::MAX) + 2));
    }

    /// JobSet and Kubeflow sizes are sums and products of the tenant's numbers: they saturate
    /// (and are then refused as too large for a gang size) instead of overflowing.
    #[test]
    fn owner_sizes_that_overflow_are_refused_without_panicking() {
        use crate::model::gang::membership::{InferredKind, owner_size};
        let jobset = json!({"spec": {"replicatedJobs": [
            {"replicas": u64::MAX, "template": {"spec": {"parallelism": u64::MAX}}},
            {"replicas": u64::MAX}]}});
        assert_eq!(owner_size(InferredKind::JobSet, &jobset), None);
        let pytorch = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": u64::MAX}, "Worker": {"replicas": u64::MAX}}}});
        assert_eq!(owner_size(InferredKind::KubeflowJob, &pytorch), None);
    }

    #[test]
    fn a_bound_terminating_pod_still_takes_its_node_and_a_terminating_member_is_no_member() {
        let p = policies("");
        // 4 GPUs on n1 + n2; a terminating pod still holds one on n1 until it is gone.
        let mut leaving = member("leaving", "x", 1, "2026-11-22T01:00:00Z", json!({"spec": {"nodeName": "n1"}}));
        leaving["metadata"]["labels"] = json!({});
        leaving["spec"]["schedulingGates"] = json!([]);
        leaving["metadata"]["deletionTimestamp"] = json!("2026-11-22T01:05:00Z");
        let gang: Vec<Value> =
            (0..4).map(|i| member(&format!("a-{i}"), "a", 4, "2026-11-22T01:00:00Z", json!({}))).collect();
        let state = cluster(&p, &[gang.clone(), vec![leaving.clone()]].concat());
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty(), "3 GPUs free for a gang of 4: {:?}", pass.actions);
        // Gone: the gang fits.
        state.remove_pod("ml", "leaving");
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions).len(), 4);

        // A gated member being deleted is no member: 3/4 present, nothing released.
        let mut members = gang;
        members[3]["metadata"]["deletionTimestamp"] = json!("2026-11-22T01:05:00Z");
        let state = cluster(&p, &members);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty());
        assert!(
            pass.actions.iter().any(
                |a| matches!(a, ControllerAction::Explain { message, .. } if message.starts_with("3/4 members present"))
            ),
            "{:?}",
            pass.actions
        );
        // ... but it still counts for its team's quota, and the gang is not charged a
        // placeholder for it on top (4 members hold or will hold 1 GPU each).
        let (usage, _) = state.usage_where(&mut |_| true);
        assert_eq!(usage["nvidia.com/gpu"], Quantity::from_units(4));
        let peers = crate::admission::directory::GangDirectory::peers(&state, "ml", "a");
        assert_eq!(peers.len(), 3, "admission's directory lists present members only: {peers:?}");
    }

    #[test]
    fn a_plan_counts_waiting_gangs_by_reason_and_reports_releases_with_their_wait() {
        let p = policies("");
        let mut pods = two_gangs();
        pods.push(member("c-0", "c", 3, "2026-11-22T01:00:09Z", json!({})));
        let state = cluster(&p, &pods);
        let now = snapshot_time("2026-11-22T01:10:00Z");
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, now);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert_eq!(
            pass.waiting,
            std::collections::BTreeMap::from([("InsufficientResources", 1), ("WaitingForMembers", 1)])
        );
        assert_eq!(pass.released.len(), 1);
        let a = &pass.released[0];
        assert_eq!((a.gang.name.as_str(), a.members), ("a", 4));
        assert_eq!(a.waited_secs, 600);
        assert!(a.message.starts_with("4/4 members present"), "{}", a.message);
    }

    /// Regression: the controller once resolved GangPolicies without the pod's team, so pods a
    /// team-scoped policy had gated at admission were never recognised as gang members and
    /// stayed gated for ever.
    #[test]
    fn the_controller_uses_a_team_scoped_gang_policy_like_admission_does() {
        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: research}\nspec:\n  namespaces: {selector: {matchLabels: {team: research}}}\n---\napiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: research-jobs}\nspec:\n  match: {teams: [research]}\n  infer: [Job]\n  assemblyTimeout: 7m\n",
        );
        let mut pod = member("train-0", "-", 2, "2026-11-22T01:00:00Z", json!({}));
        pod["metadata"]["labels"] =
            json!({"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"});
        pod["metadata"]["annotations"] = json!({});
        pod["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u", "controller": true}]);
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let labelled = crate::model::namespaces::StaticNamespaces(HashMap::from([(
            "ml".to_string(),
            std::collections::BTreeMap::from([("team".to_string(), "research".to_string())]),
        )]));
        let record = PodRecord::from_pod(&pod, &p, &labelled).unwrap();
        assert_eq!(record.gang.as_ref().map(|g| g.name.as_str()), Some("job-train"), "{record:?}");
        let state = ClusterState::default();
        state.upsert_pod(record);
        let (_, facts) = state.snapshot(&p, &labelled, NOW);
        let gf = facts.values().next().expect("the gang is tracked");
        assert_eq!(gf.assembly_timeout, 7 * 60, "the team's policy, not the default");
        // Outside the team, the default policy infers nothing: not a gang.
        let plain = PodRecord::from_pod(&pod, &p, &crate::model::namespaces::NoNamespaces).unwrap();
        assert!(plain.gang.is_none());
    }

    /// Regression: lifting the quota gate locally used to forget any third-party gate the
    /// member still had, so its gang could be released past Kueue's gate.
    #[test]
    fn a_member_keeps_waiting_for_a_foreign_gate_after_its_quota_gate_goes() {
        let p = policies("");
        let gates = json!({"spec": {"schedulingGates": [
            {"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}, {"name": "example.com/hold"}
        ]}});
        let state = cluster(&p, &[member("solo-0", "solo", 1, "2026-11-22T01:00:00Z", gates)]);
        state.mark_quota_released("ml", "solo-0", NOW);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(snapshot.gangs[0].held_by.as_deref(), Some("another scheduling gate"), "{:?}", snapshot.gangs);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(releases(&pass.actions).is_empty(), "still held by example.com/hold: {:?}", pass.actions);
        assert_eq!(pass.waiting.get("HeldByOtherGate"), Some(&1));
    }

    const QUEUE_TIMEOUT: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: q}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Queue, limits: {nvidia.com/gpu: 2}}\n---\napiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  assemblyTimeout: 10s\n  onTimeout: Fail\n";

    /// Issue 12, defect 2: a gang whose only member waits in its team's quota queue (both of
    /// Allot's gates) never reached its assembly timeout — the gang plan looked only at gangs
    /// no other gate held. Every waiting gang gets its timeout, whatever gate holds it.
    #[test]
    fn a_gang_waiting_in_its_team_queue_still_reaches_its_assembly_timeout() {
        let p = policies(QUEUE_TIMEOUT);
        let both = json!({"spec": {"schedulingGates": [{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]}});
        let state = cluster(&p, &[member("g-0", "g", 3, "2026-11-22T01:00:00Z", both)]);
        let before = snapshot_time("2026-11-22T01:00:09Z");
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, before);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert!(!pass.actions.iter().any(|a| matches!(a, ControllerAction::Delete { .. })), "{:?}", pass.actions);
        assert_eq!(pass.next_deadline, Some(snapshot_time("2026-11-22T01:00:10Z")), "the loop wakes at the timeout");
        let (snapshot, facts) =
            state.snapshot(&p, &crate::model::namespaces::NoNamespaces, snapshot_time("2026-11-22T01:00:10Z"));
        let actions = plan(&snapshot, &facts, &mut HashMap::new()).actions;
        let deleted: Vec<&str> = actions
            .iter()
            .filter_map(|a| if let ControllerAction::Delete { pod, .. } = a { Some(pod.as_str()) } else { None })
            .collect();
        assert_eq!(deleted, ["g-0"], "{actions:?}");
        assert!(releases(&actions).is_empty());
    }

    /// A complete gang still in its team's queue is explained as held, is never released past
    /// the quota gate, and holds up no other gang (a later gang that fits goes).
    #[test]
    fn a_complete_gang_held_by_the_quota_gate_waits_without_blocking() {
        let p = policies(QUEUE_TIMEOUT);
        let both = json!({"spec": {"schedulingGates": [{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]}});
        let mut pods: Vec<Value> =
            (0..2).map(|i| member(&format!("held-{i}"), "held", 2, "2026-11-22T01:00:00Z", both.clone())).collect();
        pods.extend((0..2).map(|i| member(&format!("free-{i}"), "free", 2, "2026-11-22T01:00:05Z", json!({}))));
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let pass = plan(&snapshot, &facts, &mut HashMap::new());
        assert_eq!(releases(&pass.actions), ["free-0", "free-1"]);
        let held: Vec<&ControllerAction> = pass
            .actions
            .iter()
            .filter(|a| matches!(a, ControllerAction::Explain { pod, .. } if pod.starts_with("held")))
            .collect();
        assert_eq!(held.len(), 2, "{:?}", pass.actions);
        let ControllerAction::Explain { reason, message, ready, .. } = held[0] else { unreachable!() };
        assert_eq!((*reason, *ready), ("HeldByOtherGate", false));
        assert_eq!(
            message,
            "2/2 members present; waiting for the team's quota queue (allot.dev/quota) before placement"
        );
    }

    /// A new leader (empty memory) or a resync does not rewrite an explanation the members
    /// already carry: the condition on the pod is what is compared.
    #[test]
    fn an_explanation_the_members_already_carry_is_not_written_again() {
        let p = policies("");
        let message = "2/3 members present; needs 3 nvidia.com/gpu on any node, 4 free";
        let condition = json!({"status": {"conditions": [{"type": "allot.dev/GangReady", "status": "False",
            "reason": "WaitingForMembers", "message": message}]}});
        let pods: Vec<Value> =
            (0..2).map(|i| member(&format!("x-{i}"), "x", 3, "2026-11-22T01:00:00Z", condition.clone())).collect();
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let actions = plan(&snapshot, &facts, &mut HashMap::new()).actions;
        assert!(actions.is_empty(), "{actions:?}");
        // A third member changes the text: both old members and the new one are told.
        let mut third = member("x-2", "x", 3, "2026-11-22T01:00:01Z", json!({}));
        third["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("8");
        state.upsert_pod(record(&third, &p));
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        let explained = plan(&snapshot, &facts, &mut HashMap::new())
            .actions
            .iter()
            .filter(|a| matches!(a, ControllerAction::Explain { .. }))
            .count();
        assert_eq!(explained, 3);
    }

    /// A gang of 64 created one member per pass: writes (conditions, each with its Event) for
    /// the passes at `times`, the members' condition marked as the controller marks it, and
    /// whether every member ends up carrying the same explanation.
    fn assembly_writes(times: &[i64]) -> (usize, bool) {
        assembly_writes_of(64, times)
    }

    /// [`assembly_writes`] for a gang of `size`.
    fn assembly_writes_of(size: u32, times: &[i64]) -> (usize, bool) {
        use crate::control::cluster::records::condition_fingerprint;
        let p = policies("");
        let state = ClusterState::default();
        state.replace_nodes(vec![crate::control::cluster::fixtures::node("n1", 2)]);
        let mut previous = HashMap::new();
        let mut writes = 0;
        let mut pass = |now: i64| {
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, now);
            let pass = plan(&snapshot, &facts, &mut previous);
            for action in &pass.actions {
                if let ControllerAction::Explain { namespace, pod, ready, reason, message, .. } = action {
                    writes += 1;
                    state.mark_condition(namespace, pod, false, condition_fingerprint(*ready, reason, message));
                }
            }
            pass.next_deadline
        };
        let mut wake = None;
        for (i, now) in times.iter().enumerate() {
            state.upsert_pod(record(&member(&format!("w-{i}"), "big", size, "2026-11-22T01:00:00Z", json!({})), &p));
            wake = pass(*now);
        }
        // Nothing more arrives: the controller looks again when the plan asks.
        if let Some(at) = wake.filter(|at| *at < NOW + 1_000) {
            pass(at);
        }
        let conditions: std::collections::BTreeSet<u64> =
            state.view().pods().filter(|r| r.gang.is_some()).map(|r| r.gang_condition).collect();
        (writes, conditions.len() == 1 && !conditions.contains(&0))
    }

    /// An assembling gang's count is rewritten on its members at most every
    /// COUNT_REFRESH_SECS: a member arriving meanwhile is told at once, the others later, so a
    /// gang created one member at a time no longer costs n²/2 writes (2,080 for 64, then 64 more
    /// once it is complete and does not fit).
    #[test]
    fn an_assembling_gangs_count_is_rewritten_at_most_every_refresh() {
        use crate::control::cluster::action::COUNT_REFRESH_SECS;
        // 63 members in one second, one pass each, and the last ten seconds later.
        let mut burst: Vec<i64> = vec![NOW; 63];
        burst.push(NOW + COUNT_REFRESH_SECS);
        let (writes, converged) = assembly_writes(&burst);
        // 63 told as they come, then all 64 told the gang is complete (it does not fit).
        assert_eq!(writes, 63 + 64);
        assert!(converged);
        // One member per second: each told as it comes, the others every ten seconds.
        let slow: Vec<i64> = (0..64).map(|i| NOW + i).collect();
        let (writes, converged) = assembly_writes(&slow);
        eprintln!("a gang of 64, one member per second: {writes} writes");
        assert!(writes < 64 + 10 + 20 + 30 + 40 + 50 + 60 + 64 + 64, "{writes} writes");
        assert!(writes > 64 + 64, "{writes} writes: the count is refreshed");
        assert!(converged);
        // A gang of 1,024 (the default maxGangSize) created one member per second: refreshed
        // every 10 s it cost 54,577 writes (525,824 before any refresh period); the period
        // grows with the members to tell, about 6 writes a second at most.
        let slow: Vec<i64> = (0..1024).map(|i| NOW + i).collect();
        let (writes, converged) = assembly_writes_of(1024, &slow);
        eprintln!("a gang of 1,024, one member per second: {writes} writes");
        assert!(writes <= 1024 + 1024 + 6 * 1024, "{writes} writes");
        assert!(converged);
        // 40 members in a second, then nothing: the refresh tells the first ones the count.
        let (writes, converged) = assembly_writes(&[NOW; 40]);
        assert_eq!(writes, 40 + 39);
        assert!(converged, "the members told the count earlier are told the current one");
    }

    /// One controller pass over `state` at `now`: the explanations it sends, as (pod, reason,
    /// message), each marked on its pod as the controller marks what it writes; and when the
    /// loop would wake next.
    fn plan_and_mark(
        state: &ClusterState,
        p: &crate::model::policy::PolicySet,
        previous: &mut HashMap<GangKey, crate::control::gang::plan::Explained>,
        now: i64,
    ) -> (Vec<(String, &'static str, String)>, Option<i64>) {
        let (snapshot, facts) = state.snapshot(p, &crate::model::namespaces::NoNamespaces, now);
        let pass = plan(&snapshot, &facts, previous);
        let mut told = Vec::new();
        for action in &pass.actions {
            if let ControllerAction::Explain { namespace, pod, ready, reason, message, .. } = action {
                let fingerprint = crate::control::cluster::records::condition_fingerprint(*ready, reason, message);
                state.mark_condition(namespace, pod, false, fingerprint);
                told.push((pod.clone(), *reason, message.clone()));
            }
        }
        (told, pass.next_deadline)
    }

    /// A count that moves and comes back while members are held back: the member arriving
    /// last is told at once, and at the refresh every member carries the same explanation.
    #[test]
    fn a_count_that_comes_back_still_reaches_every_member() {
        use crate::control::cluster::action::COUNT_REFRESH_SECS;
        let p = policies("");
        let state = ClusterState::default();
        state.replace_nodes(vec![crate::control::cluster::fixtures::node("n1", 2)]);
        let mut previous = HashMap::new();
        let mut pass = |now: i64| {
            let (told, wake) = plan_and_mark(&state, &p, &mut previous, now);
            (told.into_iter().map(|(pod, _, message)| (pod, message[..5].to_string())).collect::<Vec<_>>(), wake)
        };
        let add = |i: usize| {
            state.upsert_pod(record(&member(&format!("m-{i}"), "g", 64, "2026-11-22T01:00:00Z", json!({})), &p));
        };
        (0..3).for_each(add);
        assert_eq!(pass(NOW).0.len(), 3);
        add(3);
        let (told, wake) = pass(NOW + 1);
        assert_eq!(told, [("m-3".to_string(), "4/64 ".to_string())]);
        assert_eq!(wake, Some(NOW + COUNT_REFRESH_SECS));
        state.remove_pod("ml", "m-0");
        state.remove_pod("ml", "m-1");
        add(4);
        // Back to 3/64, the text the first members were told: the newcomer is told all the same.
        let (told, wake) = pass(NOW + 2);
        assert_eq!(told, [("m-4".to_string(), "3/64 ".to_string())]);
        assert_eq!(wake, Some(NOW + COUNT_REFRESH_SECS));
        assert_eq!(pass(NOW + 3).0, [], "nothing new before the refresh");
        // The refresh tells m-3 the current count; the others carry it already.
        assert_eq!(pass(NOW + COUNT_REFRESH_SECS).0, [("m-3".to_string(), "3/64 ".to_string())]);
        let (told, wake) = pass(NOW + COUNT_REFRESH_SECS + 1);
        assert_eq!(told, [], "settled");
        assert!(wake.is_some_and(|at| at > NOW + 100), "only the assembly timeout is ahead: {wake:?}");
    }

    /// A gang waiting for room (or behind another gang) says what is free on its nodes, which
    /// any pod started or deleted there changes: a tenant looping create/delete of a 1-GPU pod
    /// rewrote every waiting member's condition (and an Event) at each change. Now the figures
    /// alone are rewritten at most every refresh period, like an assembling gang's count; a new
    /// verdict is written at once.
    #[test]
    fn free_capacity_churn_rewrites_a_waiting_gang_at_most_every_refresh() {
        use crate::control::cluster::action::COUNT_REFRESH_SECS;
        use crate::control::cluster::fixtures::team_pod;
        let p = policies("");
        // 2 × 2 GPUs on two 2-GPU nodes, one GPU of n1 taken: does not fit, 3 free.
        let mut pods: Vec<Value> = (0..2)
            .map(|i| {
                let two = json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
                member(&format!("big-{i}"), "big", 2, "2026-11-22T01:00:00Z", two)
            })
            .collect();
        pods.push(team_pod("r1", 1, false, "2026-11-22T01:00:00Z"));
        let state = cluster(&p, &pods);
        let mut previous = HashMap::new();
        let mut pass = |now: i64| {
            let (mut told, wake) = plan_and_mark(&state, &p, &mut previous, now);
            told.retain(|(pod, _, _)| pod.starts_with("big-"));
            told.sort();
            (told, wake)
        };
        let churn = |on: bool| {
            if on {
                state.upsert_pod(record(&team_pod("churn", 1, false, "2026-11-22T01:00:00Z"), &p));
            } else {
                state.remove_pod("ml", "churn");
            }
        };
        let both = |reason: &'static str, message: &str| {
            ["big-0", "big-1"].map(|pod| (pod.to_string(), reason, message.to_string())).to_vec()
        };
        let fits_not = |free: u32| format!("2/2 members present; needs 4 nvidia.com/gpu on any node, {free} free");
        let behind = |free: u32| format!("{}; waiting behind higher-priority gang ml/whale", fits_not(free));
        let t0 = NOW;
        assert_eq!(pass(t0).0, both("InsufficientResources", &fits_not(3)));

        // The free count moves, and moves back: nothing is written, the loop wakes at the refresh.
        churn(true);
        let (told, wake) = pass(t0 + 1);
        assert_eq!(told, [], "only the free count changed");
        assert_eq!(wake, Some(t0 + COUNT_REFRESH_SECS));
        churn(false);
        assert_eq!(pass(t0 + 2).0, []);

        // A new verdict is written at once: an older gang competing for the same nodes starves.
        let whale = json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        for i in 0..2 {
            state.upsert_pod(record(
                &member(&format!("whale-{i}"), "whale", 2, "2026-11-01T00:00:00Z", whale.clone()),
                &p,
            ));
        }
        assert_eq!(pass(t0 + 3).0, both("WaitingForHigherPriority", &behind(3)));
        // Behind it, the free count moves again: nothing, until the refresh.
        churn(true);
        let (told, wake) = pass(t0 + 4);
        assert_eq!(told, []);
        assert_eq!(wake, Some(t0 + 3 + COUNT_REFRESH_SECS));
        assert_eq!(pass(t0 + 3 + COUNT_REFRESH_SECS - 1).0, []);
        // After the period the new figures are written.
        assert_eq!(pass(t0 + 3 + COUNT_REFRESH_SECS).0, both("WaitingForHigherPriority", &behind(2)));
        assert_eq!(pass(t0 + 3 + COUNT_REFRESH_SECS + 1).0, [], "settled");

        // Room at last: the release is written at once, whatever the period.
        for pod in ["whale-0", "whale-1", "churn", "r1"] {
            state.remove_pod("ml", pod);
        }
        let (told, _) = pass(t0 + 3 + COUNT_REFRESH_SECS + 2);
        assert_eq!(told, both("Released", "2/2 members present; the whole gang fits, releasing"));
    }

    /// Free capacity moves for every waiting gang at once, so its rewrites are paced by all the
    /// members told it, not gang by gang: in a Queue-mode team (incomplete queued gangs are
    /// never charged), 200 gangs of one member each (size 2) are told the free GPUs once; a
    /// pod started elsewhere moves the figure, and 10 s later not all 200 are rewritten (before,
    /// each gang's own period was 10 s: 200 conditions and 200 Events every 10 s while capacity
    /// moved, 10,000 gangs saturating the explainer). They are once the period for 200 members
    /// is up. A member told nothing yet, and a gang whose state changes, is told at once.
    #[test]
    fn free_capacity_churn_rewrites_many_waiting_gangs_within_one_budget() {
        use crate::control::cluster::action::refresh_secs;
        use crate::control::cluster::fixtures::{queue_policies, team_pod};
        let p = queue_policies();
        let queued = |name: &str, gang: &str| {
            let both = json!({"spec": {"schedulingGates": [{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]}});
            member(name, gang, 2, "2026-11-18T11:00:00Z", both)
        };
        let pods: Vec<Value> = (0..200).map(|i| queued(&format!("g{i}-0"), &format!("g{i}"))).collect();
        let state = cluster(&p, &pods);
        let mut previous = HashMap::new();
        let t0 = NOW;
        let (told, _) = plan_and_mark(&state, &p, &mut previous, t0);
        assert_eq!(told.len(), 200, "each member told once");
        assert!(
            told.iter().all(|(_, reason, message)| *reason == "WaitingForMembers" && message.ends_with(", 4 free"))
        );

        // Someone's pod starts: every gang's free figure moves.
        state.upsert_pod(record(&team_pod("churn", 1, false, "2026-11-18T11:00:00Z"), &p));
        let every = refresh_secs(200);
        let (told, wake) = plan_and_mark(&state, &p, &mut previous, t0 + 1);
        assert_eq!(told, [], "only the free figure changed");
        assert_eq!(wake, Some(t0 + every));
        let (told, _) = plan_and_mark(&state, &p, &mut previous, t0 + 10);
        assert!(told.len() <= 64, "{} rewrites 10 s later", told.len());

        // A new gang's member is told at once; so is a gang whose verdict changes (complete:
        // its team's queue holds it now).
        state.upsert_pod(record(&queued("new-0", "new"), &p));
        state.upsert_pod(record(&queued("g0-1", "g0"), &p));
        let (mut told, _) = plan_and_mark(&state, &p, &mut previous, t0 + 11);
        told.sort();
        let who: Vec<(&str, &str)> = told.iter().map(|(pod, reason, _)| (pod.as_str(), *reason)).collect();
        assert_eq!(who, [("g0-0", "HeldByOtherGate"), ("g0-1", "HeldByOtherGate"), ("new-0", "WaitingForMembers")]);

        // The period for all the members told is up: the others carry the current figure.
        let (told, _) = plan_and_mark(&state, &p, &mut previous, t0 + every);
        assert_eq!(told.len(), 199, "g1..g199 (new-0 was told the current figure)");
        assert!(told.iter().all(|(_, _, message)| message.ends_with(", 3 free")), "{told:?}");
        assert_eq!(plan_and_mark(&state, &p, &mut previous, t0 + every + 1).0, [], "settled");
    }

    /// Gangs created in the same second go in the order Allot saw them, not by name.
    #[test]
    fn gangs_created_in_the_same_second_go_in_arrival_order() {
        let p = policies("");
        let state = ClusterState::default();
        state.replace_nodes(vec![crate::control::cluster::fixtures::node("n1", 2)]);
        // "z" arrives first; "a" would win a tie broken by name.
        for gang in ["z", "a"] {
            for i in 0..2 {
                state.upsert_pod(record(
                    &member(&format!("{gang}-{i}"), gang, 2, "2026-11-22T01:00:00Z", json!({})),
                    &p,
                ));
            }
        }
        let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
        assert_eq!(releases(&plan(&snapshot, &facts, &mut HashMap::new()).actions), ["z-0", "z-1"]);
    }

    /// The reasons a plan gives the members of `gang` (one per member told).
    fn reasons_of(pass: &crate::control::gang::plan::Plan, gang: &str) -> Vec<&'static str> {
        pass.actions
            .iter()
            .filter_map(|a| match a {
                ControllerAction::Explain { pod, reason, .. } if pod.starts_with(&format!("{gang}-")) => Some(*reason),
                _ => None,
            })
            .collect()
    }

    /// A 2-GPU member of gang `gang` (size `size`), created at `created`.
    fn two_gpu_member(name: &str, gang: &str, size: u32, created: &str) -> Value {
        let two = json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        member(name, gang, size, created, two)
    }

    /// A gang is ordered from when it became complete (its newest member), not from its oldest
    /// member: gang a's placeholder a-0, created a month before the rest (default `onTimeout:
    /// Warn` never deletes it), does not put a ahead of gang v, complete since 10:50 while a
    /// is complete only since 11:06. Both ask the cluster's 4 GPUs: v goes, a waits. (Before,
    /// a went, and it had been "waiting" a month.) The assembly timeout still runs from a-0.
    #[test]
    fn a_placeholder_member_does_not_make_its_gang_old() {
        let p = policies("");
        let mut pods = vec![member("a-0", "a", 4, "2026-10-18T11:00:00Z", json!({}))];
        pods.extend((1..4).map(|i| member(&format!("a-{i}"), "a", 4, "2026-11-18T11:06:00Z", json!({}))));
        pods.extend((0..4).map(|i| member(&format!("v-{i}"), "v", 4, "2026-11-18T10:50:00Z", json!({}))));
        for order in [pods.clone(), pods.iter().rev().cloned().collect()] {
            let state = cluster(&p, &order);
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
            let a = snapshot.gangs.iter().find(|g| g.key.name == "a").expect("a waits");
            assert_eq!(a.created, snapshot_time("2026-10-18T11:00:00Z"), "the assembly timeout's start");
            assert_eq!(a.ready.0, snapshot_time("2026-11-18T11:06:00Z"), "complete since its last member");
            let pass = plan(&snapshot, &facts, &mut HashMap::new());
            assert_eq!(releases(&pass.actions), ["v-0", "v-1", "v-2", "v-3"], "{:?}", pass.actions);
            assert_eq!(reasons_of(&pass, "a"), ["InsufficientResources"; 4]);
        }
    }

    /// Pods for the starvation tests: gang `big` of two 2-GPU members (`first`, `last`
    /// created), one GPU of n1 taken by a running pod (so big does not fit now but could on
    /// empty nodes), and gang `next` of two 1-GPU members created after big is complete, which
    /// fits what is free: it goes unless big is a starving blocker.
    fn starvation_pods(first: &str, last: &str) -> Vec<Value> {
        let mut pods = vec![two_gpu_member("big-0", "big", 2, first), two_gpu_member("big-1", "big", 2, last)];
        pods.extend((0..2).map(|i| member(&format!("next-{i}"), "next", 2, "2026-11-18T11:06:10Z", json!({}))));
        pods.push(crate::control::cluster::fixtures::team_pod("running", 1, false, "2026-11-01T00:00:00Z"));
        pods
    }

    /// A placeholder does not start the starvation clock either: gang big, one member
    /// created on 1 November and the other a minute ago, has waited a minute, not 17 days, so
    /// the later gang next backfills what is free. Complete for over `starvationTimeout` (30
    /// minutes by default), big does hold next back (before, it did from its first minute).
    #[test]
    fn a_placeholder_member_does_not_start_the_starvation_clock() {
        let p = policies("");
        let pass = |pods: &[Value]| {
            let state = cluster(&p, pods);
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
            plan(&snapshot, &facts, &mut HashMap::new())
        };
        let placeholder = pass(&starvation_pods("2026-11-01T00:00:00Z", "2026-11-18T11:05:40Z"));
        assert_eq!(releases(&placeholder.actions), ["next-0", "next-1"], "{:?}", placeholder.actions);
        assert_eq!(reasons_of(&placeholder, "big"), ["InsufficientResources"; 2]);
        assert_eq!(placeholder.waiting.get("WaitingForHigherPriority"), None);

        let starving = pass(&starvation_pods("2026-11-01T00:00:00Z", "2026-11-18T10:30:00Z"));
        assert!(releases(&starving.actions).is_empty(), "{:?}", starving.actions);
        assert_eq!(reasons_of(&starving, "next"), ["WaitingForHigherPriority"; 2]);
    }

    /// A gang that waited in its own team's quota queue could not go meanwhile: that time does
    /// not count towards its starvation. Gang big, complete since 10:00, waits in its team's
    /// queue until its quota gate is lifted (locally marked, then as a new leader reads the
    /// `allot.dev/quota-released` annotation the lift wrote): right after, the later gang next
    /// still backfills; `starvationTimeout` after the lift, big holds it back. (Before, big was
    /// a starving blocker the moment its quota gate went.)
    #[test]
    fn time_behind_the_teams_quota_does_not_count_towards_starvation() {
        use crate::control::quota::queue::QuotaQueue;
        // When the team's queue let big go: a minute ago, before gang next was created (30 s
        // ago), so big comes first.
        const LIFTED: i64 = NOW - 60;
        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Queue, limits: {nvidia.com/gpu: 8}}\n",
        );
        let labels = crate::model::namespaces::NoNamespaces;
        let mut pods = starvation_pods("2026-11-18T10:00:00Z", "2026-11-18T10:00:00Z");
        for pod in pods.iter_mut().filter(|p| p["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("big-"))) {
            pod["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]);
        }
        let state = cluster(&p, &pods);
        let (snapshot, facts) = state.snapshot(&p, &labels, NOW);
        let held = plan(&snapshot, &facts, &mut HashMap::new());
        assert_eq!(releases(&held.actions), ["next-0", "next-1"], "held by its quota gate: {:?}", held.actions);
        // The team has room: the queue lifts big's quota gates.
        let lifted = state.quota_plan(&p, &labels, &mut HashMap::new(), LIFTED);
        let mut big = Vec::new();
        for action in &lifted {
            if let ControllerAction::ReleaseQuota { pod, .. } = action {
                state.mark_quota_released("ml", pod, LIFTED);
                big.push(pod.clone());
            }
        }
        big.sort();
        assert_eq!(big, ["big-0", "big-1"], "{lifted:?}");
        let at = |state: &ClusterState, now: i64| {
            let (snapshot, facts) = state.snapshot(&p, &labels, now);
            plan(&snapshot, &facts, &mut HashMap::new())
        };
        let starving_after = 30 * 60;
        // The same pods as a new leader reads them: the lift's annotation, no quota gate.
        let mut read_again = pods.clone();
        for pod in
            read_again.iter_mut().filter(|p| p["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("big-")))
        {
            let patch: json_patch::Patch = serde_json::from_value(
                crate::control::gang::controller::quota_release_patch(1, None, true, &rfc3339(LIFTED), None),
            )
            .unwrap();
            json_patch::patch(pod, &patch).unwrap();
            assert_eq!(pod["spec"]["schedulingGates"], json!([{"name": "allot.dev/gang"}]));
        }
        for state in [state, cluster(&p, &read_again)] {
            let just_lifted = at(&state, NOW);
            assert_eq!(releases(&just_lifted.actions), ["next-0", "next-1"], "{:?}", just_lifted.actions);
            assert_eq!(reasons_of(&just_lifted, "big"), ["InsufficientResources"; 2]);
            let later = at(&state, LIFTED + starving_after);
            assert!(releases(&later.actions).is_empty(), "{:?}", later.actions);
            assert_eq!(reasons_of(&later, "next"), ["WaitingForHigherPriority"; 2]);
        }
    }

    /// A gang whose GPUs come from DRA claims waits whole until the nodes' ResourceSlices offer
    /// its devices, and goes whole once they do (issue 15); before the slices are read it is
    /// judged on its other resources alone, as before they were read.
    #[test]
    fn a_gang_asking_claim_devices_goes_only_when_the_slices_offer_them() {
        use std::sync::Arc;

        use crate::control::cluster::Devices;
        use crate::model::dra::slices::{DeviceClassMatcher, NodeDevices, slice_devices};
        use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

        let p = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: cluster}\nspec:\n  dra:\n    deviceClasses:\n      gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n",
        );
        let mut claims = crate::model::dra::ClaimObjects::new("not among the manifests");
        claims.insert(
            &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}}),
            "ml",
        );
        let state = ClusterState::default();
        // No device plugin: the nodes' GPUs are DRA devices only.
        state.replace_nodes(vec![
            crate::control::cluster::fixtures::node("n1", 0),
            crate::control::cluster::fixtures::node("n2", 0),
        ]);
        let members = (0..4).map(|i| {
            let mut pod = member(&format!("d-{i}"), "d", 4, "2026-11-22T01:00:00Z", json!({}));
            pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
            pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]);
            let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).unwrap();
            PodRecord::from_pod_with_claims(&pod, &p, &crate::model::namespaces::NoNamespaces, &claims).unwrap()
        });
        state.replace_pods(members.collect());
        let decide = |state: &ClusterState| {
            let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, NOW);
            plan(&snapshot, &facts, &mut HashMap::new()).actions
        };
        assert_eq!(releases(&decide(&state)), ["d-0", "d-1", "d-2", "d-3"], "slices not read: other resources alone");

        let class: DeviceClass = serde_json::from_value(json!({"metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}))
        .unwrap();
        let matcher = DeviceClassMatcher::new(&[class]);
        let slice = |node: &str| {
            let slice: ResourceSlice = serde_json::from_value(json!({"metadata": {"name": node},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}))
            .unwrap();
            slice_devices(&slice, &matcher)
        };
        let (n1, n2) = (slice("n1"), slice("n2"));

        state.set_devices(Devices::Waiting);
        assert!(!state.complete(), "no pass decides while the device lists are not in");
        state.set_devices(Devices::Known(Arc::new(NodeDevices::from_slices([&n1], &matcher))));
        assert!(state.complete());
        let actions = decide(&state);
        assert!(releases(&actions).is_empty(), "2 GPUs for a gang of 4: {actions:?}");
        let told: Vec<&str> = actions
            .iter()
            .filter_map(|a| match a {
                ControllerAction::Explain { message, ready: false, .. } => Some(message.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(told.len(), 4, "{actions:?}");
        assert_eq!(told[0], "4/4 members present; needs 4 gpu.nvidia.com devices on any node, 2 free");

        state.set_devices(Devices::Known(Arc::new(NodeDevices::from_slices([&n1, &n2], &matcher))));
        assert_eq!(releases(&decide(&state)), ["d-0", "d-1", "d-2", "d-3"], "4 devices on two nodes");

        // A device taken by a bound pod is not free for the gang.
        let mut bound = member("running", "-", 1, "2026-11-22T00:00:00Z", json!({}));
        bound["metadata"]["labels"] = json!({});
        bound["spec"].as_object_mut().unwrap().remove("schedulingGates");
        bound["spec"]["nodeName"] = json!("n2");
        bound["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
        bound["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]);
        let bound: k8s_openapi::api::core::v1::Pod = serde_json::from_value(bound).unwrap();
        state.upsert_pod(
            PodRecord::from_pod_with_claims(&bound, &p, &crate::model::namespaces::NoNamespaces, &claims).unwrap(),
        );
        assert!(releases(&decide(&state)).is_empty(), "3 devices free for 4 members");
    }
}

/// 100k Pods must fit in the controller well under 200 MB (the records, not whole objects).
/// RSS is per process and other tests allocate in parallel, so the measurement runs in a child
/// process of this test binary that runs this test alone.
#[cfg(target_os = "linux")]
#[test]
fn a_hundred_thousand_pods_fit_in_memory() {
    const CHILD: &str = "ALLOT_MEMORY_TEST_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let exe = std::env::current_exe().expect("test binary path");
        // This test's own name, as the harness lists it (the module path without the crate).
        let name = format!("{}::a_hundred_thousand_pods_fit_in_memory", module_path!().trim_start_matches("allot::"));
        let out = std::process::Command::new(exe)
            .args(["--exact", name.as_str(), "--test-threads", "1", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .expect("run the measurement alone");
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("{stderr}");
        assert!(out.status.success(), "the measurement failed:\n{stderr}");
        assert!(stderr.contains("100k pod records"), "the child did not measure: {stderr}");
        return;
    }
    measure_a_hundred_thousand_pods();
}

#[cfg(target_os = "linux")]
fn measure_a_hundred_thousand_pods() {
    use crate::control::cluster::{ClusterState, PodRecord};

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }
    let p = crate::model::policy::compile(&[]).unwrap();
    let template: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x", "namespace": "ns", "uid": "0123456789abcdef0123456789abcdef",
            "labels": {"allot.dev/gang-name": "g", "app": "train"}, "annotations": {"allot.dev/gang-size": "4"},
            "creationTimestamp": "2026-11-22T01:00:00Z"},
        "spec": {"nodeName": "node-00001", "priorityClassName": "low-priority", "schedulerName": "default-scheduler",
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    }))
    .unwrap();
    let base = PodRecord::from_pod(&template, &p, &crate::model::namespaces::NoNamespaces).unwrap();
    let before = rss_kib();
    let state = ClusterState::default();
    // One at a time, as watch events arrive.
    for i in 0..100_000 {
        let mut r = base.clone();
        r.name = format!("pod-{i:06}").into();
        r.namespace = format!("team-{}", i % 50).into();
        r.node_name = Some(format!("node-{:05}", i % 5000).into());
        state.upsert_pod(r);
    }
    let grown_mib = rss_kib().saturating_sub(before) / 1024;
    eprintln!("100k pod records: +{grown_mib} MiB RSS");
    assert_eq!(state.counts().0, 100_000);
    assert!(grown_mib < 120, "{grown_mib} MiB: the records have grown");
}

/// Which failures of a streaming list make the Pod watch list in pages instead: the refusals
/// of API servers that cannot stream (WatchList off: 422/400; etcd too old for watch
/// progress: a 500 naming RequestWatchProgress, as the 1.36 API server on etcd 3.4 answers),
/// and not an ordinary failure, which is retried as it is.
#[test]
fn a_streaming_list_falls_back_to_pages_only_where_the_api_server_cannot_stream() {
    use kube::core::Status;
    use kube::runtime::watcher::Error;
    let status = |code: u16, message: &str| Box::new(Status::failure(message, "").with_code(code));
    let refused = |e: &Error| super::controller::streaming_refused(e);
    assert!(refused(&Error::WatchStartFailed(kube::Error::Api(status(422, "sendInitialEvents is forbidden")))));
    assert!(refused(&Error::WatchStartFailed(kube::Error::Api(status(400, "bad request")))));
    assert!(refused(&Error::WatchError(status(
        500,
        "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled"
    ))));
    assert!(!refused(&Error::WatchError(status(500, "etcdserver: request timed out"))));
    assert!(!refused(&Error::WatchStartFailed(kube::Error::Api(status(403, "forbidden")))));
    assert!(!refused(&Error::WatchError(status(410, "too old resource version"))));
    assert!(!refused(&Error::NoResourceVersion));
}

/// A pod behind Allot's gang gate that names no valid gang under the current policies (its
/// size above a lowered `maxGangSize`, its gang gate with no gang metadata at all) is never
/// released and, before this, was never told why: it gets one Warning condition; a real
/// gang beside it goes as usual.
#[test]
fn a_gated_pod_in_no_gang_is_told_why_once() {
    use crate::control::cluster::fixtures::{cluster, member, policies};
    use crate::control::cluster::records::condition_fingerprint;
    use crate::control::gang::plan::{STRAY_MESSAGE, STRAY_REASON, plan};
    use crate::control::gang::snapshot::GangSnapshot;
    use serde_json::json;
    use std::collections::HashMap;
    let lowered = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  maxGangSize: 4\n";
    let p = policies(lowered);
    let created = "2026-11-18T10:00:00Z";
    let oversized = member("big-0", "big", 8, created, json!({}));
    let mut unnamed = member("plain", "-", 1, created, json!({}));
    unnamed["metadata"]["labels"] = json!({});
    unnamed["metadata"]["annotations"] = json!({});
    let pods = [oversized, unnamed, member("ok-0", "ok", 1, created, json!({}))];
    let state = cluster(&p, &pods);
    let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, 1_795_000_000);
    let mut explained = HashMap::new();
    let pass = plan(&snapshot, &facts, &mut explained);
    let told: Vec<&str> = pass
        .actions
        .iter()
        .filter_map(|a| match a {
            crate::control::cluster::ControllerAction::Explain {
                pod,
                reason,
                message,
                warning: true,
                ready: false,
                ..
            } if *reason == STRAY_REASON && message == STRAY_MESSAGE => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    let mut told = told;
    told.sort();
    assert_eq!(told, ["big-0", "plain"], "{:?}", pass.actions);
    assert!(
        pass.actions
            .iter()
            .any(|a| matches!(a, crate::control::cluster::ControllerAction::Release { pod, .. } if pod == "ok-0")),
        "{:?}",
        pass.actions
    );
    // Told once: with the condition on the pods, the next pass says nothing to them.
    for pod in ["big-0", "plain"] {
        state.mark_condition("ml", pod, false, condition_fingerprint(false, STRAY_REASON, STRAY_MESSAGE));
    }
    let (snapshot, facts) = state.snapshot(&p, &crate::model::namespaces::NoNamespaces, 1_795_000_010);
    let pass = plan(&snapshot, &facts, &mut explained);
    assert!(
        !pass
            .actions
            .iter()
            .any(|a| matches!(a, crate::control::cluster::ControllerAction::Explain { reason, .. } if *reason == STRAY_REASON)),
        "{:?}",
        pass.actions
    );
}
