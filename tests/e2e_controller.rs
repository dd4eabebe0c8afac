//! Issue 12 on a real control plane (skipped without the envtest binaries): queue mode never
//! stalls, and the gang controller reacts to events, not a poll.
//!
//! - The issue's reproduction (Team `{mode: Queue, limits: {nvidia.com/gpu: 2}}`, GangPolicy
//!   `assemblyTimeout: 10s, onTimeout: Fail`): p1 and p2 run, a gang with 1 of 3 members and p3
//!   arrive together; once p1 goes, p3 goes (the incomplete gang holds up no one), and the gang's
//!   member is deleted at its assembly timeout although it waits behind the quota gate.
//! - Pods created in the same second leave the queue in the order they arrived, not by name.
//! - Measured and bounded in the same run: release latency (last member created → all gates
//!   lifted) against the API's own write-and-watch round trip, and the writes the controller and
//!   the API server see with 1,000 gated pods and nothing changing.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::cluster::{Assets, Cluster, metric, wait_for};

/// Sorted before the shipped `gangs.yaml` (an everywhere GangPolicy): first match wins.
const POLICIES: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: q}
spec:
  namespaces: {names: [quota-queue]}
  quota: {mode: Queue, limits: {nvidia.com/gpu: 2}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: waiting}
spec:
  namespaces: {names: [quota-gang]}
  quota: {mode: Queue, limits: {nvidia.com/gpu: 1}}
---
apiVersion: allot.dev/v1alpha1
kind: GangPolicy
metadata: {name: issue-12}
spec:
  match: {namespaces: [quota-queue]}
  assemblyTimeout: 10s
  onTimeout: Fail
"#;

fn gpu_pod(name: &str, gang: Option<(&str, u32)>) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
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

async fn gates_of(pods: &Api<Pod>, name: &str) -> Option<Vec<String>> {
    pods.get_opt(name).await.expect("get pod").map(|p| gates(&p))
}

async fn delete_now(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
}

/// The `q`-th quantile (0..=1) of `samples`, nearest rank.
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// Write requests on pods and events the API server counted (`apiserver_request_total`).
async fn api_writes(client: &kube::Client) -> f64 {
    let text = client
        .request_text(axum::http::Request::get("/metrics").body(Vec::new()).expect("request"))
        .await
        .expect("API server metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"pods\"") || l.contains("resource=\"events\""))
        .filter(|l| ["POST", "PATCH", "PUT", "DELETE", "APPLY"].iter().any(|v| l.contains(&format!("verb=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum of the controller's `allot_gang_controller_writes_total` over its kinds.
fn controller_writes(metrics_addr: &str) -> f64 {
    ["gate", "condition", "event", "delete", "arrival"]
        .iter()
        .filter_map(|kind| metric(metrics_addr, &format!("allot_gang_controller_writes_total{{kind=\"{kind}\"}}")))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_never_stall_and_the_controller_reacts_at_once() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("queues_never_stall_and_the_controller_reacts_at_once") else { return };
    let cluster = Cluster::start_with(&assets, &[("00-issue-12.yaml", POLICIES)]).await;
    let client = cluster.client.clone();

    // --- Issue 12, defect 1: an incomplete gang ordered first holds up no one. ---
    let queue: Api<Pod> = Api::namespaced(client.clone(), "quota-queue");
    for name in ["p1", "p2"] {
        queue.create(&PostParams::default(), &gpu_pod(name, None)).await.expect("create");
    }
    wait_for("p1 and p2 released", Duration::from_secs(30), || async {
        gates_of(&queue, "p1").await == Some(vec![]) && gates_of(&queue, "p2").await == Some(vec![])
    })
    .await;
    // The gang first, then p3: in arrival order (and in name order) the gang is ahead.
    queue.create(&PostParams::default(), &gpu_pod("a-0", Some(("a", 3)))).await.expect("gang member");
    let gang_created = Instant::now();
    queue.create(&PostParams::default(), &gpu_pod("p3", None)).await.expect("p3");
    wait_for("p3 queued with its reason", Duration::from_secs(20), || async {
        let Ok(p) = queue.get("p3").await else { return false };
        gates(&p) == ["allot.dev/quota"]
            && p.status.and_then(|s| s.conditions).unwrap_or_default().iter().any(|c| {
                c.type_ == "allot.dev/QuotaReady"
                    && c.message.as_deref() == Some("team q uses 2 of 2 nvidia.com/gpu; this asks 1")
            })
    })
    .await;
    delete_now(&queue, "p1").await;
    wait_for("p3 released once the team has room", Duration::from_secs(20), || async {
        gates_of(&queue, "p3").await == Some(vec![])
    })
    .await;

    // --- Defect 2: the gang in the queue reaches its 10 s assembly timeout (Fail: deleted). ---
    wait_for("the incomplete gang's member deleted at its timeout", Duration::from_secs(40), || async {
        queue.get_opt("a-0").await.ok().flatten().is_none()
    })
    .await;
    let timed_out = gang_created.elapsed();
    eprintln!("incomplete queued gang deleted {timed_out:?} after its creation (assemblyTimeout 10s)");
    // creationTimestamp is whole seconds: the timeout may fall up to 1 s before 10 s of real age.
    assert!(timed_out >= Duration::from_millis(8500), "deleted before its timeout: {timed_out:?}");

    // --- Same-second arrivals leave the queue in arrival order, not name order. ---
    queue.create(&PostParams::default(), &gpu_pod("zz-first", None)).await.expect("create");
    queue.create(&PostParams::default(), &gpu_pod("aa-second", None)).await.expect("create");
    wait_for("both queued and stamped with their arrival", Duration::from_secs(20), || async {
        let mut ok = true;
        for name in ["zz-first", "aa-second"] {
            let Ok(p) = queue.get(name).await else { return false };
            ok &= gates(&p) == ["allot.dev/quota"]
                && p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("allot.dev/arrival"));
        }
        ok
    })
    .await;
    delete_now(&queue, "p2").await;
    wait_for("the first arrival released", Duration::from_secs(20), || async {
        gates_of(&queue, "zz-first").await == Some(vec![])
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(gates_of(&queue, "aa-second").await, Some(vec!["allot.dev/quota".to_string()]), "one GPU of room");
    for name in ["p3", "zz-first", "aa-second"] {
        delete_now(&queue, name).await;
    }

    // --- Release latency, last member created -> all gates lifted, with a same-run floor. ---
    let pods: Api<Pod> = Api::namespaced(client.clone(), "nlp");
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<(String, bool, Option<String>, Instant)>();
    let watch_api = pods.clone();
    let watch_task = tokio::spawn(async move {
        let mut stream = watcher(watch_api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event {
                let name = p.metadata.name.clone().unwrap_or_default();
                let touched = p.metadata.labels.as_ref().and_then(|l| l.get("touched").cloned());
                let _ = seen_tx.send((name, gates(&p).is_empty(), touched, Instant::now()));
            }
        }
    });
    // Drains the watch until `done` holds for what it saw; panics after 20 s.
    async fn until(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, bool, Option<String>, Instant)>,
        mut done: impl FnMut(&str, bool, Option<&str>) -> bool,
    ) -> Instant {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let next = tokio::time::timeout_at(deadline, rx.recv()).await.expect("watch event in time");
            let (name, ungated, touched, at) = next.expect("watch open");
            if done(&name, ungated, touched.as_deref()) {
                return at;
            }
        }
    }
    const ROUNDS: usize = 20;
    let mut floor = Vec::new();
    let mut latency = Vec::new();
    for round in 0..ROUNDS {
        // The floor: one write of ours and the watch event it causes — the least any
        // controller needs between an event and its effect being visible.
        let solo = format!("solo-{round}");
        pods.create(&PostParams::default(), &gpu_pod(&solo, None)).await.expect("create");
        until(&mut seen_rx, |n, _, _| n == solo).await;
        let start = Instant::now();
        let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
        pods.patch(&solo, &PatchParams::default(), &Patch::Merge(patch)).await.expect("patch");
        let seen = until(&mut seen_rx, |n, _, t| n == solo && t == Some("yes")).await;
        floor.push(seen.duration_since(start));
        delete_now(&pods, &solo).await;

        let gang = format!("l{round}");
        pods.create(&PostParams::default(), &gpu_pod(&format!("{gang}-0"), Some((&gang, 2)))).await.expect("member");
        pods.create(&PostParams::default(), &gpu_pod(&format!("{gang}-1"), Some((&gang, 2)))).await.expect("member");
        let created = Instant::now();
        let mut lifted = BTreeMap::new();
        let last = until(&mut seen_rx, |n, ungated, _| {
            if n.starts_with(&format!("{gang}-")) && ungated {
                lifted.insert(n.to_string(), ());
            }
            lifted.len() == 2
        })
        .await;
        latency.push(last.saturating_duration_since(created));
        for i in 0..2 {
            delete_now(&pods, &format!("{gang}-{i}")).await;
        }
        wait_for("the gang's pods gone", Duration::from_secs(20), || async {
            pods.list(&ListParams::default().labels(&format!("allot.dev/gang-name={gang}")))
                .await
                .is_ok_and(|l| l.items.is_empty())
        })
        .await;
    }
    watch_task.abort();
    let (p50, p99) = (quantile(&latency, 0.5), quantile(&latency, 0.99));
    let floor50 = quantile(&floor, 0.5);
    eprintln!(
        "release latency over {ROUNDS} gangs of 2: p50 {p50:?}, p99 {p99:?}, max {:?}; floor (one write -> its watch \
         event) p50 {floor50:?}; p50 ratio {:.1}x",
        quantile(&latency, 1.0),
        p50.as_secs_f64() / floor50.as_secs_f64().max(1e-6)
    );
    // Generous for a loaded 2-core machine; the 250 ms poll it replaces made 135-360 ms.
    assert!(p50 < Duration::from_millis(100), "p50 {p50:?}: {latency:?}");
    assert!(p99 < Duration::from_millis(250), "p99 {p99:?}: {latency:?}");

    // --- 1,000 gated pods, nothing changing: no writes (resync every 5 s here). ---
    let waiting: Api<Pod> = Api::namespaced(client.clone(), "quota-gang");
    let creates = (0..1000).map(|i| {
        let (waiting, gangs) = (waiting.clone(), pods.clone());
        async move {
            if i % 2 == 0 {
                // Incomplete gangs of 3 with 2 members: they wait, explained (`nlp` has no quota).
                let gang = format!("w{}", i / 4);
                gangs
                    .create(&PostParams::default(), &gpu_pod(&format!("{gang}-{}", (i / 2) % 2), Some((&gang, 3))))
                    .await
            } else {
                // A team queue with 1 GPU of quota: all but the first wait behind the quota gate.
                waiting.create(&PostParams::default(), &gpu_pod(&format!("q-{i}"), None)).await
            }
        }
    });
    let results: Vec<_> = futures::stream::iter(creates).buffer_unordered(8).collect().await;
    assert!(results.iter().all(Result::is_ok), "{:?}", results.iter().find(|r| r.is_err()));
    // Settled: the controller's write counter has not moved for 5 s (a resync period).
    let mut last = (controller_writes(&cluster.allot_metrics), Instant::now());
    let settle_deadline = Instant::now() + Duration::from_secs(180);
    while last.1.elapsed() < Duration::from_secs(5) {
        assert!(Instant::now() < settle_deadline, "the controller never settled");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = controller_writes(&cluster.allot_metrics);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let settled_writes = last.0;
    let passes_before = metric(&cluster.allot_metrics, "allot_gang_controller_passes_total").unwrap_or(0.0);
    let api_before = api_writes(&client).await;
    let window = Duration::from_secs(30);
    tokio::time::sleep(window).await;
    let allot_delta = controller_writes(&cluster.allot_metrics) - settled_writes;
    let api_delta = api_writes(&client).await - api_before;
    let passes = metric(&cluster.allot_metrics, "allot_gang_controller_passes_total").unwrap_or(0.0) - passes_before;
    eprintln!(
        "1,000 gated pods, {window:?} with nothing changing: {allot_delta} controller writes, {api_delta} pod/event \
         writes at the API server ({} per minute), {passes} controller passes (resyncs); {settled_writes} writes to \
         settle",
        api_delta * 60.0 / window.as_secs_f64()
    );
    assert!(passes >= 4.0, "the resync kept running: {passes} passes");
    assert_eq!(allot_delta, 0.0, "the controller wrote with nothing changing");
    assert_eq!(api_delta, 0.0, "pod or event writes at the API server with nothing changing");

    // --- A timeout's deletion names the uid the pass saw: a pod made again under the name
    // since (a StatefulSet's or LeaderWorkerSet's stable names) is refused (409), not deleted.
    let cpu_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stable-name"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}
    }))
    .unwrap();
    let first = queue.create(&PostParams::default(), &cpu_pod).await.expect("create");
    let first_uid = first.metadata.uid.clone().expect("a uid");
    delete_now(&queue, "stable-name").await;
    wait_for("the first pod gone", Duration::from_secs(20), || async {
        queue.get_opt("stable-name").await.expect("get").is_none()
    })
    .await;
    let successor = queue.create(&PostParams::default(), &cpu_pod).await.expect("create again");
    let refused = queue.delete("stable-name", &allot::control::gang::controller::delete_params(Some(&first_uid))).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 409), "{refused:?}");
    let still = queue.get("stable-name").await.expect("the successor is still there");
    assert_eq!(still.metadata.uid, successor.metadata.uid);
    let successor_uid = successor.metadata.uid.expect("a uid");
    queue
        .delete("stable-name", &allot::control::gang::controller::delete_params(Some(&successor_uid)))
        .await
        .expect("its own uid deletes it");
}
