//! Borrowing between the teams of a cohort on a real control plane (skipped without the envtest
//! binaries), as two tenants, each with a namespaced Role and nothing else: imaging and speech have
//! 4 GPUs each in cohort research (queue mode). While speech is idle, imaging's 5th and 6th pods
//! are released on speech's unused quota and marked `allot.dev/borrowed-from: research` (a key
//! the tenant can neither write nor remove); speech then gets the 2 GPUs still unused, and its
//! third pod, within its nominal quota, reclaims one GPU: imaging's newest pod is evicted (a fake
//! kubelet runs bound pods and finishes deletions), told why, and nothing else is.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::cluster::{Assets, Cluster, impersonating, metric, tenant_namespace, wait_for};
use support::events::events;
use support::kubelet::fake_kubelet;

const TEAMS: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: imaging}
spec:
  namespaces: {names: [imaging]}
  quota: {mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: speech}
spec:
  namespaces: {names: [speech]}
  quota: {mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}
"#;

const BORROWED_FROM: &str = "allot.dev/borrowed-from";

fn tenant_rules() -> serde_json::Value {
    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete", "patch"]}])
}

fn gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("a pod")
}

fn quota_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == "allot.dev/quota"))
}

fn borrowed_from(pod: &Pod) -> Option<String> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(BORROWED_FROM)).cloned()
}

/// The `allot.dev/QuotaReady` condition's message.
fn quota_message(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "allot.dev/QuotaReady").and_then(|c| c.message.clone())
}

/// Waits until `names` of `ns` are bound and running (the scheduler and the fake kubelet).
async fn wait_bound(admin: &kube::Client, ns: &str, names: &[&str]) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    wait_for(&format!("{names:?} running"), Duration::from_secs(60), || async {
        let list = pods.list(&ListParams::default()).await.expect("list");
        names.iter().all(|n| {
            list.items.iter().any(|p| {
                p.metadata.name.as_deref() == Some(*n)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
        })
    })
    .await;
}

/// Creates `names` one after the other, each once the previous has left the queue (so the
/// order they are released in is the order they were made in).
async fn create_released(pods: &Api<Pod>, names: &[&str]) {
    for name in names {
        pods.create(&PostParams::default(), &gpu_pod(name)).await.expect("a tenant creates a pod");
        wait_for(&format!("{name} released from the quota queue"), Duration::from_secs(30), || async {
            pods.get(name).await.is_ok_and(|p| !quota_gated(&p))
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_teams_quota_is_lent_and_reclaimed_from_the_newest_borrowed_pod() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("an_idle_teams_quota_is_lent_and_reclaimed_from_the_newest_borrowed_pod")
    else {
        return;
    };
    let cluster = Cluster::start_with(&assets, &[("cohort-e2e.yaml", TEAMS)]).await;
    let admin = cluster.client.clone();
    tenant_namespace(&admin, "imaging", "alice", tenant_rules()).await;
    tenant_namespace(&admin, "speech", "bob", tenant_rules()).await;
    // Pods run (a node of 8 GPUs beside the two of 2) and go when evicted, after 2 s.
    cluster.add_gpu_node("cohort-gpus", 8).await;
    let kubelets = ["imaging", "speech"].map(|ns| fake_kubelet(admin.clone(), ns, Duration::from_secs(2)));
    let imaging: Api<Pod> = Api::namespaced(impersonating(&cluster.kubeconfig, "alice").await, "imaging");
    let speech: Api<Pod> = Api::namespaced(impersonating(&cluster.kubeconfig, "bob").await, "speech");

    // --- speech is idle: imaging's 5th and 6th pods go on its quota, and say so. ---
    create_released(&imaging, &["i0", "i1", "i2", "i3", "i4", "i5"]).await;
    for (name, wanted) in [("i0", None), ("i3", None), ("i4", Some("research")), ("i5", Some("research"))] {
        let pod = imaging.get(name).await.expect("get");
        assert_eq!(borrowed_from(&pod).as_deref(), wanted, "{name}");
    }
    let metrics = &cluster.allot_metrics;
    wait_for("the borrowed and lent gauges", Duration::from_secs(10), || async {
        metric(metrics, r#"allot_quota_borrowed{team="imaging",resource="nvidia.com/gpu"}"#) == Some(2.0)
            && metric(metrics, r#"allot_quota_lent{team="speech",resource="nvidia.com/gpu"}"#) == Some(2.0)
    })
    .await;

    // --- The tenant can neither claim borrowed status nor shed it. ---
    let mut forged = gpu_pod("forged");
    forged.metadata.annotations = Some([(BORROWED_FROM.to_string(), "research".to_string())].into());
    let refused = imaging.create(&PostParams::default(), &forged).await.expect_err("a reserved key").to_string();
    assert!(refused.contains(BORROWED_FROM), "{refused}");
    let strip = json!({"metadata": {"annotations": {BORROWED_FROM: null}}});
    let refused = imaging
        .patch("i5", &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .expect_err("shed the mark")
        .to_string();
    assert!(refused.contains(BORROWED_FROM), "{refused}");

    // --- speech gets the 2 GPUs nobody uses; for its third, imaging's newest pod is reclaimed. ---
    create_released(&speech, &["s0", "s1"]).await;
    for name in ["s0", "s1"] {
        assert_eq!(borrowed_from(&speech.get(name).await.expect("get")), None, "{name} is within speech's nominal");
    }
    wait_bound(&admin, "imaging", &["i0", "i1", "i2", "i3", "i4", "i5"]).await;
    speech.create(&PostParams::default(), &gpu_pod("s2")).await.expect("queued, not denied");
    wait_for("i5 evicted, and s2 released once it is gone", Duration::from_secs(60), || async {
        let gone = imaging.get_opt("i5").await.is_ok_and(|p| p.is_none());
        gone && speech.get("s2").await.is_ok_and(|p| !quota_gated(&p))
    })
    .await;
    assert_eq!(borrowed_from(&speech.get("s2").await.expect("get")), None);
    let told = events(&admin, "imaging", "Preempted").await;
    assert_eq!(
        told,
        [(
            "i5".to_string(),
            "reclaimed by team speech of cohort research: team imaging ran this on quota borrowed from the cohort, \
             and pod/speech/s2 asks 1 nvidia.com/gpu within team speech's nominal quota: this pod is evicted"
                .to_string()
        )]
    );
    assert_eq!(metric(metrics, r#"allot_quota_reclaims_total{team="speech"}"#), Some(1.0));
    assert_eq!(metric(metrics, r#"allot_evicted_pods_total{team="imaging",reason="Reclaimed"}"#), Some(1.0));
    wait_for("the gauges follow", Duration::from_secs(10), || async {
        metric(metrics, r#"allot_quota_borrowed{team="imaging",resource="nvidia.com/gpu"}"#) == Some(1.0)
            && metric(metrics, r#"allot_quota_lent{team="speech",resource="nvidia.com/gpu"}"#) == Some(1.0)
    })
    .await;

    // --- No loop: the cohort is full, imaging's next pod waits with the numbers, nobody else goes. ---
    imaging.create(&PostParams::default(), &gpu_pod("i6")).await.expect("queued");
    wait_for("i6 told why it waits", Duration::from_secs(30), || async {
        imaging.get("i6").await.ok().and_then(|p| quota_message(&p)).is_some_and(|m| {
            m == "team imaging uses 5 of 4 nvidia.com/gpu (1 borrowed from cohort research); this asks 1; the cohort \
                  has 0 unused"
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (pods, names) in [(&imaging, &["i0", "i1", "i2", "i3", "i4"][..]), (&speech, &["s0", "s1", "s2"][..])] {
        for name in names {
            let pod = pods.get(name).await.expect("still there");
            assert!(pod.metadata.deletion_timestamp.is_none(), "{name} must not be evicted");
        }
    }
    assert_eq!(metric(metrics, r#"allot_quota_reclaims_total{team="speech"}"#), Some(1.0));
    kubelets.into_iter().for_each(|k| k.abort());
}
