//! `/readyz` waits for the Pod cache, proved by blocking the list that fills it (issue 49), on a
//! real kube-apiserver and etcd (skipped without the envtest binaries). A real `allot serve`
//! (the shipped policies: deny-mode quotas, so admission needs the Pod cache) talks to the API
//! server through [`GateProxy`], which holds the cluster-wide Pod reads a cache fill makes until
//! the test releases them:
//! - the streaming list held: `/readyz` answers 503 "starting … Pod cache" the whole time, Allot
//!   tracks no pod; released, it turns 200 and tracks every pod, with no LIST made;
//! - the streaming list refused with 422 (an API server with WatchList off) and the paged LIST
//!   that follows held: the same, and the proxy saw the refused watch, then the LIST.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;
use support::cluster::{ControlPlane, binaries_from_env, http_get, metric, wait_for};
use support::gate_proxy::{GateProxy, Gates, PodRead, Seen};

/// Pods in the cluster before Allot starts: what its Pod cache must hold once ready.
const PODS: usize = 6;
/// How long a read is held while `/readyz` is watched.
const HOLD: Duration = Duration::from_secs(5);
/// How long `/readyz` may take to turn 200 once the read is released.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A namespace with `PODS` plain pods (never scheduled: no scheduler runs).
async fn create_pods(client: &kube::Client, ns: &str) {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("a namespace");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
    // No controller-manager: the ServiceAccount admission plugin wants the default account.
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("an account");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .expect("service account");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for i in 0..PODS {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("waiting-{i}")},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}
        }))
        .expect("a pod");
        pods.create(&PostParams::default(), &pod).await.expect("pod");
    }
}

/// The certificates and policies every `allot serve` here uses, in `dir`.
fn prepare_allot(dir: &Path) {
    let allot = env!("CARGO_BIN_EXE_allot");
    let certs = dir.join("allot-certs");
    let out = Command::new(allot)
        .args(["certs", "--out", certs.to_str().expect("a UTF-8 path"), "--dns-name", "127.0.0.1"])
        .output()
        .expect("allot certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).expect("policies dir");
    for entry in std::fs::read_dir(support::root().join("policies")).expect("the shipped policies") {
        let entry = entry.expect("a policy file");
        std::fs::copy(entry.path(), policies.join(entry.file_name())).expect("copy a policy");
    }
}

/// A running `allot serve` (killed on drop) whose API server is `proxy`.
struct Allot {
    _child: support::KilledOnDrop,
    metrics: String,
    log: std::path::PathBuf,
}

/// Starts `allot serve` (streaming initial list, as by default) through `proxy`; returns once
/// it prints its serving line, not once it is ready.
fn start_allot(dir: &Path, proxy: &GateProxy, identity: &str) -> Allot {
    let kubeconfig = dir.join(format!("kubeconfig-{identity}"));
    std::fs::write(&kubeconfig, proxy.kubeconfig()).expect("the proxy's kubeconfig");
    let log = dir.join(format!("allot-{identity}.log"));
    let log_file = std::fs::File::create(&log).expect("allot's log");
    let certs = dir.join("allot-certs");
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["serve", "--policies", &path(&dir.join("policies"))])
        .args(["--tls-cert", &path(&certs.join("tls.crt")), "--tls-key", &path(&certs.join("tls.key"))])
        .args(["--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .args(["--lease-namespace", "default", "--identity", identity, "--initial-list", "streaming"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", std::env::var("ALLOT_E2E_LOG").unwrap_or_else(|_| "info,kube=warn".into()))
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .expect("allot serve");
    let stdout = child.stdout.take().expect("allot's stdout");
    let child = support::KilledOnDrop::new(child);
    let line = support::first_line(stdout, Duration::from_secs(30)).expect("allot serve printed no serving line");
    let (_, metrics) = support::serving_addresses(&line).expect("the serving line names its addresses");
    Allot { _child: child, metrics, log }
}

impl Allot {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(30).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Polls `/readyz` for `HOLD` while the proxy holds the read: every answer must be 503,
    /// saying Allot is starting and its Pod cache is what it waits for, and no pod may be
    /// tracked. Returns how long it was watched and how many answers came.
    async fn stays_unready(&self, proxy: &GateProxy, held: PodRead) -> (Duration, usize) {
        let started = Instant::now();
        let mut answers = 0;
        while started.elapsed() < HOLD {
            let (status, body) = http_get(&self.metrics, "/readyz").expect("/readyz answers");
            assert_eq!(status, 503, "/readyz while the {held:?} read is held: {body}\n{}", self.log_tail());
            assert!(
                body.contains("Allot is starting") && body.contains("Pod"),
                "/readyz names the Pod cache it waits for: {body:?}"
            );
            answers += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(proxy.waiting(held), 1, "the {held:?} read is still held: {:?}", proxy.seen());
        assert_eq!(metric(&self.metrics, "allot_cluster_pods"), Some(0.0), "no pod known while the list is held");
        assert_eq!(metric(&self.metrics, "allot_ready"), Some(0.0), "the allot_ready gauge says the same");
        (started.elapsed(), answers)
    }

    /// Waits (bounded) for `/readyz` to answer 200 after `released`; returns how long it took.
    async fn turns_ready(&self, released: Instant) -> Duration {
        let deadline = released + READY_WITHIN;
        loop {
            if let Some((200, body)) = http_get(&self.metrics, "/readyz") {
                assert!(body.starts_with("ok: policy set"), "{body}");
                return released.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "/readyz not 200 within {READY_WITHIN:?} of the release: {:?}\n{}",
                http_get(&self.metrics, "/readyz"),
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Once ready, the Pod cache holds every pod of the cluster.
    fn tracks_every_pod(&self) {
        let tracked = metric(&self.metrics, "allot_cluster_pods");
        assert_eq!(tracked, Some(PODS as f64), "the Pod cache once ready\n{}", self.log_tail());
        assert_eq!(metric(&self.metrics, "allot_ready"), Some(1.0));
    }
}

/// Waits until the proxy holds a read of `read`'s kind.
async fn held(proxy: &GateProxy, read: PodRead) {
    wait_for(&format!("allot serve's {read:?} Pod read to reach the proxy"), Duration::from_secs(60), || async {
        proxy.waiting(read) == 1
    })
    .await;
}

fn reads(seen: &[Seen]) -> Vec<(PodRead, Option<u16>, bool)> {
    seen.iter().map(|s| (s.read, s.status, s.held)).collect()
}

/// The streaming list held, then released.
async fn streaming_held(plane: &ControlPlane) {
    let proxy = GateProxy::start(plane.client.clone(), Gates { hold_streaming: true, ..Gates::default() }).await;
    let allot = start_allot(plane.dir.path(), &proxy, "streaming-held");
    held(&proxy, PodRead::Streaming).await;
    let (unready, answers) = allot.stays_unready(&proxy, PodRead::Streaming).await;
    let released = Instant::now();
    proxy.set(|g| g.hold_streaming = false);
    let to_ready = allot.turns_ready(released).await;
    allot.tracks_every_pod();
    let seen = proxy.seen();
    let first = seen.first().expect("a Pod read");
    assert_eq!((first.read, first.status, first.held), (PodRead::Streaming, Some(200), true), "{seen:?}");
    assert!(first.query.contains("sendInitialEvents=true"), "{}", first.query);
    assert!(!seen.iter().any(|s| s.read == PodRead::List), "served by streaming, no LIST: {:?}", reads(&seen));
    println!(
        "streaming held: /readyz 503 for {:.2} s ({answers} answers) while held; 200 {:.3} s after the release",
        unready.as_secs_f64(),
        to_ready.as_secs_f64()
    );
}

/// The streaming list refused with 422; the paged LIST that follows held, then released.
async fn streaming_refused_list_held(plane: &ControlPlane) {
    let gates = Gates { refuse_streaming: true, hold_list: true, ..Gates::default() };
    let proxy = GateProxy::start(plane.client.clone(), gates).await;
    let allot = start_allot(plane.dir.path(), &proxy, "streaming-refused");
    held(&proxy, PodRead::List).await;
    let (unready, answers) = allot.stays_unready(&proxy, PodRead::List).await;
    let released = Instant::now();
    proxy.set(|g| g.hold_list = false);
    let to_ready = allot.turns_ready(released).await;
    allot.tracks_every_pod();
    wait_for("the watch that follows the LIST", Duration::from_secs(30), || async {
        proxy.seen().iter().any(|s| s.read == PodRead::Watch)
    })
    .await;
    let seen = proxy.seen();
    // The fallback: the streaming list refused, then a paged LIST (held, answered), then the
    // watch from the LIST's resourceVersion.
    let [streaming, list, watch, ..] = seen.as_slice() else { panic!("three Pod reads at least: {seen:?}") };
    assert_eq!((streaming.read, streaming.status, streaming.held), (PodRead::Streaming, Some(422), false), "{seen:?}");
    assert_eq!((list.read, list.status, list.held), (PodRead::List, Some(200), true), "{seen:?}");
    assert!(list.query.split('&').any(|kv| kv == "limit=500"), "a page of 500: {}", list.query);
    assert!(streaming.arrived <= list.arrived, "{seen:?}");
    assert_eq!(watch.read, PodRead::Watch, "{seen:?}");
    let retried = seen.iter().skip(1).filter(|s| s.read == PodRead::Streaming).count();
    assert_eq!(retried, 0, "no streaming list once refused: {:?}", reads(&seen));
    println!(
        "streaming refused (422), LIST held: /readyz 503 for {:.2} s ({answers} answers) while held; 200 {:.3} s after the release",
        unready.as_secs_f64(),
        to_ready.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_while_the_pod_list_is_held() {
    let Some([etcd, apiserver]) =
        binaries_from_env("readyz_waits_while_the_pod_list_is_held", ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"])
    else {
        return;
    };
    let plane = ControlPlane::start(&etcd, &apiserver).await;
    create_pods(&plane.client, "readiness").await;
    prepare_allot(plane.dir.path());
    streaming_held(&plane).await;
    streaming_refused_list_held(&plane).await;
}
