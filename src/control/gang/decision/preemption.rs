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
//!
//! **Speed, same answers.** A pass may search for hundreds of gangs over tens of thousands of
//! running units, so what the search reads is built once per pass, when a gang first searches
//! (`candidates`: flat arrays in cost order; `domains`: per domain, the units with a pod there);
//! domains are searched by a lower bound on the priority a set there can have, and the search
//! stops once no domain left can beat the best set found (`bounds`); a probe answers "no"
//! without placing anything when the aggregate free capacity is short, and a gang of one shape
//! is tested by counting copies of it instead of placing it (`search`, `copies`). None of these
//! may change an answer: `reference_tests` decides random clusters with both searches, this one
//! and the plain one the paragraphs above describe, and asks for the same decisions.

use std::cmp::Reverse;

mod bounds;
mod candidates;
mod copies;
mod domains;
#[cfg(test)]
mod reference_tests;
pub(super) use candidates::Candidates;
mod search;

use super::{
    Decision, Domain, GangKey, Placements, Quantity, ResourceList, Simulation, Snapshot, Verdict, WaitingGang,
};
use crate::control::cluster::PodUid;
use crate::model::resources::ResourceMatcher;

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
    pub uid: Option<PodUid>,
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
    /// ([`RunningUnit::devices`] summed, without building its map: a pass asks it of every
    /// running unit.)
    fn work_lost(&self, now: i64, accelerators: &ResourceMatcher) -> i128 {
        let mut devices: Vec<(&str, Quantity)> = Vec::new();
        for (name, q) in self.pods.iter().flat_map(|p| p.requests.iter()).filter(|(n, _)| accelerators.matches(n)) {
            match devices.iter_mut().find(|(n, _)| *n == name) {
                Some((_, sum)) => *sum = sum.saturating_add(*q),
                None => devices.push((name, *q)),
            }
        }
        work_lost_of(&mut devices, self.started, now)
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

/// Work lost by evicting a unit that started at `started` and holds `devices` (per resource,
/// summed saturating): all of them (in name order, as [`RunningUnit::devices`] lists them) ×
/// seconds running.
fn work_lost_of(devices: &mut [(&str, Quantity)], started: i64, now: i64) -> i128 {
    devices.sort_unstable_by_key(|(name, _)| *name);
    let devices: i128 = devices.iter().map(|(_, q)| q.nanos()).sum();
    devices.saturating_mul(i128::from(now.saturating_sub(started).max(0)))
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
    /// Whether it may evict work of `team` (`None`: a namespace of no team), by team name.
    pub fn may_evict(&self, team: Option<&str>) -> bool {
        self.may_evict_work(team.is_some() && team == self.team.as_deref())
    }

    /// Whether it may evict work of its own team (`own`) or of anyone else (a namespace of no
    /// team included): the one rule, whoever names the teams.
    pub fn may_evict_work(&self, own: bool) -> bool {
        if own { self.within_team } else { self.other_teams }
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

/// What [`set_cost`] returns.
type Cost = (i32, i128, Reverse<i64>, usize);

/// Why a gang that does not fit evicts nobody, for its message (`None`: nothing to add).
#[derive(Debug, Clone, PartialEq)]
pub enum NoVictims {
    /// Its team or its members' `preemptionPolicy` say never.
    Never,
    /// A preemption is already in flight on the nodes it may use.
    InFlight,
    /// No set of evictable lower-priority work would make it fit.
    NoSet,
    /// A reclaim of its team's lent quota makes room for it (not decided here: see
    /// [`super::Snapshot::reclaiming`]).
    Reclaiming,
}

/// Where the search runs for one gang: the domains of one level of its required topology (or
/// only the one its released members are in), or all nodes.
enum Scope {
    Anywhere,
    Level { level: String, only: Option<usize> },
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
        candidates.order(self);
        #[cfg(test)]
        if reference_tests::active() {
            return self.reference_preempt_for(gang, candidates);
        }
        candidates.bounds.searching();
        // Candidates are a prefix of the cost order (priority first): those of lower priority.
        let lower = candidates.priority.partition_point(|p| *p < gang.priority);
        if lower == 0 {
            return Err(NoVictims::NoSet);
        }
        let demand = search::Demand::of(self, candidates, gang);
        let (usable_id, usable) = candidates.indexes.usable(self, gang, &demand.classes);
        let team = preemptor.team.as_deref().and_then(|t| candidates.teams.get(t).copied());
        let who = search::Eligible { lower, preemptor, team, usable: &usable, usable_id };
        let ask = search::Ask { gang, who: &who, demand: &demand };
        let scopes = self.preemption_scopes(gang);
        let mut busy_everywhere = !scopes.is_empty();
        let mut found = None;
        // Tightest level first; the first level where some set makes room decides.
        for scope in &scopes {
            let (best, searched) = match scope {
                Scope::Anywhere => self.search_anywhere(candidates, &ask),
                Scope::Level { level, only } => self.search_level(candidates, &ask, level, *only),
            };
            busy_everywhere &= !searched;
            if best.is_some() {
                found = best;
                break;
            }
        }
        let Some(domains::Found { victims, placements, domain, .. }) = found else {
            return Err(if busy_everywhere { NoVictims::InFlight } else { NoVictims::NoSet });
        };
        candidates.claim(&victims);
        let victims = victims.into_iter().map(|v| candidates.units[v].clone()).collect();
        Ok(Chosen { victims, placements, domain })
    }

    /// Where the search runs, by level, tightest first: the domain its released members are in
    /// (nowhere if no node has it any more), each level of its required topology, or all nodes.
    fn preemption_scopes(&mut self, gang: &WaitingGang) -> Vec<Scope> {
        if let Some(domain) = &gang.joins {
            self.ensure_level(&domain.level);
            let level = &self.levels.by_key[&domain.level];
            let Ok(index) = level.names.binary_search(&domain.value) else { return Vec::new() };
            return vec![Scope::Level { level: domain.level.clone(), only: Some(index) }];
        }
        let Some(topology) = gang.topology.as_ref().filter(|t| t.required) else {
            return vec![Scope::Anywhere];
        };
        topology.levels.iter().map(|level| Scope::Level { level: level.clone(), only: None }).collect()
    }

    /// Gives back (`sign` -1) or takes again (1) what unit `v`'s pods hold on their nodes.
    fn evict(&mut self, candidates: &Candidates<'_>, v: usize, sign: i128) {
        for (pod, node) in candidates.units[v].pods.iter().zip(candidates.pod_nodes(v)) {
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

/// The decision for a complete gang that does not fit, where preemption has one: released
/// once the victims of its preemption in flight are gone, waiting while they go, or evicting
/// the cheapest set of lower-priority work that makes room. Whatever it is, the room is its: its
/// members are placed where the search put them (over the victims, still there, so those
/// nodes have nothing left for any later gang). `Err`: it simply does not fit, and why it
/// evicts nobody (a preemption in flight on its nodes is said in its message).
pub(super) fn verdict(
    sim: &mut Simulation<'_>,
    candidates: &mut Candidates<'_>,
    snapshot: &Snapshot,
    gang: &WaitingGang,
) -> Result<Decision, NoVictims> {
    let present = gang.present();
    let flight = snapshot.preemptions.iter().find(|f| f.preemptor.as_ref() == Some(&gang.key));
    let covers = |placements: &Placements| gang.members.iter().all(|m| placements.iter().any(|(n, _)| *n == m.name));
    let (verdict, message, placements) = match flight {
        Some(flight) if flight.nodes.is_empty() && covers(&flight.placements) => {
            // Its victims are gone. Whatever took their room meanwhile (a plain pod the
            // scheduler bound first) has a lower priority: the scheduler preempts it for the
            // released members, which it sees once their gates are gone.
            let message = format!("{present}/{present} members present; the pods it preempted are gone, releasing");
            let verdict = Verdict::Release { placements: flight.placements.clone(), domain: flight.domain.clone() };
            (verdict, message, &flight.placements)
        }
        Some(flight) if covers(&flight.placements) => {
            candidates.mark_busy(sim, &flight.nodes);
            let need = sim.need_message(gang, &snapshot.accelerators);
            let on = flight.nodes.join(", ");
            let message = format!("{need}; preempting to make room: waiting for its victims to go (on {on})");
            (Verdict::Preempting, message, &flight.placements)
        }
        // (Members changed since: what it preempted for is not what waits now.)
        _ => {
            let chosen = sim.preempt_for(gang, candidates)?;
            let named: Vec<String> = chosen.victims.iter().map(|v| v.describe(&snapshot.accelerators)).collect();
            let message = format!(
                "{}; preempting {} to make room",
                sim.need_message(gang, &snapshot.accelerators),
                and_list(&named)
            );
            let placements = chosen.placements.clone();
            let preempt =
                Verdict::Preempt { victims: chosen.victims, placements: chosen.placements, domain: chosen.domain };
            let decision = Decision { gang: gang.key.clone(), verdict: preempt, message };
            sim.reserve(gang, &placements);
            return Ok(decision);
        }
    };
    sim.reserve(gang, placements);
    Ok(Decision { gang: gang.key.clone(), verdict, message })
}

/// "a, b and c"; past three, "a, b, c and 4 more".
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [first @ .., last] if items.len() <= 3 => format!("{} and {last}", first.join(", ")),
        _ => format!("{} and {} more", items[..3].join(", "), items.len() - 3),
    }
}

#[cfg(test)]
#[path = "preemption_tests.rs"]
mod tests;
