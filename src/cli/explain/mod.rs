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
mod team;
pub mod victims;

pub use report::{
    Assembly, ConditionReport, DecisionReport, GangReport, LimitReport, MemberReport, NamespaceUsage, NeedReport,
    NodeReport, PodReport, PodUsage, QueueEntry, QuotaReport, Report, Short, Start, TeamReport,
};

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use team::explain_team;

use crate::control::cluster::{CONDITION, ClusterState, PodRecord, QUOTA_CONDITION};
use crate::control::gang::decision::{self, Decision, GangDetail, GangKey, Need, Snapshot, Verdict, WaitingGang};
use crate::control::gang::plan::{TIMEOUT_REASON, condition_reason};
use crate::control::gang::snapshot::{GangFacts, GangSnapshot};
use crate::control::quota::queue::queues;
use crate::model::gang::membership::{GATE, QUOTA_GATE};
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::{OnStartTimeout, OnTimeout, PolicySet};

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

impl ExplainError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ExplainError::PodNotFound { .. } => "pod_not_found",
            ExplainError::GangNotFound { .. } => "gang_not_found",
            ExplainError::TeamNotFound { .. } => "team_not_found",
        }
    }
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
    let (records, owner_size) = gang_records(inputs, namespace, name)?;
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
    let start = facts.get(&key).and_then(|gf| start_report(gf, inputs.now));
    let (decision, nodes, assembly) = match (waiting, decision::explain(&snapshot, &key), facts.get(&key)) {
        (Some(gang), Some((d, detail)), Some(gf)) => {
            let (decision, nodes, assembly) = decided(inputs, &snapshot, &gang, &d, &detail, gf);
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

/// The gang's pods by name, and the size its owner declares: a gang is its pods, so a name
/// none of the listed pods carries is not found (with why, when not every pod could be listed).
fn gang_records(
    inputs: &Inputs<'_>,
    namespace: &str,
    name: &str,
) -> Result<(Vec<PodRecord>, Option<u32>), ExplainError> {
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
    Ok((records, owner_size))
}

/// The start timeout's clock, once released members wait to be bound: when they must be.
fn start_report(gf: &GangFacts, now: i64) -> Option<Start> {
    let deadline = gf.start_deadline()?;
    Some(Start {
        timeout_seconds: gf.start_timeout,
        since: deadline.saturating_sub(gf.start_timeout),
        deadline,
        remaining_seconds: deadline.saturating_sub(now),
        on_start_timeout: match gf.on_start_timeout {
            OnStartTimeout::Fail => "Fail".into(),
            OnStartTimeout::Warn => "Warn".into(),
        },
        unbound: gf.started.iter().filter(|m| m.unbound_since.is_some()).map(|m| m.name.clone()).collect(),
    })
}

/// The controller's decision on a waiting gang as the report shows it, with the nodes' fit and
/// the assembly timeout; what the caller cannot see (nodes) is left out, not guessed.
fn decided(
    inputs: &Inputs<'_>,
    snapshot: &Snapshot,
    gang: &WaitingGang,
    d: &Decision,
    detail: &GangDetail,
    gf: &GangFacts,
) -> (DecisionReport, Vec<NodeReport>, Option<Assembly>) {
    let deadline = gang.created.saturating_add(gf.assembly_timeout);
    let applies = d.verdict.awaits_assembly() && gf.assembly_timeout > 0;
    let placement_known = inputs.visibility.nodes.is_none();
    let (reason, message) = reason_and_message(inputs, d, detail, gf, applies && inputs.now >= deadline);
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
    (decision, nodes, assembly)
}

/// The GangReady reason and message the controller would write (`timed_out`: past the assembly
/// timeout), except where the nodes cannot be listed: then only what is known of the need.
fn reason_and_message(
    inputs: &Inputs<'_>,
    d: &Decision,
    detail: &GangDetail,
    gf: &GangFacts,
    timed_out: bool,
) -> (String, String) {
    let (mut reason, _) = condition_reason(&d.verdict);
    let mut message = d.message.clone();
    if timed_out {
        reason = TIMEOUT_REASON;
        message = format!("{message}; not assembled within {}s", gf.assembly_timeout);
    }
    let placement_known = inputs.visibility.nodes.is_none();
    match &d.verdict {
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
    }
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
                borrows_from: unit.borrowed_from,
            });
        }
    }
    out
}
