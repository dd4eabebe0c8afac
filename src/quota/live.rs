//! Deny-mode quota in `allot serve`, over the live cluster view.

use std::collections::BTreeMap;

use super::{Charge, Exceeded, Quota, QuotaBook, QuotaRequest, add, effective_charge};
use crate::cluster::ClusterState;
use crate::quantity::Quantity;
use crate::resources::ResourceList;

/// Deny-mode quota in `allot serve`: usage from the controller's Pod watch plus an in-process
/// ledger of pods admitted but not yet seen in the watch, keyed by the AdmissionRequest uid (the
/// API server retries with the same uid, so a retry is not charged twice). Check-and-reserve is
/// one critical section: concurrent admissions cannot race past a limit. The ledger is per
/// replica (see README, "Quotas").
pub struct LiveQuota {
    pub state: std::sync::Arc<ClusterState>,
    pub policies: std::sync::Arc<arc_swap::ArcSwap<crate::policy::PolicySet>>,
    pub namespaces: std::sync::Arc<dyn crate::namespaces::NamespaceLabels>,
    ledger: std::sync::Mutex<BTreeMap<String, Pending>>,
    /// namespace → team, for one policy version, refreshed every few seconds (namespace labels
    /// change): resolving every namespace's team on every admission costs more than the rest.
    teams: std::sync::Mutex<TeamCache>,
}

#[derive(Default)]
struct TeamCache {
    version: String,
    at: Option<std::time::Instant>,
    team_of: std::collections::HashMap<String, Option<String>>,
}

const TEAM_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, Clone)]
struct Pending {
    team: String,
    namespace: String,
    pod: String,
    /// In resource terms (charge units depend on the quota, which a reload may change).
    resources: ResourceList,
    gang: Option<(String, String)>,
    at: std::time::Instant,
}

/// How long a reservation waits for its pod to show up in the watch (a later webhook or the API
/// server may still have refused the pod).
const PENDING_TTL: std::time::Duration = std::time::Duration::from_secs(60);

impl LiveQuota {
    /// A book over the controller's state.
    pub fn new(
        state: std::sync::Arc<ClusterState>,
        policies: std::sync::Arc<arc_swap::ArcSwap<crate::policy::PolicySet>>,
        namespaces: std::sync::Arc<dyn crate::namespaces::NamespaceLabels>,
    ) -> LiveQuota {
        LiveQuota { state, policies, namespaces, ledger: Default::default(), teams: Default::default() }
    }
}

fn to_resources(quota: &Quota, charge: &Charge) -> ResourceList {
    charge.iter().map(|(k, v)| (k.clone(), Quantity::from_nanos(v / quota.denominator))).collect()
}

impl QuotaBook for LiveQuota {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), (Exceeded, Vec<String>)> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if !request.uid.is_empty() && ledger.contains_key(request.uid) {
            return Ok(()); // a retry of an admitted request
        }
        let now = std::time::Instant::now();
        ledger.retain(|_, p| now.duration_since(p.at) < PENDING_TTL && !self.state.has_pod(&p.namespace, &p.pod));
        let policies = self.policies.load();
        let mut cache = self.teams.lock().unwrap_or_else(|e| e.into_inner());
        if cache.version != policies.version || cache.at.is_none_or(|t| now.duration_since(t) > TEAM_CACHE_TTL) {
            *cache = TeamCache { version: policies.version.clone(), at: Some(now), team_of: Default::default() };
        }
        let (usage, seen) = self.state.usage_where(&mut |ns| {
            let team = cache.team_of.entry(ns.to_string()).or_insert_with(|| {
                crate::namespaces::team_of(&policies, ns, self.namespaces.as_ref()).team.map(|t| t.name.clone())
            });
            team.as_deref() == Some(request.team)
        });
        drop(cache);
        let mut used = quota.charge(&usage);
        let mut namespaces: std::collections::BTreeSet<String> = seen.into_iter().collect();
        namespaces.insert(request.namespace.to_string());
        for p in ledger.values().filter(|p| p.team == request.team) {
            add(&mut used, &quota.charge(&p.resources));
        }
        let gang_key = request.gang.map(|(g, _)| (request.namespace.to_string(), g.to_string()));
        let known = gang_key.as_ref().is_some_and(|(ns, g)| {
            self.state.gang_exists(ns, g) || ledger.values().any(|p| p.gang.as_ref() == Some(&(ns.clone(), g.clone())))
        });
        let charge = effective_charge(request, known);
        if let Some(e) = quota.exceeded(&used, &charge) {
            return Err((e, namespaces.into_iter().collect()));
        }
        if !request.dry_run && !request.uid.is_empty() {
            ledger.insert(
                request.uid.to_string(),
                Pending {
                    team: request.team.to_string(),
                    namespace: request.namespace.to_string(),
                    pod: request.pod.to_string(),
                    resources: to_resources(quota, &charge),
                    gang: gang_key,
                    at: now,
                },
            );
        }
        Ok(())
    }
}
