//! Issue 12's failover test on a real control plane (skipped without the envtest binaries): the
//! gang controller's leader is killed (SIGKILL: no Lease handover, lifts cut off) while it is
//! lifting the gates of many gangs at once, so some gangs are half released when it dies. The
//! other replica takes the Lease and finishes: afterwards no gang is partly released and no gate
//! is left behind.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::cluster::{Assets, Cluster, metric, point_webhooks_at, wait_for};

const LEADER: &str = "allot_gang_controller_leader";
const GANGS: usize = 24;
const SIZE: usize = 4;

fn gpu_pod(name: &str, gang: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"allot.dev/gang-name": gang}, "annotations": {"allot.dev/gang-size": SIZE.to_string()}},
        "spec": {"containers": [{"name": "worker", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap()
}

fn gated(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty())
}

/// Per gang: (members, members still gated).
async fn gangs(pods: &Api<Pod>) -> BTreeMap<String, (usize, usize)> {
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for pod in pods.list(&ListParams::default()).await.expect("list pods").items {
        let Some(gang) = pod.metadata.labels.as_ref().and_then(|l| l.get("allot.dev/gang-name")).cloned() else {
            continue;
        };
        let slot = out.entry(gang).or_default();
        slot.0 += 1;
        if gated(&pod) {
            slot.1 += 1;
        }
    }
    out
}

/// Gangs with some members released and some still gated.
fn partial(gangs: &BTreeMap<String, (usize, usize)>) -> Vec<String> {
    gangs.iter().filter(|(_, (n, g))| *g > 0 && g < n).map(|(name, _)| name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_release_leaves_no_partial_gang_and_no_orphaned_gate() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("a_leader_killed_mid_release_leaves_no_partial_gang_and_no_orphaned_gate")
    else {
        return;
    };
    let mut cluster = Cluster::start(&assets).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "nlp");
    wait_for("the first replica to lead", Duration::from_secs(30), || async {
        metric(&cluster.allot_metrics, LEADER) == Some(1.0)
    })
    .await;
    let mut replica = cluster.start_replica("e2e-failover");
    wait_for("the second replica to follow", Duration::from_secs(30), || async {
        metric(&replica.metrics, LEADER) == Some(0.0)
    })
    .await;
    // The webhooks (they see the new leader's gate lifts: pod updates) are served by the
    // replica that survives.
    point_webhooks_at(&cluster.client, &cluster.allot_addr, &replica.addr).await;

    // Every gang complete; the cluster's 4 GPUs (two nodes of 2) take one of them, the others
    // wait for capacity. (nlp: a team without quota.)
    let creates = (0..GANGS * SIZE).map(|i| {
        let pods = pods.clone();
        async move {
            pods.create(
                &PostParams::default(),
                &gpu_pod(&format!("f{}-{}", i / SIZE, i % SIZE), &format!("f{}", i / SIZE)),
            )
            .await
        }
    });
    let results: Vec<_> = futures::stream::iter(creates).buffer_unordered(8).collect().await;
    assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    let before = gangs(&pods).await;
    assert_eq!(before.len(), GANGS);
    wait_for("the gang that fits to be released", Duration::from_secs(30), || async {
        gangs(&pods).await.values().filter(|(_, g)| *g == 0).count() == 1
    })
    .await;
    let before = gangs(&pods).await;
    let released_before: Vec<String> = before.iter().filter(|(_, (_, g))| *g == 0).map(|(n, _)| n.clone()).collect();
    assert!(partial(&before).is_empty(), "{before:?}");
    assert!(before.values().all(|(n, _)| *n == SIZE), "{before:?}");

    // Capacity for every gang at once: the leader starts lifting ~100 gates; it is killed at
    // the first lift the watch shows.
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel();
    let watched = pods.clone();
    let watch_task = tokio::spawn(async move {
        let mut stream = watcher(watched, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(p)) = event
                && !gated(&p)
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("allot.dev/gang-name"))
                    .is_some_and(|g| !released_before.contains(g))
            {
                let _ = first_tx.send(());
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await; // the watch has listed
    cluster.add_gpu_node("gpu-1", (GANGS * SIZE) as u32).await;
    tokio::time::timeout(Duration::from_secs(30), first_rx.recv()).await.expect("a first gate lifted in time");
    cluster.kill_allot();
    let killed = Instant::now();
    watch_task.abort();
    // What the dead leader left (lifts it had sent may still land: look after a moment).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_kill = gangs(&pods).await;
    let released_at_kill = at_kill.values().filter(|(_, g)| *g == 0).count();
    let half = partial(&at_kill);
    eprintln!(
        "at the kill: {released_at_kill} of {GANGS} gangs released, {} partly released ({half:?}), {} gates left",
        half.len(),
        at_kill.values().map(|(_, g)| g).sum::<usize>()
    );
    assert!(released_at_kill < GANGS, "the leader finished before it was killed: nothing to fail over");

    // The other replica takes the Lease once it expires (no handover: the leader crashed) and
    // finishes the release.
    wait_for("the other replica to take the Lease", Duration::from_secs(60), || async {
        metric(&replica.metrics, LEADER) == Some(1.0)
    })
    .await;
    wait_for("every gang released after the failover", Duration::from_secs(60), || async {
        gangs(&pods).await.values().all(|(_, g)| *g == 0)
    })
    .await;
    let took = killed.elapsed();
    let after = gangs(&pods).await;
    assert_eq!(after.len(), GANGS, "no gang lost a member: {after:?}");
    assert!(partial(&after).is_empty(), "0 partial gangs: {after:?}");
    let orphaned: usize = after.values().map(|(_, g)| g).sum();
    assert_eq!(orphaned, 0, "0 orphaned gates: {after:?}");
    assert!(after.values().all(|(n, _)| *n == SIZE), "{after:?}");
    eprintln!("after the failover: {GANGS} gangs whole, 0 partial, 0 gates left, {took:?} after the kill");
    replica.stop();
}
