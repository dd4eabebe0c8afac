//! The victim search as its specification reads (the module doc of `preemption`), written
//! plainly: every eligible unit filtered per scope, every domain searched, every probe placing
//! the gang on the simulation. The property test runs whole decision passes over random
//! clusters twice, once with the fast search and once with this one, and asks for the same
//! decisions: the bounds, the per-domain indexes, the copy counts and the aggregate checks may
//! only make the search faster, never change its answer.

use std::cell::Cell;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::{Candidates, Chosen, Domain, NoVictims, Placed, Placements, RunningPod, RunningUnit, UnitKey, set_cost};
use crate::control::cluster::{NodeInfo, Placement, PodShape};
use crate::control::gang::decision::{
    GangKey, GangTopology, InFlight, Member, Phantoms, Simulation, Snapshot, Verdict, WaitingGang, decide,
};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceMatcher;

thread_local! {
    /// This thread's passes search with the reference.
    static REFERENCE: Cell<bool> = const { Cell::new(false) };
}

/// True while [`with_reference`] runs on this thread.
pub(super) fn active() -> bool {
    REFERENCE.with(Cell::get)
}

/// `f`, with every victim search on this thread done by the reference.
fn with_reference<T>(f: impl FnOnce() -> T) -> T {
    REFERENCE.with(|r| r.set(true));
    let out = f();
    REFERENCE.with(|r| r.set(false));
    out
}

/// One scope of the search: its nodes (sorted; `None`: all) and its domain.
type ReferenceScope = (Option<Vec<usize>>, Option<Domain>);

impl Simulation<'_> {
    /// [`Simulation::preempt_for`], plainly.
    pub(super) fn reference_preempt_for(
        &mut self,
        gang: &WaitingGang,
        candidates: &mut Candidates<'_>,
    ) -> Result<Chosen, NoVictims> {
        let Some(preemptor) = &gang.preemptor else { return Err(NoVictims::Never) };
        let lower = candidates.priority.partition_point(|p| *p < gang.priority);
        if lower == 0 {
            return Err(NoVictims::NoSet);
        }
        let usable = self.usable_nodes(gang);
        let may_evict = |u: &RunningUnit| {
            if u.team.is_some() && u.team == preemptor.team { preemptor.within_team } else { preemptor.other_teams }
        };
        let eligible: Vec<usize> = (0..lower)
            .filter(|&v| {
                let unit = candidates.units[v];
                !candidates.taken[v]
                    && candidates.now >= unit.evictable_from
                    && may_evict(unit)
                    && candidates.pod_nodes(v).iter().flatten().any(|&i| usable[i])
            })
            .collect();
        let scopes = self.reference_scopes(gang, &usable);
        let mut busy_everywhere = !scopes.is_empty();
        let mut best: Option<(Vec<usize>, Placements, Option<Domain>)> = None;
        for level in scopes {
            for (nodes, domain) in level {
                let busy = |i: usize| usable[i] && candidates.busy[i];
                let in_flight = match &nodes {
                    None => (0..self.nodes.len()).any(busy),
                    Some(ns) => ns.iter().any(|&i| busy(i)),
                };
                if in_flight {
                    continue;
                }
                busy_everywhere = false;
                let in_scope = |i: &usize| nodes.as_ref().is_none_or(|ns| ns.binary_search(i).is_ok());
                let inside: Vec<usize> = eligible
                    .iter()
                    .copied()
                    .filter(|&v| candidates.pod_nodes(v).iter().flatten().any(in_scope))
                    .collect();
                let Some((victims, (placements, placed_in))) =
                    self.reference_smallest_set(gang, candidates, &inside, nodes.as_deref())
                else {
                    continue;
                };
                let cost = |set: &[usize]| {
                    let units: Vec<&RunningUnit> = set.iter().map(|&v| candidates.units[v]).collect();
                    set_cost(&units, candidates.now, candidates.accelerators)
                };
                if best.as_ref().is_none_or(|(b, _, _)| cost(&victims) < cost(b)) {
                    best = Some((victims, placements, domain.clone().or(placed_in)));
                }
            }
            if best.is_some() {
                break;
            }
        }
        let Some((victims, placements, domain)) = best else {
            return Err(if busy_everywhere { NoVictims::InFlight } else { NoVictims::NoSet });
        };
        candidates.claim(&victims);
        let victims = victims.into_iter().map(|v| candidates.units[v].clone()).collect();
        Ok(Chosen { victims, placements, domain })
    }

    /// By level, tightest first: every domain with a node the gang may use.
    fn reference_scopes(&mut self, gang: &WaitingGang, usable: &[bool]) -> Vec<Vec<ReferenceScope>> {
        if let Some(domain) = &gang.joins {
            self.ensure_level(&domain.level);
            let level = &self.levels.by_key[&domain.level];
            let Ok(index) = level.names.binary_search(&domain.value) else { return Vec::new() };
            return vec![vec![(Some(level.nodes[index].clone()), Some(domain.clone()))]];
        }
        let Some(topology) = gang.topology.as_ref().filter(|t| t.required) else {
            return vec![vec![(None, None)]];
        };
        let mut out = Vec::new();
        for level in &topology.levels {
            self.ensure_level(level);
            let l = &self.levels.by_key[level];
            let domains = (l.nodes.iter().zip(&l.names))
                .filter(|(nodes, _)| nodes.iter().any(|&i| usable[i]))
                .map(|(nodes, name)| (Some(nodes.clone()), Some(Domain { level: level.clone(), value: name.clone() })))
                .collect();
            out.push(domains);
        }
        out
    }

    /// The shortest cheapest-first prefix that makes room (every probe a placement), then the
    /// reprieve, most expensive first.
    fn reference_smallest_set(
        &mut self,
        gang: &WaitingGang,
        candidates: &Candidates<'_>,
        eligible: &[usize],
        scope: Option<&[usize]>,
    ) -> Option<(Vec<usize>, Placed)> {
        let mut removed = 0;
        let set_removed = |sim: &mut Self, to: usize, removed: &mut usize| {
            while *removed < to {
                sim.evict(candidates, eligible[*removed], -1);
                *removed += 1;
            }
            while *removed > to {
                *removed -= 1;
                sim.evict(candidates, eligible[*removed], 1);
            }
        };
        set_removed(self, eligible.len(), &mut removed);
        if self.fits_within(gang, scope).is_none() {
            set_removed(self, 0, &mut removed);
            return None;
        }
        let (mut lo, mut hi) = (0, eligible.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            set_removed(self, mid, &mut removed);
            if self.fits_within(gang, scope).is_some() { hi = mid } else { lo = mid }
        }
        set_removed(self, hi, &mut removed);
        let mut victims: Vec<usize> = eligible[..hi].to_vec();
        for index in (0..victims.len()).rev() {
            let v = victims[index];
            self.evict(candidates, v, 1);
            if self.fits_within(gang, scope).is_some() {
                victims.remove(index);
            } else {
                self.evict(candidates, v, -1);
            }
        }
        let placements = self.fits_within(gang, scope);
        for &v in &victims {
            self.evict(candidates, v, 1);
        }
        Some((victims, placements?))
    }
}

/// A small deterministic generator (xorshift): the cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn q(n: i64) -> Quantity {
    Quantity::from_units(n)
}

const POOLS: [&str; 3] = ["a", "b", "c"];

/// A waiting member's shape: on pool `pool` (3: any), asking `gpus`, tolerating the GPU taint.
fn shape(rng: &mut Rng, pool: usize, gpus: i64) -> PodShape {
    let mut requests = BTreeMap::from([("nvidia.com/gpu".to_string(), q(gpus)), ("pods".to_string(), q(1))]);
    if rng.chance(50) {
        requests.insert("cpu".into(), q(1 + rng.below(8) as i64));
    }
    let pool_selector = BTreeMap::from([("pool".to_string(), POOLS[pool % 3].to_string())]);
    let placement = Placement {
        node_selector: if pool < 3 { pool_selector } else { BTreeMap::new() },
        tolerations: vec![Toleration {
            key: Some("gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }],
        ..Placement::default()
    };
    PodShape::new(requests, placement)
}

/// 2–25 nodes of three pools in 1–4 racks and cliques of two (a few lacking either label),
/// some tainted or cordoned.
fn random_nodes(rng: &mut Rng) -> (Vec<NodeInfo>, usize) {
    let count = 2 + rng.below(24) as usize;
    let racks = 1 + rng.below(4) as usize;
    let nodes = (0..count)
        .map(|i| {
            let mut labels = BTreeMap::from([("pool".to_string(), POOLS[i % 3].to_string())]);
            if !rng.chance(10) {
                labels.insert("rack".into(), format!("r{}", i % racks));
            }
            if !rng.chance(10) {
                labels.insert("clique".into(), format!("c{}", i / 2));
            }
            let taint = Taint { key: "gpu".into(), effect: "NoSchedule".into(), ..Default::default() };
            NodeInfo {
                name: format!("n{i:02}"),
                labels,
                taints: if rng.chance(20) { vec![taint] } else { vec![] },
                unschedulable: rng.chance(5),
                allocatable: BTreeMap::from([
                    ("nvidia.com/gpu".to_string(), q([2, 4, 8][rng.below(3) as usize])),
                    ("cpu".to_string(), q(8 + rng.below(24) as i64)),
                    ("pods".to_string(), q(110)),
                ]),
            }
        })
        .collect();
    (nodes, racks)
}

/// Up to 30 running units of priorities 0–5, of three teams (and none), a few on a node the view
/// lacks, a few not evictable yet, a few asking a negative quantity (a pass must not count on
/// evictions only ever freeing room).
fn random_running(rng: &mut Rng, nodes: &[NodeInfo]) -> Vec<RunningUnit> {
    let mut free: Vec<i64> =
        nodes.iter().map(|n| (n.allocatable["nvidia.com/gpu"].nanos() / 1_000_000_000) as i64).collect();
    let mut running = Vec::new();
    for k in 0..rng.below(30) {
        let count = if rng.chance(40) { 2 + rng.below(3) } else { 1 };
        let gpus = 1 + rng.below(2) as i64;
        let mut pods = Vec::new();
        for m in 0..count {
            let i = rng.below(nodes.len() as u64) as usize;
            if free[i] < gpus {
                continue;
            }
            free[i] -= gpus;
            let mut requests = BTreeMap::from([("nvidia.com/gpu".to_string(), q(gpus)), ("pods".to_string(), q(1))]);
            if rng.chance(30) {
                requests.insert("cpu".into(), q(if rng.chance(5) { -2 } else { 1 + rng.below(4) as i64 }));
            }
            let node = if rng.chance(3) { "ghost".to_string() } else { nodes[i].name.clone() };
            pods.push(RunningPod {
                namespace: format!("t{}", k % 3),
                name: format!("u{k}-{m}"),
                uid: None,
                node,
                requests,
            });
        }
        if pods.is_empty() {
            continue;
        }
        let started = rng.below(9_000) as i64;
        let namespace = format!("t{}", k % 3);
        running.push(RunningUnit {
            key: if pods.len() > 1 || rng.chance(30) {
                UnitKey::Gang(GangKey { namespace: namespace.clone(), name: format!("u{k}") })
            } else {
                UnitKey::Pod { namespace: namespace.clone(), name: format!("u{k}-0") }
            },
            team: if rng.chance(10) { None } else { Some(namespace) },
            priority: rng.below(6) as i32,
            started,
            evictable_from: if rng.chance(10) { 20_000 } else { started },
            pods,
        });
    }
    running
}

/// 1–6 waiting gangs of priorities 0–7: one shape or two, with phantoms, a topology required or
/// preferred, joining a domain, with or without the right to preempt within or across teams.
fn random_gangs(rng: &mut Rng, racks: usize) -> Vec<WaitingGang> {
    let mut gangs = Vec::new();
    for g in 0..1 + rng.below(6) {
        let members = 1 + rng.below(5) as u32;
        let pool = rng.below(4) as usize;
        let base = {
            let gpus = 1 + rng.below(3) as i64;
            shape(rng, pool, gpus)
        };
        let hetero = rng.chance(20);
        let topology = match rng.below(5) {
            0 => Some(GangTopology { levels: vec!["rack".into()], required: true }),
            1 => Some(GangTopology { levels: vec!["clique".into(), "rack".into()], required: true }),
            2 => Some(GangTopology { levels: vec!["clique".into(), "rack".into()], required: false }),
            _ => None,
        };
        let member = |rng: &mut Rng, m: u32| Member {
            name: format!("w{g}-{m}"),
            shape: if hetero && m % 2 == 1 {
                let gpus = 1 + rng.below(3) as i64;
                shape(rng, pool, gpus)
            } else {
                base.clone()
            },
        };
        let team = format!("t{}", g % 3);
        gangs.push(WaitingGang {
            key: GangKey { namespace: team.clone(), name: format!("w{g}") },
            expected: Some(members + u32::from(rng.chance(10))),
            members: (0..members).map(|m| member(rng, m)).collect(),
            priority: rng.below(8) as i32,
            created: 0,
            ready: (g as i64, 0),
            held_by: None,
            disagreement: None,
            unplaceable: None,
            starvation_after: if rng.chance(20) { Some(10) } else { None },
            phantoms: rng.chance(10).then(|| Phantoms { count: 1 + rng.below(3) as u32, shape: base.clone() }),
            joins: rng
                .chance(8)
                .then(|| Domain { level: "rack".into(), value: format!("r{}", rng.below(racks as u64 + 1)) }),
            topology,
            preemptor: (!rng.chance(10)).then(|| super::Preemptor {
                team: Some(team),
                within_team: rng.chance(80),
                other_teams: rng.chance(70),
            }),
        });
    }
    gangs
}

fn random_snapshot(seed: u64) -> Snapshot {
    let mut rng = Rng::new(seed);
    let (nodes, racks) = random_nodes(&mut rng);
    let running = random_running(&mut rng, &nodes);
    let mut bound: Vec<(String, BTreeMap<String, Quantity>)> =
        running.iter().flat_map(|u| u.pods.iter().map(|p| (p.node.clone(), p.requests.clone()))).collect();
    if rng.chance(20) {
        bound.push((nodes[0].name.clone(), BTreeMap::from([("nvidia.com/gpu".to_string(), q(1))])));
    }
    let gangs = random_gangs(&mut rng, racks);
    let mut preemptions = Vec::new();
    if rng.chance(15) {
        let node = nodes[rng.below(nodes.len() as u64) as usize].name.clone();
        preemptions.push(InFlight { preemptor: None, nodes: vec![node], placements: vec![], domain: None });
    }
    let accelerators = ResourceMatcher::new(["nvidia.com/gpu"]);
    Snapshot { now: 10_000, nodes, bound, gangs, accelerators, running, preemptions, ..Default::default() }
}

#[test]
fn the_fast_search_decides_what_the_plain_search_decides() {
    let (mut preempts, mut with_topology) = (0, 0);
    for seed in 0..1_500 {
        let snapshot = random_snapshot(seed);
        let fast = decide(&snapshot);
        let plain = with_reference(|| decide(&snapshot));
        assert_eq!(fast, plain, "seed {seed}: the fast search decided otherwise");
        for d in fast.iter().filter(|d| matches!(d.verdict, Verdict::Preempt { .. })) {
            preempts += 1;
            with_topology += usize::from(snapshot.gangs.iter().any(|w| w.key == d.gang && w.topology.is_some()));
        }
    }
    // The cases do reach the search, with and without a topology.
    assert!(preempts >= 200, "only {preempts} preemptions");
    assert!(with_topology >= 50, "only {with_topology} with a topology");
}
