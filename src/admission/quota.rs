//! Per-team quota usage: the books admission asks in deny mode ([`QuotaBook`]: none, the
//! CLI's `--state`, or the live cluster view in [`live`]) and the queue-mode plan ([`queue`]).
//! The quota itself — limits, weights, exact charges — is compiled with the policy
//! ([`crate::model::policy::quota`]).

use std::collections::BTreeMap;

use crate::model::policy::cohort::{Cohort, CohortUsage, Shortfall};
use crate::model::policy::quota::{Charge, Exceeded, Quota};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;
use crate::model::tally::{GangTally, add_to};

/// One admission asking for quota.
#[derive(Debug, Clone)]
pub struct QuotaRequest<'a> {
    /// The AdmissionRequest uid: the API server retries with the same one.
    pub uid: &'a str,
    pub team: &'a str,
    pub namespace: &'a str,
    pub pod: &'a str,
    /// The pod's UID (`metadata.uid`; set by the API server before validating webhooks run,
    /// empty before that): the key of its charge in the shared ledger.
    pub pod_uid: &'a str,
    /// The pod's creationTimestamp in unix seconds (0 when not set yet).
    pub created: i64,
    /// What this pod counts.
    pub charge: Charge,
    /// The pod's effective requests, in resource terms (a gang's placeholders are computed
    /// from these, like the watch computes them from the pods it sees).
    pub requests: ResourceList,
    /// The gang it joins: `(gang name, declared size)`.
    pub gang: Option<(&'a str, u32)>,
    /// The shared ResourceClaims it names, with their devices (resource terms): each is charged
    /// once for its namespace, by the first pod that names it, and stays counted while any pod
    /// that names it lives.
    pub shared_claims: crate::model::dra::SharedClaims,
    /// Evaluated, never reserved.
    pub dry_run: bool,
    /// The team's cohort (`quota.cohort`): its usage is then decided with the cohort's
    /// ([`check_in_cohort`]).
    pub cohort: Option<&'a Cohort>,
}

/// Why a quota book refuses a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// A limit would be exceeded: which one, the namespaces counted, and what the pod asks
    /// ("this pod asks 4", "gang ddp of 2 asks 8 in all").
    Exceeded { exceeded: Box<Exceeded>, namespaces: Vec<String>, asking: String },
    /// The team would borrow past its borrowing limit or past what its cohort has unused.
    Cohort { cohort: String, shortfall: Box<Shortfall> },
    /// The pod asks more than its team could ever use in its cohort.
    NeverFits { cohort: String, resource: String, asked: String, most: String },
    /// The gang already has every member it declares.
    GangFull { gang: String, declared: u32, existing: u32 },
    /// Usage is not known yet (Allot is starting and its caches have not synced): fail closed.
    Unknown { reason: String },
}

impl Refusal {
    /// The denial text for the person who ran `kubectl apply`.
    pub fn message(&self, team: &str) -> String {
        match self {
            Refusal::Exceeded { exceeded, namespaces, asking } => {
                format!("team {team} {exceeded} in namespaces {}; {asking}", namespaces.join(", "))
            }
            Refusal::GangFull { gang, declared, existing } => format!(
                "gang {gang} declares {declared} members; {existing} exist already. A member beyond the declared \
                 size is refused (it would run outside the gang and uncharged): delete a member first, or start a \
                 new gang with a larger allot.dev/gang-size"
            ),
            Refusal::Cohort { cohort, shortfall } => shortfall.message(team, cohort),
            Refusal::NeverFits { cohort, resource, asked, most } => format!(
                "team {team} can use at most {most} {resource} in cohort {cohort} (its nominal quota and what it may \
                 borrow); this asks {asked}, which can never be admitted"
            ),
            Refusal::Unknown { reason } => format!("team {team}: {reason}"),
        }
    }
}

/// Where deny-mode admission gets current usage and keeps its reservations.
pub trait QuotaBook: Send + Sync {
    /// Admits (and, unless dry run, reserves) or says why not.
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal>;
}

impl<B: QuotaBook + ?Sized> QuotaBook for std::sync::Arc<B> {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        (**self).admit(quota, request)
    }
}

impl<B: QuotaBook + ?Sized> QuotaBook for &B {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        (**self).admit(quota, request)
    }
}

/// A [`QuotaRequest`] that owns its data, so that it can outlive the evaluation that asked it.
#[derive(Debug, Clone)]
pub struct OwnedQuotaRequest {
    pub uid: String,
    pub team: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub created: i64,
    pub charge: Charge,
    pub requests: ResourceList,
    pub gang: Option<(String, u32)>,
    pub shared_claims: crate::model::dra::SharedClaims,
    pub dry_run: bool,
    pub cohort: Option<Cohort>,
}

impl OwnedQuotaRequest {
    pub fn of(r: &QuotaRequest<'_>) -> OwnedQuotaRequest {
        OwnedQuotaRequest {
            uid: r.uid.into(),
            team: r.team.into(),
            namespace: r.namespace.into(),
            pod: r.pod.into(),
            pod_uid: r.pod_uid.into(),
            created: r.created,
            charge: r.charge.clone(),
            requests: r.requests.clone(),
            gang: r.gang.map(|(g, n)| (g.to_string(), n)),
            shared_claims: r.shared_claims.clone(),
            dry_run: r.dry_run,
            cohort: r.cohort.cloned(),
        }
    }

    pub fn borrow(&self) -> QuotaRequest<'_> {
        QuotaRequest {
            uid: &self.uid,
            team: &self.team,
            namespace: &self.namespace,
            pod: &self.pod,
            pod_uid: &self.pod_uid,
            created: self.created,
            charge: self.charge.clone(),
            requests: self.requests.clone(),
            gang: self.gang.as_ref().map(|(g, n)| (g.as_str(), *n)),
            shared_claims: self.shared_claims.clone(),
            dry_run: self.dry_run,
            cohort: self.cohort.as_ref(),
        }
    }
}

/// What admitting a request adds to its team's usage.
pub(crate) struct Asks {
    /// In resource terms; negative entries where a gang's placeholders shrink.
    pub(crate) delta: ResourceList,
    /// The request's gang with the request counted in.
    pub(crate) after: Option<GangTally>,
}

/// What `request` adds to its team's usage, given its gang as counted so far (`before`: the
/// watch's members plus reservations not yet seen) and the shared claims its namespace already
/// holds (`held`: named by a live pod or a reservation), or why a gang member is refused
/// outright. A plain pod adds its requests; a gang member adds the difference it makes to its
/// gang's total ([`GangTally`]): at the first member, the whole declared gang. Either adds the
/// devices of each shared claim nobody holds yet.
pub(crate) fn asks(
    request: &QuotaRequest<'_>,
    before: &GangTally,
    held: &dyn Fn(&str) -> bool,
) -> Result<Asks, Refusal> {
    let mut asks = own_asks(request, before)?;
    for (claim, devices) in &request.shared_claims {
        if !held(claim) {
            add_to(&mut asks.delta, devices, 1);
        }
    }
    Ok(asks)
}

/// [`asks`] without the shared claims.
fn own_asks(request: &QuotaRequest<'_>, before: &GangTally) -> Result<Asks, Refusal> {
    let Some((gang, declared)) = request.gang else {
        return Ok(Asks { delta: request.requests.clone(), after: None });
    };
    // Members disagreeing on the size are denied by the consistency check; the smaller size
    // is the one that refuses a member too many.
    let limit = before.declared().map_or(declared, |d| d.min(declared));
    // A native PodGroup's `minCount` is a minimum: members beyond it are the scheduler's to
    // place, and each is charged in full.
    if before.live >= limit && !crate::model::gang::membership::is_native_group(gang) {
        return Err(Refusal::GangFull { gang: gang.to_string(), declared: limit, existing: before.live });
    }
    let mut after = before.clone();
    after.add(request.requests.iter().map(|(k, v)| (k.as_str(), *v)), Some(declared), false);
    let mut delta = after.total();
    add_to(&mut delta, &before.total(), -1);
    Ok(Asks { delta, after: Some(after) })
}

/// Checks `asks` against `used` (charge units): the refusal says what the pod asks.
pub(crate) fn check(
    quota: &Quota,
    request: &QuotaRequest<'_>,
    used: &Charge,
    asks: &Asks,
    namespaces: impl FnOnce() -> Vec<String>,
) -> Result<(), Refusal> {
    let mut charge = quota.charge(&asks.delta);
    // Every resource the pod itself asks for is checked, even where its gang's charge does not
    // grow (it fills a placeholder): a deletion can leave a gang's placeholders above the
    // limit, and a member filling one then would take real devices past it.
    for resource in request.charge.keys() {
        charge.entry(resource.clone()).or_insert(0);
    }
    let Some(exceeded) = quota.exceeded(used, &charge) else { return Ok(()) };
    let asking = match (request.gang, &asks.after) {
        (Some((gang, declared)), Some(after)) => {
            let total = quota.charge(&after.total()).get(&exceeded.resource).copied().unwrap_or(0);
            let added = charge.get(&exceeded.resource).copied().unwrap_or(0);
            if added == total {
                format!("gang {gang} of {declared} asks {} in all", quota.show(total))
            } else {
                format!(
                    "gang {gang} of {declared} asks {} in all, {} more with this member",
                    quota.show(total),
                    exceeded.asked
                )
            }
        }
        _ => format!("this pod asks {}", exceeded.asked),
    };
    Err(Refusal::Exceeded { exceeded: Box::new(exceeded), namespaces: namespaces(), asking })
}

/// [`check`] for a team in a cohort (`request.cohort`), whatever its quota mode says:
/// `used_of(team)` is what each team of the cohort uses (resource terms), the request's own
/// team included. Within its nominal quota a team is always admitted (what it lent is reclaimed
/// by Allot's controller); beyond it, it borrows what the cohort has unused, up to its borrowing
/// limit.
pub(crate) fn check_in_cohort(
    cohort: &Cohort,
    request: &QuotaRequest<'_>,
    used_of: &mut dyn FnMut(&str) -> Option<ResourceList>,
    asks: &Asks,
) -> Result<(), Refusal> {
    let Some(member) = cohort.members.iter().find(|m| m.team == request.team) else {
        // (Not reached: a request names its own team's cohort.) Fail closed.
        return Err(Refusal::Unknown { reason: format!("cohort {} does not list the team", cohort.name) });
    };
    let usage = CohortUsage::new(cohort, &mut |team| {
        let quota = &cohort.members.iter().find(|m| m.team == team)?.quota;
        used_of(team).map(|used| quota.charge(&used))
    });
    let mut charge = member.quota.charge(&asks.delta);
    // As in `check`: a gang member filling a placeholder is still checked for what it asks.
    for resource in request.charge.keys() {
        charge.entry(resource.clone()).or_insert(0);
    }
    if let Some((resource, asked, most)) = usage.never_fits(request.team, &charge) {
        return Err(Refusal::NeverFits { cohort: cohort.name.clone(), resource, asked, most });
    }
    match usage.check_admission(request.team, &charge) {
        Ok(_) => Ok(()),
        Err(shortfall) => Err(Refusal::Cohort { cohort: cohort.name.clone(), shortfall }),
    }
}

/// Decides `asks` given what the request's team uses (`used`, resource terms): with its cohort
/// when it has one (`others(team)`: what each other team of the cohort uses), else against its
/// team's quota alone.
pub(crate) fn decide(
    quota: &Quota,
    request: &QuotaRequest<'_>,
    used: &ResourceList,
    others: &mut dyn FnMut(&str) -> Option<ResourceList>,
    asks: &Asks,
    namespaces: impl FnOnce() -> Vec<String>,
) -> Result<(), Refusal> {
    match request.cohort {
        Some(cohort) => {
            let mut used_of = |team: &str| if team == request.team { Some(used.clone()) } else { others(team) };
            check_in_cohort(cohort, request, &mut used_of, asks)
        }
        None => check(quota, request, &quota.charge(used), asks, namespaces),
    }
}

/// No usage known (the CLI without `--state`, templates): a request is checked on its own
/// (a gang member as its whole gang).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoUsage;

impl QuotaBook for NoUsage {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        let asks = asks(request, &GangTally::default(), &|_| false)?;
        decide(quota, request, &ResourceList::new(), &mut |_| None, &asks, || vec![request.namespace.to_string()])
    }
}

/// Usage per team from `allot check --state FILE`, plus what the run's own manifests take.
#[derive(Debug, Default)]
pub struct StaticUsage {
    /// Team → resource amounts in use.
    pub teams: BTreeMap<String, ResourceList>,
    taken: std::sync::Mutex<Taken>,
}

/// What the manifests of one run took so far: per team, the plain pods' requests and the
/// shared claims' devices; per gang (namespace, name), its team and tally; the shared claims
/// counted, by (namespace, claim).
#[derive(Debug, Default)]
struct Taken {
    plain: BTreeMap<String, ResourceList>,
    gangs: BTreeMap<(String, String), (String, GangTally)>,
    claims: std::collections::BTreeSet<(String, String)>,
}

/// An amount of a usage file (`allot check --state`, a suite's `usage`) that is no quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}.{resource}: {source}")]
pub struct AmountError {
    pub field: String,
    pub resource: String,
    pub source: crate::model::quantity::QuantityError,
}

impl AmountError {
    /// A short, stable name for the reason (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        "amount"
    }
}

/// Why a usage file (`{teams: {TEAM: {RESOURCE: AMOUNT}}}`) cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageFileError {
    #[error(transparent)]
    Documents(#[from] crate::model::documents::DocumentError),
    #[error("{name}: document {index}: expected `teams: {{TEAM: {{RESOURCE: AMOUNT}}}}`")]
    NotTeams { name: String, index: usize },
    #[error(transparent)]
    Amount(#[from] AmountError),
}

impl UsageFileError {
    /// A short, stable name for the reason (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            UsageFileError::Documents(e) => e.metric_label(),
            UsageFileError::NotTeams { .. } => "not_teams",
            UsageFileError::Amount(e) => e.metric_label(),
        }
    }
}

/// Parses one team's amounts (`{nvidia.com/gpu: 6}`); errors name `field.RESOURCE`.
pub fn parse_amounts<'a>(
    field: &str,
    amounts: impl IntoIterator<Item = (&'a String, &'a serde_json::Value)>,
) -> Result<ResourceList, AmountError> {
    amounts
        .into_iter()
        .map(|(resource, raw)| {
            Quantity::from_json(raw).map(|q| (resource.clone(), q)).map_err(|source| AmountError {
                field: field.to_string(),
                resource: resource.clone(),
                source,
            })
        })
        .collect()
}

impl StaticUsage {
    /// Usage per team, nothing taken yet.
    pub fn new(teams: BTreeMap<String, ResourceList>) -> StaticUsage {
        StaticUsage { teams, taken: Default::default() }
    }

    /// Parses `{teams: {vision: {nvidia.com/gpu: 6}}}` (YAML or JSON).
    pub fn parse(name: &str, text: &str) -> Result<StaticUsage, UsageFileError> {
        let docs = crate::model::policy::parse_documents(name, text)?;
        let mut teams = BTreeMap::new();
        for (index, doc) in docs {
            let Some(map) = doc.get("teams").and_then(|t| t.as_object()) else {
                return Err(UsageFileError::NotTeams { name: name.to_string(), index });
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

impl StaticUsage {
    /// What `team` uses: the usage file's amounts and what the run's manifests took.
    fn used(&self, taken: &Taken, team: &str) -> ResourceList {
        let mut used = self.teams.get(team).cloned().unwrap_or_default();
        if let Some(t) = taken.plain.get(team) {
            add_to(&mut used, t, 1);
        }
        for (of, tally) in taken.gangs.values() {
            if of == team {
                add_to(&mut used, &tally.total(), 1);
            }
        }
        used
    }
}

impl QuotaBook for StaticUsage {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let used = self.used(&taken, request.team);
        let gang_key = request.gang.map(|(g, _)| (request.namespace.to_string(), g.to_string()));
        let before = gang_key.as_ref().and_then(|k| taken.gangs.get(k)).map(|(_, t)| t.clone()).unwrap_or_default();
        let held = |claim: &str| taken.claims.contains(&(request.namespace.to_string(), claim.to_string()));
        let asks = asks(request, &before, &held)?;
        let mut others = |team: &str| Some(self.used(&taken, team));
        decide(quota, request, &used, &mut others, &asks, || vec![request.namespace.to_string()])?;
        for (claim, devices) in &request.shared_claims {
            if taken.claims.insert((request.namespace.to_string(), claim.clone())) {
                add_to(taken.plain.entry(request.team.to_string()).or_default(), devices, 1);
            }
        }
        match (gang_key, asks.after) {
            (Some(key), Some(after)) => {
                taken.gangs.insert(key, (request.team.to_string(), after));
            }
            _ => add_to(taken.plain.entry(request.team.to_string()).or_default(), &request.requests, 1),
        }
        Ok(())
    }
}
