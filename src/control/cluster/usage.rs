//! Who uses what, from the cluster view: requests summed by namespace and by where the pods
//! stand ([`UsageState`]), what counts against each team's quota, and the per-team gauges that
//! `/metrics` publishes.

use std::collections::{BTreeMap, HashMap};

use super::store::{ClusterState, ClusterView};
pub use super::store::{Gate, GateGauge, RequestsByState, UsageState};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::PolicySet;
use crate::model::policy::quota::{Charge, Quota};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

impl ClusterState {
    /// The per-team accelerator gauges: for every team (`""` for namespaces of no team) and
    /// accelerator resource, what its non-finished pods request, by where they stand; and for
    /// every team with a quota, its limit and what counts against it now (queued pods excluded),
    /// in the quota's own units (GPU-equivalents where weights apply).
    pub fn accelerator_usage(&self, policies: &PolicySet, labels: &dyn NamespaceLabels) -> AcceleratorUsage {
        let sums = self.requests_by_state();
        let mut teams = TeamsByNamespace::new(policies, labels);
        let named = NamedResources::of(policies);
        let mut by_state: BTreeMap<(String, String, UsageState), i128> = BTreeMap::new();
        for ((namespace, state, name), nanos) in &sums {
            if policies.accelerators.matches(name) {
                let team_name = teams.get(namespace).map_or("", |t| t.name.as_str());
                let slot = by_state.entry((team_name.to_string(), named.label(name), *state)).or_default();
                *slot = slot.saturating_add(*nanos);
            }
        }
        let quota_used = admitted_by_team(&sums, &mut teams);
        let in_units = |quota: &Quota, units: i128| units as f64 / quota.denominator as f64 / 1e9;
        let exchanged = cohort_exchanges(policies, &quota_used);
        let mut quotas = Vec::new();
        for team in &policies.teams {
            let Some(quota) = &team.quota else { continue };
            for (resource, limit) in &quota.limits {
                let used = quota_used.get(team.name.as_str()).and_then(|c| c.get(resource)).copied().unwrap_or(0);
                let exchange = exchanged.get(&(team.name.as_str(), resource.as_str())).copied();
                quotas.push(QuotaGauge {
                    team: team.name.clone(),
                    resource: resource.clone(),
                    used: in_units(quota, used),
                    limit: in_units(quota, *limit),
                    borrowed_lent: exchange,
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

/// The accelerator names the policies write out, which may be metric label values as they
/// are. Any other name a pod asks is under a prefix (`nvidia.com/mig-*`): a tenant asking for
/// `nvidia.com/mig-x0001` … `x5000` (pods that never start, in a team without a quota) would
/// otherwise make a series of each, in every replica and in Prometheus.
struct NamedResources<'p> {
    exact: std::collections::HashSet<&'p str>,
    prefixes: &'p [String],
}

impl<'p> NamedResources<'p> {
    fn of(policies: &'p PolicySet) -> NamedResources<'p> {
        let (exact, prefixes) = policies.accelerators.patterns();
        let quotas = policies.teams.iter().filter_map(|t| t.quota.as_ref());
        let exact = exact
            .iter()
            .map(String::as_str)
            .chain(quotas.flat_map(|q| q.limits.keys().chain(q.equivalents.keys()).map(String::as_str)))
            .chain(policies.device_classes.iter().map(|(_, w)| w.counts_as.as_str()))
            .collect();
        NamedResources { exact, prefixes }
    }

    fn label(&self, name: &str) -> String {
        if self.exact.contains(name) {
            return name.to_string();
        }
        match self.prefixes.iter().filter(|p| name.starts_with(p.as_str())).max_by_key(|p| p.len()) {
            Some(prefix) => format!("{prefix}*"),
            None => name.to_string(),
        }
    }
}

/// Requests of the non-finished pods, summed per (namespace, state, resource), as the store
/// keeps them (O(entries), consistent with the view's pods: the same lock).
///
/// A shared ResourceClaim's devices count once per namespace, in the most advanced state of the
/// pods that name it (bound before pending before gated before queued): a claim a running pod
/// holds is in use whoever else waits on it. Its devices are those its holder whose name sorts
/// first records (should holders disagree), so that the sums depend only on who holds it now.
pub fn requests_by_state(view: &ClusterView<'_>) -> RequestsByState {
    view.requests_by_state()
}

/// [`requests_by_state`] recounted by walking every pod: the reference the store's sums are
/// tested against, and the baseline the scrape bench compares them with.
#[doc(hidden)]
pub fn recount_requests_by_state(view: &ClusterView<'_>) -> RequestsByState {
    let mut sums = RequestsByState::new();
    let mut claims: HashMap<super::records::ClaimId, (UsageState, &str, &super::records::ClaimDevices)> =
        HashMap::new();
    for p in view.pods().filter(|p| !p.finished) {
        let state = UsageState::of(p);
        for (name, q) in &p.requests {
            let slot = sums.entry((p.namespace.clone(), state, name.clone())).or_default();
            *slot = slot.saturating_add(q.nanos());
        }
        for claim in p.held_claims() {
            let slot =
                claims.entry((p.namespace.clone(), claim.name.clone())).or_insert((state, &p.name, &claim.devices));
            slot.0 = slot.0.min(state);
            if *p.name < *slot.1 {
                (slot.1, slot.2) = (&p.name, &claim.devices);
            }
        }
    }
    for ((namespace, _), (state, _, devices)) in claims {
        for (name, q) in devices {
            let slot = sums.entry((namespace.clone(), state, name.clone())).or_default();
            *slot = slot.saturating_add(q.nanos());
        }
    }
    sums
}

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
    /// For a team in a cohort: what it uses beyond its nominal quota, and what of its unused
    /// nominal others use.
    pub borrowed_lent: Option<(f64, f64)>,
}

/// (team, resource) → (borrowed, lent), in resource terms, for every team in a cohort.
fn cohort_exchanges<'p>(
    policies: &'p PolicySet,
    used: &HashMap<&'p str, Charge>,
) -> HashMap<(&'p str, &'p str), (f64, f64)> {
    let mut out = HashMap::new();
    for cohort in policies.cohorts.iter() {
        let usage = crate::model::policy::cohort::CohortUsage::new(cohort, &mut |team| used.get(team).cloned());
        let lent = usage.lent();
        let in_units = |units: i128| units as f64 / cohort.denominator as f64 / 1e9;
        for member in &cohort.members {
            let borrowed = usage.borrowed(&member.team);
            for resource in member.nominal.keys() {
                let of = |c: Option<&Charge>| in_units(c.and_then(|c| c.get(resource)).copied().unwrap_or(0));
                out.insert(
                    (member.team.as_str(), resource.as_str()),
                    (of(Some(&borrowed)), of(lent.get(&member.team))),
                );
            }
        }
    }
    out
}

/// Everything [`ClusterState::accelerator_usage`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceleratorUsage {
    pub requested: Vec<AcceleratorGauge>,
    pub quotas: Vec<QuotaGauge>,
}

/// [`ClusterState::gate_gauges`] recounted by walking every pod: the reference the store's
/// gate counts are tested against, and the baseline the scrape bench compares them with.
#[doc(hidden)]
pub fn recount_gate_gauges(view: &ClusterView<'_>, now: i64) -> Vec<GateGauge> {
    let mut held = [(0u64, None::<i64>); Gate::ALL.len()];
    for p in view.pods().filter(|p| !p.finished && !p.terminating) {
        for (slot, gate) in held.iter_mut().zip(Gate::ALL) {
            if gate.holds(p) {
                slot.0 += 1;
                slot.1 = Some(slot.1.map_or(p.created, |c| c.min(p.created)));
            }
        }
    }
    held.iter().zip(Gate::ALL).map(|(&(pods, oldest), gate)| GateGauge::at(gate, pods, oldest, now)).collect()
}

#[cfg(test)]
mod tests;
