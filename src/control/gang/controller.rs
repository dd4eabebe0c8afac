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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::decision::GangKey;
use super::lease::{self, LeaseConfig, LeaseTiming};
use super::metrics::ControllerMetrics;
use super::owners::resolve_owner_sizes;
pub use super::owners::{OWNER_APIS, OwnerApi};
use super::plan::{Plan, plan};
use super::refusal::RefusedLifts;
use super::snapshot::GangSnapshot;
pub use super::watches::{InitialList, OnSynced, streaming_refused};
use super::watches::{watch_nodes, watch_pods};
use super::writes::{Condition, Failures, Later, Writers, execute_lifts, explain, unix_now};
pub use super::writes::{
    borrowed_mark_patch, delete_params, lift_gate_ops, pin_op, quota_release_patch, release_patch,
};
use crate::control::cluster::{ClusterState, ControllerAction};
use crate::control::quota::QuotaQueue;
use crate::control::quota::reclaim::Reclaim;
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::PolicySet;

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

/// How long the loop waits after a change before it looks: a burst of watch events (a gang's
/// members created together, the echoes of its own patches) becomes one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(5);

/// After a change, the loop waits at least this many times as long as the last pass's planning
/// took (and at most [`MOST_SETTLE`]): a pass reads the pods in play and every node while
/// anything is gated, so with many waiting gangs changing fast, passes back to back would take a
/// core; this way they take at most about a fifth of one (passes a timer wakes do not wait), and
/// a small cluster keeps the [`DEBOUNCE`].
const SETTLE_PER_PLANNING: u32 = 4;

/// The longest wait after a change, however long the last pass took.
const MOST_SETTLE: Duration = Duration::from_secs(1);

/// How long the loop waits after a change before its pass.
fn settle_time(last_planning: Duration) -> Duration {
    (last_planning * SETTLE_PER_PLANNING).clamp(DEBOUNCE, MOST_SETTLE)
}

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

/// What the leader remembers between passes. A new leader starts from the pods (what they
/// carry: gates, conditions, stamps), with none of this.
#[derive(Default)]
struct Remembered {
    /// What each gang's members were last told.
    explained: HashMap<GangKey, crate::control::gang::plan::Explained>,
    /// Each queued pod's place, as last told.
    queued: HashMap<(String, String), crate::control::quota::queue::Told>,
    /// Gangs whose native PodGroup this leader tried to create.
    handed_off: HashSet<(String, String)>,
    /// Preemptions in flight, and units spared for a while.
    preemptions: super::preemption::Memory,
    /// Reclaims in flight, and units a budget kept a reclaim from evicting.
    reclaims: crate::control::quota::reclaim::Memory,
}

/// The control loop's state between two wake-ups.
struct ControlLoop {
    context: Context,
    /// The Events of evictions, made in the loop (they must land before the next pass decides
    /// again); the explainer has its own clone.
    events: super::events::Publisher,
    refused: RefusedLifts,
    /// Set by the explainer when a write failed: its conditions are written again.
    write_failed: Arc<std::sync::atomic::AtomicBool>,
    explain_tx: tokio::sync::mpsc::UnboundedSender<Later>,
    remembered: Remembered,
    /// The members of disrupted gangs already counted in `allot_evicted_pods_total` (bounded).
    disrupted_counted: HashSet<(String, String, Option<Arc<str>>)>,
    retry: Retry,
    /// The view's generation the last pass saw (`u64::MAX`: none yet).
    seen_generation: u64,
    resync_at: tokio::time::Instant,
    /// The next assembly or start timeout, reservation end or queue refresh (seconds).
    deadline: Option<i64>,
    was_leader: bool,
    /// How long the last pass's planning (its walks over the pods) took.
    last_planning: Duration,
}

async fn control_loop(context: Context, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let (leader_tx, mut leader) = tokio::sync::watch::channel(false);
    let lease_config = LeaseConfig {
        namespace: context.config.lease_namespace.clone(),
        name: context.config.lease_name.clone(),
        identity: context.config.identity.clone(),
        timing: LeaseTiming::default(),
    };
    let election = tokio::spawn(lease::run(context.client.clone(), lease_config, leader_tx, stopped.clone()));
    let (mut control, explainer, write_retry) = ControlLoop::start(context, leader.clone());
    loop {
        let wake = next_wake(control.resync_at, control.deadline, &control.retry);
        tokio::select! {
            // Pod and Node events (and the controller's own local marks) wake the loop.
            () = control.context.state.changed() => tokio::time::sleep(settle_time(control.last_planning)).await,
            () = tokio::time::sleep_until(wake) => {}
            // A write of the explainer failed: try again after the backoff.
            () = write_retry.notified() => control.retry.failed(tokio::time::Instant::now()),
            Ok(()) = leader.changed() => {}
            // Err (the handle was dropped, not used to stop) disables this branch: keep running.
            Ok(()) = stopped.changed() => if *stopped.borrow() { break },
        }
        let is_leader = *leader.borrow_and_update();
        control.follow_leadership(is_leader);
        // Before the first lists of Pods and Nodes are in, or while a (re)list is applied pod
        // by pod, the view is partial (a gang 1/3 present, no nodes, a queue without its
        // running pods): no pass until it is whole; the list's end wakes the loop.
        if !is_leader || !control.context.state.complete() {
            control.idle();
            continue;
        }
        control.pass().await;
    }
    let ControlLoop { context, explain_tx, .. } = control;
    drop(explain_tx);
    drop(leader);
    context.metrics.leader.set(0);
    let ended = election.await;
    // (The explainer writes nothing once this replica no longer leads.)
    if tokio::time::timeout(Duration::from_secs(5), explainer).await.is_err() {
        tracing::warn!("the explainer did not finish in time");
    }
    let identity = &context.config.identity;
    match ended {
        Ok(lease::Ended::Released) => tracing::info!(%identity, "gang controller stopped; Lease released"),
        Ok(lease::Ended::Follower) => tracing::info!(%identity, "gang controller stopped"),
        Ok(lease::Ended::NotReleased(e)) => {
            tracing::warn!(error = %e, "gang controller stopped; the Lease could not be released")
        }
        Err(e) => tracing::warn!(error = %e, "gang controller stopped; the election task failed"),
    }
}

impl ControlLoop {
    /// The loop before its first wake-up, its explainer started (and the explainer's signal
    /// that a write failed).
    fn start(
        context: Context,
        leader: tokio::sync::watch::Receiver<bool>,
    ) -> (ControlLoop, tokio::task::JoinHandle<()>, Arc<tokio::sync::Notify>) {
        let events = super::events::Publisher::new(context.client.clone(), context.config.identity.clone());
        let (explain_tx, explain_rx) = tokio::sync::mpsc::unbounded_channel();
        let write_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let write_retry = Arc::new(tokio::sync::Notify::new());
        let writers = Writers {
            client: context.client.clone(),
            events: events.clone(),
            state: context.state.clone(),
            metrics: context.metrics.clone(),
        };
        let failures = Failures { conditions: write_failed.clone(), wake: write_retry.clone() };
        let explainer = tokio::spawn(explain(writers, leader, explain_rx, failures));
        let control = ControlLoop {
            retry: Retry::new(context.config.resync),
            resync_at: tokio::time::Instant::now() + context.config.resync,
            context,
            events,
            refused: RefusedLifts::default(),
            write_failed,
            explain_tx,
            remembered: Remembered::default(),
            disrupted_counted: HashSet::new(),
            seen_generation: u64::MAX,
            deadline: None,
            was_leader: false,
            last_planning: Duration::ZERO,
        };
        (control, explainer, write_retry)
    }

    /// A new leader starts from the pods, not from what this replica remembered while it led
    /// before.
    fn follow_leadership(&mut self, is_leader: bool) {
        if is_leader == self.was_leader {
            return;
        }
        tracing::info!(leader = is_leader, identity = %self.context.config.identity, "gang controller leadership changed");
        self.was_leader = is_leader;
        self.remembered = Remembered::default();
        self.refused.clear();
        self.seen_generation = u64::MAX;
        let metrics = &self.context.metrics;
        metrics.leader.set(i64::from(is_leader));
        metrics.clear_waiting();
        metrics.set_waiting_for_domain(&Default::default());
    }

    /// No pass, so none of the timed wake-ups is acted on: a resync time or deadline left in
    /// the past would wake the loop again at once, and it would spin (a follower did, from its
    /// first resync period on: 3.27 s of CPU in 3 s in an e2e run).
    fn idle(&mut self) {
        let now = tokio::time::Instant::now();
        if now >= self.resync_at {
            self.resync_at = now + self.context.config.resync;
        }
        self.deadline = None;
        self.retry.at = None;
    }

    /// Whether a pass is due (the view changed, the resync period, a deadline or a retry), and
    /// what it forgets first.
    fn begin_pass(&mut self, generation: u64, now: i64) -> bool {
        let resync = tokio::time::Instant::now() >= self.resync_at;
        let due = self.deadline.is_some_and(|d| now >= d);
        let retrying = self.retry.due(tokio::time::Instant::now());
        if generation == self.seen_generation && !resync && !due && !retrying {
            return false;
        }
        // This pass tries again whatever failed before it (the plan is made from the pods, and
        // what failed was unmarked); a failure in it sets the next try.
        self.retry.begin_pass(tokio::time::Instant::now());
        if resync {
            self.resync_at = tokio::time::Instant::now() + self.context.config.resync;
            // The safety net: forget what was written; only pods whose conditions differ from
            // the plan's (compared on the pods themselves) are written again.
            self.remembered.explained.clear();
            self.remembered.queued.clear();
            self.remembered.handed_off.clear();
        }
        if self.write_failed.swap(false, std::sync::atomic::Ordering::Relaxed) {
            // A condition that could not be written is tried again in this pass.
            self.remembered.explained.clear();
            self.remembered.queued.clear();
        }
        true
    }

    /// One pass: the quota queue's lifts, then the gangs' (plan, lifts, preemptions,
    /// disruptions), then what the explainer writes.
    async fn pass(&mut self) {
        let state = self.context.state.clone();
        let (generation, now) = (state.generation(), unix_now());
        tracing::debug!(generation, "gang pass: start");
        if !self.begin_pass(generation, now) {
            return;
        }
        // With nothing behind a gate both passes have nothing to do (issue 18); otherwise they
        // read the pods the view keeps in play, not every pod (issue 49).
        let (gang_gated, quota_gated) = state.gated();
        // Bounded (a few GETs at once, none for owners waiting out a failure): the decisions
        // below wait for them, the next pass does those left.
        let client = &self.context.client;
        let owners_left = gang_gated > 0 && resolve_owner_sizes(client, &state, std::time::Instant::now()).await;
        let current = self.context.policies.load_full();
        let handed_off = &mut self.remembered.handed_off;
        super::hand_off::create_missing(client, &state, handed_off, &current, self.context.namespaces.as_ref()).await;
        self.seen_generation = state.generation();
        self.context.metrics.passes.inc();
        let planning_started = std::time::Instant::now();
        // (A cohort in deny mode has lender pods to look for whatever is gated.)
        let deny_cohorts = crate::control::quota::reclaim::deny::any(&current);
        let (quota_actions, reclaims) = if quota_gated == 0 && !deny_cohorts {
            // Nothing queued: nothing to remember (nor any place to refresh).
            self.remembered.queued.clear();
            Default::default()
        } else {
            self.plan_quota(now).await
        };
        let mut planning = planning_started.elapsed();
        // Quota first: a gang member is released by the gang controller only once its quota
        // gate is gone. Only the gate lifts wait; explanations go out after the gang's lifts.
        let (client, metrics) = (&self.context.client, &self.context.metrics);
        let (later, quota_lifts_failed) = execute_lifts(client, &state, metrics, &self.refused, quota_actions).await;
        let evictor = super::eviction::ApiEvictor { client: &self.context.evictions, events: &self.events, metrics };
        let memory = &mut self.remembered.reclaims;
        let reclaim_refused = super::evicting::reclaim(&evictor, &state, memory, &reclaims, now).await;
        let planning_started = std::time::Instant::now();
        let pass = self.plan_gangs(gang_gated, now).await;
        tracing::debug!(preemptions = pass.preemptions.len(), actions = pass.actions.len(), "gang pass: planned");
        planning += planning_started.elapsed();
        self.last_planning = planning;
        // The next assembly or start timeout, reservation end or count refresh, the next queue
        // place held back, and, when owners were left unread, a pass within a second (events or
        // not) to read them. (Only times ahead: a place this pass did not look at, a pod
        // terminating say, must not make the next pass due at once, and the one after.)
        let refreshes = self.remembered.queued.values().filter_map(|t| t.refresh_at()).filter(|at| *at > now);
        // (A refused reclaim: the next pass, within a second, chooses other victims or waits.)
        let soon = owners_left || reclaim_refused;
        self.deadline = pass.next_deadline.into_iter().chain(refreshes).chain(soon.then_some(now + 1)).min();
        self.act(pass, later, quota_lifts_failed, now).await;
    }

    /// The quota queue's plan (on a blocking thread: however large the cluster view, it never
    /// occupies the async workers that answer /mutate, /validate and /readyz).
    async fn plan_quota(&mut self, now: i64) -> (Vec<ControllerAction>, Vec<Reclaim>) {
        let (state, p, namespaces) =
            (self.context.state.clone(), self.context.policies.load_full(), self.context.namespaces.clone());
        let mut queued = std::mem::take(&mut self.remembered.queued);
        self.remembered.reclaims.begin_pass(now);
        let memory = self.remembered.reclaims.clone();
        let planned = tokio::task::spawn_blocking(move || {
            let planned = state.quota_pass(&p, namespaces.as_ref(), &mut queued, &memory, now);
            (planned, queued)
        })
        .await;
        match planned {
            Ok((planned, queued)) => {
                self.remembered.queued = queued;
                planned
            }
            Err(e) => {
                tracing::error!(error = %e, "the quota pass failed; retrying on the next change");
                Default::default()
            }
        }
    }

    /// The gangs' plan (on a blocking thread, as the quota's). Released members not bound yet
    /// need passes too, gated pods or not: their reservations end and their gangs' start
    /// timeouts fire there; so do bound members still told their gang did not start.
    async fn plan_gangs(&mut self, gang_gated: usize, now: i64) -> Plan {
        let state = self.context.state.clone();
        let idle = gang_gated == 0
            && state.gated().0 == 0
            && state.awaiting_bind() == 0
            && state.told_late() == 0
            && state.disrupted() == 0;
        if idle {
            return Plan::default();
        }
        let (p, namespaces) = (self.context.policies.load_full(), self.context.namespaces.clone());
        let mut memory = std::mem::take(&mut self.remembered.preemptions);
        let mut explained = std::mem::take(&mut self.remembered.explained);
        let reclaiming = self.remembered.reclaims.reclaiming(&state.view());
        let planned = tokio::task::spawn_blocking(move || {
            let (mut snapshot, facts) = state.snapshot(&p, namespaces.as_ref(), now);
            memory.apply(&mut snapshot, &state.view());
            snapshot.reclaiming = reclaiming;
            (plan(&snapshot, &facts, &mut explained), explained, memory)
        })
        .await;
        match planned {
            Ok((pass, explained, memory)) => {
                self.remembered.explained = explained;
                self.remembered.preemptions = memory;
                pass
            }
            Err(e) => {
                tracing::error!(error = %e, "the gang pass failed; retrying on the next change");
                Plan::default()
            }
        }
    }

    /// Carries out a gang plan: the releases' lifts, the preemptions, the deletions of disrupted
    /// gangs; then hands explanations, deletions and stamps to the explainer.
    async fn act(&mut self, pass: Plan, mut later: Vec<ControllerAction>, quota_lifts_failed: bool, now: i64) {
        let Context { client, evictions, state, policies, namespaces, metrics, .. } = &self.context;
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
        let (rest, gang_lifts_failed) = execute_lifts(client, state, metrics, &self.refused, pass.actions).await;
        later.extend(rest);
        let memory = &mut self.remembered.preemptions;
        for gang in &pass.released {
            memory.released(&gang.gang);
        }
        let evictor = super::eviction::ApiEvictor { client: evictions, events: &self.events, metrics };
        if super::evicting::preempt(&evictor, state, memory, &pass.preemptions, now).await {
            // Refused: the next pass, within a second, chooses other victims or waits.
            self.deadline = Some(self.deadline.map_or(now + 1, |d| d.min(now + 1)));
        }
        later.extend(disruption_deletions(&mut self.disrupted_counted, metrics, state, policies, namespaces).await);
        if quota_lifts_failed || gang_lifts_failed {
            self.retry.failed(tokio::time::Instant::now());
        }
        self.hand_to_explainer(later).await;
    }

    /// After the lifts (a pod released in this pass needs no place in the queue): the queue's
    /// stamps, and what the explainer writes, so the next pass's gate lifts never wait behind
    /// this pass's condition patches and Events.
    async fn hand_to_explainer(&self, later: Vec<ControllerAction>) {
        let state = &self.context.state;
        // Only queued pods are stamped: with none (the common case), nothing to look at.
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
        // So do borrowed marks: the next pass does not send them again.
        for action in &later {
            if let ControllerAction::MarkBorrowed { namespace, pod, cohort, .. } = action {
                state.mark_borrowed(namespace, pod, cohort.is_some());
            }
        }
        // Conditions count as written from now: a pass before the write lands does not tell
        // the pod again (the explainer unmarks what it could not write).
        for condition in later.iter().filter_map(Condition::of) {
            condition.sent(state);
        }
        let _ = self.explain_tx.send(Later { actions: later, stamps });
    }
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
        let members_of = |ns: &str, gang: &str| view.gang_pods(ns, gang).collect();
        super::disruption::deletions(view.disrupting_pods(), members_of, &p, labels.as_ref())
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
            let team = crate::model::namespaces::team_of(&current, namespace, namespaces.as_ref()).team;
            let team = team.map(|t| t.name.clone()).unwrap_or_default();
            let labels = super::metrics::EvictedLabels { team, reason: super::disruption::GANG_DISRUPTED_REASON };
            metrics.evicted_pods.get_or_create(&labels).inc();
        }
    }
    deletions
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
