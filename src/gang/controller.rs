//! The gang controller inside `allot serve`: watches Pods and Nodes into a [`ClusterState`],
//! and — on the replica holding the `allot-gang-controller` Lease — runs the pure decision and
//! carries out its actions: lift gates, explain on every member, enforce assembly timeouts.
//!
//! Event-driven: every change to the cluster view wakes the loop (coalesced over [`DEBOUNCE`]);
//! it also wakes at the next assembly timeout, after a backoff when a write failed ([`Retry`]),
//! and, as a safety net, every resync period. The gate lifts of a pass go out together, before
//! its explanations.
//!
//! Restart-safe: all state comes from the API (gates, gang metadata, the
//! `allot.dev/gang-released` and `allot.dev/arrival` annotations, the conditions already
//! written), so a new leader rebuilds it from a list, releases nothing twice and rewrites no
//! explanation a pod already carries. Leadership: [`super::lease`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::decision::GangKey;
use super::events::{EventAction, publish};
use super::lease::{self, LeaseConfig, LeaseTiming};
use super::membership::{ARRIVAL_ANNOTATION, GATE, QUOTA_GATE, QUOTA_RELEASED_ANNOTATION, RELEASED_ANNOTATION};
use super::metrics::ControllerMetrics;
use super::owners::resolve_owner_sizes;
pub use super::owners::{OWNER_APIS, OwnerApi};
use super::plan::{Plan, plan};
use super::refusal::{RefusedLifts, admission_refusal};
use super::snapshot::GangSnapshot;
use crate::cluster::records::{condition_fingerprint, format_nanos};
use crate::cluster::{CONDITION, ClusterState, ControllerAction, PodRecord, QUOTA_CONDITION, WatchedPod, node_info};
use crate::namespaces::NamespaceLabels;
use crate::patch::escape;
use crate::policy::PolicySet;
use crate::quota::QuotaQueue;
use crate::quota::queue::QUEUED_REASON;

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub lease_namespace: String,
    pub lease_name: String,
    pub identity: String,
    /// Full re-evaluation even without events.
    pub resync: Duration,
    /// How the Pod watch gets its first (and every re-)list.
    pub initial_list: InitialList,
}

/// How the Pod watch fills the cache at start and after a watch is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum InitialList {
    /// A watch that starts with every existing Pod (`sendInitialEvents`, Kubernetes' streaming
    /// list, on by default since 1.32): served from the API server's watch cache one object at
    /// a time, no etcd range reads, no page of whole Pods held at once.
    #[default]
    Streaming,
    /// A paged LIST (500 Pods per page), then a watch: for API servers where streaming lists
    /// are off (the `WatchList` feature gate).
    Paged,
}

/// Called once the Pod watch's first list is in `state` (quota answers wait for it).
pub type OnSynced = Box<dyn Fn() + Send + Sync>;

/// The API clients of the controller.
#[derive(Clone)]
pub struct Clients {
    /// Watches and writes (retrying what the API server throttles).
    pub api: kube::Client,
    /// Evictions, which a PodDisruptionBudget refuses with 429: a client that does not retry
    /// them, so a refusal is an answer, not minutes of backoff.
    pub evictions: kube::Client,
}

impl From<kube::Client> for Clients {
    /// One client for both (its 429s retried: only where nothing evicts, as in tests).
    fn from(api: kube::Client) -> Clients {
        Clients { evictions: api.clone(), api }
    }
}

/// Starts the watches and the control loop; returns at once.
pub fn spawn(
    clients: impl Into<Clients>,
    state: Arc<ClusterState>,
    policies: Arc<ArcSwap<PolicySet>>,
    namespaces: Arc<dyn NamespaceLabels>,
    config: ControllerConfig,
    metrics: ControllerMetrics,
    pods_synced: OnSynced,
) -> ControllerHandle {
    let Clients { api: client, evictions } = clients.into();
    tokio::spawn(watch_pods(
        client.clone(),
        state.clone(),
        policies.clone(),
        namespaces.clone(),
        pods_synced,
        config.initial_list,
    ));
    tokio::spawn(watch_nodes(client.clone(), state.clone()));
    tokio::spawn(super::devices::watch(client.clone(), state.clone(), policies.clone()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let context = Context { client, evictions, state, policies, namespaces, config, metrics };
    let done = tokio::spawn(control_loop(context, stopped));
    ControllerHandle { stop, done }
}

/// What the control loop works with.
struct Context {
    client: kube::Client,
    evictions: kube::Client,
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

/// How long the Pod watch waits for the claim watches' first lists before it starts anyway.
const CLAIMS_SYNC_WAIT: Duration = Duration::from_secs(30);

/// With DeviceClasses mapped, the Pod watch starts once the claim caches are filled: a pod
/// recorded before its claims are known would count no claim devices (its team's usage too
/// low until the pod changes). Bounded: a cluster that does not serve `resource.k8s.io/v1`
/// never fills them, and then pods are recorded without their claim devices, said in the log.
async fn wait_for_claims(state: &ClusterState, policies: &PolicySet, within: Duration) {
    if policies.device_classes.is_empty() {
        return;
    }
    let started = tokio::time::Instant::now();
    while !state.claims().synced() {
        if started.elapsed() >= within {
            tracing::warn!(
                waited = ?within,
                "the ResourceClaim/ResourceClaimTemplate watches have not listed yet; recording pods without their claim devices until they do"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where the server reads the cluster's DeviceClasses, the Pod watch starts once the policy set
/// is compiled with them (bounded: the DeviceClass watch gives up after its own wait), so that
/// its first list records claims as they count; otherwise the set's change would list every
/// pod a second time.
async fn wait_for_device_classes(state: &ClusterState, within: Duration) {
    let started = tokio::time::Instant::now();
    while state.device_classes_pending() && started.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn watch_pods(
    client: kube::Client,
    state: Arc<ClusterState>,
    policies: Arc<ArcSwap<PolicySet>>,
    namespaces: Arc<dyn NamespaceLabels>,
    synced: OnSynced,
    initial_list: InitialList,
) {
    wait_for_device_classes(&state, CLAIMS_SYNC_WAIT * 2).await;
    wait_for_claims(&state, &policies.load(), CLAIMS_SYNC_WAIT).await;
    // A relist asked before the first list is answered by that list.
    let _ = futures::FutureExt::now_or_never(state.relist_requested());
    // Decoded slim: only the fields a record reads (managedFields, env, statuses skipped).
    let api: Api<WatchedPod> = Api::all(client);
    let mut strategy = initial_list;
    loop {
        // Each pod of a (re)list goes straight into the store as its compact record, one at a
        // time (streaming) or one page of whole Pods at a time (paged): a (re)list never holds
        // a second copy of the cluster (issue 18).
        let config = match strategy {
            InitialList::Streaming => watcher::Config::default().streaming_lists(),
            InitialList::Paged => watcher::Config::default().page_size(LIST_PAGE_SIZE),
        };
        let mut stream = watcher(api.clone(), config).default_backoff().boxed();
        let mut unsupported = false;
        let mut relist = false;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = state.relist_requested() => {
                    relist = true;
                    break;
                }
            };
            let Some(event) = event else { break };
            let p = policies.load();
            match event {
                Ok(watcher::Event::Init) => state.begin_relist(),
                Ok(watcher::Event::InitApply(WatchedPod(pod)) | watcher::Event::Apply(WatchedPod(pod))) => {
                    if let Some(r) = PodRecord::from_pod_with_claims(&pod, &p, namespaces.as_ref(), state.claims()) {
                        state.upsert_pod(r);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    state.finish_relist();
                    synced();
                }
                Ok(watcher::Event::Delete(WatchedPod(pod))) => {
                    if let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) {
                        state.remove_pod(ns, name);
                    }
                }
                Err(e) if strategy == InitialList::Streaming && streaming_refused(&e) => {
                    tracing::warn!(error = %e, "the API server refuses streaming lists (WatchList off); listing Pods in pages instead");
                    unsupported = true;
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "pod watch error; retrying"),
            }
        }
        if relist {
            continue;
        }
        if !unsupported {
            return;
        }
        strategy = InitialList::Paged;
    }
}

/// The API server's answer to a streaming list it cannot serve: the request is invalid (422;
/// 400 on older versions) where its WatchList feature is off (1.27–1.31, 1.33), and an
/// InternalError naming `RequestWatchProgress` where etcd is too old to report watch progress
/// (etcd 3.4: the test control plane in ../shared/k8s). Paged lists work on every version.
pub(crate) fn streaming_refused(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.as_ref(),
        watcher::Error::WatchError(status) => status.as_ref(),
        _ => return false,
    };
    matches!(status.code, 400 | 422) || status.message.contains("RequestWatchProgress")
}

/// Pods per page of a (re)list: one page's objects (slim, see [`WatchedPod`]) and its
/// response body are in memory at once.
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

/// How long the loop waits after a change before it looks: a burst of watch events (a gang's
/// members created together, the echoes of its own patches) becomes one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(5);

/// After a change, the loop waits at least this many times as long as the last pass's planning
/// took (and at most [`MOST_SETTLE`]): a pass walks every pod while anything is gated, so with a
/// large cluster changing fast, passes back to back would take a core; this way they take at
/// most about a fifth of one (the planning's walks; passes a timer wakes do not wait), and a
/// small cluster keeps the [`DEBOUNCE`].
const SETTLE_PER_PLANNING: u32 = 4;

/// The longest wait after a change, however long the last pass took.
const MOST_SETTLE: Duration = Duration::from_secs(1);

/// How long the loop waits after a change before its pass.
fn settle_time(last_planning: Duration) -> Duration {
    (last_planning * SETTLE_PER_PLANNING).clamp(DEBOUNCE, MOST_SETTLE)
}

/// How many API calls of one kind (gate lifts; explanations and stamps) run at once.
const CONCURRENT_WRITES: usize = 16;

/// The first wait before a write the API server refused is tried again; it doubles while the
/// writes keep failing, up to the resync period.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// When the loop tries again after a write that failed for another reason than a conflict or a
/// missing pod (which a watch event follows): a 5xx, a timeout, a 429, a refusal. Such a failure
/// leaves no event behind, so without this a gang half released by a refused gate patch, or a
/// condition never written, waited for the next unrelated change or the resync period (30 s by
/// default).
#[derive(Debug)]
struct Retry {
    /// The pass that tries again; `None` when none is due (nothing failed since the last pass,
    /// or this replica does not lead).
    at: Option<tokio::time::Instant>,
    backoff: Duration,
    most: Duration,
    /// The pass under way is a retry: a failure now doubles the backoff.
    retrying: bool,
}

impl Retry {
    fn new(most: Duration) -> Retry {
        Retry { at: None, backoff: RETRY_FIRST, most: most.max(RETRY_FIRST), retrying: false }
    }

    /// A pass begins at `now`: whether it is the retry, which it then takes over.
    fn begin_pass(&mut self, now: tokio::time::Instant) {
        self.retrying = self.due(now);
        self.at = None;
    }

    /// A write failed at `now`: a pass is due after the backoff (unless one is already set).
    /// A failure after a retry pass doubles the backoff (up to the resync period), however long
    /// the failing writes took (a timeout); any other starts again from [`RETRY_FIRST`].
    fn failed(&mut self, now: tokio::time::Instant) {
        if self.at.is_some() {
            return;
        }
        self.backoff = if self.retrying { (self.backoff * 2).min(self.most) } else { RETRY_FIRST };
        self.at = Some(now + self.backoff);
    }

    fn due(&self, now: tokio::time::Instant) -> bool {
        self.at.is_some_and(|at| now >= at)
    }
}

/// What the loop does at its next wake-up.
fn next_wake(resync_at: tokio::time::Instant, deadline: Option<i64>, retry: &Retry) -> tokio::time::Instant {
    let resync_at = retry.at.map_or(resync_at, |at| at.min(resync_at));
    let Some(deadline) = deadline else { return resync_at };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    // Just past the second the deadline falls in (the plan compares whole seconds).
    let wait =
        Duration::from_secs(u64::try_from(deadline).unwrap_or(0)).saturating_sub(now) + Duration::from_millis(20);
    resync_at.min(tokio::time::Instant::now() + wait)
}

async fn control_loop(context: Context, stopped: tokio::sync::watch::Receiver<bool>) {
    let Context { client, evictions, state, policies, namespaces, config, metrics } = context;
    let (leader_tx, mut leader) = tokio::sync::watch::channel(false);
    let lease_config = LeaseConfig {
        namespace: config.lease_namespace.clone(),
        name: config.lease_name.clone(),
        identity: config.identity.clone(),
        timing: LeaseTiming::default(),
    };
    let election = tokio::spawn(lease::run(client.clone(), lease_config, leader_tx, stopped.clone()));
    let mut stopped = stopped;
    let reporter = Reporter { controller: "allot".into(), instance: Some(config.identity.clone()) };
    let recorder = Recorder::new(client.clone(), reporter.clone());
    // Evictions are made in the loop (they must land before the next pass decides again).
    let eviction_recorder = Recorder::new(client.clone(), reporter);
    let mut preemptions = super::preemption::Memory::default();
    // The members of disrupted gangs already counted in `allot_evicted_pods_total` (bounded).
    let mut disrupted_counted = std::collections::HashSet::new();
    let (explain_tx, explain_rx) = tokio::sync::mpsc::unbounded_channel();
    let write_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let write_retry = Arc::new(tokio::sync::Notify::new());
    let explainer = tokio::spawn(explain(
        Writers { client: client.clone(), recorder, state: state.clone(), metrics: metrics.clone() },
        leader.clone(),
        explain_rx,
        Failures { conditions: write_failed.clone(), wake: write_retry.clone() },
    ));
    let mut retry = Retry::new(config.resync);
    let refused = RefusedLifts::default();
    let mut explained: HashMap<GangKey, crate::gang::plan::Explained> = HashMap::new();
    let mut queued: HashMap<(String, String), crate::quota::queue::Told> = HashMap::new();
    let mut handed_off = std::collections::HashSet::new();
    let mut seen_generation = u64::MAX;
    let mut resync_at = tokio::time::Instant::now() + config.resync;
    let mut deadline: Option<i64> = None;
    let mut was_leader = false;
    // How long the last pass's planning (its walks over the pods) took.
    let mut last_planning = Duration::ZERO;
    loop {
        tokio::select! {
            // Pod and Node events (and the controller's own local marks) wake the loop.
            () = state.changed() => tokio::time::sleep(settle_time(last_planning)).await,
            () = tokio::time::sleep_until(next_wake(resync_at, deadline, &retry)) => {}
            // A write of the explainer failed: try again after the backoff.
            () = write_retry.notified() => retry.failed(tokio::time::Instant::now()),
            Ok(()) = leader.changed() => {}
            // Err (the handle was dropped, not used to stop) disables this branch: keep running.
            Ok(()) = stopped.changed() => if *stopped.borrow() { break },
        }
        let is_leader = *leader.borrow_and_update();
        if is_leader != was_leader {
            tracing::info!(leader = is_leader, identity = %config.identity, "gang controller leadership changed");
            was_leader = is_leader;
            // A new leader starts from the pods: what they carry (gates, conditions, stamps),
            // not from what this replica remembered while it led before.
            explained.clear();
            queued.clear();
            handed_off.clear();
            refused.clear();
            preemptions.clear();
            seen_generation = u64::MAX;
            metrics.leader.set(i64::from(is_leader));
            metrics.clear_waiting();
            metrics.set_waiting_for_domain(&Default::default());
        }
        // Before the first lists of Pods and Nodes are in, or while a (re)list is applied pod
        // by pod, the view is partial (a gang 1/3 present, no nodes, a queue without its
        // running pods): no pass until it is whole; the list's end wakes the loop.
        if !is_leader || !state.complete() {
            // No pass, so none of the timed wake-ups is acted on: a resync time or deadline
            // left in the past would wake the loop again at once, and it would spin (a
            // follower did, from its first resync period on: 3.27 s of CPU in 3 s in an e2e run).
            let now = tokio::time::Instant::now();
            if now >= resync_at {
                resync_at = now + config.resync;
            }
            deadline = None;
            retry.at = None;
            continue;
        }
        let generation = state.generation();
        let now = unix_now();
        tracing::debug!(generation, "gang pass: start");
        let resync = tokio::time::Instant::now() >= resync_at;
        let due = deadline.is_some_and(|d| now >= d);
        let retrying = retry.due(tokio::time::Instant::now());
        if generation == seen_generation && !resync && !due && !retrying {
            continue;
        }
        // This pass tries again whatever failed before it (the plan is made from the pods, and
        // what failed was unmarked); a failure in it sets the next try.
        retry.begin_pass(tokio::time::Instant::now());
        if resync {
            resync_at = tokio::time::Instant::now() + config.resync;
            // The safety net: forget what was written; only pods whose conditions differ from
            // the plan's (compared on the pods themselves) are written again.
            explained.clear();
            queued.clear();
            handed_off.clear();
        }
        if write_failed.swap(false, std::sync::atomic::Ordering::Relaxed) {
            // A condition that could not be written is tried again in this pass.
            explained.clear();
            queued.clear();
        }
        // Both passes walk every pod; with nothing behind a gate they have nothing to do, and at
        // 100,000 pods a walk every 250 ms is CPU the webhooks lack (issue 18).
        let (gang_gated, quota_gated) = state.gated();
        // Bounded (a few GETs at once, none for owners waiting out a failure): the decisions
        // below wait for them, the next pass does those left.
        let owners_left = gang_gated > 0 && resolve_owner_sizes(&client, &state, std::time::Instant::now()).await;
        let current = policies.load_full();
        super::hand_off::create_missing(&client, &state, &mut handed_off, &current, namespaces.as_ref()).await;
        seen_generation = state.generation();
        metrics.passes.inc();
        // The pure work of a pass (quota queue, snapshot, decision) runs on a blocking thread:
        // however large the cluster view, it never occupies the async workers that answer
        // /mutate, /validate and /readyz.
        let planning_started = std::time::Instant::now();
        let (quota_actions, back) = if quota_gated == 0 {
            // Nothing queued: nothing to remember (nor any place to refresh).
            (Vec::new(), HashMap::new())
        } else {
            let (state, p, namespaces) = (state.clone(), policies.load_full(), namespaces.clone());
            match tokio::task::spawn_blocking(move || {
                let actions = state.quota_plan(&p, namespaces.as_ref(), &mut queued, now);
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
        let mut planning = planning_started.elapsed();
        // Quota first: a gang member is released by the gang controller only once its quota
        // gate is gone. Only the gate lifts wait; explanations go out after the gang's lifts.
        let (mut later, quota_lifts_failed) = execute_lifts(&client, &state, &metrics, &refused, quota_actions).await;
        let planning_started = std::time::Instant::now();
        // Released members not bound yet need passes too, gated pods or not: their
        // reservations end and their gangs' start timeouts fire there; so do bound members
        // still told their gang did not start.
        let idle = gang_gated == 0
            && state.gated().0 == 0
            && state.awaiting_bind() == 0
            && state.told_late() == 0
            && state.disrupted() == 0;
        let (pass, back, memory) = if idle {
            (Plan::default(), std::mem::take(&mut explained), std::mem::take(&mut preemptions))
        } else {
            let (state, p, namespaces) = (state.clone(), policies.load_full(), namespaces.clone());
            let mut memory = std::mem::take(&mut preemptions);
            match tokio::task::spawn_blocking(move || {
                let (mut snapshot, facts) = state.snapshot(&p, namespaces.as_ref(), now);
                memory.apply(&mut snapshot, &state.view());
                (plan(&snapshot, &facts, &mut explained), explained, memory)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    tracing::error!(error = %e, "the gang pass failed; retrying on the next change");
                    (Plan::default(), HashMap::new(), super::preemption::Memory::default())
                }
            }
        };
        explained = back;
        preemptions = memory;
        tracing::debug!(preemptions = pass.preemptions.len(), actions = pass.actions.len(), "gang pass: planned");
        planning += planning_started.elapsed();
        last_planning = planning;
        // The next assembly or start timeout, reservation end or count refresh, the next queue place held back, and,
        // when owners were left unread, a pass within a second (events or not) to read them.
        // (Only times ahead: a place this pass did not look at, a pod terminating say, must not
        // make the next pass due at once, and the one after.)
        deadline = pass
            .next_deadline
            .into_iter()
            .chain(queued.values().filter_map(|t| t.refresh_at()).filter(|at| *at > now))
            .chain(owners_left.then_some(now + 1))
            .min();
        metrics.set_waiting(&pass.waiting);
        metrics.set_waiting_for_domain(&pass.waiting_for_domain);
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
        let (rest, gang_lifts_failed) = execute_lifts(&client, &state, &metrics, &refused, pass.actions).await;
        later.extend(rest);
        for gang in &pass.released {
            preemptions.released(&gang.gang);
        }
        let evictor =
            super::eviction::ApiEvictor { client: &evictions, recorder: &eviction_recorder, metrics: &metrics };
        if preempt(&evictor, &state, &mut preemptions, &pass.preemptions, now).await {
            // Refused: the next pass, within a second, chooses other victims or waits.
            deadline = Some(deadline.map_or(now + 1, |d| d.min(now + 1)));
        }
        later.extend(disruption_deletions(&mut disrupted_counted, &metrics, &state, &policies, &namespaces).await);
        if quota_lifts_failed || gang_lifts_failed {
            retry.failed(tokio::time::Instant::now());
        }
        // After the lifts: a pod released in this pass needs no place in the queue.
        // Only queued pods are stamped: with none (the common case), no walk over every pod
        // after every pass, i.e. after every watch event.
        let stamps = if state.gated().1 == 0 {
            Vec::new()
        } else {
            let state = state.clone();
            tokio::task::spawn_blocking(move || state.arrivals_to_stamp()).await.unwrap_or_default()
        };
        for (namespace, pod, _) in &stamps {
            state.mark_arrival_stamped(namespace, pod, true);
        }
        // A member this pass deletes is no member for the next pass, whatever the watch has
        // delivered by then.
        for action in &later {
            if let ControllerAction::Delete { namespace, pod, uid, .. } = action {
                state.mark_deleting(namespace, pod, uid.as_deref(), true);
            }
        }
        // Explanations, deletions and stamps are written by the explainer, so the next pass's
        // gate lifts never wait behind this pass's condition patches and Events.
        // Conditions count as written from now: a pass before the write lands does not tell
        // the pod again (the explainer unmarks what it could not write).
        for condition in later.iter().filter_map(Condition::of) {
            condition.sent(&state);
        }
        let _ = explain_tx.send(Later { actions: later, stamps });
    }
    drop(explain_tx);
    drop(leader);
    metrics.leader.set(0);
    let ended = election.await;
    // (The explainer writes nothing once this replica no longer leads.)
    if tokio::time::timeout(Duration::from_secs(5), explainer).await.is_err() {
        tracing::warn!("the explainer did not finish in time");
    }
    match ended {
        Ok(lease::Ended::Released) => {
            tracing::info!(identity = %config.identity, "gang controller stopped; Lease released")
        }
        Ok(lease::Ended::Follower) => tracing::info!(identity = %config.identity, "gang controller stopped"),
        Ok(lease::Ended::NotReleased(e)) => {
            tracing::warn!(error = %e, "gang controller stopped; the Lease could not be released")
        }
        Err(e) => tracing::warn!(error = %e, "gang controller stopped; the election task failed"),
    }
}

/// Carries out a pass's preemptions ([`super::preemption::evict`]) and marks the victims
/// evicted as being deleted, so the next pass neither counts them as members nor chooses them
/// again; true when an eviction was refused.
async fn preempt(
    evictor: &super::eviction::ApiEvictor<'_>,
    state: &ClusterState,
    memory: &mut super::preemption::Memory,
    preemptions: &[super::preemption::Preemption],
    now: i64,
) -> bool {
    use super::metrics::{EvictedLabels, TeamLabels};
    use super::preemption::Outcome;
    let mut refused = false;
    for p in preemptions {
        let team = TeamLabels { team: p.team.clone().unwrap_or_default() };
        let outcome = super::preemption::evict(p, evictor, memory, now).await;
        let evicted = match &outcome {
            Outcome::Evicted { pods } => {
                evictor.metrics.preemptions.get_or_create(&team).inc();
                *pods
            }
            Outcome::Refused { unit, pod, why, evicted } => {
                tracing::warn!(gang = %p.preemptor, victim = %unit, %pod, %why, "preemption refused");
                evictor.metrics.refused_evictions.get_or_create(&team).inc();
                refused = true;
                *evicted
            }
        };
        for (unit, pod) in p.victims.iter().flat_map(|u| u.pods.iter().map(move |pod| (u, pod))).take(evicted) {
            state.mark_deleting(&pod.namespace, &pod.name, pod.uid.as_deref(), true);
            let labels = EvictedLabels { team: unit.team.clone().unwrap_or_default(), reason: "Preempted" };
            evictor.metrics.evicted_pods.get_or_create(&labels).inc();
            tracing::warn!(gang = %p.preemptor, victim = %unit.key, namespace = %pod.namespace, pod = %pod.name,
                priority = unit.priority, preemptor_priority = p.priority, "evicted for a higher-priority gang");
        }
    }
    refused
}

/// The deletions that take down the rest of gangs a disruption broke ([`super::disruption`]):
/// none, without a walk over the pods, while no released member is being disrupted.
async fn disruption_deletions(
    counted: &mut std::collections::HashSet<(String, String, Option<Arc<str>>)>,
    metrics: &ControllerMetrics,
    state: &Arc<ClusterState>,
    policies: &Arc<ArcSwap<PolicySet>>,
    namespaces: &Arc<dyn NamespaceLabels>,
) -> Vec<ControllerAction> {
    if state.disrupted() == 0 {
        return Vec::new();
    }
    let (state, p, labels) = (state.clone(), policies.load_full(), namespaces.clone());
    let deletions = tokio::task::spawn_blocking(move || {
        let view = state.view();
        super::disruption::deletions(|| view.pods(), &p, labels.as_ref())
    })
    .await
    .unwrap_or_default();
    let current = policies.load();
    if counted.len() > 10_000 {
        counted.clear();
    }
    for action in &deletions {
        if let ControllerAction::Delete { namespace, pod, reason, uid, .. } = action {
            tracing::warn!(%namespace, %pod, %reason, "deleting a member of a disrupted gang");
            // Counted once per pod: a watch event older than the deletion can make a later pass
            // decide it again (the second deletion finds it gone).
            if !counted.insert((namespace.clone(), pod.clone(), uid.clone())) {
                continue;
            }
            let team = crate::namespaces::team_of(&current, namespace, namespaces.as_ref()).team;
            let team = team.map(|t| t.name.clone()).unwrap_or_default();
            let labels = super::metrics::EvictedLabels { team, reason: super::disruption::GANG_DISRUPTED_REASON };
            metrics.evicted_pods.get_or_create(&labels).inc();
        }
    }
    deletions
}

/// What a pass leaves to the explainer.
struct Later {
    actions: Vec<ControllerAction>,
    stamps: Vec<(String, String, i64)>,
}

/// How the explainer reports writes that failed to the loop.
struct Failures {
    /// A condition could not be written: the next pass forgets what it told.
    conditions: Arc<std::sync::atomic::AtomicBool>,
    /// Any write failed (a condition, a deletion, an arrival stamp): the loop sets a retry.
    wake: Arc<tokio::sync::Notify>,
}

/// What the explainer writes with.
struct Writers {
    client: kube::Client,
    recorder: Recorder,
    state: Arc<ClusterState>,
    metrics: ControllerMetrics,
}

/// Writes what the passes leave (conditions, Events, deletions, arrival stamps) in pass order,
/// off the decision loop. A backlog is coalesced: of several explanations for one pod's
/// condition only the newest is written. Nothing is written while this replica does not lead.
async fn explain(
    writers: Writers,
    leader: tokio::sync::watch::Receiver<bool>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Later>,
    failures: Failures,
) {
    let Writers { client, recorder, state, metrics } = writers;
    while let Some(first) = rx.recv().await {
        let mut batches = vec![first];
        while let Ok(more) = rx.try_recv() {
            batches.push(more);
        }
        if !*leader.borrow() {
            for b in &batches {
                for (namespace, pod, _) in &b.stamps {
                    state.mark_arrival_stamped(namespace, pod, false);
                }
                for condition in b.actions.iter().filter_map(Condition::of) {
                    condition.failed(&state);
                }
            }
            continue;
        }
        let (actions, stamps) = coalesce(batches);
        let (conditions_failed, others_failed) = execute_rest(&client, &recorder, &state, &metrics, actions).await;
        if conditions_failed {
            failures.conditions.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let stamps_failed = stamp_arrivals(&client, &state, &metrics, stamps).await;
        if conditions_failed || others_failed || stamps_failed {
            failures.wake.notify_one();
        }
    }
}

/// The actions of several passes, oldest first, with each pod's condition written once (the
/// newest explanation wins); deletions are all kept.
fn coalesce(batches: Vec<Later>) -> (Vec<ControllerAction>, Vec<(String, String, i64)>) {
    let mut actions: Vec<Option<ControllerAction>> = Vec::new();
    let mut latest: HashMap<(String, String, bool), usize> = HashMap::new();
    let mut stamps = Vec::new();
    for batch in batches {
        stamps.extend(batch.stamps);
        for action in batch.actions {
            let key = match &action {
                ControllerAction::Explain { namespace, pod, .. } => Some((namespace.clone(), pod.clone(), false)),
                ControllerAction::Queued { namespace, pod, .. }
                | ControllerAction::QuotaAdmitted { namespace, pod } => Some((namespace.clone(), pod.clone(), true)),
                _ => None,
            };
            if let Some(key) = key
                && let Some(older) = latest.insert(key, actions.len())
            {
                actions[older] = None;
            }
            actions.push(Some(action));
        }
    }
    stamps.sort();
    stamps.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    (actions.into_iter().flatten().collect(), stamps)
}

/// Writes `allot.dev/arrival` on pods that lack it (once per pod), so a later leader orders them
/// as this one did. True when a stamp could not be written (it is unmarked; a later pass tries
/// again).
async fn stamp_arrivals(
    client: &kube::Client,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    stamps: Vec<(String, String, i64)>,
) -> bool {
    let failed = std::sync::atomic::AtomicBool::new(false);
    let failed_ref = &failed;
    futures::stream::iter(stamps)
        .for_each_concurrent(CONCURRENT_WRITES, |(namespace, pod, arrival)| async move {
            let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let patch = json!({"metadata": {"annotations": {ARRIVAL_ANNOTATION: format_nanos(arrival)}}});
            metrics.wrote("arrival");
            match api.patch(&pod, &PatchParams::default(), &Patch::Merge(patch)).await {
                Ok(_) => {}
                Err(e) if is_status(&e, &[404]) => {}
                Err(e) => {
                    state.mark_arrival_stamped(&namespace, &pod, false);
                    failed_ref.store(true, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(%namespace, %pod, error = %e, "cannot stamp the arrival; retrying later")
                }
            }
        })
        .await;
    failed.into_inner()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Test-and-remove of one gate: the `test`s guard the pod and the index, so a pod made again
/// under the name since the pass decided (another pod, maybe asking more) or a concurrent
/// change of the gate list makes the patch fail (422) instead of removing the wrong gate.
pub fn lift_gate_ops(gate: &str, gate_index: usize, uid: Option<&str>) -> Vec<Value> {
    let uid = uid.map(|uid| json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    uid.into_iter()
        .chain([
            json!({"op": "test", "path": format!("/spec/schedulingGates/{gate_index}/name"), "value": gate}),
            json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate_index}")}),
        ])
        .collect()
}

/// The JSON Patch that lifts Allot's gang gate and only it, from the pod of that `uid`, and
/// marks the member released.
pub fn release_patch(gate_index: usize, uid: Option<&str>, has_annotations: bool, released_at: &str) -> Value {
    lift_and_stamp(GATE, RELEASED_ANNOTATION, gate_index, uid, has_annotations, released_at)
}

/// Pins a released member to its gang's topology domain: `spec.nodeSelector[key] = value`.
/// The API server lets a gated pod gain node selectors (only additions), and checks the gates
/// of the pod before the patch, so it goes in the same patch as the gate lift. A selector that
/// already names the key names this value (the domain was chosen among the nodes it admits),
/// so the add changes nothing there.
pub fn pin_op(key: &str, value: &str, has_node_selector: bool) -> Value {
    if has_node_selector {
        json!({"op": "add", "path": format!("/spec/nodeSelector/{}", escape(key)), "value": value})
    } else {
        json!({"op": "add", "path": "/spec/nodeSelector", "value": {key: value}})
    }
}

/// The JSON Patch that lifts Allot's quota gate and only it, from the pod of that `uid`, and
/// stamps when (`allot.dev/quota-released`): a gang member is not able to go before its
/// team's quota lets it, so its gang's order and starvation clock start no earlier.
pub fn quota_release_patch(gate_index: usize, uid: Option<&str>, has_annotations: bool, released_at: &str) -> Value {
    lift_and_stamp(QUOTA_GATE, QUOTA_RELEASED_ANNOTATION, gate_index, uid, has_annotations, released_at)
}

/// Lifts `gate` (see [`lift_gate_ops`]) and sets `annotation` to `at` in the same patch.
fn lift_and_stamp(
    gate: &str,
    annotation: &str,
    gate_index: usize,
    uid: Option<&str>,
    has_annotations: bool,
    at: &str,
) -> Value {
    let mut ops = lift_gate_ops(gate, gate_index, uid);
    ops.push(if has_annotations {
        json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(annotation)), "value": at})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {annotation: at}})
    });
    Value::Array(ops)
}

/// Lifts gates, all at once (a gang's members go out together, not one round trip after the
/// other); returns the other actions, plus the explanation owed for each pod lifted from its
/// quota queue, for [`execute_rest`]; and true when a lift failed for another reason than a
/// change the watch will report (a 5xx, a timeout): the loop then sets a [`Retry`].
async fn execute_lifts(
    client: &kube::Client,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    refused: &RefusedLifts,
    actions: Vec<ControllerAction>,
) -> (Vec<ControllerAction>, bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (lifts, mut rest): (Vec<_>, Vec<_>) = actions
        .into_iter()
        .partition(|a| matches!(a, ControllerAction::Release { .. } | ControllerAction::ReleaseQuota { .. }));
    let now = &now;
    let admitted: Vec<(Option<ControllerAction>, bool)> = futures::stream::iter(lifts)
        .map(|action| async move {
            match action {
                ControllerAction::Release {
                    namespace,
                    pod,
                    uid,
                    gate_index,
                    has_annotations,
                    node,
                    pin,
                    has_node_selector,
                } => {
                    metrics.wrote("gate");
                    let mut patch = release_patch(gate_index, uid.as_deref(), has_annotations, now);
                    if let (Some((key, value)), Value::Array(ops)) = (&pin, &mut patch) {
                        ops.push(pin_op(key, value, has_node_selector));
                    }
                    match patch_pod(client, &namespace, &pod, patch).await {
                        Ok(_) => {
                            state.mark_released(&namespace, std::slice::from_ref(&pod), unix_now());
                            if let Some((key, value)) = &pin {
                                // The reservation of this member is in its domain from the next
                                // pass on, whether or not the watch has shown the patch yet.
                                state.pin_placement(&namespace, &pod, key, value);
                            }
                            tracing::info!(%namespace, %pod, simulated_node = %node, "released gang member");
                            (refused.lifted(&namespace, &pod), false)
                        }
                        Err(e) if admission_refusal(&e).is_some() => {
                            let admission = admission_refusal(&e).unwrap_or_default();
                            refused.refused_now(&namespace, &pod);
                            (refused.refused(metrics, "gate", &namespace, &pod, admission), true)
                        }
                        Err(e) if is_status(&e, &[404]) => {
                            tracing::debug!(%namespace, %pod, "member gone before release");
                            (None, false)
                        }
                        Err(e) if is_status(&e, &[409, 422]) => {
                            tracing::info!(%namespace, %pod, error = %e, "gate list changed; retrying on the next pass");
                            (None, false)
                        }
                        Err(e) => {
                            tracing::warn!(%namespace, %pod, error = %e, "release failed; retrying after a backoff");
                            (None, true)
                        }
                    }
                }
                ControllerAction::ReleaseQuota { namespace, pod, uid, gate_index, has_annotations } => {
                    metrics.wrote("gate");
                    let patch = quota_release_patch(gate_index, uid.as_deref(), has_annotations, now);
                    match patch_pod(client, &namespace, &pod, patch).await {
                        Ok(_) => {
                            state.mark_quota_released(&namespace, &pod, unix_now());
                            metrics.quota_releases.inc();
                            tracing::info!(%namespace, %pod, "released from the quota queue");
                            (Some(ControllerAction::QuotaAdmitted { namespace, pod }), false)
                        }
                        Err(e) if admission_refusal(&e).is_some() => {
                            let admission = admission_refusal(&e).unwrap_or_default();
                            // (The pod keeps its queue condition; the count, the alert and the
                            // error line say why it does not leave the queue.)
                            let _ = refused.refused(metrics, "quota", &namespace, &pod, admission);
                            (None, true)
                        }
                        Err(e) if is_status(&e, &[404, 409, 422]) => {
                            tracing::debug!(%namespace, %pod, error = %e, "quota release skipped; retrying on the next pass");
                            (None, false)
                        }
                        Err(e) => {
                            tracing::warn!(%namespace, %pod, error = %e, "quota release failed; retrying after a backoff");
                            (None, true)
                        }
                    }
                }
                _ => (None, false),
            }
        })
        .buffered(CONCURRENT_WRITES)
        .collect()
        .await;
    let failed = admitted.iter().any(|(_, failed)| *failed);
    // A member whose lift was refused is not told the plan's "releasing": it keeps what the
    // refusal says (else whichever condition write landed last would win).
    refused.drop_plans_for_refused(&mut rest);
    rest.extend(admitted.into_iter().filter_map(|(action, _)| action));
    (rest, failed)
}

/// Conditions, Events and deletions, concurrently. Returns (a condition could not be written:
/// the loop then forgets what it wrote; a deletion could not be made); either way the next
/// pass, after a [`Retry`] backoff, tries again.
async fn execute_rest(
    client: &kube::Client,
    recorder: &Recorder,
    state: &ClusterState,
    metrics: &ControllerMetrics,
    actions: Vec<ControllerAction>,
) -> (bool, bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let writer = Writer { client, recorder, metrics, now: &now };
    // (condition failed, deletion failed) per action.
    let outcomes: Vec<(bool, bool)> = futures::stream::iter(actions)
        .map(|action| async move {
            if let ControllerAction::Delete { namespace, pod, uid, event_reason, reason } = &action {
                if !writer.delete_member(namespace, pod, uid.as_deref(), event_reason, reason).await {
                    state.mark_deleting(namespace, pod, uid.as_deref(), false);
                    return (false, true);
                }
                return (false, false);
            }
            let Some(c) = Condition::of(&action) else { return (false, false) };
            let condition = if c.quota { QUOTA_CONDITION } else { CONDITION };
            if !writer.set_condition(c.namespace, c.pod, condition, c.ready, c.reason, c.message).await {
                // Marked when the pass sent it: unmarked (unless a newer one is on its way), so
                // the next pass tells the pod again.
                c.failed(state);
                return (true, false);
            }
            c.landed(state);
            writer.publish(c.namespace, c.pod, None, c.event, c.warning, c.reason, c.message).await;
            (false, false)
        })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    (outcomes.iter().any(|o| o.0), outcomes.iter().any(|o| o.1))
}

/// The message of the condition a pod released from its team's quota queue gets.
const QUOTA_ADMITTED_MESSAGE: &str = "the team's quota has room; released from the queue";

/// The condition (and Event) an explaining action writes on a pod.
struct Condition<'a> {
    namespace: &'a str,
    pod: &'a str,
    /// `allot.dev/QuotaReady`, else `allot.dev/GangReady`.
    quota: bool,
    ready: bool,
    reason: &'static str,
    message: &'a str,
    warning: bool,
    event: EventAction,
}

impl Condition<'_> {
    fn of(action: &ControllerAction) -> Option<Condition<'_>> {
        Some(match action {
            ControllerAction::Explain { namespace, pod, ready, reason, message, warning } => Condition {
                namespace,
                pod,
                quota: false,
                ready: *ready,
                reason,
                message,
                warning: *warning,
                event: EventAction::GangScheduling,
            },
            ControllerAction::Queued { namespace, pod, message } => Condition {
                namespace,
                pod,
                quota: true,
                ready: false,
                reason: QUEUED_REASON,
                message,
                warning: false,
                event: EventAction::QuotaQueueing,
            },
            ControllerAction::QuotaAdmitted { namespace, pod } => Condition {
                namespace,
                pod,
                quota: true,
                ready: true,
                reason: "QuotaAdmitted",
                message: QUOTA_ADMITTED_MESSAGE,
                warning: false,
                event: EventAction::QuotaQueueing,
            },
            ControllerAction::Delete { .. }
            | ControllerAction::Release { .. }
            | ControllerAction::ReleaseQuota { .. } => {
                return None;
            }
        })
    }

    /// Records on the pod's record that this condition is on its way, so the passes meanwhile
    /// neither tell the pod again nor count it as told nothing.
    fn sent(&self, state: &ClusterState) {
        state.mark_condition(self.namespace, self.pod, self.quota, self.fingerprint());
    }

    /// Records that it was not written (or not sent): unmarked, unless a newer one is on its way.
    fn failed(&self, state: &ClusterState) {
        state.unmark_condition(self.namespace, self.pod, self.quota, self.fingerprint());
    }

    /// Records that the write completed: the pod's watch events carry it from now on.
    fn landed(&self, state: &ClusterState) {
        state.condition_landed(self.namespace, self.pod, self.quota, self.fingerprint());
    }

    fn fingerprint(&self) -> u64 {
        condition_fingerprint(self.ready, self.reason, self.message)
    }
}

/// What the explaining writes share: the client, the Event recorder, the write counter and
/// the pass's time.
#[derive(Clone, Copy)]
struct Writer<'a> {
    client: &'a kube::Client,
    recorder: &'a Recorder,
    metrics: &'a ControllerMetrics,
    now: &'a str,
}

impl Writer<'_> {
    /// Sets one of Allot's pod conditions (strategic merge on `type`, so other conditions
    /// stay); false when it could not be written.
    async fn set_condition(
        &self,
        namespace: &str,
        pod: &str,
        condition: &str,
        ready: bool,
        reason: &str,
        message: &str,
    ) -> bool {
        self.metrics.wrote("condition");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"status": {"conditions": [{
            "type": condition,
            "status": if ready { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastTransitionTime": self.now,
        }]}});
        match api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(patch)).await {
            Ok(_) => true,
            // Gone: nothing to say any more.
            Err(e) if is_status(&e, &[404]) => true,
            Err(e) => {
                tracing::warn!(%namespace, %pod, %condition, error = %e, "cannot set the pod condition");
                false
            }
        }
    }

    /// An Event about the pod (the one of `uid`, when known).
    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        action: EventAction,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        self.metrics.wrote("event");
        publish(self.recorder, namespace, pod, uid, action, warning, reason, message).await;
    }

    /// Assembly or start timeout under `Fail`: a Warning Event (`event_reason`, `reason`) on the
    /// pod of that `uid` (before: a deletion that fails and is retried repeats it, and the pod's
    /// Events say why it went), then its deletion; false when the pod could not be deleted (it
    /// is still there). A pod made again under the name since is spared by the uid, and the
    /// Event names the uid, so the successor's `kubectl describe` does not show it.
    async fn delete_member(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        event_reason: &str,
        reason: &str,
    ) -> bool {
        self.publish(namespace, pod, uid, EventAction::GangScheduling, true, event_reason, reason).await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        if event_reason == super::disruption::GANG_DISRUPTED_REASON {
            // As the scheduler and the Eviction API do: a Job whose podFailurePolicy ignores
            // disruptions (onPodConditions DisruptionTarget) replaces the member without counting
            // a failure or waiting out a backoff. Deleted whether or not this lands.
            let condition =
                super::disruption::disruption_condition(reason, &k8s_openapi::jiff::Timestamp::now().to_string());
            if let Err(e) = api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(condition)).await {
                tracing::debug!(%namespace, %pod, error = %e, "DisruptionTarget condition not written");
            }
        }
        match api.delete(pod, &delete_params(uid)).await {
            Ok(_) => {
                // Deletions made, not tried: what AllotGangMembersDeleted alerts on.
                self.metrics.wrote("delete");
                tracing::warn!(%namespace, %pod, %event_reason, %reason, "deleted gang member");
                true
            }
            Err(e) if is_status(&e, &[404]) => true,
            // The uid precondition failed: the pod of that name now is another one (made again
            // since the pass decided); the member meant is gone, and this one is not ours to take.
            Err(e) if is_status(&e, &[409]) => {
                tracing::info!(%namespace, %pod, "gang member to delete was replaced under its name; left alone");
                true
            }
            Err(e) => {
                tracing::warn!(%namespace, %pod, error = %e, "cannot delete gang member");
                false
            }
        }
    }
}

/// Deletes only the pod of that `uid` (when known): the API server answers 409 Conflict when
/// the name now belongs to another pod.
pub fn delete_params(uid: Option<&str>) -> DeleteParams {
    let preconditions = uid.map(|uid| Preconditions { uid: Some(uid.to_string()), resource_version: None });
    DeleteParams { preconditions, ..DeleteParams::default() }
}

/// Sends one of this module's JSON Patches (gate removals) to a Pod.
async fn patch_pod(client: &kube::Client, namespace: &str, pod: &str, ops: Value) -> Result<(), kube::Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.patch(pod, &PatchParams::default(), &Patch::Json::<()>(patch)).await.map(|_| ())
}

#[cfg(test)]
mod claim_wait_tests {
    use super::*;

    /// Claim watches that finish their first lists at a given time.
    struct SyncedAt(std::time::Instant);

    impl crate::dra::ClaimSource for SyncedAt {
        fn template(&self, _: &str, _: &str) -> Option<Arc<serde_json::Value>> {
            None
        }
        fn claim(&self, _: &str, _: &str) -> Option<Arc<serde_json::Value>> {
            None
        }
        fn synced(&self) -> bool {
            std::time::Instant::now() >= self.0
        }
    }

    fn with_claims_in(delay: Duration) -> ClusterState {
        let state = ClusterState::default();
        state.set_claims(Arc::new(SyncedAt(std::time::Instant::now() + delay)));
        state
    }

    /// Where the server reads DeviceClasses, the Pod watch waits until the set in force is
    /// compiled with them (one list, not two), boundedly; elsewhere it does not wait.
    #[tokio::test]
    async fn the_pod_watch_waits_for_the_device_classes_where_the_server_reads_them() {
        let state = Arc::new(ClusterState::default());
        let started = std::time::Instant::now();
        wait_for_device_classes(&state, Duration::from_secs(20)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "not expected: no wait");

        state.expect_device_classes();
        let settler = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            settler.mark_device_classes_settled();
        });
        let started = std::time::Instant::now();
        wait_for_device_classes(&state, Duration::from_secs(20)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(10), "{waited:?}");

        let never = ClusterState::default();
        never.expect_device_classes();
        let started = std::time::Instant::now();
        wait_for_device_classes(&never, Duration::from_millis(200)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(10), "bounded: {waited:?}");
    }

    #[tokio::test]
    async fn the_pod_watch_waits_for_the_claim_watches_when_device_classes_are_mapped() {
        let cluster = "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n";
        let dra = crate::policy::compile(&[crate::policy::Source { name: "c.yaml".into(), text: cluster.into() }])
            .expect("policies");
        let none = crate::policy::compile(&[]).expect("no policies");

        let started = std::time::Instant::now();
        wait_for_claims(&with_claims_in(Duration::from_millis(300)), &dra, Duration::from_secs(20)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(10), "{waited:?}");

        // Bounded: claim watches that never list hold the Pod watch back no longer than `within`.
        let started = std::time::Instant::now();
        wait_for_claims(&with_claims_in(Duration::from_secs(3600)), &dra, Duration::from_millis(200)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(10), "{waited:?}");

        // Without DeviceClasses mapped nothing is waited for.
        let started = std::time::Instant::now();
        wait_for_claims(&with_claims_in(Duration::from_secs(3600)), &none, Duration::from_secs(20)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

#[cfg(test)]
mod retry_tests {
    use super::{RETRY_FIRST, Retry};
    use std::time::Duration;

    #[test]
    fn the_wait_after_a_change_grows_with_the_last_pass_only_when_it_was_expensive() {
        use super::{DEBOUNCE, MOST_SETTLE, settle_time};
        assert_eq!(settle_time(Duration::ZERO), DEBOUNCE);
        assert_eq!(settle_time(Duration::from_micros(300)), DEBOUNCE, "a small cluster's pass: the debounce");
        assert_eq!(settle_time(Duration::from_millis(20)), Duration::from_millis(80), "a fifth of a core at most");
        assert_eq!(settle_time(Duration::from_secs(3)), MOST_SETTLE);
    }

    #[test]
    fn a_retry_backs_off_while_retries_fail_and_starts_over_after_a_pass_that_was_no_retry() {
        let start = tokio::time::Instant::now();
        let mut retry = Retry::new(Duration::from_secs(30));
        assert!(!retry.due(start));
        retry.begin_pass(start);
        retry.failed(start);
        assert_eq!(retry.at, Some(start + RETRY_FIRST));
        // A second failure before the pass changes nothing: one retry is set.
        retry.failed(start + Duration::from_millis(10));
        assert_eq!(retry.at, Some(start + RETRY_FIRST));
        assert!(!retry.due(start + Duration::from_millis(999)));
        assert!(retry.due(start + RETRY_FIRST));
        // Each retry pass fails again, however long its writes take (a 10 s timeout here):
        // 2 s, 4 s, … up to the resync period.
        let mut waits = Vec::new();
        for _ in 0..7 {
            let mut now = retry.at.expect("a retry is set");
            retry.begin_pass(now);
            assert!(retry.at.is_none(), "the pass takes the retry over");
            now += Duration::from_secs(10);
            retry.failed(now);
            waits.push(retry.at.expect("set again").duration_since(now).as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30]);
        // A failure in a pass that was no retry (an event's) starts again from the first wait.
        let later = retry.at.expect("set") + Duration::from_secs(1);
        retry.begin_pass(later);
        let event = later + Duration::from_secs(5);
        retry.begin_pass(event);
        retry.failed(event);
        assert_eq!(retry.at, Some(event + RETRY_FIRST));
        // A resync period shorter than the first wait does not shorten it.
        assert_eq!(Retry::new(Duration::from_millis(100)).most, RETRY_FIRST);
    }
}
