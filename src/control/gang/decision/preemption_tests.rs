//! Preemption in the decision: pure tests over snapshots, and properties over random ones.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::super::*;
use crate::control::cluster::NodeInfo;
use crate::control::cluster::fixtures::{gpu_shape as shape, node};
use crate::model::resources::ResourceMatcher;

const RACK: &str = "topology.kubernetes.io/rack";
const NOW: i64 = 10_000;

fn key(name: &str) -> GangKey {
    GangKey { namespace: "ml".into(), name: name.into() }
}

/// A complete waiting gang of `members` × `gpus` GPUs at `priority`, of team `ml`, that may evict.
fn gang(name: &str, members: u32, gpus: i64, priority: i32) -> WaitingGang {
    WaitingGang {
        key: key(name),
        expected: Some(members),
        members: (0..members).map(|i| Member { name: format!("{name}-{i}"), shape: shape(gpus) }).collect(),
        priority,
        created: 0,
        ready: (0, 0),
        held_by: None,
        disagreement: None,
        unplaceable: None,
        starvation_after: None,
        phantoms: None,
        topology: None,
        joins: None,
        preemptor: Some(Preemptor { team: Some("ml".into()), within_team: true, other_teams: true }),
    }
}

/// One pod of `gpus` GPUs on `node`.
fn pod_on(name: &str, node: &str, gpus: i64) -> RunningPod {
    RunningPod {
        namespace: "ml".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}").into()),
        node: node.into(),
        requests: shape(gpus).requests,
    }
}

/// A plain pod of `gpus` GPUs on `node`, started at `started`.
fn plain(name: &str, node: &str, gpus: i64, priority: i32, started: i64) -> RunningUnit {
    RunningUnit {
        key: UnitKey::Pod { namespace: "ml".into(), name: name.into() },
        team: Some("ml".into()),
        priority,
        started,
        evictable_from: started,
        pods: vec![pod_on(name, node, gpus)],
    }
}

/// A released gang with one 1-GPU member on each of `nodes`.
fn running_gang(name: &str, nodes: &[&str], priority: i32, started: i64) -> RunningUnit {
    RunningUnit {
        key: UnitKey::Gang(key(name)),
        team: Some("ml".into()),
        priority,
        started,
        evictable_from: started,
        pods: nodes.iter().enumerate().map(|(i, n)| pod_on(&format!("{name}-{i}"), n, 1)).collect(),
    }
}

/// The nodes, the waiting gangs and the running units (whose pods are bound there too).
fn snapshot(nodes: Vec<NodeInfo>, gangs: Vec<WaitingGang>, running: Vec<RunningUnit>) -> Snapshot {
    let bound = running.iter().flat_map(|u| u.pods.iter().map(|p| (p.node.clone(), p.requests.clone()))).collect();
    Snapshot {
        now: NOW,
        nodes,
        bound,
        gangs,
        running,
        accelerators: ResourceMatcher::new(["nvidia.com/gpu"]),
        ..Default::default()
    }
}

fn victims_of(d: &Decision) -> Vec<String> {
    match &d.verdict {
        Verdict::Preempt { victims, .. } => victims.iter().map(|v| v.key.to_string()).collect(),
        other => panic!("{}: expected a preemption, got {other:?} ({})", d.gang, d.message),
    }
}

/// The cluster: 2 nodes × 2 GPUs, four low-priority one-GPU pods running.
fn full_cluster() -> Vec<RunningUnit> {
    vec![
        plain("low-0", "n1", 1, 100, 1_000),
        plain("low-1", "n1", 1, 100, 2_000),
        plain("low-2", "n2", 1, 100, 3_000),
        plain("low-3", "n2", 1, 100, 4_000),
    ]
}

#[test]
fn a_high_priority_gang_evicts_exactly_what_it_needs_the_newest_first() {
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], full_cluster());
    let d = &decide(&s)[0];
    // Least work lost: the two that started last.
    assert_eq!(victims_of(d), ["pod ml/low-3", "pod ml/low-2"]);
    assert_eq!(
        d.message,
        "2/2 members present; needs 2 nvidia.com/gpu on any node, 0 free; preempting pod ml/low-3 (1 pod, 1 \
         nvidia.com/gpu) and pod ml/low-2 (1 pod, 1 nvidia.com/gpu) to make room"
    );
    let Verdict::Preempt { placements, .. } = &d.verdict else { unreachable!() };
    assert_eq!(placements, &[("high-0".to_string(), "n2".to_string()), ("high-1".to_string(), "n2".to_string())]);
}

#[test]
fn equal_or_higher_priority_is_never_a_victim() {
    let mut running = full_cluster();
    for u in &mut running {
        u.priority = 1000;
    }
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], running);
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
}

#[test]
fn a_gang_its_teams_reclaim_makes_room_for_preempts_nobody_meanwhile() {
    let mut s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], full_cluster());
    s.reclaiming = vec![key("high")];
    let d = &decide(&s)[0];
    assert_eq!(d.verdict, Verdict::DoesNotFit);
    assert_eq!(
        d.message,
        format!("2/2 members present; needs 2 nvidia.com/gpu on any node, 0 free{}", super::super::RECLAIMING)
    );
    // Another gang's reclaim changes nothing for it.
    s.reclaiming = vec![key("other")];
    assert_eq!(victims_of(&decide(&s)[0]), ["pod ml/low-3", "pod ml/low-2"]);
}

#[test]
fn a_running_gang_is_evicted_whole_or_not_at_all() {
    // Two low gangs, each with a member on both nodes: one whole gang makes room.
    let running = vec![running_gang("old", &["n1", "n2"], 100, 1_000), running_gang("new", &["n1", "n2"], 100, 5_000)];
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], running);
    let d = &decide(&s)[0];
    assert_eq!(victims_of(d), ["gang ml/new"]);
    let Verdict::Preempt { victims, .. } = &d.verdict else { unreachable!() };
    assert_eq!(victims[0].pods.len(), 2, "every member of the gang goes");
}

#[test]
fn lower_priority_goes_before_less_work_lost() {
    let running = vec![plain("mid-new", "n1", 2, 500, 9_000), plain("low-old", "n2", 2, 100, 1_000)];
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], running);
    assert_eq!(victims_of(&decide(&s)[0]), ["pod ml/low-old"]);
}

#[test]
fn a_victim_inside_its_min_runtime_or_back_off_is_spared() {
    let mut running = full_cluster();
    // The two newest may not be evicted yet: the two oldest go instead.
    running[2].evictable_from = NOW + 60;
    running[3].evictable_from = NOW + 1;
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], running);
    assert_eq!(victims_of(&decide(&s)[0]), ["pod ml/low-1", "pod ml/low-0"]);
}

#[test]
fn team_rules_decide_whose_work_may_go() {
    let mut running = full_cluster();
    for u in &mut running[..2] {
        u.team = Some("other".into());
    }
    let mut g = gang("high", 2, 1, 1000);
    // Not another team's: its own team's two newest.
    g.preemptor = Some(Preemptor { team: Some("ml".into()), within_team: true, other_teams: false });
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![g.clone()], running.clone());
    assert_eq!(victims_of(&decide(&s)[0]), ["pod ml/low-3", "pod ml/low-2"]);
    // Not its own team's: the other team's two.
    g.preemptor = Some(Preemptor { team: Some("ml".into()), within_team: false, other_teams: true });
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![g.clone()], running.clone());
    assert_eq!(victims_of(&decide(&s)[0]), ["pod ml/low-1", "pod ml/low-0"]);
    // preemptionPolicy Never (or a team that never evicts): it waits.
    g.preemptor = None;
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![g], running);
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
}

#[test]
fn no_two_gangs_are_given_the_same_victims_and_one_preemption_is_in_flight_at_a_time() {
    let gangs = vec![gang("first", 2, 1, 1000), gang("second", 2, 1, 900)];
    let s = snapshot(vec![node("n1", 2), node("n2", 2)], gangs, full_cluster());
    let d = decide(&s);
    assert_eq!(victims_of(&d[0]), ["pod ml/low-3", "pod ml/low-2"]);
    assert_eq!(d[1].verdict, Verdict::DoesNotFit);
    assert!(d[1].message.ends_with(IN_FLIGHT), "{}", d[1].message);
}

#[test]
fn a_preemption_in_flight_holds_its_room_and_releases_the_gang_once_its_victims_are_gone() {
    let mut s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000), gang("later", 1, 1, 0)], {
        let mut r = full_cluster();
        r.truncate(2);
        r
    });
    // Victims low-2 and low-3 are terminating on n2 (still bound, no longer candidates).
    s.bound.push(("n2".into(), shape(2).requests));
    let placements = vec![("high-0".to_string(), "n2".to_string()), ("high-1".to_string(), "n2".to_string())];
    s.preemptions = vec![InFlight {
        preemptor: Some(key("high")),
        nodes: vec!["n2".into()],
        placements: placements.clone(),
        domain: None,
    }];
    let d = decide(&s);
    assert_eq!(d[0].verdict, Verdict::Preempting);
    assert!(
        d[0].message.ends_with("preempting to make room: waiting for its victims to go (on n2)"),
        "{}",
        d[0].message
    );
    // No later gang takes its room (a reservation over the victims shows as nothing free).
    assert_eq!(d[1].verdict, Verdict::DoesNotFit);
    assert_eq!(d[1].message, "1/1 members present; needs 1 nvidia.com/gpu on any node, 0 free");
    // Gone: released where the search placed it, even if a plain pod took a GPU meanwhile.
    s.bound.pop();
    s.bound.push(("n2".into(), shape(1).requests));
    s.preemptions[0].nodes.clear();
    let d = decide(&s);
    assert_eq!(d[0].verdict, Verdict::Release { placements, domain: None });
}

#[test]
fn no_new_preemption_where_one_is_in_flight() {
    let mut s = snapshot(vec![node("n1", 2), node("n2", 2)], vec![gang("high", 2, 1, 1000)], full_cluster());
    // Victims of an earlier preemption (its gang unknown: a new leader) still on n1.
    s.preemptions = vec![InFlight { preemptor: None, nodes: vec!["n1".into()], placements: Vec::new(), domain: None }];
    assert_eq!(decide(&s)[0].verdict, Verdict::DoesNotFit);
}

#[test]
fn with_a_required_rack_victims_and_gang_share_one_rack() {
    let racked = |name: &str, rack: &str| {
        let mut n = node(name, 2);
        n.labels.insert(RACK.into(), rack.into());
        n
    };
    let nodes = vec![racked("a1", "rack-a"), racked("a2", "rack-a"), racked("b1", "rack-b"), racked("b2", "rack-b")];
    // Rack a is full of cheap pods, rack b of one expensive gang and one cheap pod.
    let running = vec![
        plain("a1-x", "a1", 2, 100, 8_000),
        plain("a2-x", "a2", 2, 100, 8_000),
        running_gang("b-gang", &["b1", "b2"], 100, 1_000),
        plain("b1-x", "b1", 1, 100, 9_000),
        plain("b2-x", "b2", 1, 100, 9_000),
    ];
    let mut g = gang("high", 4, 1, 1000);
    g.topology = Some(GangTopology { levels: vec![RACK.into()], required: true });
    let s = snapshot(nodes, vec![g], running);
    let d = &decide(&s)[0];
    assert_eq!(victims_of(d), ["pod ml/a1-x", "pod ml/a2-x"]);
    let Verdict::Preempt { placements, domain, .. } = &d.verdict else { unreachable!() };
    assert_eq!(domain, &Some(Domain { level: RACK.into(), value: "rack-a".into() }));
    assert!(placements.iter().all(|(_, n)| n.starts_with('a')), "{placements:?}");
}

#[test]
fn cost_compares_priority_then_work_lost_then_newest_then_pods() {
    let m = ResourceMatcher::new(["nvidia.com/gpu"]);
    let a = plain("a", "n1", 1, 100, 9_000);
    let b = plain("b", "n1", 2, 100, 9_000);
    let c = plain("c", "n1", 1, 200, 9_990);
    assert!(set_cost(&[&a], NOW, &m) < set_cost(&[&b], NOW, &m), "less work lost");
    assert!(set_cost(&[&b], NOW, &m) < set_cost(&[&c], NOW, &m), "lower priority first");
    let old = plain("old", "n1", 1, 100, 9_000);
    let newer = plain("newer", "n1", 2, 100, 9_500);
    // Equal work lost (1 × 1000 = 2 × 500): the newer set goes first.
    assert!(set_cost(&[&newer], NOW, &m) < set_cost(&[&old], NOW, &m));
}

// ---- properties ----

/// A small random cluster: nodes of 2–4 GPUs in two racks, running plain pods and 2-member
/// gangs of random priorities and ages, and one waiting gang.
/// Node GPUs; running units as (node, second node, priority, started, is a gang); the waiting
/// gang as (members, GPUs each, priority, requires a rack).
type Case = (Vec<i64>, Vec<(u8, u8, i32, i64, bool)>, (u32, i64, i32, bool));

fn arbitrary_case() -> impl Strategy<Value = Case> {
    let nodes = proptest::collection::vec(2i64..=4, 2..=6);
    // (node, second node, priority, started, is a gang)
    let units = proptest::collection::vec((0u8..6, 0u8..6, 0i32..4, 0i64..9_000, any::<bool>()), 0..14);
    let waiting = (1u32..=5, 1i64..=2, 1i32..=4, any::<bool>());
    (nodes, units, waiting)
}

fn build(case: &Case) -> Snapshot {
    let (gpus, units, (members, size, priority, rack)) = case;
    let nodes: Vec<NodeInfo> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut n = node(&format!("n{i}"), *g);
            n.labels.insert(RACK.into(), format!("rack-{}", i % 2));
            n
        })
        .collect();
    let mut free: Vec<i64> = gpus.clone();
    let mut running = Vec::new();
    for (i, (a, b, p, started, is_gang)) in units.iter().enumerate() {
        let (a, b) = (*a as usize % nodes.len(), *b as usize % nodes.len());
        if *is_gang && free[a] >= 1 && free[b] > i64::from(a == b) {
            free[a] -= 1;
            free[b] -= 1;
            running.push(running_gang(&format!("g{i}"), &[&nodes[a].name, &nodes[b].name], *p, *started));
        } else if free[a] >= 1 {
            free[a] -= 1;
            running.push(plain(&format!("p{i}"), &nodes[a].name, 1, *p, *started));
        }
    }
    let mut g = gang("w", *members, *size, *priority);
    if *rack {
        g.topology = Some(GangTopology { levels: vec![RACK.into()], required: true });
    }
    snapshot(nodes, vec![g], running)
}

/// Whether the gang fits once `removed` units are gone (all of the snapshot's other pods stay).
fn fits_without(s: &Snapshot, removed: &BTreeSet<&UnitKey>) -> bool {
    let mut t = s.clone();
    t.running.clear();
    t.bound = s
        .running
        .iter()
        .filter(|u| !removed.contains(&u.key))
        .flat_map(|u| u.pods.iter().map(|p| (p.node.clone(), p.requests.clone())))
        .collect();
    let mut g = t.gangs[0].clone();
    g.preemptor = None;
    t.gangs = vec![g];
    matches!(decide(&t)[0].verdict, Verdict::Release { .. })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn a_chosen_set_is_whole_lower_needed_and_lowest_in_priority(case in arbitrary_case()) {
        let s = build(&case);
        let d = decide(&s);
        let Verdict::Preempt { victims, placements, domain } = &d[0].verdict else { return Ok(()) };
        let gang = &s.gangs[0];
        let keys: BTreeSet<&UnitKey> = victims.iter().map(|v| &v.key).collect();
        // Whole units only: a victim gang's pods are all there.
        for v in victims {
            let original = s.running.iter().find(|u| u.key == v.key).unwrap();
            prop_assert_eq!(&original.pods, &v.pods);
            prop_assert!(v.priority < gang.priority);
        }
        // It makes room, and every victim is needed.
        prop_assert!(fits_without(&s, &keys));
        for k in &keys {
            let mut fewer = keys.clone();
            fewer.remove(k);
            prop_assert!(!fits_without(&s, &fewer), "{} was not needed", k);
        }
        // Lowest priority first: no set whose highest victim is of a lower priority makes room.
        let highest = victims.iter().map(|v| v.priority).max().unwrap();
        let below: BTreeSet<&UnitKey> =
            s.running.iter().filter(|u| u.priority < highest).map(|u| &u.key).collect();
        prop_assert!(!fits_without(&s, &below));
        // A required rack: the gang lands in one, and every victim has a pod there.
        if gang.topology.is_some() {
            let domain = domain.as_ref().expect("a required topology has a domain");
            let in_rack = |n: &str| s.nodes.iter().any(|x| x.name == n && x.labels.get(RACK) == Some(&domain.value));
            prop_assert!(placements.iter().all(|(_, n)| in_rack(n)));
            for v in victims {
                prop_assert!(v.pods.iter().any(|p| in_rack(&p.node)), "{} is outside {}", v.key, domain.value);
            }
        }
    }

    #[test]
    fn a_gang_that_could_fit_without_lower_priority_work_is_never_left_waiting(case in arbitrary_case()) {
        let s = build(&case);
        let d = decide(&s);
        let gang = &s.gangs[0];
        let lower: BTreeSet<&UnitKey> = s.running.iter().filter(|u| u.priority < gang.priority).map(|u| &u.key).collect();
        if d[0].verdict == Verdict::DoesNotFit {
            prop_assert!(!fits_without(&s, &lower), "{}", d[0].message);
        }
    }
}

#[test]
fn two_waiting_gangs_in_two_racks_each_preempt_in_their_own() {
    let racked = |name: &str, rack: &str| {
        let mut n = node(name, 2);
        n.labels.insert(RACK.into(), rack.into());
        n
    };
    let nodes = vec![racked("a1", "rack-a"), racked("b1", "rack-b")];
    let running = vec![plain("a", "a1", 2, 0, 1_000), plain("b", "b1", 2, 0, 1_000)];
    let mut first = gang("first", 2, 1, 1000);
    let mut second = gang("second", 2, 1, 900);
    for g in [&mut first, &mut second] {
        g.topology = Some(GangTopology { levels: vec![RACK.into()], required: true });
    }
    let d = decide(&snapshot(nodes, vec![first, second], running));
    let chosen: BTreeMap<String, Vec<String>> = d.iter().map(|d| (d.gang.name.clone(), victims_of(d))).collect();
    assert_eq!(chosen["first"].len() + chosen["second"].len(), 2);
    assert_ne!(chosen["first"], chosen["second"]);
}
