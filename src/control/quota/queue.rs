//! Queue-mode quotas: which quota-gated pods to release now, from the cluster view. Per team,
//! queued units (a gang whole, once all its members exist, or a single pod) go in order —
//! priority, then arrival (creation second, then the order Allot saw the pods in: never the
//! name; a gang's is its newest present member's, when it became complete) — while the team's usage (every non-finished pod not behind the quota gate) leaves
//! room. The order is strict: a unit that does not fit stops the team's queue, so a large job is
//! never starved by smaller ones behind it. A gang whose members do not all exist yet is not in
//! that line: it waits without holding anyone up (its assembly timeout is the gang plan's).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::control::cluster::action::{ControllerAction, QUEUED_REASON, refresh_secs};
use crate::control::cluster::records::condition_fingerprint;
use crate::control::cluster::usage::{admitted_by_team, requests_by_state};
use crate::control::cluster::{ClusterState, ClusterView, PodUid};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::cohort::{Cohort, CohortUsage};
use crate::model::policy::quota::{Charge, add};
use crate::model::policy::{PolicySet, QuotaMode};
use crate::model::resources::ResourceList;

use super::reclaim::{Memory as ReclaimMemory, Reclaim, ReclaimAsk, Reclaimer};

mod lines;
use lines::{Group, Line};

/// Plans the quota queue over a cluster view.
pub trait QuotaQueue {
    /// The gates to lift now (`ControllerAction::ReleaseQuota`), and for every pod left in the queue an
    /// explanation (`ControllerAction::Queued`) whenever it changes: `previous` holds the last one per pod
    /// (and is updated), so `kubectl describe` says why a pod waits without an Event on every
    /// pass. A pod's place in the queue or its gang's count of members, which every release
    /// ahead or member arriving changes, is rewritten at most every
    /// [`refresh_secs`] (`now`: seconds since the epoch); a pod told nothing yet is told
    /// at once.
    fn quota_plan(
        &self,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        previous: &mut HashMap<(String, String), Told>,
        now: i64,
    ) -> Vec<ControllerAction> {
        self.quota_pass(policies, labels, previous, &ReclaimMemory::default(), now).0
    }

    /// [`QuotaQueue::quota_plan`], and the reclaims of lent quota the queues call for
    /// ([`super::reclaim`], with what the leader remembers of those it carried out).
    fn quota_pass(
        &self,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        previous: &mut HashMap<(String, String), Told>,
        memory: &ReclaimMemory,
        now: i64,
    ) -> (Vec<ControllerAction>, Vec<Reclaim>);
}

/// What a queued pod was last told, and when (seconds since the epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct Told {
    pub message: String,
    pub at: i64,
    /// How long it keeps a place that has moved ([`refresh_secs`] of its team's queue then).
    pub every: i64,
    /// Its place has moved since, and it is told at [`Told::refresh_at`].
    pub behind: bool,
}

impl Told {
    /// When a pod held back from its new place is told it.
    pub fn refresh_at(&self) -> Option<i64> {
        self.behind.then(|| self.at.saturating_add(self.every))
    }
}

/// Explanations that only say where a pod stands, which every movement of its queue changes:
/// rewritten at most every [`refresh_secs`] (a queue of q pods draining would otherwise
/// cost q²/2 condition writes and Events).
const BEHIND: &str = "queued behind ";
const ASSEMBLING: &str = "gang has ";

/// Whether `new` only moves `old` along: both are a place in the queue, or both a gang's count.
fn only_moved(old: &str, new: &str) -> bool {
    [BEHIND, ASSEMBLING].iter().any(|kind| old.starts_with(kind) && new.starts_with(kind))
}

impl QuotaQueue for ClusterState {
    fn quota_pass(
        &self,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        previous: &mut HashMap<(String, String), Told>,
        memory: &ReclaimMemory,
        now: i64,
    ) -> (Vec<ControllerAction>, Vec<Reclaim>) {
        let view = self.view();
        let Queues { mut actions, teams, reclaim_asks } = queues(&view, policies, labels);
        let mut reclaims = super::reclaim::reclaims(&view, policies, labels, &reclaim_asks, memory, now);
        let deny_walk = super::reclaim::deny::walk_needed(&view, policies, labels);
        let (deny_reclaims, marks) = match deny_walk {
            true => super::reclaim::deny_pass(&view, policies, labels, memory, now),
            false => Default::default(),
        };
        reclaims.extend(deny_reclaims);
        actions.extend(marks);
        let units = teams.into_values().flat_map(|line| {
            // The pods of the team's queue a refresh may tell again.
            let every = refresh_secs(line.iter().filter(|u| u.waits.is_some()).map(|u| u.members.len()).sum());
            line.into_iter().map(move |unit| (unit, every))
        });
        for (unit, every) in units {
            match unit.waits {
                Some(message) => {
                    let written = condition_fingerprint(false, QUEUED_REASON, &message);
                    for m in unit.members {
                        let key = (m.namespace, m.pod);
                        let last = previous.get(&key);
                        let recent = last.is_some_and(|t| {
                            m.condition != 0 && only_moved(&t.message, &message) && now < t.at.saturating_add(t.every)
                        });
                        let changed = last.is_none_or(|t| t.message != message);
                        if let Some(told) = previous.get_mut(&key) {
                            // Held back: the controller looks again at the refresh.
                            told.behind = changed && recent;
                        }
                        if changed && !recent {
                            previous
                                .insert(key.clone(), Told { message: message.clone(), at: now, every, behind: false });
                            // The pod says so already (a new leader, or a resync).
                            if m.condition == written {
                                continue;
                            }
                            actions.push(ControllerAction::Queued {
                                namespace: key.0,
                                pod: key.1,
                                message: message.clone(),
                            });
                        }
                    }
                }
                None => {
                    for m in unit.members {
                        previous.remove(&(m.namespace.clone(), m.pod.clone()));
                        actions.push(ControllerAction::ReleaseQuota {
                            namespace: m.namespace,
                            pod: m.pod,
                            uid: m.uid.as_ref().map(PodUid::to_arc),
                            gate_index: m.gate_index,
                            has_annotations: m.has_annotations,
                            borrowed_from: unit.borrowed_from.clone(),
                        });
                    }
                }
            }
        }
        // Forget pods that left the queue some other way (deleted, gate removed by hand).
        previous.retain(|(ns, pod), _| view.pod(ns, pod).is_some_and(|p| p.quota_gate_index.is_some()));
        (actions, reclaims)
    }
}

/// Every queue-mode team's queue in order, each unit with its outcome: the one decision the
/// controller carries out ([`QuotaQueue::quota_plan`]) and `allot explain team` shows.
#[derive(Debug, Default)]
pub struct Queues<'p> {
    /// Quota gates nothing queues any more (the team left queue mode or has no quota): lifted.
    pub actions: Vec<ControllerAction>,
    /// Team → its units in queue order.
    pub teams: BTreeMap<String, Vec<QueuedUnit>>,
    /// Per cohort, its teams' units waiting for lent quota to come back ([`super::reclaim`]).
    pub reclaim_asks: Vec<ReclaimAsk<'p>>,
}

/// One unit of a team's queue (a gang whole, or one pod) and what the pass does with it.
#[derive(Debug, Clone)]
pub struct QueuedUnit {
    /// `gang/NAMESPACE/NAME` or `pod/NAMESPACE/NAME`.
    pub key: String,
    /// The highest priority among the members.
    pub priority: i32,
    /// The members behind the quota gate.
    pub members: Vec<QueuedMember>,
    /// What the unit counts against the quota (charge units).
    pub charge: Charge,
    /// The gang's declared size, if it is a gang.
    pub size: Option<u32>,
    /// `None`: released now; else why it waits (the message its members carry).
    pub waits: Option<String>,
    /// Released on quota borrowed from this cohort.
    pub borrowed_from: Option<String>,
}

/// A pod behind the quota gate.
#[derive(Debug, Clone)]
pub struct QueuedMember {
    pub namespace: String,
    pub pod: String,
    pub uid: Option<PodUid>,
    pub gate_index: usize,
    /// Whether it has annotations (the lift adds `allot.dev/quota-released` to them).
    pub has_annotations: bool,
    /// Fingerprint of its current `allot.dev/QuotaReady` condition.
    pub condition: u64,
}

/// The queues over one consistent view: per team, units by priority then arrival, each
/// released while the team's usage leaves room, until one does not fit (strict order). The
/// teams of a cohort are decided together ([`lines`]): a team may borrow what the others leave
/// unused.
pub fn queues<'p>(view: &ClusterView<'_>, policies: &'p PolicySet, labels: &dyn NamespaceLabels) -> Queues<'p> {
    let mut actions = Vec::new();
    let mut teams = TeamsByNamespace::new(policies, labels);
    let mut used = admitted_by_team(&requests_by_state(view), &mut teams);
    // Shared claims an admitted pod names are counted in `used` already (the view keeps who
    // holds each); so are those of units released earlier in this pass.
    let mut claimed: HashSet<(Arc<str>, Arc<str>)> = HashSet::new();
    let queued = queued_units(view, &mut teams, &mut actions);
    let mut lines: BTreeMap<&str, Line<'_>> = BTreeMap::new();
    for (team_name, units) in queued {
        let Some(quota) = policies.teams.iter().find(|t| t.name == team_name).and_then(|t| t.quota.as_ref()) else {
            continue;
        };
        let mut units: Vec<(String, Unit)> = units.into_iter().collect();
        units.sort_by(|a, b| {
            b.1.priority.cmp(&a.1.priority).then(a.1.order.cmp(&b.1.order)).then_with(|| a.0.cmp(&b.0))
        });
        let team_used = used.get(team_name).cloned().unwrap_or_default();
        lines.insert(team_name, Line::new(team_name, quota, units.into(), team_used));
    }
    let mut out = BTreeMap::new();
    // A cohort's teams together; each other team alone.
    let mut groups: Vec<(Option<&Cohort>, Vec<Line<'_>>)> = Vec::new();
    for cohort in policies.cohorts.iter() {
        let members: Vec<Line<'_>> = cohort.members.iter().filter_map(|m| lines.remove(m.team.as_str())).collect();
        if !members.is_empty() {
            groups.push((Some(cohort), members));
        }
    }
    groups.extend(lines.into_values().map(|line| (None, vec![line])));
    let mut reclaim_asks = Vec::new();
    for (cohort, mut members) in groups {
        let cohort = cohort.map(|c| CohortUsage::new(c, &mut |team| used.remove(team)));
        let after = Group { view, claimed: &mut claimed, cohort }.decide(&mut members);
        let reclaimers: Vec<(String, Reclaimer)> =
            members.iter_mut().filter_map(|l| Some((l.team.to_string(), l.reclaimer.take()?))).collect();
        if let Some(usage) = after.filter(|_| !reclaimers.is_empty()) {
            reclaim_asks.push(ReclaimAsk { usage, reclaimers });
        }
        for line in members {
            out.insert(line.team.to_string(), line.decided);
        }
    }
    Queues { actions, teams: out, reclaim_asks }
}

/// What goes through a team's queue at once: a gang (all its quota-gated members) or one pod.
struct Unit {
    /// The highest priority among the members.
    priority: i32,
    /// Its place in arrival order ([`crate::control::cluster::PodRecord::order_key`]): a pod's own; a
    /// gang's newest present member's, queued or not, i.e. when the gang became complete and
    /// could first go. Not its first member's: one placeholder created days before the rest
    /// would put the whole gang ahead of everything its team queued meanwhile.
    order: (i64, i64),
    /// `(namespace, gang)` for a gang's unit: where its newest member is looked up.
    gang: Option<(Arc<str>, String)>,
    members: Vec<QueuedMember>,
    /// What its members ask for themselves.
    charge: Charge,
    /// The shared claims its members name, by (namespace, claim), with their devices (resource
    /// terms): charged only where no admitted pod names them already.
    claims: BTreeMap<(Arc<str>, Arc<str>), ResourceList>,
    /// The gang's size, if it has one: the unit waits until all members exist.
    size: Option<u32>,
    /// Members of its gang present in all, queued or not (a launcher asking nothing the quota
    /// counts has no quota gate, yet is one of the gang's members); for a pod, 1.
    present: u32,
}

/// The quota-gated pods grouped into units per team (by unit key). A pod that nothing queues any
/// more (its team left queue mode, or its namespace changed team, since it was gated) is not
/// kept: its gate goes now (`actions`), since nobody else would lift it.
fn queued_units<'p>(
    view: &ClusterView<'_>,
    teams: &mut TeamsByNamespace<'p>,
    actions: &mut Vec<ControllerAction>,
) -> HashMap<&'p str, BTreeMap<String, Unit>> {
    let mut queued: HashMap<&'p str, BTreeMap<String, Unit>> = HashMap::new();
    // Only the queue's pods (present, quota-gated), kept by the view: a pod being deleted
    // leaves the queue, since it will not run and is no member of its gang.
    for p in view.quota_queue_pods() {
        let Some(gate_index) = p.quota_gate_index else { continue };
        let team = teams.get(&p.namespace).filter(|t| t.quota.as_ref().is_some_and(|q| q.mode == QuotaMode::Queue));
        let team_and_charge = team.and_then(|team| {
            let quota = team.quota.as_ref()?;
            let requests: ResourceList = p.requests.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            let asks_anything = !quota.charge(&requests).is_empty()
                || p.held_claims().iter().any(|c| !quota.charge(&c.device_list()).is_empty());
            Some((team, quota.charge(&requests))).filter(|_| asks_anything)
        });
        let Some((team, charge)) = team_and_charge else {
            actions.push(ControllerAction::ReleaseQuota {
                namespace: p.namespace.to_string(),
                pod: p.name.to_string(),
                uid: p.uid.as_ref().map(PodUid::to_arc),
                gate_index,
                has_annotations: p.has_annotations,
                borrowed_from: None,
            });
            continue;
        };
        let (key, size) = match &p.gang {
            Some(g) => (format!("gang/{}/{}", p.namespace, g.name), g.size),
            None => (format!("pod/{}/{}", p.namespace, p.name), None),
        };
        let unit = queued.entry(team.name.as_str()).or_default().entry(key).or_insert_with(|| Unit {
            priority: p.priority,
            order: p.order_key(),
            gang: p.gang.as_ref().map(|g| (p.namespace.clone(), g.name.clone())),
            members: Vec::new(),
            charge: Charge::new(),
            claims: BTreeMap::new(),
            size,
            present: p.gang.as_ref().map_or(1, |g| view.gang_present(&p.namespace, &g.name)),
        });
        unit.priority = unit.priority.max(p.priority);
        // Members recorded before their native PodGroup was known carry no size: any that does
        // sizes the unit.
        unit.size = unit.size.max(size);
        unit.order = unit.order.max(p.order_key());
        unit.members.push(QueuedMember {
            namespace: p.namespace.to_string(),
            pod: p.name.to_string(),
            uid: p.uid.clone(),
            gate_index,
            has_annotations: p.has_annotations,
            condition: p.quota_condition,
        });
        add(&mut unit.charge, &charge);
        for claim in p.held_claims() {
            unit.claims.entry((p.namespace.clone(), claim.name.clone())).or_insert_with(|| claim.device_list());
        }
    }
    // A gang's newest present member, whatever gate holds it (a launcher asking nothing the
    // quota counts has none, yet completes its gang when it comes).
    for unit in queued.values_mut().flat_map(BTreeMap::values_mut) {
        if let Some((namespace, gang)) = &unit.gang
            && let Some(at) = view.gang_pods(namespace, gang).filter(|p| p.present()).map(|p| p.order_key()).max()
        {
            unit.order = unit.order.max(at);
        }
    }
    queued
}

#[cfg(test)]
mod cohort_tests;
#[cfg(test)]
mod reclaim_tests;
#[cfg(test)]
mod tests;
