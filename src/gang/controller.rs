//! The gang controller inside `allot serve`: watches Pods and Nodes into a [`ClusterState`],
//! and — on the replica holding the `allot-gang-controller` Lease — runs the pure decision and
//! carries out its actions: lift gates, explain on every member, enforce assembly timeouts.
//!
//! Restart-safe: all state comes from the API (gates, gang metadata, the
//! `allot.dev/gang-released` annotation), so a new leader rebuilds it from a list and releases
//! nothing twice; a periodic resync covers missed events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::decision::GangKey;
use super::membership::{GATE, InferredKind, QUOTA_GATE, RELEASED_ANNOTATION};
use super::metrics::ControllerMetrics;
use super::plan::{Plan, plan};
use super::snapshot::GangSnapshot;
use crate::cluster::{CONDITION, ClusterState, ControllerAction, PodRecord, QUOTA_CONDITION, node_info};
use crate::namespaces::NamespaceLabels;
use crate::patch::escape;
use crate::policy::PolicySet;
use crate::quota::QuotaQueue;

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub lease_namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// Full re-evaluation even without events.
    pub resync: Duration,
}

/// Called once the Pod watch's first list is in `state` (quota answers wait for it).
pub type OnSynced = Box<dyn Fn() + Send + Sync>;

/// Starts the watches and the control loop; returns at once.
pub fn spawn(
    client: kube::Client,
    state: Arc<ClusterState>,
    policies: Arc<ArcSwap<PolicySet>>,
    namespaces: Arc<dyn NamespaceLabels>,
    config: ControllerConfig,
    metrics: ControllerMetrics,
    pods_synced: OnSynced,
) -> ControllerHandle {
    tokio::spawn(watch_pods(client.clone(), state.clone(), policies.clone(), namespaces.clone(), pods_synced));
    tokio::spawn(watch_nodes(client.clone(), state.clone()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let context = Context { client, state, policies, namespaces, config, metrics };
    let done = tokio::spawn(control_loop(context, stopped));
    ControllerHandle { stop, done }
}

/// What the control loop works with.
struct Context {
    client: kube::Client,
    state: Arc<ClusterState>,
    policies: Arc<ArcSwap<PolicySet>>,
    namespaces: Arc<dyn NamespaceLabels>,
    config: ControllerConfig,
    metrics: ControllerMetrics,
}

/// Stops the control loop on shutdown.
pub struct ControllerHandle {
    stop: tokio::sync::watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
}

impl ControllerHandle {
    /// Ends the control loop and gives up the Lease, so another replica leads at once rather
    /// than after the Lease expires (a rolling update would otherwise leave gangs waiting
    /// ~15 s with no leader). Bounded by `within`.
    pub async fn shutdown(self, within: Duration) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(within, self.done).await.is_err() {
            tracing::warn!("the gang controller did not stop in time; its Lease expires by itself");
        }
    }
}

async fn watch_pods(
    client: kube::Client,
    state: Arc<ClusterState>,
    policies: Arc<ArcSwap<PolicySet>>,
    namespaces: Arc<dyn NamespaceLabels>,
    synced: OnSynced,
) {
    let api: Api<Pod> = Api::all(client);
    // Lists come in pages (one page of whole Pods in memory at a time) and each pod goes
    // straight into the store as its compact record: a (re)list never holds a second copy of
    // the cluster (issue 18).
    let config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        let p = policies.load();
        match event {
            Ok(watcher::Event::Init) => state.begin_relist(),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(r) = PodRecord::from_pod(&pod, &p, namespaces.as_ref()) {
                    state.upsert_pod(r);
                }
            }
            Ok(watcher::Event::InitDone) => {
                state.finish_relist();
                synced();
            }
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(r) = PodRecord::from_pod(&pod, &p, namespaces.as_ref()) {
                    state.upsert_pod(r);
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) {
                    state.remove_pod(ns, name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch error; retrying"),
        }
    }
}

/// Pods per page of a (re)list: the whole objects of one page are in memory at once.
const LIST_PAGE_SIZE: u32 = 500;

async fn watch_nodes(client: kube::Client, state: Arc<ClusterState>) {
    let api: Api<Node> = Api::all(client);
    let mut buffer = Vec::new();
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => buffer.clear(),
            Ok(watcher::Event::InitApply(node)) => buffer.extend(node_info(&node)),
            Ok(watcher::Event::InitDone) => state.replace_nodes(std::mem::take(&mut buffer)),
            Ok(watcher::Event::Apply(node)) => {
                if let Some(n) = node_info(&node) {
                    state.upsert_node(n);
                }
            }
            Ok(watcher::Event::Delete(node)) => {
                if let Some(name) = node.metadata.name.as_deref() {
                    state.remove_node(name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "node watch error; retrying"),
        }
    }
}

/// First retry of a failed leader-election setup; doubled up to [`ELECTION_RETRY_MAX`].
pub const ELECTION_RETRY_MIN: Duration = Duration::from_millis(500);
pub const ELECTION_RETRY_MAX: Duration = Duration::from_secs(30);

/// Sets up leader election, retrying with backoff until it works or the controller is stopped
/// (`None`). Setting up creates the Lease; that fails while, say, the Lease namespace does not
/// exist yet or RBAC is still being applied, and giving up would leave this replica without a
/// gang controller for its whole life. Once set up, the lease task retries errors by itself.
async fn join_election(
    client: &kube::Client,
    config: &ControllerConfig,
    stopped: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<(
    tokio::sync::watch::Receiver<bool>,
    tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
)> {
    let mut delay = ELECTION_RETRY_MIN;
    loop {
        match kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
            .with_namespace(&config.lease_namespace)
            .with_identity(&config.identity)
            .with_duration(15)
            .with_grace(5)
            .build()
            .await
        {
            // The lease task runs while the channel lives; dropping the channel releases the Lease.
            Ok(manager) => return Some(manager.watch().await),
            Err(e) => {
                tracing::warn!(error = %e, lease = %config.lease_name, namespace = %config.lease_namespace, retry_in = ?delay, "cannot set up leader election yet; retrying");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            Ok(()) = stopped.changed() => return None,
        }
        delay = (delay * 2).min(ELECTION_RETRY_MAX);
    }
}

async fn control_loop(context: Context, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let Context { client, state, policies, namespaces, config, metrics } = context;
    let Some((leader, lease_task)) = join_election(&client, &config, &mut stopped).await else {
        return;
    };
    let recorder =
        Recorder::new(client.clone(), Reporter { controller: "allot".into(), instance: Some(config.identity.clone()) });
    let mut explained: HashMap<GangKey, String> = HashMap::new();
    let mut queued: HashMap<(String, String), String> = HashMap::new();
    let mut seen_generation = u64::MAX;
    let mut last_full = tokio::time::Instant::now();
    let mut was_leader = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            // Err (the handle was dropped, not used to stop) disables this branch: keep running.
            Ok(()) = stopped.changed() => break,
        }
        let is_leader = *leader.borrow();
        if is_leader != was_leader {
            tracing::info!(leader = is_leader, identity = %config.identity, "gang controller leadership changed");
            was_leader = is_leader;
            explained.clear();
            queued.clear();
            seen_generation = u64::MAX;
            metrics.leader.set(i64::from(is_leader));
            metrics.gangs_waiting.clear();
        }
        if !is_leader {
            continue;
        }
        let generation = state.generation();
        let resync = last_full.elapsed() >= config.resync;
        if generation == seen_generation && !resync {
            continue;
        }
        if resync {
            last_full = tokio::time::Instant::now();
            explained.clear();
            // Queue explanations are not rewritten on resync: a team's queue can hold hundreds
            // of pods, and their conditions persist on the pods.
        }
        // Both passes walk every pod; with nothing behind a gate they have nothing to do, and at
        // 100,000 pods a walk every 250 ms is CPU the webhooks lack (issue 18).
        let (gang_gated, quota_gated) = state.gated();
        if gang_gated > 0 {
            resolve_owner_sizes(&client, &state).await;
        }
        seen_generation = state.generation();
        let now = unix_now();
        // The pure work of a pass (quota queue, snapshot, decision) runs on a blocking thread:
        // however large the cluster view, it never occupies the async workers that answer
        // /mutate, /validate and /readyz.
        let (quota_actions, back) = if quota_gated == 0 {
            (Vec::new(), std::mem::take(&mut queued))
        } else {
            let (state, p, namespaces) = (state.clone(), policies.load_full(), namespaces.clone());
            match tokio::task::spawn_blocking(move || {
                let actions = state.quota_plan(&p, namespaces.as_ref(), &mut queued);
                (actions, queued)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    tracing::error!(error = %e, "the quota pass failed; retrying on the next change");
                    (Vec::new(), HashMap::new())
                }
            }
        };
        queued = back;
        // Quota first: a gang member is released by the gang controller only once its quota
        // gate is gone.
        execute(&client, &recorder, &state, &metrics, quota_actions).await;
        let (pass, back) = if gang_gated == 0 && state.gated().0 == 0 {
            (Plan::default(), std::mem::take(&mut explained))
        } else {
            let (state, p, namespaces) = (state.clone(), policies.load_full(), namespaces.clone());
            match tokio::task::spawn_blocking(move || {
                let (snapshot, facts) = state.snapshot(&p, namespaces.as_ref(), now);
                (plan(&snapshot, &facts, &mut explained), explained)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    tracing::error!(error = %e, "the gang pass failed; retrying on the next change");
                    (Plan::default(), HashMap::new())
                }
            }
        };
        explained = back;
        metrics.set_waiting(&pass.waiting);
        for gang in &pass.released {
            metrics.gang_releases.inc();
            metrics.gang_wait_seconds.observe(gang.waited_secs as f64);
            tracing::info!(
                namespace = %gang.gang.namespace,
                gang = %gang.gang.name,
                members = gang.members,
                waited_secs = gang.waited_secs,
                decision = %gang.message,
                "releasing gang"
            );
        }
        execute(&client, &recorder, &state, &metrics, pass.actions).await;
    }
    drop(leader);
    metrics.leader.set(0);
    match lease_task.await {
        Ok(Ok(_)) => tracing::info!(identity = %config.identity, "gang controller stopped; Lease released"),
        Ok(Err(e)) => tracing::warn!(error = %e, "gang controller stopped; the Lease could not be released"),
        Err(e) => tracing::warn!(error = %e, "gang controller stopped; the lease task failed"),
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Where the owners of one kind of inferred gang live: the API group and version the controller
/// reads them from, and the Kubernetes kinds it accepts as owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerApi {
    pub kind: InferredKind,
    pub group: &'static str,
    pub version: &'static str,
    pub kinds: &'static [&'static str],
}

impl OwnerApi {
    /// The resource name of an owner kind (`PyTorchJob` → `pytorchjobs`).
    pub fn plural(&self, api_kind: &str) -> String {
        format!("{}s", api_kind.to_lowercase())
    }
}

/// The owners the controller GETs to size inferred gangs: the one table behind
/// [`resolve_owner_sizes`] and the `get` rules of the RBAC in `deploy/` (`tests/deploy.rs`
/// checks that each entry is granted and that nothing else is).
pub const OWNER_APIS: &[OwnerApi] = &[
    OwnerApi { kind: InferredKind::Job, group: "batch", version: "v1", kinds: &["Job"] },
    OwnerApi { kind: InferredKind::JobSet, group: "jobset.x-k8s.io", version: "v1alpha2", kinds: &["JobSet"] },
    OwnerApi { kind: InferredKind::MPIJob, group: "kubeflow.org", version: "v2beta1", kinds: &["MPIJob"] },
    OwnerApi {
        kind: InferredKind::KubeflowJob,
        group: "kubeflow.org",
        version: "v1",
        kinds: &["PyTorchJob", "TFJob", "XGBoostJob", "JAXJob", "PaddleJob"],
    },
    OwnerApi {
        kind: InferredKind::LeaderWorkerSet,
        group: "leaderworkerset.x-k8s.io",
        version: "v1",
        kinds: &["LeaderWorkerSet"],
    },
];

/// The table entry for an inferred gang's owner, if its kind is one the controller reads.
pub fn owner_api(kind: InferredKind, api_kind: &str) -> Option<&'static OwnerApi> {
    OWNER_APIS.iter().find(|a| a.kind == kind && a.kinds.contains(&api_kind))
}

/// Reads the size of inferred gangs from their owners (elastic owners are re-read on every
/// pass, so a changed `parallelism` is followed, never a stale size).
async fn resolve_owner_sizes(client: &kube::Client, state: &ClusterState) {
    for (namespace, gang, owner) in state.owners_to_resolve() {
        let Some(api) = owner_api(owner.kind, &owner.api_kind) else {
            // Only the kinds of the table are read (and granted by deploy/'s RBAC).
            tracing::warn!(%namespace, %gang, owner = %owner.name, kind = %owner.api_kind, "not a known owner kind for inferred gangs");
            continue;
        };
        let gvk = GroupVersionKind::gvk(api.group, api.version, &owner.api_kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &api.plural(&owner.api_kind));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
        match api.get_opt(&owner.name).await {
            Ok(Some(obj)) => match super::membership::owner_gang(owner.kind, &obj.data) {
                Some(info) => state.set_owner_gang(&namespace, &gang, info),
                None => tracing::warn!(%namespace, %gang, owner = %owner.name, "owner declares no usable size"),
            },
            Ok(None) => tracing::debug!(%namespace, %gang, owner = %owner.name, "owner not found (yet)"),
            Err(e) => tracing::warn!(%namespace, %gang, owner = %owner.name, error = %e, "cannot read gang owner"),
        }
    }
}

fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Test-and-remove of one gate: `test` guards the index, so a concurrent change of the gate
/// list makes the patch fail instead of removing another gate.
pub fn lift_gate_ops(gate: &str, gate_index: usize) -> Vec<Value> {
    vec![
        json!({"op": "test", "path": format!("/spec/schedulingGates/{gate_index}/name"), "value": gate}),
        json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate_index}")}),
    ]
}

/// The JSON Patch that lifts Allot's gang gate and only it, and marks the member released.
pub fn release_patch(gate_index: usize, has_annotations: bool, released_at: &str) -> Value {
    let mut ops = lift_gate_ops(GATE, gate_index);
    ops.push(if has_annotations {
        json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(RELEASED_ANNOTATION)), "value": released_at})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {RELEASED_ANNOTATION: released_at}})
    });
    Value::Array(ops)
}

async fn execute(
    client: &kube::Client,
    recorder: &Recorder,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    actions: Vec<ControllerAction>,
) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    for action in actions {
        match action {
            ControllerAction::Release { namespace, pod, gate_index, has_annotations, node } => {
                match patch_pod(client, &namespace, &pod, release_patch(gate_index, has_annotations, &now)).await {
                    Ok(_) => {
                        state.mark_released(&namespace, std::slice::from_ref(&pod), unix_now());
                        tracing::info!(%namespace, %pod, simulated_node = %node, "released gang member");
                    }
                    Err(e) if is_status(&e, &[404]) => tracing::debug!(%namespace, %pod, "member gone before release"),
                    Err(e) if is_status(&e, &[409, 422]) => {
                        tracing::info!(%namespace, %pod, error = %e, "gate list changed; retrying on the next pass")
                    }
                    Err(e) => tracing::warn!(%namespace, %pod, error = %e, "release failed; retrying on the next pass"),
                }
            }
            ControllerAction::Explain { namespace, pod, ready, reason, message, warning } => {
                set_condition(client, &namespace, &pod, CONDITION, ready, reason, &message, &now).await;
                publish(recorder, &namespace, &pod, EventAction::GangScheduling, warning, reason, &message).await;
            }
            ControllerAction::Queued { namespace, pod, message } => {
                set_condition(client, &namespace, &pod, QUOTA_CONDITION, false, "QuotaQueued", &message, &now).await;
                publish(recorder, &namespace, &pod, EventAction::QuotaQueueing, false, "QuotaQueued", &message).await;
            }
            ControllerAction::ReleaseQuota { namespace, pod, gate_index } => {
                match patch_pod(client, &namespace, &pod, Value::Array(lift_gate_ops(QUOTA_GATE, gate_index))).await {
                    Ok(_) => {
                        state.mark_quota_released(&namespace, &pod);
                        metrics.quota_releases.inc();
                        tracing::info!(%namespace, %pod, "released from the quota queue");
                        let message = "the team's quota has room; released from the queue";
                        set_condition(client, &namespace, &pod, QUOTA_CONDITION, true, "QuotaAdmitted", message, &now)
                            .await;
                        publish(
                            recorder,
                            &namespace,
                            &pod,
                            EventAction::QuotaQueueing,
                            false,
                            "QuotaAdmitted",
                            message,
                        )
                        .await;
                    }
                    Err(e) if is_status(&e, &[404, 409, 422]) => {
                        tracing::debug!(%namespace, %pod, error = %e, "quota release skipped; retrying on the next pass")
                    }
                    Err(e) => {
                        tracing::warn!(%namespace, %pod, error = %e, "quota release failed; retrying on the next pass")
                    }
                }
            }
            ControllerAction::Delete { namespace, pod, reason } => {
                publish(recorder, &namespace, &pod, EventAction::GangScheduling, true, "AssemblyTimeout", &reason)
                    .await;
                let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                match api.delete(&pod, &DeleteParams::default()).await {
                    Ok(_) => tracing::warn!(%namespace, %pod, %reason, "deleted gang member after assembly timeout"),
                    Err(e) if is_status(&e, &[404]) => {}
                    Err(e) => tracing::warn!(%namespace, %pod, error = %e, "cannot delete gang member"),
                }
            }
        }
    }
}

/// Sends one of this module's JSON Patches (gate removals) to a Pod.
async fn patch_pod(client: &kube::Client, namespace: &str, pod: &str, ops: Value) -> Result<(), kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.patch(pod, &PatchParams::default(), &Patch::Json::<()>(patch)).await.map(|_| ())
}

/// Sets one of Allot's pod conditions (strategic merge on `type`, so other conditions stay).
#[allow(clippy::too_many_arguments)]
async fn set_condition(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    condition: &str,
    ready: bool,
    reason: &str,
    message: &str,
    now: &str,
) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"status": {"conditions": [{
        "type": condition,
        "status": if ready { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }]}});
    if let Err(e) = api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(patch)).await
        && !is_status(&e, &[404])
    {
        tracing::warn!(%namespace, %pod, %condition, error = %e, "cannot set the pod condition");
    }
}

/// An Event's `action`: which of the controller's two jobs the Event is about.
#[derive(Debug, Clone, Copy)]
enum EventAction {
    /// Releasing, explaining or timing out a gang.
    GangScheduling,
    /// Holding or releasing a pod in its team's quota queue.
    QuotaQueueing,
}

impl EventAction {
    fn as_str(self) -> &'static str {
        match self {
            EventAction::GangScheduling => "GangScheduling",
            EventAction::QuotaQueueing => "QuotaQueueing",
        }
    }
}

async fn publish(
    recorder: &Recorder,
    namespace: &str,
    pod: &str,
    action: EventAction,
    warning: bool,
    reason: &str,
    message: &str,
) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    };
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.as_str().into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::debug!(%namespace, %pod, error = %e, "cannot publish event");
    }
}
