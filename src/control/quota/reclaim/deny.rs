//! Reclaiming in deny mode. There, admission admits a lender's pod within its team's nominal
//! quota even when that quota is lent out (it is never refused for usage on loan), and the pod
//! waits unscheduled while borrowed work holds the devices. This finds such pods and asks the
//! reclaim ([`super::reclaims_with`]) for them, as the queue pass does for queued ones:
//!
//! - a team's usage is every live pod of it that is not such a waiting lender pod: running,
//!   terminating (it still holds its devices) or pending beyond its nominal quota (borrowed);
//! - a waiting lender pod is a plain pod of a deny-mode cohort's team, not bound to a node, not
//!   behind any scheduling gate, not terminating, that its team's usage takes within its nominal
//!   quota (its team's pods in priority order, the oldest first);
//! - a borrowing team's pods that wait unscheduled are candidates before its running ones
//!   (evicting them loses no work): were they left, the room a reclaim makes would go to them,
//!   the older pods in the scheduler's queue, rather than to the lender, and the next pass would
//!   reclaim again. Made again by their owner, they are refused at admission while the lender's
//!   pods fill the cohort;
//! - pods the scheduler's own preemption is evicting (a lender's pod of higher priority than
//!   borrowed work gets room that way, its gate not hiding it here) count as gone: the room is
//!   not made twice.
//!
//! Gangs are not lenders here (a deny-mode gang waits behind its gang gate until it fits the
//! nodes, which borrowed work may prevent; the gang-aware preemption is what frees room then).

use std::collections::{BTreeMap, HashMap};

use super::{ReclaimAsk, Reclaimer};
use crate::control::cluster::{ClusterView, DisruptionCause, PodRecord};
use crate::control::gang::decision::{RunningPod, RunningUnit, UnitKey};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::cohort::{Cohort, CohortUsage};
use crate::model::policy::quota::{Charge, add};
use crate::model::policy::{PolicySet, QuotaMode};
use crate::model::resources::ResourceList;

/// The deny-mode cohorts' asks, and their borrowing teams' unscheduled pods as candidates.
pub struct DenyAsks<'p> {
    pub asks: Vec<ReclaimAsk<'p>>,
    pub pending: Vec<RunningUnit>,
}

/// Whether any cohort of `policies` is in deny mode (only then is there anything to look at).
pub fn any(policies: &PolicySet) -> bool {
    policies.cohorts.iter().any(is_deny)
}

fn is_deny(cohort: &Cohort) -> bool {
    cohort.members.first().is_some_and(|m| m.quota.mode == QuotaMode::Deny)
}

/// A pod of a cohort's team, as the walk found it.
struct Seen<'v> {
    pod: &'v PodRecord,
    requests: ResourceList,
    waiting: bool,
}

/// The asks of every deny-mode cohort in `view` (a walk over every pod, only when one exists).
pub fn asks<'p>(view: &ClusterView<'_>, policies: &'p PolicySet, labels: &dyn NamespaceLabels) -> DenyAsks<'p> {
    let cohorts: Vec<&'p Cohort> = policies.cohorts.iter().filter(|c| is_deny(c)).collect();
    let mut out = DenyAsks { asks: Vec::new(), pending: Vec::new() };
    if cohorts.is_empty() {
        return out;
    }
    let in_cohort: HashMap<&str, usize> =
        cohorts.iter().enumerate().flat_map(|(i, c)| c.members.iter().map(move |m| (m.team.as_str(), i))).collect();
    let mut teams = TeamsByNamespace::new(policies, labels);
    let mut by_team: BTreeMap<&str, Vec<Seen<'_>>> = BTreeMap::new();
    for pod in view.pods().filter(|p| !p.finished) {
        let Some(team) = teams.get(&pod.namespace) else { continue };
        let Some((name, _)) = in_cohort.get_key_value(team.name.as_str()) else { continue };
        // The scheduler's preemption already makes room with it (for a pod of higher priority):
        // counted as gone, so the room is not made twice.
        if pod.disruption == Some(DisruptionCause::PreemptionByScheduler) {
            continue;
        }
        let waiting = pod.node_name.is_none()
            && !pod.terminating
            && pod.gate_index.is_none()
            && pod.quota_gate_index.is_none()
            && !pod.other_gates
            && pod.gang.is_none();
        let requests = pod.request_pairs().map(|(k, v)| (k.to_string(), v)).collect();
        by_team.entry(name).or_default().push(Seen { pod, requests, waiting });
    }
    for cohort in cohorts {
        let mut used: BTreeMap<&str, Charge> = BTreeMap::new();
        let mut reclaimers = Vec::new();
        for member in &cohort.members {
            let mut seen = by_team.remove(member.team.as_str()).unwrap_or_default();
            seen.sort_by(|a, b| {
                (b.pod.priority.cmp(&a.pod.priority))
                    .then(a.pod.created.cmp(&b.pod.created))
                    .then(a.pod.arrival.cmp(&b.pod.arrival))
                    .then(a.pod.name.cmp(&b.pod.name))
            });
            let quota = &member.quota;
            let mut usage = Charge::new();
            for s in seen.iter().filter(|s| !s.waiting) {
                add(&mut usage, &quota.charge(&s.requests));
            }
            // A waiting pod is a lender's only while the team's usage with it and the lender pods
            // before it stays within its nominal quota (a reclaim gives the nominal quota back,
            // never room to borrow). The team's other waiting pods borrow: they count, and are
            // candidates first, unless the team has lender pods (they wait behind those).
            let (mut claimed, mut lenders, mut borrowing) = (usage.clone(), 0, Vec::new());
            for s in seen.iter().filter(|s| s.waiting) {
                let charge = quota.charge(&s.requests);
                let mut after = claimed.clone();
                add(&mut after, &charge);
                let within = after.iter().all(|(r, v)| *v <= quota.limits.get(r).copied().unwrap_or(0));
                if within && !charge.is_empty() {
                    claimed = after;
                    lenders += 1;
                    reclaimers.push((member.team.clone(), reclaimer(s.pod, charge)));
                } else {
                    borrowing.push((s, charge));
                }
            }
            if lenders == 0 {
                for (s, charge) in borrowing {
                    add(&mut usage, &charge);
                    out.pending.push(pending_unit(s.pod, &member.team, &s.requests));
                }
            }
            used.insert(member.team.as_str(), usage);
        }
        if !reclaimers.is_empty() {
            let usage = CohortUsage::new(cohort, &mut |team| used.get(team).cloned());
            out.asks.push(ReclaimAsk { usage, reclaimers });
        }
    }
    out
}

fn reclaimer(pod: &PodRecord, charge: Charge) -> Reclaimer {
    Reclaimer {
        unit: format!("pod/{}/{}", pod.namespace, pod.name),
        charge,
        first_member: Some((pod.namespace.to_string(), pod.name.to_string())),
    }
}

/// An unscheduled pod as a reclaim's candidate: nothing runs, so no `minRuntime` protects it,
/// and it counts as the newest of its priority (taken before running work).
fn pending_unit(pod: &PodRecord, team: &str, requests: &ResourceList) -> RunningUnit {
    RunningUnit {
        key: UnitKey::Pod { namespace: pod.namespace.to_string(), name: pod.name.to_string() },
        team: Some(team.to_string()),
        priority: pod.priority,
        started: i64::MAX,
        evictable_from: i64::MIN,
        pods: vec![RunningPod {
            namespace: pod.namespace.to_string(),
            name: pod.name.to_string(),
            uid: pod.uid.clone(),
            node: String::new(),
            requests: requests.clone(),
        }],
    }
}

#[cfg(test)]
#[path = "deny_tests.rs"]
mod tests;
