//! The gang snapshot: the pure [`Snapshot`] the decision runs on, built from the cluster view
//! in one pass, plus what the plan needs to know of each gang ([`GangFacts`]): its gated
//! members, what already runs, its timeout.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::decision::{
    Domain, GangKey, GangTopology, Member, Phantoms, Preemptor, Snapshot, StrayMember, ToldLate, Unplaceable,
    WaitingGang,
};
use crate::admission::directory::Peer;
use crate::control::cluster::{ClusterState, ClusterView, GangRef, PodRecord, PodShape, PodUid};
use crate::model::gang::membership::{OwnerGang, QUOTA_GATE};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::{GangPolicy, OnStartTimeout, OnTimeout, PolicySet};
use crate::model::quantity::Quantity;
use crate::model::resources::{self, ResourceList};

/// A gated member, as needed to release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRef {
    pub name: String,
    pub uid: Option<PodUid>,
    pub gate_index: usize,
    pub has_annotations: bool,
    /// `spec.nodeSelector` has entries: a topology pin is added to it, else set whole.
    pub has_node_selector: bool,
    /// Fingerprint of its `allot.dev/GangReady` condition as the pod carries it (0: none).
    pub condition: u64,
}

/// The topology domain a gang's released members are in, innermost level first: from a bound
/// member's node labels or a released member's node selector (its pin).
fn peer_domain(g: &WaitingGang, gf: &GangFacts, nodes: &[crate::control::cluster::NodeInfo]) -> Option<Domain> {
    let topology = g.topology.as_ref()?;
    topology.levels.iter().find_map(|level| {
        let pinned = gf.peer_selectors.iter().find(|(k, _)| k == level).map(|(_, v)| v.clone());
        let bound = || {
            gf.peer_nodes.iter().find_map(|name| {
                nodes.iter().find(|n| n.name.as_str() == &**name).and_then(|n| n.labels.get(level).cloned())
            })
        };
        pinned.or_else(bound).map(|value| Domain { level: level.clone(), value })
    })
}

/// The levels a gang is placed by, one more member seen: the policy's, tightened by the level
/// the member asks for (`allot.dev/topology`) where that is tighter than what the gang has. An
/// ask the policy does not allow is left out: admission refuses it at CREATE, and a pod that
/// carries one from before a policy change gets the policy's own levels.
fn tighter(
    current: Option<GangTopology>,
    policy: Option<&crate::model::policy::topology::Topology>,
    asked: Option<&str>,
) -> Option<GangTopology> {
    let policy = policy?;
    let mine = policy.for_gang(asked).or_else(|_| policy.for_gang(None)).ok()?;
    match current {
        Some(current) if (current.levels.len(), !current.required) <= (mine.levels.len(), !mine.required) => {
            Some(current)
        }
        _ => Some(mine),
    }
}

/// What a gang of `team` may evict ([`crate::model::policy::preemption`]); `None`: nothing.
fn preemptor_of(policies: &PolicySet, team: Option<&crate::model::policy::Team>) -> Option<Preemptor> {
    let rights = policies.preemption_of(team);
    rights.evicts_anyone().then(|| Preemptor {
        team: team.map(|t| t.name.clone()),
        within_team: rights.within_team,
        other_teams: rights.other_teams,
    })
}

/// Effective requests (+ `pods: 1`) of a LeaderWorkerSet's worker template.
fn worker_requests(owner: &OwnerGang) -> Option<ResourceList> {
    let spec = owner.worker_template.as_ref()?.get("spec")?;
    let mut requests = resources::pod_requests(spec);
    requests.insert("pods".into(), Quantity::from_units(1));
    Some(requests)
}

/// Per gang: its gated members and what its policy says.
#[derive(Debug, Clone, Default)]
pub struct GangFacts {
    /// LeaderReady groups: how many workers are still to come, and what each will request.
    pub leader_first_workers: Option<(u32, Option<ResourceList>)>,
    pub gated: Vec<MemberRef>,
    /// Members already released (running or about to).
    pub released: u32,
    pub assembly_timeout: i64,
    pub on_timeout: OnTimeout,
    /// Seconds a released member may stay unbound before the gang has failed to start
    /// ([`crate::model::policy::GangPolicy::start_timeout`]), and what happens then.
    pub start_timeout: i64,
    pub on_start_timeout: OnStartTimeout,
    /// Its present members Allot's gang gate no longer holds (released, bound or not), by name:
    /// whose start it times, and whom it deletes when the gang fails to start.
    pub started: Vec<StartedMember>,
    /// What each gated member says the gang is, to find members that disagree.
    terms: Vec<(Arc<str>, Terms)>,
    /// Some gated member's terms differ from the first one's (then `terms` is looked at).
    members_differ: bool,
    /// The newest present member Allot's gang gate no longer holds (released, running),
    /// by [`crate::control::cluster::PodRecord::order_key`]: the gang is complete only since it came too.
    newest_ungated: Option<(i64, i64)>,
    /// The latest quota lift among its gated members (seconds): the gang could not go before.
    quota_lifted: Option<i64>,
    /// Where its released members are: the nodes of the bound ones, the node selectors of the
    /// others (their topology pin among them). A gated member joining them must land in their
    /// topology domain, not in the best one for itself.
    peer_nodes: Vec<Arc<str>>,
    peer_selectors: Vec<(String, String)>,
}

/// A present member the gang gate no longer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedMember {
    pub name: String,
    pub uid: Option<PodUid>,
    /// Fingerprint of its `allot.dev/GangReady` condition as the pod carries it (0: none).
    pub condition: u64,
    /// Not bound yet, released by Allot at this time (seconds, as
    /// [`crate::control::cluster::PodRecord::released_since`] believes it): its gang's start clock runs.
    pub unbound_since: Option<i64>,
    /// Bound, released by Allot at this time (as believed the same way): whether it started
    /// with the members still unbound, or long before them (a running gang's older members,
    /// which a late replacement must not take down with it).
    pub bound_released: Option<i64>,
}

/// How long past its start timeout a gang that failed to start under `onStartTimeout: Fail`
/// keeps its reservation (seconds): its members are being deleted, and until they are gone
/// (or their deletion has been retried this long) no other gang is released onto the capacity
/// a member not yet deleted may still take. Bounded, so a deletion the API keeps refusing does
/// not hold the nodes forever.
pub const FAILED_START_HOLD: i64 = 60;

impl GangFacts {
    /// The members a failed start takes down: every one released with the unbound ones or
    /// after them (bound or not), and the gated ones. Members that ran before the earliest
    /// unbound one was released (a running gang whose replacement cannot bind) keep running.
    pub fn failed_start_members(&self) -> Vec<(&str, Option<&PodUid>)> {
        let Some(batch) = self.started.iter().filter_map(|m| m.unbound_since).min() else { return Vec::new() };
        let started =
            self.started.iter().filter(|m| m.unbound_since.is_some() || m.bound_released.is_some_and(|at| at >= batch));
        let gated = self.gated.iter().map(|m| (m.name.as_str(), m.uid.as_ref()));
        gated.chain(started.map(|m| (m.name.as_str(), m.uid.as_ref()))).collect()
    }

    /// When the gang has failed to start if some member is still unbound by then: its earliest
    /// unbound member's release plus its start timeout; `None` when no released member waits.
    pub fn start_deadline(&self) -> Option<i64> {
        let earliest = self.started.iter().filter_map(|m| m.unbound_since).min()?;
        Some(earliest.saturating_add(self.start_timeout))
    }

    /// How long after its release a member of this gang reserves capacity while unbound: the
    /// start timeout, and under `Fail` the time its deletion may take ([`FAILED_START_HOLD`]).
    pub fn reservation_hold(&self) -> i64 {
        match self.on_start_timeout {
            OnStartTimeout::Fail => self.start_timeout.saturating_add(FAILED_START_HOLD),
            OnStartTimeout::Warn => self.start_timeout,
        }
    }
}

/// Builds the gang snapshot from a cluster view.
pub trait GangSnapshot {
    /// The snapshot the decision runs on at `now`, plus what actions need to know of each gang.
    fn snapshot(
        &self,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        now: i64,
    ) -> (Snapshot, HashMap<GangKey, GangFacts>);
}

impl GangSnapshot for ClusterState {
    /// Reads only the pods in play (gang members off nodes, gated pods, members told late),
    /// the members of their gangs and the nodes' kept loads: O(those), not O(every pod)
    /// (issue 49; [`snapshot_by_walking`] is the walk it replaces, kept as the reference).
    fn snapshot(
        &self,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        now: i64,
    ) -> (Snapshot, HashMap<GangKey, GangFacts>) {
        let view = self.view();
        let mut walk = Walk::new(TeamsByNamespace::new(policies, labels));
        for p in view.gang_pass_pods() {
            walk.take_in(&view, p, policies, now);
        }
        let keys: Vec<GangKey> = walk.facts.keys().cloned().collect();
        for key in keys {
            for p in view.gang_pods(&key.namespace, &key.name) {
                count_running(p, &mut walk.facts, now);
            }
        }
        let bound = view.node_loads();
        assemble(&view, walk, bound, policies, labels, now)
    }
}

/// The gang snapshot by a walk over every pod, in name order: what [`GangSnapshot::snapshot`]
/// must equal (its property test). Not for production: O(every pod) under the view's lock.
#[doc(hidden)]
pub fn snapshot_by_walking(
    state: &ClusterState,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    now: i64,
) -> (Snapshot, HashMap<GangKey, GangFacts>) {
    let view = state.view();
    let mut walk = Walk::new(TeamsByNamespace::new(policies, labels));
    let mut pods: Vec<&PodRecord> = view.pods().collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    for p in &pods {
        walk.pod(&view, p, policies, now);
    }
    for p in &pods {
        count_running(p, &mut walk.facts, now);
    }
    let mut bound: Vec<(String, ResourceList)> = std::mem::take(&mut walk.bound)
        .into_iter()
        .filter(|(n, _)| view.has_node(n))
        .map(|(n, r)| (n.to_string(), r))
        .collect();
    bound.sort_by(|a, b| a.0.cmp(&b.0));
    assemble(&view, walk, bound, policies, labels, now)
}

/// The snapshot from what the walk gathered and the nodes' loads (`bound`, by node name).
fn assemble(
    view: &ClusterView<'_>,
    mut walk: Walk<'_>,
    bound: Vec<(String, ResourceList)>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    now: i64,
) -> (Snapshot, HashMap<GangKey, GangFacts>) {
    for gf in walk.facts.values_mut() {
        // By name: the watch's order is not stable, the plan's actions and words must be.
        gf.started.sort_by(|a, b| a.name.cmp(&b.name));
    }
    walk.disagreements();
    let Walk { in_flight, waiting, facts, strays, mut told_late, .. } = walk;
    let nodes = nodes_with_devices(view, policies);
    let gangs = waiting
        .into_values()
        .map(|g| {
            let gf = facts.get(&g.key);
            finish(g, gf, &nodes)
        })
        .collect::<Vec<WaitingGang>>();
    // Running work is read only when some complete waiting gang could evict it: below the
    // highest priority among them (nothing else can be a victim), from the running pods the
    // store keeps by namespace and priority.
    let complete = |g: &&WaitingGang| g.held_by.is_none() && g.expected.is_some_and(|n| g.present() >= u64::from(n));
    let preemptors: Vec<&WaitingGang> = gangs.iter().filter(|g| g.preemptor.is_some()).filter(complete).collect();
    let preempting = preemptors.iter().map(|g| g.priority).max();
    // Only the namespaces whose teams some preemptor may evict from.
    let in_reach =
        |team: Option<&str>| preemptors.iter().filter_map(|g| g.preemptor.as_ref()).any(|p| p.may_evict(team));
    let running = preempting
        .map(|below| super::victims::running_units(view, policies, labels, below, &in_reach, now))
        .unwrap_or_default();
    let preemptions = super::victims::preemptions_shown(view);
    // By name: the watch's order is not stable, the plan's actions must be.
    told_late.sort_by(|a, b| (&a.gang, &a.name).cmp(&(&b.gang, &b.name)));
    let snapshot = Snapshot {
        now,
        nodes,
        bound,
        in_flight,
        gangs,
        accelerators: (*policies.accelerators).clone(),
        strays,
        told_late,
        running,
        preemptions,
        reclaiming: Vec::new(),
    };
    (snapshot, facts)
}

/// What the walk over the pods gathers for a snapshot.
struct Walk<'p> {
    teams: TeamsByNamespace<'p>,
    /// By node: what its bound pods request, summed (5,000 entries for the simulation, not
    /// 100,000).
    bound: HashMap<Arc<str>, ResourceList>,
    /// Shared claims a bound pod holds: their devices are taken once, on its node.
    bound_claims: HashSet<(Arc<str>, Arc<str>)>,
    /// Released members not bound yet: what they will take.
    in_flight: Vec<PodShape>,
    waiting: BTreeMap<GangKey, WaitingGang>,
    facts: HashMap<GangKey, GangFacts>,
    strays: Vec<StrayMember>,
    told_late: Vec<ToldLate>,
}

impl<'p> Walk<'p> {
    fn new(teams: TeamsByNamespace<'p>) -> Walk<'p> {
        Walk {
            teams,
            bound: HashMap::new(),
            bound_claims: HashSet::new(),
            in_flight: Vec::new(),
            waiting: BTreeMap::new(),
            facts: HashMap::new(),
            strays: Vec::new(),
            told_late: Vec::new(),
        }
    }

    /// Takes in one pod of the walk over every pod: what it takes on its node, then the rest.
    fn pod(&mut self, view: &ClusterView<'_>, p: &PodRecord, policies: &'p PolicySet, now: i64) {
        if let Some(node) = p.node_name.as_ref().filter(|_| !p.finished) {
            // A terminating pod still holds its devices until it is gone: it counts here.
            self.bound_pod(node, p);
        }
        self.take_in(view, p, policies, now);
    }

    /// Takes in one pod beyond its node's load: only a pod that [`crate::control::cluster::store::takes_part`] gets past the
    /// early returns.
    fn take_in(&mut self, view: &ClusterView<'_>, p: &PodRecord, policies: &'p PolicySet, now: i64) {
        if p.finished {
            return;
        }
        if p.told_late_and_bound()
            && let Some(g) = &p.gang
        {
            let size = g.declared_size(view.owner_gang(&p.namespace, &g.name));
            self.told_late.push(ToldLate {
                gang: GangKey { namespace: p.namespace.to_string(), name: g.name.clone() },
                name: p.name.to_string(),
                condition: p.gang_condition,
                gang_whole: size.is_none_or(|n| view.gang_present(&p.namespace, &g.name) >= n),
            });
        }
        if p.node_name.is_some() {
            return;
        }
        // An unbound pod being deleted will not be scheduled: it reserves nothing on a node,
        // and it is no member of its gang's quorum any more.
        if p.terminating {
            return;
        }
        let Some(g) = &p.gang else {
            if p.gate_index.is_some() {
                let (namespace, name) = (p.namespace.to_string(), p.name.to_string());
                self.strays.push(StrayMember { namespace, name, condition: p.gang_condition });
            }
            return;
        };
        let key = GangKey { namespace: p.namespace.to_string(), name: g.name.clone() };
        let team = self.teams.get(&p.namespace);
        let policy = policies.gang_policy(&p.namespace, team.map(|t| t.name.as_str()));
        let gf = self.facts.entry(key.clone()).or_default();
        gf.start_timeout = i64::try_from(policy.start_timeout.as_secs()).unwrap_or(i64::MAX);
        gf.on_start_timeout = policy.on_start_timeout;
        if p.gate_index.is_none() {
            gf.newest_ungated = gf.newest_ungated.max(Some(p.order_key()));
            gf.started.push(StartedMember {
                name: p.name.to_string(),
                uid: p.uid.clone(),
                condition: p.gang_condition,
                unbound_since: p.released_since(now),
                bound_released: None,
            });
        }
        // Members another gate still holds (the quota queue's, a third party's) are waiting
        // members too: counted, explained and timed out, never released before it goes.
        if let Some(gate_index) = p.gate_index {
            let preemptor = || preemptor_of(policies, team);
            self.gated_member(view, p, g, key, gate_index, &policy, preemptor);
        } else if p.reserves_release(now, gf.reservation_hold()) {
            // Released, not yet bound: the reservation ledger, held until the gang's start
            // timeout (then it has failed to start, see `plan`).
            self.in_flight.push(p.shape());
            gf.released += 1;
            if let Some(placement) = &p.placement {
                gf.peer_selectors.extend(placement.node_selector.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
    }

    /// A bound pod: what it and the shared claims it holds take on its node.
    fn bound_pod(&mut self, node: &Arc<str>, p: &PodRecord) {
        let used = self.bound.entry(node.clone()).or_default();
        for (name, q) in &p.requests {
            let slot = used.entry(name.to_string()).or_default();
            *slot = slot.saturating_add(*q);
        }
        for claim in p.held_claims() {
            if self.bound_claims.insert((p.namespace.clone(), claim.name.clone())) {
                for (name, q) in claim.devices.iter() {
                    let slot = used.entry(name.to_string()).or_default();
                    *slot = slot.saturating_add(*q);
                }
            }
        }
    }

    /// A member behind a gate: one more of its waiting gang.
    #[allow(clippy::too_many_arguments)]
    fn gated_member(
        &mut self,
        view: &ClusterView<'_>,
        p: &PodRecord,
        g: &GangRef,
        key: GangKey,
        gate_index: usize,
        policy: &GangPolicy,
        preemptor: impl FnOnce() -> Option<Preemptor>,
    ) {
        let gf = self.facts.entry(key.clone()).or_default();
        gf.gated.push(MemberRef {
            name: p.name.to_string(),
            uid: p.uid.clone(),
            gate_index,
            has_annotations: p.has_annotations,
            has_node_selector: p.placement.as_ref().is_some_and(|pl| !pl.node_selector.is_empty()),
            condition: p.gang_condition,
        });
        let owner = view.owner_gang(&p.namespace, &g.name);
        let entry = self.waiting.entry(key.clone()).or_insert_with(|| WaitingGang {
            key,
            expected: g.declared_size(owner),
            members: Vec::new(),
            priority: p.priority,
            created: p.created,
            ready: p.order_key(),
            held_by: None,
            disagreement: None,
            unplaceable: None,
            starvation_after: Some(policy.starvation_after.as_secs() as i64),
            phantoms: None,
            topology: None,
            joins: None,
            preemptor: preemptor(),
        });
        if p.preempt_never {
            entry.preemptor = None;
        }
        // (A member that asks nothing leaves the gang's levels as they are: no copy.)
        if entry.topology.is_none() || g.topology.is_some() {
            entry.topology = tighter(entry.topology.take(), policy.topology.as_ref(), g.topology.as_deref());
        }
        if p.quota_gate_index.is_some() {
            entry.held_by = Some(format!("the team's quota queue ({QUOTA_GATE})"));
        } else if p.other_gates && entry.held_by.is_none() {
            entry.held_by = Some("another scheduling gate".to_string());
        }
        if let Some(excess) = p.placement_excess()
            && entry.unplaceable.as_ref().is_none_or(|u| *p.name < *u.member)
        {
            // The first by name: the watch's order is not stable, the words must be.
            entry.unplaceable = Some(Unplaceable { member: p.name.to_string(), excess });
        }
        entry.members.push(Member { name: p.name.to_string(), shape: p.shape() });
        let terms = Terms::of(g);
        gf.members_differ |= gf.terms.first().is_some_and(|(_, first)| *first != terms);
        gf.terms.push((p.name.clone(), terms));
        if g.leader {
            gf.leader_first_workers =
                owner.filter(|o| o.leader_first).map(|o| (o.size.saturating_sub(1), worker_requests(o)));
        }
        entry.priority = entry.priority.max(p.priority);
        // The oldest member starts the assembly timeout; the newest says since when the gang is
        // complete (its order and starvation clock, see `finish`).
        entry.created = entry.created.min(p.created);
        entry.ready = entry.ready.max(p.order_key());
        // On a member still behind the gang gate, only the quota lift can have set it.
        gf.quota_lifted = gf.quota_lifted.max(p.released_at);
        gf.assembly_timeout = policy.assembly_timeout.as_secs() as i64;
        gf.on_timeout = policy.on_timeout;
    }

    /// Members of one gang that disagree on its terms: the first disagreement, said on the
    /// gang, and no size to wait for.
    fn disagreements(&mut self) {
        for (key, gf) in self.facts.iter_mut().filter(|(_, gf)| gf.members_differ) {
            if let Some(gang) = self.waiting.get_mut(key) {
                gang.disagreement = first_disagreement(&mut gf.terms);
                // Which size the gang waits for would be whichever member the watch listed first.
                if gf.terms.iter().any(|(_, t)| t.size != gf.terms[0].1.size) {
                    gang.expected = None;
                }
            }
        }
    }
}

/// The nodes as the fit sees them: where the ResourceSlices have been read, each node's
/// allocatable with the DRA devices it offers ([`crate::model::dra::slices::add_node_devices`]).
fn nodes_with_devices(view: &ClusterView<'_>, policies: &PolicySet) -> Vec<crate::control::cluster::NodeInfo> {
    let devices = view.node_devices();
    view.nodes()
        .map(|n| {
            let mut node = n.clone();
            if let Some(devices) = devices {
                crate::model::dra::slices::add_node_devices(
                    &mut node.allocatable,
                    &node.name,
                    devices,
                    &policies.device_classes,
                );
            }
            node
        })
        .collect()
}

/// What admission holds every member of a gang to agree on ([`Peer::first_difference`]), as the
/// watch read it (interned: compared for every gated member on every pass).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Terms {
    size: Option<u32>,
    priority_class: Option<Arc<str>>,
    scheduler_name: Option<Arc<str>>,
}

impl Terms {
    /// The member `name` as admission's comparison sees it (only when one differs).
    fn peer(&self, name: &str) -> Peer {
        Peer {
            pod: name.to_string(),
            size: self.size,
            priority_class: self.priority_class.as_deref().map(String::from),
            scheduler_name: self.scheduler_name.as_deref().map(String::from),
        }
    }

    fn of(gang: &GangRef) -> Terms {
        Terms {
            size: gang.size,
            priority_class: gang.priority_class.clone(),
            scheduler_name: gang.scheduler_name.clone(),
        }
    }
}

/// What stands out among a gang's gated members, in words, when they disagree: on the first
/// field ([`Peer::FIELDS`]: size, priority class, scheduler) on which any two differ, the member
/// first by name without the value most of them share ("member w-3 has schedulerName volcano, 3
/// others have default-scheduler"), or, when no value is shared by most, the first two by name
/// that differ. Worked out in name order: the watch's order is not stable, and the message is
/// the condition the members carry, which must not change from one pass to the next while they
/// stay as they are.
fn first_disagreement(members: &mut [(Arc<str>, Terms)]) -> Option<String> {
    members.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let peers: Vec<Peer> = members.iter().map(|(name, t)| t.peer(name)).collect();
    let first = peers.first()?;
    let field = Peer::FIELDS.into_iter().find(|f| peers.iter().any(|p| p.differs(first, f)))?;
    let shown: Vec<String> = peers.iter().map(|p| p.shown(field)).collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for value in &shown {
        *counts.entry(value).or_default() += 1;
    }
    let most = counts.values().copied().max().unwrap_or(0);
    let mut common = counts.iter().filter(|(_, n)| **n == most).map(|(value, _)| *value);
    let odd = |than: &str| peers.iter().zip(&shown).find(|(_, v)| v.as_str() != than);
    match (common.next(), common.next()) {
        (Some(common), None) => {
            let (member, value) = odd(common)?;
            Some(format!("member {} has {field} {value}, {most} others have {common}", member.pod))
        }
        _ => {
            let (other, value) = odd(&shown[0])?;
            Some(format!("members {} and {} disagree on {field} ({} and {value})", first.pod, other.pod, shown[0]))
        }
    }
}

/// Members already running (released and bound) count towards the quorum of their gang, so a
/// replacement or a member whose release failed can still go ([`finish`]: only while they
/// and the gated members fit in the declared size). `p` is one pod of a gang the walk met.
fn count_running(p: &PodRecord, facts: &mut HashMap<GangKey, GangFacts>, now: i64) {
    if p.present()
        && p.node_name.is_some()
        && p.gate_index.is_none()
        && let Some(g) = &p.gang
        && let Some(gf) = facts.get_mut(&GangKey { namespace: p.namespace.to_string(), name: g.name.clone() })
    {
        gf.released += 1;
        gf.peer_nodes.extend(p.node_name.clone());
        gf.newest_ungated = gf.newest_ungated.max(Some(p.order_key()));
        gf.started.push(StartedMember {
            name: p.name.to_string(),
            uid: p.uid.clone(),
            condition: p.gang_condition,
            unbound_since: None,
            bound_released: p.believed_gang_release(now),
        });
    }
}

/// A waiting gang as the decision takes it: the bar lowered by what already runs, phantom
/// workers for a LeaderReady leader, members in name order.
fn finish(mut g: WaitingGang, gf: Option<&GangFacts>, nodes: &[crate::control::cluster::NodeInfo]) -> WaitingGang {
    // Members already released count towards the quorum only while they and the gated ones
    // fit in the declared size. More means the name was used again (4 members of an earlier
    // gang g still running, 4 new pods labelled g): counting them would lower the bar to
    // nothing and release the new ones one by one.
    let released = gf.map_or(0, |f| f.released);
    let gated = u64::try_from(g.members.len()).unwrap_or(u64::MAX);
    let released = if g.expected.is_some_and(|n| u64::from(released).saturating_add(gated) <= u64::from(n)) {
        released
    } else {
        0
    };
    // Able to go since its newest member came (gated or not), or since its team's quota let
    // it go if that is later: the tie within that second stays the newest member's arrival.
    if let Some(newest) = gf.and_then(|f| f.newest_ungated) {
        g.ready = g.ready.max(newest);
    }
    if let Some(lifted) = gf.and_then(|f| f.quota_lifted)
        && lifted > g.ready.0
    {
        g.ready.0 = lifted;
    }
    // The decision counts gated members; lower the bar by what already runs.
    g.expected = g.expected.map(|n| n.saturating_sub(released));
    if released > 0
        && let Some(gf) = gf
    {
        g.joins = peer_domain(&g, gf, nodes);
    }
    // LeaderReady: the leader alone is gated, its workers do not exist yet. It goes when the
    // whole group would fit: its workers are placed as phantoms (one shape and a count, never one
    // entry per declared worker: the count is the tenant's number), so only the leader is released.
    if let Some((workers, Some(requests))) = gf.and_then(|f| f.leader_first_workers.clone())
        && released == 0
        && g.members.len() == 1
        && workers > 0
    {
        let shape = PodShape { requests, placement: g.members[0].shape.placement.clone() };
        g.phantoms = Some(Phantoms { count: workers, shape });
    }
    g.members.sort_by(|a, b| a.name.cmp(&b.name));
    g
}

#[cfg(test)]
mod tests;
