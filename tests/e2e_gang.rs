//! Gangs end to end on a real control plane (skipped without the envtest binaries):
//! the 2×4 deadlock becomes "one gang whole, the other whole-gated, then released"; an
//! incomplete gang stays gated with its explanation; a controller restart releases nothing twice;
//! a tenant's gang created one pod at a time costs the controller a bounded number of writes.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::cluster::{Assets, Cluster, gang_condition, gang_gated as gated, gang_member as gpu_pod, wait_for};

fn node_of(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

async fn members(pods: &Api<Pod>, gang: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("allot.dev/gang-name={gang}"))).await.expect("list").items
}

async fn force_delete(pods: &Api<Pod>, names: &[String]) {
    for n in names {
        let _ = pods.delete(n, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gangs_on_a_real_control_plane() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("gangs_on_a_real_control_plane") else { return };
    let mut cluster = Cluster::start(&assets).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "vision");

    // --- The 2×4 deadlock: two gangs of 4 × 1 GPU on 2 + 2 GPUs, created interleaved. ---
    let mut last_created = Instant::now();
    for i in 0..4 {
        for gang in ["alpha", "beta"] {
            pods.create(&PostParams::default(), &gpu_pod(&format!("{gang}-{i}"), gang, 4))
                .await
                .expect("create member");
            last_created = Instant::now();
        }
    }
    // Polled by hand (not wait_for) to time the release.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut release_latency = None;
    loop {
        let a = members(&pods, "alpha").await;
        let b = members(&pods, "beta").await;
        if release_latency.is_none() && (a.iter().all(|p| !gated(p)) || b.iter().all(|p| !gated(p))) {
            release_latency = Some(last_created.elapsed());
        }
        let whole_bound = |g: &[Pod]| g.len() == 4 && g.iter().all(|p| node_of(p).is_some());
        let whole_gated = |g: &[Pod]| g.len() == 4 && g.iter().all(gated);
        if (whole_bound(&a) && whole_gated(&b)) || (whole_bound(&b) && whole_gated(&a)) {
            break;
        }
        assert!(Instant::now() < deadline, "timed out: one gang bound whole, the other gated whole");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "release latency (last member created -> all gates of the gang removed): {:?}",
        release_latency.unwrap_or_default()
    );
    let (first, second) = if members(&pods, "alpha").await.iter().all(|p| node_of(p).is_some()) {
        ("alpha", "beta")
    } else {
        ("beta", "alpha")
    };
    let placed = members(&pods, first).await;
    let mut nodes: Vec<String> = placed.iter().filter_map(node_of).collect();
    nodes.sort();
    assert_eq!(nodes, ["gpu-node-1", "gpu-node-1", "gpu-node-2", "gpu-node-2"], "the gang spreads over both nodes");
    for p in &placed {
        // Placement added the toleration the tainted nodes need, end to end.
        let tolerations = p.spec.as_ref().unwrap().tolerations.clone().unwrap_or_default();
        assert!(tolerations.iter().any(|t| t.key.as_deref() == Some("nvidia.com/gpu")));
        assert!(p.metadata.annotations.as_ref().unwrap().contains_key("allot.dev/gang-released"));
    }
    wait_for("the waiting gang's explanation", Duration::from_secs(30), || async {
        members(&pods, second).await.iter().all(|p| {
            gang_condition(p).is_some_and(|(status, reason, message)| {
                status == "False"
                    && reason == "InsufficientResources"
                    && message.contains("needs 4 nvidia.com/gpu")
                    && message.contains("0 free")
            })
        })
    })
    .await;

    // --- A controller restart while one gang runs and one waits: nothing changes. ---
    cluster.stop_allot();
    cluster.start_allot();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        members(&pods, second).await.iter().all(gated),
        "a restart must not release the waiting gang onto busy GPUs"
    );

    // --- The first job ends: the second goes, whole. ---
    let names: Vec<String> = placed.iter().filter_map(|p| p.metadata.name.clone()).collect();
    force_delete(&pods, &names).await;
    wait_for("the second gang released and bound whole", Duration::from_secs(60), || async {
        let g = members(&pods, second).await;
        g.len() == 4 && g.iter().all(|p| !gated(p) && node_of(p).is_some())
    })
    .await;
    wait_for("the released gang's condition", Duration::from_secs(30), || async {
        members(&pods, second)
            .await
            .iter()
            .all(|p| gang_condition(p).is_some_and(|(status, reason, _)| status == "True" && reason == "Released"))
    })
    .await;
    let names: Vec<String> = members(&pods, second).await.iter().filter_map(|p| p.metadata.name.clone()).collect();
    force_delete(&pods, &names).await;

    // --- An incomplete gang stays gated and says why. ---
    for i in 0..3 {
        pods.create(&PostParams::default(), &gpu_pod(&format!("gamma-{i}"), "gamma", 4)).await.expect("create");
    }
    wait_for("the incomplete gang's explanation", Duration::from_secs(30), || async {
        let g = members(&pods, "gamma").await;
        g.len() == 3
            && g.iter().all(|p| {
                gated(p)
                    && gang_condition(p).is_some_and(|(_, reason, message)| {
                        reason == "WaitingForMembers" && message.starts_with("3/4 members present")
                    })
            })
    })
    .await;
    // The fourth arrives: released.
    pods.create(&PostParams::default(), &gpu_pod("gamma-3", "gamma", 4)).await.expect("create");
    wait_for("the completed gang released", Duration::from_secs(30), || async {
        let g = members(&pods, "gamma").await;
        g.len() == 4 && g.iter().all(|p| !gated(p))
    })
    .await;

    // --- An inferred gang: an Indexed Job (GangPolicy infer: [Job]) needs no labels at all. ---
    let names: Vec<String> = members(&pods, "gamma").await.iter().filter_map(|p| p.metadata.name.clone()).collect();
    force_delete(&pods, &names).await;
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), "vision");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "indexed"},
        "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.expect("job");
    wait_for("the Indexed Job's pods released together", Duration::from_secs(60), || async {
        let list =
            pods.list(&ListParams::default().labels("batch.kubernetes.io/job-name=indexed")).await.expect("list").items;
        // Released by the controller (so gated at creation), not merely never gated.
        list.len() == 3
            && list.iter().all(|p| {
                !gated(p)
                    && node_of(p).is_some()
                    && p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("allot.dev/gang-released"))
            })
    })
    .await;

    // --- A Job whose request differs from its limit never reaches the controller's events. ---
    let bad: Job = serde_json::from_value(json!({
        "metadata": {"name": "bad-gpu"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "t", "image": "busybox:1.36",
            "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [{"name": "warm", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    }))
    .unwrap();
    let err = jobs.create(&PostParams::default(), &bad).await.expect_err("denied at apply");
    assert!(err.to_string().contains("accelerators/init-containers"), "{err}");

    // --- A tenant (alice: a namespaced Role on pods, impersonated) creates a gang of 64 one pod at
    // a time. Every arrival changes the count on every member's explanation; the controller
    // rewrites those at most every 10 s, not at every arrival (24 pods: 300 writes before). ---
    let rules = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]}]);
    support::cluster::tenant_namespace(&cluster.client, "vision", "alice", rules).await;
    let alice = support::cluster::impersonating(&cluster.dir.path().join("kubeconfig"), "alice").await;
    let as_alice: Api<Pod> = Api::namespaced(alice, "vision");
    let conditions = || {
        support::cluster::metric(&cluster.allot_metrics, "allot_gang_controller_writes_total{kind=\"condition\"}")
            .expect("the controller's writes are counted")
    };
    let before = conditions();
    for i in 0..24 {
        // No GPU: the team's quota (16) is not what this is about.
        let mut pod = gpu_pod(&format!("slow-{i}"), "slow", 64);
        pod.spec.as_mut().expect("spec").containers[0].resources = None;
        as_alice.create(&PostParams::default(), &pod).await.expect("create");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for("every member told 24/64", Duration::from_secs(40), || async {
        let g = members(&pods, "slow").await;
        g.len() == 24
            && g.iter().all(|p| gang_condition(p).is_some_and(|(_, _, message)| message.starts_with("24/64 members")))
    })
    .await;
    let written = conditions() - before;
    eprintln!("a gang of 24 of 64 created one pod at a time: {written} condition writes");
    assert!(written <= 24.0 * 3.0, "{written} condition writes for 24 members");
}
