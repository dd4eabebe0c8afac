//! The API side of preemption ([`super::preemption::Evictor`]): the Eviction API (dry runs and
//! evictions, each with the pod's uid as precondition), the victim's `DisruptionTarget`
//! condition and the Events.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::events::{EventAction, PodEvent, Publisher, publish};
use super::metrics::ControllerMetrics;
use super::preemption::{EvictionError, Evictor, PREEMPTED_REASON};

/// The Event reason on each victim pod.
pub const VICTIM_EVENT_REASON: &str = "Preempted";

/// Evicts through the API server as the controller's identity.
pub struct ApiEvictor<'a> {
    pub client: &'a kube::Client,
    pub events: &'a Publisher,
    pub metrics: &'a ControllerMetrics,
}

/// The body of an eviction of `pod` (the one of `uid`, when known).
pub fn eviction_body(namespace: &str, pod: &str, uid: Option<&str>) -> serde_json::Value {
    let mut body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    });
    if let Some(uid) = uid {
        body["deleteOptions"] = json!({"preconditions": {"uid": uid}});
    }
    body
}

impl Evictor for ApiEvictor<'_> {
    async fn evict(&self, namespace: &str, pod: &str, uid: Option<&str>, dry_run: bool) -> Result<(), EvictionError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let body = eviction_body(namespace, pod, uid);
        let params = PostParams { dry_run, ..PostParams::default() };
        match api.create_subresource::<_, serde_json::Value>("eviction", pod, &params, &body).await {
            Ok(_) => {
                if !dry_run {
                    self.metrics.wrote("evict");
                }
                Ok(())
            }
            // Gone, or another pod under the name now (the uid precondition): the victim meant
            // is not there to hold anything.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            // 429: a PodDisruptionBudget allows no disruption now.
            Err(kube::Error::Api(status)) => Err(EvictionError::Refused { code: status.code, message: status.message }),
            Err(e) => Err(EvictionError::Unanswered(e.to_string())),
        }
    }

    async fn tell_victim(&self, namespace: &str, pod: &str, uid: Option<&str>, message: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let condition = json!({"status": {"conditions": [{
            "type": crate::control::cluster::DISRUPTION_TARGET, "status": "True", "reason": PREEMPTED_REASON,
            "message": message, "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}});
        self.metrics.wrote("condition");
        if let Err(e) = api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(condition)).await {
            tracing::debug!(%namespace, %pod, error = %e, "DisruptionTarget condition not written");
        }
        let action = EventAction::Preemption;
        let event = PodEvent { namespace, pod, uid, action, warning: true, reason: VICTIM_EVENT_REASON, message };
        publish(self.events, self.metrics, &event).await;
    }

    async fn tell_preemptor(&self, namespace: &str, pod: &str, reason: &str, message: &str) {
        let event =
            PodEvent { namespace, pod, uid: None, action: EventAction::Preemption, warning: true, reason, message };
        publish(self.events, self.metrics, &event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eviction_names_the_pod_and_its_uid() {
        let body = eviction_body("ml", "w-0", Some("u-1"));
        let eviction: k8s_openapi::api::policy::v1::Eviction = serde_json::from_value(body).unwrap();
        assert_eq!(eviction.metadata.name.as_deref(), Some("w-0"));
        let uid = eviction.delete_options.and_then(|d| d.preconditions).and_then(|p| p.uid);
        assert_eq!(uid.as_deref(), Some("u-1"));
        let bare: k8s_openapi::api::policy::v1::Eviction =
            serde_json::from_value(eviction_body("ml", "w-0", None)).unwrap();
        assert!(bare.delete_options.is_none());
    }
}
