//! Preemption in the decision: a complete gang that does not fit may evict work of a strictly
//! lower priority to make room, as the scheduler does for a plain pod (which it cannot do for a
//! gang: it never sees a gated pod).
//!
//! **Victims** are units: a plain pod, or a whole released gang (every present member; never
//! some of them). Only running accelerator work of a lower priority, that the preemptor's team
//! may evict (`withinTeam`, `otherTeams`), that has run its team's `minRuntime`, and that was
//! not evicted by a preemption within the back-off or refused by a PodDisruptionBudget lately
//! ([`RunningUnit::evictable_from`]).
//!
//! **Cost** orders units, cheapest first: lowest priority, then least work lost (accelerator
//! devices × seconds running), then newest, then fewest pods. The search takes the shortest
//! cheapest-first prefix of candidates whose removal lets the gang fit (fit is monotone in what
//! is removed, so a binary search over the prefix: O(log n) placements), then gives back the
//! most expensive victims first while the gang still fits (each victim left is needed: removing
//! any one of them alone from the set makes the gang not fit). Where the gang requires a
//! topology domain, the search runs per domain of its tightest level that has any, and the
//! cheapest set wins; all victims that matter and the gang then lie in that domain.
//!
//! **No loops, no storms.** A victim's priority is strictly lower than the preemptor's, so no
//! two gangs can evict each other. One preemption in flight per domain: while victims of a
//! preemption are still going, no new preemption is chosen on the nodes a gang may use (its
//! domain, where it requires one), and victims chosen in a pass are no candidates for another
//! gang in it. A gang whose preemption is in flight holds back later gangs that may use its
//! nodes (the freed capacity is reserved for it), and is released once its victims are gone.

use std::cmp::Reverse;
use std::sync::Arc;

use super::{Domain, GangKey, Placements, ResourceList, Simulation, WaitingGang};
use crate::resources::ResourceMatcher;

/// What a unit of running work is: a plain pod or a whole gang.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnitKey {
    Pod { namespace: String, name: String },
    Gang(GangKey),
}

impl std::fmt::Display for UnitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnitKey::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
            UnitKey::Gang(key) => write!(f, "gang {key}"),
        }
    }
}

/// One bound pod of a running unit.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningPod {
    pub namespace: String,
    pub name: String,
    pub uid: Option<Arc<str>>,
    pub node: String,
    pub requests: ResourceList,
}

/// Running work a preemption may evict, whole.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningUnit {
    pub key: UnitKey,
    /// Its namespace's team (`None`: a namespace of no team).
    pub team: Option<String>,
    /// The highest priority among its pods.
    pub priority: i32,
    /// When it started (seconds): its newest pod's creation, or a gang's latest release.
    pub started: i64,
    /// Not evictable before this time (seconds): its team's `minRuntime` after `started`, the
    /// back-off after a preemption evicted it, or a PodDisruptionBudget's refusal.
    pub evictable_from: i64,
    pub pods: Vec<RunningPod>,
}

impl RunningUnit {
    /// Its accelerator devices, per resource.
    pub fn devices(&self, accelerators: &ResourceMatcher) -> ResourceList {
        let mut out = ResourceList::new();
        for (name, q) in self.pods.iter().flat_map(|p| p.requests.iter()).filter(|(n, _)| accelerators.matches(n)) {
            let slot = out.entry(name.clone()).or_default();
            *slot = slot.saturating_add(*q);
        }
        out
    }

    /// Work lost if it is evicted now: devices × seconds running (device-nanos × seconds).
    fn work_lost(&self, now: i64, accelerators: &ResourceMatcher) -> i128 {
        let devices: i128 = self.devices(accelerators).values().map(|q| q.nanos()).sum();
        devices.saturating_mul(i128::from(now.saturating_sub(self.started).max(0)))
    }

    /// "gang research/a (2 pods, 2 nvidia.com/gpu)".
    pub fn describe(&self, accelerators: &ResourceMatcher) -> String {
        let pods = match self.pods.len() {
            1 => "1 pod".to_string(),
            n => format!("{n} pods"),
        };
        let devices: Vec<String> = self.devices(accelerators).iter().map(|(r, q)| format!("{q} {r}")).collect();
        if devices.is_empty() {
            format!("{} ({pods})", self.key)
        } else {
            format!("{} ({pods}, {})", self.key, devices.join(", "))
        }
    }
}

/// What a waiting gang may evict: from its team's `preemption` and its members'
/// `preemptionPolicy` (`None` on [`WaitingGang::preemptor`]: it never evicts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemptor {
    pub team: Option<String>,
    pub within_team: bool,
    pub other_teams: bool,
}

impl Preemptor {
    fn may_evict(&self, unit: &RunningUnit) -> bool {
        if unit.team.is_some() && unit.team == self.team { self.within_team } else { self.other_teams }
    }
}

/// A preemption in flight: victims Allot evicted that are not gone yet, or all gone but the
/// gang not released yet.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// The gang it makes room for (`None`: known only from its victims' condition, after a
    /// leader change).
    pub preemptor: Option<GangKey>,
    /// The nodes of the victims still going.
    pub nodes: Vec<String>,
    /// Where the search placed the gang's members, and in which domain.
    pub placements: Placements,
    pub domain: Option<Domain>,
}

/// The victims chosen for one gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    /// Cheapest first.
    pub victims: Vec<RunningUnit>,
    /// Where the gang's members would go once they are gone, and in which domain.
    pub placements: Placements,
    pub domain: Option<Domain>,
}

/// How a set of victims is compared: highest priority among them, work lost, then the newest
/// set (its oldest victim started latest), then fewest pods.
pub fn set_cost(
    victims: &[&RunningUnit],
    now: i64,
    accelerators: &ResourceMatcher,
) -> (i32, i128, Reverse<i64>, usize) {
    let priority = victims.iter().map(|u| u.priority).max().unwrap_or(i32::MIN);
    let lost = victims.iter().map(|u| u.work_lost(now, accelerators)).fold(0i128, i128::saturating_add);
    let oldest = victims.iter().map(|u| u.started).min().unwrap_or(i64::MAX);
    let pods = victims.iter().map(|u| u.pods.len()).sum();
    (priority, lost, Reverse(oldest), pods)
}

/// Where a gang's members go, and the domain they go in.
type Placed = (Placements, Option<Domain>);

/// The pass's candidates: every running unit, cheapest first, with its pods' node indices;
/// which are taken by a preemption chosen earlier in the pass; which nodes have one in flight.
pub(super) struct Candidates<'s> {
    units: Vec<&'s RunningUnit>,
    /// By unit (as ordered): its pods' node indices (`None`: a node the view does not have).
    nodes: Vec<Vec<Option<usize>>>,
    taken: Vec<bool>,
    /// By node index: a preemption is in flight there.
    busy: Vec<bool>,
    now: i64,
    accelerators: &'s ResourceMatcher,
}

impl<'s> Candidates<'s> {
    pub(super) fn new(snapshot: &'s super::Snapshot, sim: &Simulation<'_>) -> Candidates<'s> {
        let now = snapshot.now;
        let accelerators = &snapshot.accelerators;
        let mut units: Vec<&RunningUnit> = snapshot.running.iter().collect();
        let mut keyed: Vec<(i128, &RunningUnit)> =
            units.drain(..).map(|u| (u.work_lost(now, accelerators), u)).collect();
        keyed.sort_by(|(la, a), (lb, b)| {
            (a.priority, la, Reverse(a.started), a.pods.len(), &a.key).cmp(&(
                b.priority,
                lb,
                Reverse(b.started),
                b.pods.len(),
                &b.key,
            ))
        });
        let units: Vec<&RunningUnit> = keyed.into_iter().map(|(_, u)| u).collect();
        let nodes =
            units.iter().map(|u| u.pods.iter().map(|p| sim.by_name.get(p.node.as_str()).copied()).collect()).collect();
        let mut busy = vec![false; sim.nodes.len()];
        for node in snapshot.preemptions.iter().flat_map(|f| f.nodes.iter()) {
            if let Some(&i) = sim.by_name.get(node.as_str()) {
                busy[i] = true;
            }
        }
        let taken = vec![false; units.len()];
        Candidates { units, nodes, taken, busy, now, accelerators }
    }

    /// Marks the victims of a preemption just chosen: taken, and their nodes busy.
    fn claim(&mut self, victims: &[usize]) {
        for &v in victims {
            self.taken[v] = true;
            for i in self.nodes[v].iter().flatten() {
                self.busy[*i] = true;
            }
        }
    }

    /// Marks nodes busy: a preemption for a gang is in flight there.
    pub(super) fn mark_busy(&mut self, sim: &Simulation<'_>, nodes: &[String]) {
        for node in nodes {
            if let Some(&i) = sim.by_name.get(node.as_str()) {
                self.busy[i] = true;
            }
        }
    }
}

/// Why a gang that does not fit evicts nobody, for its message (`None`: nothing to add).
#[derive(Debug, Clone, PartialEq)]
pub enum NoVictims {
    /// Its team or its members' `preemptionPolicy` say never.
    Never,
    /// A preemption is already in flight on the nodes it may use.
    InFlight,
    /// No set of evictable lower-priority work would make it fit.
    NoSet,
}

impl Simulation<'_> {
    /// The cheapest set of victims whose eviction lets `gang` fit (see the module doc), or why
    /// there is none. The simulation is left as it was; the victims are claimed in
    /// `candidates`.
    pub(super) fn preempt_for(
        &mut self,
        gang: &WaitingGang,
        candidates: &mut Candidates<'_>,
    ) -> Result<Chosen, NoVictims> {
        let Some(preemptor) = &gang.preemptor else { return Err(NoVictims::Never) };
        // Candidates are a prefix of the cost order (priority first): those of lower priority.
        let lower = candidates.units.partition_point(|u| u.priority < gang.priority);
        if lower == 0 {
            return Err(NoVictims::NoSet);
        }
        let usable = self.usable_nodes(gang);
        // Who may go is worked out only once some scope has no preemption in flight: behind one
        // (most waiting gangs, once a preemption is under way), the check costs O(its nodes).
        let mut eligible: Option<Vec<usize>> = None;
        let scopes = self.preemption_scopes(gang, &usable);
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
                let eligible = eligible.get_or_insert_with(|| {
                    (0..lower)
                        .filter(|&v| {
                            let unit = candidates.units[v];
                            !candidates.taken[v]
                                && candidates.now >= unit.evictable_from
                                && preemptor.may_evict(unit)
                                && candidates.nodes[v].iter().flatten().any(|&i| usable[i])
                        })
                        .collect()
                });
                let in_scope = |i: &usize| nodes.as_ref().is_none_or(|ns| ns.binary_search(i).is_ok());
                let inside: Vec<usize> =
                    eligible.iter().copied().filter(|&v| candidates.nodes[v].iter().flatten().any(&in_scope)).collect();
                let Some((victims, placements)) = self.smallest_set(gang, candidates, &inside, nodes.as_deref()) else {
                    continue;
                };
                let cost = |set: &[usize]| {
                    let units: Vec<&RunningUnit> = set.iter().map(|&v| candidates.units[v]).collect();
                    set_cost(&units, candidates.now, candidates.accelerators)
                };
                if best.as_ref().is_none_or(|(b, _, _)| cost(&victims) < cost(b)) {
                    let (placements, placed_in) = placements;
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

    /// Where the search runs, by level, tightest first: each domain's nodes (sorted) and the
    /// domain; one scope of all nodes (`None`) for a gang without a required topology.
    #[allow(clippy::type_complexity)]
    fn preemption_scopes(
        &mut self,
        gang: &WaitingGang,
        usable: &[bool],
    ) -> Vec<Vec<(Option<Vec<usize>>, Option<Domain>)>> {
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
            let domains = l
                .nodes
                .iter()
                .zip(&l.names)
                .filter(|(nodes, _)| nodes.iter().any(|&i| usable[i]))
                .map(|(nodes, name)| (Some(nodes.clone()), Some(Domain { level: level.clone(), value: name.clone() })))
                .collect();
            out.push(domains);
        }
        out
    }

    /// The smallest cheapest-first prefix of `eligible` whose removal lets the gang fit within
    /// `scope`, then each victim given back (most expensive first) where it is not needed.
    /// `None` when even all of them do not make room. The simulation is left as it was.
    fn smallest_set(
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
        // Fit is monotone in the prefix: the smallest one that fits, by bisection.
        let (mut lo, mut hi) = (0, eligible.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            set_removed(self, mid, &mut removed);
            if self.fits_within(gang, scope).is_some() { hi = mid } else { lo = mid }
        }
        set_removed(self, hi, &mut removed);
        // Give back the most expensive first while the gang still fits without them.
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

    /// Gives back (`sign` -1) or takes again (1) what unit `v`'s pods hold on their nodes.
    fn evict(&mut self, candidates: &Candidates<'_>, v: usize, sign: i128) {
        for (pod, node) in candidates.units[v].pods.iter().zip(&candidates.nodes[v]) {
            if let Some(i) = node {
                self.adjust(*i, &pod.requests, sign);
            }
        }
    }

    /// Where the whole gang would go now (inside `scope` where given, else as
    /// [`Simulation::place_for`] places it, with the domain it chose); the simulation is left
    /// as it was.
    fn fits_within(&mut self, gang: &WaitingGang, scope: Option<&[usize]>) -> Option<Placed> {
        let placed = match scope {
            None => self.place_for(gang)?,
            Some(nodes) => {
                let done = self.place_members(gang, Some(nodes))?;
                (self.named(done), None)
            }
        };
        self.unplace(gang, &placed.0);
        Some(placed)
    }

    /// Takes what `gang`'s members would take at `placements`: the room its preemption makes is
    /// its (over the victims while they are still there).
    pub(super) fn reserve(&mut self, gang: &WaitingGang, placements: &Placements) {
        for (member, node) in placements {
            let m = gang.members.iter().find(|m| &m.name == member);
            if let (Some(m), Some(&i)) = (m, self.by_name.get(node.as_str())) {
                self.commit(i, &m.shape.requests);
            }
        }
    }

    /// Gives back what `placements` of `gang`'s members took.
    pub(super) fn unplace(&mut self, gang: &WaitingGang, placements: &Placements) {
        for (member, node) in placements {
            let m = gang.members.iter().find(|m| &m.name == member);
            if let (Some(m), Some(&i)) = (m, self.by_name.get(node.as_str())) {
                self.adjust(i, &m.shape.requests, -1);
            }
        }
    }
}

#[cfg(test)]
#[path = "preemption_tests.rs"]
mod tests;
