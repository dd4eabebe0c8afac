//! The controller's writes to the API: gate lifts (together, before anything else of a pass),
//! then conditions, Events, deletions and arrival stamps, written off the decision loop by the
//! explainer in pass order (a backlog coalesced), each failure reported back for a retry.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};

use super::events::{EventAction, PodEvent, Publisher, publish};
use super::metrics::ControllerMetrics;
pub use super::owners::{OWNER_APIS, OwnerApi};
use super::refusal::{RefusedLifts, admission_refusal};
use crate::control::cluster::action::QUEUED_REASON;
use crate::control::cluster::records::{condition_fingerprint, format_nanos};
use crate::control::cluster::{CONDITION, ClusterState, ControllerAction, QUOTA_CONDITION};
pub(super) use crate::model::clock::unix_now;
use crate::model::gang::membership::{
    ARRIVAL_ANNOTATION, BORROWED_FROM_ANNOTATION, GATE, QUOTA_GATE, QUOTA_RELEASED_ANNOTATION, RELEASED_ANNOTATION,
};
use crate::model::patch::escape;

/// How many API calls of one kind (gate lifts; explanations and stamps) run at once.
pub(super) const CONCURRENT_WRITES: usize = 16;

/// What a pass leaves to the explainer.
pub(super) struct Later {
    pub(super) actions: Vec<ControllerAction>,
    pub(super) stamps: Vec<(String, String, i64)>,
}

/// How the explainer reports writes that failed to the loop.
pub(super) struct Failures {
    /// A condition could not be written: the next pass forgets what it told.
    pub(super) conditions: Arc<std::sync::atomic::AtomicBool>,
    /// Any write failed (a condition, a deletion, an arrival stamp): the loop sets a retry.
    pub(super) wake: Arc<tokio::sync::Notify>,
}

/// What the explainer writes with.
pub(super) struct Writers {
    pub(super) client: kube::Client,
    pub(super) events: Publisher,
    pub(super) state: Arc<ClusterState>,
    pub(super) metrics: ControllerMetrics,
}

/// Writes what the passes leave (conditions, Events, deletions, arrival stamps) in pass order,
/// off the decision loop. A backlog is coalesced: of several explanations for one pod's
/// condition only the newest is written. Nothing is written while this replica does not lead.
pub(super) async fn explain(
    writers: Writers,
    leader: tokio::sync::watch::Receiver<bool>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Later>,
    failures: Failures,
) {
    let Writers { client, events, state, metrics } = writers;
    while let Some(first) = rx.recv().await {
        let mut batches = vec![first];
        while let Ok(more) = rx.try_recv() {
            batches.push(more);
        }
        if !*leader.borrow() {
            for b in &batches {
                for (namespace, pod, _) in &b.stamps {
                    state.mark_arrival_stamped(namespace, pod, false);
                }
                for condition in b.actions.iter().filter_map(Condition::of) {
                    condition.failed(&state);
                }
            }
            continue;
        }
        let (actions, stamps) = coalesce(batches);
        let (conditions_failed, others_failed) = execute_rest(&client, &events, &state, &metrics, actions).await;
        if conditions_failed {
            failures.conditions.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let stamps_failed = stamp_arrivals(&client, &state, &metrics, stamps).await;
        if conditions_failed || others_failed || stamps_failed {
            failures.wake.notify_one();
        }
    }
}

/// The actions of several passes, oldest first, with each pod's condition written once (the
/// newest explanation wins); deletions are all kept.
fn coalesce(batches: Vec<Later>) -> (Vec<ControllerAction>, Vec<(String, String, i64)>) {
    let mut actions: Vec<Option<ControllerAction>> = Vec::new();
    let mut latest: HashMap<(String, String, bool), usize> = HashMap::new();
    let mut stamps = Vec::new();
    for batch in batches {
        stamps.extend(batch.stamps);
        for action in batch.actions {
            let key = match &action {
                ControllerAction::Explain { namespace, pod, .. } => Some((namespace.clone(), pod.clone(), false)),
                ControllerAction::Queued { namespace, pod, .. }
                | ControllerAction::QuotaAdmitted { namespace, pod } => Some((namespace.clone(), pod.clone(), true)),
                _ => None,
            };
            if let Some(key) = key
                && let Some(older) = latest.insert(key, actions.len())
            {
                actions[older] = None;
            }
            actions.push(Some(action));
        }
    }
    stamps.sort();
    stamps.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    (actions.into_iter().flatten().collect(), stamps)
}

/// Writes `allot.dev/arrival` on pods that lack it (once per pod), so a later leader orders them
/// as this one did. True when a stamp could not be written (it is unmarked; a later pass tries
/// again).
async fn stamp_arrivals(
    client: &kube::Client,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    stamps: Vec<(String, String, i64)>,
) -> bool {
    let failed = std::sync::atomic::AtomicBool::new(false);
    let failed_ref = &failed;
    futures::stream::iter(stamps)
        .for_each_concurrent(CONCURRENT_WRITES, |(namespace, pod, arrival)| async move {
            let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let patch = json!({"metadata": {"annotations": {ARRIVAL_ANNOTATION: format_nanos(arrival)}}});
            metrics.wrote("arrival");
            match api.patch(&pod, &PatchParams::default(), &Patch::Merge(patch)).await {
                Ok(_) => {}
                Err(e) if is_status(&e, &[404]) => {}
                Err(e) => {
                    state.mark_arrival_stamped(&namespace, &pod, false);
                    failed_ref.store(true, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(%namespace, %pod, error = %e, "cannot stamp the arrival; retrying later")
                }
            }
        })
        .await;
    failed.into_inner()
}

pub(super) fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Test-and-remove of one gate: the `test`s guard the pod and the index, so a pod made again
/// under the name since the pass decided (another pod, maybe asking more) or a concurrent
/// change of the gate list makes the patch fail (422) instead of removing the wrong gate.
pub fn lift_gate_ops(gate: &str, gate_index: usize, uid: Option<&str>) -> Vec<Value> {
    let uid = uid.map(|uid| json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    uid.into_iter()
        .chain([
            json!({"op": "test", "path": format!("/spec/schedulingGates/{gate_index}/name"), "value": gate}),
            json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate_index}")}),
        ])
        .collect()
}

/// The JSON Patch that lifts Allot's gang gate and only it, from the pod of that `uid`, and
/// marks the member released.
pub fn release_patch(gate_index: usize, uid: Option<&str>, has_annotations: bool, released_at: &str) -> Value {
    lift_and_stamp(GATE, &[(RELEASED_ANNOTATION, released_at)], gate_index, uid, has_annotations)
}

/// Pins a released member to its gang's topology domain: `spec.nodeSelector[key] = value`.
/// The API server lets a gated pod gain node selectors (only additions), and checks the gates
/// of the pod before the patch, so it goes in the same patch as the gate lift. A selector that
/// already names the key names this value (the domain was chosen among the nodes it admits),
/// so the add changes nothing there.
pub fn pin_op(key: &str, value: &str, has_node_selector: bool) -> Value {
    if has_node_selector {
        json!({"op": "add", "path": format!("/spec/nodeSelector/{}", escape(key)), "value": value})
    } else {
        json!({"op": "add", "path": "/spec/nodeSelector", "value": {key: value}})
    }
}

/// The JSON Patch that lifts Allot's quota gate and only it, from the pod of that `uid`, and
/// stamps when (`allot.dev/quota-released`): a gang member is not able to go before its
/// team's quota lets it, so its gang's order and starvation clock start no earlier.
/// A pod released on quota its team borrows from a cohort also says so
/// (`allot.dev/borrowed-from: COHORT`).
pub fn quota_release_patch(
    gate_index: usize,
    uid: Option<&str>,
    has_annotations: bool,
    released_at: &str,
    borrowed_from: Option<&str>,
) -> Value {
    let borrowed = borrowed_from.map(|cohort| (BORROWED_FROM_ANNOTATION, cohort));
    let stamps: Vec<(&str, &str)> = [(QUOTA_RELEASED_ANNOTATION, released_at)].into_iter().chain(borrowed).collect();
    lift_and_stamp(QUOTA_GATE, &stamps, gate_index, uid, has_annotations)
}

/// The merge patch that sets (`cohort`) or removes (`None`) `allot.dev/borrowed-from` on the
/// pod of that `uid` (a uid the pod does not have fails the write: it is another pod). A
/// merge patch, not a JSON Patch: it touches that one key, whatever annotations the pod has
/// gained since the pass looked.
pub fn borrowed_mark_patch(uid: Option<&str>, cohort: Option<&str>) -> Value {
    let mut metadata = json!({"annotations": {BORROWED_FROM_ANNOTATION: cohort}});
    if let Some(uid) = uid {
        metadata["uid"] = json!(uid);
    }
    json!({"metadata": metadata})
}

/// Lifts `gate` (see [`lift_gate_ops`]) and sets each `(annotation, value)` of `stamps` in the
/// same patch.
fn lift_and_stamp(
    gate: &str,
    stamps: &[(&str, &str)],
    gate_index: usize,
    uid: Option<&str>,
    has_annotations: bool,
) -> Value {
    let mut ops = lift_gate_ops(gate, gate_index, uid);
    if has_annotations {
        ops.extend(stamps.iter().map(|(annotation, value)| {
            json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(annotation)), "value": value})
        }));
    } else {
        let all: serde_json::Map<String, Value> =
            stamps.iter().map(|(k, v)| (k.to_string(), Value::String(v.to_string()))).collect();
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": all}));
    }
    Value::Array(ops)
}

/// Lifts gates, all at once (a gang's members go out together, not one round trip after the
/// other); returns the other actions, plus the explanation owed for each pod lifted from its
/// quota queue, for [`execute_rest`]; and true when a lift failed for another reason than a
/// change the watch will report (a 5xx, a timeout): the loop then sets a [`Retry`].
pub(super) async fn execute_lifts(
    client: &kube::Client,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    refused: &RefusedLifts,
    actions: Vec<ControllerAction>,
) -> (Vec<ControllerAction>, bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (lifts, mut rest): (Vec<_>, Vec<_>) = actions
        .into_iter()
        .partition(|a| matches!(a, ControllerAction::Release { .. } | ControllerAction::ReleaseQuota { .. }));
    let lifter = &Lifter { client, state, metrics, refused, now: &now };
    let admitted: Vec<(Option<ControllerAction>, bool)> = futures::stream::iter(lifts)
        .map(|action| async move {
            match action {
                ControllerAction::Release { .. } => lifter.lift_gang_gate(action).await,
                ControllerAction::ReleaseQuota { namespace, pod, uid, gate_index, has_annotations, borrowed_from } => {
                    let borrowed_from = borrowed_from.as_deref();
                    lifter.lift_quota_gate(namespace, pod, uid, gate_index, has_annotations, borrowed_from).await
                }
                _ => (None, false),
            }
        })
        .buffered(CONCURRENT_WRITES)
        .collect()
        .await;
    let failed = admitted.iter().any(|(_, failed)| *failed);
    // A member whose lift was refused is not told the plan's "releasing": it keeps what the
    // refusal says (else whichever condition write landed last would win).
    refused.drop_plans_for_refused(&mut rest);
    rest.extend(admitted.into_iter().filter_map(|(action, _)| action));
    (rest, failed)
}

/// What a gate lift writes with: each lift returns what the explainer should write after it
/// (if anything), and whether it failed in a way only a retry after a backoff mends.
struct Lifter<'a> {
    client: &'a kube::Client,
    state: &'a ClusterState,
    metrics: &'a ControllerMetrics,
    refused: &'a RefusedLifts,
    /// The time written on the released pods.
    now: &'a str,
}

impl Lifter<'_> {
    /// Lifts the gang gate of a released member (pinned to its domain, where it has one).
    async fn lift_gang_gate(&self, action: ControllerAction) -> (Option<ControllerAction>, bool) {
        let ControllerAction::Release {
            namespace,
            pod,
            uid,
            gate_index,
            has_annotations,
            node,
            pin,
            has_node_selector,
        } = action
        else {
            return (None, false);
        };
        let (state, metrics, refused) = (self.state, self.metrics, self.refused);
        metrics.wrote("gate");
        let mut patch = release_patch(gate_index, uid.as_deref(), has_annotations, self.now);
        if let (Some((key, value)), Value::Array(ops)) = (&pin, &mut patch) {
            ops.push(pin_op(key, value, has_node_selector));
        }
        match patch_pod(self.client, &namespace, &pod, patch).await {
            Ok(_) => {
                state.mark_released(&namespace, std::slice::from_ref(&pod), unix_now());
                if let Some((key, value)) = &pin {
                    // The reservation of this member is in its domain from the next pass on,
                    // whether or not the watch has shown the patch yet.
                    state.pin_placement(&namespace, &pod, key, value);
                }
                tracing::info!(%namespace, %pod, simulated_node = %node, "released gang member");
                (refused.lifted(&namespace, &pod), false)
            }
            Err(e) if admission_refusal(&e).is_some() => {
                let admission = admission_refusal(&e).unwrap_or_default();
                refused.refused_now(&namespace, &pod);
                (refused.refused(metrics, "gate", &namespace, &pod, admission), true)
            }
            Err(e) if is_status(&e, &[404]) => {
                tracing::debug!(%namespace, %pod, "member gone before release");
                (None, false)
            }
            Err(e) if is_status(&e, &[409, 422]) => {
                tracing::info!(%namespace, %pod, error = %e, "gate list changed; retrying on the next pass");
                (None, false)
            }
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "release failed; retrying after a backoff");
                (None, true)
            }
        }
    }

    /// Lifts the quota gate of a pod the queue admits.
    async fn lift_quota_gate(
        &self,
        namespace: String,
        pod: String,
        uid: Option<Arc<str>>,
        gate_index: usize,
        has_annotations: bool,
        borrowed_from: Option<&str>,
    ) -> (Option<ControllerAction>, bool) {
        self.metrics.wrote("gate");
        let patch = quota_release_patch(gate_index, uid.as_deref(), has_annotations, self.now, borrowed_from);
        match patch_pod(self.client, &namespace, &pod, patch).await {
            Ok(_) => {
                self.state.mark_quota_released(&namespace, &pod, unix_now());
                self.metrics.quota_releases.inc();
                tracing::info!(%namespace, %pod, borrowed_from, "released from the quota queue");
                (Some(ControllerAction::QuotaAdmitted { namespace, pod }), false)
            }
            Err(e) if admission_refusal(&e).is_some() => {
                let admission = admission_refusal(&e).unwrap_or_default();
                // (The pod keeps its queue condition; the count, the alert and the error line
                // say why it does not leave the queue.)
                let _ = self.refused.refused(self.metrics, "quota", &namespace, &pod, admission);
                (None, true)
            }
            Err(e) if is_status(&e, &[404, 409, 422]) => {
                tracing::debug!(%namespace, %pod, error = %e, "quota release skipped; retrying on the next pass");
                (None, false)
            }
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "quota release failed; retrying after a backoff");
                (None, true)
            }
        }
    }
}

/// Conditions, Events and deletions, concurrently. Returns (a condition could not be written:
/// the loop then forgets what it wrote; a deletion could not be made); either way the next
/// pass, after a [`Retry`] backoff, tries again.
pub(super) async fn execute_rest(
    client: &kube::Client,
    events: &Publisher,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    actions: Vec<ControllerAction>,
) -> (bool, bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let writer = Writer { client, events, metrics, now: &now };
    // (condition failed, deletion failed) per action.
    let outcomes: Vec<(bool, bool)> = futures::stream::iter(actions)
        .map(|action| async move {
            if let ControllerAction::MarkBorrowed { namespace, pod, uid, cohort, .. } = &action {
                let patch = borrowed_mark_patch(uid.as_deref(), cohort.as_deref());
                if !writer.mark(namespace, pod, patch).await {
                    state.mark_borrowed(namespace, pod, cohort.is_none());
                    return (false, true);
                }
                return (false, false);
            }
            if let ControllerAction::Delete { namespace, pod, uid, event_reason, reason } = &action {
                if !writer.delete_member(namespace, pod, uid.as_deref(), event_reason, reason).await {
                    state.mark_deleting(namespace, pod, uid.as_deref(), false);
                    return (false, true);
                }
                return (false, false);
            }
            let Some(c) = Condition::of(&action) else { return (false, false) };
            let condition = if c.quota { QUOTA_CONDITION } else { CONDITION };
            if !writer.set_condition(c.namespace, c.pod, condition, c.ready, c.reason, c.message).await {
                // Marked when the pass sent it: unmarked (unless a newer one is on its way), so
                // the next pass tells the pod again.
                c.failed(state);
                return (true, false);
            }
            c.landed(state);
            let event = PodEvent {
                namespace: c.namespace,
                pod: c.pod,
                uid: None,
                action: c.event,
                warning: c.warning,
                reason: c.reason,
                message: c.message,
            };
            publish(writer.events, writer.metrics, &event).await;
            (false, false)
        })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    (outcomes.iter().any(|o| o.0), outcomes.iter().any(|o| o.1))
}

/// The message of the condition a pod released from its team's quota queue gets.
const QUOTA_ADMITTED_MESSAGE: &str = "the team's quota has room; released from the queue";

/// The condition (and Event) an explaining action writes on a pod.
pub(super) struct Condition<'a> {
    namespace: &'a str,
    pod: &'a str,
    /// `allot.dev/QuotaReady`, else `allot.dev/GangReady`.
    quota: bool,
    ready: bool,
    reason: &'static str,
    message: &'a str,
    warning: bool,
    event: EventAction,
}

impl Condition<'_> {
    pub(super) fn of(action: &ControllerAction) -> Option<Condition<'_>> {
        Some(match action {
            ControllerAction::Explain { namespace, pod, ready, reason, message, warning } => Condition {
                namespace,
                pod,
                quota: false,
                ready: *ready,
                reason,
                message,
                warning: *warning,
                event: EventAction::GangScheduling,
            },
            ControllerAction::Queued { namespace, pod, message } => Condition {
                namespace,
                pod,
                quota: true,
                ready: false,
                reason: QUEUED_REASON,
                message,
                warning: false,
                event: EventAction::QuotaQueueing,
            },
            ControllerAction::QuotaAdmitted { namespace, pod } => Condition {
                namespace,
                pod,
                quota: true,
                ready: true,
                reason: "QuotaAdmitted",
                message: QUOTA_ADMITTED_MESSAGE,
                warning: false,
                event: EventAction::QuotaQueueing,
            },
            ControllerAction::Delete { .. }
            | ControllerAction::Release { .. }
            | ControllerAction::ReleaseQuota { .. }
            | ControllerAction::MarkBorrowed { .. } => {
                return None;
            }
        })
    }

    /// Records on the pod's record that this condition is on its way, so the passes meanwhile
    /// neither tell the pod again nor count it as told nothing.
    pub(super) fn sent(&self, state: &ClusterState) {
        state.mark_condition(self.namespace, self.pod, self.quota, self.fingerprint());
    }

    /// Records that it was not written (or not sent): unmarked, unless a newer one is on its way.
    fn failed(&self, state: &ClusterState) {
        state.unmark_condition(self.namespace, self.pod, self.quota, self.fingerprint());
    }

    /// Records that the write completed: the pod's watch events carry it from now on.
    fn landed(&self, state: &ClusterState) {
        state.condition_landed(self.namespace, self.pod, self.quota, self.fingerprint());
    }

    fn fingerprint(&self) -> u64 {
        condition_fingerprint(self.ready, self.reason, self.message)
    }
}

/// What the explaining writes share: the client, the Event publisher, the write counter and
/// the pass's time.
#[derive(Clone, Copy)]
struct Writer<'a> {
    client: &'a kube::Client,
    events: &'a Publisher,
    metrics: &'a ControllerMetrics,
    now: &'a str,
}

impl Writer<'_> {
    /// Sets one of Allot's pod conditions (strategic merge on `type`, so other conditions
    /// stay); false when it could not be written.
    async fn set_condition(
        &self,
        namespace: &str,
        pod: &str,
        condition: &str,
        ready: bool,
        reason: &str,
        message: &str,
    ) -> bool {
        self.metrics.wrote("condition");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"status": {"conditions": [{
            "type": condition,
            "status": if ready { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastTransitionTime": self.now,
        }]}});
        match api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(patch)).await {
            Ok(_) => true,
            // Gone: nothing to say any more.
            Err(e) if is_status(&e, &[404]) => true,
            Err(e) => {
                tracing::warn!(%namespace, %pod, %condition, error = %e, "cannot set the pod condition");
                false
            }
        }
    }

    /// A pod's borrowed mark set or removed ([`borrowed_mark_patch`]); false when it could not
    /// be written for a reason only a retry mends.
    async fn mark(&self, namespace: &str, pod: &str, patch: Value) -> bool {
        self.metrics.wrote("mark");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => true,
            // Gone, made again under the name, or changed since the pass: the next one decides.
            Err(e) if is_status(&e, &[404, 409, 422]) => true,
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "cannot mark a pod's borrowed quota");
                false
            }
        }
    }

    /// Assembly or start timeout under `Fail`: a Warning Event (`event_reason`, `reason`) on the
    /// pod of that `uid` (before: a deletion that fails and is retried repeats it, and the pod's
    /// Events say why it went), then its deletion; false when the pod could not be deleted (it
    /// is still there). A pod made again under the name since is spared by the uid, and the
    /// Event names the uid, so the successor's `kubectl describe` does not show it.
    async fn delete_member(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        event_reason: &str,
        reason: &str,
    ) -> bool {
        let action = EventAction::GangScheduling;
        let event = PodEvent { namespace, pod, uid, action, warning: true, reason: event_reason, message: reason };
        publish(self.events, self.metrics, &event).await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        if event_reason == super::disruption::GANG_DISRUPTED_REASON {
            // As the scheduler and the Eviction API do: a Job whose podFailurePolicy ignores
            // disruptions (onPodConditions DisruptionTarget) replaces the member without counting
            // a failure or waiting out a backoff. Deleted whether or not this lands.
            let condition =
                super::disruption::disruption_condition(reason, &k8s_openapi::jiff::Timestamp::now().to_string());
            if let Err(e) = api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(condition)).await {
                tracing::debug!(%namespace, %pod, error = %e, "DisruptionTarget condition not written");
            }
        }
        match api.delete(pod, &delete_params(uid)).await {
            Ok(_) => {
                // Deletions made, not tried: what AllotGangMembersDeleted alerts on.
                self.metrics.wrote("delete");
                tracing::warn!(%namespace, %pod, %event_reason, %reason, "deleted gang member");
                true
            }
            Err(e) if is_status(&e, &[404]) => true,
            // The uid precondition failed: the pod of that name now is another one (made again
            // since the pass decided); the member meant is gone, and this one is not ours to take.
            Err(e) if is_status(&e, &[409]) => {
                tracing::info!(%namespace, %pod, "gang member to delete was replaced under its name; left alone");
                true
            }
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "cannot delete gang member");
                false
            }
        }
    }
}

/// Deletes only the pod of that `uid` (when known): the API server answers 409 Conflict when
/// the name now belongs to another pod.
pub fn delete_params(uid: Option<&str>) -> DeleteParams {
    let preconditions = uid.map(|uid| Preconditions { uid: Some(uid.to_string()), resource_version: None });
    DeleteParams { preconditions, ..DeleteParams::default() }
}

/// Sends one of this module's JSON Patches (gate removals) to a Pod.
pub(super) async fn patch_pod(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    ops: Value,
) -> Result<(), kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.patch(pod, &PatchParams::default(), &Patch::Json::<()>(patch)).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_borrowed_mark_patch_touches_that_one_key_of_that_very_pod() {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "v5", "namespace": "vision", "uid": "uid-vision-v5"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        pod["metadata"]["annotations"] = json!({"team.example/owner": "alice"});
        let mut marked = pod.clone();
        json_patch::merge(&mut marked, &borrowed_mark_patch(Some("uid-vision-v5"), Some("research")));
        let parsed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(marked.clone()).unwrap();
        let annotations = parsed.metadata.annotations.unwrap();
        assert_eq!(annotations.get("allot.dev/borrowed-from").map(String::as_str), Some("research"));
        assert_eq!(annotations.get("team.example/owner").map(String::as_str), Some("alice"), "the tenant's stay");
        assert_eq!(parsed.metadata.uid.as_deref(), Some("uid-vision-v5"), "the uid is the pod's: no change");
        let mut unmarked = marked.clone();
        json_patch::merge(&mut unmarked, &borrowed_mark_patch(Some("uid-vision-v5"), None));
        assert_eq!(unmarked["metadata"]["annotations"], json!({"team.example/owner": "alice"}));
        // A pod without annotations gets the one key; one made again under the name (another uid)
        // would be given the old uid, which the API server refuses (uids are immutable).
        let mut bare = pod.clone();
        bare["metadata"].as_object_mut().unwrap().remove("annotations");
        bare["metadata"]["uid"] = json!("uid-made-again");
        json_patch::merge(&mut bare, &borrowed_mark_patch(Some("uid-vision-v5"), Some("research")));
        assert_eq!(bare["metadata"]["annotations"], json!({"allot.dev/borrowed-from": "research"}));
        assert_eq!(bare["metadata"]["uid"], "uid-vision-v5");
    }
}
