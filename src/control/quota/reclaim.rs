//! Reclaiming lent quota: a team of a cohort asking for what its nominal quota guarantees gets
//! it, even when other teams borrowed it. When the queue pass finds such a unit waiting for
//! quota that is lent out ([`ReclaimAsk`]), or, in deny mode, a lender's pod admitted on lent
//! quota waits unscheduled ([`deny`]), this chooses borrowed work of the cohort's other teams
//! to evict ([`reclaims`], [`deny_pass`]), which the controller evicts like a preemption's
//! victims (PodDisruptionBudgets consulted by a dry run first, all or nothing).
//!
//! The choice ([`choose`]) is pure:
//! - only running units (a plain pod, or a released gang whole) of teams that borrow, while they
//!   still borrow what the lender asks; never the lender's own work;
//! - past their team's `minRuntime`, and not refused by a budget lately;
//! - lowest priority first, then the newest (its start, then the order Allot saw its pods in:
//!   pods made in the same second are told apart), then by name;
//! - no more than needed: once enough is chosen, each victim that is not needed after all is
//!   spared again, the last chosen first;
//! - all or nothing: if the candidates cannot free enough, nothing is evicted.
//!
//! A reclaim in flight is not repeated while its victims terminate: the victims this leader
//! evicted count as gone ([`Memory`]) for at most [`IN_FLIGHT_MAX_SECS`], and so, during the
//! first [`IN_FLIGHT_MAX_SECS`] of its leadership, do the pods Allot's condition shows evicted
//! (a previous leader's). Nothing else terminating counts as gone: a tenant whose borrowed pod
//! takes a year to terminate (a long grace period, a finalizer) cannot keep a lender waiting.

use std::collections::{BTreeMap, HashMap};

use crate::control::cluster::{ClusterView, ControllerAction, PodRecord, PodUid};
use crate::control::gang::decision::{GangKey, RunningUnit, UnitKey};
use crate::control::gang::preemption::IN_FLIGHT_MAX_SECS;
use crate::control::gang::victims::running_units;
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::PolicySet;
use crate::model::policy::cohort::{Cohort, CohortUsage};
use crate::model::policy::quota::{Charge, Quota};
use crate::model::resources::ResourceList;

/// A unit waiting for its team's lent quota to come back.
#[derive(Debug, Clone)]
pub struct Reclaimer {
    /// Its queue key (`pod/NS/NAME`, `gang/NS/NAME`).
    pub unit: String,
    /// What it asks (the team quota's charge units).
    pub charge: Charge,
    /// Its first member, where a refused reclaim is told: (namespace, pod).
    pub first_member: Option<(String, String)>,
}

/// A cohort's lenders waiting for their lent quota, as one queue pass left them.
#[derive(Debug, Clone)]
pub struct ReclaimAsk<'p> {
    /// The cohort's usage after the pass's releases.
    pub usage: CohortUsage<'p>,
    /// (team, its unit waiting), in team name order.
    pub reclaimers: Vec<(String, Reclaimer)>,
}

/// What the controller evicts for one lender's unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaim {
    pub cohort: String,
    /// The lender.
    pub team: String,
    /// Its waiting unit (`pod/NS/NAME`, `gang/NS/NAME`) and what it asks (`1 nvidia.com/gpu`).
    pub unit: String,
    pub asks: String,
    /// Its first member, where a refusal is told: (namespace, pod).
    pub first_member: Option<(String, String)>,
    /// Chosen in order (the cheapest first).
    pub victims: Vec<RunningUnit>,
}

impl Reclaim {
    /// What each victim pod is told (condition and Event).
    pub fn victim_message(&self, unit: &RunningUnit) -> String {
        let what = match &unit.key {
            UnitKey::Gang(g) => format!("gang {g} is evicted whole"),
            UnitKey::Pod { .. } => "this pod is evicted".to_string(),
        };
        let team = unit.team.as_deref().unwrap_or_default();
        format!(
            "reclaimed by team {} of cohort {}: team {team} ran this on quota borrowed from the cohort, and {} asks \
             {} within team {}'s nominal quota: {what}",
            self.team, self.cohort, self.unit, self.asks, self.team
        )
    }
}

pub mod deny;

/// The most entries of each kind the [`Memory`] keeps.
const MEMORY_BOUND: usize = 10_000;

/// A victim evicted: its uid (a pod made again under the name is another pod), when, and the
/// gang it was evicted for, if a gang reclaimed.
type Evicted = (Option<PodUid>, i64, Option<GangKey>);

/// The gang of a reclaimer's unit key (`gang/NS/NAME`).
fn gang_of_unit(unit: &str) -> Option<GangKey> {
    let (namespace, name) = unit.strip_prefix("gang/")?.split_once('/')?;
    Some(GangKey { namespace: namespace.to_string(), name: name.to_string() })
}

/// What the leader remembers of its reclaims between passes (a new leader starts empty).
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// When this leadership's first pass was.
    leading_since: Option<i64>,
    /// The victims it evicted: (namespace, pod) → (uid, when).
    evicted: HashMap<(String, String), Evicted>,
    /// Units a budget kept a reclaim from evicting, until when.
    spared: HashMap<UnitKey, i64>,
}

impl Memory {
    /// At the start of a pass: forgets what is over.
    pub fn begin_pass(&mut self, now: i64) {
        self.leading_since.get_or_insert(now);
        self.evicted.retain(|_, (_, at, _)| now < at.saturating_add(IN_FLIGHT_MAX_SECS));
        self.spared.retain(|_, until| now < *until);
    }

    /// A victim pod evicted at `now`.
    pub fn evicted(&mut self, namespace: &str, pod: &str, uid: Option<PodUid>, now: i64) {
        self.evicted_for(namespace, pod, uid, now, None);
    }

    /// A victim pod evicted at `now` for `reclaimer`'s unit (`gang/NS/NAME` is remembered).
    pub fn evicted_for(&mut self, namespace: &str, pod: &str, uid: Option<PodUid>, now: i64, reclaimer: Option<&str>) {
        if self.evicted.len() < MEMORY_BOUND {
            let gang = reclaimer.and_then(gang_of_unit);
            self.evicted.insert((namespace.to_string(), pod.to_string()), (uid, now, gang));
        }
    }

    /// The gangs a reclaim of this leader makes room for while its victims are still there:
    /// the gang-aware preemption waits for those rather than also make room for them.
    pub fn reclaiming(&self, view: &ClusterView<'_>) -> Vec<GangKey> {
        let mut out: Vec<GangKey> = self
            .evicted
            .iter()
            .filter_map(|((namespace, pod), (uid, _, gang))| {
                let p = view.pod(namespace, pod)?;
                (!p.finished && (uid.is_none() || p.uid == *uid)).then(|| gang.clone())?
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// A unit whose eviction a budget refused: not chosen before `until`.
    pub fn spare(&mut self, unit: UnitKey, until: i64) {
        if self.spared.len() < MEMORY_BOUND {
            self.spared.insert(unit, until);
        }
    }

    /// The pods a reclaim in flight still waits for, at `now`: this leader's victims not gone
    /// yet, and early in its leadership those Allot's condition shows evicted.
    fn leaving<'v>(&self, view: &'v ClusterView<'_>, now: i64) -> BTreeMap<(&'v str, &'v str), &'v PodRecord> {
        let mut out = BTreeMap::new();
        for ((namespace, pod), (uid, _, _)) in &self.evicted {
            if let Some(p) = view.pod(namespace, pod).filter(|p| !p.finished && (uid.is_none() || p.uid == *uid)) {
                out.insert((&*p.namespace, &*p.name), p);
            }
        }
        let since = self.leading_since.unwrap_or(now);
        if now < since.saturating_add(IN_FLIGHT_MAX_SECS) {
            out.extend(view.preempted_pods().map(|p| ((&*p.namespace, &*p.name), p)));
        }
        out
    }
}

/// The reclaims the pass's asks call for, at `now`, given what the leader remembers.
pub fn reclaims(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    asks: &[ReclaimAsk<'_>],
    memory: &Memory,
    now: i64,
) -> Vec<Reclaim> {
    reclaims_with(view, policies, labels, asks, &[], memory, now)
}

/// The reclaims the deny-mode cohorts call for ([`deny`]), at `now`, and the writes that keep
/// their pods' borrowed marks in step: a walk over every pod, only when the policies have such
/// a cohort.
pub fn deny_pass(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    memory: &Memory,
    now: i64,
) -> (Vec<Reclaim>, Vec<ControllerAction>) {
    let deny::DenyAsks { asks, pending, marks } = deny::asks(view, policies, labels);
    (reclaims_with(view, policies, labels, &asks, &pending, memory, now), marks)
}

/// [`reclaims`], with units beyond the running ones that may be evicted (`extra`).
fn reclaims_with(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    asks: &[ReclaimAsk<'_>],
    extra: &[RunningUnit],
    memory: &Memory,
    now: i64,
) -> Vec<Reclaim> {
    if asks.is_empty() {
        return Vec::new();
    }
    let quota_of = |team: &str| policies.teams.iter().find(|t| t.name == team).and_then(|t| t.quota.as_ref());
    let leaving = leaving_by_team(memory.leaving(view, now).into_values(), policies, labels);
    // Only the cohorts' teams' work can be reclaimed (`candidates`): no other namespace is read.
    let in_reach = |team: Option<&str>| {
        team.is_some_and(|t| asks.iter().any(|a| a.usage.cohort().members.iter().any(|m| m.team == t)))
    };
    let mut units = running_units(view, policies, labels, i32::MAX, &in_reach, now);
    units.extend(extra.iter().cloned());
    let mut out = Vec::new();
    for ask in asks {
        let mut usage = ask.usage.clone();
        let cohort = usage.cohort();
        for member in &cohort.members {
            if let (Some(quota), Some(gone)) = (quota_of(&member.team), leaving.get(member.team.as_str())) {
                usage.give_back(&member.team, &quota.charge(gone));
            }
        }
        let candidates = candidates(view, cohort, &units, &quota_of, &memory.spared, now);
        let mut taken = vec![false; candidates.len()];
        for (team, reclaimer) in &ask.reclaimers {
            let Some(quota) = quota_of(team) else { continue };
            if usage.check(team, &reclaimer.charge).is_err() {
                let open: Vec<usize> = (0..candidates.len()).filter(|i| !taken[*i]).collect();
                let Some(chosen) = choose(&usage, team, &reclaimer.charge, &candidates, &open) else { continue };
                for &i in &chosen {
                    taken[i] = true;
                    usage.give_back(&candidates[i].team, &candidates[i].charge);
                }
                out.push(Reclaim {
                    cohort: cohort.name.clone(),
                    team: team.clone(),
                    unit: reclaimer.unit.clone(),
                    asks: asks_text(quota, &reclaimer.charge),
                    first_member: reclaimer.first_member.clone(),
                    victims: chosen.iter().map(|&i| candidates[i].unit.clone()).collect(),
                });
            }
            // Counted as the lender's: the next lender of the cohort does not count on the same room.
            usage.take(team, &reclaimer.charge);
        }
    }
    out
}

fn asks_text(quota: &Quota, charge: &Charge) -> String {
    charge.iter().map(|(r, v)| format!("{} {r}", quota.show(*v))).collect::<Vec<_>>().join(", ")
}

/// A running unit of a cohort's team, with what it counts against its team's quota.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub unit: RunningUnit,
    pub team: String,
    pub charge: Charge,
    /// How new it is: its start (seconds), then the latest arrival of its pods (the order Allot
    /// saw them in, for pods started in the same second).
    pub recency: (i64, i64),
}

/// The running units of `cohort`'s teams that may be evicted at `now`, in the order a reclaim
/// takes them: lowest priority, then newest, then by key.
fn candidates<'p>(
    view: &ClusterView<'_>,
    cohort: &Cohort,
    units: &[RunningUnit],
    quota_of: &dyn Fn(&str) -> Option<&'p Quota>,
    spared: &HashMap<UnitKey, i64>,
    now: i64,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = units
        .iter()
        .filter(|u| u.evictable_from <= now && spared.get(&u.key).is_none_or(|until| *until <= now))
        .filter_map(|u| {
            let team = u.team.as_deref().filter(|t| cohort.members.iter().any(|m| m.team == *t))?;
            let mut requests = ResourceList::new();
            for pod in &u.pods {
                crate::model::tally::add_to(&mut requests, &pod.requests, 1);
            }
            let charge = quota_of(team)?.charge(&requests);
            let arrival = u.pods.iter().filter_map(|p| view.pod(&p.namespace, &p.name)?.arrival).max();
            let recency = (u.started, arrival.unwrap_or(i64::MIN));
            (!charge.is_empty()).then(|| Candidate { unit: u.clone(), team: team.to_string(), charge, recency })
        })
        .collect();
    out.sort_by(|a, b| {
        a.unit
            .priority
            .cmp(&b.unit.priority)
            .then(b.recency.cmp(&a.recency))
            .then_with(|| a.unit.key.to_string().cmp(&b.unit.key.to_string()))
    });
    out
}

/// The candidates (indexes into `candidates`, among `open`, which are in reclaim order) to
/// evict so that `lender` can take `charge`, or `None` when they cannot free enough.
pub fn choose(
    usage: &CohortUsage<'_>,
    lender: &str,
    charge: &Charge,
    candidates: &[Candidate],
    open: &[usize],
) -> Option<Vec<usize>> {
    let mut sim = usage.clone();
    let mut chosen = Vec::new();
    for &i in open {
        if sim.check(lender, charge).is_ok() {
            break;
        }
        let c = &candidates[i];
        // Only borrowed work, and only while its team still borrows what the lender needs.
        if c.team == lender || !sim.borrows_any_of(&c.team, charge) {
            continue;
        }
        if !c.charge.iter().any(|(r, v)| *v > 0 && charge.get(r).is_some_and(|a| *a > 0)) {
            continue;
        }
        sim.give_back(&c.team, &c.charge);
        chosen.push(i);
    }
    sim.check(lender, charge).ok()?;
    // No more than needed: spare again what is not, the last chosen (the dearest) first.
    for k in (0..chosen.len()).rev() {
        let c = &candidates[chosen[k]];
        let mut trial = sim.clone();
        trial.take(&c.team, &c.charge);
        if trial.check(lender, charge).is_ok() {
            sim = trial;
            chosen.remove(k);
        }
    }
    Some(chosen)
}

/// What the `leaving` pods request, per team.
fn leaving_by_team<'v>(
    leaving: impl Iterator<Item = &'v PodRecord>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
) -> HashMap<String, ResourceList> {
    let mut teams = TeamsByNamespace::new(policies, labels);
    let mut out: HashMap<String, ResourceList> = HashMap::new();
    for p in leaving {
        let Some(team) = teams.get(&p.namespace) else { continue };
        let slot = out.entry(team.name.clone()).or_default();
        for (name, q) in p.request_pairs() {
            let entry = slot.entry(name.to_string()).or_default();
            *entry = entry.saturating_add(q);
        }
    }
    out
}
