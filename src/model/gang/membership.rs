//! Which gang a Pod belongs to. First match wins:
//!
//! | source | name | size |
//! |---|---|---|
//! | explicit | label `allot.dev/gang-name` | annotation `allot.dev/gang-size` |
//! | Kueue pod group | label/annotation `kueue.x-k8s.io/pod-group-name` | annotation `kueue.x-k8s.io/pod-group-total-count` |
//! | coscheduling | label `scheduling.x-k8s.io/pod-group` | GangPolicy `coschedulingSize` |
//! | inferred (opt-in per kind) | the owning Job / JobSet / Kubeflow job | from the owner, resolved by the controller |
//!
//! Works on [`PodFacts`], a small copy of what membership needs, built from admission JSON or
//! from a watched k8s-openapi Pod alike.

use crate::model::json::Fields;
use std::collections::BTreeMap;

use serde_json::Value;

/// The scheduling gate Allot owns for gangs.
pub const GATE: &str = "allot.dev/gang";
/// The scheduling gate Allot owns for queue-mode quotas.
pub const QUOTA_GATE: &str = "allot.dev/quota";
pub const NAME_LABEL: &str = "allot.dev/gang-name";
pub const SIZE_ANNOTATION: &str = "allot.dev/gang-size";
/// Set by the controller in the patch that lifts the gate: marks a member as released (its
/// resources are reserved until it is bound), and survives controller restarts.
pub const RELEASED_ANNOTATION: &str = "allot.dev/gang-released";
/// Set by the controller in the patch that lifts the quota gate (RFC 3339): when the team's
/// quota let the pod go. A gang member still behind the gang gate was not able to go before
/// then, so its gang's order and starvation clock start no earlier (`gang::snapshot`); it
/// survives controller restarts like the release mark. Tenants cannot write it (every
/// `allot.dev/` key is Allot's), and a value that got there anyway can only make a gang later.
pub const QUOTA_RELEASED_ANNOTATION: &str = "allot.dev/quota-released";
/// Set by Allot on a pod its team's queue released on quota borrowed from a cohort: the
/// cohort's name.
pub const BORROWED_FROM_ANNOTATION: &str = "allot.dev/borrowed-from";
/// Set by the leading controller on a pod in a team's quota queue, once: when the watch first
/// saw the pod (RFC 3339, nanoseconds). Breaks ties of `creationTimestamp` (one-second
/// resolution) in queue order, so the order is arrival as Allot saw it, the same after a leader
/// change, and never the pod's name. Tenants cannot write it (every `allot.dev/` key is Allot's).
pub const ARRIVAL_ANNOTATION: &str = "allot.dev/arrival";
pub const KUEUE_GROUP: &str = "kueue.x-k8s.io/pod-group-name";
pub const KUEUE_TOTAL: &str = "kueue.x-k8s.io/pod-group-total-count";
pub const COSCHEDULING_LABEL: &str = "scheduling.x-k8s.io/pod-group";

pub const KUEUE_GATE: &str = "kueue.x-k8s.io/admission";
pub const KUEUE_MANAGED: &str = "kueue.x-k8s.io/managed";
pub const VOLCANO_GROUP: &str = "scheduling.k8s.io/group-name";
const JOB_NAME: &str = "batch.kubernetes.io/job-name";
const JOB_INDEX: &str = "batch.kubernetes.io/job-completion-index";
const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
const KUBEFLOW_JOB: &str = "training.kubeflow.org/job-name";
const KUBEFLOW_ROLE: &str = "training.kubeflow.org/replica-type";
pub const LWS_NAME: &str = "leaderworkerset.sigs.k8s.io/name";
const LWS_GROUP: &str = "leaderworkerset.sigs.k8s.io/group-index";
const LWS_WORKER: &str = "leaderworkerset.sigs.k8s.io/worker-index";

/// Owner kinds whose gangs can be inferred (opt-in in a GangPolicy).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
pub enum InferredKind {
    /// An Indexed Job: one gang per Job, size = parallelism.
    Job,
    /// A JobSet: one gang per JobSet, size = Σ replicas × parallelism.
    JobSet,
    /// Kubeflow PyTorchJob/TFJob/XGBoostJob/JAXJob/PaddleJob: Σ replica counts.
    KubeflowJob,
    /// Kubeflow MPIJob: the workers (the launcher starts after them and is not a member).
    MPIJob,
    /// LeaderWorkerSet: one gang per group, size = `leaderWorkerTemplate.size`. Under
    /// `startupPolicy: LeaderReady` the leader goes first, once the whole group would fit.
    LeaderWorkerSet,
}

/// A Pod's labels or annotations where they already are (the review's JSON or a watched
/// Pod), read in place: facts are made once or more per Pod view on every review, and
/// collecting a map of borrowed strings each time cost more than every lookup in it.
#[derive(Debug, Clone, Copy)]
pub enum StrMap<'a> {
    /// A JSON object; values that are not strings read as absent.
    Json(Option<&'a serde_json::Map<String, Value>>),
    Typed(Option<&'a BTreeMap<String, String>>),
}

impl Default for StrMap<'_> {
    fn default() -> Self {
        StrMap::Typed(None)
    }
}

impl<'a> StrMap<'a> {
    /// The value under `key`, if it is a string.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        match *self {
            StrMap::Json(map) => map?.get(key)?.as_str(),
            StrMap::Typed(map) => map?.get(key).map(String::as_str),
        }
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every string entry, in key order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&'a str, &'a str)> + 'a> {
        match *self {
            StrMap::Json(map) => {
                Box::new(map.into_iter().flatten().filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))))
            }
            StrMap::Typed(map) => Box::new(map.into_iter().flatten().map(|(k, v)| (k.as_str(), v.as_str()))),
        }
    }
}

/// Equal when they hold the same string entries, wherever they are read from.
impl PartialEq for StrMap<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for StrMap<'_> {}

/// What membership needs to know about a Pod, borrowed from it: made once or more per Pod
/// view on every review, so it copies no label, annotation or name (a Pod's last-applied
/// annotation alone is kilobytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts<'a> {
    pub labels: StrMap<'a>,
    pub annotations: StrMap<'a>,
    /// `(kind, name)` of owner references.
    pub owners: Vec<(&'a str, &'a str)>,
    pub node_name: Option<&'a str>,
    pub scheduler_name: Option<&'a str>,
    pub gates: Vec<&'a str>,
    /// `spec.schedulingGroup.podGroupName`: the pod belongs to a native PodGroup (Kubernetes'
    /// own gang scheduling). The API server drops the field where its feature gate is off. Unset
    /// on a pod that carries Allot's gang gate ([`native_pod_group_of`]).
    pub native_pod_group: Option<&'a str>,
}

impl<'a> PodFacts<'a> {
    /// From a Pod as JSON (admission, CLI).
    pub fn from_json(pod: &'a Value) -> PodFacts<'a> {
        PodFacts {
            labels: StrMap::Json(pod.field(&["metadata", "labels"]).and_then(Value::as_object)),
            annotations: StrMap::Json(pod.field(&["metadata", "annotations"]).and_then(Value::as_object)),
            owners: pod
                .field(&["metadata", "ownerReferences"])
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|o| Some((o.get("kind")?.as_str()?, o.get("name")?.as_str()?)))
                .collect(),
            node_name: pod.text(&["spec", "nodeName"]),
            scheduler_name: pod.text(&["spec", "schedulerName"]),
            native_pod_group: native_pod_group_of(pod),
            gates: gate_names(pod).collect(),
        }
    }

    /// From a watched Pod (controller).
    pub fn from_pod(pod: &'a k8s_openapi::api::core::v1::Pod) -> PodFacts<'a> {
        let spec = pod.spec.as_ref();
        PodFacts {
            labels: StrMap::Typed(pod.metadata.labels.as_ref()),
            annotations: StrMap::Typed(pod.metadata.annotations.as_ref()),
            owners: pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|o| (o.kind.as_str(), o.name.as_str()))
                .collect(),
            node_name: spec.and_then(|s| s.node_name.as_deref()).filter(|s| !s.is_empty()),
            scheduler_name: spec.and_then(|s| s.scheduler_name.as_deref()).filter(|s| !s.is_empty()),
            native_pod_group: spec
                .filter(|s| !s.scheduling_gates.iter().flatten().any(|g| g.name == GATE))
                .and_then(|s| s.scheduling_group.as_ref())
                .and_then(|g| g.pod_group_name.as_deref())
                .filter(|s| !s.is_empty()),
            gates: spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .into_iter()
                .flatten()
                .map(|g| g.name.as_str())
                .collect(),
        }
    }

    fn label_or_annotation(&self, key: &str) -> Option<&str> {
        self.labels.get(key).or_else(|| self.annotations.get(key)).filter(|s| !s.is_empty())
    }
}

/// Facts of a Pod made of `metadata` and `spec`, for tests. Facts borrow from their Pod: a
/// test's Pod lives as long as the test binary.
#[cfg(test)]
pub(crate) fn test_facts(metadata: Value, spec: Value) -> PodFacts<'static> {
    PodFacts::from_json(Box::leak(Box::new(serde_json::json!({"metadata": metadata, "spec": spec}))))
}

/// Where a gang's membership comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Explicit,
    KueuePodGroup,
    Coscheduling,
    Inferred(InferredKind),
    /// A native PodGroup (`spec.schedulingGroup`): the scheduler gangs it; Allot only charges
    /// its quota as a group ([`native_group`]).
    NativePodGroup,
}

/// A Pod's gang.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub name: String,
    /// Expected members; `None` when only the owner knows (inferred gangs) or the policy gives
    /// no coscheduling size.
    pub size: Option<u32>,
    pub source: Source,
}

/// Every label or annotation key membership reads: changing one after CREATE moves a Pod into
/// or out of a gang, so only Allot may (see [`crate::admission::tenant`]).
pub const MEMBERSHIP_KEYS: &[&str] = &[
    NAME_LABEL,
    SIZE_ANNOTATION,
    KUEUE_GROUP,
    KUEUE_TOTAL,
    COSCHEDULING_LABEL,
    KUEUE_MANAGED,
    VOLCANO_GROUP,
    JOB_NAME,
    JOB_INDEX,
    JOBSET_NAME,
    KUBEFLOW_JOB,
    KUBEFLOW_ROLE,
    LWS_NAME,
    LWS_GROUP,
    LWS_WORKER,
];

/// The longest gang name: an object name's (a DNS subdomain). Labels give at most 63 bytes;
/// Kueue's pod-group name may come from an annotation, which the API server bounds only by the
/// Pod's whole size (256 KiB of annotations).
pub const MAX_GANG_NAME: usize = 253;

/// The largest gang size allowed when no GangPolicy says otherwise: far above any real
/// training job on one cluster, and small enough that per-member work stays cheap.
pub const DEFAULT_MAX_GANG_SIZE: u32 = 1024;

/// Why a Pod's gang metadata is refused (the message the person who applied it reads).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GangMetadataError {
    #[error("{key} must be a positive integer, got {got:?}")]
    NotASize { key: String, got: String },
    #[error("{key} is {size}; gangs here have at most {max} members (GangPolicy maxGangSize)")]
    TooLarge { key: String, size: String, max: u32 },
    /// A gang named (by `named_by`: the label or annotation and its value) without its size.
    #[error("{named_by} needs the annotation {annotation}")]
    NoSize { named_by: String, annotation: &'static str },
    #[error("{KUEUE_GROUP} is {0} bytes long; a gang name has at most {MAX_GANG_NAME}")]
    NameTooLong(usize),
    #[error("{KUEUE_GROUP} {0:?}: names starting {NATIVE_GROUP_PREFIX:?} are native PodGroups'")]
    NativeGroupName(String),
    /// The topology level a member asks for is not one its GangPolicy allows (judged at CREATE).
    #[error("{0}")]
    Topology(String),
}

/// Parses a gang size: a positive integer no larger than `max`.
pub fn parse_size(key: &str, raw: &str, max: u32) -> Result<u32, GangMetadataError> {
    let trimmed = raw.trim();
    match trimmed.parse::<u32>() {
        Ok(n) if n > 0 && n <= max => Ok(n),
        Ok(n) if n > 0 => Err(too_big(key, &n.to_string(), max)),
        // A long run of digits is a size too, just one that does not fit in a u32.
        _ if !trimmed.is_empty()
            && trimmed.bytes().all(|b| b.is_ascii_digit())
            && !trimmed.trim_start_matches('0').is_empty() =>
        {
            Err(too_big(key, &shorten(trimmed), max))
        }
        _ => Err(GangMetadataError::NotASize { key: key.to_string(), got: shorten(raw) }),
    }
}

fn too_big(key: &str, size: &str, max: u32) -> GangMetadataError {
    GangMetadataError::TooLarge { key: key.to_string(), size: size.to_string(), max }
}

/// A user-written value, cut short for a message.
fn shorten(raw: &str) -> String {
    match raw.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &raw[..end]),
        None => raw.to_string(),
    }
}

/// The gang of a Pod, first match wins; `Err` for invalid gang metadata. `infer` lists the
/// owner kinds the matching GangPolicy opts into; `coscheduling_size` is its default size.
///
/// A member of a native PodGroup (`spec.schedulingGroup`) is in no Allot gang: the scheduler
/// places its group all-or-nothing, so Allot neither infers another gang for it nor gates it
/// (its quota gate, in Queue mode, still applies).
pub fn membership(
    facts: &PodFacts<'_>,
    infer: &[InferredKind],
    coscheduling_size: Option<u32>,
    max_size: u32,
) -> Result<Option<Membership>, GangMetadataError> {
    if facts.native_pod_group.is_some() {
        return Ok(None);
    }
    if let Some(name) = facts.labels.get(NAME_LABEL).filter(|n| !n.is_empty()) {
        let raw = facts.annotations.get(SIZE_ANNOTATION).ok_or_else(|| GangMetadataError::NoSize {
            named_by: format!("label {NAME_LABEL}={name}"),
            annotation: SIZE_ANNOTATION,
        })?;
        return Ok(Some(Membership {
            name: name.to_string(),
            size: Some(parse_size(SIZE_ANNOTATION, raw, max_size)?),
            source: Source::Explicit,
        }));
    }
    if let Some(name) = facts.label_or_annotation(KUEUE_GROUP) {
        // The one gang name an annotation can give, so bounded by nothing but the Pod's size:
        // every replica keeps a gang's name in each member's record and in its indexes.
        if name.len() > MAX_GANG_NAME {
            return Err(GangMetadataError::NameTooLong(name.len()));
        }
        if name.starts_with(NATIVE_GROUP_PREFIX) {
            return Err(GangMetadataError::NativeGroupName(name.to_string()));
        }
        let raw = facts.annotations.get(KUEUE_TOTAL).ok_or_else(|| GangMetadataError::NoSize {
            named_by: format!("{KUEUE_GROUP}={name}"),
            annotation: KUEUE_TOTAL,
        })?;
        return Ok(Some(Membership {
            name: name.to_string(),
            size: Some(parse_size(KUEUE_TOTAL, raw, max_size)?),
            source: Source::KueuePodGroup,
        }));
    }
    if let Some(name) = facts.labels.get(COSCHEDULING_LABEL).filter(|n| !n.is_empty()) {
        return Ok(Some(Membership { name: name.to_string(), size: coscheduling_size, source: Source::Coscheduling }));
    }
    Ok(infer_from_owner(facts, infer))
}

/// A PodGroup's `spec.schedulingPolicy.gang.minCount`; `None` for a `basic` PodGroup (its pods
/// go alone: no group).
pub fn gang_min_count(pod_group: &Value) -> Option<u32> {
    let min_count = pod_group.field(&["spec", "schedulingPolicy", "gang", "minCount"])?.as_u64()?;
    (min_count > 0).then(|| u32::try_from(min_count).unwrap_or(u32::MAX))
}

/// The native PodGroup a Pod (as JSON) is left to: its `spec.schedulingGroup.podGroupName`,
/// unless it carries Allot's gang gate. The mutating webhook adds that gate only when it found
/// the cluster does not gang PodGroups, so a gated pod is an Allot gang member by its labels
/// wherever it is read (validation, the watch, the controller), whatever the field says.
pub fn native_pod_group_of(pod: &Value) -> Option<&str> {
    if has_gate(pod, GATE) {
        return None;
    }
    pod.text(&["spec", "schedulingGroup", "podGroupName"])
}

/// The names of a Pod's (as JSON) scheduling gates, in order.
pub fn gate_names(pod: &Value) -> impl Iterator<Item = &str> {
    pod.field(&["spec", "schedulingGates"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("name").and_then(Value::as_str))
}

/// True when the Pod (as JSON) carries the scheduling gate `name`.
pub fn has_gate(pod: &Value, name: &str) -> bool {
    gate_names(pod).any(|g| g == name)
}

/// What a native PodGroup's quota group is named: a prefix no label value has (a `/`), and that
/// the one annotation-named source (Kueue's) may not use, so no other gang shares its tally.
pub const NATIVE_GROUP_PREFIX: &str = "PodGroup/";

/// True for the quota group of a native PodGroup (see [`native_group`]).
pub fn is_native_group(name: &str) -> bool {
    name.starts_with(NATIVE_GROUP_PREFIX)
}

/// A native PodGroup member's group as team quotas charge it: named `PodGroup/NAME`, sized by
/// the PodGroup's `spec.schedulingPolicy.gang.minCount` (the scheduler binds the group only
/// whole, so its quota is held whole from the first member on, as an Allot gang's is). `None`
/// for a pod of no PodGroup, or of a `basic` one (each pod goes alone). A PodGroup not found
/// (not created yet, or not served) gives a group of unknown size: each member is charged its
/// own requests, and once a member names the size the group is charged whole.
///
/// `pod_group` is the pod's `spec.schedulingGroup.podGroupName` ([`PodFacts::native_pod_group`]).
pub fn native_group(
    pod_group: Option<&str>,
    namespace: &str,
    objects: &dyn crate::model::dra::ClaimSource,
) -> Option<Membership> {
    let name = pod_group.filter(|n| !n.is_empty())?;
    let size = match objects.pod_group(namespace, name) {
        None => None,
        Some(group) => Some(gang_min_count(&group)?),
    };
    Some(Membership { name: format!("{NATIVE_GROUP_PREFIX}{name}"), size, source: Source::NativePodGroup })
}

/// The native PodGroup an inferred gang is handed to (GangPolicy `nativeScheduling`): `allot-`
/// and the gang's name, if that is a valid object name (a DNS subdomain); `None` otherwise (the
/// gang stays behind Allot's gate). Only the leader creates it, and only for members of that
/// gang ([`handed_off`]).
pub fn hand_off_name(gang: &str) -> Option<String> {
    let name = format!("allot-{gang}");
    let valid = name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    valid.then_some(name)
}

/// Whether `gang` may go to the scheduler's native gang scheduling: inferred gangs, except a
/// LeaderWorkerSet group, whose workers (under `startupPolicy: LeaderReady`) are created only
/// once the leader runs, which a PodGroup's `minCount` would wait for forever; Allot releases
/// such a leader alone when the whole group would fit.
pub fn can_hand_off(gang: &Membership) -> bool {
    matches!(gang.source, Source::Inferred(kind) if kind != InferredKind::LeaderWorkerSet)
}

/// True when a pod's native PodGroup is the one Allot hands its inferred `gang` to: the leader
/// then creates it. (A tenant may name `allot-…` PodGroups herself; the leader acts only where
/// the name is the one her pod's own inferred gang maps to, and owns the object by the gang's
/// owner, so it is the owner's, not hers.)
pub fn handed_off(facts: &PodFacts<'_>, gang: &Membership) -> bool {
    can_hand_off(gang)
        && facts.native_pod_group.is_some()
        && facts.native_pod_group == hand_off_name(&gang.name).as_deref()
}

fn infer_from_owner(facts: &PodFacts<'_>, infer: &[InferredKind]) -> Option<Membership> {
    let inferred = |kind, name: String| Some(Membership { name, size: None, source: Source::Inferred(kind) });
    if let (Some(lws), Some(group)) = (facts.labels.get(LWS_NAME), facts.labels.get(LWS_GROUP)) {
        return if infer.contains(&InferredKind::LeaderWorkerSet) {
            inferred(InferredKind::LeaderWorkerSet, format!("lws-{lws}-{group}"))
        } else {
            None
        };
    }
    // JobSet pods are Job pods too: JobSet first.
    if let Some(js) = facts.labels.get(JOBSET_NAME) {
        return if infer.contains(&InferredKind::JobSet) {
            inferred(InferredKind::JobSet, format!("jobset-{js}"))
        } else {
            None
        };
    }
    if let Some(job) = facts.labels.get(KUBEFLOW_JOB) {
        let mpi = facts.owners.iter().any(|(k, _)| *k == "MPIJob");
        if mpi {
            let launcher = facts.labels.get(KUBEFLOW_ROLE).is_some_and(|r| r.eq_ignore_ascii_case("launcher"));
            return if infer.contains(&InferredKind::MPIJob) && !launcher {
                inferred(InferredKind::MPIJob, format!("mpijob-{job}"))
            } else {
                None
            };
        }
        return if infer.contains(&InferredKind::KubeflowJob) {
            inferred(InferredKind::KubeflowJob, format!("kubeflow-{job}"))
        } else {
            None
        };
    }
    if let Some(job) = facts.labels.get(JOB_NAME) {
        let indexed = facts.labels.contains_key(JOB_INDEX) || facts.annotations.contains_key(JOB_INDEX);
        if indexed && infer.contains(&InferredKind::Job) && facts.owners.iter().any(|(k, _)| *k == "Job") {
            return inferred(InferredKind::Job, format!("job-{job}"));
        }
    }
    None
}

/// The labels a workload's controller gives the pods of the template at `template_path` (as [`crate::model::workload::pods_of`]
/// names it) of the workload `name` of kind `(group, kind)`, as far as [`membership`] infers a
/// gang from them, for the kinds whose controllers leave the compared fields as
/// the templates have them: JobSet, and LeaderWorkerSet (every group as its first, all being
/// alike). Not Kubeflow jobs and MPIJob: with gang scheduling on, their operators fill in a
/// template's empty `schedulerName` (and only an empty one), so templates that differ there may
/// make pods that agree. `None` for every other kind, an Indexed Job (one template) among them.
pub fn controller_labels(
    group: &str,
    kind: &str,
    name: &str,
    template_path: &str,
) -> Option<Vec<(&'static str, String)>> {
    match (group, kind) {
        ("jobset.x-k8s.io", "JobSet") => Some(vec![(JOBSET_NAME, name.to_string())]),
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet") => {
            let worker = if template_path.ends_with(".leaderTemplate") { "0" } else { "1" };
            Some(vec![(LWS_NAME, name.to_string()), (LWS_GROUP, "0".into()), (LWS_WORKER, worker.into())])
        }
        _ => None,
    }
}

/// True for the leader of a LeaderWorkerSet group (worker index 0).
pub fn is_group_leader(facts: &PodFacts<'_>) -> bool {
    facts.labels.get(LWS_WORKER) == Some("0")
}

/// What an owner object says about its gang.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerGang {
    pub size: u32,
    /// LeaderWorkerSet `startupPolicy: LeaderReady`: workers are created only once the leader
    /// runs, so the leader is released alone when the whole group would fit.
    pub leader_first: bool,
    /// The workers' Pod template (LeaderWorkerSet), to reserve room for workers not created yet.
    pub worker_template: Option<Value>,
}

/// Reads an owner object's gang: see [`owner_size`].
pub fn owner_gang(kind: InferredKind, owner: &Value) -> Option<OwnerGang> {
    let size = owner_size(kind, owner)?;
    let lws = kind == InferredKind::LeaderWorkerSet;
    Some(OwnerGang {
        size,
        leader_first: lws && owner.field(&["spec", "startupPolicy"]).and_then(Value::as_str) == Some("LeaderReady"),
        worker_template: lws
            .then(|| owner.field(&["spec", "leaderWorkerTemplate", "workerTemplate"]).cloned())
            .flatten(),
    })
}

/// The number of Pods an owner object runs at once: its gang size.
///
/// Job: `parallelism`. JobSet: Σ `replicas` × `parallelism`. Kubeflow jobs: Σ replica counts of
/// every `*ReplicaSpecs` entry. MPIJob: the Worker replicas (the launcher is not a member).
/// LeaderWorkerSet: `leaderWorkerTemplate.size` (one gang per group).
pub fn owner_size(kind: InferredKind, owner: &Value) -> Option<u32> {
    owner_total(kind, owner).and_then(|total| u32::try_from(total).ok()).filter(|n| *n > 0)
}

/// [`owner_size`] before the conversion: saturating, so absurd replica counts cannot overflow.
pub fn owner_total(kind: InferredKind, owner: &Value) -> Option<u64> {
    let int = |v: Option<&Value>, default: u64| v.and_then(Value::as_u64).unwrap_or(default);
    let spec = owner.get("spec")?;
    let total = match kind {
        InferredKind::Job => int(spec.get("parallelism"), 1),
        InferredKind::JobSet => spec
            .get("replicatedJobs")?
            .as_array()?
            .iter()
            // Saturating: the numbers are the tenant's, and an overflow must not panic the controller.
            .map(|rj| int(rj.get("replicas"), 1).saturating_mul(int(rj.field(&["template", "spec", "parallelism"]), 1)))
            .fold(0u64, u64::saturating_add),
        InferredKind::MPIJob => int(spec.field(&["mpiReplicaSpecs", "Worker", "replicas"]), 1),
        InferredKind::LeaderWorkerSet => int(spec.field(&["leaderWorkerTemplate", "size"]), 1),
        InferredKind::KubeflowJob => spec
            .as_object()?
            .iter()
            .filter(|(k, _)| k.ends_with("ReplicaSpecs"))
            .flat_map(|(_, specs)| specs.as_object().into_iter().flatten())
            .map(|(_, rs)| int(rs.get("replicas"), 1))
            .fold(0u64, u64::saturating_add),
    };
    Some(total)
}

#[cfg(test)]
mod tests;
