//! Team quotas end to end on a real control plane (skipped without the envtest binaries): deny
//! mode rejects the 9th GPU with the numbers, charges every gang member and refuses members
//! beyond the declared size; queue mode holds a pod behind `allot.dev/quota`
//! and releases it when a running pod goes; a gang of 4 with 3 GPUs of quota left stays whole.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::cluster::{Assets, Cluster, wait_for};

const TEAMS: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-team}
spec:
  namespaces: {names: [quota-deny]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 8}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: queue-team}
spec:
  namespaces: {names: [quota-queue]}
  quota: {mode: Queue, limits: {nvidia.com/gpu: 2}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: gang-team}
spec:
  namespaces: {names: [quota-gang]}
  quota: {mode: Queue, limits: {nvidia.com/gpu: 4}}
"#;

fn gpu_pod(name: &str, gpus: u32, gang: Option<(&str, u32)>) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}
    });
    if let Some((g, size)) = gang {
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": g});
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": size.to_string()});
    }
    serde_json::from_value(pod).unwrap()
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

/// The `allot.dev/QuotaReady` condition: (status, message).
fn quota_condition(pod: &Pod) -> Option<(String, String)> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "allot.dev/QuotaReady")?;
    Some((c.status.clone(), c.message.clone().unwrap_or_default()))
}

async fn get(pods: &Api<Pod>, name: &str) -> Pod {
    pods.get(name).await.expect("get pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_on_a_real_control_plane() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("quotas_on_a_real_control_plane") else { return };
    let cluster = Cluster::start_with(&assets, &[("teams-e2e.yaml", TEAMS)]).await;

    // --- Deny: 8 GPUs admitted, the 9th refused with the numbers. ---
    let deny: Api<Pod> = Api::namespaced(cluster.client.clone(), "quota-deny");
    for i in 0..4 {
        deny.create(&PostParams::default(), &gpu_pod(&format!("d-{i}"), 2, None)).await.expect("within quota");
    }
    let err = deny.create(&PostParams::default(), &gpu_pod("d-over", 1, None)).await.expect_err("over quota");
    let message = err.to_string();
    assert!(
        message.contains("team deny-team uses 8 of 8 nvidia.com/gpu in namespaces quota-deny; this pod asks 1"),
        "{message}"
    );
    // A dry run is evaluated but reserves nothing: after deleting one pod, exactly 2 fit again.
    deny.delete("d-0", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    wait_for("the deleted pod to leave the usage", Duration::from_secs(20), || async {
        deny.create(&PostParams { dry_run: true, ..Default::default() }, &gpu_pod("d-dry", 2, None)).await.is_ok()
    })
    .await;
    deny.create(&PostParams::default(), &gpu_pod("d-4", 2, None)).await.expect("room again");
    assert!(deny.create(&PostParams::default(), &gpu_pod("d-5", 1, None)).await.is_err());

    // --- Deny through gangs: every member is charged, none beyond the declared size. ---
    for name in ["d-1", "d-2", "d-3", "d-4"] {
        deny.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    }
    wait_for("the deleted pods to leave the usage", Duration::from_secs(20), || async {
        deny.create(&PostParams { dry_run: true, ..Default::default() }, &gpu_pod("d-dry", 8, None)).await.is_ok()
    })
    .await;
    // The issue's attempt: one-GPU members of a gang declared 2; the third is refused.
    for i in 0..2 {
        deny.create(&PostParams::default(), &gpu_pod(&format!("g-{i}"), 1, Some(("g", 2)))).await.expect("member");
    }
    let message =
        deny.create(&PostParams::default(), &gpu_pod("g-2", 1, Some(("g", 2)))).await.expect_err("beyond").to_string();
    assert!(message.contains("gang g declares 2 members; 2 exist already"), "{message}");
    // A first member of 1 GPU charges the gang 2; a second of 8 would make it 9.
    deny.create(&PostParams::default(), &gpu_pod("h-0", 1, Some(("h", 2)))).await.expect("first member");
    let message =
        deny.create(&PostParams::default(), &gpu_pod("h-1", 8, Some(("h", 2)))).await.expect_err("larger").to_string();
    assert!(
        message.contains("team deny-team uses 4 of 8 nvidia.com/gpu in namespaces quota-deny; gang h of 2 asks 9 in all, 7 more with this member"),
        "{message}"
    );
    deny.create(&PostParams::default(), &gpu_pod("h-1", 4, Some(("h", 2)))).await.expect("room for 4");
    // Gang g: 2; gang h: 1 + 4. Seven of eight: a 2-GPU pod is refused.
    let message = deny.create(&PostParams::default(), &gpu_pod("d-6", 2, None)).await.expect_err("over").to_string();
    assert!(message.contains("team deny-team uses 7 of 8 nvidia.com/gpu"), "{message}");

    // --- Queue: 2 GPUs of quota, three 1-GPU pods: two run, the third waits behind the gate. ---
    let queue: Api<Pod> = Api::namespaced(cluster.client.clone(), "quota-queue");
    for i in 0..3 {
        queue.create(&PostParams::default(), &gpu_pod(&format!("q-{i}"), 1, None)).await.expect("queued, not denied");
    }
    wait_for("two pods released from the quota queue, one held", Duration::from_secs(30), || async {
        let mut held = 0;
        for i in 0..3 {
            if gates(&get(&queue, &format!("q-{i}")).await).contains(&"allot.dev/quota".to_string()) {
                held += 1;
            }
        }
        held == 1
    })
    .await;
    let mut released = Vec::new();
    for i in 0..3 {
        let name = format!("q-{i}");
        if gates(&get(&queue, &name).await).is_empty() {
            released.push(name);
        }
    }
    assert_eq!(released, ["q-0", "q-1"], "oldest first");
    // `kubectl describe` says why the third waits, and that the others were let go.
    wait_for("the held pod to say why it waits", Duration::from_secs(20), || async {
        quota_condition(&get(&queue, "q-2").await).is_some_and(|(status, message)| {
            status == "False" && message == "team queue-team uses 2 of 2 nvidia.com/gpu; this asks 1"
        })
    })
    .await;
    let (status, _) = quota_condition(&get(&queue, "q-0").await).expect("released pods carry the condition");
    assert_eq!(status, "True");
    queue.delete("q-0", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    wait_for("the held pod released when a running pod goes", Duration::from_secs(30), || async {
        gates(&get(&queue, "q-2").await).is_empty()
    })
    .await;

    // --- A gang of 4 with 3 GPUs of quota left stays whole-gated; 4 left: released whole. ---
    let gang: Api<Pod> = Api::namespaced(cluster.client.clone(), "quota-gang");
    gang.create(&PostParams::default(), &gpu_pod("solo", 1, None)).await.expect("solo");
    wait_for("the solo pod admitted by quota", Duration::from_secs(30), || async {
        gates(&get(&gang, "solo").await).is_empty()
    })
    .await;
    for i in 0..4 {
        gang.create(&PostParams::default(), &gpu_pod(&format!("g-{i}"), 1, Some(("ring", 4)))).await.expect("member");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..4 {
        let g = gates(&get(&gang, &format!("g-{i}")).await);
        assert!(
            g.contains(&"allot.dev/quota".to_string()) && g.contains(&"allot.dev/gang".to_string()),
            "g-{i}: {g:?}"
        );
    }
    gang.delete("solo", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    wait_for("the whole gang released from the quota queue", Duration::from_secs(30), || async {
        let mut ok = true;
        for i in 0..4 {
            ok &= !gates(&get(&gang, &format!("g-{i}")).await).contains(&"allot.dev/quota".to_string());
        }
        ok
    })
    .await;
}
