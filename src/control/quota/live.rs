//! Deny-mode quota in `allot serve`, over the live cluster view.

use std::collections::{BTreeMap, BTreeSet};

use crate::admission::quota::{QuotaBook, QuotaRequest, Refusal, asks, check};
use crate::control::cluster::ClusterState;
use crate::model::policy::quota::Quota;
use crate::model::resources::ResourceList;
use crate::model::tally::{GangTally, add_to};

/// Deny-mode quota in `allot serve`: usage from the controller's Pod watch plus an in-process
/// ledger of pods admitted but not yet seen in the watch, keyed by the AdmissionRequest uid (the
/// API server retries with the same uid, so a retry is not charged twice). Check-and-reserve is
/// one critical section: concurrent admissions cannot race past a limit. The ledger is per
/// replica (see docs/src/quotas.md, "Quotas").
pub struct LiveQuota {
    pub state: std::sync::Arc<ClusterState>,
    pub policies: std::sync::Arc<arc_swap::ArcSwap<crate::model::policy::PolicySet>>,
    pub namespaces: std::sync::Arc<dyn crate::model::namespaces::NamespaceLabels>,
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
    /// The pod's own requests, in resource terms (charge units depend on the quota, which a
    /// reload may change; a gang member's share depends on the other members).
    resources: ResourceList,
    /// (namespace, gang, declared size) of a gang member.
    gang: Option<(String, String, u32)>,
    /// The shared claims it names (counted once per claim with the watch's holders).
    shared_claims: crate::model::dra::SharedClaims,
    at: std::time::Instant,
}

/// How long a reservation waits for its pod to show up in the watch (a later webhook or the API
/// server may still have refused the pod).
const PENDING_TTL: std::time::Duration = std::time::Duration::from_secs(60);

impl LiveQuota {
    /// A book over the controller's state.
    pub fn new(
        state: std::sync::Arc<ClusterState>,
        policies: std::sync::Arc<arc_swap::ArcSwap<crate::model::policy::PolicySet>>,
        namespaces: std::sync::Arc<dyn crate::model::namespaces::NamespaceLabels>,
    ) -> LiveQuota {
        LiveQuota { state, policies, namespaces, ledger: Default::default(), teams: Default::default() }
    }
}

impl QuotaBook for LiveQuota {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        if !request.uid.is_empty() && ledger.contains_key(request.uid) {
            return Ok(()); // a retry of an admitted request
        }
        let now = std::time::Instant::now();
        ledger.retain(|_, p| {
            now.duration_since(p.at) < PENDING_TTL && !self.state.seen_since(&p.namespace, &p.pod, p.at)
        });
        let policies = self.policies.load();
        let mut cache = self.teams.lock().unwrap_or_else(|e| e.into_inner());
        if cache.version != policies.version || cache.at.is_none_or(|t| now.duration_since(t) > TEAM_CACHE_TTL) {
            *cache = TeamCache { version: policies.version.clone(), at: Some(now), team_of: Default::default() };
        }
        // The shared claims reservations and the request name, and whether the watch holds each,
        // read with the usage (one state: a claim is counted by the watch or by a reservation).
        let wanted: Vec<(&str, &str)> = ledger
            .values()
            .filter(|p| p.team == request.team)
            .flat_map(|p| p.shared_claims.keys().map(|c| (p.namespace.as_str(), c.as_str())))
            .chain(request.shared_claims.keys().map(|c| (request.namespace, c.as_str())))
            .collect();
        let (mut usage, seen, held) = self.state.usage_and_claims(
            &mut |ns| {
                let team = cache.team_of.entry(ns.to_string()).or_insert_with(|| {
                    crate::model::namespaces::team_of(&policies, ns, self.namespaces.as_ref())
                        .team
                        .map(|t| t.name.clone())
                });
                team.as_deref() == Some(request.team)
            },
            &wanted,
        );
        drop(cache);
        let watched: BTreeSet<(&str, &str)> =
            wanted.iter().zip(held).filter(|(_, held)| *held).map(|(claim, _)| *claim).collect();
        let (gangs, reserved_claims) = self.add_reservations(&ledger, request.team, &watched, &mut usage);
        let gang_key = request.gang.map(|(g, n)| (request.namespace.to_string(), g.to_string(), n));
        let before = match &gang_key {
            Some((ns, g, _)) => match gangs.get(&(ns.clone(), g.clone())) {
                Some((_, merged)) => merged.clone(),
                None => self.state.gang_tally(ns, g),
            },
            None => GangTally::default(),
        };
        let held = |claim: &str| {
            reserved_claims.contains(&(request.namespace, claim)) || watched.contains(&(request.namespace, claim))
        };
        let asks = asks(request, &before, &held)?;
        check(quota, request, &quota.charge(&usage), &asks, || {
            let mut namespaces: std::collections::BTreeSet<String> = seen.into_iter().collect();
            namespaces.insert(request.namespace.to_string());
            namespaces.into_iter().collect()
        })?;
        if !request.dry_run && !request.uid.is_empty() {
            ledger.insert(
                request.uid.to_string(),
                Pending {
                    team: request.team.to_string(),
                    namespace: request.namespace.to_string(),
                    pod: request.pod.to_string(),
                    resources: request.requests.clone(),
                    gang: gang_key,
                    shared_claims: request.shared_claims.clone(),
                    at: now,
                },
            );
        }
        Ok(())
    }
}

/// Per gang with reservations: the watch's tally, and the tally with the reservations added.
type GangTallies = BTreeMap<(String, String), (GangTally, GangTally)>;

impl LiveQuota {
    /// Adds to `usage` the reservations of `team` not seen in the watch yet: a plain pod adds
    /// its requests; a gang member joins its gang's tally, which then replaces the watch's
    /// tally of that gang (the same formula over more members, so the ledger and the watch
    /// agree once the pods show up). Returns those gangs' tallies and the shared claims a
    /// reservation names that no pod in the watch holds (counted once).
    fn add_reservations<'l>(
        &self,
        ledger: &'l BTreeMap<String, Pending>,
        team: &str,
        watched: &BTreeSet<(&str, &str)>,
        usage: &mut ResourceList,
    ) -> (GangTallies, BTreeSet<(&'l str, &'l str)>) {
        let mut gangs: GangTallies = BTreeMap::new();
        let mut reserved_claims: BTreeSet<(&str, &str)> = BTreeSet::new();
        for p in ledger.values().filter(|p| p.team == team) {
            for (claim, devices) in &p.shared_claims {
                let id = (p.namespace.as_str(), claim.as_str());
                if !watched.contains(&id) && reserved_claims.insert(id) {
                    add_to(usage, devices, 1);
                }
            }
            match &p.gang {
                None => add_to(usage, &p.resources, 1),
                Some((ns, g, declared)) => {
                    let (_, merged) = gangs.entry((ns.clone(), g.clone())).or_insert_with(|| {
                        let watch = self.state.gang_tally(ns, g);
                        (watch.clone(), watch)
                    });
                    merged.add(p.resources.iter().map(|(k, v)| (k.as_str(), *v)), Some(*declared), false);
                }
            }
        }
        for (watch, merged) in gangs.values() {
            add_to(usage, &merged.total(), 1);
            add_to(usage, &watch.total(), -1);
        }
        (gangs, reserved_claims)
    }
}
