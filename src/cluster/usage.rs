//! Who uses what, from the cluster view: requests summed by namespace and by where the pods
//! stand ([`UsageState`]), what counts against each team's quota, and the per-team gauges that
//! `/metrics` publishes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::records::PodRecord;
use super::store::{ClusterState, ClusterView};
use crate::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::policy::PolicySet;
use crate::policy::quota::{Charge, Quota};
use crate::quantity::Quantity;
use crate::resources::ResourceList;

impl ClusterState {
    /// The per-team accelerator gauges: for every team (`""` for namespaces of no team) and
    /// accelerator resource, what its non-finished pods request, by where they stand; and for
    /// every team with a quota, its limit and what counts against it now (queued pods excluded),
    /// in the quota's own units (GPU-equivalents where weights apply).
    pub fn accelerator_usage(&self, policies: &PolicySet, labels: &dyn NamespaceLabels) -> AcceleratorUsage {
        let sums = requests_by_state(&self.view());
        let mut teams = TeamsByNamespace::new(policies, labels);
        let mut by_state: BTreeMap<(String, String, UsageState), i128> = BTreeMap::new();
        for ((namespace, state, name), nanos) in &sums {
            if policies.accelerators.matches(name) {
                let team_name = teams.get(namespace).map_or("", |t| t.name.as_str());
                let slot = by_state.entry((team_name.to_string(), name.to_string(), *state)).or_default();
                *slot = slot.saturating_add(*nanos);
            }
        }
        let quota_used = admitted_by_team(&sums, &mut teams);
        let in_units = |quota: &Quota, units: i128| units as f64 / quota.denominator as f64 / 1e9;
        let mut quotas = Vec::new();
        for team in &policies.teams {
            let Some(quota) = &team.quota else { continue };
            for (resource, limit) in &quota.limits {
                let used = quota_used.get(team.name.as_str()).and_then(|c| c.get(resource)).copied().unwrap_or(0);
                quotas.push(QuotaGauge {
                    team: team.name.clone(),
                    resource: resource.clone(),
                    used: in_units(quota, used),
                    limit: in_units(quota, *limit),
                });
            }
        }
        let requested = by_state
            .into_iter()
            .map(|((team, resource, state), nanos)| AcceleratorGauge {
                team,
                resource,
                state,
                amount: nanos as f64 / 1e9,
            })
            .collect();
        AcceleratorUsage { requested, quotas }
    }
}

/// Requests of the non-finished pods, summed per (namespace, state, resource): one pass,
/// no allocation per pod (names are interned).
pub fn requests_by_state(view: &ClusterView<'_>) -> RequestsByState {
    let mut sums = RequestsByState::new();
    for p in view.pods().filter(|p| !p.finished) {
        let state = UsageState::of(p);
        for (name, q) in &p.requests {
            let slot = sums.entry((p.namespace.clone(), state, name.clone())).or_default();
            *slot = slot.saturating_add(q.nanos());
        }
    }
    sums
}

/// Nano-units requested per (namespace, state, resource).
pub type RequestsByState = HashMap<(Arc<str>, UsageState, Arc<str>), i128>;

/// What counts against each team's quota now: the requests of its pods that are not queued
/// behind the quota gate (teams with a quota only). A quota's charge is linear, so charging
/// these sums equals charging each pod.
pub fn admitted_by_team<'p>(sums: &RequestsByState, teams: &mut TeamsByNamespace<'p>) -> HashMap<&'p str, Charge> {
    let mut requests: HashMap<&'p str, (&'p Quota, ResourceList)> = HashMap::new();
    for ((namespace, state, name), nanos) in sums {
        if *state == UsageState::QuotaQueued {
            continue;
        }
        let Some(team) = teams.get(namespace) else { continue };
        let Some(quota) = &team.quota else { continue };
        let slot = requests.entry(team.name.as_str()).or_insert_with(|| (quota, ResourceList::new()));
        let q = slot.1.entry(name.to_string()).or_default();
        *q = Quantity::from_nanos(q.nanos().saturating_add(*nanos));
    }
    requests.into_iter().map(|(team, (quota, requests))| (team, quota.charge(&requests))).collect()
}

/// Where a pod's requests stand, for the per-team gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UsageState {
    /// On a node.
    Bound,
    /// Admitted and ungated (released, or never gated), waiting for the scheduler: reserved.
    Pending,
    /// Behind Allot's gang gate.
    GangGated,
    /// Behind Allot's quota gate.
    QuotaQueued,
}

impl UsageState {
    fn of(p: &PodRecord) -> UsageState {
        if p.quota_gate_index.is_some() {
            UsageState::QuotaQueued
        } else if p.gate_index.is_some() {
            UsageState::GangGated
        } else if p.node_name.is_some() {
            UsageState::Bound
        } else {
            UsageState::Pending
        }
    }

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageState::Bound => "bound",
            UsageState::Pending => "pending",
            UsageState::GangGated => "gang_gated",
            UsageState::QuotaQueued => "quota_queued",
        }
    }
}

/// Accelerators requested by one team's pods in one state.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceleratorGauge {
    pub team: String,
    pub resource: String,
    pub state: UsageState,
    pub amount: f64,
}

/// One limit of a team's quota and what counts against it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaGauge {
    pub team: String,
    pub resource: String,
    pub used: f64,
    pub limit: f64,
}

/// Everything [`ClusterState::accelerator_usage`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceleratorUsage {
    pub requested: Vec<AcceleratorGauge>,
    pub quotas: Vec<QuotaGauge>,
}

/// What a gang counts against its team's quota, kept per gang by the store and rebuilt the same
/// way by the deny-mode ledger, so the watch and the ledger agree: the requests of every member
/// that exists (terminating ones included: they hold their devices until they are gone) plus,
/// while fewer members exist than the gang declares, one placeholder per missing member.
///
/// The placeholder is the largest request seen among the members, per resource. Missing members
/// are unknown; the largest present one is the smallest estimate no present member exceeds, and
/// it cannot be gamed by the order of creation (the first member's request can: start with a
/// CPU-only member and the rest of the gang would be reserved for free). A missing member that
/// turns out larger pays the difference when it is admitted. The charge never counts fewer than
/// the declared members, and every member that exists counts in full.
///
/// Cost: O(resources × log distinct requests) per change, never O(declared size).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GangTally {
    /// Members that hold or will hold devices: every non-finished member.
    pub members: u32,
    /// Members present for the gang's quorum and its declared size: not terminating.
    pub live: u32,
    /// The members' declared sizes, as a multiset (size → count): exact after removals.
    declared: BTreeMap<u32, u32>,
    /// Σ of the members' requests.
    sum: ResourceList,
    /// Per resource, the members' requests as a multiset (amount → count), for the largest.
    amounts: BTreeMap<String, BTreeMap<Quantity, u32>>,
}

impl GangTally {
    /// Counts one member in.
    pub fn add<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a str, Quantity)>,
        declared: Option<u32>,
        terminating: bool,
    ) {
        self.change(requests, declared, terminating, 1);
    }

    /// Counts one member out (as it was counted in).
    pub fn remove<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a str, Quantity)>,
        declared: Option<u32>,
        terminating: bool,
    ) {
        self.change(requests, declared, terminating, -1);
    }

    fn change<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a str, Quantity)>,
        declared: Option<u32>,
        terminating: bool,
        sign: i32,
    ) {
        let step = |n: u32| if sign > 0 { n.saturating_add(1) } else { n.saturating_sub(1) };
        self.members = step(self.members);
        if !terminating {
            self.live = step(self.live);
        }
        if let Some(size) = declared {
            multiset_step(&mut self.declared, size, sign);
        }
        for (name, q) in requests {
            let slot = self.sum.entry(name.to_string()).or_default();
            *slot = Quantity::from_nanos(slot.nanos().saturating_add(i128::from(sign) * q.nanos()));
            let amounts = self.amounts.entry(name.to_string()).or_default();
            multiset_step(amounts, q, sign);
            if amounts.is_empty() {
                self.amounts.remove(name);
            }
        }
        self.sum.retain(|_, q| q.nanos() != 0);
    }

    /// The size the gang declares: the largest its members declare (they must agree; admission
    /// denies those that do not), `None` when no member declares one (inferred gangs).
    pub fn declared(&self) -> Option<u32> {
        self.declared.keys().next_back().copied()
    }

    /// Members the declared size still lacks.
    pub fn missing(&self) -> u32 {
        self.declared().unwrap_or(0).saturating_sub(self.members)
    }

    /// What the missing members are charged: `missing × largest request`, one multiplication.
    pub fn placeholders(&self) -> ResourceList {
        let missing = i128::from(self.missing());
        if missing == 0 {
            return ResourceList::new();
        }
        self.amounts
            .iter()
            .filter_map(|(name, amounts)| {
                let largest = amounts.keys().next_back()?;
                Some((name.clone(), Quantity::from_nanos(largest.nanos().saturating_mul(missing))))
            })
            .filter(|(_, q)| q.nanos() != 0)
            .collect()
    }

    /// Everything the gang counts: its members' requests plus the placeholders.
    pub fn total(&self) -> ResourceList {
        let mut total = self.sum.clone();
        add_to(&mut total, &self.placeholders(), 1);
        total
    }
}

fn multiset_step<K: Ord>(set: &mut BTreeMap<K, u32>, key: K, sign: i32) {
    if sign > 0 {
        *set.entry(key).or_default() += 1;
    } else if let Some(n) = set.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            set.remove(&key);
        }
    }
}

/// `total += sign × list`, per resource (saturating; zero entries dropped).
pub fn add_to(total: &mut ResourceList, list: &ResourceList, sign: i128) {
    for (name, q) in list {
        let slot = total.entry(name.clone()).or_default();
        *slot = Quantity::from_nanos(slot.nanos().saturating_add(sign.saturating_mul(q.nanos())));
    }
    total.retain(|_, q| q.nanos() != 0);
}
