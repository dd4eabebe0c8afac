//! The snapshots of the preemption benchmarks (`gang/preempt_*` in `benches/gang.rs`): the
//! decision's 1,000 waiting gangs, now allowed to evict, over a full cluster of 50,000 running
//! pods of lower priority, so that most of them do not fit and the victim search runs.
//!
//! Every running unit is accelerator work (as `gang::victims` reads it from the view), so
//! 50,000 of them on 5,000 nodes is 10 a node: these nodes have 16 GPUs (the decision's usual
//! 8 could not hold them). Each node runs ten pods of 1, 1, 1, 2, 1, 1, 4, 1, 2, 2 GPUs (16),
//! except one node in ten (of two pools), whose last pod asks 1: 500 GPUs are free, one here and there, so
//! the smallest gangs fit and the rest must preempt. Half the pods are members of running
//! gangs of 2–8 (on consecutive nodes of one pool, as the decision would have placed them).

use std::collections::BTreeMap;

use allot::control::gang::decision::{
    GangKey, GangTopology, Preemptor, RunningPod, RunningUnit, Snapshot, UnitKey, Verdict, decide,
};
use allot::model::quantity::Quantity;
use allot::model::resources::ResourceList;

/// The pass's clock: every running unit started in the day before it.
const NOW: i64 = 100_000;
const GPUS: i64 = 16;
/// GPUs of each of a node's ten pods; the slots in `GANG_SLOTS` are gang members.
const SLOTS: [i64; 10] = [1, 1, 1, 2, 1, 1, 4, 1, 2, 2];
const GANG_SLOTS: [usize; 5] = [0, 1, 2, 3, 8];

fn requests(gpus: i64) -> ResourceList {
    BTreeMap::from([
        ("nvidia.com/gpu".to_string(), Quantity::from_units(gpus)),
        ("cpu".to_string(), Quantity::from_units(4)),
        ("pods".to_string(), Quantity::from_units(1)),
    ])
}

/// A unit's priority (0–999), start and team, spread by its number `k` (a multiplicative
/// hash: neighbours differ, the pass's order does not follow the nodes').
fn unit(k: usize, key: UnitKey, pods: Vec<RunningPod>) -> RunningUnit {
    let started = NOW - 60 - (k as i64 * 104_729) % 86_400;
    RunningUnit {
        key,
        team: Some(format!("team-{}", k % 20)),
        priority: ((k * 7_919 + 13) % 1_000) as i32,
        started,
        // A ten-minute minRuntime: the newest few are not evictable yet.
        evictable_from: started + 600,
        pods,
    }
}

fn pod(namespace: &str, name: String, node: &str, gpus: i64) -> RunningPod {
    RunningPod { namespace: namespace.into(), name, uid: None, node: node.into(), requests: requests(gpus) }
}

/// Fills every node of `s` (16 GPUs each) with ten running pods: plain ones, and members of
/// gangs chunked over the consecutive nodes of each pool (a node's pool is its index mod 4).
fn fill(s: &mut Snapshot) {
    let pools = 4;
    let names: Vec<String> = s.nodes.iter().map(|n| n.name.clone()).collect();
    let gpus = |node: usize, slot: usize| if slot == 9 && node % 10 == 4 { 1 } else { SLOTS[slot] };
    let mut running = Vec::new();
    for (node, name) in names.iter().enumerate() {
        for slot in (0..SLOTS.len()).filter(|j| !GANG_SLOTS.contains(j)) {
            let k = running.len();
            let ns = format!("team-{}", k % 20);
            let pod = pod(&ns, format!("pod-{node}-{slot}"), name, gpus(node, slot));
            running.push(unit(k, UnitKey::Pod { namespace: ns, name: format!("pod-{node}-{slot}") }, vec![pod]));
        }
    }
    for pool in 0..pools {
        let in_pool: Vec<usize> = (pool..names.len()).step_by(pools).collect();
        for slot in GANG_SLOTS {
            let mut rest = &in_pool[..];
            while !rest.is_empty() {
                let k = running.len();
                let (members, after) = rest.split_at((2 + k % 7).min(rest.len()));
                rest = after;
                let key = GangKey { namespace: format!("team-{}", k % 20), name: format!("run-{k}") };
                let pods = members
                    .iter()
                    .enumerate()
                    .map(|(m, &node)| pod(&key.namespace, format!("run-{k}-{m}"), &names[node], gpus(node, slot)))
                    .collect();
                running.push(unit(k, UnitKey::Gang(key), pods));
            }
        }
    }
    // What the real snapshot holds: every bound pod's requests, summed per node.
    let mut bound: BTreeMap<&str, ResourceList> = BTreeMap::new();
    for p in running.iter().flat_map(|u| &u.pods) {
        let slot = bound.entry(p.node.as_str()).or_default();
        for (name, q) in &p.requests {
            let sum = slot.entry(name.clone()).or_default();
            *sum = sum.saturating_add(*q);
        }
    }
    s.bound = bound.into_iter().map(|(node, requests)| (node.to_string(), requests)).collect();
    s.running = running;
}

/// `base` (the decision bench's 5,000 nodes and 1,000 gangs) made the preemption case: nodes of
/// 16 GPUs filled with running work of priorities 0–999; the gangs of priorities 500–1499, each
/// allowed to evict its own team's work and (four in five) other teams'. No gang starves: a
/// starving gang would hold back every later one on its pool, and those would never search.
pub fn preempt_snapshot(mut base: Snapshot) -> Snapshot {
    base.now = NOW;
    for node in &mut base.nodes {
        node.allocatable.insert("nvidia.com/gpu".into(), Quantity::from_units(GPUS));
    }
    fill(&mut base);
    for (g, gang) in base.gangs.iter_mut().enumerate() {
        gang.priority = 500 + ((g * 389) % 1_000) as i32;
        gang.ready = (NOW - 1_000 + g as i64, 0);
        gang.starvation_after = None;
        gang.preemptor =
            Some(Preemptor { team: Some(gang.key.namespace.clone()), within_team: true, other_teams: g % 5 != 0 });
    }
    assert_eq!(base.running.iter().map(|u| u.pods.len()).sum::<usize>(), 10 * base.nodes.len());
    base
}

/// [`preempt_snapshot`] of a base with topology labels, every gang *requiring* an NVLink clique
/// or else a rack: the search runs per domain (500 cliques, then 100 racks) and at most one
/// preemption is in flight in each, so many gangs search in the same pass: the worst case.
pub fn preempt_required_snapshot(base: Snapshot) -> Snapshot {
    let mut s = preempt_snapshot(base);
    let levels = ["nvidia.com/gpu.clique", "topology.kubernetes.io/rack"];
    for gang in &mut s.gangs {
        gang.topology = Some(GangTopology { levels: levels.iter().map(|l| l.to_string()).collect(), required: true });
    }
    s
}

/// "1000 gangs: 412 preempt, 7 released, 581 do not fit": that the search does its real work.
pub fn tally(s: &Snapshot) -> String {
    let started = std::time::Instant::now();
    let decisions = decide(s);
    let took = started.elapsed();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut victims = 0;
    for d in &decisions {
        let name = match &d.verdict {
            Verdict::Preempt { victims: v, .. } => {
                victims += v.len();
                "preempt"
            }
            Verdict::Release { .. } => "released",
            Verdict::DoesNotFit if d.message.ends_with(allot::control::gang::decision::IN_FLIGHT) => "wait (in flight)",
            Verdict::DoesNotFit => "do not fit",
            _ => "other",
        };
        *counts.entry(name).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!("{} gangs: {} ({victims} victims); one pass {took:.2?}", decisions.len(), counts.join(", "))
}
