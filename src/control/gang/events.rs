//! The Events the gang controller publishes on Pods (gang scheduling, quota queueing,
//! preemption): one place for the controller and the evictions.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use super::metrics::ControllerMetrics;

/// An Event's `action`: which of the controller's jobs the Event is about.
#[derive(Debug, Clone, Copy)]
pub enum EventAction {
    /// Releasing, explaining or timing out a gang.
    GangScheduling,
    /// Holding or releasing a pod in its team's quota queue.
    QuotaQueueing,
    /// Evicting lower-priority work for a gang ([`super::preemption`]).
    Preemption,
}

impl EventAction {
    fn as_str(self) -> &'static str {
        match self {
            EventAction::GangScheduling => "GangScheduling",
            EventAction::QuotaQueueing => "QuotaQueueing",
            EventAction::Preemption => "Preemption",
        }
    }
}

/// One Event on one pod: the pod of that `uid` when known, so that a successor made under the
/// same name does not show it.
pub struct PodEvent<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub uid: Option<&'a str>,
    pub action: EventAction,
    pub warning: bool,
    pub reason: &'a str,
    pub message: &'a str,
}

/// Publishes `event`, counted as one of the controller's writes. A failure is logged, never
/// retried: an Event is a courtesy, the pod's condition is the record.
pub async fn publish(recorder: &Recorder, metrics: &ControllerMetrics, event: &PodEvent<'_>) {
    metrics.wrote("event");
    let PodEvent { namespace, pod, uid, action, warning, reason, message } = *event;
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.into()),
        namespace: Some(namespace.into()),
        uid: uid.map(str::to_string),
        ..Default::default()
    };
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.as_str().into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::debug!(%namespace, %pod, error = %e, "cannot publish event");
    }
}
