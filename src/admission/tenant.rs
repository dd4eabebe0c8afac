//! Tenants are adversaries: every field a namespace user can write is checked before Allot
//! trusts it. This module holds who is trusted for what ([`TenantPolicy`], [`Requester`]) and
//! the admission checks that follow from it:
//!
//! - only Allot's own identity moves Allot's gates (`allot.dev/gang`, `allot.dev/quota`) and the
//!   keys that drive its controller (every `allot.dev/` key, and every key gang membership reads)
//!   after CREATE ([`check_pod_update`]);
//! - `allot.dev/` keys other than the two users declare gangs with are Allot's alone, and are
//!   denied at CREATE rather than stripped: silently dropping them would hide a tenant's mistake
//!   (or attack) and make the same manifest behave differently under `allot check` and
//!   `kubectl apply --dry-run=server` ([`check_reserved_keys`]);
//! - Pods created with `spec.nodeName` skip the scheduler and every gate, so accelerator Pods,
//!   gang members and queued Pods may set it only from a trusted identity ([`check_bound_pod`]);
//! - every accelerator amount is bounded ([`check_amounts`]), as gang sizes are in
//!   [`crate::model::gang::membership::parse_size`], and so is the placement of a pod Allot holds
//!   ([`check_placement_size`]);
//! - in-place resizes and ephemeral containers never change what a Pod holds of accelerators.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::admission::finding::{Check, Finding};
use crate::model::gang::membership::{
    self, GATE, MEMBERSHIP_KEYS, NAME_LABEL, QUOTA_GATE, RELEASED_ANNOTATION, SIZE_ANNOTATION,
};
use crate::model::json::Fields;
pub use crate::model::policy::tenancy::{DEFAULT_MAX_AMOUNT, TenantPolicy};
use crate::model::policy::{Action, ExternalScheduler, PolicySet};
use crate::model::quantity::Quantity;
use crate::model::resources::{self, ContainerResources, ResourceList, ResourceMatcher, accelerators_only};
use crate::model::workload::PodView;

mod update;
pub use update::check_pod_update;

/// The user name Allot runs as in the shipped `deploy/` (service account `allot` in
/// `allot-system`): what `allot serve` allows where it cannot ask the API server who it is and
/// no `--allot-username` says (see `server::identity`), and the name `allot compile` and
/// `allot webhooks` skip by default.
pub const DEFAULT_ALLOT_USERNAME: &str = "system:serviceaccount:allot-system:allot";

/// A service account's user name (`system:serviceaccount:NAMESPACE:NAME`) as its namespace and
/// name, where both are plain DNS names.
pub fn service_account_of(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    let plain = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    (plain(namespace) && plain(name)).then_some((namespace, name))
}

/// `username` as a CEL string expression quoted with `quote` (`'` or `"`). A service account's
/// name is written as the sum `'system:serviceaccount:' + 'NAMESPACE' + ':' + 'NAME'`: split at
/// the quote, the namespace is part 3 and the name part 7, which is how `deploy/identity`'s
/// kustomize replacements put an overlay's namespace and ServiceAccount name into the webhooks'
/// and native policies' `not-allot-itself` conditions. Any other name is one escaped literal.
pub fn username_cel(username: &str, quote: char) -> String {
    if let Some((namespace, name)) = service_account_of(username) {
        let q = quote;
        return format!("{q}system:serviceaccount:{q} + {q}{namespace}{q} + {q}:{q} + {q}{name}{q}");
    }
    let mut out = String::with_capacity(username.len() + 2);
    out.push(quote);
    for c in username.chars() {
        if c == quote || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push(quote);
    out
}
/// The prefix of every key Allot owns.
pub const RESERVED_PREFIX: &str = "allot.dev/";

/// Who is making a request, as far as the caller knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester<'a> {
    /// The AdmissionReview's `userInfo.username`.
    User(&'a str),
    /// No userInfo (the gang controller reading watched Pods): no identity-based trust.
    Unknown,
}

impl Requester<'_> {
    /// A kubelet (`system:node:NAME`): the only writer of mirror pods.
    pub fn is_node(self) -> bool {
        matches!(self, Requester::User(u) if u.starts_with("system:node:"))
    }

    /// True when the requester is one of `identities`.
    pub fn is_one_of(self, identities: &[String]) -> bool {
        matches!(self, Requester::User(u) if identities.iter().any(|i| i == u))
    }
}

fn deny(check: Check, path: String, message: String) -> Finding {
    Finding { rule: check.into(), action: Action::Deny, path, message }
}

fn metadata_path(view_path: &str) -> String {
    if view_path.is_empty() { "metadata".to_string() } else { format!("{view_path}.metadata") }
}

/// A user-written value, cut short for a message.
fn shorten(raw: &str) -> String {
    match raw.char_indices().nth(60) {
        Some((end, _)) => format!("{}…", &raw[..end]),
        None => raw.to_string(),
    }
}

fn string_map<'v>(pod: &'v Value, field: &str) -> BTreeMap<&'v str, &'v Value> {
    pod.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default()
}

/// True for a key users may write at CREATE to declare a gang (label or annotation as given):
/// its name, its size, and the topology level it asks for (checked against its GangPolicy's
/// levels with the gang's metadata, [`crate::model::policy::topology`]).
fn user_declared(field: &str, key: &str) -> bool {
    (field == "labels" && key == NAME_LABEL)
        || (field == "annotations"
            && (key == SIZE_ANNOTATION || key == crate::model::policy::topology::TOPOLOGY_ANNOTATION))
}

/// `allot.dev/` labels and annotations a user wrote, other than the gang-name label and the
/// gang-size annotation: they are Allot's (e.g. `allot.dev/gang-released` would make the
/// controller reserve capacity for a Pod it never released).
pub fn check_reserved_keys(view: &PodView<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (field, what) in [("labels", "label"), ("annotations", "annotation")] {
        for key in string_map(&view.pod, field).keys().filter(|k| k.starts_with(RESERVED_PREFIX)) {
            if user_declared(field, key) {
                continue;
            }
            findings.push(deny(
                Check::TenantReservedKeys,
                format!("{}.{field}", metadata_path(&view.path)),
                format!(
                    "{what} {} is reserved for Allot and may not be set by users; remove it (the only allot.dev/ \
                     keys you may write are the label {NAME_LABEL} and the annotations {SIZE_ANNOTATION} and {})",
                    shorten(key),
                    crate::model::policy::topology::TOPOLOGY_ANNOTATION
                ),
            ));
        }
    }
    findings
}

/// A team with a quota counts every accelerator its pods ask for. One its quota neither limits
/// nor weighs as an equivalent would otherwise be used without limit: a team limited in
/// `nvidia.com/gpu` asking `nvidia.com/mig-7g.80gb: 8` or `amd.com/gpu`, or the devices of a DRA
/// DeviceClass whose `countsAs` its quota does not count. Denied in both modes (a queue-mode
/// pod asking only those would not even be queued), naming the fix.
pub fn check_uncounted_accelerators(
    policies: &PolicySet,
    view: &PodView<'_>,
    claims: &crate::model::dra::ClaimDemand,
    team: Option<&crate::model::policy::Team>,
) -> Option<Finding> {
    let team = team?;
    let quota = team.quota.as_ref()?;
    // What the pod holds in quota terms (`dra::held_quota_requests`: the claims' entries over
    // the requests'), without a copy of its requests: this runs on every review of a pod of a
    // team with a quota.
    let claimed = claims.quota_resources();
    let requests = view.requests().iter().filter(|(name, _)| !claimed.contains_key(*name));
    let mut uncounted: Vec<&str> = requests
        .chain(&claimed)
        .filter(|(name, q)| {
            **q > Quantity::ZERO
                && (policies.accelerators.matches(name) || name.starts_with(crate::model::dra::CLASS_RESOURCE_PREFIX))
                && !quota.counts(name, **q)
        })
        .map(|(name, _)| name.as_str())
        .collect();
    if uncounted.is_empty() {
        return None;
    }
    uncounted.sort_unstable();
    let names = uncounted.join(", ");
    Some(deny(
        Check::TeamQuota,
        view.spec_path(),
        format!(
            "team {}'s quota does not count {names}: its pods may not ask for it (add it to the quota's limits, or \
             to its equivalents with a weight)",
            team.name
        ),
    ))
}

/// The most distinct resource names one pod may ask (its containers' and its own requests and
/// limits together). Kubernetes bounds only their format: a pod asking `example.com/r1` …
/// `r20000` (it never starts) cost every replica megabytes of records and usage tables. Real
/// pods ask a handful (cpu, memory, ephemeral-storage, huge pages, an accelerator or two, RDMA).
pub const MAX_RESOURCE_NAMES: usize = 64;

/// A pod asking more than [`MAX_RESOURCE_NAMES`] distinct resources is denied.
pub fn check_resource_names(view: &PodView<'_>) -> Option<Finding> {
    let requests = view.requests();
    let limits = || view.containers().iter().flat_map(|c| c.resources.limits.keys());
    // Most pods: every limit is among the effective requests (the API server defaults a missing
    // request to its limit), so no set is built.
    if requests.len() <= MAX_RESOURCE_NAMES && limits().all(|k| requests.contains_key(k)) {
        return None;
    }
    let names: std::collections::BTreeSet<&str> = requests.keys().chain(limits()).map(String::as_str).collect();
    if names.len() <= MAX_RESOURCE_NAMES {
        return None;
    }
    Some(deny(
        Check::TenantResourceNames,
        view.spec_path(),
        format!(
            "the pod asks {} distinct resources in its requests and limits; at most {MAX_RESOURCE_NAMES}",
            names.len()
        ),
    ))
}

/// Accelerator amounts are bounded: no container and no Pod asks more than `max_amount` of one
/// accelerator resource, and none asks a negative amount. A Pod's total counts the devices of
/// its DRA claims (`claimed`, in accelerator terms) too.
pub fn check_amounts(policies: &PolicySet, view: &PodView<'_>, claimed: &ResourceList) -> Vec<Finding> {
    let mut findings = Vec::new();
    let max = policies.tenancy.max_amount;
    let limit = Quantity::from_units(i64::from(max));
    let too_much = |q: &Quantity| *q > limit || *q < Quantity::ZERO;
    for (parsed, container) in view.containers_with_json() {
        let (path, res) = (&parsed.path, &parsed.resources);
        let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
        for (kind, list) in [("request", &res.requests), ("limit", &res.limits)] {
            for (resource, q) in accelerators_only(list, &policies.accelerators).iter().filter(|(_, q)| too_much(q)) {
                findings.push(deny(
                    Check::TenantAmount,
                    path.clone(),
                    format!(
                        "container {name}: {resource} {kind} {q} is out of range; a pod may ask between 0 and {max} \
                         (Cluster spec.accelerators.maxAmount)"
                    ),
                ));
            }
        }
    }
    if findings.is_empty() {
        let mut total = accelerators_only(view.requests(), &policies.accelerators);
        for (resource, q) in claimed {
            let slot = total.entry(resource.clone()).or_default();
            *slot = slot.saturating_add(*q);
        }
        for (resource, q) in total.iter().filter(|(_, q)| too_much(q)) {
            let claims = if claimed.contains_key(resource) { " (its DRA claims included)" } else { "" };
            findings.push(deny(
                Check::TenantAmount,
                view.spec_path(),
                format!(
                    "pod asks {q} {resource} in all{claims}; at most {max} of one accelerator per pod \
                     (Cluster spec.accelerators.maxAmount)"
                ),
            ));
        }
    }
    findings
}

/// A pod Allot holds (a gang member, or one behind either of Allot's gates: `held`) may not
/// carry a placement over [`crate::model::gang::bounds`]: every replica keeps a gang member's placement
/// for the gang fit, and Kubernetes bounds none of those lists (27,000 tolerations fit in a
/// Pod). The same measure as the cluster view's, so a pod admitted here is never one the view
/// drops. Other pods are not checked: the view keeps no placement of theirs.
pub fn check_placement_size(view: &PodView<'_>, held: bool) -> Option<Finding> {
    if !held {
        return None;
    }
    let excess = crate::model::gang::bounds::excess_of_spec(view.pod.get("spec")?)?;
    let spec = view.spec_path();
    Some(deny(
        Check::TenantPlacementSize,
        spec.clone(),
        format!(
            "{}: Allot holds this pod (a gang member, or queued behind its team's quota) and keeps its \
             placement in every replica, so no larger one is accepted; keep only the tolerations, selector \
             keys and affinity terms the pod needs",
            excess.in_spec(&spec)
        ),
    ))
}

/// True when a Pod (as JSON) carries one of Allot's gates.
pub fn gated_by_allot(pod: &Value) -> bool {
    !allot_gates(pod).is_empty()
}

/// What a Pod created with `spec.nodeName` would skip, if anything Allot guards.
pub struct Bypassed {
    pub accelerators: bool,
    pub gang: bool,
    pub queued: bool,
}

/// A Pod created with `spec.nodeName` goes to its node without the scheduler, Allot's gates or
/// its placement: only trusted identities may do that with an accelerator Pod, a gang member
/// or a Pod queued behind a quota. (Its quota is charged like any other Pod's.) `bypassed` is
/// called only for such a Pod, so ordinary admissions do not pay for it.
pub fn check_bound_pod(
    policies: &PolicySet,
    view: &PodView<'_>,
    requester: Requester<'_>,
    bypassed: impl FnOnce() -> Bypassed,
) -> Option<Finding> {
    let node = view.pod.field(&["spec", "nodeName"]).and_then(Value::as_str).filter(|n| !n.is_empty())?;
    if requester.is_node() || requester.is_one_of(&policies.tenancy.bound_pod_creators) {
        return None;
    }
    // Only now, for a bound pod from an untrusted creator: what it would skip.
    let bypassed = bypassed();
    let what = if bypassed.accelerators {
        "requests accelerators"
    } else if bypassed.gang {
        "belongs to a gang"
    } else if bypassed.queued {
        "is queued behind its team's quota"
    } else {
        return None;
    };
    let who = match requester {
        Requester::User(u) => u,
        Requester::Unknown => "an unknown user",
    };
    Some(deny(
        Check::TenantBoundPod,
        format!("{}.nodeName", view.spec_path()),
        format!(
            "this pod {what} and sets spec.nodeName {node:?}, which would skip the scheduler and Allot's gates; \
             remove spec.nodeName (use a nodeSelector) — only {} may create such pods, not {who}",
            policies.tenancy.bound_pod_creators.join(", ")
        ),
    ))
}

/// True when an UPDATE takes Kueue's admission gate off the Pod (Kueue admitting it).
pub fn lifts_kueue_gate(old: &Value, new: &Value) -> bool {
    membership::has_gate(old, membership::KUEUE_GATE) && !membership::has_gate(new, membership::KUEUE_GATE)
}

/// Allot's gates of a Pod, in order.
fn allot_gates(pod: &Value) -> Vec<&str> {
    membership::gate_names(pod).filter(|g| *g == GATE || *g == QUOTA_GATE).collect()
}

/// True for a label or annotation key only Allot may change after CREATE.
pub fn is_guarded_key(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX) || MEMBERSHIP_KEYS.contains(&key)
}

fn describe(value: Option<&&Value>) -> String {
    match value {
        None => "absent".to_string(),
        Some(Value::String(s)) => format!("{:?}", shorten(s)),
        Some(other) => shorten(&other.to_string()),
    }
}

/// Per container name, its accelerator requests and limits.
fn accelerator_amounts(spec: &Value, matcher: &ResourceMatcher) -> BTreeMap<String, ContainerResources> {
    resources::containers(spec, &resources::ASKING_LISTS)
        .map(|(list, index, container)| {
            let path = format!("spec.{list}[{index}]");
            let name = container.get("name").and_then(Value::as_str).unwrap_or(&path).to_string();
            let res = ContainerResources::from_container(container, &path, &mut Vec::new());
            let res = ContainerResources {
                requests: accelerators_only(&res.requests, matcher),
                limits: accelerators_only(&res.limits, matcher),
            };
            (name, res)
        })
        .collect()
}

/// A Pod's owners decide which inferred gang it belongs to and how large that gang is (the
/// owner's parallelism or replicas): repointing a gated member at a smaller Job of one's own
/// would shrink the gang Allot waits for and the quota it charges. While Allot still holds the
/// pod (one of its gates, or a release reservation), only Allot and the control plane's own
/// controllers (garbage collector, Job and ReplicaSet adoption run as kube-system service
/// accounts or `system:kube-controller-manager`) may change them; other pods are left alone, so
/// operators that adopt ordinary pods keep working.
fn check_owner_change(old: &Value, new: &Value, username: &str, allot: &str, who: &str) -> Option<Finding> {
    let held = !allot_gates(old).is_empty() || string_map(old, "annotations").contains_key(RELEASED_ANNOTATION);
    let control_plane =
        username == "system:kube-controller-manager" || username.starts_with("system:serviceaccount:kube-system:");
    let changed = old.field(&["metadata", "ownerReferences"]) != new.field(&["metadata", "ownerReferences"]);
    (held && changed && !control_plane).then(|| {
        deny(
            Check::TenantReservedKeys,
            "metadata.ownerReferences".into(),
            format!(
                "the owners of a pod Allot is holding decide which gang it counts in and how large that gang is; \
                 only Allot ({allot}) or the cluster's controllers (kube-system) may change them, not {who}; \
                 delete and recreate the pod instead"
            ),
        )
    })
}

fn show(res: &ContainerResources) -> String {
    let part =
        |list: &resources::ResourceList| list.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ");
    format!("requests {{{}}} limits {{{}}}", part(&res.requests), part(&res.limits))
}

/// The owner kind whose Pods form an inferred gang, for a workload's group and kind.
pub fn inferred_kind(group: &str, kind: &str) -> Option<membership::InferredKind> {
    use membership::InferredKind as K;
    Some(match (group, kind) {
        ("batch", "Job") => K::Job,
        ("jobset.x-k8s.io", "JobSet") => K::JobSet,
        ("kubeflow.org", "MPIJob") => K::MPIJob,
        ("kubeflow.org", "PyTorchJob" | "TFJob" | "XGBoostJob" | "JAXJob" | "PaddleJob") => K::KubeflowJob,
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet") => K::LeaderWorkerSet,
        _ => return None,
    })
}

/// The gang size a workload implies (Job parallelism, Σ JobSet replicas…) when its GangPolicy
/// infers gangs of its kind, checked against that policy's `maxGangSize`.
pub fn check_owner_size(
    policies: &PolicySet,
    req: &crate::admission::request::Request<'_>,
    team: Option<&str>,
) -> Option<Finding> {
    let kind = inferred_kind(req.group, req.kind)?;
    let policy = policies.gang_policy(req.namespace, team);
    if !policy.infer.contains(&kind) {
        return None;
    }
    let size = membership::owner_total(kind, req.object)?;
    let max = policy.max_size;
    (size > u64::from(max)).then(|| {
        deny(
            Check::TenantGangSize,
            "spec".into(),
            format!(
                "this {} makes a gang of {size} pods; gangs here have at most {max} members (GangPolicy \
                 maxGangSize); lower its parallelism or replicas",
                req.kind
            ),
        )
    })
}

/// An in-place resize must not change what a Pod is charged against its team's quota (the
/// quota was checked, or the Pod queued, on the amounts it was created with).
pub fn check_charge_change(quota: &crate::model::policy::quota::Quota, old: &Value, new: &Value) -> Option<Finding> {
    let charge = |pod: &Value| pod.get("spec").map(|s| quota.charge(&resources::pod_requests(s))).unwrap_or_default();
    let (before, after) = (charge(old), charge(new));
    (before != after).then(|| {
        let names: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        let names: Vec<&str> =
            names.into_iter().filter(|n| before.get(*n) != after.get(*n)).map(String::as_str).collect();
        deny(
            Check::TenantResize,
            "spec.containers".into(),
            format!(
                "this change alters what the pod is charged against its team's quota ({}); quota-limited \
                 resources may not be resized in place — recreate the pod",
                names.join(", ")
            ),
        )
    })
}

/// Why a Pod never carries Allot's gang gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exemption {
    /// Created with `spec.nodeName`: the API server refuses gates on it.
    Bound,
    /// A kubelet's mirror of a static pod.
    Mirror,
    /// A DaemonSet's pod, from a trusted DaemonSet controller: one per node, never a gang.
    DaemonSet,
    /// Managed by a gang or queue manager the cluster runs.
    Kueue,
    Volcano,
    Coscheduling,
}

impl Exemption {
    /// Also keeps the quota gate off: only for a manager that queues pods itself (Kueue's
    /// ClusterQueues, Volcano's queues). Not for a DaemonSet's pods (what they hold counts
    /// against their team like any pod's, and a tenant's own DaemonSet asking GPUs would
    /// otherwise run on every node past a queue-mode quota), nor for coscheduling's (a gang
    /// mechanism, no quota: a tenant's own one-member PodGroup would skip her team's queue),
    /// except where its group's size is unknown ([`quota_queue_exemption`] decides: the queue
    /// cannot release such a group whole).
    pub fn from_the_quota_queue(self) -> bool {
        !matches!(self, Exemption::DaemonSet | Exemption::Coscheduling)
    }
}

/// The scheduler the API server gives a Pod that names none.
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Why a pod that counts against its team's queue-mode quota is kept out of Allot's quota
/// queue, or `None` when the queue holds it: a [`never_gate`] exemption that
/// [`Exemption::from_the_quota_queue`], and a coscheduling pod only where its group's size is
/// not known (GangPolicy `coschedulingSize`): the queue would release part of such a group,
/// which could then hold the team's quota waiting for members queued behind it. One rule for
/// mutation (which then adds no quota gate) and validation ([`check_quota_queue_skip`]).
pub fn quota_queue_exemption(
    policies: &PolicySet,
    facts: &membership::PodFacts<'_>,
    namespace: &str,
    team: &str,
    requester: Requester<'_>,
) -> Option<Exemption> {
    match never_gate(facts, &policies.tenancy, requester)? {
        Exemption::Coscheduling => policies
            .gang_of(facts, namespace, Some(team))
            .is_ok_and(|m| m.is_none_or(|m| m.size.is_none()))
            .then_some(Exemption::Coscheduling),
        e => e.from_the_quota_queue().then_some(e),
    }
}

/// A pod that counts against its team's queue-mode quota, placed by a scheduler whose pods
/// Allot's quota queue does not hold (Volcano, whose queues a tenant picks herself; the
/// coscheduling plugin with groups of unknown size), would run past the team's quota:
/// denied, with what to do instead. Kueue's pods stay exempt: they wait in the LocalQueues the
/// cluster's admins give each namespace. Bound pods are [`check_bound_pod`]'s.
///
/// A pod naming no scheduler gets `workload_scheduler` (what a Volcano Job gives the pods of
/// its tasks) or the default one. Only a pod whose scheduler is one of Volcano's, or one of
/// coscheduling's with its group label, pays for more than a team lookup and a few string
/// compares; `counts_against_quota` is asked only for them.
pub fn check_quota_queue_skip(
    policies: &PolicySet,
    view: &PodView<'_>,
    namespace: &str,
    team: Option<&crate::model::policy::Team>,
    requester: Requester<'_>,
    workload_scheduler: Option<&str>,
    counts_against_quota: impl FnOnce(&crate::model::policy::quota::Quota) -> bool,
) -> Option<Finding> {
    let team = team?;
    let quota = team.quota.as_ref().filter(|q| q.mode == crate::model::policy::QuotaMode::Queue)?;
    let scheduler = view.pod.text(&["spec", "schedulerName"]).or(workload_scheduler).unwrap_or(DEFAULT_SCHEDULER);
    // The quick test: only a pod an external scheduler places reads on.
    let grouped = || view.pod.text(&["metadata", "labels", membership::COSCHEDULING_LABEL]).is_some();
    placed_by_external_scheduler(&policies.tenancy, scheduler, grouped)?;
    if !counts_against_quota(quota) {
        return None;
    }
    let mut facts = membership::PodFacts::from_json(&view.pod);
    facts.scheduler_name = Some(scheduler);
    let instead = match quota_queue_exemption(policies, &facts, namespace, &team.name, requester)? {
        Exemption::Volcano => "Volcano's queues do not hold it to this quota",
        Exemption::Coscheduling => {
            "the coscheduling plugin's group size is not known here, so the queue cannot hold the group whole \
             (set coschedulingSize in this namespace's GangPolicy)"
        }
        _ => return None,
    };
    Some(deny(
        Check::TeamQuota,
        format!("{}.schedulerName", view.spec_path()),
        format!(
            "team {} queues what its quota counts in Allot's quota queue (quota mode Queue), and this pod, \
             placed by scheduler {scheduler:?}, would not wait in it: {instead}; it would run past the team's \
             quota. Leave schedulerName to the default scheduler (a gang waits behind Allot's gang gate)",
            team.name
        ),
    ))
}

/// Why a Pod must never carry Allot's gang gate, or `None` ([`Exemption::from_the_quota_queue`]
/// says whether the quota gate too).
///
/// Exemptions go by trust, not by label: a DaemonSet ownerReference counts only when the
/// DaemonSet controller created the Pod, a mirror annotation only from a kubelet, and Kueue's,
/// Volcano's or coscheduling's markers only when the Cluster policy says the cluster runs them.
/// With [`Requester::Unknown`] (the controller, which sees no userInfo) no identity-based
/// exemption is granted.
pub fn never_gate(
    facts: &membership::PodFacts<'_>,
    tenancy: &TenantPolicy,
    requester: Requester<'_>,
) -> Option<Exemption> {
    if facts.node_name.is_some() {
        // The API server refuses scheduling gates on a Pod created with nodeName; whether such
        // a Pod is admitted at all is validation's call (`tenant/bound-pod`).
        return Some(Exemption::Bound);
    }
    if facts.annotations.contains_key("kubernetes.io/config.mirror") && requester.is_node() {
        return Some(Exemption::Mirror);
    }
    if facts.owners.iter().any(|(kind, _)| *kind == "DaemonSet") && requester.is_one_of(&tenancy.daemon_set_controllers)
    {
        return Some(Exemption::DaemonSet);
    }
    // Kueue's gate holds the pod until Kueue admits it, and only Kueue may lift it
    // ([`check_pod_update`]); its `managed` label alone holds nothing (a tenant writes it).
    if tenancy.external_schedulers.contains(&ExternalScheduler::Kueue) && facts.gates.contains(&membership::KUEUE_GATE)
    {
        return Some(Exemption::Kueue);
    }
    // A pod naming no scheduler gets the default.
    let scheduler = facts.scheduler_name.unwrap_or(DEFAULT_SCHEDULER);
    placed_by_external_scheduler(tenancy, scheduler, || {
        facts.labels.get(membership::COSCHEDULING_LABEL).is_some_and(|v| !v.is_empty())
    })
}

/// The external scheduler that places a pod `scheduler` places, where the cluster runs it:
/// Volcano under its scheduler names; coscheduling under the names of the schedulers running
/// the plugin, for a pod with its pod-group label (`grouped`). A marker holds a pod only where
/// that scheduler places it: Volcano's group on a pod the default scheduler places, or the
/// pod-group label on one a scheduler without the plugin places, holds nothing.
fn placed_by_external_scheduler(
    tenancy: &TenantPolicy,
    scheduler: &str,
    grouped: impl FnOnce() -> bool,
) -> Option<Exemption> {
    let runs = |s| tenancy.external_schedulers.contains(&s);
    let placed_by = |names: &[String]| names.iter().any(|n| n == scheduler);
    if runs(ExternalScheduler::Volcano) && placed_by(&tenancy.volcano_schedulers) {
        return Some(Exemption::Volcano);
    }
    if runs(ExternalScheduler::Coscheduling) && placed_by(&tenancy.coscheduling_schedulers) && grouped() {
        return Some(Exemption::Coscheduling);
    }
    None
}

#[cfg(test)]
mod tests;
