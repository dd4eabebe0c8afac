//! What the cluster view keeps of each Pod and Node: only what scheduling, gangs and quotas
//! need, compactly (issue 18: a [`PodRecord`] is 152 bytes plus its name and a short request
//! list; `cluster::tests::a_typical_pod_record_stays_small` pins it). Built from watched
//! k8s-openapi objects; the few distinct strings (namespaces, nodes, resource names, gang
//! policy fields) are interned, and where an unbound pod may go ([`Placement`]: selector,
//! affinity, tolerations) is shared by every pod of the same template instead of copied.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};

use crate::model::gang::bounds::PlacementExcess;
use crate::model::gang::membership::{
    self, ARRIVAL_ANNOTATION, BORROWED_FROM_ANNOTATION, GATE, InferredKind, LWS_NAME, PodFacts, QUOTA_GATE,
    QUOTA_RELEASED_ANNOTATION, RELEASED_ANNOTATION, Source,
};
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::PolicySet;
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

mod from_pod;
mod shape;
mod uid;

use shape::requests_of;
pub use shape::{Placement, PodShape, shape_of};
pub use uid::PodUid;

/// What the simulation keeps of a Node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: ResourceList,
}

/// A Pod's gang, as the controller tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangRef {
    pub name: String,
    /// From the Pod's own metadata; inferred gangs get theirs from the owner.
    pub size: Option<u32>,
    /// For inferred gangs: the owner to read the size from.
    pub owner: Option<Owner>,
    /// The leader of a LeaderWorkerSet group.
    pub leader: bool,
    /// What admission compares members on (interned).
    pub priority_class: Option<Arc<str>>,
    pub scheduler_name: Option<Arc<str>>,
    /// A native PodGroup's quota group (`PodGroup/NAME`): charged as a gang, never gated or
    /// released by Allot (the scheduler gangs it).
    pub native: bool,
    /// The topology level the member asks for (`allot.dev/topology`, interned), if any.
    pub topology: Option<Arc<str>>,
}

impl GangRef {
    /// The size the gang declares: its members' own, else (an inferred gang) its owner's, once
    /// read.
    pub fn declared_size(&self, owner: Option<&membership::OwnerGang>) -> Option<u32> {
        self.size.or_else(|| owner.map(|o| o.size))
    }
}

/// Shared ResourceClaims a pod names ([`PodRecord::shared_claims`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HeldClaims(pub Vec<HeldClaim>);

/// One shared ResourceClaim and its devices as quota resources (names interned).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldClaim {
    /// Its key ([`crate::model::dra::ClaimDemand::shared`]: name and UID).
    pub name: Arc<str>,
    pub devices: ClaimDevices,
}

/// A shared claim's devices as quota resources.
pub type ClaimDevices = Box<[(Arc<str>, Quantity)]>;

/// A shared claim in the cluster view: (namespace, claim key).
pub type ClaimId = (Arc<str>, Arc<str>);

impl HeldClaim {
    /// Its devices as a resource list.
    pub fn device_list(&self) -> ResourceList {
        self.devices.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
}

/// What the controller keeps of one Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `metadata.uid`. The controller's gate lifts test it: a pod deleted and made again under
    /// its name between a pass and the write (with other requests) is not released in its
    /// predecessor's place.
    pub uid: Option<PodUid>,
    pub node_name: Option<Arc<str>>,
    /// Succeeded or Failed: holds nothing any more.
    pub finished: bool,
    /// Being deleted (deletionTimestamp set) but not finished: still holds its devices until it
    /// is gone, so it counts in quota usage and node usage, but it is no member of its gang's
    /// quorum any more (it will not run again).
    pub terminating: bool,
    /// Effective requests (with `pods: 1`), names interned.
    pub requests: Box<[(Arc<str>, Quantity)]>,
    /// Where it may go, for the gang fit: kept only for an unbound gang member behind Allot's
    /// gang gate (a member the controller may release) or released by it (its reservation is
    /// placed until it binds), the only records whose decisions read it (`gang::snapshot`);
    /// shared with every pod of the same placement. Every other pod keeps none: a plain pod,
    /// a quota-queued one (the queue charges amounts, never nodes), a bound one (it only takes
    /// capacity), one an external scheduler gangs. Keeping it for every unbound pod let a
    /// tenant's pods that never bind (a selector no node matches, a gate of her own) hold
    /// megabytes each in every replica. Within [`crate::model::gang::bounds`], or only the marker.
    pub placement: Option<Arc<Placement>>,
    /// Boxed: most pods are in no gang and pay 8 bytes for this, not a hundred.
    pub gang: Option<Box<GangRef>>,
    /// Index of Allot's gate in `spec.schedulingGates`, if present.
    pub gate_index: Option<usize>,
    /// Index of Allot's quota gate, if present.
    pub quota_gate_index: Option<usize>,
    /// Gates that are neither of Allot's (Kueue's, Volcano's, …).
    pub other_gates: bool,
    /// When Allot last lifted one of its gates from it (seconds since the epoch): the later of
    /// the `allot.dev/gang-released` and `allot.dev/quota-released` annotations; `None` when
    /// neither is a time. One field for both, so the record does not grow: on a member still
    /// behind the gang gate it can only be the quota lift (when its gang became able to go,
    /// see `gang::snapshot`), on an ungated member the gang release (the quota gate goes
    /// first). What it reserves is bounded: see [`PodRecord::reserves_release`].
    pub released_at: Option<i64>,
    /// Allot lifted its gang gate (`allot.dev/gang-released` is a time, or the controller marked
    /// the release): only such members reserve capacity and run a start clock. A quota lift
    /// alone does neither: a pod another gang scheduler places (coscheduling, a native
    /// PodGroup) legitimately waits unbound while its group does not fit.
    pub gang_released: bool,
    pub has_annotations: bool,
    /// It carries `allot.dev/borrowed-from` (what a deny-mode cohort's leader keeps in step with
    /// which of a team's pods run beyond its nominal quota).
    pub borrowed_mark: bool,
    /// Which relist last saw it (see `ClusterState::begin_relist`).
    pub(super) relist: u8,
    pub priority: i32,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// When Allot first saw the pod (nanoseconds since the epoch): from the
    /// `allot.dev/arrival` annotation, or assigned by the store on first sight (watch order).
    /// Orders pods created in the same second; see [`PodRecord::order_key`].
    pub arrival: Option<i64>,
    /// True when `arrival` comes from the annotation (nothing to write back).
    pub arrival_stamped: bool,
    /// A DRA claim or template it names was not found when recorded: the store keeps the claim
    /// devices an earlier record of it counted ([`super::store`]).
    pub claims_unresolved: bool,
    /// The shared ResourceClaims it names that count devices: charged once per claim for the
    /// namespace, not in `requests` (boxed: most pods name none and pay 8 bytes).
    pub shared_claims: Option<Box<HeldClaims>>,
    /// Fingerprints of Allot's two conditions as the pod carries them (0: absent), so the
    /// controller writes a condition only when its text changes, also after a leader change.
    pub gang_condition: u64,
    pub quota_condition: u64,
    /// Its `allot.dev/GangReady` condition, as the pod carries it, says its gang did not start
    /// in time ([`super::action::START_TIMEOUT_REASON`], `onStartTimeout: Warn`): once bound,
    /// it is told that the gang started after all ([`PodRecord::told_late_and_bound`]).
    pub told_start_timeout: bool,
    /// Being deleted by a disruption (its `DisruptionTarget` condition): the scheduler's
    /// preemption, an eviction (a drain), a taint or the pod GC. A user's plain delete sets none.
    pub disruption: Option<DisruptionCause>,
    /// `spec.preemptionPolicy: Never` (the PriorityClass's, filled in by the API server): a gang
    /// with such a member waits rather than evicts ([`crate::control::gang::preemption`]).
    pub preempt_never: bool,
}

/// A fingerprint of a condition's status, reason and message (never 0).
pub fn condition_fingerprint(ready: bool, reason: &str, message: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ready, reason, message).hash(&mut h);
    h.finish().max(1)
}

/// The condition `type_` on `pod`, if it carries one.
fn condition<'p>(pod: &'p Pod, type_: &str) -> Option<&'p k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

/// The condition Kubernetes puts on a pod it is about to delete for a disruption.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Why a pod is being deleted, from its `DisruptionTarget` condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisruptionCause {
    PreemptionByScheduler,
    EvictionByEvictionAPI,
    DeletionByTaintManager,
    DeletionByPodGC,
    TerminationByKubelet,
    /// Allot's own preemption, for a higher-priority gang ([`crate::control::gang::preemption`]).
    PreemptionByAllot,
    Other,
}

impl DisruptionCause {
    fn of(reason: &str) -> DisruptionCause {
        match reason {
            "PreemptionByScheduler" | "PreemptionByKubeScheduler" => DisruptionCause::PreemptionByScheduler,
            "EvictionByEvictionAPI" => DisruptionCause::EvictionByEvictionAPI,
            "DeletionByTaintManager" => DisruptionCause::DeletionByTaintManager,
            "DeletionByPodGC" => DisruptionCause::DeletionByPodGC,
            "TerminationByKubelet" => DisruptionCause::TerminationByKubelet,
            crate::control::cluster::action::PREEMPTED_REASON => DisruptionCause::PreemptionByAllot,
            _ => DisruptionCause::Other,
        }
    }

    /// What it is, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            DisruptionCause::PreemptionByScheduler => "preempted by the scheduler",
            DisruptionCause::EvictionByEvictionAPI => "evicted (Eviction API: a drain, a descheduler)",
            DisruptionCause::DeletionByTaintManager => "deleted for a NoExecute taint",
            DisruptionCause::DeletionByPodGC => "deleted by the pod garbage collector",
            DisruptionCause::TerminationByKubelet => "terminated by the kubelet",
            DisruptionCause::PreemptionByAllot => "preempted by Allot for a higher-priority gang",
            DisruptionCause::Other => "disrupted",
        }
    }
}

/// True when `pod`'s condition `type_` is False with `reason`.
fn condition_says(pod: &Pod, type_: &str, reason: &str) -> bool {
    condition(pod, type_).is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some(reason))
}

/// The fingerprint of condition `type_` on `pod` (0 when absent).
fn condition_of(pod: &Pod, type_: &str) -> u64 {
    condition(pod, type_).map_or(0, |c| {
        condition_fingerprint(
            c.status == "True",
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default(),
        )
    })
}

impl PodRecord {
    /// Extracts a record; `policies` decide inference and coscheduling sizes (the GangPolicy of
    /// the pod's namespace and team, team from `labels`, as at admission).
    ///
    /// Nothing here exempts a pod. Exemptions (external gang managers, DaemonSet pods) are
    /// decided at admission, with trust taken from the request's userInfo; the watch carries
    /// no userInfo, so labels, annotations and owner references a tenant may have written
    /// (`kueue.x-k8s.io/managed`, Volcano's group annotation, a DaemonSet owner) change nothing:
    /// a pod that carries Allot's gate is a member like any other.
    pub fn from_pod(pod: &Pod, policies: &PolicySet, labels: &dyn NamespaceLabels) -> Option<PodRecord> {
        PodRecord::from_pod_with_claims(pod, policies, labels, &crate::model::dra::NoClaims)
    }

    /// [`PodRecord::from_pod`], with the devices of the pod's DRA claims (resolved in `claims`)
    /// added to its requests under their DeviceClass names ([`crate::model::dra::class_resource`]), as
    /// admission charged them. (The gang fit does not simulate DRA devices: it skips those names.)
    pub fn from_pod_with_claims(
        pod: &Pod,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        claims: &dyn crate::model::dra::ClaimSource,
    ) -> Option<PodRecord> {
        let namespace = pod.metadata.namespace.clone()?;
        let name = pod.metadata.name.clone()?;
        let facts = PodFacts::from_pod(pod);
        let spec = pod.spec.as_ref();
        let team = crate::model::namespaces::team_of(policies, &namespace, labels).team;
        let team_name = team.map(|t| t.name.as_str());
        let membership = policies.gang_of(&facts, &namespace, team_name);
        let membership = match membership {
            Ok(None) => Ok(membership::native_group(facts.native_pod_group, &namespace, claims)),
            other => other,
        };
        let gang = from_pod::gang_ref(membership, &facts, spec, policies, &namespace, team_name);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let finished = matches!(phase, Some("Succeeded" | "Failed"));
        let own_requests = spec.map(requests_of).unwrap_or_default();
        let (counted, claims_unresolved, shared_claims) =
            from_pod::claim_accounting(pod, &namespace, &own_requests, policies, claims);
        let requests = kept_requests(&counted, policies);
        // Where it may go only matters to the gang fit ([`PodRecord::placement`]): a bound pod
        // only takes capacity, and a pod Allot neither holds nor released is no decision's.
        let gate_index = facts.gates.iter().position(|g| *g == GATE);
        let released_at = facts.annotations.get(RELEASED_ANNOTATION).and_then(parse_time);
        // The later of the two releases is the one a gang's order counts from (gang::snapshot).
        let quota_released_at = facts.annotations.get(QUOTA_RELEASED_ANNOTATION).and_then(parse_time);
        let placement =
            (facts.node_name.is_none() && gang.is_some() && (gate_index.is_some() || released_at.is_some()))
                .then(|| Placement::bounded(spec).interned());
        Some(PodRecord {
            node_name: facts.node_name.map(intern),
            finished,
            terminating: !finished && pod.metadata.deletion_timestamp.is_some(),
            requests,
            placement,
            gate_index,
            quota_gate_index: facts.gates.iter().position(|g| *g == QUOTA_GATE),
            other_gates: facts.gates.iter().any(|g| *g != GATE && *g != QUOTA_GATE),
            released_at: [released_at, quota_released_at].into_iter().flatten().max(),
            gang_released: released_at.is_some(),
            has_annotations: pod.metadata.annotations.is_some(),
            borrowed_mark: facts.annotations.get(BORROWED_FROM_ANNOTATION).is_some(),
            relist: 0,
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            created: pod.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
            arrival: facts.annotations.get(ARRIVAL_ANNOTATION).and_then(parse_nanos),
            arrival_stamped: facts.annotations.get(ARRIVAL_ANNOTATION).and_then(parse_nanos).is_some(),
            claims_unresolved,
            shared_claims,
            gang_condition: condition_of(pod, super::action::CONDITION),
            quota_condition: condition_of(pod, super::action::QUOTA_CONDITION),
            told_start_timeout: condition_says(pod, super::action::CONDITION, super::action::START_TIMEOUT_REASON),
            disruption: (!finished && pod.metadata.deletion_timestamp.is_some())
                .then(|| condition(pod, DISRUPTION_TARGET))
                .flatten()
                .filter(|c| c.status == "True")
                .map(|c| DisruptionCause::of(c.reason.as_deref().unwrap_or_default())),
            preempt_never: spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never"),
            gang,
            namespace: intern(&namespace),
            name: Arc::from(name),
            uid: pod.metadata.uid.as_deref().map(PodUid::new),
        })
    }

    /// A gate besides Allot's gang gate (the quota gate included): a member that still has one
    /// is not ready for its gang to be released.
    pub fn foreign_gates(&self) -> bool {
        self.other_gates || self.quota_gate_index.is_some()
    }

    /// When the release of this pod started its gang's start clock, if Allot released it and
    /// it waits for the scheduler: a gang member, ungated, not bound, with a release time
    /// ([`PodRecord::believed_gang_release`]).
    pub fn released_since(&self, now: i64) -> Option<i64> {
        if self.gang.is_none() || self.gate_index.is_some() || self.node_name.is_some() {
            return None;
        }
        self.believed_gang_release(now)
    }

    /// When Allot lifted this pod's gang gate, as far as it is believed at `now`. The annotation
    /// is a pod field: one that a user wrote (admission denies that now, but not for pods
    /// admitted before, or while the webhook was down) is believed only within bounds. A time
    /// from the future (beyond [`CLOCK_SKEW`]) is no release at all: it reserves nothing and
    /// times nothing out (else it would hold capacity until then). A time before the pod was
    /// created (`creationTimestamp`, which the API server sets) counts from the creation: a
    /// release cannot be older than its pod, so an old forged time neither ends a reservation
    /// early nor makes the gang's start timeout fire before a real release's would.
    pub fn believed_gang_release(&self, now: i64) -> Option<i64> {
        self.released_at
            .filter(|at| self.gang_released && *at <= now.saturating_add(CLOCK_SKEW))
            .map(|at| at.max(self.created))
    }

    /// True when the pod's release still reserves capacity at `now`: it was released
    /// ([`PodRecord::released_since`]) less than `hold` seconds ago (its gang's start timeout,
    /// see `gang::snapshot`). Never longer: every reservation ends.
    pub fn reserves_release(&self, now: i64, hold: i64) -> bool {
        self.released_since(now).is_some_and(|since| now < since.saturating_add(hold))
    }

    /// A gang member Allot released (a release time, believable or not) that is present and not
    /// bound: its gang's start clock may run ([`PodRecord::released_since`]). Counted by the
    /// store, so the controller knows when a pass has such members to look at.
    pub fn awaits_bind(&self) -> bool {
        self.gang.is_some()
            && self.gang_released
            && self.gate_index.is_none()
            && self.node_name.is_none()
            && self.released_at.is_some()
            && self.present()
    }

    /// A gang member that carries the start-timeout condition and is bound now: the gang pass
    /// has to tell it that its gang started after all. Counted by the store like
    /// [`PodRecord::awaits_bind`].
    pub fn told_late_and_bound(&self) -> bool {
        self.gang.is_some() && self.told_start_timeout && self.node_name.is_some() && self.present()
    }

    /// A member of a gang Allot released that a disruption is taking away: its gang cannot
    /// make progress without it ([`crate::control::gang::disruption`]).
    pub fn disrupts_gang(&self) -> bool {
        self.disruption.is_some()
            && self.terminating
            && self.gang.as_ref().is_some_and(|g| !g.native)
            && self.gate_index.is_none()
            && (self.node_name.is_some() || self.gang_released)
    }

    /// Counts for its gang's quorum: neither finished nor being deleted.
    pub fn present(&self) -> bool {
        !self.finished && !self.terminating
    }

    /// Where the pod stands in queue and gang order (earliest first, after priority): its
    /// creation second, then its arrival within it. The creation second comes first, so an
    /// arrival stamp (written after creation, perhaps late after a leader change) only ever
    /// orders pods created in the same second.
    pub fn order_key(&self) -> (i64, i64) {
        (self.created, self.arrival.unwrap_or(i64::MAX))
    }

    /// True when the leader should write the pod's arrival: it waits in a team's quota queue
    /// (where order is the contract) and has no stamp. Gang order between gangs of one creation
    /// second uses the arrival each replica's own watch saw (both replicas watch all along), so
    /// gang members cost no extra write.
    pub fn needs_arrival_stamp(&self) -> bool {
        !self.arrival_stamped && self.arrival.is_some() && self.present() && self.quota_gate_index.is_some()
    }

    /// The requests as `(name, amount)` pairs.
    pub fn request_pairs(&self) -> impl Iterator<Item = (&str, Quantity)> {
        self.requests.iter().map(|(k, v)| (&**k, *v))
    }

    /// The requests as an owned list.
    pub fn request_list(&self) -> ResourceList {
        self.request_pairs().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Heap bytes this record owns alone (its name, its request list, its gang), not counting
    /// what it shares with other records (interned strings, its placement): what each further
    /// pod costs besides `size_of::<PodRecord>()` and its slot in the store's table.
    pub fn owned_heap_bytes(&self) -> usize {
        let gang = self.gang.as_ref().map_or(0, |g| {
            std::mem::size_of::<GangRef>()
                + g.name.len()
                + g.owner.as_ref().map_or(0, |o| o.api_kind.len() + o.name.len())
        });
        let claims = self.shared_claims.as_ref().map_or(0, |c| {
            std::mem::size_of::<HeldClaims>()
                + c.0
                    .iter()
                    .map(|h| std::mem::size_of::<HeldClaim>() + arc_str(&h.name) + std::mem::size_of_val(&*h.devices))
                    .sum::<usize>()
        });
        arc_str(&self.name)
            + self.uid.as_ref().map_or(0, PodUid::heap_bytes)
            + std::mem::size_of_val(&*self.requests)
            + gang
            + claims
    }

    /// The shared claims it names (empty for most pods).
    pub fn held_claims(&self) -> &[HeldClaim] {
        self.shared_claims.as_deref().map_or(&[], |c| &c.0)
    }

    pub(super) fn key(&self) -> Key {
        (self.namespace.clone(), self.name.clone())
    }

    /// Adds `key: value` to its node selector (a topology pin, [`super::ClusterState::pin_placement`]).
    /// A placement over the bounds stays as it is: where that member may go is not known anyway.
    pub fn pin_placement(&mut self, key: &str, value: &str) {
        let mut placement = self.placement.as_deref().cloned().unwrap_or_default();
        if placement.excess.is_some() {
            return;
        }
        placement.node_selector.insert(key.to_string(), value.to_string());
        self.placement = Some(placement.interned());
    }

    /// The pod's shape for the simulation (requests only, for a bound pod).
    /// A shared claim's devices are in it too: the simulation does not know whether another
    /// pod's allocation already holds them, so a member asking them is placed as if it needed
    /// them (waiting, never over-placing).
    pub fn shape(&self) -> PodShape {
        let mut requests: ResourceList = self.requests.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        for claim in self.held_claims() {
            crate::model::tally::add_to(&mut requests, &claim.device_list(), 1);
        }
        match &self.placement {
            // Where a released member over the bounds may go is not known: its reservation may
            // take room on any node (tolerating every taint), so that it is held somewhere
            // rather than nowhere. A gated one is never placed ([`PodRecord::placement_excess`]).
            Some(p) if p.excess.is_some() => PodShape { requests, placement: ANYWHERE.clone() },
            // Shared, not copied: a pass makes a shape for every waiting member.
            Some(p) => PodShape { requests, placement: p.clone() },
            None => PodShape { requests, placement: NOWHERE_IN_PARTICULAR.clone() },
        }
    }

    /// The bound its placement was over, when it was (then the gang fit does not know where it
    /// may go, and never releases its gang).
    pub fn placement_excess(&self) -> Option<PlacementExcess> {
        self.placement.as_ref().and_then(|p| p.excess)
    }
}

/// The heap bytes of an `Arc<str>` holding `s`: two counters and the bytes.
fn arc_str(s: &str) -> usize {
    2 * std::mem::size_of::<usize>() + s.len()
}

/// The placement of a shape whose record keeps none (a bound pod: it only takes capacity).
static NOWHERE_IN_PARTICULAR: LazyLock<Arc<Placement>> = LazyLock::new(Arc::default);

/// The placement of a released member whose own was over the bounds: any node, every taint
/// tolerated ([`PodRecord::shape`]).
static ANYWHERE: LazyLock<Arc<Placement>> = LazyLock::new(|| {
    let tolerations = vec![Toleration { operator: Some("Exists".into()), ..Toleration::default() }];
    Arc::new(Placement { tolerations, ..Placement::default() })
});

/// How far in the future a release time may lie (seconds of clock skew between replicas).
const CLOCK_SKEW: i64 = 60;

/// An RFC 3339 time (what the controller writes), in seconds since the epoch.
fn parse_time(value: &str) -> Option<i64> {
    value.trim().parse::<k8s_openapi::jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// An RFC 3339 time, in nanoseconds since the epoch (what `allot.dev/arrival` holds).
fn parse_nanos(value: &str) -> Option<i64> {
    let t = value.trim().parse::<k8s_openapi::jiff::Timestamp>().ok()?;
    i64::try_from(t.as_nanosecond()).ok()
}

/// Nanoseconds since the epoch as RFC 3339 (what the controller writes in `allot.dev/arrival`).
pub fn format_nanos(nanos: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(nanos)).map(|t| t.to_string()).unwrap_or_default()
}

/// (namespace, name) of a Pod.
pub(super) type Key = (Arc<str>, Arc<str>);

pub(super) fn key(namespace: &str, name: &str) -> Key {
    (Arc::from(namespace), Arc::from(name))
}

/// Shares the few distinct strings (namespaces, nodes, resource names, priority classes)
/// among all records. Strings no record holds any more are dropped as the table grows, so
/// namespaces and nodes that come and go do not pile up.
/// The requests a record keeps: all of them, but for a pod over
/// [`crate::admission::tenant::MAX_RESOURCE_NAMES`] distinct names (admitted before admission bounded
/// them, or while the webhook was bypassed), only that many, those decisions read first (the
/// scheduler's own resources, accelerators, what a quota counts): a pod asking twenty thousand
/// made-up resources would otherwise cost every replica megabytes. It never starts anyway.
fn kept_requests(counted: &ResourceList, policies: &PolicySet) -> Box<[(Arc<str>, Quantity)]> {
    let max = crate::admission::tenant::MAX_RESOURCE_NAMES;
    if counted.len() <= max {
        return counted.iter().map(|(k, v)| (intern(k), *v)).collect();
    }
    let counts = |name: &str| {
        let quotas = policies.teams.iter().filter_map(|t| t.quota.as_ref());
        quotas.into_iter().any(|q| q.limits.contains_key(name) || q.equivalents.contains_key(name))
    };
    let read = |name: &str| {
        matches!(name, "cpu" | "memory" | "ephemeral-storage" | "pods")
            || name.starts_with("hugepages-")
            || policies.accelerators.matches(name)
            || counts(name)
    };
    let mut names: Vec<(&String, &Quantity)> = counted.iter().collect();
    names.sort_by_key(|(name, _)| !read(name));
    names.into_iter().take(max).map(|(k, v)| (intern(k), *v)).collect()
}

fn intern(s: &str) -> Arc<str> {
    static TABLE: LazyLock<Mutex<(HashSet<Arc<str>>, usize)>> = LazyLock::new(Default::default);
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let (table, sweep_at) = &mut *guard;
    if let Some(found) = table.get(s) {
        return found.clone();
    }
    let new: Arc<str> = Arc::from(s);
    table.insert(new.clone());
    if table.len() > (*sweep_at).max(1024) {
        table.retain(|a| Arc::strong_count(a) > 1);
        *sweep_at = table.len() * 2;
    }
    new
}

/// The object an inferred gang takes its size from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    pub kind: InferredKind,
    /// The owner's Kubernetes kind (`Job`, `JobSet`, `PyTorchJob`, …).
    pub api_kind: String,
    pub name: String,
}

/// For a member of the native PodGroup Allot hands its inferred gang to (GangPolicy
/// `nativeScheduling`): the gang's owner, from which the leader creates the PodGroup.
fn hand_off_owner(facts: &PodFacts<'_>, policies: &PolicySet, namespace: &str, team: Option<&str>) -> Option<Owner> {
    if !policies.gang_policy(namespace, team).native_scheduling {
        return None;
    }
    let inferred = PodFacts { native_pod_group: None, ..facts.clone() };
    let gang = policies.gang_of(&inferred, namespace, team).ok().flatten()?;
    match gang.source {
        Source::Inferred(kind) if membership::handed_off(facts, &gang) => owner_of(facts, kind),
        _ => None,
    }
}

/// The JobSet for JobSet pods (their direct owner is a Job), otherwise the direct owner.
fn owner_of(facts: &PodFacts<'_>, kind: InferredKind) -> Option<Owner> {
    if kind == InferredKind::JobSet {
        let name = facts.labels.get("jobset.sigs.k8s.io/jobset-name")?.to_string();
        return Some(Owner { kind, api_kind: "JobSet".into(), name });
    }
    if kind == InferredKind::LeaderWorkerSet {
        // Group pods are owned by StatefulSets; the LeaderWorkerSet names itself in a label.
        let name = facts.labels.get(LWS_NAME)?.to_string();
        return Some(Owner { kind, api_kind: "LeaderWorkerSet".into(), name });
    }
    let (api_kind, name) = facts.owners.first()?;
    // The API server bounds neither an owner reference's name nor its kind (only the Pod's
    // size does), and the view keeps them with each member and in its owner indexes. One
    // longer than an object name or a kind names no object: no owner to read, as for one
    // that is not there (the gang's size stays unknown, and it is told so).
    if name.len() > MAX_OWNER_NAME || api_kind.len() > MAX_OWNER_KIND {
        return None;
    }
    Some(Owner { kind, api_kind: api_kind.to_string(), name: name.to_string() })
}

/// The longest owner name the view keeps: an object name's (a DNS subdomain).
const MAX_OWNER_NAME: usize = 253;
/// The longest owner kind it keeps: a kind is a DNS label at most (a CRD's `names.kind`).
const MAX_OWNER_KIND: usize = 63;

/// What the cluster view knows of a Node.
pub fn node_info(node: &Node) -> Option<NodeInfo> {
    let name = node.metadata.name.clone()?;
    let spec = node.spec.as_ref();
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| a.iter().filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.clone(), q))).collect())
        .unwrap_or_default();
    Some(NodeInfo {
        name,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        allocatable,
    })
}
