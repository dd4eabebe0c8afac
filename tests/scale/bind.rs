//! The scale test's pods bound to nodes, as the scheduler binds them: a `Binding` posted to
//! each pod's `binding` subresource (Allot's webhooks do not see it), then Allot's view waited
//! for until it holds every pod as bound.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use super::allot_process::Allot;
use super::support::cluster::metric;
use super::{NAMESPACES, NODE_NAMES, post_json};

/// Binds pods `p-0` .. `p-{count-1}` to `node-0000` .. (round robin over [`NODE_NAMES`]) with
/// `clients` requests in flight; returns the seconds it took. Any failure fails the run.
pub(crate) async fn bind_pods(client: &kube::Client, count: usize, clients: usize) -> f64 {
    let started = Instant::now();
    let failures: Vec<String> = futures::stream::iter(0..count)
        .map(|i| {
            let client = client.clone();
            async move {
                let (ns, name) = (format!("scale-{:02}", i % NAMESPACES), format!("p-{i}"));
                let body = json!({
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": format!("node-{:04}", i % NODE_NAMES)}
                });
                let path = format!("/api/v1/namespaces/{ns}/pods/{name}/binding");
                post_json(&client, &path, &body).await.map(|e| format!("{ns}/{name}: {e}"))
            }
        })
        .buffer_unordered(clients)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    assert!(failures.is_empty(), "{} of {count} bindings failed, first: {}", failures.len(), failures[0]);
    started.elapsed().as_secs_f64()
}

/// The one-GPU pods Allot holds as bound (its `allot_team_accelerators` gauge).
fn bound(allot: &Allot) -> Option<usize> {
    let series = "allot_team_accelerators{team=\"scale\",resource=\"nvidia.com/gpu\",state=\"bound\"}";
    metric(&allot.metrics, series).map(|v| v as usize)
}

/// Waits until Allot holds `pods` pods as bound (at most `timeout`).
pub(crate) async fn wait_bound(allot: &Allot, pods: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while bound(allot) != Some(pods) {
        assert!(
            Instant::now() < deadline,
            "allot holds {:?} pods bound, expected {pods} within {timeout:?}",
            bound(allot)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
