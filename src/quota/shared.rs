//! The deny-mode book of `allot serve` with the Kubernetes API: each team's [`Ledger`] lives in a
//! ConfigMap in Allot's namespace, and every admission that adds usage commits its charge there
//! (a resourceVersion-guarded update) before it answers, so every replica decides from the same
//! numbers. The leader's reconciler ([`SharedLedger::reconcile`]) keeps the ledgers in line
//! with the pods its watch sees.
//!
//! Group commit: admissions of one team on one replica queue up; whoever takes the team's write
//! slot decides the whole queue in order against one copy of the ledger and writes it once. On
//! 409 (another replica wrote first) it reads the ledger again and decides everything again.
//! A refusal is only ever given from a ledger read in the same round (a cached copy may be
//! stale, and a stale copy must not refuse a pod that fits). The round trip is paid only by
//! deny-mode admissions that reach the book (those that count something, and gang members);
//! nothing on the request path looks at the pod cache.
//!
//! Fails closed: an API server that cannot be read or written within the request's budget, a
//! missing or not-yet-reconciled ledger, or a full one, refuse the pod with the reason.
//!
//! Kept fresh by a watch ([`SharedLedger::watch`]): a round starts from the newest copy the
//! watch delivered (so it does not write over a copy another replica has already replaced,
//! which would only earn a 409), and after a 409 it waits briefly for the watch to deliver the
//! version that beat it instead of reading it again. The watch changes only how fresh the
//! starting copy is: every write is still guarded by its resourceVersion, and a refusal still
//! needs a read of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use super::ledger::{self, Charged, CountedPod, Ledger, Reconciled, Recount, SeenPod};
use super::{OwnedQuotaRequest, QuotaRequest, Refusal};
use crate::policy::quota::Quota;
use crate::resources::ResourceList;

/// What the ledger costs, for `/metrics` (registered by the server).
#[derive(Debug, Clone, Default)]
pub struct LedgerMetrics {
    /// Ledger reads (a missing cached copy, a conflict, or a refusal to confirm).
    pub reads: prometheus_client::metrics::counter::Counter,
    /// Rounds whose charges were committed (one write for a whole queue).
    pub commits: prometheus_client::metrics::counter::Counter,
    /// Writes refused with 409: another writer came first.
    pub conflicts: prometheus_client::metrics::counter::Counter,
    /// Admissions answered by a round (charged, refused, or already charged).
    pub decisions: prometheus_client::metrics::counter::Counter,
    /// Rounds that ended in a fail-closed refusal (API errors, deadline).
    pub failures: prometheus_client::metrics::counter::Counter,
}

/// The API-server-backed deny-mode book.
pub struct SharedLedger {
    pub metrics: LedgerMetrics,
    api: Api<ConfigMap>,
    /// How long one admission may spend on the ledger (reads, writes, retries) before it is
    /// refused; well inside the request deadline.
    budget: Duration,
    teams: Mutex<HashMap<String, Arc<TeamBook>>>,
    /// The newest copy of each ledger object the watch delivered, by object name.
    watched: Mutex<HashMap<String, ConfigMap>>,
    /// Signalled on every delivery of the watch.
    delivered: tokio::sync::Notify,
}

/// How long a round that lost a write (409) waits for the watch to deliver the copy that beat
/// it before it reads the ledger itself.
const WATCH_GRACE: Duration = Duration::from_millis(50);

/// A resourceVersion as a number (etcd's revision, what every API server in practice sends);
/// `None` for one that is not, which is then never taken for newer.
fn revision(object: &ConfigMap) -> Option<u64> {
    object.metadata.resource_version.as_deref()?.parse().ok()
}

/// One team's queue and write slot on this replica.
#[derive(Default)]
struct TeamBook {
    waiting: Mutex<Vec<Waiting>>,
    slot: tokio::sync::Mutex<Cached>,
}

/// The last copy of the ledger this replica read or wrote: where an optimistic write starts.
#[derive(Default)]
struct Cached {
    object: Option<ConfigMap>,
    ledger: Ledger,
}

impl Cached {
    /// Takes `object` (read, or delivered by the watch) as the copy to start from.
    fn adopt(&mut self, object: ConfigMap) {
        self.ledger = parse(&object);
        self.object = Some(object);
    }
}

struct Waiting {
    quota: Quota,
    request: OwnedQuotaRequest,
    key: String,
    deadline: Instant,
    answer: tokio::sync::oneshot::Sender<Result<(), Refusal>>,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Why the ledger could not be used: the refusal's text.
fn unavailable(what: &str) -> Refusal {
    Refusal::Unknown {
        reason: format!(
            "the quota ledger in the API server could not be used ({what}); deny-mode quota fails closed, so the pod \
             is refused: retry when the API server answers"
        ),
    }
}

impl SharedLedger {
    /// A book over the ConfigMaps in `namespace`; `budget` bounds each admission's time on it.
    pub fn new(client: kube::Client, namespace: &str, budget: Duration) -> SharedLedger {
        SharedLedger {
            metrics: LedgerMetrics::default(),
            api: Api::namespaced(client, namespace),
            budget,
            teams: Default::default(),
            watched: Default::default(),
            delivered: tokio::sync::Notify::new(),
        }
    }

    /// Watches the ledger objects (label [`ledger::TEAM_LABEL`]) for as long as `self` lives,
    /// so that rounds start from the newest copy (see the module doc). Optional: without it
    /// every copy comes from a read.
    pub fn watch(self: &Arc<Self>) {
        use kube::runtime::{WatchStreamExt, watcher};
        let config = watcher::Config::default().labels(ledger::TEAM_LABEL);
        let mut events = watcher(self.api.clone(), config).default_backoff().boxed();
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let Some(ledger) = this.upgrade() else { return };
                match event {
                    Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                        ledger.keep_if_newer(object)
                    }
                    Ok(watcher::Event::Delete(object)) => {
                        if let Some(name) = &object.metadata.name {
                            ledger.watched.lock().unwrap_or_else(|e| e.into_inner()).remove(name);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "quota ledger watch error; retrying"),
                }
            }
        });
    }

    /// Keeps `object` if it is newer than the copy the watch gave before.
    fn keep_if_newer(&self, object: ConfigMap) {
        let Some(name) = object.metadata.name.clone() else { return };
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let newer = match watched.get(&name) {
            Some(old) => revision(&object) > revision(old),
            None => true,
        };
        if newer {
            watched.insert(name, object);
            drop(watched);
            self.delivered.notify_waiters();
        }
    }

    /// The watch's copy of ledger `name` if it is newer than revision `than` (any copy when
    /// `than` is `None`).
    fn watched_newer(&self, name: &str, than: Option<u64>) -> Option<ConfigMap> {
        let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let object = watched.get(name)?;
        match (revision(object), than) {
            (_, None) => Some(object.clone()),
            (Some(r), Some(than)) if r > than => Some(object.clone()),
            _ => None,
        }
    }

    /// Waits until the watch has a copy of `name` newer than `than`, at most until `until`.
    async fn await_newer(&self, name: &str, than: Option<u64>, until: tokio::time::Instant) -> Option<ConfigMap> {
        loop {
            let notified = self.delivered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(object) = self.watched_newer(name, than) {
                return Some(object);
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return None;
            }
        }
    }

    fn book(&self, team: &str) -> Arc<TeamBook> {
        let mut teams = self.teams.lock().unwrap_or_else(|e| e.into_inner());
        teams.entry(team.to_string()).or_default().clone()
    }

    /// Reads the team's ledger into `cached` (a missing object leaves an empty, unreconciled
    /// ledger: admission then refuses until the reconciler creates it).
    async fn read(&self, team: &str, cached: &mut Cached) -> Result<(), kube::Error> {
        self.metrics.reads.inc();
        match self.api.get_opt(&ledger::object_name(team)).await? {
            Some(object) => cached.adopt(object),
            None => {
                cached.ledger = Ledger::default();
                cached.object = None;
            }
        }
        Ok(())
    }

    /// Decides the queue of `book` in order and commits what it charges; answers every waiter.
    async fn commit(&self, team: &str, book: &TeamBook, cached: &mut Cached) {
        let mut batch = Vec::new();
        take_waiting(book, &mut batch);
        let Some(deadline) = batch.iter().map(|w| w.deadline).min() else { return };
        let deadline = tokio::time::Instant::from_std(deadline);
        let name = ledger::object_name(team);
        let mut fresh = false;
        // A refusal must be confirmed by a read: no copy from the watch will do then.
        let mut must_read = false;
        let started = Instant::now();
        let (mut reads, mut writes) = (0u32, 0u32);
        let answers = loop {
            if !fresh && !must_read {
                // Start from the newest copy the watch has, if it is newer than ours.
                let newer = match cached.object.as_ref() {
                    Some(ours) => revision(ours).and_then(|r| self.watched_newer(&name, Some(r))),
                    None => self.watched_newer(&name, None),
                };
                if let Some(object) = newer {
                    cached.adopt(object);
                }
            }
            if !fresh && cached.object.is_none() {
                reads += 1;
                match tokio::time::timeout_at(deadline, self.read(team, cached)).await {
                    Ok(Ok(())) => fresh = true,
                    Ok(Err(e)) => break Err(unavailable(&format!("reading {name}: {e}"))),
                    Err(_) => break Err(unavailable("no answer from the API server within the request deadline")),
                }
                // No ledger yet (a replica creates it seconds after start-up, or after a policy
                // reload adds the team): wait for it a little, within the deadline.
                let retry_at = tokio::time::Instant::now() + MISSING_LEDGER_RETRY;
                if cached.object.is_none() && retry_at + MISSING_LEDGER_RETRY < deadline {
                    tokio::time::sleep_until(retry_at).await;
                    fresh = false;
                    continue;
                }
            }
            let now = unix_now();
            let mut next = cached.ledger.clone();
            let decided: Vec<Result<Charged, Refusal>> =
                batch.iter().map(|w| next.charge(&w.quota, &w.request.borrow(), &w.key, now)).collect();
            if !fresh && (cached.object.is_none() || decided.iter().any(Result::is_err)) {
                // Refuse only from what the API server says now, not from a copy.
                cached.object = None;
                must_read = true;
                continue;
            }
            if !decided.iter().any(|d| matches!(d, Ok(Charged::New))) {
                break Ok(decided);
            }
            let Some(mut object) = cached.object.clone() else {
                break Err(unavailable(&format!("{name} does not exist")));
            };
            object.data = Some(next.to_data());
            writes += 1;
            match tokio::time::timeout_at(deadline, self.api.replace(&name, &PostParams::default(), &object)).await {
                Ok(Ok(written)) => {
                    self.metrics.commits.inc();
                    cached.object = Some(written);
                    cached.ledger = next;
                    break Ok(decided);
                }
                Ok(Err(e)) if is_conflict(&e) => {
                    // Another replica (or the reconciler) wrote first: decide again on the copy
                    // that beat this one (from the watch, else read), with whatever queued up
                    // meanwhile (under contention, rounds grow).
                    self.metrics.conflicts.inc();
                    let tried = revision(&object);
                    let grace = (tokio::time::Instant::now() + WATCH_GRACE).min(deadline);
                    match self.await_newer(&name, tried, grace).await {
                        Some(newer) => cached.adopt(newer),
                        None => cached.object = None,
                    }
                    fresh = false;
                    take_waiting(book, &mut batch);
                }
                Ok(Err(e)) => {
                    cached.object = None;
                    break Err(unavailable(&format!("updating {name}: {e}")));
                }
                Err(_) => {
                    cached.object = None;
                    break Err(unavailable("no answer from the API server within the request deadline"));
                }
            }
        };
        let took = started.elapsed();
        if took > Duration::from_millis(250) {
            tracing::info!(%team, ?took, reads, writes, admissions = batch.len(), ok = answers.is_ok(), "slow quota ledger round");
        }
        match answers {
            Ok(decided) => {
                self.metrics.decisions.inc_by(decided.len() as u64);
                for (w, d) in batch.into_iter().zip(decided) {
                    let _ = w.answer.send(d.map(|_| ()));
                }
            }
            Err(refusal) => {
                self.metrics.failures.inc();
                for w in batch {
                    let _ = w.answer.send(Err(refusal.clone()));
                }
            }
        }
    }

    /// Admits or refuses `request` through the team's queue (async: what [`QuotaBook::admit`]
    /// runs on the runtime).
    pub async fn admit_async(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        let deadline = Instant::now() + self.budget;
        let book = self.book(request.team);
        let (answer, mut receiver) = tokio::sync::oneshot::channel();
        book.waiting.lock().unwrap_or_else(|e| e.into_inner()).push(Waiting {
            quota: quota.clone(),
            request: OwnedQuotaRequest::of(request),
            key: ledger::admission_key(request),
            deadline,
            answer,
        });
        let decided = async {
            let mut cached = book.slot.lock().await;
            // A round that ran while this one waited for the slot may have answered it.
            if let Ok(answer) = receiver.try_recv() {
                return answer;
            }
            self.commit(request.team, &book, &mut cached).await;
            drop(cached);
            (&mut receiver).await.unwrap_or_else(|_| Err(unavailable("the round deciding it was cut off")))
        };
        match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), decided).await {
            Ok(answer) => answer,
            Err(_) => Err(unavailable("no decision within the request deadline")),
        }
    }

    /// Creates `team`'s ledger from `pods` (this replica's synced watch) when it does not exist
    /// yet; an existing one is left to the leader. Any replica may do this: a new ledger holds
    /// no charge a stale watch could wrongly release, only pods it adds (at worst one the leader
    /// later finds gone).
    pub async fn ensure(&self, team: &str, recount: &Recount) -> Result<(), kube::Error> {
        let book = self.book(team);
        let mut cached = book.slot.lock().await;
        self.read(team, &mut cached).await?;
        if cached.object.is_some() {
            return Ok(());
        }
        let mut ledger = Ledger::default();
        ledger.reconcile_with(recount, unix_now(), &|_| false);
        let mut object = new_object(team);
        set_reconciled(&mut object, &ledger);
        match self.api.create(&PostParams::default(), &object).await {
            Ok(o) => {
                tracing::info!(%team, pods = recount.pods(), "quota ledger created");
                cached.ledger = ledger;
                cached.object = Some(o);
                Ok(())
            }
            Err(e) if is_conflict(&e) => Ok(()), // another replica made it first
            Err(e) => Err(e),
        }
    }

    /// Brings `team`'s ledger in line with its pods as the leader sees them (creating the
    /// object when missing); writes only when something changed. Retries conflicts a few times.
    pub async fn reconcile(&self, team: &str, pods: &[SeenPod]) -> Result<Reconciled, kube::Error> {
        self.reconcile_with(team, &Recount::from_pods(pods), &|_| false).await
    }

    /// [`SharedLedger::reconcile`], releasing pending charges whose pod `deleted` says the watch
    /// saw deleted (see [`Ledger::reconcile_with`]).
    pub async fn reconcile_with(
        &self,
        team: &str,
        recount: &Recount,
        deleted: &(dyn Fn(&ledger::Entry) -> bool + Sync),
    ) -> Result<Reconciled, kube::Error> {
        let book = self.book(team);
        let mut cached = book.slot.lock().await;
        let name = ledger::object_name(team);
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.read(team, &mut cached).await?;
            let was = cached.ledger.clone();
            let mut next = cached.ledger.clone();
            let report = next.reconcile_with(recount, unix_now(), deleted);
            let exists = cached.object.is_some();
            if exists && was.reconciled && !report.changed() {
                return Ok(report);
            }
            let mut object = cached.object.clone().unwrap_or_else(|| new_object(team));
            set_reconciled(&mut object, &next);
            let written = if exists {
                self.api.replace(&name, &PostParams::default(), &object).await
            } else {
                self.api.create(&PostParams::default(), &object).await
            };
            match written {
                Ok(o) => {
                    cached.ledger = next;
                    cached.object = Some(o);
                    return Ok(report);
                }
                Err(e) if is_conflict(&e) && attempt < 5 => cached.object = None,
                Err(e) => {
                    cached.object = None;
                    return Err(e);
                }
            }
        }
    }
}

/// An empty ledger object for `team`.
fn new_object(team: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(ledger::object_name(team)),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "allot".to_string()),
                (ledger::TEAM_LABEL.to_string(), label_value(team)),
            ])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Puts `ledger` into `object`, stamped as reconciled now.
fn set_reconciled(object: &mut ConfigMap, ledger: &Ledger) {
    object.data = Some(ledger.to_data());
    object
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ledger::RECONCILED_ANNOTATION.to_string(), k8s_openapi::jiff::Timestamp::now().to_string());
}

/// Moves the team's queued admissions into `batch`, answering at once those whose deadline has
/// passed (their caller has given up: charging them would only over-count).
fn take_waiting(book: &TeamBook, batch: &mut Vec<Waiting>) {
    let now = Instant::now();
    let queued = std::mem::take(&mut *book.waiting.lock().unwrap_or_else(|e| e.into_inner()));
    for w in queued {
        if w.deadline <= now {
            let _ = w.answer.send(Err(unavailable("the request deadline passed while it waited")));
        } else {
            batch.push(w);
        }
    }
}

/// A label value naming the team (63 characters of `[-._a-zA-Z0-9]`; others become `-`).
fn label_value(team: &str) -> String {
    let value: String =
        team.chars().take(63).map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '-' }).collect();
    value.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

fn parse(object: &ConfigMap) -> Ledger {
    let reconciled =
        object.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ledger::RECONCILED_ANNOTATION));
    Ledger::from_data(object.data.as_ref().unwrap_or(&BTreeMap::new()), reconciled)
}

/// The deny-mode team of `namespace` and its quota, if any.
fn deny_team_of(
    policies: &crate::policy::PolicySet,
    labels: &dyn crate::namespaces::NamespaceLabels,
    namespace: &str,
) -> Option<(String, Quota)> {
    let t = crate::namespaces::team_of(policies, namespace, labels).team?;
    let q = t.quota.as_ref().filter(|q| q.mode == crate::policy::QuotaMode::Deny)?;
    Some((t.name.clone(), q.clone()))
}

/// What the ledger counts of `pod` under `quota`: its counted requests, unless it has none and
/// no gang (the admission book charges nothing for it).
fn counted_pod(pod: &crate::cluster::PodRecord, quota: &Quota) -> Option<ResourceList> {
    let requests: ResourceList = pod.request_pairs().map(|(k, v)| (k.to_string(), v)).collect();
    let requests = ledger::counted(quota, &requests);
    (!requests.is_empty() || pod.gang.is_some()).then_some(requests)
}

/// Each deny-mode team's pods in `view`, counted as the reconciler matches them (those the
/// admission book charges: they request something the quota counts, or belong to a gang), in
/// one pass and without copying them.
pub fn recount_by_team(
    view: &crate::cluster::ClusterView<'_>,
    policies: &crate::policy::PolicySet,
    labels: &dyn crate::namespaces::NamespaceLabels,
) -> BTreeMap<String, Recount> {
    let mut out: BTreeMap<String, Recount> = policies
        .teams
        .iter()
        .filter(|t| t.quota.as_ref().is_some_and(|q| q.mode == crate::policy::QuotaMode::Deny))
        .map(|t| (t.name.clone(), Recount::default()))
        .collect();
    let mut team_of: HashMap<String, Option<(String, Quota)>> = HashMap::new();
    for pod in view.pods() {
        let team = match team_of.get(&*pod.namespace) {
            Some(team) => team,
            None => team_of
                .entry(pod.namespace.to_string())
                .or_insert_with(|| deny_team_of(policies, labels, &pod.namespace)),
        };
        let Some((team, quota)) = team else { continue };
        let Some(requests) = counted_pod(pod, quota) else { continue };
        if let Some(recount) = out.get_mut(team.as_str()) {
            let counted = CountedPod {
                namespace: &pod.namespace,
                name: &pod.name,
                created: pod.created,
                finished: pod.finished,
                terminating: pod.terminating,
                gang: pod.gang.as_ref().map(|g| (g.name.as_str(), g.size)),
            };
            recount.add(&counted, requests);
        }
    }
    out
}

/// How long an admission waits before it reads a missing ledger again.
const MISSING_LEDGER_RETRY: Duration = Duration::from_millis(100);

/// How often the leader looks at its watch for changes to reconcile.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);

/// What the reconciler asks of the server.
pub struct ReconcilerHooks {
    /// This replica holds the gang controller's Lease.
    pub leading: Box<dyn Fn() -> bool + Send + Sync>,
    /// Its Pod and Namespace watches have synced.
    pub ready: Box<dyn Fn() -> bool + Send + Sync>,
    /// Called once every deny-mode team has a ledger (this replica is then ready to answer).
    pub ledgers_exist: Box<dyn Fn() + Send + Sync>,
}

/// On every replica, once its watches have synced: creates the ledgers that do not exist yet
/// (after start-up and after each policy reload). On the leader: reconciles every deny-mode
/// team's ledger at once when the watch or the policies changed, else every 10 s (pending
/// charges expire with time alone).
pub fn spawn_reconciler(
    ledger: Arc<SharedLedger>,
    state: Arc<crate::cluster::ClusterState>,
    policies: Arc<arc_swap::ArcSwap<crate::policy::PolicySet>>,
    labels: Arc<dyn crate::namespaces::NamespaceLabels>,
    hooks: ReconcilerHooks,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Option<(u64, String, Instant)> = None;
        let mut ensured: Option<String> = None;
        loop {
            if !(hooks.ready)() || state.relisting() {
                last = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let current = policies.load_full();
            if ensured.as_deref() != Some(current.version.as_str()) {
                let teams = recount_by_team(&state.view(), &current, labels.as_ref());
                let mut all = true;
                for (team, recount) in &teams {
                    if let Err(e) = ledger.ensure(team, recount).await {
                        all = false;
                        tracing::warn!(%team, error = %e, "cannot create the quota ledger yet; retrying");
                    }
                }
                if all {
                    tracing::info!(teams = teams.len(), "every deny-mode team has a quota ledger");
                    ensured = Some(current.version.clone());
                    (hooks.ledgers_exist)();
                }
            }
            tokio::time::sleep(RECONCILE_INTERVAL).await;
            if !(hooks.leading)() {
                last = None;
                continue;
            }
            // Mid-relist the view lacks pods it has not seen again: their charges would be
            // released (a quota overshoot). Wait for the list to end.
            if state.relisting() {
                continue;
            }
            let current = policies.load_full();
            let generation = state.generation();
            if let Some((g, v, at)) = &last
                && *g == generation
                && *v == current.version
                && at.elapsed() < Duration::from_secs(10)
            {
                continue;
            }
            let teams = recount_by_team(&state.view(), &current, labels.as_ref());
            let mut clean = true;
            // A pending charge whose pod the watch saw deleted since it was charged.
            let (now_unix, now) = (unix_now(), Instant::now());
            let store = state.clone();
            let deleted = move |e: &ledger::Entry| {
                // `at` has whole seconds: a charge made at 10.9 s reads as 10 s. Counting back one
                // second more keeps a pod charged, created and deleted within the second of the
                // reconcile from holding its charge until it expires (120 s of spurious usage).
                // The cost: a same-name pod deleted up to 1 s before a new one was charged
                // releases the new charge until the leader sees that pod (the next reconcile).
                let ago = Duration::from_secs(u64::try_from(now_unix.saturating_sub(e.at)).unwrap_or(0) + 1);
                now.checked_sub(ago).is_some_and(|since| store.removed_since(&e.namespace, &e.name, since))
            };
            for (team, recount) in &teams {
                match ledger.reconcile_with(team, recount, &deleted).await {
                    Ok(report) if report.changed() => {
                        tracing::info!(%team, pods = recount.pods(), ?report, "quota ledger reconciled");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        clean = false;
                        tracing::warn!(%team, error = %e, "quota ledger reconcile failed; retrying");
                    }
                }
            }
            last = clean.then(|| (generation, current.version.clone(), Instant::now()));
        }
    })
}
