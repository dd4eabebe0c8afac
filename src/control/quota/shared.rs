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
//! Allowances: a round that admits a plain pod also sets aside, for this replica, 1/8 of what
//! the team has free (in whole pods of the shape it just admitted, at most 64) as an
//! [`Allowance`] in the ledger: usage for every other writer, so charges and allowances together
//! never pass the limit. Later pods of that shape are admitted from it in memory, with no round
//! trip ([`Headroom`]); the flusher ([`SharedLedger::spawn_flusher`]) writes their charges every
//! [`FLUSH_INTERVAL`] in the same write that shrinks the allowance by them, so the pods move from
//! allowance to pending charge without a moment uncounted. Only rounds that decide such a pod
//! (and the flusher's renewals) grant: a round of gang members alone gives the allowance back,
//! the capacity being what those members ask for. A refusal that only allowances cause
//! is never given: this replica's own stops growing, the others are asked back (a `drain` request
//! in the ledger, which their watches deliver; no grants for 5 s after one) and the admission
//! waits for the next version. An allowance is used for [`ALLOWANCE_USABLE`] after the write that
//! renewed it and stays in the ledger for [`ALLOWANCE_TTL_SECS`]: a replica that dies with one
//! leaves its pods covered until the leader folds them, then the leader drops it (over-count for
//! seconds, never under-count). A replica that stops gives its allowances back
//! ([`SharedLedger::give_back`]).
//!
//! Cohorts: the teams of a deny-mode cohort keep their ledgers as parts of one object, the
//! cohort's ([`scope`], [`ledger::parts`]), so that a borrowing admission is decided against
//! every team's usage and committed in the same guarded write: two replicas cannot lend the
//! same unused quota twice. Each team keeps its own queue and write slot on the object (rounds
//! of two teams conflict like rounds of two replicas), and takes no allowance.
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

use super::ledger::{self, Ledger, Reconciled, Recount, SeenPod};
use crate::admission::quota::{OwnedQuotaRequest, QuotaRequest, Refusal};
use crate::model::clock::unix_now;
use crate::model::policy::cohort::Cohort;
use crate::model::policy::quota::Quota;

mod headroom;
mod kept;
mod reconciler;
mod round;
mod scope;

use headroom::*;
pub use kept::recount_kept;
use reconciler::*;
pub use reconciler::{ReconcilerHooks, recount_by_team, recount_by_team_at, spawn_reconciler};
use scope::Scope;

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
    /// Admissions answered from this replica's allowance, without a round trip.
    pub allowance_admissions: prometheus_client::metrics::counter::Counter,
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
    /// The data key of this process's allowances (random per process: a restarted replica
    /// never takes over the allowance of its former self, which the leader lets expire).
    holder: String,
    /// Wakes the flusher before its next tick (a drain request arrived).
    flush_now: tokio::sync::Notify,
}

/// How long a round that lost a write (409) waits for the watch to deliver the copy that beat
/// it before it reads the ledger itself.
const WATCH_GRACE: Duration = Duration::from_millis(50);

/// A resourceVersion as a number (etcd's revision, what every API server in practice sends);
/// `None` for one that is not, which is then never taken for newer.
fn revision(object: &ConfigMap) -> Option<u64> {
    object.metadata.resource_version.as_deref()?.parse().ok()
}

/// One team's queue, write slot and allowance on this replica.
#[derive(Default)]
struct TeamBook {
    waiting: Mutex<Vec<Waiting>>,
    slot: tokio::sync::Mutex<Cached>,
    headroom: Mutex<Headroom>,
    /// Where its ledger is kept, as the policies last said (its own object, or its cohort's).
    scope: Mutex<Scope>,
}

impl TeamBook {
    fn headroom(&self) -> std::sync::MutexGuard<'_, Headroom> {
        self.headroom.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn scope(&self) -> Scope {
        self.scope.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets where the team's ledger is kept (a policy reload may move it into or out of a
    /// cohort's).
    /// Keeps the book's ledger where `cohort` says (a policy reload may move a team into a
    /// cohort, out of one, or change its members); unchanged on every other admission.
    fn follow_cohort(&self, team: &str, cohort: Option<&Cohort>) {
        let mut scope = self.scope.lock().unwrap_or_else(|e| e.into_inner());
        if !scope.serves(team, cohort) {
            *scope = Scope::of(team, cohort);
        }
    }
}

/// An allowance is admitted from for this long after the write that last renewed it; the
/// ledger keeps it for [`ALLOWANCE_TTL_SECS`]. The difference covers a pod's way from its
/// admission to the leader's fold (the request deadline, [`ledger::FOLD_DELAY_SECS`], a
/// reconcile) and clocks that disagree by seconds.
const ALLOWANCE_USABLE: Duration = Duration::from_secs(3);

/// An allowance in use is renewed when less than this is left of its usable time.
const ALLOWANCE_RENEW: Duration = Duration::from_millis(1500);

/// A round keeps the allowance's expiry as written when it was written this recently (seconds)
/// and its amounts do not change: no write just to move it.
const ALLOWANCE_REWRITE_SECS: i64 = 2;

/// An allowance unused for this long is given back.
const ALLOWANCE_IDLE: Duration = Duration::from_secs(2);

/// How often the flusher writes the charges of pods admitted from allowances.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// A grant is at most 1/`GRANT_SHARE` of what the team has free...
const GRANT_SHARE: i128 = 8;

/// ...and at most this many pods of the shape it is sized for.
const GRANT_MAX_PODS: i128 = 64;

/// No allowance is granted while a drain request is younger than this (milliseconds).
const DRAIN_HOLD_MS: i64 = 5_000;

/// A refusal that only allowances cause waits for them to be given back, unless its deadline is
/// this close: then it is given.
const DRAIN_LAST_CHANCE: Duration = Duration::from_millis(150);

/// How long an admission deferred behind allowances waits for the ledger to change before it
/// looks again.
const DRAIN_RETRY: Duration = Duration::from_millis(50);

/// The last copy of the ledger this replica read or wrote: where an optimistic write starts.
#[derive(Default)]
struct Cached {
    object: Option<ConfigMap>,
    ledger: Ledger,
    /// What the cohort's other teams use, in this copy (empty for a team in none).
    others: BTreeMap<String, crate::model::resources::ResourceList>,
    /// The team's part of a cohort's ledger carries the reconciler's mark.
    marked: bool,
    /// The scope the copy was read in.
    scope: Scope,
}

impl Cached {
    /// Takes `object` (read, or delivered by the watch) as the copy to start from.
    fn adopt(&mut self, object: ConfigMap) {
        let parsed = self.scope.parse(&object);
        (self.ledger, self.others, self.marked) = (parsed.ledger, parsed.others, parsed.marked);
        self.object = Some(object);
    }

    /// Follows `scope` (the book's): a copy read in another scope is dropped.
    fn follow(&mut self, scope: Scope) {
        if self.scope != scope {
            *self = Cached { scope, ..Cached::default() };
        }
    }
}

struct Waiting {
    quota: Quota,
    request: OwnedQuotaRequest,
    key: String,
    deadline: Instant,
    answer: tokio::sync::oneshot::Sender<Result<(), Refusal>>,
}

fn unix_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
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
            holder: ledger::allowance_key(&format!("{:016x}", random_u64())),
            flush_now: tokio::sync::Notify::new(),
        }
    }

    /// Gives every allowance back and writes what was admitted from them (on shutdown, once no
    /// request is in flight: the other replicas then have the capacity at once rather than when
    /// the allowances expire).
    pub async fn give_back(&self) {
        for (team, book) in self.books() {
            book.headroom().closing = true;
            let mut cached = book.slot.lock().await;
            self.commit(&team, &book, &mut cached).await;
        }
    }

    /// Writes the charges of pods admitted from this replica's allowances every
    /// [`FLUSH_INTERVAL`], and gives allowances back when asked, idle or stale; for as long as
    /// `self` lives. Without it those writes wait for the team's next admission round.
    pub fn spawn_flusher(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(ledger) = this.upgrade() else { return };
                let woken = ledger.flush_now.notified();
                let _ = tokio::time::timeout(FLUSH_INTERVAL, woken).await;
                for (team, book) in ledger.books() {
                    if book.headroom().wants_round(Instant::now()) {
                        let mut cached = book.slot.lock().await;
                        ledger.commit(&team, &book, &mut cached).await;
                    }
                }
            }
        });
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
            let drain = object.data.as_ref().and_then(ledger::drain_requested_in);
            watched.insert(name.clone(), object);
            drop(watched);
            self.delivered.notify_waiters();
            if let Some(at) = drain {
                let mut books = self.books().into_iter().filter(|(_, b)| b.scope().object == name);
                if books.any(|(_, b)| b.headroom().note_drain(at)) {
                    self.flush_now.notify_one();
                }
            }
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

    /// Every team's book so far, copied out of the lock.
    fn books(&self) -> Vec<(String, Arc<TeamBook>)> {
        let teams = self.teams.lock().unwrap_or_else(|e| e.into_inner());
        teams.iter().map(|(t, b)| (t.clone(), b.clone())).collect()
    }

    fn book(&self, team: &str) -> Arc<TeamBook> {
        let mut teams = self.teams.lock().unwrap_or_else(|e| e.into_inner());
        teams
            .entry(team.to_string())
            .or_insert_with(|| Arc::new(TeamBook { scope: Mutex::new(Scope::of(team, None)), ..TeamBook::default() }))
            .clone()
    }

    /// The book of `team`, its ledger kept where `cohort` says (its cohort's, or its own).
    fn book_in(&self, team: &str, cohort: Option<&Cohort>) -> Arc<TeamBook> {
        let book = self.book(team);
        book.follow_cohort(team, cohort);
        book
    }

    /// Reads the team's ledger into `cached` (a missing object leaves an empty, unreconciled
    /// ledger: admission then refuses until the reconciler creates it).
    async fn read(&self, cached: &mut Cached) -> Result<(), kube::Error> {
        self.metrics.reads.inc();
        match self.api.get_opt(&cached.scope.object).await? {
            Some(object) => cached.adopt(object),
            None => {
                cached.ledger = Ledger::default();
                cached.others.clear();
                cached.marked = false;
                cached.object = None;
            }
        }
        Ok(())
    }

    /// Admits or refuses `request`: from this replica's allowance when it covers the pod (no
    /// round trip), else through the team's queue (async: what [`QuotaBook::admit`] runs on the
    /// runtime).
    pub async fn admit_async(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        let deadline = Instant::now() + self.budget;
        let book = self.book_in(request.team, request.cohort);
        let key = ledger::admission_key(request);
        // (A team of a cohort holds no allowance; one kept from before it joined is not used.)
        if request.cohort.is_none() && book.headroom().admit(quota, request, &key, Instant::now()) {
            self.metrics.allowance_admissions.inc();
            return Ok(());
        }
        let (answer, mut receiver) = tokio::sync::oneshot::channel();
        book.waiting.lock().unwrap_or_else(|e| e.into_inner()).push(Waiting {
            quota: quota.clone(),
            request: OwnedQuotaRequest::of(request),
            key,
            deadline,
            answer,
        });
        let decided = async {
            loop {
                let mut cached = book.slot.lock().await;
                // A round that ran while this one waited for the slot may have answered it.
                match receiver.try_recv() {
                    Ok(answer) => return answer,
                    Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                        return Err(unavailable("the round deciding it was cut off"));
                    }
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
                }
                self.commit(request.team, &book, &mut cached).await;
                drop(cached);
                match receiver.try_recv() {
                    Ok(answer) => return answer,
                    Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                        return Err(unavailable("the round deciding it was cut off"));
                    }
                    // Deferred behind other replicas' allowances: decide again once the ledger
                    // changes (they give them back on the drain request), or shortly.
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                        let _ = tokio::time::timeout(DRAIN_RETRY, self.delivered.notified()).await;
                    }
                }
            }
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
    pub async fn ensure(&self, team: &str, cohort: Option<&Cohort>, recount: &Recount) -> Result<(), kube::Error> {
        let book = self.book_in(team, cohort);
        let mut cached = book.slot.lock().await;
        cached.follow(book.scope());
        for attempt in 1.. {
            self.read(&mut cached).await?;
            if cached.object.is_some() && cached.marked {
                return Ok(());
            }
            // A new object; or a cohort's without this team's part (it just joined), which is
            // made the same way: nothing can be charged in it yet (admission refuses until it
            // exists), so this replica's watch cannot release anything it should not.
            let mut ledger = Ledger::default();
            ledger.reconcile_with(recount, unix_now(), &|_| false);
            let mut object = cached.object.clone().unwrap_or_else(|| new_object(&cached.scope));
            set_reconciled(&mut object, &cached.scope, &ledger);
            let written = match &cached.object {
                Some(_) => self.api.replace(&cached.scope.object, &PostParams::default(), &object).await,
                None => self.api.create(&PostParams::default(), &object).await,
            };
            match written {
                Ok(o) => {
                    tracing::info!(%team, object = %cached.scope.object, pods = recount.pods(), "quota ledger created");
                    cached.adopt(o);
                    return Ok(());
                }
                // Another replica wrote first: look again (it may have made this very part).
                Err(e) if is_conflict(&e) && attempt < 5 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The pods (namespace, name) of the pending charges in this replica's last copy of
    /// `team`'s ledger: those the leader's recount looks up by name.
    pub async fn pending_pods(&self, team: &str, cohort: Option<&Cohort>) -> Vec<(String, String)> {
        let book = self.book_in(team, cohort);
        let mut cached = book.slot.lock().await;
        cached.follow(book.scope());
        cached.ledger.entries().map(|(_, e)| (e.namespace.clone(), e.name.clone())).collect()
    }

    /// Brings `team`'s ledger in line with its pods as the leader sees them (creating the
    /// object when missing); writes only when something changed. Retries conflicts a few times.
    pub async fn reconcile(&self, team: &str, pods: &[SeenPod]) -> Result<Reconciled, kube::Error> {
        self.reconcile_with(team, None, &Recount::from_pods(pods), &|_| false).await
    }

    /// [`SharedLedger::reconcile`], releasing pending charges whose pod `deleted` says the watch
    /// saw deleted (see [`Ledger::reconcile_with`]).
    pub async fn reconcile_with(
        &self,
        team: &str,
        cohort: Option<&Cohort>,
        recount: &Recount,
        deleted: &(dyn Fn(&ledger::Entry) -> bool + Sync),
    ) -> Result<Reconciled, kube::Error> {
        let book = self.book_in(team, cohort);
        let mut cached = book.slot.lock().await;
        cached.follow(book.scope());
        let name = cached.scope.object.clone();
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.read(&mut cached).await?;
            // (A ledger last reconciled by an older leader is stamped again, so that replicas
            // may grant allowances on it and charge shared claims once.)
            let was = &cached.ledger;
            let stamped = was.reconciled && was.allowances_known && was.claims_known;
            // Reconciled in place, not on a copy: with a thousand gangs waiting a team's ledger
            // holds a tally for each, and its copies were a pass's largest allocations (issue
            // 49). Unchanged, it is as it was; changed, the object is taken out first, so that
            // until the write's answer is adopted (or if this future is dropped while it waits)
            // the book holds no object and its next user reads the ledger again.
            let report = cached.ledger.reconcile_with(recount, unix_now(), deleted);
            let exists = cached.object.is_some();
            if exists && cached.marked && stamped && !report.changed() {
                return Ok(report);
            }
            let mut object = cached.object.take().unwrap_or_else(|| new_object(&cached.scope));
            set_reconciled(&mut object, &cached.scope, &cached.ledger);
            let written = if exists {
                self.api.replace(&name, &PostParams::default(), &object).await
            } else {
                self.api.create(&PostParams::default(), &object).await
            };
            match written {
                Ok(o) => {
                    // (Read back from what was written: its annotations too.)
                    cached.adopt(o);
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

/// A number no other process is likely to draw (the allowance holder's name).
fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one((std::process::id(), unix_now_ms(), Instant::now()))
}

/// An empty ledger object where `scope` says.
fn new_object(scope: &Scope) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(scope.object.clone()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "allot".to_string()),
                (ledger::TEAM_LABEL.to_string(), scope.label.clone()),
            ])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Puts `ledger` into `object` (its part, in a cohort's), stamped as reconciled now (by a
/// leader that knows allowances).
fn set_reconciled(object: &mut ConfigMap, scope: &Scope, ledger: &Ledger) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    object.data = Some(scope.data(Some(object), ledger, Some(&now)));
    let annotations = object.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(ledger::RECONCILED_ANNOTATION.to_string(), now.clone());
    annotations.insert(ledger::ALLOWANCES_ANNOTATION.to_string(), now.clone());
    annotations.insert(ledger::CLAIMS_ANNOTATION.to_string(), now);
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
pub(super) fn label_value(team: &str) -> String {
    let value: String =
        team.chars().take(63).map(|c| if c.is_ascii_alphanumeric() || "-._".contains(c) { c } else { '-' }).collect();
    value.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// The reservation step of an admission ([`crate::admission::reserve`]) asks the shared ledger.
impl crate::admission::reserve::Reservations for SharedLedger {
    fn reserve(
        &self,
        quota: &Quota,
        request: &QuotaRequest<'_>,
    ) -> impl std::future::Future<Output = Result<(), Refusal>> + Send {
        self.admit_async(quota, request)
    }
}

#[cfg(test)]
mod tests;
