//! Deny-mode quota in `allot serve`, over the live cluster view.

use std::collections::{BTreeMap, BTreeSet};

use crate::admission::quota::{QuotaBook, QuotaRequest, Refusal, asks, decide};
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
        let own_claims: Vec<(&str, &str)> =
            request.shared_claims.keys().map(|c| (request.namespace, c.as_str())).collect();
        // With the other teams of its cohort, for a pod that may borrow: each one's watch and
        // reservations, as its own would be counted.
        // (A team in no cohort, the common case, allocates no list for it.)
        let alone = [request.team];
        let in_cohort: Vec<&str>;
        let teams: &[&str] = match request.cohort {
            None => &alone,
            Some(c) => {
                let others = c.members.iter().map(|m| m.team.as_str()).filter(|t| *t != request.team);
                in_cohort = std::iter::once(request.team).chain(others).collect();
                &in_cohort
            }
        };
        let mut watched = self.watched(&ledger, &policies, &mut cache, teams, &own_claims).into_iter();
        let (mut usage, seen, watched_own) = watched.next().unwrap_or_default();
        let mut others: BTreeMap<String, ResourceList> = BTreeMap::new();
        for (team, (mut used, _, held)) in teams[1..].iter().zip(watched) {
            self.add_reservations(&ledger, team, &held, &mut used);
            others.insert(team.to_string(), used);
        }
        drop(cache);
        let watched = watched_own;
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
            let id = (request.namespace.to_string(), claim.to_string());
            reserved_claims.contains(&(id.0.as_str(), id.1.as_str())) || watched.contains(&id)
        };
        let asks = asks(request, &before, &held)?;
        decide(quota, request, &usage, &mut |team| others.get(team).cloned(), &asks, || {
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

/// What a team uses by the watch: its usage, the namespaces that use anything, and the shared
/// claims (its reservations' and the request's) the watch holds.
type Watched = (ResourceList, Vec<String>, BTreeSet<(String, String)>);

impl LiveQuota {
    /// What each of `teams` uses by the watch (namespaces resolved through `cache`), in one
    /// walk, read with the shared claims its reservations name (and, for the first, `extra`)
    /// and whether the watch holds each (one state: a claim is counted by the watch or by a
    /// reservation).
    fn watched(
        &self,
        ledger: &BTreeMap<String, Pending>,
        policies: &crate::model::policy::PolicySet,
        cache: &mut TeamCache,
        teams: &[&str],
        extra: &[(&str, &str)],
    ) -> Vec<Watched> {
        let wanted: Vec<(usize, String, String)> = ledger
            .values()
            .filter_map(|p| Some((teams.iter().position(|t| *t == p.team)?, p)))
            .flat_map(|(i, p)| p.shared_claims.keys().map(move |c| (i, p.namespace.clone(), c.clone())))
            .chain(extra.iter().map(|(n, c)| (0, n.to_string(), c.to_string())))
            .collect();
        let claims: Vec<(&str, &str)> = wanted.iter().map(|(_, n, c)| (n.as_str(), c.as_str())).collect();
        let mut group_of = |ns: &str| {
            let of = match cache.team_of.get(ns) {
                Some(of) => of,
                None => {
                    let team = crate::model::namespaces::team_of(policies, ns, self.namespaces.as_ref()).team;
                    cache.team_of.entry(ns.to_string()).or_insert(team.map(|t| t.name.clone()))
                }
            };
            teams.iter().position(|t| of.as_deref() == Some(*t))
        };
        let (usage, held) = self.state.usage_by_group(&mut group_of, teams.len(), &claims);
        let mut out: Vec<Watched> = usage.into_iter().map(|(u, seen)| (u, seen, BTreeSet::new())).collect();
        for ((i, ns, claim), held) in wanted.into_iter().zip(held) {
            if held && let Some(team) = out.get_mut(i) {
                team.2.insert((ns, claim));
            }
        }
        out
    }

    /// Adds to `usage` the reservations of `team` not seen in the watch yet: a plain pod adds
    /// its requests; a gang member joins its gang's tally, which then replaces the watch's
    /// tally of that gang (the same formula over more members, so the ledger and the watch
    /// agree once the pods show up). Returns those gangs' tallies and the shared claims a
    /// reservation names that no pod in the watch holds (counted once).
    fn add_reservations<'l>(
        &self,
        ledger: &'l BTreeMap<String, Pending>,
        team: &str,
        watched: &BTreeSet<(String, String)>,
        usage: &mut ResourceList,
    ) -> (GangTallies, BTreeSet<(&'l str, &'l str)>) {
        let mut gangs: GangTallies = BTreeMap::new();
        let mut reserved_claims: BTreeSet<(&str, &str)> = BTreeSet::new();
        for p in ledger.values().filter(|p| p.team == team) {
            for (claim, devices) in &p.shared_claims {
                let id = (p.namespace.as_str(), claim.as_str());
                if !watched.contains(&(p.namespace.clone(), claim.clone())) && reserved_claims.insert(id) {
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
