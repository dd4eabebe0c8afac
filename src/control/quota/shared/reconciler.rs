//! The deny-mode ledgers' reconciler: recounts each team's usage from the watched pods and
//! corrects its ledger (what a replica charged for pods that never came, or were deleted). The
//! recount reads the groups the watch keeps ([`super::recount_kept`]); the walk over every pod
//! ([`recount_by_team`]) stays as the reference it is tested and measured against.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ledger::{self, CountedPod, Recount};
use crate::control::cluster::ClusterState;
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::PolicySet;
use crate::model::policy::quota::Quota;
use crate::model::resources::ResourceList;

use super::*;

/// The deny-mode team of `namespace` and its quota, if any.
pub(super) fn deny_team_of(
    policies: &crate::model::policy::PolicySet,
    labels: &dyn crate::model::namespaces::NamespaceLabels,
    namespace: &str,
) -> Option<(String, Quota)> {
    let t = crate::model::namespaces::team_of(policies, namespace, labels).team.filter(|t| deny_team(t))?;
    Some((t.name.clone(), t.quota.clone()?))
}

/// The team keeps a deny-mode quota (a ledger).
pub(super) fn deny_team(team: &crate::model::policy::Team) -> bool {
    team.quota.as_ref().is_some_and(|q| q.mode == crate::model::policy::QuotaMode::Deny)
}

/// What the ledger counts of `pod` under `quota`: its counted requests and shared claims,
/// unless it has none of either and no gang (the admission book charges nothing for it).
///
/// Runs for every pod in the reference walk, and for the young and looked-up pods of a kept
/// recount: only what the quota counts is copied ([`ledger::counted`] on the pod's requests,
/// without a copy of them all first).
pub(super) fn counted_pod(
    pod: &crate::control::cluster::PodRecord,
    quota: &Quota,
) -> Option<(ResourceList, crate::model::dra::SharedClaims)> {
    let requests = ledger::counted_pairs(quota, pod.request_pairs());
    let claims: crate::model::dra::SharedClaims =
        pod.held_claims().iter().map(|h| (h.name.to_string(), h.device_list())).collect();
    let claims = ledger::counted_claims(quota, &claims);
    (!requests.is_empty() || !claims.is_empty() || pod.gang.is_some()).then_some((requests, claims))
}

/// Each deny-mode team's pods in `view`, counted as the reconciler matches them (those the
/// admission book charges: they request something the quota counts, or belong to a gang), in
/// one pass over every pod and without copying them: the reference for [`super::recount_kept`].
pub fn recount_by_team(
    view: &crate::control::cluster::ClusterView<'_>,
    policies: &crate::model::policy::PolicySet,
    labels: &dyn crate::model::namespaces::NamespaceLabels,
) -> BTreeMap<String, Recount> {
    recount_by_team_at(view, policies, labels, unix_now())
}

/// [`recount_by_team`] at `now` (unix seconds).
pub fn recount_by_team_at(
    view: &crate::control::cluster::ClusterView<'_>,
    policies: &crate::model::policy::PolicySet,
    labels: &dyn crate::model::namespaces::NamespaceLabels,
    now: i64,
) -> BTreeMap<String, Recount> {
    let mut out: BTreeMap<String, Recount> =
        policies.teams.iter().filter(|t| deny_team(t)).map(|t| (t.name.clone(), Recount::at(now))).collect();
    if out.is_empty() {
        // No deny-mode team: nothing to count, and no walk over every pod.
        return out;
    }
    // Keyed by the address of the record's namespace, which records share (interned): no
    // hashing and comparing of the namespace's text per pod. Two records naming one namespace
    // through two allocations would only make two entries with the same team.
    let mut team_of: HashMap<*const u8, Option<(String, Quota)>> = HashMap::new();
    for pod in view.pods() {
        let team =
            team_of.entry(pod.namespace.as_ptr()).or_insert_with(|| deny_team_of(policies, labels, &pod.namespace));
        let Some((team, quota)) = team else { continue };
        let Some((requests, claims)) = counted_pod(pod, quota) else { continue };
        if let Some(recount) = out.get_mut(team.as_str()) {
            let counted = CountedPod {
                namespace: &pod.namespace,
                name: &pod.name,
                created: pod.created,
                finished: pod.finished,
                terminating: pod.terminating,
                gang: pod.gang.as_ref().map(|g| (g.name.as_str(), g.size)),
            };
            recount.add(&counted, requests, claims);
        }
    }
    out
}

/// Whether a pending charge whose pod the leader's recount did not find was the charge of a pod
/// the watch saw deleted (`removed_since(t)`: a pod of its name was removed at or after `t`): it
/// is released then, not at expiry.
///
/// `at` has whole seconds: a charge made at 10.9 s reads as 10 s, so a removal up to a second
/// before the charge looks like one after it. Were the charge released at once, a tenant who
/// deletes pod `x` and creates `x` again asking more would see the new charge released before
/// the leader's watch shows the new `x`, which then, too young to fold ([`ledger::FOLD_DELAY_SECS`]),
/// is counted nowhere for seconds: room for another pod past the quota. So a charge is released
/// this way only once it is older than the fold delay: by then a pod created under it is in the
/// watch (the recount finds it, and this is not asked), and a pod deleted before the leader
/// looked holds its charge a few seconds, not until it expires (120 s of spurious usage).
/// `None`: a removal was seen, but the charge is too young to tell whose (look again soon).
pub(super) fn charge_of_a_deleted_pod(
    e: &ledger::Entry,
    now_unix: i64,
    now: Instant,
    removed_since: impl Fn(Instant) -> bool,
) -> Option<bool> {
    let age = now_unix.saturating_sub(e.at);
    let ago = Duration::from_secs(u64::try_from(age).unwrap_or(0) + 1);
    let removed = now.checked_sub(ago).is_some_and(removed_since);
    match (removed, age > ledger::FOLD_DELAY_SECS) {
        (false, _) => Some(false),
        (true, true) => Some(true),
        (true, false) => None,
    }
}

/// How long an admission waits before it reads a missing ledger again.
pub(super) const MISSING_LEDGER_RETRY: Duration = Duration::from_millis(100);

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
    state: Arc<ClusterState>,
    policies: Arc<arc_swap::ArcSwap<PolicySet>>,
    labels: Arc<dyn NamespaceLabels>,
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
            if ensured.as_deref() != Some(current.version.as_str())
                && ensure_ledgers(&ledger, &state, &current, labels.as_ref()).await
            {
                ensured = Some(current.version.clone());
                (hooks.ledgers_exist)();
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
            let Some(teams) = recount_off_the_workers(&ledger, &state, &current, &labels).await else {
                continue;
            };
            let clean = reconcile_teams(&ledger, &state, &current, &teams).await;
            last = clean.then(|| (generation, current.version.clone(), Instant::now()));
        }
    })
}

/// Creates the ledger of every deny-mode team that has none; whether all exist now.
async fn ensure_ledgers(
    ledger: &SharedLedger,
    state: &ClusterState,
    current: &PolicySet,
    labels: &dyn NamespaceLabels,
) -> bool {
    // (A new ledger holds no pending charge: no pod is looked up by name.)
    let teams = recount_kept(&state.view(), current, labels, &BTreeMap::new(), unix_now());
    let mut all = true;
    for (team, recount) in &teams {
        if let Err(e) = ledger.ensure(team, current.cohorts.of_team(team), recount).await {
            all = false;
            tracing::warn!(%team, error = %e, "cannot create the quota ledger yet; retrying");
        }
    }
    if all {
        tracing::info!(teams = teams.len(), "every deny-mode team has a quota ledger");
    }
    all
}

/// Every deny-mode team's recount, or `None` when a relist began or the recount failed: read
/// from the groups the watch keeps ([`recount_kept`]), with the pods of the pending charges in
/// this replica's copy of each ledger looked up by name. Under the view's read lock, on a
/// blocking thread: never on the async workers that answer admission.
async fn recount_off_the_workers(
    ledger: &SharedLedger,
    state: &Arc<ClusterState>,
    current: &Arc<PolicySet>,
    labels: &Arc<dyn NamespaceLabels>,
) -> Option<BTreeMap<String, Recount>> {
    let mut asked = BTreeMap::new();
    for team in current.teams.iter().filter(|t| deny_team(t)) {
        let pods = ledger.pending_pods(&team.name, current.cohorts.of_team(&team.name)).await;
        asked.insert(team.name.clone(), pods);
    }
    let (state, current, labels) = (state.clone(), current.clone(), labels.clone());
    // The relist check again, under the view's own lock: one may have begun since.
    let recount = move || {
        let view = state.view();
        (!view.relisting()).then(|| recount_kept(&view, &current, labels.as_ref(), &asked, unix_now()))
    };
    match tokio::task::spawn_blocking(recount).await {
        Ok(teams) => teams,
        Err(e) => {
            tracing::error!(error = %e, "the quota recount failed; retrying");
            None
        }
    }
}

/// Reconciles every team's ledger with its recount; whether all came out clean (nothing left
/// that needs another look within a second).
async fn reconcile_teams(
    ledger: &SharedLedger,
    state: &ClusterState,
    current: &PolicySet,
    teams: &BTreeMap<String, Recount>,
) -> bool {
    let mut clean = true;
    // A pending charge whose pod the watch saw deleted since it was charged.
    let (now_unix, now) = (unix_now(), Instant::now());
    // A release put off (a removal seen, the charge too young to tell whose): looked at
    // again within a second, not at the next 10 s reconcile.
    let put_off = std::sync::atomic::AtomicBool::new(false);
    let deleted = |e: &ledger::Entry| {
        let released =
            charge_of_a_deleted_pod(e, now_unix, now, |since| state.removed_since(&e.namespace, &e.name, since));
        if released.is_none() {
            put_off.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        released == Some(true)
    };
    for (team, recount) in teams {
        // Pods too young to fold, and allowances (their holder may stop renewing them),
        // need another look within a second even if nothing else changes.
        if recount.young() > 0 {
            clean = false;
        }
        let reconciled = ledger.reconcile_with(team, current.cohorts.of_team(team), recount, &deleted).await;
        if put_off.load(std::sync::atomic::Ordering::Relaxed) {
            clean = false;
        }
        match reconciled {
            Ok(report) => {
                if report.changed() {
                    tracing::info!(%team, pods = recount.pods(), ?report, "quota ledger reconciled");
                }
                if report.allowances_held > 0 || report.not_looked_up > 0 {
                    clean = false;
                }
            }
            Err(e) => {
                clean = false;
                tracing::warn!(%team, error = %e, "quota ledger reconcile failed; retrying");
            }
        }
    }
    clean
}
