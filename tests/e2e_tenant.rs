//! Tenants are adversaries (issue #11): an end-to-end suite on a real control plane (skipped
//! without the envtest binaries) in which `alice`, whose only rights are a namespaced Role with
//! `*` on pods (and their subresources) and Jobs, tries to stall Allot, lift or dodge its gates,
//! forge its reserved keys and overshoot a deny quota. Each test is one attempt; each asserts the
//! denial (a 4xx that names the problem) and that nothing changed: the gates are still there,
//! the usage is what it was, and the webhook still answers within its deadline.
//!
//! One control plane serves the whole file (starting one costs more than all the attempts
//! together): the first test starts it, every test runs alone in its own namespace (the tests
//! take turns on one lock, so an attempt that stalls Allot cannot fail the others), and a test
//! that leaves Allot unresponsive gets it restarted before the next one. The processes are
//! stopped when the test binary exits.
//!
//! Allot runs as `system:serviceaccount:allot-system:allot` (its deploy/ identity, through
//! impersonation) and the webhooks skip that user, as the shipped configurations do, so Allot's
//! own writes are never mistaken for a tenant's.

mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::cluster::{Assets, Cluster, wait_for};

/// Allot's identity in deploy/ (its ServiceAccount).
const ALLOT_USER: &str = "system:serviceaccount:allot-system:allot";
const TENANT: &str = "alice";
const GANG_GATE: &str = "allot.dev/gang";
const QUOTA_GATE: &str = "allot.dev/quota";

/// JobSets' pods form gangs unlabelled in the template test's namespace only.
const INFERRED_JOBSETS: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: GangPolicy
metadata: {name: inferred-jobsets}
spec:
  match: {namespaces: [t-template-gangs]}
  infer: [Job, JobSet]
  assemblyTimeout: 10m
---
apiVersion: allot.dev/v1alpha1
kind: GangPolicy
metadata: {name: start-timeout}
spec:
  match: {namespaces: [t-start-timeout]}
  startTimeout: 8s
---
apiVersion: allot.dev/v1alpha1
kind: GangPolicy
metadata: {name: start-late}
spec:
  match: {namespaces: [t-start-late, t-start-late-leaving]}
  startTimeout: 5s
  onStartTimeout: Warn
"#;

/// Teams for the attempts' namespaces: each quota attempt has a team of its own, everything else
/// belongs to `tenant`, which may only use `low-priority`.
const TEAMS: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-oversized-gang}
spec:
  namespaces: {names: [t-oversized-gang]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-declared-size}
spec:
  namespaces: {names: [t-declared-size]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-mixed-sizes}
spec:
  namespaces: {names: [t-mixed-sizes]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-terminating}
spec:
  namespaces: {names: [t-terminating]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 2}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-dry-run}
spec:
  namespaces: {names: [t-dry-run]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 2}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-resize}
spec:
  namespaces: {names: [t-resize]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4, cpu: 2}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-job}
spec:
  namespaces: {names: [t-job-quota]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-extreme-amounts}
spec:
  namespaces: {names: [t-extreme-amounts]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: deny-forged-trust}
spec:
  namespaces: {names: [t-forged-trust]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: queue-gate}
spec:
  namespaces: {names: [t-quota-gate]}
  quota: {mode: Queue, limits: {nvidia.com/gpu: 1}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: queue-volcano}
spec:
  namespaces: {names: [t-queue-volcano]}
  quota: {mode: Queue, limits: {nvidia.com/gpu: 1}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: open-priority}
spec:
  namespaces: {names: [t-open-priority]}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: tenant}
spec:
  namespaces: {names: ["t-*"]}
  priority:
    default: low-priority
    allowed: [low-priority]
"#;

// ---------------------------------------------------------------------------------------------
// The shared cluster
// ---------------------------------------------------------------------------------------------

/// The control plane, Allot, and a client that acts as alice.
struct Shared {
    cluster: Cluster,
    alice: kube::Client,
}

/// Taken by each test for its whole run: the tests take turns.
static SHARED: tokio::sync::Mutex<Option<Shared>> = tokio::sync::Mutex::const_new(None);

/// One runtime for every test: kube clients live on the runtime that made them.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
    })
}

unsafe extern "C" {
    /// libc's `atexit`: statics are never dropped, so the processes are stopped from here.
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn stop_shared_cluster() {
    if let Ok(mut shared) = SHARED.try_lock() {
        drop(shared.take());
    }
}

/// What a test works with: its namespace, alice's and the admin's clients, Allot's addresses.
#[derive(Clone)]
struct Ctx {
    ns: String,
    alice: kube::Client,
    admin: kube::Client,
    allot_metrics: String,
}

impl Ctx {
    /// Pods in the test's namespace, as alice.
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.alice.clone(), &self.ns)
    }

    /// Pods in the test's namespace, as the cluster admin (to look, never to attack).
    fn admin_pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.alice.clone(), &self.ns)
    }

    async fn get(&self, name: &str) -> Pod {
        self.admin_pods().get(name).await.unwrap_or_else(|e| panic!("get pod {name}: {e}"))
    }
}

/// Runs one attempt in namespace `ns` on the shared cluster; afterwards deletes what it made and
/// restarts Allot if the attempt left it unresponsive (then re-raises the attempt's failure).
fn attempt<F, Fut>(test: &str, ns: &str, body: F)
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env(test) else { return };
    runtime().block_on(async move {
        let mut guard = SHARED.lock().await;
        if guard.is_none() {
            let started = Instant::now();
            *guard = Some(start_shared(&assets).await);
            // SAFETY: registers a plain function with no arguments; it runs once, at exit.
            unsafe {
                atexit(stop_shared_cluster);
            }
            println!("shared control plane and Allot ready in {:?}", started.elapsed());
        }
        let Some(shared) = guard.as_mut() else { unreachable!("started above") };
        let admin = shared.cluster.client.clone();
        prepare_namespace(&admin, ns).await;
        let ctx = Ctx {
            ns: ns.to_string(),
            alice: shared.alice.clone(),
            admin: admin.clone(),
            allot_metrics: shared.cluster.allot_metrics.clone(),
        };
        let started = Instant::now();
        let outcome = tokio::spawn(body(ctx.clone())).await;
        println!("{test}: {:?}", started.elapsed());
        if outcome.is_err() {
            let log = std::fs::read_to_string(shared.cluster.dir.path().join("allot.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            eprintln!("--- allot.log (last 25 lines) ---");
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
        clean_namespace(&ctx).await;
        if probe_webhook(&ctx).await.is_err() {
            eprintln!("{test}: Allot did not answer after the attempt; restarting it for the next test");
            shared.cluster.stop_allot();
            shared.cluster.start_allot();
            wait_until_ready(&shared.cluster.allot_metrics).await;
        }
        if let Err(e) = outcome {
            match e.try_into_panic() {
                Ok(panic) => {
                    // The body ran on a runtime worker, whose panic message the harness may not
                    // show with this test's output: say it here.
                    let message = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("(not a string)");
                    eprintln!("{test} panicked: {message}");
                    std::panic::resume_unwind(panic)
                }
                Err(e) => panic!("{test}: {e}"),
            }
        }
    });
}

/// The cluster of tests/support, then Allot restarted as its deploy/ identity and the webhooks
/// told to skip that identity, as deploy/ does.
async fn start_shared(assets: &Assets) -> Shared {
    // (Named to sort before the harness's `gangs.yaml`: the first GangPolicy that matches wins.)
    let policies = [("teams-tenant-e2e.yaml", TEAMS), ("0-gangs-tenant-e2e.yaml", INFERRED_JOBSETS)];
    let mut cluster = Cluster::start_with(assets, &policies).await;
    let admin_kubeconfig = std::fs::read_to_string(&cluster.kubeconfig).expect("admin kubeconfig");
    let mut allot_kubeconfig = String::new();
    for line in admin_kubeconfig.lines() {
        allot_kubeconfig.push_str(line);
        allot_kubeconfig.push('\n');
        if line.trim_start().starts_with("token:") {
            let indent = &line[..line.len() - line.trim_start().len()];
            allot_kubeconfig.push_str(&format!("{indent}as: {ALLOT_USER}\n{indent}as-groups: [system:masters]\n"));
        }
    }
    assert!(allot_kubeconfig.contains("as-groups"), "the admin kubeconfig has no token line:\n{admin_kubeconfig}");
    let path = cluster.dir.path().join("allot.kubeconfig");
    std::fs::write(&path, allot_kubeconfig).expect("allot kubeconfig");
    cluster.stop_allot();
    cluster.kubeconfig = path;
    // The cluster runs Kueue (as far as Allot is told): its gate exempts a pod from Allot's
    // gates, so who may lift it matters (`kueue_markers_exempt_nothing_alice_can_lift`). And
    // Volcano, under a scheduler name of its own here (other attempts use `volcano` as a
    // scheduler nobody declared): `a_volcano_pod_does_not_run_past_a_queue_mode_quota`.
    let cluster_policy = cluster.dir.path().join("policies/cluster.yaml");
    let text = std::fs::read_to_string(&cluster_policy).expect("the Cluster policy");
    for shipped in ["\n  externalSchedulers: []\n", "\n    volcano: [volcano]\n"] {
        assert!(text.contains(shipped), "the shipped Cluster policy changed: {shipped:?} is gone");
    }
    let text = text.replacen("\n  externalSchedulers: []\n", "\n  externalSchedulers: [Kueue, Volcano]\n", 1).replacen(
        "\n    volcano: [volcano]\n",
        &format!("\n    volcano: [{VOLCANO_E2E}]\n"),
        1,
    );
    std::fs::write(&cluster_policy, text).expect("write the Cluster policy");
    cluster.start_allot();
    wait_until_ready(&cluster.allot_metrics).await;
    skip_allot_in_webhooks(&cluster.client).await;
    let alice = alice_client(&cluster).await;
    Shared { cluster, alice }
}

/// Waits for Allot's `/readyz` (policies loaded and, where Allot says so, its caches synced).
async fn wait_until_ready(metrics: &str) {
    wait_for("Allot's /readyz", Duration::from_secs(60), || async {
        let answer = tokio::time::timeout(Duration::from_secs(2), http_get(metrics, "/readyz")).await;
        matches!(answer, Ok(Ok(text)) if text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"))
    })
    .await;
}

/// Adds deploy/'s `not-allot-itself` match condition where the generated configuration lacks it.
async fn skip_allot_in_webhooks(admin: &kube::Client) {
    let condition = MatchCondition {
        name: "not-allot-itself".into(),
        expression: format!("request.userInfo.username != '{ALLOT_USER}'"),
    };
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    for name in
        mutating.list(&ListParams::default()).await.expect("list").items.iter().filter_map(|c| c.metadata.name.clone())
    {
        let mut config = mutating.get(&name).await.expect("get");
        for w in config.webhooks.iter_mut().flatten() {
            let conditions = w.match_conditions.get_or_insert_with(Vec::new);
            if !conditions.iter().any(|c| c.name == condition.name) {
                conditions.push(condition.clone());
            }
        }
        mutating.replace(&name, &PostParams::default(), &config).await.expect("mutating webhook");
    }
    validating_condition(admin, &condition, true).await;
}

/// Adds (`present`) or removes the match condition named `condition.name` on every validating
/// webhook. A write that meets another writer (409: Allot's certificate rotation, another
/// test's condition) is made again on the new version, so that a condition added for one
/// request does not stay for the rest of the shared run.
async fn validating_condition(admin: &kube::Client, condition: &MatchCondition, present: bool) {
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    for name in validating
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
    {
        for attempt in 1.. {
            let mut config = validating.get(&name).await.expect("get");
            for w in config.webhooks.iter_mut().flatten() {
                let conditions = w.match_conditions.get_or_insert_with(Vec::new);
                conditions.retain(|c| c.name != condition.name);
                if present {
                    conditions.push(condition.clone());
                }
            }
            match validating.replace(&name, &PostParams::default(), &config).await {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 10 => continue,
                Err(e) => panic!("validating webhook {name}: {e}"),
            }
        }
    }
}

/// The admin's kubeconfig, impersonating alice (`kubectl --as=alice`).
async fn alice_client(cluster: &Cluster) -> kube::Client {
    support::cluster::impersonating(&cluster.dir.path().join("kubeconfig"), TENANT).await
}

/// The namespace, alice's Role (`*` on pods, their subresources and Jobs) and RoleBinding, and
/// the default ServiceAccount pods need.
async fn prepare_namespace(admin: &kube::Client, ns: &str) {
    let rules = json!([
        {"apiGroups": [""], "verbs": ["*"], "resources": [
            "pods", "pods/binding", "pods/ephemeralcontainers", "pods/resize", "pods/status",
            "pods/eviction", "pods/log", "pods/exec"]},
        {"apiGroups": ["batch"], "verbs": ["*"], "resources": ["jobs", "jobs/status"]}
    ]);
    support::cluster::tenant_namespace(admin, ns, TENANT, rules).await;
}

/// Force-deletes every Job and Pod the attempt left, and waits until they are gone (they hold
/// GPUs of the two shared nodes).
async fn clean_namespace(ctx: &Ctx) {
    let jobs: Api<Job> = Api::namespaced(ctx.admin.clone(), &ctx.ns);
    let _ = jobs.delete_collection(&DeleteParams::background(), &ListParams::default()).await;
    let pods = ctx.admin_pods();
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let left = pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        if left.is_empty() {
            return;
        }
        for p in left.iter().filter_map(|p| p.metadata.name.clone()) {
            let _ = pods.delete(&p, &now).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("pods of {} still there after 30 s", ctx.ns);
}

// ---------------------------------------------------------------------------------------------
// What the attempts use
// ---------------------------------------------------------------------------------------------

/// A one-container pod asking `gpus` (0: none).
fn pod(name: &str, gpus: u32) -> Value {
    let resources = if gpus == 0 { json!({}) } else { json!({"limits": {"nvidia.com/gpu": gpus.to_string()}}) };
    json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": resources}]}
    })
}

/// A member of gang `gang` declaring `size` (written as given), asking `gpus`.
fn member(name: &str, gang: &str, size: &str, gpus: u32) -> Value {
    let mut p = pod(name, gpus);
    p["metadata"]["labels"] = json!({"allot.dev/gang-name": gang});
    p["metadata"]["annotations"] = json!({"allot.dev/gang-size": size});
    p
}

fn typed(pod: Value) -> Pod {
    serde_json::from_value(pod).expect("a pod")
}

async fn create(ctx: &Ctx, pod: Value) -> Result<Pod, kube::Error> {
    ctx.pods().create(&PostParams::default(), &typed(pod)).await
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default().into_iter().map(|g| g.name).collect()
}

fn annotation(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.annotations.as_ref()?.get(key).cloned()
}

fn label(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.labels.as_ref()?.get(key).cloned()
}

fn gpus_of(pod: &Pod) -> u64 {
    let Some(spec) = &pod.spec else { return 0 };
    spec.containers
        .iter()
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("nvidia.com/gpu")?.0.parse::<u64>().ok())
        .sum()
}

/// GPUs held by the namespace's pods that have not finished, terminating ones included (they
/// hold their devices until they are gone).
async fn gpus_in_use(ctx: &Ctx) -> u64 {
    let pods = ctx.admin_pods().list(&ListParams::default()).await.expect("list pods").items;
    pods.iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded") | Some("Failed"))
        })
        .map(gpus_of)
        .sum()
}

/// A JSON patch from JSON.
fn json_patch(ops: Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).expect("a JSON patch"))
}

/// The message of a denial: the request must have been refused with a 4xx, which is what an
/// admission denial or an API validation error is (a webhook that times out or fails is a 500).
fn denial<T>(what: &str, result: Result<T, kube::Error>) -> String {
    match result {
        Ok(_) => panic!("{what}: admitted, expected a denial"),
        Err(kube::Error::Api(status)) => {
            assert!(
                (400..500).contains(&status.code),
                "{what}: expected a 4xx denial, got {} {}: {}",
                status.code,
                status.reason,
                status.message
            );
            println!("  denied ({}) {what}: {}", status.code, status.message);
            status.message
        }
        Err(e) => panic!("{what}: expected a denial, got {e}"),
    }
}

/// Asserts that `message` names every one of `words` (case-insensitive).
fn assert_names(what: &str, message: &str, words: &[&str]) {
    let lower = message.to_lowercase();
    for w in words {
        assert!(lower.contains(&w.to_lowercase()), "{what}: the message should name {w:?}: {message}");
    }
}

/// Asserts that the webhooks still answer within their deadline (a dry-run pod create as alice
/// in under 4 s, under the 5 s `timeoutSeconds`) and that `/readyz` answers.
async fn assert_webhook_answers(ctx: &Ctx) {
    if let Err(e) = probe_webhook(ctx).await {
        panic!("Allot no longer answers: {e}");
    }
}

async fn probe_webhook(ctx: &Ctx) -> Result<(), String> {
    let started = Instant::now();
    let dry = PostParams { dry_run: true, ..Default::default() };
    let created = tokio::time::timeout(Duration::from_secs(10), ctx.pods().create(&dry, &typed(pod("probe", 0))))
        .await
        .map_err(|_| "a dry-run pod create took over 10 s".to_string())?;
    created.map_err(|e| format!("a dry-run pod create failed: {e}"))?;
    let took = started.elapsed();
    if took > Duration::from_secs(4) {
        return Err(format!("a dry-run pod create took {took:?}"));
    }
    let readyz = tokio::time::timeout(Duration::from_secs(3), http_get(&ctx.allot_metrics, "/readyz"))
        .await
        .map_err(|_| "/readyz did not answer within 3 s".to_string())?;
    match readyz {
        Ok(text) if text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200") => Ok(()),
        Ok(text) => Err(format!("/readyz: {}", text.lines().next().unwrap_or_default())),
        Err(e) => Err(format!("/readyz: {e}")),
    }
}

async fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text)
}

/// Deletes pod `name` as alice, without grace, and waits until it is gone.
async fn delete_now(ctx: &Ctx, name: &str) {
    ctx.pods()
        .delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    wait_for(&format!("{name} gone"), Duration::from_secs(20), || async {
        ctx.admin_pods().get_opt(name).await.ok().flatten().is_none()
    })
    .await;
}

/// Asserts that `name` still carries `gate` after `settle` (the controller had time to act).
async fn assert_still_gated(ctx: &Ctx, name: &str, gate: &str, settle: Duration) {
    tokio::time::sleep(settle).await;
    let p = ctx.get(name).await;
    assert!(gates(&p).iter().any(|g| g == gate), "{name} lost {gate}: gates {:?}", gates(&p));
    assert!(p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(), "{name} was bound");
}

/// `pod` mounting the PersistentVolumeClaim `claim` (which need not exist: then it never binds).
fn mounting(mut pod: Value, claim: &str) -> Value {
    pod["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    pod
}

/// Creates, as the admin, the claim `claim` in the attempt's namespace, pre-bound to a volume
/// of its own, so that the scheduler can bind the pods mounting it; [`delete_claim`] removes
/// both.
async fn bound_claim(ctx: &Ctx, claim: &str) {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let volume_name = format!("{}-{claim}", ctx.ns);
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": volume_name},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "manual",
            "hostPath": {"path": "/tmp/allot-e2e"},
            "claimRef": {"namespace": ctx.ns, "name": claim}
        }
    }))
    .expect("a volume");
    let volumes: Api<PersistentVolume> = Api::all(ctx.admin.clone());
    volumes.create(&PostParams::default(), &volume).await.expect("create the volume");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "manual", "volumeName": volume_name,
            "resources": {"requests": {"storage": "1Gi"}}
        }
    }))
    .expect("a claim");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.admin.clone(), &ctx.ns);
    claims.create(&PostParams::default(), &pvc).await.expect("create the claim");
}

/// Deletes what [`bound_claim`] made.
async fn delete_claim(ctx: &Ctx, claim: &str) {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.admin.clone(), &ctx.ns);
    let _ = claims.delete(claim, &DeleteParams::default()).await;
    let volumes: Api<PersistentVolume> = Api::all(ctx.admin.clone());
    let _ = volumes.delete(&format!("{}-{claim}", ctx.ns), &DeleteParams::default()).await;
}

/// Whether each of `names` is bound, and its `allot.dev/GangReady` condition as `"STATUS
/// REASON"` (empty when it has none).
async fn gang_states(ctx: &Ctx, names: &[&str]) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for name in names {
        let pod = ctx.get(name).await;
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
        let condition = support::cluster::gang_condition(&pod).map(|(status, reason, _)| format!("{status} {reason}"));
        out.push((bound, condition.unwrap_or_default()));
    }
    out
}

/// Creates a member of an incomplete gang (it can never be released) and returns it, gated.
async fn gated_member(ctx: &Ctx, name: &str, gang: &str) -> Pod {
    let p = create(ctx, member(name, gang, "4", 1)).await.expect("a gang member is admitted");
    assert!(gates(&p).contains(&GANG_GATE.to_string()), "a gang member is gated at creation: {:?}", gates(&p));
    p
}

// ---------------------------------------------------------------------------------------------
// 1. Stalling the webhook with a declared size
// ---------------------------------------------------------------------------------------------

#[test]
fn huge_gang_size_is_denied_and_does_not_stall_the_webhook() {
    attempt("huge_gang_size_is_denied_and_does_not_stall_the_webhook", "t-huge-size", |ctx| async move {
        for (i, size) in ["4294967295", "10000"].into_iter().enumerate() {
            let started = Instant::now();
            let message = denial(
                &format!("gang-size {size}"),
                create(&ctx, member(&format!("huge-{i}"), &format!("huge-{i}"), size, 1)).await,
            );
            assert_names(&format!("gang-size {size}"), &message, &["allot.dev/gang-size", size]);
            assert!(started.elapsed() < Duration::from_secs(4), "the denial took {:?}", started.elapsed());
            assert!(ctx.admin_pods().get_opt(&format!("huge-{i}")).await.expect("get").is_none());
        }
        // Not stalled: a normal member is admitted and gated at once, and the webhook answers.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        gated_member(&ctx, "normal-0", "normal").await;
        assert!(started.elapsed() < Duration::from_secs(4), "a normal create took {:?}", started.elapsed());
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn huge_kueue_group_total_does_not_stall_the_webhook() {
    attempt("huge_kueue_group_total_does_not_stall_the_webhook", "t-huge-kueue", |ctx| async move {
        // Kueue's pod-group keys are another size a user writes. Either Allot ignores them (no
        // Kueue declared in the Cluster policy) or it bounds them; either way it keeps answering.
        let mut p = pod("kueue-huge", 1);
        p["metadata"]["labels"] = json!({"kueue.x-k8s.io/pod-group-name": "huge"});
        p["metadata"]["annotations"] = json!({"kueue.x-k8s.io/pod-group-total-count": "4294967295"});
        match create(&ctx, p).await {
            Ok(_) => {}
            Err(e) => {
                let message = denial("kueue total 4294967295", Err::<(), _>(e));
                assert_names("kueue total 4294967295", &message, &["kueue.x-k8s.io/pod-group-total-count"]);
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_webhook_answers(&ctx).await;
        gated_member(&ctx, "normal-0", "normal").await;
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Removing Allot's gates
// ---------------------------------------------------------------------------------------------

#[test]
fn tenant_cannot_remove_the_gang_gate() {
    attempt("tenant_cannot_remove_the_gang_gate", "t-gang-gate", |ctx| async move {
        let mut p = member("w-0", "ring", "4", 1);
        p["spec"]["schedulingGates"] = json!([{"name": "example.com/hold"}]);
        let created = create(&ctx, p).await.expect("a gang member with a gate of alice's own");
        let before = gates(&created);
        assert!(
            before.contains(&GANG_GATE.to_string()) && before.contains(&"example.com/hold".to_string()),
            "{before:?}"
        );
        let pods = ctx.pods();
        let pp = PatchParams::default();

        let message = denial(
            "remove /spec/schedulingGates",
            pods.patch("w-0", &pp, &json_patch(json!([{"op": "remove", "path": "/spec/schedulingGates"}]))).await,
        );
        assert_names("remove all gates", &message, &[GANG_GATE]);
        assert_eq!(gates(&ctx.get("w-0").await), before);

        let index = before.iter().position(|g| g == GANG_GATE).unwrap();
        let message = denial(
            "remove Allot's gate alone",
            pods.patch(
                "w-0",
                &pp,
                &json_patch(json!([{"op": "remove", "path": format!("/spec/schedulingGates/{index}")}])),
            )
            .await,
        );
        assert_names("remove Allot's gate alone", &message, &[GANG_GATE]);

        let message = denial(
            "replace the gates with alice's own",
            pods.patch(
                "w-0",
                &pp,
                &json_patch(
                    json!([{"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "example.com/hold"}]}]),
                ),
            )
            .await,
        );
        assert_names("replace the gates with alice's own", &message, &[GANG_GATE]);

        // A gate that was not there: the API server itself only allows removals.
        denial(
            "replace the gates with another",
            pods.patch(
                "w-0",
                &pp,
                &json_patch(
                    json!([{"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "example.com/other"}]}]),
                ),
            )
            .await,
        );
        assert_eq!(gates(&ctx.get("w-0").await), before, "nothing changed");

        // Alice's own gate is hers to remove; Allot's stays.
        pods.patch(
            "w-0",
            &pp,
            &json_patch(json!([
                {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": GANG_GATE}]}
            ])),
        )
        .await
        .expect("alice may remove her own gate");
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        assert_eq!(gates(&ctx.get("w-0").await), [GANG_GATE]);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn tenant_cannot_remove_the_quota_gate() {
    attempt("tenant_cannot_remove_the_quota_gate", "t-quota-gate", |ctx| async move {
        // Queue quota of 1 GPU: the first pod is let go, the second waits behind allot.dev/quota.
        create(&ctx, pod("q-0", 1)).await.expect("queued");
        create(&ctx, pod("q-1", 1)).await.expect("queued");
        wait_for("q-0 released by the quota queue, q-1 held", Duration::from_secs(30), || async {
            gates(&ctx.get("q-0").await).is_empty() && gates(&ctx.get("q-1").await).contains(&QUOTA_GATE.to_string())
        })
        .await;
        let message = denial(
            "remove the quota gate",
            ctx.pods()
                .patch(
                    "q-1",
                    &PatchParams::default(),
                    &json_patch(json!([{"op": "remove", "path": "/spec/schedulingGates"}])),
                )
                .await,
        );
        assert_names("remove the quota gate", &message, &[QUOTA_GATE]);
        assert_still_gated(&ctx, "q-1", QUOTA_GATE, Duration::from_secs(2)).await;
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn binding_a_gated_pod_directly_is_refused() {
    attempt("binding_a_gated_pod_directly_is_refused", "t-binding", |ctx| async move {
        gated_member(&ctx, "w-0", "ring").await;
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "w-0"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"}
        });
        let result: Result<Value, _> =
            ctx.pods().create_subresource("binding", "w-0", &PostParams::default(), &binding).await;
        let message = denial("pods/binding of a gated pod", result);
        // Refused by the API server itself (kube-apiserver refuses to bind a pod with gates).
        assert_names("pods/binding", &message, &["schedulingGates"]);
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(1)).await;
        assert_webhook_answers(&ctx).await;
    });
}

// ---------------------------------------------------------------------------------------------
// 3. Allot's reserved keys
// ---------------------------------------------------------------------------------------------

#[test]
fn tenant_cannot_write_reserved_gang_keys_on_update() {
    attempt("tenant_cannot_write_reserved_gang_keys_on_update", "t-reserved-update", |ctx| async move {
        gated_member(&ctx, "w-0", "ring").await;
        create(&ctx, pod("solo", 1)).await.expect("a plain GPU pod");
        let pods = ctx.pods();
        let pp = PatchParams::default();
        let attempts = [
            (
                "w-0",
                "allot.dev/gang-released",
                json!({"metadata": {"annotations": {"allot.dev/gang-released": "true"}}}),
            ),
            ("w-0", "allot.dev/gang-size", json!({"metadata": {"annotations": {"allot.dev/gang-size": "1"}}})),
            ("w-0", "allot.dev/gang-name", json!({"metadata": {"labels": {"allot.dev/gang-name": "other"}}})),
            ("w-0", "allot.dev/gang-name", json!({"metadata": {"labels": {"allot.dev/gang-name": null}}})),
            (
                "solo",
                "allot.dev/gang-",
                json!({"metadata": {"labels": {"allot.dev/gang-name": "late"}, "annotations": {"allot.dev/gang-size": "2"}}}),
            ),
            (
                "solo",
                "allot.dev/gang-released",
                json!({"metadata": {"annotations": {"allot.dev/gang-released": "true"}}}),
            ),
        ];
        for (name, key, patch) in attempts {
            let what = format!("{name}: {patch}");
            let message = denial(&what, pods.patch(name, &pp, &Patch::Merge(&patch)).await);
            assert_names(&what, &message, &[key]);
        }
        let w = ctx.get("w-0").await;
        assert_eq!(label(&w, "allot.dev/gang-name").as_deref(), Some("ring"));
        assert_eq!(annotation(&w, "allot.dev/gang-size").as_deref(), Some("4"));
        assert_eq!(annotation(&w, "allot.dev/gang-released"), None);
        let solo = ctx.get("solo").await;
        assert_eq!(label(&solo, "allot.dev/gang-name"), None);
        assert_eq!(annotation(&solo, "allot.dev/gang-released"), None);
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        // Keys that are not Allot's stay alice's to change.
        pods.patch("w-0", &pp, &Patch::Merge(json!({"metadata": {"labels": {"team-note": "mine"}}})))
            .await
            .expect("alice may change her own labels");
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn tenant_cannot_write_gang_released_at_create() {
    attempt("tenant_cannot_write_gang_released_at_create", "t-reserved-create", |ctx| async move {
        // Denied, or (the issue allows it) stripped: never a pod that says it was released.
        for (name, mut p) in [("w-0", member("w-0", "ring", "2", 1)), ("solo", pod("solo", 1))] {
            p["metadata"]["annotations"]["allot.dev/gang-released"] = json!("true");
            match create(&ctx, p).await {
                Ok(created) => {
                    assert_eq!(annotation(&created, "allot.dev/gang-released"), None, "{name}: kept the annotation");
                }
                Err(e) => {
                    let message = denial(name, Err::<(), _>(e));
                    assert_names(name, &message, &["allot.dev/gang-released"]);
                }
            }
        }
        if ctx.admin_pods().get_opt("w-0").await.expect("get").is_some() {
            assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        }
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn reserved_keys_cannot_be_written_through_pods_status() {
    attempt("reserved_keys_cannot_be_written_through_pods_status", "t-reserved-status", |ctx| async move {
        // pods/status keeps the spec but lets metadata through: another way to the same keys.
        gated_member(&ctx, "w-0", "ring").await;
        let pp = PatchParams::default();
        for (key, patch) in [
            ("allot.dev/gang-released", json!({"metadata": {"annotations": {"allot.dev/gang-released": "true"}}})),
            ("allot.dev/gang-size", json!({"metadata": {"annotations": {"allot.dev/gang-size": "1"}}})),
        ] {
            let what = format!("pods/status {patch}");
            let result = ctx.pods().patch_status("w-0", &pp, &Patch::Merge(&patch)).await;
            if let Ok(p) = &result {
                panic!("{what}: admitted; the pod now has {key}={:?}", annotation(p, key));
            }
            let message = denial(&what, result);
            assert_names(&what, &message, &[key]);
        }
        let w = ctx.get("w-0").await;
        assert_eq!(annotation(&w, "allot.dev/gang-released"), None);
        assert_eq!(annotation(&w, "allot.dev/gang-size").as_deref(), Some("4"));
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        assert_webhook_answers(&ctx).await;
    });
}

// ---------------------------------------------------------------------------------------------
// 4. Exemptions a tenant can write
// ---------------------------------------------------------------------------------------------

/// The scheduler name the Cluster policy gives Volcano in these attempts.
const VOLCANO_E2E: &str = "volcano-tenant-e2e";

/// Alice's team queues its GPUs (quota mode Queue, 1 GPU). The Cluster lists Volcano, whose
/// pods Allot's quota queue does not hold; a pod naming Volcano's scheduler ran at once, past
/// her quota (Volcano's queue is hers to pick). Now denied, with what to do instead; the same pod
/// for the default scheduler queues, and one asking no GPU is admitted for Volcano.
#[test]
fn a_volcano_pod_does_not_run_past_a_queue_mode_quota() {
    attempt("a_volcano_pod_does_not_run_past_a_queue_mode_quota", "t-queue-volcano", |ctx| async move {
        let mut p = pod("v-0", 1);
        p["spec"]["schedulerName"] = json!(VOLCANO_E2E);
        let message = denial("a GPU pod for Volcano in a queue-mode team", create(&ctx, p).await);
        assert_names("v-0", &message, &["team/quota", "queue-volcano", "would not wait in it", "Volcano's queues"]);
        let mut cpu = pod("v-1", 0);
        cpu["spec"]["schedulerName"] = json!(VOLCANO_E2E);
        create(&ctx, cpu).await.expect("a pod asking nothing the quota counts");
        let queued = create(&ctx, pod("d-0", 1)).await.expect("the same pod for the default scheduler");
        assert!(gates(&queued).contains(&"allot.dev/quota".to_string()), "not queued: {:?}", gates(&queued));
        // Kueue's gate written by alice on her Volcano pod: Kueue's to admit (the cluster lists
        // Kueue), so admitted behind that gate alone, which she cannot lift herself.
        let mut kueued = pod("v-2", 1);
        kueued["spec"]["schedulerName"] = json!(VOLCANO_E2E);
        kueued["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        let created = create(&ctx, kueued).await.expect("behind Kueue's gate");
        assert_eq!(gates(&created), ["kueue.x-k8s.io/admission"]);
        let lift = json_patch(json!([{"op": "remove", "path": "/spec/schedulingGates/0"}]));
        let message =
            denial("alice lifting Kueue's gate", ctx.pods().patch("v-2", &PatchParams::default(), &lift).await);
        assert_names("v-2", &message, &["tenant/allot-gates", "only Kueue"]);
        assert_still_gated(&ctx, "v-2", "kueue.x-k8s.io/admission", Duration::ZERO).await;
        // A Job whose pods Volcano would place: refused as a template, before any pod.
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "via-volcano"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "schedulerName": VOLCANO_E2E, "containers": [
                {"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        }))
        .expect("a Job");
        let message = denial("a Job for Volcano", ctx.jobs().create(&PostParams::default(), &job).await);
        assert_names("via-volcano", &message, &["team/quota", "spec.template.spec.schedulerName"]);
        assert_webhook_answers(&ctx).await;
    });
}

/// The Cluster policy here lists Kueue. Kueue's label alone holds nothing (the pod would run at
/// once), so it exempts nothing; Kueue's gate exempts a pod from Allot's gates because it holds
/// the pod for Kueue, so only Kueue may lift it: alice cannot.
#[test]
fn kueue_markers_exempt_nothing_alice_can_lift() {
    attempt("kueue_markers_exempt_nothing_alice_can_lift", "t-kueue-label", |ctx| async move {
        let mut p = member("w-0", "ring", "4", 1);
        p["metadata"]["labels"]["kueue.x-k8s.io/managed"] = json!("true");
        let created = create(&ctx, p).await.expect("admitted");
        assert!(gates(&created).contains(&GANG_GATE.to_string()), "not gated: {:?}", gates(&created));
        // Kueue's own gate, written by alice: Kueue's to lift, so Allot leaves the pod to it.
        let mut p = member("w-1", "ring", "4", 1);
        p["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        let created = create(&ctx, p).await.expect("admitted");
        assert_eq!(gates(&created), ["kueue.x-k8s.io/admission"]);
        let lift = json_patch(json!([{"op": "remove", "path": "/spec/schedulingGates/0"}]));
        let message =
            denial("alice lifting Kueue's gate", ctx.pods().patch("w-1", &PatchParams::default(), &lift).await);
        assert_names("w-1", &message, &["tenant/allot-gates", "only Kueue", "kueue-controller-manager"]);
        assert_still_gated(&ctx, "w-1", "kueue.x-k8s.io/admission", Duration::ZERO).await;
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn volcano_annotation_does_not_exempt_a_gang() {
    attempt("volcano_annotation_does_not_exempt_a_gang", "t-volcano-annotation", |ctx| async move {
        let mut p = member("w-0", "ring", "4", 1);
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = json!("pg");
        let created = create(&ctx, p).await.expect("admitted");
        assert!(gates(&created).contains(&GANG_GATE.to_string()), "not gated: {:?}", gates(&created));
        // Volcano's scheduler name: no Volcano is declared in the Cluster policy either. (Its own
        // gang: members of one gang must agree on their scheduler, which gang/consistency checks.)
        let mut p = member("v-0", "vring", "4", 1);
        p["spec"]["schedulerName"] = json!("volcano");
        let created = create(&ctx, p).await.expect("admitted");
        assert!(gates(&created).contains(&GANG_GATE.to_string()), "not gated: {:?}", gates(&created));
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        assert_webhook_answers(&ctx).await;
    });
}

/// Trust is not read from what alice writes, and what her team's quota does not count she may
/// not ask. A pod she annotates as a kubelet's mirror pod: the API server requires `nodeName`
/// with the annotation, and a GPU pod or gang member naming its node is denied to her (the
/// engine no longer skips mutation for the annotation either: `tests/tenant.rs`). A MIG
/// profile her team's quota neither limits nor weighs is denied, not free.
#[test]
fn forged_mirror_pods_and_uncounted_accelerators_get_nothing_for_free() {
    attempt("forged_mirror_pods_and_uncounted_accelerators_get_nothing_for_free", "t-forged-trust", |ctx| async move {
        for (name, mut p) in [("mirror", pod("mirror", 1)), ("w-0", member("w-0", "ring", "4", 1))] {
            p["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("forged");
            p["spec"]["nodeName"] = json!("gpu-node-1");
            let message = denial(name, create(&ctx, p).await);
            assert_names(name, &message, &["nodeName"]);
            assert!(ctx.admin_pods().get_opt(name).await.expect("get").is_none(), "{name} exists");
        }

        let mut slice = pod("slice", 0);
        slice["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/mig-3g.40gb": "2"}});
        let message = denial("slice", create(&ctx, slice).await);
        assert_names("slice", &message, &["quota does not count nvidia.com/mig-3g.40gb"]);
        assert!(ctx.admin_pods().get_opt("slice").await.expect("get").is_none(), "slice exists");
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn gpu_pod_with_node_name_is_denied() {
    attempt("gpu_pod_with_node_name_is_denied", "t-node-name", |ctx| async move {
        for (name, mut p) in [("direct", pod("direct", 1)), ("w-0", member("w-0", "ring", "4", 1))] {
            p["spec"]["nodeName"] = json!("gpu-node-1");
            let message = denial(name, create(&ctx, p).await);
            assert_names(name, &message, &["nodeName"]);
            assert!(ctx.admin_pods().get_opt(name).await.expect("get").is_none(), "{name} exists");
        }
        assert_eq!(gpus_in_use(&ctx).await, 0);
        // A CPU pod may not name it either: the node's GPU taint is reserveTolerations'
        // (the kubelet admits a pod bound by name past a NoSchedule taint).
        let mut cpu = pod("cpu", 0);
        cpu["spec"]["nodeName"] = json!("gpu-node-1");
        let message = denial("a CPU pod naming a GPU node", create(&ctx, cpu).await);
        assert_names("cpu", &message, &["tenant/tolerations", "node gpu-node-1 has the taint nvidia.com/gpu"]);
        // Nor a node nobody has seen: it would run on the next node to join under that name.
        let mut cpu = pod("cpu", 0);
        cpu["spec"]["nodeName"] = json!("gpu-node-9");
        let message = denial("a CPU pod naming a node that does not exist", create(&ctx, cpu).await);
        assert_names("cpu", &message, &["tenant/tolerations", "no node gpu-node-9 is known to Allot"]);
        assert!(ctx.admin_pods().get_opt("cpu").await.expect("get").is_none(), "the pod exists");
        assert_webhook_answers(&ctx).await;
    });
}

/// The bounds on what every replica keeps, on the real API server, as alice: a gang member
/// with more tolerations than Allot keeps, and a pod asking more made-up resources than a pod
/// may, are refused at apply and never exist.
#[test]
fn oversized_placements_and_made_up_resources_are_refused() {
    attempt("oversized_placements_and_made_up_resources_are_refused", "t-oversized", |ctx| async move {
        let mut big = member("big-0", "big", "2", 1);
        big["spec"]["tolerations"] =
            (0..100).map(|i| json!({"key": format!("example.com/k{i}"), "operator": "Exists"})).collect();
        let message = denial("a gang member with 100 tolerations", create(&ctx, big).await);
        assert_names("big-0", &message, &["tenant/placement-size", "at most 64"]);
        let mut many = pod("many", 1);
        let limits = many["spec"]["containers"][0]["resources"]["limits"].as_object_mut().expect("limits");
        for i in 0..70 {
            limits.insert(format!("example.com/r{i}"), json!("1"));
        }
        let message = denial("a pod asking 71 resources", create(&ctx, many).await);
        assert_names("many", &message, &["tenant/resource-names", "asks 71 distinct resources"]);
        for name in ["big-0", "many"] {
            assert!(ctx.admin_pods().get_opt(name).await.expect("get").is_none(), "{name} exists");
        }
        assert_webhook_answers(&ctx).await;
    });
}

/// reserveTolerations on the real API server, as alice: a pod asking for no GPU cannot get
/// onto the GPU nodes by tolerating their taint (by name, or every taint), by adding the
/// toleration later (the API server lets a pod gain tolerations), or through a Job's template;
/// the API server's own default tolerations pass.
#[test]
fn cpu_pods_cannot_squat_on_gpu_nodes() {
    attempt("cpu_pods_cannot_squat_on_gpu_nodes", "t-squat", |ctx| async move {
        let gpu_taint = json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"});
        for (name, toleration) in [("gpu-taint", gpu_taint.clone()), ("everything", json!({"operator": "Exists"}))] {
            let mut p = pod(name, 0);
            p["spec"]["tolerations"] = json!([toleration]);
            let message = denial(name, create(&ctx, p).await);
            assert_names(name, &message, &["tenant/tolerations", "placement nvidia-gpu keeps for pods asking for"]);
            assert!(ctx.admin_pods().get_opt(name).await.expect("get").is_none(), "{name} exists");
        }
        // The API server gives every pod the not-ready/unreachable NoExecute tolerations.
        let plain = create(&ctx, pod("plain", 0)).await.expect("a plain CPU pod");
        let defaults = plain.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
        assert!(!defaults.is_empty(), "DefaultTolerationSeconds added none");
        let add = json_patch(json!([{"op": "add", "path": "/spec/tolerations/-", "value": gpu_taint}]));
        let message =
            denial("adding the GPU toleration", ctx.pods().patch("plain", &PatchParams::default(), &add).await);
        assert_names("plain", &message, &["tenant/tolerations", "spec.tolerations["]);
        assert_eq!(ctx.get("plain").await.spec.and_then(|s| s.tolerations).map(|t| t.len()), Some(defaults.len()));
        // Other edits of the pod still pass.
        let label = json_patch(json!([{"op": "add", "path": "/metadata/labels", "value": {"tier": "web"}}]));
        ctx.pods().patch("plain", &PatchParams::default(), &label).await.expect("a label edit");

        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "squat"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "w", "image": "busybox:1.36"}]}}}
        }))
        .expect("a job");
        let message =
            denial("a Job whose template tolerates everything", ctx.jobs().create(&PostParams::default(), &job).await);
        assert_names("job", &message, &["tenant/tolerations", "spec.template.spec.tolerations[0]"]);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn job_template_with_node_name_does_not_bypass_the_gates() {
    attempt("job_template_with_node_name_does_not_bypass_the_gates", "t-job-node-name", |ctx| async move {
        // The pods are created by the Job controller, not alice: her nodeName must not ride along.
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "pinned"},
            "spec": {"parallelism": 2, "completions": 2, "template": {
                "metadata": {"labels": {"allot.dev/gang-name": "pinned"}, "annotations": {"allot.dev/gang-size": "4"}},
                "spec": {"restartPolicy": "Never", "nodeName": "gpu-node-1", "containers": [
                    {"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        }))
        .unwrap();
        match ctx.jobs().create(&PostParams::default(), &job).await {
            Err(e) => {
                let message = denial("a Job pinned to a node", Err::<(), _>(e));
                assert_names("a Job pinned to a node", &message, &["nodeName"]);
            }
            Ok(_) => {
                // Admitted as a template: no pod of it may be on the node, past the gang gate.
                tokio::time::sleep(Duration::from_secs(5)).await;
                let pods = ctx.admin_pods().list(&ListParams::default().labels("job-name=pinned")).await.expect("list");
                for p in &pods.items {
                    assert!(
                        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
                        "{:?} is on a node with gates {:?}",
                        p.metadata.name,
                        gates(p)
                    );
                }
            }
        }
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn job_template_with_reserved_keys_does_not_release_its_pods() {
    attempt("job_template_with_reserved_keys_does_not_release_its_pods", "t-job-reserved", |ctx| async move {
        // The Job controller writes what alice put in the template: the reserved keys with it.
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "forged"},
            "spec": {"parallelism": 1, "completions": 1, "template": {
                "metadata": {
                    "labels": {"allot.dev/gang-name": "forged"},
                    "annotations": {"allot.dev/gang-size": "4", "allot.dev/gang-released": "true"}},
                "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        }))
        .unwrap();
        match ctx.jobs().create(&PostParams::default(), &job).await {
            Err(e) => {
                let message = denial("a Job with allot.dev/gang-released", Err::<(), _>(e));
                assert_names("a Job with allot.dev/gang-released", &message, &["allot.dev/gang-released"]);
            }
            Ok(_) => {
                // Admitted as a template: its pods are refused, or stripped and gated.
                tokio::time::sleep(Duration::from_secs(5)).await;
                let pods = ctx.admin_pods().list(&ListParams::default().labels("job-name=forged")).await.expect("list");
                for p in &pods.items {
                    assert_eq!(annotation(p, "allot.dev/gang-released"), None, "{:?}", p.metadata.name);
                    assert!(gates(p).contains(&GANG_GATE.to_string()), "{:?}: gates {:?}", p.metadata.name, gates(p));
                }
            }
        }
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn fake_daemonset_owner_does_not_exempt_a_gang() {
    attempt("fake_daemonset_owner_does_not_exempt_a_gang", "t-fake-owner", |ctx| async move {
        let mut p = member("w-0", "ring", "4", 1);
        p["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "fake",
            "uid": "00000000-0000-0000-0000-000000000001", "controller": true
        }]);
        // The owner does not exist, so the garbage collector may delete the pod soon: judge the
        // object the create returned.
        match create(&ctx, p).await {
            Ok(created) => {
                assert!(gates(&created).contains(&GANG_GATE.to_string()), "not gated: {:?}", gates(&created))
            }
            Err(e) => {
                denial("a pod with a forged DaemonSet owner", Err::<(), _>(e));
            }
        }
        assert_webhook_answers(&ctx).await;
    });
}

// ---------------------------------------------------------------------------------------------
// 5. Deny quotas through gangs
// ---------------------------------------------------------------------------------------------

#[test]
fn deny_quota_holds_against_an_oversized_gang() {
    attempt("deny_quota_holds_against_an_oversized_gang", "t-oversized-gang", |ctx| async move {
        // Quota 4 GPUs; 8 one-GPU members of a gang that declares 2.
        let mut admitted = Vec::new();
        for i in 0..8 {
            let name = format!("m-{i}");
            match create(&ctx, member(&name, "big", "2", 1)).await {
                Ok(_) => admitted.push(name.clone()),
                Err(e) => {
                    let message = denial(&name, Err::<(), _>(e));
                    assert_names(&name, &message, &["big", "2"]);
                }
            }
            let used = gpus_in_use(&ctx).await;
            assert!(used <= 4, "after {name}: the team holds {used} GPUs, its deny limit is 4");
        }
        assert_eq!(admitted, ["m-0", "m-1"], "members beyond the declared size are denied");
        // The gang is charged 2: exactly 2 more GPUs fit, then the limit says so.
        create(&ctx, pod("p-0", 1)).await.expect("3 of 4");
        create(&ctx, pod("p-1", 1)).await.expect("4 of 4");
        let message = denial("p-2", create(&ctx, pod("p-2", 1)).await);
        assert_names("p-2", &message, &["4 of 4"]);
        assert_eq!(gpus_in_use(&ctx).await, 4);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn a_gang_is_charged_its_declared_size() {
    attempt("a_gang_is_charged_its_declared_size", "t-declared-size", |ctx| async move {
        // One member present of a gang of 3: the team is charged 3, not 1, also once the pod is
        // in the watch (not only while the admission ledger remembers it).
        create(&ctx, member("m-0", "trio", "3", 1)).await.expect("member");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let message = denial("2 more GPUs", create(&ctx, pod("p-0", 2)).await);
        assert_names("2 more GPUs", &message, &["of 4", "asks 2"]);
        create(&ctx, pod("p-1", 1)).await.expect("3 + 1 of 4");
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn gang_sizes_that_disagree_do_not_grow_past_the_quota() {
    attempt("gang_sizes_that_disagree_do_not_grow_past_the_quota", "t-mixed-sizes", |ctx| async move {
        // Each member declares a larger gang than the one before: whatever Allot makes of that,
        // the team never holds more than its 4 GPUs.
        for i in 0..6u32 {
            let name = format!("m-{i}");
            if let Err(e) = create(&ctx, member(&name, "grow", &(i + 1).to_string(), 1)).await {
                denial(&name, Err::<(), _>(e));
            }
            let used = gpus_in_use(&ctx).await;
            assert!(used <= 4, "after {name}: the team holds {used} GPUs, its deny limit is 4");
        }
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn terminating_pods_still_count_against_a_deny_quota() {
    attempt("terminating_pods_still_count_against_a_deny_quota", "t-terminating", |ctx| async move {
        create(&ctx, pod("p-0", 1)).await.expect("1 of 2");
        create(&ctx, pod("p-1", 1)).await.expect("2 of 2");
        wait_for("both pods bound", Duration::from_secs(30), || async {
            let mut bound = 0;
            for n in ["p-0", "p-1"] {
                bound += usize::from(ctx.get(n).await.spec.and_then(|s| s.node_name).is_some());
            }
            bound == 2
        })
        .await;
        // A graceful delete: with no kubelet to confirm it, the pod stays terminating and keeps
        // its GPU, as a real pod does until its containers are gone.
        ctx.pods().delete("p-0", &DeleteParams::default()).await.expect("delete");
        assert!(ctx.get("p-0").await.metadata.deletion_timestamp.is_some(), "p-0 is terminating");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let message = denial("a pod in place of a terminating one", create(&ctx, pod("p-2", 1)).await);
        assert_names("terminating", &message, &["2 of 2"]);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn dry_run_creates_reserve_no_quota() {
    attempt("dry_run_creates_reserve_no_quota", "t-dry-run", |ctx| async move {
        let dry = PostParams { dry_run: true, ..Default::default() };
        for i in 0..3 {
            ctx.pods().create(&dry, &typed(pod(&format!("dry-{i}"), 2))).await.expect("a dry run that fits");
        }
        ctx.pods().create(&PostParams::default(), &typed(pod("real", 2))).await.expect("the real pod still fits");
        // Dry runs are still checked: a third GPU is over the limit.
        let message = denial("a dry run over the limit", ctx.pods().create(&dry, &typed(pod("dry-over", 1))).await);
        assert_names("a dry run over the limit", &message, &["2 of 2"]);
        assert_eq!(gpus_in_use(&ctx).await, 2);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn resize_cannot_grow_past_a_deny_quota() {
    attempt("resize_cannot_grow_past_a_deny_quota", "t-resize", |ctx| async move {
        // Team quota cpu: 2, enforced at create. In-place resize (pods/resize) is another way
        // to grow a pod.
        let with_cpu = |name: &str, cpu: &str| {
            let mut p = pod(name, 1);
            p["spec"]["containers"][0]["resources"]["requests"] = json!({"cpu": cpu});
            p
        };
        let message = denial("a 3-CPU pod", create(&ctx, with_cpu("big", "3")).await);
        assert_names("a 3-CPU pod", &message, &["cpu"]);
        create(&ctx, with_cpu("r-0", "1")).await.expect("1 of 2 CPUs");
        let message = denial(
            "resize to 8 CPUs",
            ctx.pods()
                .patch_subresource(
                    "resize",
                    "r-0",
                    &PatchParams::default(),
                    &Patch::Strategic(
                        json!({"spec": {"containers": [{"name": "w", "resources": {"requests": {"cpu": "8"}}}]}}),
                    ),
                )
                .await,
        );
        assert_names("resize to 8 CPUs", &message, &["cpu"]);
        let r = ctx.get("r-0").await;
        let cpu =
            r.spec.unwrap().containers[0].resources.as_ref().and_then(|r| r.requests.as_ref()?.get("cpu").cloned());
        assert_eq!(cpu.map(|q| q.0).as_deref(), Some("1"));
        assert_webhook_answers(&ctx).await;
    });
}

// ---------------------------------------------------------------------------------------------
// 7. More that a tenant can write
// ---------------------------------------------------------------------------------------------

#[test]
fn malformed_gang_sizes_are_denied() {
    attempt("malformed_gang_sizes_are_denied", "t-malformed-size", |ctx| async move {
        let long = "9".repeat(200_000);
        for (i, size) in
            ["two", "-1", "0", "1.5", "", "0x10", "1e3", "4294967296", long.as_str()].into_iter().enumerate()
        {
            let shown: String = size.chars().take(12).collect();
            let what = format!("gang-size {shown:?}");
            let started = Instant::now();
            let message = denial(&what, create(&ctx, member(&format!("m-{i}"), "bad", size, 1)).await);
            assert_names(&what, &message, &["allot.dev/gang-size"]);
            assert!(started.elapsed() < Duration::from_secs(4), "{what}: the denial took {:?}", started.elapsed());
        }
        assert_eq!(gpus_in_use(&ctx).await, 0);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn ten_thousand_containers_do_not_stall_the_webhook() {
    attempt("ten_thousand_containers_do_not_stall_the_webhook", "t-many-containers", |ctx| async move {
        let containers: Vec<Value> = (0..10_000)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
            .collect();
        let mut p = member("many", "many", "2", 0);
        p["spec"]["containers"] = Value::Array(containers);
        let started = Instant::now();
        let refused = create(&ctx, p).await;
        let took = started.elapsed();
        println!("10,000 containers answered in {took:?}");
        match refused {
            // The AdmissionReview of this pod is over Allot's body limit: Allot answers 413 with
            // a Status saying so, and the API server (failurePolicy Fail) refuses the pod with
            // that message.
            Err(kube::Error::Api(status))
                if status.code == 500 && status.message.contains("too large to be reviewed") =>
            {
                println!("  refused (500, Allot's 413): {}", status.message);
            }
            other => {
                let message = denial("10,000 GPU containers", other);
                assert_names("10,000 GPU containers", &message, &["nvidia.com/gpu"]);
            }
        }
        // Allot answered within the webhook's timeout (a timeout is a 500 without 413); the
        // bound only catches a hang of the API server itself.
        assert!(took < Duration::from_secs(10), "the answer took {took:?}");
        assert!(ctx.admin_pods().get_opt("many").await.expect("get").is_none());
        assert_webhook_answers(&ctx).await;
        // 2,000 containers stay under the body limit: Allot reads them all and says why not.
        let containers: Vec<Value> = (0..2_000)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
            .collect();
        let mut p = member("wide", "wide", "2", 0);
        p["spec"]["containers"] = Value::Array(containers);
        let started = Instant::now();
        let message = denial("2,000 GPU containers", create(&ctx, p).await);
        let took = started.elapsed();
        println!("2,000 containers denied in {took:?}");
        assert_names("2,000 GPU containers", &message, &["nvidia.com/gpu"]);
        assert!(took < Duration::from_secs(10), "the denial took {took:?}");
        // A huge annotation that is not Allot's: admitted and gated as usual, promptly.
        let mut p = member("annotated", "annotated", "2", 1);
        p["metadata"]["annotations"]["example.com/blob"] = json!("x".repeat(200_000));
        let started = Instant::now();
        let created = create(&ctx, p).await.expect("a pod with a 200 kB annotation");
        assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
        assert!(gates(&created).contains(&GANG_GATE.to_string()));
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn priority_class_outside_the_team_is_denied() {
    attempt("priority_class_outside_the_team_is_denied", "t-priority", |ctx| async move {
        let mut p = member("w-0", "ring", "4", 1);
        p["spec"]["priorityClassName"] = json!("high-priority");
        let message = denial("high-priority for team tenant", create(&ctx, p).await);
        assert_names("high-priority", &message, &["high-priority"]);
        // The class the team allows is fine, and the member is gated as usual.
        let mut p = member("w-1", "ring", "4", 1);
        p["spec"]["priorityClassName"] = json!("low-priority");
        let created = create(&ctx, p).await.expect("low-priority is allowed");
        assert!(gates(&created).contains(&GANG_GATE.to_string()));
        assert_webhook_answers(&ctx).await;
    });
}

/// A team that lists no allowed classes (team open-priority) may use any class but the system
/// ones: alice's GPU pod at system-node-critical would preempt every other team's pods.
#[test]
fn system_priority_classes_are_denied_to_a_team_without_a_list() {
    attempt("system_priority_classes_are_denied_to_a_team_without_a_list", "t-open-priority", |ctx| async move {
        for class in ["system-node-critical", "system-cluster-critical"] {
            let mut p = pod("critical", 1);
            p["spec"]["priorityClassName"] = json!(class);
            let message = denial(class, create(&ctx, p).await);
            assert_names(class, &message, &["team/priority-class", &format!("{class} is a system priority class")]);
            assert!(ctx.admin_pods().get_opt("critical").await.expect("get").is_none(), "{class}: the pod exists");
        }
        // Any other class is the team's to use.
        let mut p = pod("high", 1);
        p["spec"]["priorityClassName"] = json!("high-priority");
        let created = create(&ctx, p).await.expect("high-priority for a team without a list");
        assert_eq!(created.spec.and_then(|s| s.priority), Some(1_000_000));
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn gang_members_cannot_disagree_on_their_scheduler() {
    attempt("gang_members_cannot_disagree_on_their_scheduler", "t-scheduler", |ctx| async move {
        // A second scheduler for half a gang would place that half on its own: the two halves
        // could each hold GPUs waiting for the other, the deadlock gangs exist to prevent.
        create(&ctx, member("w-0", "ring", "2", 1)).await.expect("the first member");
        let mut other = member("w-1", "ring", "2", 1);
        other["spec"]["schedulerName"] = json!("volcano");
        // Allot knows the gang's members from its watch: wait (with dry runs, which change
        // nothing) until it has seen w-0, then the real create must be denied the same way.
        let dry = PostParams { dry_run: true, ..Default::default() };
        let deadline = Instant::now() + Duration::from_secs(10);
        while ctx.pods().create(&dry, &typed(other.clone())).await.is_ok() {
            assert!(Instant::now() < deadline, "w-1 on another scheduler still admitted after 10 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let message = denial("w-1 on another scheduler", create(&ctx, other).await);
        assert_names("w-1 on another scheduler", &message, &["ring", "schedulerName", "volcano", "w-0"]);
        // Its gang stays as it was: one member, still gated.
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        assert_eq!(gpus_in_use(&ctx).await, 1);
        // On the gang's own scheduler, the same member is admitted, gated.
        let created = create(&ctx, member("w-1", "ring", "2", 1)).await.expect("w-1 on the default scheduler");
        assert!(gates(&created).contains(&GANG_GATE.to_string()), "not gated: {:?}", gates(&created));
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn members_admitted_unseen_by_each_other_are_held_until_they_agree() {
    attempt("members_admitted_unseen_by_each_other_are_held_until_they_agree", "t-scheduler-race", |ctx| async move {
        // Two members created at the same moment each pass validation before Allot's watch
        // shows the other. Made deterministic here: the validating webhook skips w-1's create
        // (a match condition the admin adds for this one request), as if it had raced w-0.
        create(&ctx, member("w-0", "ring", "2", 1)).await.expect("the first member");
        let skip_w1 = MatchCondition {
            name: "e2e-w-1-unseen".into(),
            expression: format!("!(request.namespace == '{}' && request.name == 'w-1')", ctx.ns),
        };
        validating_condition(&ctx.admin, &skip_w1, true).await;
        let mut other = member("w-1", "ring", "2", 1);
        other["spec"]["schedulerName"] = json!("volcano");
        // The API server takes the changed configuration up within moments: until then Allot
        // still sees (and denies) the create.
        let deadline = Instant::now() + Duration::from_secs(10);
        let created = loop {
            match create(&ctx, other.clone()).await {
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
                result => break result,
            }
        };
        validating_condition(&ctx.admin, &skip_w1, false).await;
        let created = created.expect("w-1, unseen by validation");
        assert!(gates(&created).contains(&GANG_GATE.to_string()), "mutation gated it: {:?}", gates(&created));
        // The controller compares the members it holds: neither goes, both are told why.
        let disagreeing = |pod: &Pod| {
            support::cluster::gang_condition(pod)
                .filter(|(status, reason, _)| status == "False" && reason == "MembersDisagree")
        };
        wait_for("both members explained as disagreeing", Duration::from_secs(30), || async {
            disagreeing(&ctx.get("w-0").await).is_some() && disagreeing(&ctx.get("w-1").await).is_some()
        })
        .await;
        let (_, _, explained) = disagreeing(&ctx.get("w-1").await).expect("still explained");
        assert_names("the condition", &explained, &["w-0", "w-1", "schedulerName", "default-scheduler", "volcano"]);
        for name in ["w-0", "w-1"] {
            assert_still_gated(&ctx, name, GANG_GATE, Duration::from_secs(1)).await;
        }
        // The member that differs deleted and made again on the gang's scheduler: both go.
        delete_now(&ctx, "w-1").await;
        create(&ctx, member("w-1", "ring", "2", 1)).await.expect("w-1 on the default scheduler");
        wait_for("the agreeing pair released", Duration::from_secs(30), || async {
            let (a, b) = (ctx.get("w-0").await, ctx.get("w-1").await);
            gates(&a).is_empty() && gates(&b).is_empty()
        })
        .await;
        assert_webhook_answers(&ctx).await;
    });
}

/// Serves JobSets (open schema, as a test stand-in for the JobSet operator's CRD; no controller
/// runs them) once per cluster, and lets alice write them in `ns`.
async fn serve_jobsets(ctx: &Ctx) {
    let kind = ("jobset.x-k8s.io".to_string(), "v1alpha2".to_string(), "JobSet".to_string());
    support::cluster::serve_custom_kinds(&ctx.admin, &std::collections::BTreeSet::from([kind])).await;
    let rules = json!([{"apiGroups": ["jobset.x-k8s.io"], "verbs": ["*"], "resources": ["jobsets"]}]);
    support::cluster::grant_role(&ctx.admin, &ctx.ns, "jobsets", TENANT, rules).await;
    // The new kind's discovery and alice's new Role reach the API server's caches a moment
    // later (a full CI run once saw the first create fail at once): wait until she may list.
    let resource = kube::api::ApiResource {
        group: "jobset.x-k8s.io".into(),
        version: "v1alpha2".into(),
        api_version: "jobset.x-k8s.io/v1alpha2".into(),
        kind: "JobSet".into(),
        plural: "jobsets".into(),
    };
    let jobsets: Api<kube::api::DynamicObject> = Api::namespaced_with(ctx.alice.clone(), &ctx.ns, &resource);
    wait_for("alice may list JobSets", Duration::from_secs(30), || async {
        jobsets.list(&ListParams::default()).await.is_ok()
    })
    .await;
}

#[test]
fn workload_templates_joining_one_gang_must_agree() {
    attempt("workload_templates_joining_one_gang_must_agree", "t-template-gangs", |ctx| async move {
        use kube::api::{ApiResource, DynamicObject};
        serve_jobsets(&ctx).await;
        let resource = ApiResource {
            group: "jobset.x-k8s.io".into(),
            version: "v1alpha2".into(),
            api_version: "jobset.x-k8s.io/v1alpha2".into(),
            kind: "JobSet".into(),
            plural: "jobsets".into(),
        };
        let jobsets: Api<DynamicObject> = Api::namespaced_with(ctx.alice.clone(), &ctx.ns, &resource);
        // Two replicated jobs whose pods join one gang (with `gang`: an explicit gang of 4,
        // else the JobSet's inferred one); the workers' template names another scheduler. Its pods would each be denied as the JobSet controller made
        // them, after the driver's two had been admitted to wait for them.
        let jobset_with = |name: &str, workers_scheduler: Option<&str>, gang: bool| {
            let template = |job: &str, scheduler: Option<&str>| {
                let mut spec = json!({"restartPolicy": "Never", "containers": [{"name": "w", "image": "busybox:1.36",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
                if let Some(s) = scheduler {
                    spec["schedulerName"] = json!(s);
                }
                let metadata = match gang {
                    true => {
                        json!({"labels": {"allot.dev/gang-name": "ring"}, "annotations": {"allot.dev/gang-size": "4"}})
                    }
                    false => json!({}),
                };
                json!({"name": job, "replicas": 1, "template": {"spec": {"parallelism": 2, "completions": 2, "template": {
                    "metadata": metadata, "spec": spec}}}})
            };
            let object = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
                "spec": {"replicatedJobs": [template("driver", None), template("workers", workers_scheduler)]}});
            serde_json::from_value::<DynamicObject>(object).expect("a JobSet")
        };
        let jobset = |name: &str, workers_scheduler: Option<&str>| jobset_with(name, workers_scheduler, true);
        let message = denial(
            "a JobSet whose templates disagree on the scheduler",
            jobsets.create(&PostParams::default(), &jobset("split", Some("volcano"))).await,
        );
        assert_names(
            "the denial",
            &message,
            &[
                "validate.allot.dev",
                "gang/consistency",
                "spec.replicatedJobs[1].template.spec.template.metadata",
                "schedulerName volcano",
                "spec.replicatedJobs[0].template.spec.template default-scheduler",
            ],
        );
        assert!(jobsets.get_opt("split").await.expect("get").is_none(), "nothing was created");
        // The same JobSet with templates that agree is admitted.
        jobsets.create(&PostParams::default(), &jobset("agreed", None)).await.expect("templates that agree");
        jobsets.delete("agreed", &DeleteParams::default()).await.expect("delete");
        // Unlabelled, where the GangPolicy infers JobSets: the pods' gang is the JobSet's own,
        // and its templates are compared under it.
        let message = denial(
            "an unlabelled JobSet whose templates disagree, JobSets inferred",
            jobsets.create(&PostParams::default(), &jobset_with("inferred", Some("volcano"), false)).await,
        );
        assert_names(
            "the denial",
            &message,
            &[
                "gang/consistency",
                "jobset-inferred",
                "spec.replicatedJobs[1].template.spec.template.metadata",
                "schedulerName volcano",
            ],
        );
        assert!(jobsets.get_opt("inferred").await.expect("get").is_none(), "nothing was created");
        jobsets
            .create(&PostParams::default(), &jobset_with("inferred", None, false))
            .await
            .expect("unlabelled, agreeing");
        jobsets.delete("inferred", &DeleteParams::default()).await.expect("delete");
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn a_recreated_member_arrives_gated() {
    attempt("a_recreated_member_arrives_gated", "t-recreate", |ctx| async move {
        // A gang of 2 is released; one member is deleted and made again under the same name.
        for i in 0..2 {
            create(&ctx, member(&format!("w-{i}"), "pair", "2", 1)).await.expect("member");
        }
        wait_for("the pair released", Duration::from_secs(30), || async {
            let (a, b) = (ctx.get("w-0").await, ctx.get("w-1").await);
            gates(&a).is_empty() && gates(&b).is_empty()
        })
        .await;
        delete_now(&ctx, "w-1").await;
        let again = create(&ctx, member("w-1", "pair", "2", 1)).await.expect("recreated");
        assert!(gates(&again).contains(&GANG_GATE.to_string()), "a new pod is gated: {:?}", gates(&again));
        assert_eq!(annotation(&again, "allot.dev/gang-released"), None);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn extreme_gpu_amounts_are_denied_by_allot() {
    attempt("extreme_gpu_amounts_are_denied_by_allot", "t-extreme-amounts", |ctx| async move {
        // Amounts the API server accepts for an extended resource, written in the common form
        // (digits and a suffix, Allot's short parse) and in the others (exponent, leading
        // zeros, the largest int64): each one is Allot's to deny, none may slip through as a
        // wrapped or misread number. The team's deny quota is 4 GPUs.
        // (The API server stores 8Ei, past int64, as the largest int64.) Each message names the
        // amount as Allot read it.
        let amounts = [
            ("5", "asks 5"),
            ("1k", "1000"),
            ("8Ei", "9223372036854775807"),
            ("9223372036854775807", "9223372036854775807"),
            ("1e3", "1000"),
            ("0005", "asks 5"),
        ];
        for (i, (amount, read_as)) in amounts.into_iter().enumerate() {
            let name = format!("p-{i}");
            let mut p = pod(&name, 0);
            p["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": amount}});
            let message = denial(&format!("{amount} GPUs"), create(&ctx, p).await);
            assert_names(&format!("{amount} GPUs"), &message, &["allot.dev", "nvidia.com/gpu", read_as]);
        }
        assert_eq!(gpus_in_use(&ctx).await, 0);
        // The limit itself is fine, in either form.
        let mut p = pod("p-fits", 0);
        p["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "0004"}});
        create(&ctx, p).await.expect("4 GPUs, the team's limit");
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn tenant_cannot_remove_gang_released_from_a_released_member() {
    attempt("tenant_cannot_remove_gang_released_from_a_released_member", "t-unrelease", |ctx| async move {
        // Without the mark the controller forgets the reservation it holds for the member.
        for i in 0..2 {
            create(&ctx, member(&format!("w-{i}"), "pair", "2", 1)).await.expect("member");
        }
        wait_for("the pair released", Duration::from_secs(30), || async {
            annotation(&ctx.get("w-0").await, "allot.dev/gang-released").is_some()
        })
        .await;
        let before = annotation(&ctx.get("w-0").await, "allot.dev/gang-released");
        let patch = json!({"metadata": {"annotations": {"allot.dev/gang-released": null}}});
        let message = denial(
            "remove allot.dev/gang-released",
            ctx.pods().patch("w-0", &PatchParams::default(), &Patch::Merge(&patch)).await,
        );
        assert_names("remove allot.dev/gang-released", &message, &["allot.dev/gang-released"]);
        assert_eq!(annotation(&ctx.get("w-0").await, "allot.dev/gang-released"), before);
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn ephemeral_containers_cannot_take_gpus() {
    attempt("ephemeral_containers_cannot_take_gpus", "t-ephemeral", |ctx| async move {
        // pods/ephemeralcontainers adds containers to a pod that has passed admission.
        gated_member(&ctx, "w-0", "ring").await;
        let patch = json!({"spec": {"ephemeralContainers": [{
            "name": "debug", "image": "busybox:1.36", "targetContainerName": "w",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let message = denial(
            "an ephemeral container with a GPU",
            ctx.pods()
                .patch_subresource("ephemeralcontainers", "w-0", &PatchParams::default(), &Patch::Strategic(&patch))
                .await,
        );
        assert_names("an ephemeral container with a GPU", &message, &["resources"]);
        let w = ctx.get("w-0").await;
        assert!(w.spec.as_ref().and_then(|s| s.ephemeral_containers.as_ref()).is_none_or(Vec::is_empty));
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(1)).await;
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn a_job_cannot_run_past_a_deny_quota() {
    attempt("a_job_cannot_run_past_a_deny_quota", "t-job-quota", |ctx| async move {
        // The pods come from the Job controller, not alice: still the team's, still charged.
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "wide"},
            "spec": {"parallelism": 8, "completions": 8, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        }))
        .unwrap();
        ctx.jobs().create(&PostParams::default(), &job).await.expect("the Job itself is admitted");
        wait_for("the Job's first pods", Duration::from_secs(30), || async { gpus_in_use(&ctx).await >= 1 }).await;
        let deadline = Instant::now() + Duration::from_secs(6);
        while Instant::now() < deadline {
            let used = gpus_in_use(&ctx).await;
            assert!(used <= 4, "the team holds {used} GPUs, its deny limit is 4");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(gpus_in_use(&ctx).await, 4, "the Job got the quota's 4 GPUs, no more");
        assert_webhook_answers(&ctx).await;
    });
}

#[test]
fn terminating_pods_still_hold_their_gpus_for_gang_fit() {
    attempt("terminating_pods_still_hold_their_gpus_for_gang_fit", "t-terminating-fit", |ctx| async move {
        // Fill all 4 GPUs of the two nodes, then delete the pods gracefully: with no kubelet they
        // stay terminating, holding their devices, as real pods do while their containers stop.
        for i in 0..4 {
            create(&ctx, pod(&format!("busy-{i}"), 1)).await.expect("a plain GPU pod");
        }
        wait_for("all 4 GPUs bound", Duration::from_secs(30), || async {
            let pods = ctx.admin_pods().list(&ListParams::default()).await.expect("list").items;
            pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()).count() == 4
        })
        .await;
        for i in 0..4 {
            ctx.pods().delete(&format!("busy-{i}"), &DeleteParams::default()).await.expect("delete");
        }
        // A gang of 2 that fits only if terminating pods are counted as free.
        for i in 0..2 {
            create(&ctx, member(&format!("w-{i}"), "pair", "2", 1)).await.expect("member");
        }
        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(6)).await;
        assert_still_gated(&ctx, "w-1", GANG_GATE, Duration::ZERO).await;
        assert_webhook_answers(&ctx).await;
    });
}

/// The CEL rules read fields the tenant writes, now evaluated directly over the review's JSON
/// (`expression::direct`) with the interpreter answering wherever that gives up. As alice, with
/// hostile images (non-ASCII, where direct evaluation's character indexes give up; a tag hidden
/// behind a registry port; a digest after `:latest`; 20 KB long, evaluated off the in-place
/// path), the shipped Warn rule warns exactly where it says it does, and nothing errs.
#[test]
fn tenant_strings_read_by_rules_get_the_rules_answers() {
    attempt("tenant_strings_read_by_rules_get_the_rules_answers", "t-rule-strings", |ctx| async move {
        let long = format!("registry.local/{}:latest", "a".repeat(20_000));
        let cases: [(&str, &str, bool); 7] = [
            ("unicode-latest", "régistry.local/ïmage:latest", true),
            ("unicode-pinned", "régistry.local/ïmage:v1", false),
            ("port-no-tag", "registry:5000/train", true),
            ("port-tagged", "registry:5000/train:v1", false),
            ("digest-after-latest", "busybox:latest@sha256:0123", false),
            ("latest", "busybox:latest", true),
            ("long-latest", long.as_str(), true),
        ];
        let message = "GPU containers should pin an image tag";
        for (name, image, warns) in cases {
            let mut object = pod(name, 1);
            object["metadata"]["namespace"] = json!(ctx.ns);
            object["spec"]["containers"][0]["image"] = json!(image);
            let request = axum::http::Request::post(format!("/api/v1/namespaces/{}/pods?dryRun=All", ctx.ns))
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&object).expect("json")))
                .expect("request");
            let started = Instant::now();
            let response = ctx.alice.send(request).await.expect("the API server answers");
            assert!(response.status().is_success(), "{name}: {}", response.status());
            let warnings: Vec<String> = response
                .headers()
                .get_all("warning")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(String::from)
                .collect();
            assert_eq!(warnings.iter().any(|w| w.contains(message)), warns, "{name}: {warnings:?}");
            assert!(warnings.iter().all(|w| !w.contains("could not be evaluated")), "{name}: {warnings:?}");
            assert!(started.elapsed() < Duration::from_secs(4), "{name} took {:?}", started.elapsed());
        }
        assert_webhook_answers(&ctx).await;
    });
}

/// Allot does not build a Pod's `spec.volumes` or its kubectl last-applied copy while decoding a
/// review (no shipped policy reads them). Written by the tenant to say something else, they
/// change nothing: a member is gated by its real labels though the copy claims a released,
/// gate-less pod, a disallowed priority class is denied though the copy names the allowed one,
/// and a large escaped copy with many volumes does not slow the webhook.
#[test]
fn what_allot_does_not_decode_hides_nothing() {
    attempt("what_allot_does_not_decode_hides_nothing", "t-undecoded-parts", |ctx| async move {
        let forge = |priority: &str| {
            let claim = json!({"metadata": {"labels": {}, "annotations": {"allot.dev/gang-released": "2026-01-01T00:00:00Z"}},
                "spec": {"priorityClassName": priority, "schedulingGates": []}});
            // Quotes make the copy expensive to unescape: ~120 KB of them, under the API
            // server's 256 KiB for all annotations.
            format!("{claim}{}", "\"{}\"".repeat(30_000))
        };
        let volumes: Vec<Value> =
            (0..50).map(|i| json!({"name": format!("allot-dev-gang-released-{i}"), "emptyDir": {}})).collect();

        let mut p = member("w-0", "ring", "2", 1);
        p["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json!(forge("low-priority"));
        p["spec"]["volumes"] = json!(volumes);
        let started = Instant::now();
        let created = create(&ctx, p).await.expect("admitted");
        assert!(started.elapsed() < Duration::from_secs(4), "the create took {:?}", started.elapsed());
        assert!(gates(&created).contains(&GANG_GATE.to_string()), "not gated: {:?}", gates(&created));
        assert_eq!(annotation(&created, "allot.dev/gang-released"), None);

        let mut p = member("w-1", "ring", "2", 1);
        p["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json!(forge("low-priority"));
        p["spec"]["priorityClassName"] = json!("high-priority");
        p["spec"]["volumes"] = json!(volumes);
        let message = denial("high-priority behind a forged copy", create(&ctx, p).await);
        assert_names("high-priority", &message, &["high-priority"]);

        assert_still_gated(&ctx, "w-0", GANG_GATE, Duration::from_secs(2)).await;
        assert_webhook_answers(&ctx).await;
    });
}

/// Under `onStartTimeout: Warn` (5 s in this namespace) a gang whose members wait for a claim
/// is told it did not start (`GangReady=False StartTimeout`) and nothing is deleted; once the
/// claim exists and the scheduler binds the members, their condition says the gang started
/// after all (`True StartedLate`) instead of keeping the Warning on running pods.
#[test]
fn under_warn_a_gang_that_binds_after_its_start_timeout_is_told_it_started() {
    attempt(
        "under_warn_a_gang_that_binds_after_its_start_timeout_is_told_it_started",
        "t-start-late",
        |ctx| async move {
            let states = || gang_states(&ctx, &["late-0", "late-1"]);
            for i in 0..2 {
                let p = mounting(member(&format!("late-{i}"), "late", "2", 1), "late-data");
                create(&ctx, p).await.expect("a member mounting a claim that does not exist yet");
            }
            let told = (false, "False StartTimeout".to_string());
            wait_for("both members told their gang did not start", Duration::from_secs(40), || async {
                states().await == [told.clone(), told.clone()]
            })
            .await;
            // The claim appears, pre-bound to a volume: the scheduler binds both members.
            bound_claim(&ctx, "late-data").await;
            let started = (true, "True StartedLate".to_string());
            wait_for("both members bound and told their gang started late", Duration::from_secs(90), || async {
                states().await == [started.clone(), started.clone()]
            })
            .await;
            for name in ["late-0", "late-1"] {
                delete_now(&ctx, name).await;
            }
            delete_claim(&ctx, "late-data").await;
        },
    );
}

/// The same, with a member alice deletes: `late-0` binds after the start timeout while `late-1`
/// waits for a claim that never comes; she deletes `late-1`. The gang now has one member of
/// the two it declares, so `late-0` keeps `StartTimeout` (it was told `StartedLate` as soon as
/// its unbound peer was gone); once she makes `late-1` again, mounting the claim that exists,
/// the gang is released whole, binds, and `late-0` is told it started late.
#[test]
fn under_warn_a_gang_missing_a_deleted_member_is_not_told_it_started() {
    attempt(
        "under_warn_a_gang_missing_a_deleted_member_is_not_told_it_started",
        "t-start-late-leaving",
        |ctx| async move {
            create(&ctx, mounting(member("late-0", "leave", "2", 1), "data-0")).await.expect("late-0");
            create(&ctx, mounting(member("late-1", "leave", "2", 1), "never-made")).await.expect("late-1");
            let told = (false, "False StartTimeout".to_string());
            wait_for("both members told their gang did not start", Duration::from_secs(40), || async {
                gang_states(&ctx, &["late-0", "late-1"]).await == [told.clone(), told.clone()]
            })
            .await;
            bound_claim(&ctx, "data-0").await;
            let bound_told = (true, "False StartTimeout".to_string());
            wait_for("late-0 bound, still told StartTimeout", Duration::from_secs(60), || async {
                gang_states(&ctx, &["late-0"]).await == [bound_told.clone()]
            })
            .await;
            delete_now(&ctx, "late-1").await;
            // Passes run on the deletion's watch events (a told member is bound): none may say
            // the gang started while it is missing a member.
            let until = Instant::now() + Duration::from_secs(6);
            while Instant::now() < until {
                assert_eq!(
                    gang_states(&ctx, &["late-0"]).await,
                    std::slice::from_ref(&bound_told),
                    "a gang of one of two"
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            create(&ctx, mounting(member("late-1", "leave", "2", 1), "data-0")).await.expect("late-1 again");
            wait_for("the gang whole and bound: late-0 told it started late", Duration::from_secs(90), || async {
                let states = gang_states(&ctx, &["late-0", "late-1"]).await;
                states[0] == (true, "True StartedLate".to_string()) && states[1].0
            })
            .await;
            for name in ["late-0", "late-1"] {
                delete_now(&ctx, name).await;
            }
            delete_claim(&ctx, "data-0").await;
        },
    );
}

/// A gang alice gets released whose members never bind (they mount a PersistentVolumeClaim she
/// has not created) keeps the GPUs it was released onto: her second gang, needing the same GPUs,
/// stays gated while any member of the first exists. At the start timeout (`8s` in this
/// namespace's GangPolicy, `onStartTimeout` left at its default, `Fail`) every member of the
/// first gang is deleted with a Warning Event saying bare pods are not recreated, and only then
/// does the second gang go.
#[test]
fn a_released_gang_that_never_binds_is_deleted_at_its_start_timeout_before_another_takes_its_gpus() {
    attempt(
        "a_released_gang_that_never_binds_is_deleted_at_its_start_timeout_before_another_takes_its_gpus",
        "t-start-timeout",
        |ctx| async move {
            use k8s_openapi::api::events::v1::Event;
            let gated = |p: &Pod| gates(p).contains(&GANG_GATE.to_string());
            let list = |gang: &'static str| {
                let pods = ctx.admin_pods();
                async move {
                    let selector = format!("allot.dev/gang-name={gang}");
                    let all = pods.list(&ListParams::default().labels(&selector)).await.expect("list").items;
                    all.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect::<Vec<Pod>>()
                }
            };
            // Two members of 2 GPUs each fill both shared nodes (2 GPUs each).
            for i in 0..2 {
                let p = mounting(member(&format!("stuck-{i}"), "stuck", "2", 2), "not-created-yet");
                create(&ctx, p).await.expect("a member mounting a claim that does not exist");
            }
            wait_for("the stuck gang released", Duration::from_secs(30), || async {
                let stuck = list("stuck").await;
                stuck.len() == 2 && stuck.iter().all(|p| !gated(p))
            })
            .await;
            let released = Instant::now();
            for i in 0..2 {
                create(&ctx, member(&format!("next-{i}"), "next", "2", 2)).await.expect("the second gang");
            }
            // While any member of the stuck gang is there, the second gang stays gated.
            let gone = loop {
                let stuck = list("stuck").await;
                let next = list("next").await;
                assert!(stuck.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()), "bound?");
                if stuck.is_empty() {
                    break released.elapsed();
                }
                assert!(
                    next.iter().all(gated),
                    "the second gang was released onto the stuck gang's GPUs after {:?}",
                    released.elapsed()
                );
                assert!(released.elapsed() < Duration::from_secs(60), "the stuck gang was never deleted");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            // Not before its start timeout (8 s after the release second; a second of slack for
            // the annotation's resolution and the poll).
            assert!(gone >= Duration::from_secs(6), "deleted after {gone:?}, before its start timeout");
            let events: Api<Event> = Api::namespaced(ctx.admin.clone(), &ctx.ns);
            wait_for("the StartTimeout Warning on each member", Duration::from_secs(10), || async {
                let all = events.list(&ListParams::default()).await.expect("events").items;
                ["stuck-0", "stuck-1"].iter().all(|name| {
                    all.iter().any(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(*name)
                            && e.reason.as_deref() == Some("StartTimeout")
                            && e.type_.as_deref() == Some("Warning")
                            && e.note.as_deref().is_some_and(|n| n.contains("bare pods are not recreated"))
                    })
                })
            })
            .await;
            // Then the second gang goes, whole.
            wait_for("the second gang released", Duration::from_secs(30), || async {
                let next = list("next").await;
                next.len() == 2 && next.iter().all(|p| !gated(p))
            })
            .await;
        },
    );
}
