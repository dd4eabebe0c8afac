//! `allot explain pod|gang|team NAME`: "why is my pod waiting?", answered from the live cluster
//! by the controller's own decision code, never a second implementation. The cluster is read
//! into the very [`ClusterState`] the controller's watches fill ([`live`]); the gang answer is
//! [`crate::control::gang::decision::explain`] over the controller's [`GangSnapshot`] (the same pass as
//! `decide`, looked at when it reaches the gang), the queue answer is
//! [`crate::control::quota::queue::queues`], the one the controller carries out.
//!
//! This module is pure: [`Inputs`] in, a [`Report`] out; [`render`] prints it as text or JSON.
//!
//! **JSON** (`-o json`, stable; fields are only ever added): one object with `kind` `Pod`,
//! `Gang` or `Team`, camelCase fields as in [`PodReport`], [`GangReport`], [`TeamReport`];
//! quantities are strings (`"4"`, `"500m"`), times are seconds since the epoch. `notes` says
//! what could not be read (a tenant who cannot list nodes) and so what the answer leaves out.

pub mod live;
pub mod render;
mod report;
pub mod victims;

pub use report::{
    Assembly, ConditionReport, DecisionReport, GangReport, LimitReport, MemberReport, NamespaceUsage, NeedReport,
    NodeReport, PodReport, PodUsage, QueueEntry, QuotaReport, Report, Short, Start, TeamReport,
};

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Pod;

use crate::control::cluster::usage::requests_by_state;
use crate::control::cluster::{CONDITION, ClusterState, PodRecord, QUOTA_CONDITION, UsageState};
use crate::control::gang::decision::{self, GangKey, Need, Verdict};
use crate::control::gang::plan::{TIMEOUT_REASON, condition_reason};
use crate::control::gang::snapshot::GangSnapshot;
use crate::control::quota::queue::queues;
use crate::model::gang::membership::{GATE, QUOTA_GATE};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::{OnStartTimeout, OnTimeout, PolicySet, QuotaMode};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

/// What `allot explain` is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Pod,
    Gang,
    Team,
}

/// Why an explanation cannot be given at all.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("pod {namespace}/{name} not found{hint}")]
    PodNotFound { namespace: String, name: String, hint: String },
    #[error(
        "no pod of gang {namespace}/{name} found (a gang is named by the allot.dev/gang-name label, a Kueue pod group or its owner){hint}"
    )]
    GangNotFound { namespace: String, name: String, hint: String },
    #[error("no team {name} in the policies; teams: {teams}")]
    TeamNotFound { name: String, teams: String },
}

/// What the builders read: the cluster view and policies, the time, the few pod fields the view
/// does not keep (gates by name, phase, Allot's conditions), and what could not be read.
pub struct Inputs<'a> {
    pub state: &'a ClusterState,
    pub policies: &'a PolicySet,
    pub labels: &'a dyn NamespaceLabels,
    /// Seconds since the epoch.
    pub now: i64,
    /// `(namespace, name)` → what the view does not keep, for the pods of the namespaces asked
    /// about.
    pub pods: &'a HashMap<(String, String), PodStatus>,
    pub visibility: &'a Visibility,
}

/// What could not be read, and why (the API's answer): the report says so instead of guessing.
#[derive(Debug, Clone, Default)]
pub struct Visibility {
    /// Nodes could not be listed: placement is not evaluated.
    pub nodes: Option<String>,
    /// Pods of other namespaces could not be listed: node usage and team usage count only the
    /// pods that could be.
    pub all_pods: Option<String>,
    /// Namespaces could not be listed: Team label selectors cannot match.
    pub namespaces: Option<String>,
    /// DRA ResourceClaims or ResourceClaimTemplates could not be listed (with DeviceClasses
    /// mapped): the devices pods ask through them are not counted.
    pub claims: Option<String>,
    /// DeviceClasses or ResourceSlices could not be listed (with DeviceClasses mapped): the
    /// gang fit leaves claim devices out, as the controller does before it has read them.
    pub devices: Option<String>,
    /// Native PodGroups could not be listed (where served): their members' quota groups are of
    /// unknown size, each member counted alone.
    pub pod_groups: Option<String>,
}

/// The pod fields the view does not keep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodStatus {
    pub phase: Option<String>,
    pub gates: Vec<String>,
    /// Allot's two conditions, as the controller last wrote them.
    pub conditions: Vec<ConditionReport>,
}

impl PodStatus {
    pub fn of(pod: &Pod) -> PodStatus {
        let status = pod.status.as_ref();
        PodStatus {
            phase: status.and_then(|s| s.phase.clone()),
            gates: pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .map(|g| g.iter().map(|g| g.name.clone()).collect())
                .unwrap_or_default(),
            conditions: status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .filter(|c| c.type_ == CONDITION || c.type_ == QUOTA_CONDITION)
                .map(|c| ConditionReport {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                })
                .collect(),
        }
    }
}

/// Pods listed in a team's answer.
pub const TOP_PODS: usize = 10;

/// Builds the answer for one subject.
pub fn explain(inputs: &Inputs<'_>, subject: Subject, namespace: &str, name: &str) -> Result<Report, ExplainError> {
    match subject {
        Subject::Pod => explain_pod(inputs, namespace, name).map(Report::Pod),
        Subject::Gang => explain_gang(inputs, namespace, name).map(Report::Gang),
        Subject::Team => explain_team(inputs, name).map(Report::Team),
    }
}

/// A hint for "not found" when not every pod could be listed.
fn visibility_hint(inputs: &Inputs<'_>) -> String {
    inputs
        .visibility
        .all_pods
        .as_ref()
        .map(|why| format!(" (only this namespace was listed: {why})"))
        .unwrap_or_default()
}

/// What the visibility limits leave out, as notes.
fn visibility_notes(inputs: &Inputs<'_>, gang: bool) -> Vec<String> {
    let v = inputs.visibility;
    let mut notes = Vec::new();
    if let Some(why) = &v.nodes
        && gang
    {
        notes.push(format!(
            "cannot list nodes ({why}): placement is not evaluated; the GangReady condition is the controller's answer"
        ));
    }
    if let Some(why) = &v.all_pods {
        notes.push(format!("cannot list pods in all namespaces ({why}): usage counts only the pods listed here"));
    }
    if let Some(why) = &v.namespaces
        && inputs.policies.teams.iter().any(|t| t.selector.is_some())
    {
        notes.push(format!("cannot list namespaces ({why}): teams that select namespaces by label are not matched"));
    }
    if let Some(why) = &v.devices
        && gang
    {
        notes.push(format!(
            "cannot list DeviceClasses or ResourceSlices ({why}): the fit leaves DRA claim devices out; the GangReady condition is the controller's answer"
        ));
    }
    if let Some(why) = &v.pod_groups {
        notes.push(format!(
            "cannot list native PodGroups ({why}): their members are counted one by one, not as whole groups"
        ));
    }
    if let Some(why) = &v.claims {
        notes.push(format!(
            "DRA claims not fully listed ({why}): accelerators pods ask through the claims not listed are not counted"
        ));
    }
    notes
}

fn team_name(inputs: &Inputs<'_>, namespace: &str) -> Option<String> {
    crate::model::namespaces::team_of(inputs.policies, namespace, inputs.labels).team.map(|t| t.name.clone())
}

fn explain_pod(inputs: &Inputs<'_>, namespace: &str, name: &str) -> Result<PodReport, ExplainError> {
    let view = inputs.state.view();
    let Some(record) = view.pod(namespace, name).cloned() else {
        return Err(ExplainError::PodNotFound {
            namespace: namespace.into(),
            name: name.into(),
            hint: visibility_hint(inputs),
        });
    };
    drop(view);
    let status = inputs.pods.get(&(namespace.to_string(), name.to_string())).cloned().unwrap_or_default();
    let team = team_name(inputs, namespace);
    let gang = match &record.gang {
        Some(g) => Some(Box::new(explain_gang(inputs, namespace, &g.name)?)),
        None => None,
    };
    let quota = if record.quota_gate_index.is_some() {
        queue_entries(inputs, team.as_deref()).into_iter().find(|e| e.members.iter().any(|m| m == name))
    } else {
        None
    };
    let mut waiting_for = Vec::new();
    if record.finished {
        waiting_for.push(format!("nothing: the pod has finished ({})", status.phase.as_deref().unwrap_or("?")));
    } else if record.terminating {
        waiting_for.push("nothing: the pod is being deleted".into());
    } else if let Some(node) = &record.node_name {
        waiting_for.push(format!("nothing of Allot's: bound to node {node}"));
    } else {
        if record.quota_gate_index.is_some() {
            waiting_for.push(match &quota {
                Some(QueueEntry { message: Some(m), position, .. }) => format!("quota queue (#{position}): {m}"),
                Some(QueueEntry { position, .. }) => {
                    format!("quota queue (#{position}): the team has room; the controller lifts {QUOTA_GATE} on its next pass")
                }
                None => format!("quota gate {QUOTA_GATE}: no queue-mode team holds it; the controller lifts it on its next pass"),
            });
        }
        if record.gate_index.is_some() {
            let line = gang
                .as_ref()
                .and_then(|g| g.decision.as_ref())
                .map(|d| format!("gang gate {GATE} ({}): {}", d.reason, d.message))
                .unwrap_or_else(|| format!("gang gate {GATE}"));
            waiting_for.push(line);
        }
        let others: Vec<&String> = status.gates.iter().filter(|g| *g != GATE && *g != QUOTA_GATE).collect();
        if !others.is_empty() {
            let names: Vec<&str> = others.iter().map(|g| g.as_str()).collect();
            waiting_for.push(format!("scheduling gate(s) not Allot's: {}", names.join(", ")));
        }
        if waiting_for.is_empty() {
            waiting_for.push("nothing of Allot's: no scheduling gate; the kube-scheduler places it (see its Events: kubectl describe pod)".into());
        }
    }
    Ok(PodReport {
        namespace: namespace.into(),
        name: name.into(),
        phase: status.phase.clone(),
        node: record.node_name.as_deref().map(str::to_string),
        gates: status.gates.clone(),
        team,
        waiting_for,
        quota,
        gang,
        conditions: status.conditions.clone(),
        notes: visibility_notes(inputs, false),
    })
}

fn member_state(p: &PodRecord) -> &'static str {
    if p.finished {
        "finished"
    } else if p.terminating {
        "terminating"
    } else if p.gate_index.is_some() {
        "gated"
    } else if p.quota_gate_index.is_some() {
        "quotaQueued"
    } else if p.node_name.is_some() {
        "bound"
    } else {
        "pending"
    }
}

fn explain_gang(inputs: &Inputs<'_>, namespace: &str, name: &str) -> Result<GangReport, ExplainError> {
    let view = inputs.state.view();
    let mut records: Vec<PodRecord> = view
        .pods()
        .filter(|p| &*p.namespace == namespace && p.gang.as_ref().is_some_and(|g| g.name == name))
        .cloned()
        .collect();
    let owner_size = view.owner_gang(namespace, name).map(|o| o.size);
    drop(view);
    if records.is_empty() {
        return Err(ExplainError::GangNotFound {
            namespace: namespace.into(),
            name: name.into(),
            hint: visibility_hint(inputs),
        });
    }
    records.sort_by(|a, b| a.name.cmp(&b.name));
    let declared = records.iter().find_map(|p| p.gang.as_ref().and_then(|g| g.size)).or(owner_size);
    let present = records.iter().filter(|p| p.present()).count() as u32;
    let members = records
        .iter()
        .map(|p| MemberReport {
            name: p.name.to_string(),
            state: member_state(p),
            node: p.node_name.as_deref().map(str::to_string),
        })
        .collect();
    let condition = records
        .iter()
        .filter(|p| p.gate_index.is_some())
        .filter_map(|p| inputs.pods.get(&(namespace.to_string(), p.name.to_string())))
        .find_map(|s| s.conditions.iter().find(|c| c.type_ == CONDITION).cloned());
    let mut notes = visibility_notes(inputs, true);
    let key = GangKey { namespace: namespace.into(), name: name.into() };
    let (snapshot, facts) = inputs.state.snapshot(inputs.policies, inputs.labels, inputs.now);
    let waiting = snapshot.gangs.iter().find(|g| g.key == key).cloned();
    let start = facts.get(&key).and_then(|gf| {
        let deadline = gf.start_deadline()?;
        Some(Start {
            timeout_seconds: gf.start_timeout,
            since: deadline.saturating_sub(gf.start_timeout),
            deadline,
            remaining_seconds: deadline.saturating_sub(inputs.now),
            on_start_timeout: match gf.on_start_timeout {
                OnStartTimeout::Fail => "Fail".into(),
                OnStartTimeout::Warn => "Warn".into(),
            },
            unbound: gf.started.iter().filter(|m| m.unbound_since.is_some()).map(|m| m.name.clone()).collect(),
        })
    });
    let (decision, nodes, assembly) = match (waiting, decision::explain(&snapshot, &key), facts.get(&key)) {
        (Some(gang), Some((d, detail)), Some(gf)) => {
            let (mut reason, _) = condition_reason(&d.verdict);
            let mut message = d.message.clone();
            let deadline = gang.created.saturating_add(gf.assembly_timeout);
            let applies = d.verdict.awaits_assembly() && gf.assembly_timeout > 0;
            if applies && inputs.now >= deadline {
                reason = TIMEOUT_REASON;
                message = format!("{message}; not assembled within {}s", gf.assembly_timeout);
            }
            let placement_known = inputs.visibility.nodes.is_none();
            let (reason, message) = match &d.verdict {
                Verdict::Release { .. } | Verdict::DoesNotFit | Verdict::Blocked { .. } if !placement_known => (
                    "Unknown".to_string(),
                    format!(
                        "{}; placement not evaluated (nodes cannot be listed)",
                        Need { nodes: None, ..detail.need.clone() }.message()
                    ),
                ),
                Verdict::Incomplete if !placement_known => {
                    ("WaitingForMembers".to_string(), Need { nodes: None, ..detail.need.clone() }.message())
                }
                _ => (reason.to_string(), message),
            };
            let needs = if placement_known {
                detail
                    .need
                    .resources
                    .iter()
                    .map(|n| NeedReport {
                        resource: n.resource.clone(),
                        needed: n.needed.to_string(),
                        free: n.free.to_string(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let blocked_by = match &d.verdict {
                Verdict::Blocked { by } => Some(by.to_string()),
                _ => None,
            };
            let decision = DecisionReport {
                reason,
                message,
                position: detail.position,
                expected: detail.need.expected,
                counted: detail.need.present,
                nodes: detail.need.nodes.clone(),
                needs,
                blocked_by,
                victims: victims::victims(&d.verdict, &snapshot.accelerators, inputs.now),
            };
            let nodes = if placement_known { detail.nodes.iter().map(node_report).collect() } else { Vec::new() };
            let assembly = (gf.assembly_timeout > 0).then(|| Assembly {
                timeout_seconds: gf.assembly_timeout,
                since: gang.created,
                deadline,
                remaining_seconds: deadline - inputs.now,
                on_timeout: match gf.on_timeout {
                    OnTimeout::Warn => "Warn".into(),
                    OnTimeout::Fail => "Fail".into(),
                },
                applies,
            });
            (Some(decision), nodes, assembly)
        }
        _ if start.is_some() => {
            notes.push("no member waits behind the gang gate; released members wait to be bound".into());
            (None, Vec::new(), None)
        }
        _ => {
            notes.push("no member waits behind the gang gate: the controller has nothing to decide".into());
            (None, Vec::new(), None)
        }
    };
    Ok(GangReport {
        namespace: namespace.into(),
        name: name.into(),
        declared,
        present,
        members,
        decision,
        nodes,
        assembly,
        start,
        condition,
        notes,
    })
}

fn node_report(fit: &decision::NodeFit) -> NodeReport {
    let short: Vec<Short> = fit
        .short
        .iter()
        .map(|(resource, asked, free)| Short {
            resource: resource.clone(),
            asked: asked.to_string(),
            free: free.to_string(),
        })
        .collect();
    let why_not = match (&fit.refusal, fit.members) {
        (Some(r), _) => Some(r.to_string()),
        (None, 0) => Some(
            short
                .iter()
                .map(|s| format!("{} free {} < {} asked", s.resource, s.free, s.asked))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (None, _) => None,
    };
    NodeReport { name: fit.node.clone(), members: fit.members, why_not, refusal: fit.refusal.clone(), short }
}

/// The queue entries of `team` (all teams when `None`), 1-based positions.
fn queue_entries(inputs: &Inputs<'_>, team: Option<&str>) -> Vec<QueueEntry> {
    let view = inputs.state.view();
    let all = queues(&view, inputs.policies, inputs.labels);
    let mut out = Vec::new();
    for (team_name, units) in all.teams {
        if team.is_some_and(|t| t != team_name) {
            continue;
        }
        let quota = inputs.policies.teams.iter().find(|t| t.name == team_name).and_then(|t| t.quota.as_ref());
        for (i, unit) in units.into_iter().enumerate() {
            out.push(QueueEntry {
                position: i + 1,
                team: team_name.clone(),
                unit: unit.key,
                priority: unit.priority,
                members: unit.members.into_iter().map(|m| m.pod).collect(),
                asks: unit
                    .charge
                    .iter()
                    .map(|(r, units)| (r.clone(), quota.map_or_else(|| units.to_string(), |q| q.show(*units))))
                    .collect(),
                releasable: unit.waits.is_none(),
                message: unit.waits,
            });
        }
    }
    out
}

fn usage_state(state: UsageState) -> &'static str {
    match state {
        UsageState::Bound => "bound",
        UsageState::Pending => "pending",
        UsageState::GangGated => "gangGated",
        UsageState::QuotaQueued => "quotaQueued",
    }
}

fn explain_team(inputs: &Inputs<'_>, name: &str) -> Result<TeamReport, ExplainError> {
    let Some(team) = inputs.policies.teams.iter().find(|t| t.name == name) else {
        let teams: Vec<&str> = inputs.policies.teams.iter().map(|t| t.name.as_str()).collect();
        return Err(ExplainError::TeamNotFound {
            name: name.into(),
            teams: if teams.is_empty() { "none".into() } else { teams.join(", ") },
        });
    };
    let quota = team.quota.as_ref();
    // The resources shown: accelerators, and whatever the quota counts.
    let shown = |resource: &str| {
        inputs.policies.accelerators.matches(resource)
            || quota.is_some_and(|q| q.limits.contains_key(resource) || q.equivalents.contains_key(resource))
    };
    let view = inputs.state.view();
    let mut teams = TeamsByNamespace::new(inputs.policies, inputs.labels);
    let mut namespaces: BTreeSet<String> = BTreeSet::new();
    let mut by_namespace: BTreeMap<String, ResourceList> = BTreeMap::new();
    for ((ns, _state, resource), nanos) in requests_by_state(&view) {
        if teams.get(&ns).is_none_or(|t| t.name != name) {
            continue;
        }
        namespaces.insert(ns.to_string());
        if !shown(&resource) {
            continue;
        }
        let slot = by_namespace.entry(ns.to_string()).or_default().entry(resource.to_string()).or_default();
        *slot = Quantity::from_nanos(slot.nanos().saturating_add(nanos));
    }
    let mut pods: Vec<(i128, PodUsage)> = Vec::new();
    for p in view.pods().filter(|p| !p.finished) {
        if teams.get(&p.namespace).is_none_or(|t| t.name != name) {
            continue;
        }
        let requests: ResourceList = p
            .requests
            .iter()
            .filter(|(r, q)| shown(r) && *q > Quantity::ZERO)
            .map(|(r, q)| (r.to_string(), *q))
            .collect();
        if requests.is_empty() {
            continue;
        }
        let weight: i128 = match quota {
            Some(q) => q.charge(&requests).values().sum(),
            None => requests.values().map(|q| q.nanos()).sum(),
        };
        pods.push((
            weight,
            PodUsage {
                namespace: p.namespace.to_string(),
                pod: p.name.to_string(),
                state: usage_state(UsageState::of(p)),
                requests: requests.iter().map(|(r, q)| (r.clone(), q.to_string())).collect(),
            },
        ));
    }
    let mut used = crate::control::cluster::usage::admitted_by_team(&requests_by_state(&view), &mut teams);
    drop(view);
    // Deny mode: what admission checks a new pod against, gangs and native groups charged whole
    // (a gang that is not whole yet holds its missing members' places), not the pods' sum.
    if let Some(q) = quota.filter(|q| q.mode == QuotaMode::Deny) {
        let (usage, _) = inputs.state.usage_where(&mut |ns| {
            crate::model::namespaces::team_of(inputs.policies, ns, inputs.labels).team.is_some_and(|t| t.name == name)
        });
        used.insert(team.name.as_str(), q.charge(&usage));
    }
    pods.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (&a.1.namespace, &a.1.pod).cmp(&(&b.1.namespace, &b.1.pod))));
    let top_pods = pods.into_iter().take(TOP_PODS).map(|(_, p)| p).collect();
    let mut usage_by_namespace: Vec<(Quantity, NamespaceUsage)> = by_namespace
        .into_iter()
        .map(|(namespace, requests)| {
            let total = requests.values().fold(Quantity::ZERO, |a, q| a.saturating_add(*q));
            (
                total,
                NamespaceUsage {
                    namespace,
                    requests: requests.iter().map(|(r, q)| (r.clone(), q.to_string())).collect(),
                },
            )
        })
        .collect();
    usage_by_namespace.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.namespace.cmp(&b.1.namespace)));
    let quota_report = quota.map(|q| QuotaReport {
        mode: match q.mode {
            QuotaMode::Deny => "Deny".into(),
            QuotaMode::Queue => "Queue".into(),
        },
        limits: q
            .limits
            .iter()
            .map(|(resource, limit)| {
                let units = used.get(name).and_then(|c| c.get(resource)).copied().unwrap_or(0);
                LimitReport {
                    resource: resource.clone(),
                    limit: q.show(*limit),
                    used: q.show(units),
                    over: units > *limit,
                }
            })
            .collect(),
    });
    let mut notes = visibility_notes(inputs, false);
    if quota.is_none() {
        notes.push(format!("team {name} has no quota"));
    }
    Ok(TeamReport {
        team: name.into(),
        namespaces: namespaces.into_iter().collect(),
        quota: quota_report,
        usage_by_namespace: usage_by_namespace.into_iter().map(|(_, u)| u).collect(),
        top_pods,
        queue: queue_entries(inputs, Some(name)),
        notes,
    })
}
