//! Whole-gang disruption. When a disruption takes one member of a gang Allot released — the
//! scheduler preempting it for a higher-priority pod, an eviction (a node drain), a NoExecute
//! taint — the rest of the gang cannot make progress (an all-reduce waits for the missing rank)
//! yet keeps its GPUs. Under GangPolicy `disruption: Gang` (the default) the controller deletes
//! the other members too, so the gang's controller recreates them, they are gated at CREATE
//! and the gang starts again whole once it fits (Volcano's most asked-for gang bug, volcano#4607;
//! Kubernetes' own `disruptionMode: PodGroup`, KEP-5710, for native PodGroups).
//!
//! Only a real disruption counts: the pod's `DisruptionTarget` condition, which the scheduler,
//! the Eviction API, the taint manager and the pod GC set and a user's plain delete does not
//! (deleting a pod of one's own gang is the user's business). The decision is a pure function of
//! the cluster view; each deletion carries the uid it saw (a same-name successor is another pod)
//! and never repeats (members being deleted are not "running"), so there is no loop: the
//! recreated members are new, gated pods.
//!
//! A PodDisruptionBudget is not consulted for the rest of a broken gang: with a member gone it
//! makes no progress, and keeping it running only holds its GPUs (a budget that should protect
//! the gang protects it from the first disruption, where it applies).

use std::collections::HashMap;
use std::sync::Arc;

use crate::control::cluster::{ControllerAction, DisruptionCause, PodRecord, PodUid};
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::{Disruption, PolicySet};

/// The Warning Event reason of each member deleted because its gang was disrupted.
pub const GANG_DISRUPTED_REASON: &str = "GangDisrupted";

/// The `DisruptionTarget` condition written on a member before it is deleted for its gang's
/// disruption (a strategic-merge patch of the status), with `message` and the time `now`.
pub fn disruption_condition(message: &str, now: &str) -> serde_json::Value {
    serde_json::json!({"status": {"conditions": [{
        "type": crate::control::cluster::DISRUPTION_TARGET, "status": "True", "reason": GANG_DISRUPTED_REASON,
        "message": message, "lastTransitionTime": now
    }]}})
}

/// The deletions that finish disruptions: every member still running or released (neither
/// finished, nor being deleted, nor gated) of a gang (under `disruption: Gang`) whose released
/// member a disruption is taking. In gang and pod name order. `disrupting` holds (at least) the
/// members a disruption is taking ([`PodRecord::disrupts_gang`]), `members_of(namespace, gang)`
/// a gang's pods: O(those), not a walk over every pod.
pub fn deletions<'p>(
    disrupting: impl Iterator<Item = &'p PodRecord>,
    members_of: impl Fn(&str, &str) -> Vec<&'p PodRecord>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
) -> Vec<ControllerAction> {
    let mut whole_gang: HashMap<Arc<str>, bool> = HashMap::new();
    let mut disrupted: HashMap<(Arc<str>, &str), (&str, DisruptionCause)> = HashMap::new();
    for p in disrupting.filter(|p| p.disrupts_gang()) {
        let (Some(gang), Some(cause)) = (&p.gang, p.disruption) else { continue };
        let applies = *whole_gang.entry(p.namespace.clone()).or_insert_with(|| {
            let team = crate::model::namespaces::team_of(policies, &p.namespace, labels).team.map(|t| t.name.as_str());
            policies.gang_policy(&p.namespace, team).disruption == Disruption::Gang
        });
        if applies {
            // The first by name: the watch's order is not stable, the words must be.
            let entry = disrupted.entry((p.namespace.clone(), gang.name.as_str())).or_insert((&p.name, cause));
            if *p.name < *entry.0 {
                *entry = (&p.name, cause);
            }
        }
    }
    if disrupted.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<(String, String, ControllerAction)> = Vec::new();
    let members = disrupted.keys().flat_map(|(namespace, gang)| members_of(namespace, gang));
    for p in members.filter(|p| p.present() && p.gate_index.is_none()) {
        let Some(gang) = &p.gang else { continue };
        let Some((member, cause)) = disrupted.get(&(p.namespace.clone(), gang.name.as_str())) else { continue };
        let reason = format!(
            "member {member} of gang {}/{} was {}; a gang cannot make progress without all its members, so its \
             others are deleted to re-assemble and start whole (GangPolicy disruption: Gang; controllers recreate \
             their pods, bare pods are gone)",
            p.namespace,
            gang.name,
            cause.as_str()
        );
        let action = ControllerAction::Delete {
            namespace: p.namespace.to_string(),
            pod: p.name.to_string(),
            uid: p.uid.as_ref().map(PodUid::to_arc),
            event_reason: GANG_DISRUPTED_REASON,
            reason,
        };
        out.push((gang.name.clone(), p.name.to_string(), action));
    }
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out.into_iter().map(|(_, _, action)| action).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::control::cluster::fixtures::{member, policies, record};
    use crate::model::namespaces::NoNamespaces;

    const NO_DISRUPTION_POLICY: &str = "";

    /// The deletions for `pods`, read as the controller reads them: from a store's index of
    /// the pods a disruption is taking and its gangs' members.
    fn deletions_of(pods: &[PodRecord], policies: &PolicySet) -> Vec<ControllerAction> {
        let state = crate::control::cluster::ClusterState::default();
        state.replace_pods(pods.to_vec());
        let view = state.view();
        deletions(view.disrupting_pods(), |ns, gang| view.gang_pods(ns, gang).collect(), policies, &NoNamespaces)
    }

    /// A bound member of gang `g` (of 3) on `node`, released (its gate gone).
    fn running(name: &str, node: &str) -> Value {
        let bound = json!({"spec": {"nodeName": node, "schedulingGates": null}, "status": {"phase": "Running"}});
        member(name, "g", 3, "2026-11-20T10:00:00Z", bound)
    }

    /// `pod` being deleted, with the `DisruptionTarget` condition of `reason` (none: a plain delete).
    fn deleted(mut pod: Value, reason: Option<&str>) -> Value {
        pod["metadata"]["deletionTimestamp"] = json!("2026-11-20T11:00:00Z");
        if let Some(reason) = reason {
            pod["status"] = json!({"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason}]});
        }
        pod
    }

    fn deleted_names(actions: &[ControllerAction]) -> Vec<(String, String)> {
        actions
            .iter()
            .map(|a| match a {
                ControllerAction::Delete { pod, event_reason, .. } => (pod.clone(), event_reason.to_string()),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_preempted_member_takes_its_running_gang_down_whole() {
        let set = policies(NO_DISRUPTION_POLICY);
        let pods = [
            record(&deleted(running("g-0", "n1"), Some("PreemptionByScheduler")), &set),
            record(&running("g-1", "n1"), &set),
            record(&running("g-2", "n2"), &set),
        ];
        let actions = deletions_of(&pods, &set);
        assert_eq!(
            deleted_names(&actions),
            [
                ("g-1".to_string(), GANG_DISRUPTED_REASON.to_string()),
                ("g-2".to_string(), GANG_DISRUPTED_REASON.to_string())
            ]
        );
        let ControllerAction::Delete { reason, uid, .. } = &actions[0] else { unreachable!() };
        assert!(reason.contains("member g-0 of gang ml/g was preempted by the scheduler"), "{reason}");
        assert_eq!(uid.as_deref(), Some("uid-g-1"), "the deletion is of the pod seen");
    }

    #[test]
    fn a_plain_delete_a_finished_gang_and_disruption_pod_take_nothing_down() {
        let set = policies(NO_DISRUPTION_POLICY);
        let rest = [record(&running("g-1", "n1"), &set), record(&running("g-2", "n2"), &set)];
        // The user deleted her own member: her business.
        let plain = record(&deleted(running("g-0", "n1"), None), &set);
        assert!(deletions_of(&[vec![plain], rest.to_vec()].concat(), &set).is_empty());
        // Under disruption: Pod the others keep running.
        let pod_mode = policies(
            "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: pods}\nspec:\n  disruption: Pod\n",
        );
        let evicted = record(&deleted(running("g-0", "n1"), Some("EvictionByEvictionAPI")), &pod_mode);
        assert!(deletions_of(&[vec![evicted], rest.to_vec()].concat(), &pod_mode).is_empty());
        // Members already being deleted, finished or still gated are left as they are.
        let evicted = record(&deleted(running("g-0", "n1"), Some("EvictionByEvictionAPI")), &set);
        let leaving = deleted(running("g-1", "n1"), None);
        let mut done = running("g-2", "n2");
        done["status"] = json!({"phase": "Succeeded"});
        let gated = member(
            "g-3",
            "g",
            3,
            "2026-11-20T10:00:00Z",
            json!({"spec": {"schedulingGates": [{"name": "allot.dev/gang"}]}}),
        );
        let others = [record(&leaving, &set), record(&done, &set), record(&gated, &set)];
        assert!(deletions_of(&[vec![evicted], others.to_vec()].concat(), &set).is_empty());
    }

    #[test]
    fn a_gated_member_being_evicted_is_no_disruption_of_a_running_gang() {
        // Never released: the gang has not started, nothing runs without it.
        let set = policies(NO_DISRUPTION_POLICY);
        let gated = member(
            "g-0",
            "g",
            3,
            "2026-11-20T10:00:00Z",
            json!({"spec": {"schedulingGates": [{"name": "allot.dev/gang"}]}}),
        );
        let pods = [record(&deleted(gated, Some("DeletionByTaintManager")), &set), record(&running("g-1", "n1"), &set)];
        assert!(deletions_of(&pods, &set).is_empty());
    }
}
