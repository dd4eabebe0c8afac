//! The answers of `allot explain`, as `--output json` prints them (`docs/src/explain.md`
//! documents the structure): one report per subject, pod, gang or team.

use std::collections::BTreeMap;

use serde::Serialize;

use super::victims;
use crate::control::gang::fit::NodeRefusal;

/// One of Allot's pod conditions.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionReport {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The answer, by subject.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind")]
pub enum Report {
    Pod(PodReport),
    Gang(GangReport),
    Team(TeamReport),
}

/// `allot explain pod`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    pub namespace: String,
    pub name: String,
    pub phase: Option<String>,
    /// The node it is bound to.
    pub node: Option<String>,
    /// Its scheduling gates, by name (Allot's and others').
    pub gates: Vec<String>,
    pub team: Option<String>,
    /// What holds it, one line each (empty: nothing of Allot's holds it).
    pub waiting_for: Vec<String>,
    /// Its place in its team's quota queue, when it is behind the quota gate.
    pub quota: Option<QueueEntry>,
    /// Its gang, explained.
    pub gang: Option<Box<GangReport>>,
    /// Allot's conditions on the pod.
    pub conditions: Vec<ConditionReport>,
    pub notes: Vec<String>,
}

/// `allot explain gang`, and the gang part of a pod's answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GangReport {
    pub namespace: String,
    pub name: String,
    /// The size it declares (or its owner implies); `None` while unknown.
    pub declared: Option<u32>,
    /// Members that count (not finished, not being deleted).
    pub present: u32,
    pub members: Vec<MemberReport>,
    /// What the controller decides now; `None` when no member waits behind the gang gate.
    pub decision: Option<DecisionReport>,
    /// Every node as the gang's first waiting member sees it (empty when nodes cannot be read
    /// or nothing waits).
    pub nodes: Vec<NodeReport>,
    pub assembly: Option<Assembly>,
    /// The start timeout, while members Allot released are not bound yet.
    pub start: Option<Start>,
    /// The `allot.dev/GangReady` condition on a waiting member, as the controller wrote it.
    pub condition: Option<ConditionReport>,
    pub notes: Vec<String>,
}

/// One member of a gang.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberReport {
    pub name: String,
    /// `gated` (gang gate), `quotaQueued`, `pending` (released, not bound), `bound`,
    /// `terminating`, `finished`.
    pub state: &'static str,
    pub node: Option<String>,
}

/// The decision for a waiting gang.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionReport {
    /// The condition reason the controller writes: `Released`, `WaitingForMembers`,
    /// `InsufficientResources`, `WaitingForHigherPriority`, `HeldByOtherGate`,
    /// `MembersDisagree`, `PlacementTooLarge`, `Preempting`, `AssemblyTimeout`; `Unknown` when nodes could not
    /// be read.
    pub reason: String,
    /// The condition message the controller writes.
    pub message: String,
    /// Its place among the waiting gangs the controller considers (0 = first).
    pub position: usize,
    /// Members the decision waits for (after those already running).
    pub expected: Option<u32>,
    /// Members the decision counts as present (gated ones, and a LeaderReady leader's workers).
    pub counted: u64,
    /// Where the first member may go (`nodes matching node-type=x`).
    pub nodes: Option<String>,
    /// Per accelerator: what the gang asks in all and what is free on the nodes it may use.
    pub needs: Vec<NeedReport>,
    /// The gang it waits behind (`WaitingForHigherPriority`).
    pub blocked_by: Option<String>,
    /// What it would evict now (`Preempting`), cheapest first: a what-if, nothing is written.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub victims: Vec<victims::VictimReport>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NeedReport {
    pub resource: String,
    pub needed: String,
    pub free: String,
}

/// A node as the gang's first waiting member sees it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    /// How many members of that shape fit in what is free now.
    pub members: u64,
    /// Why the node does not take any (a filter, or what is short); `None` when it takes some.
    pub why_not: Option<String>,
    /// The filter that turns the member away, structured.
    pub refusal: Option<NodeRefusal>,
    /// What one member asks beyond the node's free capacity.
    pub short: Vec<Short>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Short {
    pub resource: String,
    pub asked: String,
    pub free: String,
}

/// The assembly timeout of a gang that waits.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assembly {
    pub timeout_seconds: i64,
    /// Creation of its oldest waiting member (seconds since the epoch).
    pub since: i64,
    pub deadline: i64,
    /// Negative once past.
    pub remaining_seconds: i64,
    /// `Warn` or `Fail` (members deleted).
    pub on_timeout: String,
    /// Whether the timeout applies now: only a gang that has not assembled times out.
    pub applies: bool,
}

/// The start timeout of a gang Allot released, while some released member is not bound: its
/// reservation holds until the deadline, then the gang has failed to start.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Start {
    pub timeout_seconds: i64,
    /// The earliest release of a member still unbound (seconds since the epoch).
    pub since: i64,
    pub deadline: i64,
    /// Negative once past.
    pub remaining_seconds: i64,
    /// `Fail` (every member deleted) or `Warn` (the reservation ends).
    pub on_start_timeout: String,
    /// Released members not bound yet, by name.
    pub unbound: Vec<String>,
}

/// `allot explain team`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TeamReport {
    pub team: String,
    /// Namespaces seen that belong to the team.
    pub namespaces: Vec<String>,
    pub quota: Option<QuotaReport>,
    /// Per namespace: what its non-finished pods request (accelerators and quota resources),
    /// largest first.
    pub usage_by_namespace: Vec<NamespaceUsage>,
    /// The pods that use the most (up to [`TOP_PODS`]), largest first.
    pub top_pods: Vec<PodUsage>,
    /// The team's quota queue in order (queue mode).
    pub queue: Vec<QueueEntry>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaReport {
    pub mode: String,
    pub limits: Vec<LimitReport>,
    /// The team's cohort, where it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cohort: Option<CohortReport>,
}

/// A cohort's exchange of quota, as the queue pass sees it now.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CohortReport {
    pub name: String,
    /// Per resource: what the teams lend that nobody uses.
    pub unused: BTreeMap<String, String>,
    /// Its teams in fair-share order: the smallest share first (who borrows next).
    pub teams: Vec<CohortTeamReport>,
}

/// One team of a cohort: per resource, its nominal quota, what it uses, borrows and lends.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CohortTeamReport {
    pub team: String,
    pub nominal: BTreeMap<String, String>,
    pub used: BTreeMap<String, String>,
    pub borrowed: BTreeMap<String, String>,
    pub lent: BTreeMap<String, String>,
    /// Its borrowed share of what the cohort lends, over its weight (0 when it borrows nothing).
    pub share: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitReport {
    pub resource: String,
    pub limit: String,
    /// What counts against it now (queued pods excluded; a gang is charged whole).
    pub used: String,
    /// Usage is above the limit (pods admitted before the quota, or while Allot was away).
    pub over: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceUsage {
    pub namespace: String,
    pub requests: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodUsage {
    pub namespace: String,
    pub pod: String,
    /// `bound`, `pending`, `gangGated`, `quotaQueued`.
    pub state: &'static str,
    pub requests: BTreeMap<String, String>,
}

/// One unit of a team's quota queue.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// 1-based place in the queue.
    pub position: usize,
    pub team: String,
    /// `gang/NAMESPACE/NAME` or `pod/NAMESPACE/NAME`.
    pub unit: String,
    pub priority: i32,
    pub members: Vec<String>,
    /// What it counts against the quota.
    pub asks: BTreeMap<String, String>,
    /// True: the controller lifts its quota gate on its next pass.
    pub releasable: bool,
    /// Why it waits.
    pub message: Option<String>,
    /// Released on quota borrowed from this cohort.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrows_from: Option<String>,
}
