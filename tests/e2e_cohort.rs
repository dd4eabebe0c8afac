//! Borrowing between the teams of a cohort on a real control plane (skipped without the envtest
//! binaries), as two tenants, each with a namespaced Role and nothing else: imaging and speech have
//! 4 GPUs each in cohort research (queue mode). While speech is idle, imaging's 5th and 6th pods
//! are released on speech's unused quota and marked `allot.dev/borrowed-from: research` (a key
//! the tenant can neither write nor remove); speech then gets the 2 GPUs still unused, and its
//! third pod, within its nominal quota, reclaims one GPU: imaging's newest pod is evicted (a fake
//! kubelet runs bound pods and finishes deletions), told why, and nothing else is. A borrowing
//! gang is evicted whole; a budget that refuses a reclaim turns it to other borrowed work.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::cluster::{Assets, Cluster, gang_gated, gang_member, impersonating, metric, tenant_namespace, wait_for};
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
    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
           {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["create", "get", "list"]}])
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

/// The cohort on a real control plane: a node of 8 GPUs, fake kubelets (pods run, and go 2 s
/// after an eviction), alice in imaging and bob in speech as tenants.
struct Research {
    cluster: Cluster,
    admin: kube::Client,
    kubelets: [tokio::task::JoinHandle<()>; 2],
    alice: kube::Client,
    imaging: Api<Pod>,
    speech: Api<Pod>,
}

impl Research {
    /// None (the test is skipped) without the envtest binaries.
    async fn start(test: &str) -> Option<Research> {
        allot::install_crypto_provider();
        let assets = Assets::from_env(test)?;
        let cluster = Cluster::start_with(&assets, &[("cohort-e2e.yaml", TEAMS)]).await;
        let admin = cluster.client.clone();
        tenant_namespace(&admin, "imaging", "alice", tenant_rules()).await;
        tenant_namespace(&admin, "speech", "bob", tenant_rules()).await;
        // (Beside the cluster's two nodes of 2 GPUs.)
        cluster.add_gpu_node("cohort-gpus", 8).await;
        let kubelets = ["imaging", "speech"].map(|ns| fake_kubelet(admin.clone(), ns, Duration::from_secs(2)));
        let alice = impersonating(&cluster.kubeconfig, "alice").await;
        let imaging = Api::namespaced(alice.clone(), "imaging");
        let speech = Api::namespaced(impersonating(&cluster.kubeconfig, "bob").await, "speech");
        Some(Research { cluster, admin, kubelets, alice, imaging, speech })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_teams_quota_is_lent_and_reclaimed_from_the_newest_borrowed_pod() {
    let Some(Research { cluster, admin, kubelets, imaging, speech, .. }) =
        Research::start("an_idle_teams_quota_is_lent_and_reclaimed_from_the_newest_borrowed_pod").await
    else {
        return;
    };

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

/// A one-GPU pod labelled `app: NAME` (what a budget selects).
fn labelled_pod(name: &str) -> Pod {
    let mut pod = gpu_pod(name);
    pod.metadata.labels = Some([("app".to_string(), name.to_string())].into());
    pod
}

/// Whether `name` of `pods` is gone, or is being deleted.
async fn leaving(pods: &Api<Pod>, name: &str) -> bool {
    pods.get_opt(name).await.is_ok_and(|p| p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_borrowing_gang_is_reclaimed_whole_and_a_budget_turns_a_reclaim_to_other_borrowed_work() {
    let Some(Research { cluster, admin, kubelets, alice, imaging, speech }) =
        Research::start("a_borrowing_gang_is_reclaimed_whole_and_a_budget_turns_a_reclaim_to_other_borrowed_work")
            .await
    else {
        return;
    };
    let metrics = &cluster.allot_metrics;

    // --- imaging fills its nominal quota, then its gang of 2 is released on speech's. ---
    create_released(&imaging, &["i0", "i1", "i2", "i3"]).await;
    for name in ["g-0", "g-1"] {
        imaging.create(&PostParams::default(), &gang_member(name, "g", 2)).await.expect("a tenant creates a member");
    }
    wait_bound(&admin, "imaging", &["i0", "i1", "i2", "i3", "g-0", "g-1"]).await;
    for name in ["g-0", "g-1"] {
        let pod = imaging.get(name).await.expect("get");
        assert!(!quota_gated(&pod) && !gang_gated(&pod), "{name} released");
        assert_eq!(borrowed_from(&pod).as_deref(), Some("research"), "{name} runs on borrowed quota");
    }
    create_released(&speech, &["s0", "s1"]).await;

    // --- speech's third pod reclaims: the gang is the newest borrowed work, and goes whole. ---
    speech.create(&PostParams::default(), &gpu_pod("s2")).await.expect("queued, not denied");
    wait_for("the gang evicted whole, and s2 released", Duration::from_secs(60), || async {
        leaving(&imaging, "g-0").await
            && leaving(&imaging, "g-1").await
            && speech.get("s2").await.is_ok_and(|p| !quota_gated(&p))
    })
    .await;
    let told = events(&admin, "imaging", "Preempted").await;
    let whole = "reclaimed by team speech of cohort research: team imaging ran this on quota borrowed from the cohort, \
                 and pod/speech/s2 asks 1 nvidia.com/gpu within team speech's nominal quota: gang imaging/g is evicted \
                 whole";
    let mut victims: Vec<&str> = told.iter().map(|(pod, _)| pod.as_str()).collect();
    victims.sort();
    assert_eq!(victims, ["g-0", "g-1"], "{told:?}");
    assert!(told.iter().all(|(_, note)| note == whole), "{told:?}");
    for name in ["i0", "i1", "i2", "i3"] {
        assert!(!leaving(&imaging, name).await, "{name} was not needed");
    }
    assert_eq!(metric(metrics, r#"allot_quota_reclaims_total{team="speech"}"#), Some(1.0));
    assert_eq!(metric(metrics, r#"allot_evicted_pods_total{team="imaging",reason="Reclaimed"}"#), Some(2.0));

    a_budget_turns_the_reclaim_to_other_borrowed_work(&cluster, &alice, &imaging, &speech).await;
    kubelets.into_iter().for_each(|k| k.abort());
}

/// imaging borrows the one GPU left and shields that pod with a budget: speech's next pod
/// reclaims, the budget refuses i4's eviction (speech's pod is told), and i3 goes instead.
async fn a_budget_turns_the_reclaim_to_other_borrowed_work(
    cluster: &Cluster,
    alice: &kube::Client,
    imaging: &Api<Pod>,
    speech: &Api<Pod>,
) {
    let (admin, metrics) = (&cluster.client, &cluster.allot_metrics);
    // --- imaging borrows the GPU left unused and shields that pod with a budget. ---
    imaging.create(&PostParams::default(), &labelled_pod("i4")).await.expect("create");
    wait_bound(admin, "imaging", &["i4"]).await;
    assert_eq!(borrowed_from(&imaging.get("i4").await.expect("get")).as_deref(), Some("research"));
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "keep-i4"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "i4"}}}
    }))
    .expect("a budget");
    Api::<PodDisruptionBudget>::namespaced(alice.clone(), "imaging")
        .create(&PostParams::default(), &budget)
        .await
        .expect("a tenant creates a budget");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "imaging");
    wait_for("the budget counting i4 healthy", Duration::from_secs(30), || async {
        let status = budgets.get("keep-i4").await.ok().and_then(|b| b.status);
        status.is_some_and(|s| s.current_healthy == Some(1) && s.disruptions_allowed == Some(0))
    })
    .await;

    // --- speech's fourth pod: the budget refuses i4's eviction, so the reclaim takes i3. ---
    speech.create(&PostParams::default(), &gpu_pod("s3")).await.expect("queued, not denied");
    wait_for("i3 evicted in i4's place, and s3 released", Duration::from_secs(60), || async {
        leaving(imaging, "i3").await && speech.get("s3").await.is_ok_and(|p| !quota_gated(&p))
    })
    .await;
    assert!(!leaving(imaging, "i4").await, "the budget kept i4");
    for name in ["i0", "i1", "i2"] {
        assert!(!leaving(imaging, name).await, "{name} was not needed");
    }
    let refused = events(admin, "speech", "ReclaimRefused").await;
    assert!(
        refused.iter().any(|(pod, note)| pod == "s3"
            && note.starts_with("reclaiming quota lent by team speech by evicting pod imaging/i4 was refused")
            && note.contains("429")),
        "{refused:?}"
    );
    assert_eq!(metric(metrics, r#"allot_quota_reclaims_total{team="speech"}"#), Some(2.0));
    assert_eq!(metric(metrics, r#"allot_evicted_pods_total{team="imaging",reason="Reclaimed"}"#), Some(3.0));
    let refusals = r#"allot_gang_preemption_refused_evictions_total{team="speech",reason="disruption_budget"}"#;
    assert!(metric(metrics, refusals).is_some_and(|n| n >= 1.0), "{refusals}");
}
