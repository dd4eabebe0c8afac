//! Allot's preemption for gangs, around the pure choice of victims
//! ([`crate::control::gang::decision`]): what the plan asks the controller to evict ([`Preemption`]), what
//! the leader remembers between passes ([`Memory`]: preemptions in flight, units evicted lately,
//! evictions a PodDisruptionBudget refused), and the eviction itself ([`evict`]).
//!
//! **Eviction.** Every victim pod of a preemption is first evicted as a dry run (the Eviction
//! API, `dryRun=All`, which consults the PodDisruptionBudgets and changes nothing); only when
//! none is refused are they evicted for real, each with its uid as precondition, then told why
//! (a `DisruptionTarget` condition with reason [`PREEMPTED_REASON`] and a Warning Event naming
//! the preemptor, its team and both priorities). A refusal evicts nothing of the set: the unit
//! is spared for [`REFUSAL_RETRY_SECS`], so the next pass chooses another set or waits, and the
//! preemptor's first member gets a Warning Event saying which budget refused. A budget that
//! refuses between the dry run and the real eviction (a race) can leave a victim gang partly
//! evicted: whole-gang disruption ([`super::disruption`]) then takes the rest.
//!
//! **Memory** is the leader's alone and bounded; a new leader starts from what the pods show
//! (victims still terminating keep their nodes busy: [`super::victims::preemptions_shown`]).

use std::collections::HashMap;

use super::decision::{Domain, GangKey, InFlight, Placements, RunningUnit, Snapshot, UnitKey};
pub use crate::control::cluster::action::PREEMPTED_REASON;
use crate::control::cluster::{ClusterView, PodUid};

/// How long a unit a preemption evicted is spared by the next ones (seconds): it cannot be
/// chosen again before, so no gang is evicted over and over as it comes back.
pub const BACKOFF_SECS: i64 = 300;

/// How long a unit whose eviction a PodDisruptionBudget refused is left out of the search.
pub const REFUSAL_RETRY_SECS: i64 = 60;

/// How long a preemption counts as in flight at most (seconds): victims that never go (a
/// finalizer nobody removes) do not hold the preemptor's room for ever.
pub const IN_FLIGHT_MAX_SECS: i64 = 900;

/// The most entries of each kind the memory keeps.
const MEMORY_BOUND: usize = 10_000;

/// The Event reason on the preemptor's first member when a budget refused an eviction.
pub const REFUSED_REASON: &str = "PreemptionRefused";

/// What the plan asks the controller to evict for one gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub preemptor: GangKey,
    pub team: Option<String>,
    pub priority: i32,
    /// The preemptor's first member by name: where a refusal is told.
    pub first_member: Option<String>,
    /// Cheapest first.
    pub victims: Vec<RunningUnit>,
    pub placements: Placements,
    pub domain: Option<Domain>,
}

impl Preemption {
    /// What each victim pod is told (condition and Event).
    pub fn victim_message(&self, unit: &RunningUnit) -> String {
        let team = self.team.as_deref().map_or_else(|| "no team".to_string(), |t| format!("team {t}"));
        let pods = self.placements.len();
        let what = match &unit.key {
            UnitKey::Gang(g) => format!("gang {g} is evicted whole"),
            UnitKey::Pod { .. } => "this pod is evicted".to_string(),
        };
        format!(
            "preempted by gang {} ({team}, priority {}) to make room for its {pods} pods: {what} (priority {}, lower)",
            self.preemptor, self.priority, unit.priority
        )
    }
}

/// A preemption the leader carried out, until its gang is released or gives up.
#[derive(Debug, Clone, PartialEq)]
struct Remembered {
    /// `(namespace, name, uid)` of every victim pod evicted.
    victims: Vec<(String, String, Option<PodUid>)>,
    placements: Placements,
    domain: Option<Domain>,
    since: i64,
}

/// What the leader remembers of its preemptions between passes.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// When this replica's leadership began (its first pass): preemptions the pods show in
    /// flight (victims' conditions) count only for [`IN_FLIGHT_MAX_SECS`] after it. They are
    /// the previous leader's, whose victims are gone within their grace period; later, the
    /// condition is believed only on pods this leader evicted (a tenant who may write her pods'
    /// status could otherwise keep nodes from preemption with a pod she keeps terminating).
    leading_since: Option<i64>,
    in_flight: HashMap<GangKey, Remembered>,
    /// Units evicted by a preemption, or refused by a budget: not evictable before the time.
    spared: HashMap<UnitKey, i64>,
}

impl Memory {
    /// Forgets everything (a leader change: the pods say what is in flight).
    pub fn clear(&mut self) {
        self.leading_since = None;
        self.in_flight.clear();
        self.spared.clear();
    }

    /// Adds what the memory knows to a snapshot built from `view` at `snapshot.now`: each
    /// preemption in flight with the nodes of its victims still there (by uid), and the spared
    /// units' times. Forgets what is over: a preemption whose gang no longer waits, or past
    /// [`IN_FLIGHT_MAX_SECS`]; a spared time passed.
    pub fn apply(&mut self, snapshot: &mut Snapshot, view: &ClusterView<'_>) {
        let now = snapshot.now;
        let since = *self.leading_since.get_or_insert(now);
        if now >= since.saturating_add(IN_FLIGHT_MAX_SECS) {
            snapshot.preemptions.retain(|f| f.preemptor.is_some());
        }
        let waiting: std::collections::HashSet<&GangKey> = snapshot.gangs.iter().map(|g| &g.key).collect();
        self.in_flight.retain(|gang, r| waiting.contains(gang) && now < r.since.saturating_add(IN_FLIGHT_MAX_SECS));
        self.spared.retain(|_, until| now < *until);
        for (gang, r) in &self.in_flight {
            let mut nodes: Vec<String> = r
                .victims
                .iter()
                .filter_map(|(ns, name, uid)| {
                    let p = view.pod(ns, name)?;
                    (!p.finished && (uid.is_none() || p.uid == *uid))
                        .then(|| p.node_name.as_ref().map(|n| n.to_string()))?
                })
                .collect();
            nodes.sort();
            nodes.dedup();
            snapshot.preemptions.push(InFlight {
                preemptor: Some(gang.clone()),
                nodes,
                placements: r.placements.clone(),
                domain: r.domain.clone(),
            });
        }
        for unit in &mut snapshot.running {
            if let Some(until) = self.spared.get(&unit.key) {
                unit.evictable_from = unit.evictable_from.max(*until);
            }
        }
    }

    /// A preemption carried out at `now`: in flight, its victims spared for the back-off.
    fn carried_out(&mut self, p: &Preemption, now: i64) {
        if self.in_flight.len() >= MEMORY_BOUND {
            return;
        }
        let victims = p
            .victims
            .iter()
            .flat_map(|u| u.pods.iter())
            .map(|pod| (pod.namespace.clone(), pod.name.clone(), pod.uid.clone()))
            .collect();
        self.in_flight.insert(
            p.preemptor.clone(),
            Remembered { victims, placements: p.placements.clone(), domain: p.domain.clone(), since: now },
        );
        for unit in &p.victims {
            self.spare(unit.key.clone(), now.saturating_add(BACKOFF_SECS));
        }
    }

    fn spare(&mut self, unit: UnitKey, until: i64) {
        if self.spared.len() < MEMORY_BOUND || self.spared.contains_key(&unit) {
            let slot = self.spared.entry(unit).or_insert(until);
            *slot = (*slot).max(until);
        }
    }

    /// The gang was released: its preemption is over.
    pub fn released(&mut self, gang: &GangKey) {
        self.in_flight.remove(gang);
    }
}

/// How one preemption went.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every victim pod was evicted (or was gone already).
    Evicted { pods: usize },
    /// A budget (or the API) refused the eviction of a pod of `unit`: nothing was evicted
    /// (refused in the dry run), or only what came before it (refused for real).
    Refused { unit: UnitKey, pod: String, why: EvictionError, evicted: usize },
}

/// Why an eviction (or its dry run) did not go through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvictionError {
    /// The API server refused it: 429 while a PodDisruptionBudget allows no disruption.
    #[error("{code} {message}")]
    Refused { code: u16, message: String },
    /// The API server could not be asked, or answered with no status.
    #[error("{0}")]
    Unanswered(String),
}

impl EvictionError {
    /// A short, stable name for the reason (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            EvictionError::Refused { code: 429, .. } => "disruption_budget",
            EvictionError::Refused { .. } => "refused",
            EvictionError::Unanswered(_) => "unanswered",
        }
    }
}

/// What the eviction talks to: the API, for dry runs and evictions, condition patches and
/// Events. A trait, so the sequence is tested without a cluster.
#[allow(async_fn_in_trait)]
pub trait Evictor {
    /// Evicts the pod of that uid (`dry_run`: only asks); `Err` with the API's words when
    /// refused. A pod already gone is no error.
    async fn evict(&self, namespace: &str, pod: &str, uid: Option<&str>, dry_run: bool) -> Result<(), EvictionError>;
    /// Tells an evicted pod why (its `DisruptionTarget` condition and a Warning Event).
    async fn tell_victim(&self, namespace: &str, pod: &str, uid: Option<&str>, message: &str);
    /// A Warning Event on the preemptor's member `pod`.
    async fn tell_preemptor(&self, namespace: &str, pod: &str, reason: &str, message: &str);
}

/// Carries out one preemption at `now` (see the module doc) and remembers it.
pub async fn evict(p: &Preemption, api: &impl Evictor, memory: &mut Memory, now: i64) -> Outcome {
    match evict_whole(&p.victims, api, |unit| p.victim_message(unit)).await {
        Ok(evicted) => {
            memory.carried_out(p, now);
            Outcome::Evicted { pods: evicted }
        }
        Err(Stopped { unit, pod, why, evicted, dry_run }) => {
            if !dry_run {
                // What was evicted is in flight all the same.
                memory.carried_out(p, now);
            }
            refused(p, api, memory, now, unit, &pod, why, evicted).await
        }
    }
}

/// Where [`evict_whole`] stopped: the unit and pod refused, why, the pods evicted before, and
/// whether it was the dry run (then nothing was evicted).
pub struct Stopped<'u> {
    pub unit: &'u RunningUnit,
    pub pod: String,
    pub why: EvictionError,
    pub evicted: usize,
    pub dry_run: bool,
}

/// Evicts every pod of `units`, or none: each is first evicted as a dry run (the budgets are
/// asked), then all for real, each with its uid as precondition; then each is told
/// `message(its unit)`. Returns how many pods were evicted.
pub async fn evict_whole<'u>(
    units: &'u [RunningUnit],
    api: &impl Evictor,
    message: impl Fn(&RunningUnit) -> String,
) -> Result<usize, Stopped<'u>> {
    let mut pods: Vec<(&RunningUnit, &super::decision::RunningPod)> = Vec::new();
    for unit in units {
        pods.extend(unit.pods.iter().map(|pod| (unit, pod)));
    }
    let uids: Vec<Option<String>> = pods.iter().map(|(_, pod)| pod.uid.as_ref().map(PodUid::to_string)).collect();
    for (&(unit, pod), uid) in pods.iter().zip(&uids) {
        if let Err(why) = api.evict(&pod.namespace, &pod.name, uid.as_deref(), true).await {
            return Err(Stopped { unit, pod: pod.name.clone(), why, evicted: 0, dry_run: true });
        }
    }
    let mut evicted = 0;
    for (&(unit, pod), uid) in pods.iter().zip(&uids) {
        if let Err(why) = api.evict(&pod.namespace, &pod.name, uid.as_deref(), false).await {
            return Err(Stopped { unit, pod: pod.name.clone(), why, evicted, dry_run: false });
        }
        evicted += 1;
    }
    for (&(unit, pod), uid) in pods.iter().zip(&uids) {
        api.tell_victim(&pod.namespace, &pod.name, uid.as_deref(), &message(unit)).await;
    }
    Ok(evicted)
}

#[allow(clippy::too_many_arguments)]
async fn refused(
    p: &Preemption,
    api: &impl Evictor,
    memory: &mut Memory,
    now: i64,
    unit: &RunningUnit,
    pod: &str,
    why: EvictionError,
    evicted: usize,
) -> Outcome {
    memory.spare(unit.key.clone(), now.saturating_add(REFUSAL_RETRY_SECS));
    if let Some(member) = &p.first_member {
        let message = format!(
            "evicting pod {}/{pod} of {} to make room was refused ({why}); it is spared for {REFUSAL_RETRY_SECS}s: \
             choosing other victims, or waiting",
            unit.pods.first().map_or("", |p| p.namespace.as_str()),
            unit.key
        );
        api.tell_preemptor(&p.preemptor.namespace, member, REFUSED_REASON, &message).await;
    }
    Outcome::Refused { unit: unit.key.clone(), pod: pod.to_string(), why, evicted }
}

#[cfg(test)]
#[path = "preemption_tests.rs"]
mod tests;
