//! The Events the gang controller publishes on Pods (gang scheduling, quota queueing,
//! preemption): one place for the controller and the evictions.
//!
//! Published by [`Publisher`], one `events.k8s.io/v1` create each, not by kube-runtime's
//! `Recorder`: the Recorder keeps a copy of every Event it published (to send a repeat as a
//! patch of an event series) and drops copies only 6 minutes old, and only when it publishes the
//! next one, walking them all each time; after a burst of thousands of gang Events that memory
//! stayed held. Allot needs no series: a pod's condition fingerprint already keeps an
//! explanation from being told twice, and the few Events that can repeat (a deletion retried)
//! are each a new Event.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use super::metrics::ControllerMetrics;

/// Every Event's `reportingController`.
pub const REPORTING_CONTROLLER: &str = "allot";
/// The API server's limit on an Event's `note`, in bytes (`NoteLengthLimit`).
pub const NOTE_LIMIT: usize = 1024;

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

/// Creates the controller's Events as replica `instance` (`reportingInstance`). Keeps nothing
/// between Events: cloning it clones the client.
#[derive(Clone)]
pub struct Publisher {
    client: kube::Client,
    instance: String,
}

impl Publisher {
    pub fn new(client: kube::Client, instance: String) -> Self {
        Publisher { client, instance }
    }
}

/// `event` as the API object, as kube-runtime's `Recorder` builds a new one: named
/// `<pod>.<nanoseconds since the epoch, hex>` (client-go's naming), regarding the pod, from
/// `allot` and `instance`, the note cut to [`NOTE_LIMIT`] bytes at a character boundary.
pub fn pod_event(event: &PodEvent<'_>, instance: &str, now: Timestamp) -> Event {
    let PodEvent { namespace, pod, uid, action, warning, reason, message } = *event;
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.into()),
        namespace: Some(namespace.into()),
        uid: uid.map(str::to_string),
        ..Default::default()
    };
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{pod}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        reporting_controller: Some(REPORTING_CONTROLLER.into()),
        reporting_instance: Some(instance.into()),
        regarding: Some(regarding),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        reason: Some(reason.into()),
        action: Some(action.as_str().into()),
        note: Some(cut_note(message).into()),
        ..Default::default()
    }
}

/// `note`'s first [`NOTE_LIMIT`] bytes, or fewer: cut at a character boundary.
fn cut_note(note: &str) -> &str {
    let mut end = note.len().min(NOTE_LIMIT);
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

/// Publishes `event`, counted as one of the controller's writes. A failure is logged, never
/// retried: an Event is a courtesy, the pod's condition is the record.
pub async fn publish(publisher: &Publisher, metrics: &ControllerMetrics, event: &PodEvent<'_>) {
    metrics.wrote("event");
    let (namespace, pod) = (event.namespace, event.pod);
    let created = pod_event(event, &publisher.instance, Timestamp::now());
    let api: Api<Event> = Api::namespaced(publisher.client.clone(), namespace);
    if let Err(e) = api.create(&PostParams::default(), &created).await {
        tracing::debug!(%namespace, %pod, error = %e, "cannot publish event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event<'a>(message: &'a str, uid: Option<&'a str>) -> PodEvent<'a> {
        PodEvent {
            namespace: "ml",
            pod: "w-0",
            uid,
            action: EventAction::Preemption,
            warning: true,
            reason: "Preempted",
            message,
        }
    }

    #[test]
    fn an_event_is_the_api_object_kube_would_create() {
        let now: Timestamp = "2026-12-07T10:00:00.123456789Z".parse().unwrap();
        let built = pod_event(&event("evicted for ml/g", Some("u-1")), "allot-0", now);
        // As the API server reads it back (the wire form parses as the k8s-openapi type).
        let wire = serde_json::to_value(&built).unwrap();
        let e: Event = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(wire["apiVersion"], "events.k8s.io/v1");
        assert_eq!(wire["kind"], "Event");
        assert_eq!(wire["eventTime"], "2026-12-07T10:00:00.123456Z", "MicroTime: microseconds");
        let name = e.metadata.name.as_deref().unwrap();
        let (pod, hex) = name.split_once('.').unwrap();
        assert_eq!(pod, "w-0");
        assert_eq!(i128::from_str_radix(hex, 16).unwrap(), now.as_nanosecond());
        assert_eq!(e.metadata.namespace.as_deref(), Some("ml"));
        let regarding = e.regarding.unwrap();
        assert_eq!(
            (regarding.api_version.as_deref(), regarding.kind.as_deref(), regarding.name.as_deref()),
            (Some("v1"), Some("Pod"), Some("w-0"))
        );
        assert_eq!((regarding.namespace.as_deref(), regarding.uid.as_deref()), (Some("ml"), Some("u-1")));
        assert_eq!(
            (e.reporting_controller.as_deref(), e.reporting_instance.as_deref()),
            (Some("allot"), Some("allot-0"))
        );
        assert_eq!((e.type_.as_deref(), e.reason.as_deref()), (Some("Warning"), Some("Preempted")));
        assert_eq!((e.action.as_deref(), e.note.as_deref()), (Some("Preemption"), Some("evicted for ml/g")));
        assert!(e.series.is_none() && e.related.is_none() && e.deprecated_count.is_none());

        let normal = pod_event(&PodEvent { warning: false, ..event("m", None) }, "allot-0", now);
        assert_eq!(normal.type_.as_deref(), Some("Normal"));
        assert!(normal.regarding.unwrap().uid.is_none());
    }

    #[test]
    fn a_note_is_cut_to_the_api_limit_in_bytes_at_a_character_boundary() {
        let now = Timestamp::UNIX_EPOCH;
        let fits = "a".repeat(NOTE_LIMIT);
        assert_eq!(pod_event(&event(&fits, None), "i", now).note.as_deref(), Some(fits.as_str()));
        let long = "b".repeat(NOTE_LIMIT + 1);
        assert_eq!(pod_event(&event(&long, None), "i", now).note.unwrap().len(), NOTE_LIMIT);
        // 3-byte characters: 341 of them are 1,023 bytes, the 342nd would cross the limit.
        let wide = "…".repeat(400);
        let note = pod_event(&event(&wide, None), "i", now).note.unwrap();
        assert_eq!((note.len(), note.chars().count()), (1023, 341));
    }
}
