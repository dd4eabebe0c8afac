//! What a preemption may evict, read from the cluster view: the running units of the decision's
//! [`RunningUnit`] (plain pods, whole released gangs) and the preemptions in flight that the
//! pods themselves show (victims Allot evicted, still terminating).
//!
//! A unit is running accelerator work only: a bound, present pod asking some accelerator. A
//! released gang is one unit of every such member, and none at all while any member of it is
//! starting (released, not bound) or being disrupted: a gang is evicted whole and only once it
//! runs, never while it starts or a disruption already takes it down. Its priority is its
//! highest member's, so a gang with one member at the preemptor's priority is no victim (never
//! evicted in part). Gangs another scheduler places (native PodGroups) are left to it.

use std::collections::{BTreeMap, HashSet};

use super::decision::{GangKey, InFlight, RunningPod, RunningUnit, UnitKey};
use crate::control::cluster::{ClusterView, PodRecord};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::PolicySet;

/// The running units whose priority is below `below` (no other can be a victim) in the
/// namespaces whose team (`None`: a namespace of no team) is `in_reach`, at `now`: each
/// evictable from its start plus its team's `minRuntime`, its start the newest pod's creation
/// or a gang's latest release. In no particular order (the decision orders them by cost).
///
/// Read from the view's running pods by namespace and priority, and a gang's members from its
/// gang: the work is the pods below `below` in reach, not every pod (issue 49).
pub fn running_units(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    below: i32,
    in_reach: &dyn Fn(Option<&str>) -> bool,
    now: i64,
) -> Vec<RunningUnit> {
    let mut teams = TeamsByNamespace::new(policies, labels);
    let mut out = Vec::new();
    let mut gangs_seen: HashSet<&str> = HashSet::new();
    for namespace in view.running_namespaces() {
        let team = teams.get(namespace);
        let team_name = team.map(|t| t.name.as_str());
        if !in_reach(team_name) {
            continue;
        }
        let reach =
            Reach { team: team_name.map(str::to_string), min_runtime: policies.preemption_of(team).min_runtime };
        gangs_seen.clear();
        for p in view.running_below(namespace, below) {
            let unit = match p.gang.as_ref().filter(|g| !g.native) {
                Some(g) if gangs_seen.insert(&g.name) => gang_unit(view, policies, &reach, p, &g.name, below, now),
                Some(_) => None,
                None => asks_accelerator(p, policies).then(|| plain_unit(p, &reach)),
            };
            out.extend(unit);
        }
    }
    out
}

/// What a unit takes from its namespace's team.
struct Reach {
    team: Option<String>,
    min_runtime: i64,
}

fn plain_unit(p: &PodRecord, reach: &Reach) -> RunningUnit {
    let node = p.node_name.as_ref().map_or_else(String::new, |n| n.to_string());
    RunningUnit {
        key: UnitKey::Pod { namespace: p.namespace.to_string(), name: p.name.to_string() },
        team: reach.team.clone(),
        priority: p.priority,
        started: p.created,
        evictable_from: p.created.saturating_add(reach.min_runtime),
        pods: vec![running_pod(p, node)],
    }
}

/// A released gang as one unit: every running member asking some accelerator, its priority
/// the highest among them. `None` while any member starts (released, not bound) or a
/// disruption takes one, or when a member's priority is not below `below`: a gang is evicted
/// whole or not at all. A member its owner deletes protects nothing: the rest still runs.
fn gang_unit(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    reach: &Reach,
    seen: &PodRecord,
    gang: &str,
    below: i32,
    now: i64,
) -> Option<RunningUnit> {
    let mut pods = Vec::new();
    let (mut priority, mut started) = (i32::MIN, i64::MIN);
    for m in view.gang_pods(&seen.namespace, gang).filter(|m| !m.finished) {
        let Some(node) = m.node_name.as_ref().filter(|_| m.present()) else {
            let starting = !m.terminating && m.gate_index.is_none();
            if starting || m.disruption.is_some() {
                return None;
            }
            continue;
        };
        if !asks_accelerator(m, policies) {
            continue;
        }
        priority = priority.max(m.priority);
        // (A release time a tenant forged into the future is not believed: it would make the
        // gang look new, so cheap to evict last and protected by minRuntime.)
        started = started.max(m.believed_gang_release(now).unwrap_or(m.created));
        pods.push(running_pod(m, node.to_string()));
    }
    if pods.is_empty() || priority >= below {
        return None;
    }
    Some(RunningUnit {
        key: UnitKey::Gang(GangKey { namespace: seen.namespace.to_string(), name: gang.to_string() }),
        team: reach.team.clone(),
        priority,
        started,
        evictable_from: started.saturating_add(reach.min_runtime),
        pods,
    })
}

/// [`running_units`] by a walk over every pod, grouped into units, a gang dropped when any
/// member starts or is disrupted, a unit kept only when its highest priority is below `below`:
/// the reference for the tests and the bench (`benches/passes.rs`), sorted by key.
pub fn running_units_by_walking(
    view: &ClusterView<'_>,
    p: &PolicySet,
    labels: &dyn NamespaceLabels,
    below: i32,
    in_reach: &dyn Fn(Option<&str>) -> bool,
    now: i64,
) -> Vec<RunningUnit> {
    let mut teams = TeamsByNamespace::new(p, labels);
    let mut units: BTreeMap<UnitKey, RunningUnit> = BTreeMap::new();
    let mut not_running: HashSet<GangKey> = HashSet::new();
    for pod in view.pods().filter(|pod| !pod.finished) {
        let team = teams.get(&pod.namespace);
        let (team, min_runtime) = (team.map(|t| t.name.clone()), p.preemption_of(team).min_runtime);
        if !in_reach(team.as_deref()) {
            continue;
        }
        let gang = pod.gang.as_ref().filter(|g| !g.native);
        let gang_key = |g: &crate::control::cluster::GangRef| GangKey {
            namespace: pod.namespace.to_string(),
            name: g.name.clone(),
        };
        let Some(node) = pod.node_name.as_ref().filter(|_| pod.present()) else {
            if let Some(g) = gang.filter(|_| (!pod.terminating && pod.gate_index.is_none()) || pod.disruption.is_some())
            {
                not_running.insert(gang_key(g));
            }
            continue;
        };
        // (A plain pod at or above `below` is no victim; a gang member is read: it decides its
        // gang's priority.)
        if !asks_accelerator(pod, p) || (gang.is_none() && pod.priority >= below) {
            continue;
        }
        let (key, started) = match gang {
            Some(g) => (UnitKey::Gang(gang_key(g)), pod.believed_gang_release(now).unwrap_or(pod.created)),
            None => (UnitKey::Pod { namespace: pod.namespace.to_string(), name: pod.name.to_string() }, pod.created),
        };
        let unit = units.entry(key.clone()).or_insert_with(|| RunningUnit {
            key,
            team,
            priority: i32::MIN,
            started: i64::MIN,
            evictable_from: 0,
            pods: Vec::new(),
        });
        unit.priority = unit.priority.max(pod.priority);
        unit.started = unit.started.max(started);
        unit.evictable_from = unit.started + min_runtime;
        unit.pods.push(running_pod(pod, node.to_string()));
    }
    let running = units.into_values().filter(|u| !matches!(&u.key, UnitKey::Gang(g) if not_running.contains(g)));
    let mut out: Vec<RunningUnit> = running.filter(|u| u.priority < below).collect();
    out.iter_mut().for_each(|u| u.pods.sort_by(|a, b| a.name.cmp(&b.name)));
    out
}

fn running_pod(p: &PodRecord, node: String) -> RunningPod {
    RunningPod {
        namespace: p.namespace.to_string(),
        name: p.name.to_string(),
        uid: p.uid.clone(),
        node,
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

#[cfg(test)]
#[path = "victims_tests.rs"]
mod tests;
