//! Per-team quota usage: the books admission asks in deny mode ([`QuotaBook`]: none, the
//! CLI's `--state`, or the live cluster view in [`live`]) and the queue-mode plan ([`queue`]).
//! The quota itself — limits, weights, exact charges — is compiled with the policy
//! ([`crate::policy::quota`]).

pub mod live;
pub mod queue;

use std::collections::BTreeMap;

pub use crate::policy::quota::{Charge, Exceeded, Quota, add, times};
use crate::quantity::Quantity;
use crate::resources::ResourceList;

pub use live::LiveQuota;
pub use queue::QuotaQueue;

/// One admission asking for quota.
#[derive(Debug, Clone)]
pub struct QuotaRequest<'a> {
    /// The AdmissionRequest uid: the API server retries with the same one.
    pub uid: &'a str,
    pub team: &'a str,
    pub namespace: &'a str,
    pub pod: &'a str,
    /// What this pod counts.
    pub charge: Charge,
    /// A gang is charged whole, once: `(gang name, size)`.
    pub gang: Option<(&'a str, u32)>,
    /// Evaluated, never reserved.
    pub dry_run: bool,
}

/// Where deny-mode admission gets current usage and keeps its reservations.
pub trait QuotaBook: Send + Sync {
    /// Admits (and, unless dry run, reserves) or says which limit would be exceeded and the
    /// namespaces counted.
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), (Exceeded, Vec<String>)>;
}

/// The charge of a request as the book must count it: a gang's first member charges the whole
/// gang; later members are already covered (`gang_known`).
pub fn effective_charge(request: &QuotaRequest<'_>, gang_known: bool) -> Charge {
    match request.gang {
        Some(_) if gang_known => Charge::new(),
        Some((_, size)) => times(&request.charge, size),
        None => request.charge.clone(),
    }
}

/// No usage known (the CLI without `--state`, templates): a request is checked on its own.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoUsage;

impl QuotaBook for NoUsage {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), (Exceeded, Vec<String>)> {
        match quota.exceeded(&Charge::new(), &effective_charge(request, false)) {
            Some(e) => Err((e, vec![request.namespace.to_string()])),
            None => Ok(()),
        }
    }
}

/// Usage per team from `allot check --state FILE`, plus what the run's own manifests take.
#[derive(Debug, Default)]
pub struct StaticUsage {
    /// Team → resource amounts in use.
    pub teams: BTreeMap<String, ResourceList>,
    taken: std::sync::Mutex<Taken>,
}

/// What the manifests of one run took so far: per team, and the gangs already charged.
type Taken = (BTreeMap<String, ResourceList>, std::collections::BTreeSet<(String, String)>);

/// Parses one team's amounts (`{nvidia.com/gpu: 6}`); errors name `field.RESOURCE`.
pub fn parse_amounts<'a>(
    field: &str,
    amounts: impl IntoIterator<Item = (&'a String, &'a serde_json::Value)>,
) -> Result<ResourceList, String> {
    amounts
        .into_iter()
        .map(|(resource, raw)| {
            Quantity::from_json(raw).map(|q| (resource.clone(), q)).map_err(|e| format!("{field}.{resource}: {e}"))
        })
        .collect()
}

impl StaticUsage {
    /// Usage per team, nothing taken yet.
    pub fn new(teams: BTreeMap<String, ResourceList>) -> StaticUsage {
        StaticUsage { teams, taken: Default::default() }
    }

    /// Parses `{teams: {vision: {nvidia.com/gpu: 6}}}` (YAML or JSON).
    pub fn parse(name: &str, text: &str) -> Result<StaticUsage, String> {
        let docs = crate::policy::parse_documents(name, text)?;
        let mut teams = BTreeMap::new();
        for (index, doc) in docs {
            let Some(map) = doc.get("teams").and_then(|t| t.as_object()) else {
                return Err(format!("{name}: document {index}: expected `teams: {{TEAM: {{RESOURCE: AMOUNT}}}}`"));
            };
            for (team, resources) in map {
                let list =
                    parse_amounts(&format!("{name}: teams.{team}"), resources.as_object().into_iter().flatten())?;
                teams.insert(team.clone(), list);
            }
        }
        Ok(StaticUsage::new(teams))
    }
}

impl QuotaBook for StaticUsage {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), (Exceeded, Vec<String>)> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let (by_team, gangs) = &mut *taken;
        let mut used = self.teams.get(request.team).map(|l| quota.charge(l)).unwrap_or_default();
        if let Some(t) = by_team.get(request.team) {
            add(&mut used, &quota.charge(t));
        }
        let gang_key = request.gang.map(|(g, _)| (request.namespace.to_string(), g.to_string()));
        let known = gang_key.as_ref().is_some_and(|k| gangs.contains(k));
        let charge = effective_charge(request, known);
        if let Some(e) = quota.exceeded(&used, &charge) {
            return Err((e, vec![request.namespace.to_string()]));
        }
        // Record what this manifest takes, in resource terms (charge units are per quota).
        let entry = by_team.entry(request.team.to_string()).or_default();
        for (name, units) in &charge {
            let slot = entry.entry(name.clone()).or_default();
            *slot = slot.saturating_add(Quantity::from_nanos(units / quota.denominator));
        }
        if let Some(k) = gang_key {
            gangs.insert(k);
        }
        Ok(())
    }
}
