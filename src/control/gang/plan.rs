//! The gang action plan: turns the decision over a [`Snapshot`] into the [`ControllerAction`]s the
//! controller carries out (lift gates, explain, delete on an assembly or start timeout), and what metrics and logs
//! report about the pass.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::decision::{Decision, Domain, GangKey, Placements, Snapshot, ToldLate, Verdict, WaitingGang, decide};
use super::snapshot::GangFacts;
use crate::control::cluster::PodUid;
use crate::control::cluster::action::{ControllerAction, refresh_secs};
use crate::control::cluster::records::condition_fingerprint;
use crate::model::policy::{OnStartTimeout, OnTimeout};

pub use crate::control::cluster::action::START_TIMEOUT_REASON;

/// What one pass of the controller decided: the API calls to make, and what the metrics and
/// logs report about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<ControllerAction>,
    /// Gangs still waiting, by the reason on their members' condition.
    pub waiting: BTreeMap<&'static str, u64>,
    /// Complete gangs with a required topology level that do not fit now, by that level (the
    /// outermost they may use).
    pub waiting_for_domain: BTreeMap<String, u64>,
    /// Gangs released in this pass.
    pub released: Vec<ReleasedGang>,
    /// What to evict for gangs that preempt ([`super::preemption`]), in consideration order.
    pub preemptions: Vec<super::preemption::Preemption>,
    /// The earliest time (seconds since the epoch) a waiting gang reaches its assembly timeout,
    /// a released gang its start timeout, a released member's reservation ends, or a waiting
    /// gang's figures are due to be rewritten ([`COUNT_REFRESH_SECS`](crate::control::cluster::action::COUNT_REFRESH_SECS)): the controller looks
    /// again then, with or without events.
    pub next_deadline: Option<i64>,
}

/// A gang the plan releases, for its log line and the wait-time histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedGang {
    pub gang: GangKey,
    pub members: usize,
    /// Seconds since its oldest member was created.
    pub waited_secs: i64,
    /// The decision, e.g. "4/4 members present; fits: 8 nvidia.com/gpu on 2 nodes".
    pub message: String,
}

/// The reason of the `allot.dev/GangReady` condition a verdict gives the members, and whether
/// it is True.
pub fn condition_reason(verdict: &Verdict) -> (&'static str, bool) {
    match verdict {
        Verdict::Release { .. } => ("Released", true),
        Verdict::Incomplete => ("WaitingForMembers", false),
        Verdict::DoesNotFit => ("InsufficientResources", false),
        Verdict::Blocked { .. } => ("WaitingForHigherPriority", false),
        Verdict::Held => ("HeldByOtherGate", false),
        Verdict::Disagrees => ("MembersDisagree", false),
        Verdict::Unplaceable => ("PlacementTooLarge", false),
        Verdict::Preempt { .. } | Verdict::Preempting => ("Preempting", false),
    }
}

/// The reason once an incomplete gang is past its assembly timeout.
pub const TIMEOUT_REASON: &str = "AssemblyTimeout";

/// The reason once a gang told [`START_TIMEOUT_REASON`] has started after all.
pub const STARTED_LATE_REASON: &str = "StartedLate";

/// What the members of a gang told [`START_TIMEOUT_REASON`] are told once no member Allot
/// released waits unbound past the start timeout any more.
pub const STARTED_LATE_MESSAGE: &str = "the gang started after its start timeout: its released members are bound";

/// What a gang that has not started within its start timeout is told (every present member
/// Allot released under `Warn`, the Warning Event of each deletion under `Fail`), or `None`
/// while it has time or no released member waits. No figure in it moves while the gang stays
/// as it is, so a member told once is not told again.
pub fn start_timeout_message(gf: &GangFacts, now: i64) -> Option<String> {
    let deadline = gf.start_deadline()?;
    if now < deadline {
        return None;
    }
    let unbound: Vec<&str> = gf.started.iter().filter(|m| m.unbound_since.is_some()).map(|m| m.name.as_str()).collect();
    let first = unbound.first()?;
    let head = format!(
        "the gang did not start: {}/{} released members not bound within {}s of their release (first: {first})",
        unbound.len(),
        gf.started.len(),
        gf.start_timeout
    );
    Some(match gf.on_start_timeout {
        OnStartTimeout::Fail => {
            let doomed = gf.failed_start_members().len();
            let all = gf.gated.len() + gf.started.len();
            let which = if doomed == all {
                format!("all {all} members")
            } else {
                format!(
                    "the {doomed} members released with them or after (the {} that ran before keep running)",
                    all - doomed
                )
            };
            format!("{head}; deleting {which} (their controllers recreate them; bare pods are not recreated)")
        }
        OnStartTimeout::Warn => format!(
            "{head}; their reservation has ended: other gangs may be released onto the capacity they would take"
        ),
    })
}

/// The start timeouts of the gangs Allot released ([`GangFacts::start_deadline`]): under `Fail`
/// every present member of a gang that has not started is deleted, bound and gated ones too (a
/// partly started gang only holds its nodes; its reservation lasts while they go, see
/// [`super::snapshot::FAILED_START_HOLD`]); under `Warn` its released members get a Warning condition and Event,
/// once. Also the next time a start timeout fires or a reservation ends (the controller looks
/// again then). Members told so that are bound since, of a whole gang (as many members present
/// as it declares) all of whose present members are bound now, are told it started after all. Returns the gangs being deleted (nothing else is
/// done to them in this pass), and the gangs past their start timeout (counted once, as
/// `StartTimeout`, in the waiting-gang counts).
fn plan_starts(
    now: i64,
    facts: &HashMap<GangKey, GangFacts>,
    told_late: &[ToldLate],
    actions: &mut Vec<ControllerAction>,
    next_deadline: &mut Option<i64>,
) -> (HashSet<GangKey>, HashSet<GangKey>) {
    let mut failing = HashSet::new();
    let mut not_started = HashSet::new();
    let mut gangs: Vec<(&GangKey, &GangFacts)> = facts.iter().filter(|(_, gf)| gf.start_deadline().is_some()).collect();
    gangs.sort_by(|a, b| a.0.cmp(b.0));
    for (key, gf) in gangs {
        let hold = gf.reservation_hold();
        // When the gang's timeout fires, and when each member's reservation ends.
        let times = gf
            .start_deadline()
            .into_iter()
            .chain(gf.started.iter().filter_map(|m| m.unbound_since).map(|since| since.saturating_add(hold)));
        if let Some(next) = times.filter(|at| *at > now).min() {
            *next_deadline = Some(next_deadline.map_or(next, |n| n.min(next)));
        }
        let Some(message) = start_timeout_message(gf, now) else { continue };
        not_started.insert(key.clone());
        let ns = &key.namespace;
        match gf.on_start_timeout {
            OnStartTimeout::Fail => {
                for (pod, uid) in gf.failed_start_members() {
                    actions.push(ControllerAction::Delete {
                        namespace: ns.clone(),
                        pod: pod.to_string(),
                        uid: uid.map(PodUid::to_arc),
                        event_reason: START_TIMEOUT_REASON,
                        reason: message.clone(),
                    });
                }
                failing.insert(key.clone());
            }
            OnStartTimeout::Warn => {
                let written = condition_fingerprint(false, START_TIMEOUT_REASON, &message);
                for m in gf.started.iter().filter(|m| m.condition != written) {
                    actions.push(ControllerAction::Explain {
                        namespace: ns.clone(),
                        pod: m.name.clone(),
                        ready: false,
                        reason: START_TIMEOUT_REASON,
                        message: message.clone(),
                        warning: true,
                    });
                }
            }
        }
    }
    // Only a whole gang every present member of which is bound has started: one with a gated
    // or unbound member has facts (a stuck member's replacement waiting, say), one with a member
    // being deleted or gone and not yet replaced is not whole.
    let started = told_late.iter().filter(|m| m.gang_whole && !facts.contains_key(&m.gang));
    let started = started.map(|m| (m.gang.namespace.as_str(), m.name.as_str(), m.condition));
    tell_once(started, (true, STARTED_LATE_REASON, STARTED_LATE_MESSAGE), actions);
    (failing, not_started)
}

/// Whether an explanation given for `verdict` carries figures that move while the verdict
/// stays (members present, capacity free), so that a change in them alone is written at most
/// every [`refresh_secs`].
pub fn refreshes_figures(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Incomplete | Verdict::DoesNotFit | Verdict::Blocked { .. })
}

/// True when two explanations differ at most in their figures: each run of digits stands for
/// one figure, whatever its value (`3/4 members present; …, 2 free` and `4/4 …, 12 free`).
/// Anything else that differs (words, names, a unit) is a new explanation.
fn differ_only_in_figures(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.chars().peekable(), b.chars().peekable());
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                while a.next_if(char::is_ascii_digit).is_some() {}
                while b.next_if(char::is_ascii_digit).is_some() {}
            }
            (Some(x), Some(y)) if x == y => {}
            _ => return false,
        }
    }
}

/// The explanation last written to a gang's members, for [`plan`].
#[derive(Debug, Clone, PartialEq)]
pub struct Explained {
    /// The verdict it explains: a change of verdict (another gang to wait behind, say) is
    /// written at once.
    pub verdict: Verdict,
    pub reason: &'static str,
    pub message: String,
    /// When every member was last told (seconds since the epoch).
    pub at: i64,
    /// Members were held back from it (they carry an earlier count until the refresh).
    pub behind: bool,
    /// The gang's count (members present, expected) every member was told at `at`: when it has
    /// moved since, the gang's own refresh period applies, else the global one of free capacity.
    pub count: Option<(u64, Option<u32>)>,
}

/// Turns decisions into actions. `previous` holds the last explanation per gang, so unchanged
/// explanations are not written again (and is updated).
pub fn plan(
    snapshot: &Snapshot,
    facts: &HashMap<GangKey, GangFacts>,
    previous: &mut HashMap<GangKey, Explained>,
) -> Plan {
    let mut out = Plan::default();
    let decisions = decide(snapshot);
    let pass = PassFacts::of(snapshot, facts, &decisions);
    let (failing, not_started) =
        plan_starts(snapshot.now, facts, &snapshot.told_late, &mut out.actions, &mut out.next_deadline);
    if !not_started.is_empty() {
        out.waiting.insert(START_TIMEOUT_REASON, not_started.len() as u64);
    }
    for d in &decisions {
        let Some(gf) = facts.get(&d.gang) else { continue };
        // Being deleted whole: its gated members are neither released nor told anything.
        if failing.contains(&d.gang) {
            continue;
        }
        out.plan_gang(&pass, d, gf, not_started.contains(&d.gang), previous);
    }
    explain_strays(snapshot, &mut out.actions);
    // Forget explanations of gangs that are gone.
    previous.retain(|k, _| facts.contains_key(k));
    out
}

/// What the plan of each gang reads about the whole pass.
struct PassFacts<'s> {
    snapshot: &'s Snapshot,
    created: HashMap<&'s GangKey, i64>,
    /// By gang: its members present, and how many it declares.
    counts: HashMap<&'s GangKey, (u64, Option<u32>)>,
    /// By gang with a required topology: the outermost level it may use.
    required_level: HashMap<&'s GangKey, String>,
    /// How often a waiting gang's members are told figures that only free capacity moved.
    capacity_every: i64,
}

impl<'s> PassFacts<'s> {
    fn of(snapshot: &'s Snapshot, facts: &HashMap<GangKey, GangFacts>, decisions: &[Decision]) -> PassFacts<'s> {
        let gangs = &snapshot.gangs;
        let required =
            |g: &'s WaitingGang| Some((&g.key, g.topology.as_ref().filter(|t| t.required)?.outermost().to_string()));
        // Free capacity moves for every waiting gang at once (any pod started or deleted on
        // their nodes): rewriting figures alone is paced by every member told such figures, not
        // per gang, so their total rate stays about 6 writes a second however many gangs wait.
        let figures_told: usize = decisions
            .iter()
            .filter(|d| refreshes_figures(&d.verdict))
            .filter_map(|d| facts.get(&d.gang))
            .map(|gf| gf.gated.len())
            .sum();
        PassFacts {
            snapshot,
            created: gangs.iter().map(|g| (&g.key, g.created)).collect(),
            counts: gangs.iter().map(|g| (&g.key, (g.present(), g.expected))).collect(),
            required_level: gangs.iter().filter_map(required).collect(),
            capacity_every: refresh_secs(figures_told),
        }
    }
}

/// What a gang's members are told: their condition and its Event.
struct Telling {
    ready: bool,
    reason: &'static str,
    message: String,
    warning: bool,
}

impl Plan {
    /// The controller looks again at `at` at the latest.
    fn look_again_at(&mut self, at: i64) {
        self.next_deadline = Some(self.next_deadline.map_or(at, |n| n.min(at)));
    }

    /// One gang's part of the plan: its preemption or release, its assembly timeout, its count
    /// among the waiting, and what its members are told.
    fn plan_gang(
        &mut self,
        pass: &PassFacts<'_>,
        d: &Decision,
        gf: &GangFacts,
        not_started: bool,
        previous: &mut HashMap<GangKey, Explained>,
    ) {
        let (reason, ready) = condition_reason(&d.verdict);
        // Members that disagree, or that can never be placed, wait until their owner acts: a
        // Warning, like a timeout.
        let warning = matches!(d.verdict, Verdict::Disagrees | Verdict::Unplaceable);
        let mut telling = Telling { ready, reason, message: d.message.clone(), warning };
        match &d.verdict {
            Verdict::Preempt { victims, placements, domain } => {
                let gang = pass.snapshot.gangs.iter().find(|g| g.key == d.gang);
                self.preemptions.push(super::preemption::Preemption {
                    preemptor: d.gang.clone(),
                    team: gang.and_then(|g| g.preemptor.as_ref()).and_then(|p| p.team.clone()),
                    priority: gang.map_or(0, |g| g.priority),
                    first_member: gf.gated.iter().map(|m| &m.name).min().cloned(),
                    victims: victims.clone(),
                    placements: placements.clone(),
                    domain: domain.clone(),
                });
            }
            Verdict::Release { placements, domain } => self.release(pass, d, gf, placements, domain.as_ref()),
            _ => {}
        }
        self.assembly_timeout(pass, d, gf, &mut telling);
        // A gang past its start timeout (under Warn, with gated replacements) is counted once,
        // as StartTimeout.
        if !telling.ready && !not_started {
            *self.waiting.entry(telling.reason).or_default() += 1;
            if d.verdict == Verdict::DoesNotFit
                && let Some(level) = pass.required_level.get(&d.gang)
            {
                *self.waiting_for_domain.entry(level.clone()).or_default() += 1;
            }
        }
        // Members being deleted get the Warning Event of their deletion, not a condition too.
        let deleting = telling.reason == TIMEOUT_REASON && gf.on_timeout == OnTimeout::Fail;
        if !deleting {
            self.explain_gang(pass, d, gf, telling, previous);
        }
    }

    /// Lifts the gates of a gang released onto `placements` (pinned to `domain`).
    fn release(
        &mut self,
        pass: &PassFacts<'_>,
        d: &Decision,
        gf: &GangFacts,
        placements: &Placements,
        domain: Option<&Domain>,
    ) {
        for (pod, node) in placements {
            if let Some(m) = gf.gated.iter().find(|m| &m.name == pod) {
                self.actions.push(ControllerAction::Release {
                    namespace: d.gang.namespace.clone(),
                    pod: pod.clone(),
                    uid: m.uid.as_ref().map(PodUid::to_arc),
                    gate_index: m.gate_index,
                    has_annotations: m.has_annotations,
                    node: node.clone(),
                    pin: domain.map(|d| (d.level.clone(), d.value.clone())),
                    has_node_selector: m.has_node_selector,
                });
            }
        }
        self.released.push(ReleasedGang {
            gang: d.gang.clone(),
            members: placements.len(),
            waited_secs: pass.created.get(&d.gang).map_or(0, |c| (pass.snapshot.now - c).max(0)),
            message: d.message.clone(),
        });
    }

    /// Every gang that has not assembled gets its timeout, whatever gate holds its members;
    /// past it, its members are told so (and deleted under `Fail`).
    fn assembly_timeout(&mut self, pass: &PassFacts<'_>, d: &Decision, gf: &GangFacts, telling: &mut Telling) {
        let now = pass.snapshot.now;
        let Some(deadline) = pass.created.get(&d.gang).map(|c| c.saturating_add(gf.assembly_timeout)) else {
            return;
        };
        if !d.verdict.awaits_assembly() || gf.assembly_timeout <= 0 {
            return;
        }
        if now < deadline {
            self.look_again_at(deadline);
            return;
        }
        telling.reason = TIMEOUT_REASON;
        telling.warning = true;
        telling.message = format!("{}; not assembled within {}s", telling.message, gf.assembly_timeout);
        if gf.on_timeout == OnTimeout::Fail {
            telling.message.push_str("; deleting the members (bare pods are not recreated)");
            for m in &gf.gated {
                self.actions.push(ControllerAction::Delete {
                    namespace: d.gang.namespace.clone(),
                    pod: m.name.clone(),
                    uid: m.uid.as_ref().map(PodUid::to_arc),
                    event_reason: TIMEOUT_REASON,
                    reason: telling.message.clone(),
                });
            }
        }
    }

    /// Tells the gang's members what `telling` says, those whose condition says otherwise, and
    /// paces what only moved figures ([`refresh_secs`]).
    fn explain_gang(
        &mut self,
        pass: &PassFacts<'_>,
        d: &Decision,
        gf: &GangFacts,
        telling: Telling,
        previous: &mut HashMap<GangKey, Explained>,
    ) {
        let Telling { ready, reason, message, warning } = telling;
        let written = condition_fingerprint(ready, reason, &message);
        let stale = || gf.gated.iter().filter(|m| m.condition != written);
        let last = previous.get(&d.gang);
        let changed = last.is_none_or(|e| e.message != message);
        let count = pass.counts.get(&d.gang).copied();
        // Only the figures of a waiting gang moved (members present, capacity free), and its
        // members were all told less than a refresh period ago: only those told nothing yet
        // are told now, the rest at the refresh. Its own count moving (its members come and
        // go) is paced by its own members; capacity alone by everyone's (`capacity_every`).
        // (When the members were last told all, their count then, and when they are told
        // again.)
        let refresh = last
            .filter(|e| {
                refreshes_figures(&d.verdict)
                    && e.verdict == d.verdict
                    && e.reason == reason
                    && differ_only_in_figures(&e.message, &message)
            })
            .map(|e| {
                let every = if e.count == count { pass.capacity_every } else { refresh_secs(gf.gated.len()) };
                (e.at, e.count, e.at.saturating_add(every))
            })
            .filter(|(_, _, at)| pass.snapshot.now < *at);
        let behind = last.is_some_and(|e| e.behind);
        let explained = |at, behind, count| Explained {
            verdict: d.verdict.clone(),
            reason,
            message: message.clone(),
            at,
            behind,
            count,
        };
        let tell: Vec<&str> = match refresh {
            Some((told_at, told_count, at)) if changed || behind => {
                self.look_again_at(at);
                previous.insert(d.gang.clone(), explained(told_at, true, told_count));
                stale().filter(|m| m.condition == 0).map(|m| m.name.as_str()).collect()
            }
            // A new explanation, or one some members were held back from: everyone whose
            // condition says otherwise (a member that says so already — a new leader, a
            // resync — is skipped).
            _ if changed || behind => {
                previous.insert(d.gang.clone(), explained(pass.snapshot.now, false, count));
                stale().map(|m| m.name.as_str()).collect()
            }
            _ => Vec::new(),
        };
        for pod in tell {
            self.actions.push(ControllerAction::Explain {
                namespace: d.gang.namespace.clone(),
                pod: pod.to_string(),
                ready,
                reason,
                message: message.clone(),
                warning,
            });
        }
    }
}

/// The reason on a pod behind Allot's gang gate that is in no gang ([`StrayMember`]).
pub const STRAY_REASON: &str = "InvalidGangMetadata";

/// What a [`StrayMember`] is told, once (a Warning: it waits for nothing that will come).
pub const STRAY_MESSAGE: &str = "held by the allot.dev/gang gate, but under the current policies its labels and \
     annotations name no valid gang (a GangPolicy that inferred its gang changed, maxGangSize was lowered below its \
     size, or it was created while Allot's webhook was down): Allot will not release it; delete it and create it \
     again (allot check says what its metadata lacks)";

/// Every stray member not yet told why it waits gets a Warning condition and Event, once.
fn explain_strays(snapshot: &Snapshot, actions: &mut Vec<ControllerAction>) {
    let strays = snapshot.strays.iter().map(|s| (s.namespace.as_str(), s.name.as_str(), s.condition));
    tell_once(strays, (false, STRAY_REASON, STRAY_MESSAGE), actions);
}

/// A fixed explanation `(ready, reason, message)` for each `(namespace, pod, condition
/// fingerprint)` that does not carry it yet: a condition and an Event, a Warning when not
/// ready; never twice, as the pod's fingerprint then matches.
fn tell_once<'p>(
    pods: impl Iterator<Item = (&'p str, &'p str, u64)>,
    (ready, reason, message): (bool, &'static str, &'static str),
    actions: &mut Vec<ControllerAction>,
) {
    let written = condition_fingerprint(ready, reason, message);
    for (namespace, pod, _) in pods.filter(|(_, _, condition)| *condition != written) {
        actions.push(ControllerAction::Explain {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            ready,
            reason,
            message: message.to_string(),
            warning: !ready,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::differ_only_in_figures;

    #[test]
    fn only_figures_may_differ() {
        let was = "3/4 members present; needs 4 nvidia.com/gpu on nodes matching pool=a, 2 free";
        assert!(differ_only_in_figures(was, was));
        assert!(differ_only_in_figures(
            was,
            "4/4 members present; needs 4 nvidia.com/gpu on nodes matching pool=a, 12 free"
        ));
        assert!(!differ_only_in_figures(
            was,
            "3/4 members present; needs 4 nvidia.com/gpu on nodes matching pool=b, 2 free"
        ));
        assert!(!differ_only_in_figures(was, &format!("{was}; cannot fit even on empty nodes")));
        assert!(!differ_only_in_figures("needs 1500m x", "needs 2 x"), "a unit is a word");
        assert!(!differ_only_in_figures("2 members present, gang size not known yet", "2/4 members present"));
    }
}
