//! The gang controller's decision: a pure function from a snapshot of the cluster to the gangs
//! to release now. No I/O, no clock, no randomness: the same snapshot gives the same answer.
//!
//! **Algorithm.** Resources start as node allocatable minus bound pods; then members released
//! earlier but not yet bound (the reservation ledger) are placed, so two gangs are never released
//! onto the same free GPUs. Waiting gangs are taken by priority (high first), then by when each
//! became able to go (its newest member's creation, or its team's quota lift if later; earlier
//! first). A gang is released only when all its expected members exist and every member
//! finds a node at once (first-fit-decreasing, best fit on the member's largest accelerator, all
//! scheduler filters of [`super::fit`]); a gang that does not fit leaves the resources as they were.
//!
//! **Backfill and starvation.** A gang that does not fit does not stop smaller, later gangs from
//! using what is free (backfill) — until it has waited `starvation_after` since it became able
//! to go ([`WaitingGang::ready`]); from then on no gang
//! behind it that competes for its nodes is released, so what frees up there accumulates for it.
//! Incomplete gangs never block. A starving gang holds back only what could help it, since every
//! field of it is a tenant's: it must fit the nodes as if they were empty (a gang that never
//! could — a selector no node matches, more GPUs than a node has — is told so and blocks
//! nobody), and it holds back only gangs that may use one of the nodes it may use (a gang in
//! another pool goes on backfilling there).
//!
//! **Speed.** Static filters (selector, affinity, taints) are computed once per distinct pod
//! placement key; free capacity of the nodes of each key is indexed per accelerator in a
//! `BTreeSet<(free, node)>`, so a best-fit lookup is a range query, and each key's total free
//! lets a gang that cannot fit be rejected without touching nodes.

use super::fit::{NodeRefusal, fits};
use crate::control::cluster::{NodeInfo, PodShape};
use crate::model::gang::bounds::PlacementExcess;
pub use crate::model::policy::topology::GangTopology;
use crate::model::quantity::Quantity;
use crate::model::resources::{ResourceList, ResourceMatcher};

/// A gang's identity: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GangKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for GangKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A gated member.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub name: String,
    pub shape: PodShape,
}

/// A gang waiting for release.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingGang {
    pub key: GangKey,
    /// Expected members; `None` when the size is not known (yet).
    pub expected: Option<u32>,
    /// Gated members present.
    pub members: Vec<Member>,
    pub priority: i32,
    /// Creation time of the oldest member (seconds): its assembly timeout runs from here.
    pub created: i64,
    /// When the gang became able to go, as `(second, nanoseconds)`: its newest present
    /// member's place in arrival order ([`crate::control::cluster::PodRecord::order_key`]: creation
    /// second, then arrival), moved to the second its team's quota queue let it go if that is
    /// later (the tie within that second still broken by the newest member's arrival). Gangs
    /// are ordered by it, and its starvation clock starts from it. Not the oldest member:
    /// one placeholder created a month early would otherwise put a gang ahead of every gang
    /// completed since and make it a starving blocker the moment it is complete; nor the time
    /// it waited behind its own team's quota, which it could not have used.
    pub ready: (i64, i64),
    /// Why some member is not Allot's to release yet: another gate it still carries (its
    /// team's quota queue, a third party's). Such a gang is never placed and never blocks
    /// anyone, but it is counted, explained and timed out like any waiting gang.
    pub held_by: Option<String>,
    /// Members that disagree on what admission holds every member to (size, priority class,
    /// scheduler), e.g. "member w-3 has schedulerName volcano, 3 others have
    /// default-scheduler". Admission compares a new member with those the watch has shown; two
    /// created at the same moment each pass before the other is seen. Such a gang is never
    /// released: half of it would hold its nodes for a peer another scheduler (or nobody) places.
    pub disagreement: Option<String>,
    /// A gated member whose placement was over Allot's bounds ([`crate::model::gang::bounds`]), the
    /// first by name: the view did not keep where it may go, so the gang is never released
    /// (releasing it blind could hold nodes none of it may use), and is told why.
    pub unplaceable: Option<Unplaceable>,
    /// After this many seconds of waiting while not fitting, no later gang competing for its
    /// nodes may pass it (if it could fit them empty); `None`: never blocks.
    pub starvation_after: Option<i64>,
    /// Members that do not exist yet but must fit with the gang (a LeaderReady group's
    /// workers): one shape and a count, never one entry per member, since the count comes
    /// from an object a tenant writes.
    pub phantoms: Option<Phantoms>,
    /// The topology levels it must or should land wholly inside (its GangPolicy's `topology`,
    /// tightened by its members' `allot.dev/topology`); `None`: any nodes.
    pub topology: Option<GangTopology>,
    /// The topology domain its released members already run in: the gated ones (replacements,
    /// a lift that failed) must join them there, whatever domain would suit them alone.
    pub joins: Option<Domain>,
    /// What it may evict when it does not fit ([`preemption`]); `None`: it waits instead.
    pub preemptor: Option<Preemptor>,
}

/// A member over the placement bounds and the bound it passed.
#[derive(Debug, Clone, PartialEq)]
pub struct Unplaceable {
    pub member: String,
    pub excess: PlacementExcess,
}

/// `count` members of one shape that are not created yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Phantoms {
    pub count: u32,
    pub shape: PodShape,
}

impl WaitingGang {
    /// Members the decision counts as present: the gated ones and the phantoms.
    pub fn present(&self) -> u64 {
        self.members.len() as u64 + u64::from(self.phantoms.as_ref().map_or(0, |p| p.count))
    }
}

/// Everything the decision looks at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub now: i64,
    pub nodes: Vec<NodeInfo>,
    /// `(node, requests)` of non-terminal pods bound to nodes.
    pub bound: Vec<(String, ResourceList)>,
    /// Released but not yet bound members: reserved before anything else is placed.
    pub in_flight: Vec<PodShape>,
    pub gangs: Vec<WaitingGang>,
    /// Which resources messages talk about.
    pub accelerators: ResourceMatcher,
    /// Pods behind Allot's gang gate that are in no gang under the current policies: never
    /// released, only told why (the decision does not read them).
    pub strays: Vec<StrayMember>,
    /// Bound gang members whose condition still says their gang did not start: told it
    /// started after all once it is no longer past its start timeout.
    pub told_late: Vec<ToldLate>,
    /// Running work a preemption may evict (plain pods and whole released gangs).
    pub running: Vec<RunningUnit>,
    /// Preemptions in flight: their victims' nodes, and the gangs they make room for.
    pub preemptions: Vec<InFlight>,
    /// Gangs a reclaim of their team's lent quota makes room for (its victims still there):
    /// they wait for it and preempt nobody meanwhile (the room is not made twice).
    pub reclaiming: Vec<GangKey>,
}

/// A bound gang member carrying the start-timeout condition
/// ([`crate::control::cluster::PodRecord::told_late_and_bound`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToldLate {
    pub gang: GangKey,
    pub name: String,
    /// Fingerprint of its `allot.dev/GangReady` condition as the pod carries it.
    pub condition: u64,
    /// Its gang is whole: as many members present (neither finished nor being deleted) as it
    /// or its owner declares. Without it, the bound members of a gang one of whose members is
    /// being deleted or was just deleted (its replacement not made yet) would be told the gang
    /// started. (A told member's gang was released, so its size is known.)
    pub gang_whole: bool,
}

/// A pod behind Allot's gang gate whose metadata names no valid gang under the current
/// policies: a GangPolicy that inferred its gang changed, a `maxGangSize` lowered below its
/// size, or it was created while Allot's webhook was down. Allot cannot release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrayMember {
    pub namespace: String,
    pub name: String,
    /// Fingerprint of its `allot.dev/GangReady` condition as the pod carries it (0: none).
    pub condition: u64,
}

/// What happens to one gang.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Lift the gates now; `(member, node)` is where the simulation placed each, and the
    /// topology domain the whole gang was placed in (its members are pinned there), if any.
    Release { placements: Vec<(String, String)>, domain: Option<Domain> },
    /// Not all members exist yet (or the size is unknown).
    Incomplete,
    /// All members exist; the nodes cannot hold them all now.
    DoesNotFit,
    /// Held behind a higher-priority gang that has waited past its starvation limit, could fit
    /// the nodes if they were empty, and may use some node this gang may use.
    Blocked { by: GangKey },
    /// All members exist; another gate holds some of them ([`WaitingGang::held_by`]).
    Held,
    /// Members disagree ([`WaitingGang::disagreement`]): never released as they are, timed out
    /// like a gang that has not assembled.
    Disagrees,
    /// A member's placement is over the bounds ([`WaitingGang::unplaceable`]): never released,
    /// timed out like a gang that has not assembled.
    Unplaceable,
    /// All members exist and do not fit; evicting these (cheapest first) makes room, and the
    /// gang would then go to `placements` (in `domain`).
    Preempt { victims: Vec<RunningUnit>, placements: Placements, domain: Option<Domain> },
    /// Its preemption is in flight: it waits for its victims to go, and the room they leave is
    /// held for it (no later gang is released there meanwhile).
    Preempting,
}

impl Verdict {
    /// The gang has not assembled as it should (members missing, or members that disagree):
    /// its assembly timeout applies.
    pub fn awaits_assembly(&self) -> bool {
        matches!(self, Verdict::Incomplete | Verdict::Disagrees | Verdict::Unplaceable)
    }
}

/// One domain of a topology level: the nodes whose label `level` has the value `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub level: String,
    pub value: String,
}

/// The verdict and its explanation for one gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub gang: GangKey,
    pub verdict: Verdict,
    /// For every member's condition and Event:
    /// "3/4 members present; needs 4 nvidia.com/gpu on nodes matching node-type=x, 2 free".
    pub message: String,
}

/// Orders gangs as they are considered: priority, then when each became able to go
/// ([`WaitingGang::ready`]: its newest member's creation second, then the order Allot saw that
/// member in); the name only where both are equal.
pub fn order(gangs: &mut [&WaitingGang]) {
    gangs.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.ready.cmp(&b.ready)).then_with(|| a.key.cmp(&b.key)));
}

/// What a gang asks of the nodes and what they have free for it, when the decision looks at it:
/// the structured form of a waiting gang's message ([`Need::message`] is what the controller
/// writes on the members; `allot explain` shows it whole).
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    /// Members the decision counts as present (gated ones and phantoms).
    pub present: u64,
    /// Members expected (after those already running); `None` when the size is not known yet.
    pub expected: Option<u32>,
    /// Where the gang's first member may go (`nodes matching node-type=x`, `any node`); `None`
    /// when no member is there to say.
    pub nodes: Option<String>,
    /// Per accelerator resource: what the whole gang asks (members not created yet counted as
    /// copies of the first), and what is free of it on the nodes the first member may use.
    pub resources: Vec<NeedOf>,
    /// Where the gang requires one topology domain: what the domains have for it.
    pub within: Option<Within>,
}

/// One resource of a [`Need`].
#[derive(Debug, Clone, PartialEq)]
pub struct NeedOf {
    pub resource: String,
    pub needed: Quantity,
    pub free: Quantity,
}

impl Need {
    /// "3/4 members present; needs 4 nvidia.com/gpu on nodes matching node-type=x, 2 free".
    pub fn message(&self) -> String {
        let present = self.present;
        let head = match self.expected {
            Some(n) => format!("{present}/{n} members present"),
            None => format!("{present} members present, gang size not known yet"),
        };
        let Some(nodes) = &self.nodes else { return head };
        if let Some(within) = &self.within {
            return format!("{head}; {}", within.message());
        }
        let mut parts: Vec<String> = self
            .resources
            .iter()
            .map(|r| match r.resource.strip_prefix(crate::model::dra::CLASS_RESOURCE_PREFIX) {
                Some(class) => format!("needs {} {class} devices on {nodes}, {} free", r.needed, r.free),
                None => format!("needs {} {} on {nodes}, {} free", r.needed, r.resource, r.free),
            })
            .collect();
        if parts.is_empty() {
            let expected = self.expected.map_or(present, |n| u64::from(n).max(present));
            parts.push(format!("needs room for {expected} pods on {nodes}"));
        }
        format!("{head}; {}", parts.join("; "))
    }
}

/// One node as a gang's first member sees it when the decision considers the gang: free
/// capacity is what is left after bound pods, released members not yet bound, and the gangs
/// released before it in the same pass.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFit {
    pub node: String,
    /// Why the node's static filters turn the member away (taint, selector, affinity, cordon).
    pub refusal: Option<NodeRefusal>,
    /// How many members of the first member's shape its free capacity holds (0 when refused).
    pub members: u64,
    /// What one member asks beyond its free capacity: `(resource, asked, free)`.
    pub short: Vec<(String, Quantity, Quantity)>,
}

/// Everything the decision knows about one gang: its [`Need`] and the nodes, one by one.
#[derive(Debug, Clone, PartialEq)]
pub struct GangDetail {
    pub need: Need,
    /// Every node, by name.
    pub nodes: Vec<NodeFit>,
    /// The gang's place in consideration order (0 = first).
    pub position: usize,
}

/// Decides which gangs to release, in consideration order.
pub fn decide(snapshot: &Snapshot) -> Vec<Decision> {
    run(snapshot, None).0
}

/// The decision for one gang, with its detail: the very pass [`decide`] makes (every gang ahead
/// of it takes what it takes), looked at when it reaches `gang`. `None` when the gang does not
/// wait (no gated member).
pub fn explain(snapshot: &Snapshot, gang: &GangKey) -> Option<(Decision, GangDetail)> {
    let (decisions, detail) = run(snapshot, Some(gang));
    let decision = decisions.into_iter().find(|d| &d.gang == gang)?;
    Some((decision, detail?))
}

/// The pass: every decision, and the detail of `detail_for` taken when the pass reaches it.
fn run(snapshot: &Snapshot, detail_for: Option<&GangKey>) -> (Vec<Decision>, Option<GangDetail>) {
    let mut pass =
        Pass { snapshot, sim: Simulation::seeded(snapshot), blockers: Vec::new(), empty: None, candidates: None };
    // (Ordered by reference: a copy of every waiting gang, its members' shapes included, was
    // the pass's largest allocation with a thousand gangs waiting.)
    let mut gangs: Vec<&WaitingGang> = snapshot.gangs.iter().collect();
    order(&mut gangs);
    let mut out = Vec::with_capacity(gangs.len());
    let mut detail = None;
    for (position, gang) in gangs.iter().enumerate() {
        if detail_for == Some(&gang.key) {
            detail = Some(pass.sim.detail(gang, &snapshot.accelerators, position));
        }
        let decision = match pass.not_tried(gang) {
            Some(decision) => decision,
            None => pass.try_place(gang),
        };
        out.push(decision);
    }
    (out, detail)
}

/// One decision pass: the simulation every gang is placed in, in order, and what earlier
/// gangs leave to later ones.
struct Pass<'s> {
    snapshot: &'s Snapshot,
    sim: Simulation<'s>,
    /// Starving gangs: no later gang is released onto nodes they may use.
    blockers: Vec<Blocker>,
    /// The nodes with nothing on them: whether a starving gang could ever fit (made once, when
    /// the first gang starves).
    empty: Option<Simulation<'s>>,
    /// The running work a preemption may evict (made when a gang first does not fit).
    candidates: Option<preemption::Candidates<'s>>,
}

impl Pass<'_> {
    /// Why `gang` is not even tried now (members that disagree or can never be placed, a
    /// starving gang ahead, not complete, held by another gate); `None`: it is tried.
    fn not_tried(&mut self, gang: &WaitingGang) -> Option<Decision> {
        let accelerators = &self.snapshot.accelerators;
        let present = gang.present();
        let complete = gang.expected.is_some_and(|n| present >= u64::from(n));
        let decision = |verdict, message| Some(Decision { gang: gang.key.clone(), verdict, message });
        // Before completeness: members that disagree on the size disagree on what complete is.
        if let Some(disagreement) = &gang.disagreement {
            let message = format!(
                "{present} members present; {disagreement}: all members of a gang must agree, delete the member \
                 that differs and create it again as the others are"
            );
            return decision(Verdict::Disagrees, message);
        }
        if let Some(u) = &gang.unplaceable {
            let message = format!(
                "{present} members present; member {}: {}, more than Allot keeps for a pod it holds, so this gang can \
                 never be placed: delete its members and create them again within the bound",
                u.member, u.excess
            );
            return decision(Verdict::Unplaceable, message);
        }
        if complete && gang.held_by.is_none() && !self.blockers.is_empty() {
            let classes = self.sim.classes_of(gang);
            if let Some(by) = self.blockers.iter().find(|b| self.sim.may_use_any(&classes, &b.nodes)) {
                let by = by.gang.clone();
                let message =
                    format!("{}; waiting behind higher-priority gang {by}", self.sim.need_message(gang, accelerators));
                return decision(Verdict::Blocked { by }, message);
            }
        }
        if !complete {
            return decision(Verdict::Incomplete, self.sim.need_message(gang, accelerators));
        }
        let held_by = gang.held_by.as_ref()?;
        decision(Verdict::Held, format!("{present}/{present} members present; waiting for {held_by} before placement"))
    }

    /// Places a complete, unheld gang; where it does not fit, preempts for it or says why it
    /// waits (and whether it now holds later gangs back).
    fn try_place(&mut self, gang: &WaitingGang) -> Decision {
        let present = gang.present();
        if let Some((placements, domain)) = self.sim.place_for(gang) {
            let message = match &domain {
                Some(d) => format!(
                    "{present}/{present} members present; the whole gang fits within {} {}, releasing",
                    d.level, d.value
                ),
                None => format!("{present}/{present} members present; the whole gang fits, releasing"),
            };
            return Decision { gang: gang.key.clone(), message, verdict: Verdict::Release { placements, domain } };
        }
        let (snapshot, sim) = (self.snapshot, &mut self.sim);
        let why = if snapshot.reclaiming.contains(&gang.key) {
            NoVictims::Reclaiming
        } else {
            let candidates = self.candidates.get_or_insert_with(|| preemption::Candidates::new(snapshot, sim));
            match preemption::verdict(sim, candidates, snapshot, gang) {
                Ok(decision) => return decision,
                Err(why) => why,
            }
        };
        let mut message = sim.need_message(gang, &snapshot.accelerators);
        match why {
            NoVictims::InFlight => message.push_str(IN_FLIGHT),
            NoVictims::Reclaiming => message.push_str(RECLAIMING),
            NoVictims::Never | NoVictims::NoSet => {}
        }
        // Waiting counts from when it could go (complete, past its team's quota).
        if gang.starvation_after.is_some_and(|limit| snapshot.now.saturating_sub(gang.ready.0) >= limit) {
            let empty = self.empty.get_or_insert_with(|| Simulation::new(&snapshot.nodes));
            if empty.could_hold(gang) {
                self.blockers.push(Blocker { gang: gang.key.clone(), nodes: sim.usable_nodes(gang) });
            } else {
                // Waiting frees nothing it could use: it holds nobody back.
                message.push_str(NEVER_FITS);
            }
        }
        Decision { gang: gang.key.clone(), verdict: Verdict::DoesNotFit, message }
    }
}

/// Ends the explanation of a gang that could preempt but for a preemption in flight on the
/// nodes it may use (one at a time per domain).
pub const IN_FLIGHT: &str = "; another preemption is in flight on its nodes, waiting for it to finish";

/// Ends the explanation of a gang its team's lent quota is being reclaimed for.
pub const RECLAIMING: &str =
    "; its team's quota lent to the cohort is being reclaimed for it, waiting for the borrowed work to go";

/// Ends the explanation of a gang past its starvation limit that would not fit its nodes even
/// if they were empty: waiting frees nothing it could use, so nobody waits behind it. (Only
/// then: before, the figures say enough, and the check costs a placement.)
pub const NEVER_FITS: &str = "; cannot fit even on empty nodes";

/// A gang past its starvation limit that could fit the empty nodes: later gangs that may use one
/// of its nodes wait behind it.
struct Blocker {
    gang: GangKey,
    /// By node index: the nodes some member of it may use (static filters only).
    nodes: Vec<bool>,
}

mod preemption;
mod simulation;
mod topology;
pub use preemption::{InFlight, NoVictims, Preemptor, RunningPod, RunningUnit, UnitKey, set_cost};
use simulation::Simulation;
pub use topology::Within;

/// `(member, node)` for every member of a gang, by member name.
pub type Placements = Vec<(String, String)>;
