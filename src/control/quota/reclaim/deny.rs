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
//! A gang is a lender's unit once all its members are there, behind Allot's gang gate alone
//! (admitted, waiting to fit the nodes): it reclaims whole, for all its members, and a
//! borrowing team's complete gated gang is a candidate whole. While its reclaim is in flight,
//! the gang-aware preemption does not also make room for it ([`super::Memory::reclaiming`]).

use std::collections::{BTreeMap, HashSet};

use super::{ReclaimAsk, Reclaimer};
use crate::control::cluster::{ClusterView, ControllerAction, DisruptionCause, PodRecord, PodUid};
use crate::control::gang::decision::{GangKey, RunningPod, RunningUnit, UnitKey};
use crate::model::namespaces::{NamespaceLabels, team_of};
use crate::model::policy::cohort::{Cohort, CohortUsage, Member};
use crate::model::policy::quota::{Charge, Quota, add};
use crate::model::policy::{PolicySet, QuotaMode};
use crate::model::resources::ResourceList;

/// The deny-mode cohorts' asks, their borrowing teams' unscheduled pods as candidates, and the
/// borrowed marks to write.
pub struct DenyAsks<'p> {
    pub asks: Vec<ReclaimAsk<'p>>,
    pub pending: Vec<RunningUnit>,
    pub marks: Vec<ControllerAction>,
}

/// The most borrowed marks one pass writes: a new leader on a cluster with thousands of
/// borrowed pods unmarked writes them a batch at a time (the writes' own watch events bring
/// the next pass, which sends the next batch: each pod is marked on its record when sent).
pub const MARKS_PER_PASS: usize = 256;

/// Whether any cohort of `policies` is in deny mode (only then is there anything to look at).
pub fn any(policies: &PolicySet) -> bool {
    policies.cohorts.iter().any(is_deny)
}

fn is_deny(cohort: &Cohort) -> bool {
    cohort.members.first().is_some_and(|m| m.quota.mode == QuotaMode::Deny)
}

/// Whether the deny-mode cohorts need this pass's walk over their teams' pods: a team uses
/// more than its nominal quota (work a lender may reclaim, pods to mark), or a pod of theirs
/// still carries the borrowed mark (to take off). Otherwise nobody borrows, nothing is to be
/// reclaimed or marked, and the pass reads only the sums the store keeps: O(namespaces), not
/// O(pods). (Those sums count every live pod and a gang's missing members: never less than
/// the walk, so a borrowing the walk would see is never skipped.)
pub fn walk_needed(view: &ClusterView<'_>, policies: &PolicySet, labels: &dyn NamespaceLabels) -> bool {
    let members: Vec<&Member> = policies.cohorts.iter().filter(|c| is_deny(c)).flat_map(|c| &c.members).collect();
    if members.is_empty() {
        return false;
    }
    let index = |ns: &str| {
        let team = team_of(policies, ns, labels).team?;
        members.iter().position(|m| m.team == team.name)
    };
    if view.borrowed_marks().any(|(ns, n)| n > 0 && index(ns).is_some()) {
        return true;
    }
    let usage = view.usage_by_group(&mut |ns| index(ns), members.len());
    members.iter().zip(usage).any(|(member, (used, _))| {
        let quota = &member.quota;
        quota.charge(&used).iter().any(|(r, v)| *v > quota.limits.get(r).copied().unwrap_or(0))
    })
}

/// What a cohort's team has, as the walk found it: a pod, or a complete gang behind Allot's
/// gang gate (one unit: it waits, or borrows, whole).
struct Seen<'v> {
    /// The pod, or the gang's newest member (what the gang ranks by: it became whole then).
    pod: &'v PodRecord,
    /// A gang's members, by name (empty for a pod).
    members: Vec<&'v PodRecord>,
    requests: ResourceList,
    waiting: bool,
}

impl<'v> Seen<'v> {
    fn pod(pod: &'v PodRecord, waiting: bool) -> Seen<'v> {
        Seen { pod, members: Vec::new(), requests: pod.request_list(), waiting }
    }

    /// A complete gang waiting for the nodes (`members` not empty).
    fn gang(mut members: Vec<&'v PodRecord>) -> Option<Seen<'v>> {
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let pod = *members.iter().max_by(|a, b| a.created.cmp(&b.created).then(a.arrival.cmp(&b.arrival)))?;
        let mut requests = ResourceList::new();
        for member in &members {
            crate::model::resources::add_into(&mut requests, &member.request_list());
        }
        Some(Seen { pod, members, requests, waiting: true })
    }

    /// Its pods: the pod, or the gang's members.
    fn pods(&self) -> Vec<&'v PodRecord> {
        if self.members.is_empty() { vec![self.pod] } else { self.members.clone() }
    }

    fn gang_key(&self) -> Option<GangKey> {
        let gang = self.pod.gang.as_ref().filter(|_| !self.members.is_empty())?;
        Some(GangKey { namespace: self.pod.namespace.to_string(), name: gang.name.clone() })
    }
}

/// A pod's Allot gang: (namespace, name).
fn gang_of(pod: &PodRecord) -> Option<(&str, &str)> {
    pod.gang.as_ref().filter(|g| !g.native).map(|g| (&*pod.namespace, g.name.as_str()))
}

/// A gang member waiting behind Allot's gang gate alone (admitted, not released, not bound):
/// its gang and its size (the members' own, or their owner's for an inferred gang).
fn gang_gated<'v>(view: &'v ClusterView<'_>, pod: &'v PodRecord) -> Option<(&'v str, Option<u32>)> {
    let gang = pod.gang.as_ref().filter(|g| !g.native)?;
    let alone = pod.gate_index.is_some()
        && pod.node_name.is_none()
        && !pod.terminating
        && pod.quota_gate_index.is_none()
        && !pod.other_gates;
    alone.then(|| (gang.name.as_str(), gang.declared_size(view.owner_gang(&pod.namespace, &gang.name))))
}

/// The asks of every deny-mode cohort in `view` (a walk over the pods of its teams' namespaces,
/// only when one exists).
pub fn asks<'p>(view: &ClusterView<'_>, policies: &'p PolicySet, labels: &dyn NamespaceLabels) -> DenyAsks<'p> {
    let cohorts: Vec<&'p Cohort> = policies.cohorts.iter().filter(|c| is_deny(c)).collect();
    let mut out = DenyAsks { asks: Vec::new(), pending: Vec::new(), marks: Vec::new() };
    if cohorts.is_empty() {
        return out;
    }
    let mut by_team = walk(view, policies, labels, &cohorts);
    for cohort in cohorts {
        let mut used: BTreeMap<&str, Charge> = BTreeMap::new();
        let mut reclaimers = Vec::new();
        for member in &cohort.members {
            let seen = by_team.remove(member.team.as_str()).unwrap_or_default();
            let Split { mut usage, lenders, borrowing, borrowed } = split(&member.quota, seen);
            let room = MARKS_PER_PASS.saturating_sub(out.marks.len());
            out.marks.extend(marks(&cohort.name, &borrowed).take(room));
            if lenders.is_empty() {
                for (s, charge) in borrowing {
                    add(&mut usage, &charge);
                    out.pending.push(pending_unit(&s, &member.team));
                }
            }
            reclaimers.extend(lenders.into_iter().map(|r| (member.team.clone(), r)));
            used.insert(member.team.as_str(), usage);
        }
        if !reclaimers.is_empty() {
            let usage = CohortUsage::new(cohort, &mut |team| used.get(team).cloned());
            out.asks.push(ReclaimAsk { usage, reclaimers });
        }
    }
    out
}

/// The pods (and complete gated gangs) of the deny-mode cohorts' teams, by team.
fn walk<'v>(
    view: &'v ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    cohorts: &[&Cohort],
) -> BTreeMap<String, Vec<Seen<'v>>> {
    let in_cohort: HashSet<&str> = cohorts.iter().flat_map(|c| c.members.iter().map(|m| m.team.as_str())).collect();
    let mut by_team: BTreeMap<String, Vec<Seen<'v>>> = BTreeMap::new();
    type Gated<'v> = (Option<u32>, Vec<&'v PodRecord>);
    let mut gated: BTreeMap<(String, &'v str, &'v str), Gated<'v>> = BTreeMap::new();
    // Only the namespaces of the cohorts' teams are walked (the store keeps pods by namespace).
    for namespace in view.pod_namespaces() {
        let team = team_of(policies, namespace, labels).team.filter(|t| in_cohort.contains(t.name.as_str()));
        let Some(team) = team else { continue };
        let seen = by_team.entry(team.name.clone()).or_default();
        for pod in view.pods_in(namespace).filter(|p| !p.finished) {
            // The scheduler's preemption already makes room with it (for a pod of higher
            // priority): counted as gone, so the room is not made twice.
            if pod.disruption == Some(DisruptionCause::PreemptionByScheduler) {
                continue;
            }
            if let Some((gang, size)) = gang_gated(view, pod) {
                let entry = gated.entry((team.name.clone(), namespace, gang)).or_default();
                entry.0 = entry.0.or(size);
                entry.1.push(pod);
                continue;
            }
            let waiting = pod.node_name.is_none()
                && !pod.terminating
                && pod.gate_index.is_none()
                && pod.quota_gate_index.is_none()
                && !pod.other_gates
                && pod.gang.is_none();
            seen.push(Seen::pod(pod, waiting));
        }
    }
    // A gang waits for the nodes once all its members are there; until then they are usage.
    for ((team, _, _), (size, members)) in gated {
        let seen = by_team.entry(team).or_default();
        let complete = size.is_some_and(|n| usize::try_from(n).is_ok_and(|n| n == members.len()));
        match complete.then(|| Seen::gang(members.clone())).flatten() {
            Some(gang) => seen.push(gang),
            None => seen.extend(members.into_iter().map(|m| Seen::pod(m, false))),
        }
    }
    by_team
}

/// One team's units, split.
struct Split<'v> {
    /// What it uses: everything that does not wait as a lender's.
    usage: Charge,
    /// Its lenders' units: waiting within its nominal quota.
    lenders: Vec<Reclaimer>,
    /// Its waiting units beyond its nominal quota, each with its charge.
    borrowing: Vec<(Seen<'v>, Charge)>,
    /// Every pod of it, and whether it is beyond the team's nominal quota (borrowed).
    borrowed: Vec<(&'v PodRecord, bool)>,
}

/// Splits a team's units (see [`Split`]), in priority order, the oldest first: what comes
/// first is the team's own, what runs past its nominal quota (the newest, lowest priority:
/// what a reclaim takes first) is borrowed.
fn split<'v>(quota: &Quota, mut seen: Vec<Seen<'v>>) -> Split<'v> {
    seen.sort_by(|a, b| {
        (b.pod.priority.cmp(&a.pod.priority))
            .then(a.pod.created.cmp(&b.pod.created))
            .then(a.pod.arrival.cmp(&b.pod.arrival))
            .then(a.pod.name.cmp(&b.pod.name))
    });
    let beyond = |used: &Charge, charge: &Charge| {
        charge
            .iter()
            .any(|(r, v)| *v > 0 && used.get(r).copied().unwrap_or(0) > quota.limits.get(r).copied().unwrap_or(0))
    };
    let mut out = Split { usage: Charge::new(), lenders: Vec::new(), borrowing: Vec::new(), borrowed: Vec::new() };
    for s in seen.iter().filter(|s| !s.waiting) {
        let charge = quota.charge(&s.requests);
        add(&mut out.usage, &charge);
        out.borrowed.push((s.pod, beyond(&out.usage, &charge)));
    }
    // A gang runs on borrowed quota whole if any member does (a reclaim takes it whole).
    let borrowing_gangs: HashSet<(&str, &str)> =
        out.borrowed.iter().filter(|(_, b)| *b).filter_map(|(p, _)| gang_of(p)).collect();
    for (pod, borrowed) in &mut out.borrowed {
        *borrowed |= gang_of(pod).is_some_and(|g| borrowing_gangs.contains(&g));
    }
    // A waiting unit is a lender's only while the team's usage with it and the lender units
    // before it stays within its nominal quota (a reclaim gives the nominal quota back, never
    // room to borrow). The team's other waiting units borrow: they count, and are candidates
    // first, unless the team has lender units (they wait behind those).
    let mut claimed = out.usage.clone();
    for s in seen.into_iter().filter(|s| s.waiting) {
        let charge = quota.charge(&s.requests);
        let mut after = claimed.clone();
        add(&mut after, &charge);
        let within = after.iter().all(|(r, v)| *v <= quota.limits.get(r).copied().unwrap_or(0));
        out.borrowed.extend(s.pods().into_iter().map(|p| (p, !within)));
        if within && !charge.is_empty() {
            claimed = after;
            out.lenders.push(reclaimer(&s, charge));
        } else {
            out.borrowing.push((s, charge));
        }
    }
    out
}

/// The writes that bring `allot.dev/borrowed-from` in step with `borrowed` (a pod being
/// deleted is left as it is).
fn marks(cohort: &str, borrowed: &[(&PodRecord, bool)]) -> impl Iterator<Item = ControllerAction> {
    borrowed.iter().filter(|(pod, b)| pod.borrowed_mark != *b && !pod.terminating).map(move |(pod, b)| {
        ControllerAction::MarkBorrowed {
            namespace: pod.namespace.to_string(),
            pod: pod.name.to_string(),
            uid: pod.uid.as_ref().map(PodUid::to_arc),
            cohort: b.then(|| cohort.to_string()),
        }
    })
}

fn reclaimer(seen: &Seen<'_>, charge: Charge) -> Reclaimer {
    let first = seen.members.first().copied().unwrap_or(seen.pod);
    let unit = match seen.gang_key() {
        Some(gang) => format!("gang/{gang}"),
        None => format!("pod/{}/{}", seen.pod.namespace, seen.pod.name),
    };
    Reclaimer { unit, charge, first_member: Some((first.namespace.to_string(), first.name.to_string())) }
}

/// A borrowing team's waiting unit as a reclaim's candidate: never started, so it loses no
/// work (a gang whole).
fn pending_unit(seen: &Seen<'_>, team: &str) -> RunningUnit {
    let pods = seen.pods();
    let key = match seen.gang_key() {
        Some(gang) => UnitKey::Gang(gang),
        None => UnitKey::Pod { namespace: seen.pod.namespace.to_string(), name: seen.pod.name.to_string() },
    };
    RunningUnit {
        key,
        team: Some(team.to_string()),
        priority: pods.iter().map(|p| p.priority).max().unwrap_or(seen.pod.priority),
        started: i64::MAX,
        evictable_from: i64::MIN,
        pods: pods
            .into_iter()
            .map(|pod| RunningPod {
                namespace: pod.namespace.to_string(),
                name: pod.name.to_string(),
                uid: pod.uid.clone(),
                node: String::new(),
                requests: pod.request_list(),
            })
            .collect(),
    }
}

#[cfg(test)]
#[path = "deny_tests.rs"]
mod tests;
