//! Allot's preemption for gangs on a real control plane (API server, scheduler,
//! controller-manager; skipped without the envtest binaries), as a tenant, with a fake kubelet
//! that runs bound pods and finishes deletions after 2 s. Two nodes of 2 GPUs, full of
//! low-priority work; a high-priority gang of 2 × 1 GPU arrives. The scheduler never sees a gated
//! pod, so without Allot's preemption the gang would wait for as long as that work runs.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::cluster::{
    Assets, Cluster, gang_condition, gang_gated, gang_member, impersonating, tenant_namespace, wait_for,
};
use support::events::events;
use support::kubelet::fake_kubelet;

const GRACE: Duration = Duration::from_secs(2);

fn tenant_rules() -> serde_json::Value {
    json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
           {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["create", "get", "list"]}])
}

/// A bare one-GPU pod of `class`, labelled `app: NAME`.
fn plain(name: &str, class: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"priorityClassName": class, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("a pod")
}

/// A one-GPU member of gang `gang` of `size`, of `class`.
fn member(name: &str, gang: &str, size: u32, class: &str) -> Pod {
    let mut pod = gang_member(name, gang, size);
    if let Some(spec) = pod.spec.as_mut() {
        spec.priority_class_name = Some(class.into());
    }
    pod
}

fn bound(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) && p.metadata.deletion_timestamp.is_none()
}

/// The names of the pods of `ns` (being deleted or not).
async fn names(admin: &kube::Client, ns: &str) -> BTreeSet<String> {
    let list = Api::<Pod>::namespaced(admin.clone(), ns).list(&ListParams::default()).await.expect("list");
    list.items.into_iter().filter_map(|p| p.metadata.name).collect()
}

async fn create_all(api: &Api<Pod>, pods: Vec<Pod>) {
    for pod in pods {
        api.create(&PostParams::default(), &pod).await.expect("create");
    }
}

async fn wait_bound(admin: &kube::Client, ns: &str, pods: &[&str], within: Duration) {
    let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    wait_for(&format!("{pods:?} bound"), within, || async {
        let list = api.list(&ListParams::default()).await.expect("list");
        pods.iter().all(|name| list.items.iter().any(|p| p.metadata.name.as_deref() == Some(*name) && bound(p)))
    })
    .await;
}

/// Waits until `gang`'s two members are bound (released and scheduled), in at most `within`;
/// returns how long it took.
async fn gang_runs(admin: &kube::Client, ns: &str, gang: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let api: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let members = [format!("{gang}-0"), format!("{gang}-1")];
    loop {
        let list = api.list(&ListParams::default()).await.expect("list");
        let running =
            members.iter().all(|m| list.items.iter().any(|p| p.metadata.name.as_ref() == Some(m) && bound(p)));
        if running {
            return started.elapsed();
        }
        if started.elapsed() > within {
            let seen: Vec<String> = list
                .items
                .iter()
                .map(|p| {
                    format!(
                        "{} bound={} gated={} deleting={} {:?}",
                        p.metadata.name.as_deref().unwrap_or_default(),
                        bound(p),
                        gang_gated(p),
                        p.metadata.deletion_timestamp.is_some(),
                        gang_condition(p)
                    )
                })
                .collect();
            panic!("gang {gang} not running within {within:?}: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_gang_evicts_what_it_needs_no_more_and_a_budget_moves_the_choice() {
    allot::install_crypto_provider();
    let Some(assets) =
        Assets::from_env("a_high_priority_gang_evicts_what_it_needs_no_more_and_a_budget_moves_the_choice")
    else {
        return;
    };
    let cluster = Cluster::start(&assets).await;
    let admin = cluster.client.clone();
    tenant_namespace(&admin, "vision", "alice", tenant_rules()).await;
    let kubelet = fake_kubelet(admin.clone(), "vision", GRACE);
    let alice = impersonating(&cluster.kubeconfig, "alice").await;
    let pods: Api<Pod> = Api::namespaced(alice.clone(), "vision");

    // Four low-priority pods fill the 4 GPUs; the two made last lose the least work.
    create_all(&pods, vec![plain("low-0", "low-priority"), plain("low-1", "low-priority")]).await;
    wait_bound(&admin, "vision", &["low-0", "low-1"], Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_all(&pods, vec![plain("low-2", "low-priority"), plain("low-3", "low-priority")]).await;
    wait_bound(&admin, "vision", &["low-2", "low-3"], Duration::from_secs(30)).await;

    // A budget protects low-3: Allot's dry run is refused, and it evicts low-2 and an older one.
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "protect-low-3"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "low-3"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(alice.clone(), "vision")
        .create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
    // (The Eviction API ignores budgets for Pending pods: low-3 runs, and the budget counts it.)
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), "vision");
    wait_for("the budget's status counting low-3 healthy", Duration::from_secs(30), || async {
        let status = budgets.get("protect-low-3").await.ok().and_then(|b| b.status);
        status.is_some_and(|s| {
            s.observed_generation == Some(1) && s.current_healthy == Some(1) && s.disruptions_allowed == Some(0)
        })
    })
    .await;

    create_all(&pods, vec![member("high-0", "high", 2, "high-priority"), member("high-1", "high", 2, "high-priority")])
        .await;
    let took = gang_runs(&admin, "vision", "high", Duration::from_secs(10)).await;
    eprintln!("the high-priority gang ran {took:?} after it was created");

    let left = names(&admin, "vision").await;
    let lows: Vec<&String> = left.iter().filter(|n| n.starts_with("low-")).collect();
    assert_eq!(lows.len(), 2, "exactly two low-priority pods evicted: {left:?}");
    assert!(left.contains("low-3"), "the budget protected low-3: {left:?}");
    assert!(!left.contains("low-2"), "the newest unprotected one went: {left:?}");
    let preempted = events(&admin, "vision", "Preempted").await;
    assert_eq!(preempted.len(), 2, "{preempted:?}");
    for (_, note) in &preempted {
        assert!(
            note.starts_with(
                "preempted by gang vision/high (team vision, priority 1000000) to make room for its 2 pods"
            ),
            "{note}"
        );
    }
    let refused = events(&admin, "vision", "PreemptionRefused").await;
    assert!(
        refused.iter().any(|(pod, note)| pod == "high-0" && note.contains("pod vision/low-3") && note.contains("429")),
        "{refused:?}"
    );
    let metrics = &cluster.allot_metrics;
    let metric = |name: &str| support::cluster::metric(metrics, name).unwrap_or(-1.0);
    assert_eq!(metric("allot_gang_preemptions_total{team=\"vision\"}"), 1.0);
    assert_eq!(metric("allot_evicted_pods_total{team=\"vision\",reason=\"Preempted\"}"), 2.0);
    // A PodDisruptionBudget refuses with 429: counted under that reason.
    let refused = "allot_gang_preemption_refused_evictions_total{team=\"vision\",reason=\"disruption_budget\"}";
    assert!(metric(refused) >= 1.0);
    kubelet.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_priority_gangs_are_evicted_whole_never_in_part() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("low_priority_gangs_are_evicted_whole_never_in_part") else {
        return;
    };
    let cluster = Cluster::start(&assets).await;
    let admin = cluster.client.clone();
    tenant_namespace(&admin, "vision", "alice", tenant_rules()).await;
    let kubelet = fake_kubelet(admin.clone(), "vision", GRACE);
    let alice = impersonating(&cluster.kubeconfig, "alice").await;
    let pods: Api<Pod> = Api::namespaced(alice.clone(), "vision");
    for gang in ["a", "b"] {
        create_all(
            &pods,
            vec![
                member(&format!("{gang}-0"), gang, 2, "low-priority"),
                member(&format!("{gang}-1"), gang, 2, "low-priority"),
            ],
        )
        .await;
        wait_bound(&admin, "vision", &[&format!("{gang}-0"), &format!("{gang}-1")], Duration::from_secs(30)).await;
    }
    shield_refused(&admin, &pods).await;
    create_all(&pods, vec![member("high-0", "high", 2, "high-priority"), member("high-1", "high", 2, "high-priority")])
        .await;
    // Never part of a gang: each low gang has both members or neither (that is not going),
    // but for the moment between the evictions of its two members.
    let started = Instant::now();
    let all: Api<Pod> = Api::namespaced(admin.clone(), "vision");
    let mut in_part: std::collections::BTreeMap<&str, Instant> = Default::default();
    loop {
        let list = all.list(&ListParams::default()).await.expect("list");
        let live = |name: &str| {
            list.items
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(name) && p.metadata.deletion_timestamp.is_none())
        };
        for gang in ["a", "b"] {
            if live(&format!("{gang}-0")) == live(&format!("{gang}-1")) {
                in_part.remove(gang);
            } else {
                let since = *in_part.entry(gang).or_insert_with(Instant::now);
                assert!(
                    since.elapsed() < Duration::from_secs(1),
                    "gang {gang} in part: {:?}",
                    names(&admin, "vision").await
                );
            }
        }
        let high = |p: &&Pod| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("high-")) && bound(p);
        if list.items.iter().filter(high).count() == 2 {
            break;
        }
        let left = names(&admin, "vision").await;
        assert!(started.elapsed() < Duration::from_secs(10), "the high gang did not run in 10 s: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = names(&admin, "vision").await;
    let kept: Vec<&str> = ["a", "b"].into_iter().filter(|g| left.contains(&format!("{g}-0"))).collect();
    assert_eq!(kept.len(), 1, "one whole gang evicted, the other untouched: {left:?}");
    let preempted = events(&admin, "vision", "Preempted").await;
    assert_eq!(preempted.len(), 2, "{preempted:?}");
    assert!(preempted.iter().all(|(_, note)| note.contains("is evicted whole")), "{preempted:?}");
    kubelet.abort();
}

/// A tenant cannot shield a low-priority gang by giving one member a high class (a gang at or
/// above its preemptor's priority is no victim, and one member sets a gang's priority): the
/// member that differs is refused at CREATE, and nothing is created.
async fn shield_refused(admin: &kube::Client, pods: &Api<Pod>) {
    create_all(pods, vec![member("mixed-0", "mixed", 2, "low-priority")]).await;
    // Allot's view has the first member once its controller says the gang waits for one more.
    let all: Api<Pod> = Api::namespaced(admin.clone(), "vision");
    wait_for("mixed-0 seen waiting", Duration::from_secs(30), || async {
        all.get("mixed-0").await.ok().and_then(|p| gang_condition(&p)).is_some_and(|(status, ..)| status == "False")
    })
    .await;
    let refused = pods.create(&PostParams::default(), &member("mixed-1", "mixed", 2, "high-priority")).await;
    let message = match refused {
        Err(kube::Error::Api(e)) => e.message,
        other => panic!("a gang member of another priority class was not refused: {other:?}"),
    };
    assert!(
        message.contains("this pod has priorityClassName high-priority, member mixed-0 has low-priority"),
        "{message}"
    );
    assert!(!names(admin, "vision").await.contains("mixed-1"), "nothing is created");
    pods.delete("mixed-0", &DeleteParams::default()).await.expect("delete");
    wait_for("mixed-0 gone", Duration::from_secs(30), || async {
        all.get_opt("mixed-0").await.ok().flatten().is_none()
    })
    .await;
}

const TEAMS: &str = "apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: patient}
spec:
  namespaces: {names: [patient]}
  priority: {default: low-priority, allowed: [low-priority]}
  preemption: {minRuntime: 1h}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: guarded}
spec:
  namespaces: {names: [guarded]}
  priority: {default: low-priority, allowed: [low-priority, high-priority]}
  preemption: {otherTeams: Never}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_teams_never_and_min_runtime_spare_what_they_protect() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("other_teams_never_and_min_runtime_spare_what_they_protect") else {
        return;
    };
    let cluster = Cluster::start_with(&assets, &[("preemption-teams.yaml", TEAMS)]).await;
    let admin = cluster.client.clone();
    let mut kubelets = Vec::new();
    for ns in ["vision", "patient", "guarded"] {
        tenant_namespace(&admin, ns, "alice", tenant_rules()).await;
        kubelets.push(fake_kubelet(admin.clone(), ns, GRACE));
    }
    let alice = impersonating(&cluster.kubeconfig, "alice").await;
    let api = |ns: &str| Api::<Pod>::namespaced(alice.clone(), ns);
    // Vision's low-priority pods are the oldest; patient's, newer (cheaper) but inside their
    // team's one-hour minRuntime.
    create_all(&api("vision"), vec![plain("old-0", "low-priority"), plain("old-1", "low-priority")]).await;
    wait_bound(&admin, "vision", &["old-0", "old-1"], Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_all(&api("patient"), vec![plain("new-0", "low-priority"), plain("new-1", "low-priority")]).await;
    wait_bound(&admin, "patient", &["new-0", "new-1"], Duration::from_secs(30)).await;

    // Guarded may evict only its own team's work: it has none running, so it waits.
    let guarded = api("guarded");
    create_all(&guarded, vec![member("g-0", "g", 2, "high-priority"), member("g-1", "g", 2, "high-priority")]).await;
    let admin_guarded: Api<Pod> = Api::namespaced(admin.clone(), "guarded");
    wait_for("the guarded gang told it does not fit", Duration::from_secs(15), || async {
        admin_guarded
            .get("g-0")
            .await
            .ok()
            .and_then(|p| gang_condition(&p))
            .is_some_and(|(_, reason, _)| reason == "InsufficientResources")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(names(&admin, "vision").await.len(), 2, "otherTeams: Never evicted nothing");
    assert_eq!(names(&admin, "patient").await.len(), 2);
    assert!(events(&admin, "vision", "Preempted").await.is_empty());
    for name in ["g-0", "g-1"] {
        guarded.delete(name, &DeleteParams::default()).await.expect("delete");
    }

    // Vision's high gang: patient's pods are cheaper but too young; vision's own old ones go.
    create_all(
        &api("vision"),
        vec![member("high-0", "high", 2, "high-priority"), member("high-1", "high", 2, "high-priority")],
    )
    .await;
    gang_runs(&admin, "vision", "high", Duration::from_secs(10)).await;
    assert_eq!(names(&admin, "patient").await, BTreeSet::from(["new-0".to_string(), "new-1".to_string()]));
    let vision = names(&admin, "vision").await;
    assert!(!vision.contains("old-0") && !vision.contains("old-1"), "{vision:?}");
    for k in kubelets {
        k.abort();
    }
}
