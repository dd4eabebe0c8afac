//! A fake kubelet for tests on a control plane without nodes that run anything: bound pods are
//! marked Running and Ready (with a start time), and a pod being deleted is finished once it has been
//! terminating for a grace period (Failed, then gone), as a kubelet does once the containers stop.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

/// Runs the fake kubelet over `namespace` until aborted: every 250 ms, bound Pending pods are
/// Running, and pods terminating for `grace` are Failed and force-deleted.
pub fn fake_kubelet(admin: kube::Client, namespace: &str, grace: Duration) -> tokio::task::JoinHandle<()> {
    let pods: Api<Pod> = Api::namespaced(admin, namespace);
    tokio::spawn(async move {
        loop {
            if let Ok(list) = pods.list(&ListParams::default()).await {
                for p in list.items {
                    step(&pods, &p, grace).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

async fn step(pods: &Api<Pod>, p: &Pod, grace: Duration) {
    let Some(name) = &p.metadata.name else { return };
    let now = k8s_openapi::jiff::Timestamp::now();
    let bound = p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if let Some(deleted) = &p.metadata.deletion_timestamp {
        // (The timestamp is when the pod's own grace period ends: the deletion plus it.)
        let own_grace =
            k8s_openapi::jiff::SignedDuration::from_secs(p.metadata.deletion_grace_period_seconds.unwrap_or(0));
        let terminating_for = now.duration_since(deleted.0) + own_grace;
        if terminating_for.as_millis() >= grace.as_millis() as i128 {
            // The containers stopped: the pod is terminal (a Job's tracking finalizer waits for
            // that), then gone.
            let failed = json!({"status": {"phase": "Failed"}});
            let _ = pods.patch_status(name, &PatchParams::default(), &Patch::Merge(failed)).await;
            let force = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
            let _ = pods.delete(name, &force).await;
        }
    } else if bound && phase == "Pending" {
        let now = now.to_string();
        let running = json!({"status": {"phase": "Running", "startTime": now, "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}
        ]}});
        if let Err(e) = pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(running)).await {
            eprintln!("fake kubelet: cannot mark {name} Running: {e}");
        }
    }
}
