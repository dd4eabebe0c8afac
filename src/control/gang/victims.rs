//! What a preemption may evict, read from the cluster view: the running units of the decision's
//! [`RunningUnit`] (plain pods, whole released gangs) and the preemptions in flight that the
//! pods themselves show (victims Allot evicted, still terminating).
//!
//! A unit is running accelerator work only: a bound, present pod asking some accelerator. A
//! released gang is one unit of every such member, and none at all while any member of it is
//! starting (released, not bound) or being disrupted: a gang is evicted whole and only once it
//! runs, never while it starts or a disruption already takes it down. Gangs another scheduler places (native
//! PodGroups) are left to it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::decision::{GangKey, InFlight, RunningPod, RunningUnit, UnitKey};
use crate::control::cluster::{ClusterView, PodRecord};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::PolicySet;

/// The running units whose priority is below `below` (no other can be a victim), at `now`: each
/// evictable from its start plus its team's `minRuntime`, its start the newest pod's creation
/// or a gang's latest release. In no particular order (the decision
/// orders them by cost).
pub fn running_units(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    below: i32,
    now: i64,
) -> Vec<RunningUnit> {
    let mut teams = TeamsByNamespace::new(policies, labels);
    let mut units: HashMap<UnitKey, RunningUnit> = HashMap::new();
    let mut not_running: HashSet<GangKey> = HashSet::new();
    for p in view.pods().filter(|p| !p.finished) {
        let gang = p.gang.as_ref().filter(|g| !g.native);
        let Some(node) = p.node_name.as_ref().filter(|_| p.present()) else {
            // A released member not bound yet (its gang is starting, for at most its start
            // timeout), or one a disruption takes (whole-gang disruption deletes the rest): the
            // gang is no victim. A member its owner deletes (a plain delete, a finalizer keeping
            // it) protects nothing: the rest still runs and may be evicted.
            let starting = !p.terminating && p.gate_index.is_none();
            if let Some(g) = gang
                && (starting || p.disruption.is_some())
            {
                not_running.insert(GangKey { namespace: p.namespace.to_string(), name: g.name.clone() });
            }
            continue;
        };
        if p.priority >= below || !asks_accelerator(p, policies) {
            continue;
        }
        let (key, started) = match gang {
            Some(g) => (
                UnitKey::Gang(GangKey { namespace: p.namespace.to_string(), name: g.name.clone() }),
                // (A release time a tenant forged into the future is not believed: it would make
                // the gang look new, so cheap to evict last and protected by minRuntime.)
                p.believed_gang_release(now).unwrap_or(p.created),
            ),
            None => (UnitKey::Pod { namespace: p.namespace.to_string(), name: p.name.to_string() }, p.created),
        };
        let team = teams.get(&p.namespace);
        let min_runtime = policies.preemption_of(team).min_runtime;
        let unit = units.entry(key.clone()).or_insert_with(|| RunningUnit {
            key,
            team: team.map(|t| t.name.clone()),
            priority: p.priority,
            started,
            evictable_from: i64::MIN,
            pods: Vec::new(),
        });
        unit.priority = unit.priority.max(p.priority);
        unit.started = unit.started.max(started);
        unit.evictable_from = unit.started.saturating_add(min_runtime);
        unit.pods.push(running_pod(p, node));
    }
    let mut out: Vec<RunningUnit> = units
        .into_values()
        .filter(|u| !matches!(&u.key, UnitKey::Gang(g) if not_running.contains(g)))
        .filter(|u| u.priority < below)
        .collect();
    for unit in &mut out {
        unit.pods.sort_by(|a, b| a.name.cmp(&b.name));
    }
    out
}

fn running_pod(p: &PodRecord, node: &Arc<str>) -> RunningPod {
    RunningPod {
        namespace: p.namespace.to_string(),
        name: p.name.to_string(),
        uid: p.uid.clone(),
        node: node.to_string(),
        requests: p.request_list(),
    }
}

fn asks_accelerator(p: &PodRecord, policies: &PolicySet) -> bool {
    p.request_pairs().any(|(name, q)| q > crate::model::quantity::Quantity::ZERO && policies.accelerators.matches(name))
}

/// The preemptions the pods show in flight: victims of Allot's preemption (their
/// `DisruptionTarget` condition) still terminating, on their nodes, for a gang the view cannot
/// name (the controller that evicted them knows it; after a leader change nobody does, and the
/// nodes are still busy).
pub fn preemptions_shown(view: &ClusterView<'_>) -> Vec<InFlight> {
    // The view keeps them (`store::preempted_on_node`): no walk over every pod.
    let mut nodes: Vec<String> =
        view.preempted_pods().filter_map(|p| p.node_name.as_ref().map(|n| n.to_string())).collect();
    if nodes.is_empty() {
        return Vec::new();
    }
    nodes.sort();
    nodes.dedup();
    vec![InFlight { preemptor: None, nodes, placements: Vec::new(), domain: None }]
}
