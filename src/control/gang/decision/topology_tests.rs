//! Topology in the decision: pure tests over snapshots, and properties over random ones.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::super::*;
use crate::control::cluster::NodeInfo;
use crate::control::cluster::fixtures::{gpu_shape as shape, node};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceMatcher;

const RACK: &str = "topology.kubernetes.io/rack";
const CLIQUE: &str = "nvidia.com/gpu.clique";

fn q(n: i64) -> Quantity {
    Quantity::from_units(n)
}

/// A node of `gpus` GPUs in `rack` (and in a clique of its own name).
fn racked(name: &str, rack: &str, gpus: i64) -> NodeInfo {
    let mut n = node(name, gpus);
    n.labels.insert(RACK.into(), rack.into());
    n.labels.insert(CLIQUE.into(), format!("clique-{name}"));
    n
}

fn topology(levels: &[&str], required: bool) -> Option<GangTopology> {
    Some(GangTopology { levels: levels.iter().map(|l| l.to_string()).collect(), required })
}

fn gang(name: &str, members: u32, gpus: i64, topology: Option<GangTopology>) -> WaitingGang {
    WaitingGang {
        key: GangKey { namespace: "ml".into(), name: name.into() },
        expected: Some(members),
        members: (0..members).map(|i| Member { name: format!("{name}-{i}"), shape: shape(gpus) }).collect(),
        priority: 0,
        created: 0,
        ready: (0, 0),
        held_by: None,
        disagreement: None,
        unplaceable: None,
        starvation_after: None,
        phantoms: None,
        topology,
        joins: None,
        preemptor: None,
    }
}

/// 2 racks × 2 nodes × 2 GPUs, one GPU busy on the nodes named in `busy`.
fn two_racks(busy: &[&str], gangs: Vec<WaitingGang>) -> Snapshot {
    let nodes = vec![
        racked("a1", "rack-a", 2),
        racked("a2", "rack-a", 2),
        racked("b1", "rack-b", 2),
        racked("b2", "rack-b", 2),
    ];
    let bound = busy.iter().map(|n| (n.to_string(), BTreeMap::from([("nvidia.com/gpu".to_string(), q(1))]))).collect();
    Snapshot {
        now: 1_000,
        nodes,
        bound,
        gangs,
        accelerators: ResourceMatcher::new(["nvidia.com/gpu"]),
        ..Default::default()
    }
}

fn released(d: &Decision) -> Option<(&super::Placements, &Option<Domain>)> {
    match &d.verdict {
        Verdict::Release { placements, domain } => Some((placements, domain)),
        _ => None,
    }
}

#[test]
fn a_gang_lands_wholly_in_the_rack_it_fits_best() {
    // rack-a has 3 free, rack-b 4: a gang of 3 fits both and takes rack-a (nothing left over).
    let s = two_racks(&["a1"], vec![gang("g", 3, 1, topology(&[RACK], true))]);
    let d = decide(&s);
    let (placements, domain) = released(&d[0]).expect("released");
    assert_eq!(domain, &Some(Domain { level: RACK.into(), value: "rack-a".into() }));
    assert!(placements.iter().all(|(_, n)| n.starts_with('a')), "{placements:?}");
    assert!(d[0].message.contains("within topology.kubernetes.io/rack rack-a"), "{}", d[0].message);
}

#[test]
fn a_required_rack_waits_although_the_gpus_are_free_elsewhere_and_says_why() {
    let s = two_racks(&["a1", "b1"], vec![gang("g", 4, 1, topology(&[RACK], true))]);
    let d = decide(&s);
    assert_eq!(d[0].verdict, Verdict::DoesNotFit);
    assert_eq!(
        d[0].message,
        "4/4 members present; needs 4 nvidia.com/gpu within one topology.kubernetes.io/rack; most free in one rack: \
         3 (rack-a); 6 free in all"
    );
    // Without the topology the same gang goes, spread over both racks.
    let plain = two_racks(&["a1", "b1"], vec![gang("g", 4, 1, None)]);
    assert!(released(&decide(&plain)[0]).is_some_and(|(_, domain)| domain.is_none()));
}

#[test]
fn a_preference_falls_back_outward_then_anywhere() {
    // Cliques are single nodes of 2 GPUs: 2 members fit one clique, 3 need a rack, 5 anywhere.
    let levels = topology(&[CLIQUE, RACK], false);
    let s = two_racks(&[], vec![gang("two", 2, 1, levels.clone())]);
    assert_eq!(released(&decide(&s)[0]).and_then(|(_, d)| d.as_ref()).map(|d| d.level.as_str()), Some(CLIQUE));
    let s = two_racks(&[], vec![gang("three", 3, 1, levels.clone())]);
    assert_eq!(released(&decide(&s)[0]).and_then(|(_, d)| d.as_ref()).map(|d| d.level.as_str()), Some(RACK));
    let s = two_racks(&[], vec![gang("five", 4, 1, levels), gang("z", 1, 1, None)]);
    let d = decide(&s);
    let five = d.iter().find(|d| d.gang.name == "five").unwrap();
    // 4 members fit one rack exactly: a rack, not anywhere.
    assert_eq!(released(five).and_then(|(_, d)| d.as_ref()).map(|d| d.value.as_str()), Some("rack-a"));
    let s = two_racks(&["a1", "b1"], vec![gang("spread", 4, 1, topology(&[CLIQUE, RACK], false))]);
    assert!(released(&decide(&s)[0]).is_some_and(|(_, domain)| domain.is_none()), "falls back to anywhere");
}

#[test]
fn a_gang_no_rack_can_ever_hold_is_told_so_and_holds_nobody_back() {
    let mut big = gang("big", 8, 1, topology(&[RACK], true));
    big.starvation_after = Some(0);
    let mut small = gang("small", 1, 1, None);
    small.ready = (1, 0);
    let s = two_racks(&[], vec![big, small]);
    let d = decide(&s);
    let big = d.iter().find(|d| d.gang.name == "big").unwrap();
    assert_eq!(big.verdict, Verdict::DoesNotFit);
    assert!(
        big.message.contains("no rack can ever hold it (the largest has 4 nvidia.com/gpu in all: rack-a)"),
        "{}",
        big.message
    );
    assert!(released(d.iter().find(|d| d.gang.name == "small").unwrap()).is_some(), "{d:?}");
}

#[test]
fn a_member_joining_its_running_peers_goes_to_their_rack_or_waits() {
    // Its three peers run in rack-b (one GPU left there); rack-a, all free, would suit it best.
    let mut g = gang("g", 1, 1, topology(&[RACK], true));
    g.joins = Some(Domain { level: RACK.into(), value: "rack-b".into() });
    let s = two_racks(&["b1", "b2", "b2"], vec![g.clone()]);
    let d = decide(&s);
    let (placements, domain) = released(&d[0]).expect("released");
    assert_eq!(domain.as_ref().map(|d| d.value.as_str()), Some("rack-b"));
    assert_eq!(placements, &vec![("g-0".to_string(), "b1".to_string())]);
    // With rack-b full it waits, though rack-a is empty: half a gang per rack is no gang.
    let s = two_racks(&["b1", "b1", "b2", "b2"], vec![g]);
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
}

#[test]
fn a_released_gangs_reservation_keeps_to_its_rack() {
    // Two members released into rack-b, not bound yet (pinned there; unpinned, best fit would
    // reserve them in rack-a): rack-b has 2 left, so a gang of 3 goes to rack-a, and a second
    // gang of 3 waits.
    let mut pinned = shape(1);
    pinned.placement_mut().node_selector.insert(RACK.into(), "rack-b".into());
    let mut s = two_racks(
        &[],
        vec![gang("first", 3, 1, topology(&[RACK], true)), gang("second", 3, 1, topology(&[RACK], true))],
    );
    s.gangs[1].ready = (1, 0);
    s.in_flight = vec![pinned.clone(), pinned];
    let d = decide(&s);
    let first = d.iter().find(|d| d.gang.name == "first").unwrap();
    assert_eq!(released(first).and_then(|(_, d)| d.as_ref()).map(|d| d.value.as_str()), Some("rack-a"));
    assert_eq!(d.iter().find(|d| d.gang.name == "second").unwrap().verdict, Verdict::DoesNotFit);
}

/// A random cluster: racks of random nodes with random GPUs and usage, and random gangs, some
/// with a required rack.
fn cluster() -> impl Strategy<Value = Snapshot> {
    let nodes = prop::collection::vec((0usize..4, 1i64..=8, 0i64..=8), 1..12);
    let gangs = prop::collection::vec((1u32..=6, 1i64..=4, any::<bool>(), any::<bool>()), 1..8);
    (nodes, gangs).prop_map(|(nodes, gangs)| {
        let mut infos = Vec::new();
        let mut bound = Vec::new();
        for (i, (rack, gpus, used)) in nodes.into_iter().enumerate() {
            let name = format!("n{i}");
            infos.push(racked(&name, &format!("rack-{rack}"), gpus));
            bound.push((name, BTreeMap::from([("nvidia.com/gpu".to_string(), q(used.min(gpus)))])));
        }
        let gangs = gangs
            .into_iter()
            .enumerate()
            .map(|(i, (members, gpus, topo, required))| {
                let levels = topo.then(|| GangTopology { levels: vec![RACK.into()], required });
                let mut g = gang(&format!("g{i}"), members, gpus, levels);
                g.ready = (i as i64, 0);
                g
            })
            .collect();
        Snapshot {
            now: 1_000,
            nodes: infos,
            bound,
            gangs,
            accelerators: ResourceMatcher::new(["nvidia.com/gpu"]),
            ..Default::default()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A released gang with a required level lies wholly in one domain of it; no node is given
    /// more than it has free (domains' last GPUs are never given twice); a gang larger than
    /// every domain's capacity is never released.
    #[test]
    fn released_gangs_keep_to_one_domain_and_never_overbook(s in cluster()) {
        let d = decide(&s);
        let rack_of: HashMap<&str, &str> = s.nodes.iter().map(|n| (n.name.as_str(), n.labels[RACK].as_str())).collect();
        let mut free: HashMap<&str, i64> = s.nodes.iter().map(|n| (n.name.as_str(), n.allocatable["nvidia.com/gpu"].nanos() as i64 / 1_000_000_000)).collect();
        for (node, used) in &s.bound {
            *free.get_mut(node.as_str()).unwrap() -= used["nvidia.com/gpu"].nanos() as i64 / 1_000_000_000;
        }
        let mut capacity: HashMap<&str, i64> = HashMap::new();
        for n in &s.nodes {
            *capacity.entry(n.labels[RACK].as_str()).or_default() += n.allocatable["nvidia.com/gpu"].nanos() as i64 / 1_000_000_000;
        }
        let largest = capacity.values().copied().max().unwrap_or(0);
        for decision in &d {
            let g = s.gangs.iter().find(|g| g.key == decision.gang).unwrap();
            let gpus = g.members[0].shape.requests["nvidia.com/gpu"].nanos() as i64 / 1_000_000_000;
            let needed = gpus * g.members.len() as i64;
            let required = g.topology.as_ref().is_some_and(|t| t.required);
            if let Verdict::Release { placements, domain } = &decision.verdict {
                for (_, node) in placements {
                    *free.get_mut(node.as_str()).unwrap() -= gpus;
                }
                if required {
                    let domain = domain.as_ref().expect("a required topology names its domain");
                    prop_assert!(placements.iter().all(|(_, n)| rack_of[n.as_str()] == domain.value), "{placements:?} not all in {domain:?}");
                    prop_assert!(needed <= largest);
                }
            } else if required && needed > largest {
                prop_assert!(decision.message.contains("can ever hold it"), "{}", decision.message);
            }
        }
        prop_assert!(free.values().all(|f| *f >= 0), "overbooked: {free:?}");
    }
}
