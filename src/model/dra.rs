//! Accelerators asked through Dynamic Resource Allocation: what a Pod's ResourceClaims and
//! ResourceClaimTemplates count as, in the same resource terms as `nvidia.com/gpu: 1` in limits.
//!
//! Pure: a Pod (raw JSON, as admission sees it), the Cluster's DeviceClass mapping and a
//! [`ClaimSource`] to look claims up in; no I/O. The server's source is its watch cache, `allot
//! check`'s the manifests it was given.
//!
//! Counting rules (each request of a claim's `spec.devices.requests`):
//! - `exactly` with `allocationMode: ExactCount` (the default) counts `count` (default 1);
//! - `allocationMode: All` counts [`DeviceClasses::all_count`] (32 unless the policy says), as the
//!   in-tree ResourceQuota does: admission cannot know how many devices match;
//! - `firstAvailable` counts its largest option, since the scheduler may pick any of them;
//! - devices of a DeviceClass the policy does not map count nothing.
//!
//! A claim made from a template belongs to one pod; a ResourceClaim named by
//! `resourceClaimName` may be shared by many pods and is kept apart ([`ClaimDemand::shared`]):
//! each pod's own checks (accelerators, placement, CEL) see its devices, and team quotas charge
//! them once per claim, while any pod that names it lives ([`SharedClaims`]; every quota book
//! keeps the claims it counted by name). A claim the scheduler creates for a pod's own extended
//! resource (DRAExtendedResource) stands for a request already in the containers' resources and is
//! never counted again: it is named in the pod's `status.extendedResourceClaimStatus`, never in
//! its `spec.resourceClaims`, and only those are counted. Every claim a pod names there counts by
//! its devices, whatever its annotations ([`EXTENDED_RESOURCE_CLAIM_ANNOTATION`] included: a
//! tenant writes those). A claim or template that cannot be found is not "free": it is reported
//! in [`ClaimDemand::missing`] and admission denies naming it.

pub mod slices;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::model::json::Fields;
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

/// The annotation the scheduler puts on the claim it creates for a pod's extended-resource
/// request backed by DRA (DRAExtendedResource). Not trusted to mean anything: anyone who may
/// create ResourceClaims may write it, and the claim the scheduler made is told by where it is
/// named (the pod's status), not by its annotations ([`pod_demand`]).
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";

/// What `allocationMode: All` counts as when the policy does not say (the in-tree quota's 32).
pub const DEFAULT_ALL_COUNT: u32 = 32;

/// Prefix of the resource names under which claim devices are charged to team quotas, one per
/// DeviceClass (`deviceclass.allot.dev/mig.nvidia.com`). The compiled quota maps each to its
/// `countsAs` resource with the exact weight, so seven `1/7` devices are exactly one GPU.
pub const CLASS_RESOURCE_PREFIX: &str = "deviceclass.allot.dev/";

/// The quota resource name of a DeviceClass's devices.
pub fn class_resource(class: &str) -> String {
    format!("{CLASS_RESOURCE_PREFIX}{class}")
}

/// What one device of a DeviceClass counts as: `numerator / denominator` of `counts_as`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassWeight {
    pub counts_as: String,
    pub numerator: i128,
    pub denominator: i128,
}

/// The Cluster policy's DeviceClass mapping, compiled (weights parsed and checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceClasses {
    classes: BTreeMap<String, ClassWeight>,
    all_count: u32,
}

impl Default for DeviceClasses {
    fn default() -> Self {
        DeviceClasses { classes: BTreeMap::new(), all_count: DEFAULT_ALL_COUNT }
    }
}

impl DeviceClasses {
    /// A mapping of DeviceClass name → weight; `all_count` is what `allocationMode: All` counts.
    pub fn new(classes: BTreeMap<String, ClassWeight>, all_count: u32) -> Self {
        DeviceClasses { classes, all_count: all_count.max(1) }
    }

    /// True when no DeviceClass is mapped: claims then count nothing and are not looked up.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The weight of one device of `class`, if the class is mapped.
    pub fn get(&self, class: &str) -> Option<&ClassWeight> {
        self.classes.get(class)
    }

    /// Every mapped class.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &ClassWeight)> {
        self.classes.iter()
    }

    /// What a request with `allocationMode: All` counts as.
    pub fn all_count(&self) -> u32 {
        self.all_count
    }
}

/// Where claims and templates are looked up.
///
/// Objects are handed out shared and may be reduced to what counting reads of them
/// ([`claim_as_read`], [`template_as_read`]): a lookup is made for every claim entry of every pod
/// view, several times per review, and a tenant writes the objects (annotations, opaque driver
/// parameters, selectors: hundreds of KiB), so a lookup must not copy or convert them whole.
pub trait ClaimSource: Send + Sync {
    /// The ResourceClaimTemplate object `name` in `namespace`.
    fn template(&self, namespace: &str, name: &str) -> Option<Arc<Value>>;
    /// The ResourceClaim object `name` in `namespace`.
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<Value>>;
    /// How a missing object is described ("not among the manifests", "not found in the
    /// cluster"), after its kind and name.
    fn missing_phrase(&self) -> &'static str {
        "not found"
    }
    /// True once the source holds every claim and template that existed when it started (a
    /// watch's first list is in): pods resolved before would count no claim devices.
    fn synced(&self) -> bool {
        true
    }
    /// The native PodGroup object `name` in `namespace` (`scheduling.k8s.io`, Kubernetes' own
    /// gang scheduling), where the cluster serves them: a member's quota is charged for the
    /// group's `minCount` ([`crate::model::gang::membership::native_group`]). Looked up beside the
    /// claims because admission and the watch resolve both from the same caches.
    fn pod_group(&self, _namespace: &str, _name: &str) -> Option<Value> {
        None
    }
    /// True when the cluster gangs native PodGroups itself. Only then does a Pod's
    /// `spec.schedulingGroup` survive CREATE: where the `GenericWorkload` gate is off the API
    /// server drops the field *after* the mutating webhooks saw it, so a tenant could name any
    /// PodGroup to keep an Allot gang member from its gate. False unless known (fail closed:
    /// the member is gated).
    fn schedules_native_gangs(&self) -> bool {
        false
    }
}

/// A source that knows no claims: every reference is missing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoClaims;

impl ClaimSource for NoClaims {
    fn template(&self, _: &str, _: &str) -> Option<Arc<Value>> {
        None
    }
    fn claim(&self, _: &str, _: &str) -> Option<Arc<Value>> {
        None
    }
    fn missing_phrase(&self) -> &'static str {
        "not known to Allot (no claim source)"
    }
}

/// Claims and templates held in memory, by (namespace, name), as counting reads them
/// ([`claim_as_read`]): `allot check`'s manifests, `allot explain`'s lists, tests.
#[derive(Debug, Clone, Default)]
pub struct ClaimObjects {
    templates: BTreeMap<(String, String), Arc<Value>>,
    claims: BTreeMap<(String, String), Arc<Value>>,
    pod_groups: BTreeMap<(String, String), Value>,
    missing_phrase: &'static str,
}

impl ClaimObjects {
    /// An empty set whose missing objects are described by `missing_phrase`.
    pub fn new(missing_phrase: &'static str) -> Self {
        ClaimObjects { missing_phrase, ..Default::default() }
    }

    /// Keeps `object` if it is a `resource.k8s.io` ResourceClaim or ResourceClaimTemplate or a
    /// `scheduling.k8s.io` PodGroup (its namespace from metadata, else `default_namespace`);
    /// true when it was kept.
    pub fn insert(&mut self, object: &Value, default_namespace: &str) -> bool {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let group = api_version.split_once('/').map_or("", |(group, _)| group);
        let Some(name) = object.field(&["metadata", "name"]).and_then(Value::as_str) else {
            return false;
        };
        let namespace =
            object.field(&["metadata", "namespace"]).and_then(Value::as_str).unwrap_or(default_namespace).to_string();
        let key = (namespace, name.to_string());
        match (group, object.get("kind").and_then(Value::as_str)) {
            ("resource.k8s.io", Some("ResourceClaimTemplate")) => {
                self.templates.insert(key, Arc::new(template_as_read(object)));
            }
            ("resource.k8s.io", Some("ResourceClaim")) => {
                self.claims.insert(key, Arc::new(claim_as_read(object)));
            }
            ("scheduling.k8s.io", Some("PodGroup")) => {
                self.pod_groups.insert(key, object.clone());
            }
            _ => return false,
        }
        true
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty() && self.claims.is_empty() && self.pod_groups.is_empty()
    }
}

impl ClaimSource for ClaimObjects {
    fn template(&self, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.templates.get(&(namespace.to_string(), name.to_string())).cloned()
    }
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.claims.get(&(namespace.to_string(), name.to_string())).cloned()
    }
    fn missing_phrase(&self) -> &'static str {
        if self.missing_phrase.is_empty() { "not found" } else { self.missing_phrase }
    }
    fn pod_group(&self, namespace: &str, name: &str) -> Option<Value> {
        self.pod_groups.get(&(namespace.to_string(), name.to_string())).cloned()
    }
    /// Manifests are taken as written: a Pod that names a PodGroup is in it.
    fn schedules_native_gangs(&self) -> bool {
        true
    }
}

/// A claim reference that could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingClaim {
    /// `ResourceClaimTemplate` or `ResourceClaim`.
    pub kind: &'static str,
    pub name: String,
    /// Path of the reference (`spec.resourceClaims[0]`).
    pub path: String,
}

/// Devices per mapped DeviceClass.
pub type ClassCounts = BTreeMap<String, u64>;

/// What a Pod asks through its claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimDemand {
    /// Devices of claims made for this pod alone (from templates).
    pub own: ClassCounts,
    /// Devices of each shared ResourceClaim the pod names, by claim ([`shared_claim_key`]: its
    /// name and UID): once per pod however often it names the claim.
    pub shared: BTreeMap<String, ClassCounts>,
    /// References that could not be resolved.
    pub missing: Vec<MissingClaim>,
}

impl ClaimDemand {
    /// True when the claims ask for no mapped device and nothing is missing.
    pub fn is_empty(&self) -> bool {
        self.own.is_empty() && self.shared.is_empty() && self.missing.is_empty()
    }

    /// Devices per class, every shared claim counted once.
    pub fn per_class(&self) -> ClassCounts {
        let mut total = self.own.clone();
        for counts in self.shared.values() {
            add_counts(&mut total, counts);
        }
        total
    }

    /// The devices as accelerator resources (`countsAs` names, weights applied, rounded up to
    /// the nano-unit): what placement, the accelerator checks and CEL see.
    pub fn accelerators(&self, classes: &DeviceClasses) -> ResourceList {
        let mut out = ResourceList::new();
        for (class, count) in self.per_class() {
            let Some(w) = classes.get(&class) else { continue };
            let scaled = i128::from(count).saturating_mul(1_000_000_000).saturating_mul(w.numerator);
            let nanos = scaled / w.denominator + i128::from(scaled % w.denominator != 0);
            let slot = out.entry(w.counts_as.clone()).or_default();
            *slot = slot.saturating_add(Quantity::from_nanos(nanos));
        }
        out
    }

    /// The devices as quota resources, one name per class ([`class_resource`]): a compiled
    /// quota weighs them exactly. Every claim, shared ones included (what one pod holds).
    pub fn quota_resources(&self) -> ResourceList {
        class_resources(&self.per_class())
    }

    /// The devices of the claims made for this pod alone, as quota resources: what its team is
    /// charged for it beside its containers' requests.
    pub fn own_quota_resources(&self) -> ResourceList {
        class_resources(&self.own)
    }

    /// The devices of each shared claim, as quota resources: charged once per claim.
    pub fn shared_quota_resources(&self) -> SharedClaims {
        self.shared.iter().map(|(name, counts)| (name.clone(), class_resources(counts))).collect()
    }
}

/// Shared ResourceClaims by name, each with its devices as quota resources
/// ([`class_resource`] names): a team is charged each once, however many of its pods name it.
pub type SharedClaims = BTreeMap<String, ResourceList>;

fn class_resources(counts: &ClassCounts) -> ResourceList {
    counts
        .iter()
        .map(|(class, count)| (class_resource(class), Quantity::from_units(i64::try_from(*count).unwrap_or(i64::MAX))))
        .collect()
}

/// Class by class, the larger of two counts.
fn larger_counts(mut a: ClassCounts, b: &ClassCounts) -> ClassCounts {
    for (class, n) in b {
        let slot = a.entry(class.clone()).or_default();
        *slot = (*slot).max(*n);
    }
    a
}

fn add_counts(total: &mut ClassCounts, other: &ClassCounts) {
    for (class, n) in other {
        let slot = total.entry(class.clone()).or_default();
        *slot = slot.saturating_add(*n);
    }
}

/// What a pod is charged against its team's quota for itself: its effective requests
/// (`requests`, from its spec) and the devices of the claims made for it alone, under their
/// DeviceClass names, which the compiled quota weighs exactly. Its shared claims are charged
/// apart, once per claim ([`ClaimDemand::shared_quota_resources`]).
pub fn quota_requests(requests: &ResourceList, claims: &ClaimDemand) -> ResourceList {
    let mut requests = requests.clone();
    requests.extend(claims.own_quota_resources());
    requests
}

/// Everything the pod holds in quota terms, its shared claims included: whether it counts
/// against a quota at all (a pod that only shares a claim still does).
pub fn held_quota_requests(requests: &ResourceList, claims: &ClaimDemand) -> ResourceList {
    let mut requests = requests.clone();
    requests.extend(claims.quota_resources());
    requests
}

/// The claims `pod` asks for, resolved in `namespace`, `pod` being as the API server stores it
/// (the Pod watch; an UPDATE's object): its `status` is written by Kubernetes' own controllers
/// and names the claims made from its templates, which are what it holds. Nothing is looked up
/// when no DeviceClass is mapped.
pub fn pod_demand(pod: &Value, namespace: &str, classes: &DeviceClasses, source: &dyn ClaimSource) -> ClaimDemand {
    demand_of(pod, StatusRead::Trusted, namespace, classes, source)
}

/// [`pod_demand`] for a Pod being created (or a template seen as one): admission at CREATE, a dry
/// run's manifests. Its `status` is not read: at CREATE it is whatever the request carries (the
/// tenant's own, which the API server replaces only after the mutating webhooks), so a status
/// naming some small claim "made from" a template must not stand for the template. The pod has
/// no claim of its own yet; its templates are what it will get.
pub fn created_pod_demand(
    pod: &Value,
    namespace: &str,
    classes: &DeviceClasses,
    source: &dyn ClaimSource,
) -> ClaimDemand {
    demand_of(pod, StatusRead::Ignored, namespace, classes, source)
}

/// Whether a pod's `status` names the claims made from its templates ([`generated_claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusRead {
    Trusted,
    Ignored,
}

fn demand_of(
    pod: &Value,
    status: StatusRead,
    namespace: &str,
    classes: &DeviceClasses,
    source: &dyn ClaimSource,
) -> ClaimDemand {
    let mut demand = ClaimDemand::default();
    if classes.is_empty() {
        return demand;
    }
    let entries = pod.field(&["spec", "resourceClaims"]).and_then(Value::as_array);
    for (i, entry) in entries.into_iter().flatten().enumerate() {
        let path = format!("spec.resourceClaims[{i}]");
        if let Some(name) = entry.get("resourceClaimTemplateName").and_then(Value::as_str) {
            let entry_name = entry.get("name").and_then(Value::as_str).unwrap_or_default();
            // The claim made from the template (once there is one) and the template: the larger
            // of the two, class by class. The claim is immutable and is what the pod holds, while
            // a template can be deleted and made again smaller under the same name (a record
            // rebuilt against it would count the smaller one); and a status is not beyond a
            // tenant whose Role reaches pods/status, who could name a small claim of her own
            // there (made with an ownerReference to the pod). Only the claim when the template
            // is gone; only the template before the claim exists (at CREATE, always).
            let generated = match status {
                StatusRead::Trusted => generated_claim(pod, entry_name, namespace, source),
                StatusRead::Ignored => None,
            };
            // A template's claim spec is at spec.spec.
            let template = source.template(namespace, name).map(|t| claim_devices(t.field(&["spec", "spec"]), classes));
            match (generated.map(|c| claim_devices(c.get("spec"), classes)), template) {
                (Some(claim), Some(template)) => add_counts(&mut demand.own, &larger_counts(claim, &template)),
                (Some(counts), None) | (None, Some(counts)) => add_counts(&mut demand.own, &counts),
                (None, None) => {
                    demand.missing.push(MissingClaim { kind: "ResourceClaimTemplate", name: name.into(), path })
                }
            }
        } else if let Some(name) = entry.get("resourceClaimName").and_then(Value::as_str) {
            // Counted whatever its annotations. The scheduler's own extended-resource claim
            // (annotated EXTENDED_RESOURCE_CLAIM_ANNOTATION) is named only in the pod's
            // `status.extendedResourceClaimStatus`, never here (the spec is immutable and that
            // claim is made after it, under a generated name), so nothing legitimate is skipped
            // by counting it: a claim named here that carries the annotation is a tenant's own,
            // and skipping it would make its devices free (kubernetes#135404 is the same class).
            match source.claim(namespace, name) {
                Some(claim) => {
                    let counts = claim_devices(claim.get("spec"), classes);
                    if !counts.is_empty() {
                        demand.shared.insert(shared_claim_key(name, &claim), counts);
                    }
                }
                None => demand.missing.push(MissingClaim { kind: "ResourceClaim", name: name.into(), path }),
            }
        }
    }
    demand
}

/// How a shared claim is told apart in the quota books: `NAME/UID` (`NAME` where the object has
/// no UID, as in manifests). Its spec is immutable, but a claim deleted and created again under
/// the same name (possible while no pod has it reserved) may ask for more: keyed by name alone, a
/// pod naming the new one would find it "counted already" at the old, smaller size.
fn shared_claim_key(name: &str, claim: &Value) -> String {
    match claim.field(&["metadata", "uid"]).and_then(Value::as_str).filter(|u| !u.is_empty()) {
        Some(uid) => format!("{name}/{uid}"),
        None => name.to_string(),
    }
}

/// The claim name in a shared claim's key ([`shared_claim_key`]).
pub fn shared_claim_name(key: &str) -> &str {
    key.split_once('/').map_or(key, |(name, _)| name)
}

/// The ResourceClaim Kubernetes made from a template for the pod's claim entry `entry`: named in
/// the pod's `status.resourceClaimStatuses` and controlled by the pod (its ownerReference with
/// the pod's UID). A pod that exists has one once the resourceclaim controller made it
/// (admission, at CREATE, has none yet), and it is counted rather than the template: it outlives
/// the template (a pod whose template was deleted before Allot (re)started is counted from it,
/// not as asking nothing) and cannot change, whatever becomes of the template.
fn generated_claim(pod: &Value, entry: &str, namespace: &str, source: &dyn ClaimSource) -> Option<Arc<Value>> {
    let uid = pod.field(&["metadata", "uid"]).and_then(Value::as_str).filter(|u| !u.is_empty())?;
    let name = pod
        .field(&["status", "resourceClaimStatuses"])
        .and_then(Value::as_array)?
        .iter()
        .find(|s| s.get("name").and_then(Value::as_str) == Some(entry))?
        .get("resourceClaimName")
        .and_then(Value::as_str)?;
    let claim = source.claim(namespace, name)?;
    controlled_by(&claim, uid).then_some(claim)
}

/// True when `claim`'s controller (an owner reference with `controller: true`) has UID `uid`.
fn controlled_by(claim: &Value, uid: &str) -> bool {
    claim.field(&["metadata", "ownerReferences"]).and_then(Value::as_array).is_some_and(|owners| {
        owners.iter().any(|o| {
            o.get("uid").and_then(Value::as_str) == Some(uid)
                && o.get("controller").and_then(Value::as_bool) == Some(true)
        })
    })
}

/// A ResourceClaim (the whole object, or any part of it holding what is read) reduced to what
/// [`pod_demand`] reads of it: `metadata.uid` (a shared claim's key), each owner reference's
/// `uid` and `controller` (a pod's generated claim) and `spec.devices.requests` as
/// [`requests_as_read`] keeps them. Annotations, managedFields, status, opaque driver
/// parameters and selectors are left out: a source keeps this, made once per object version,
/// so a lookup costs what is read, not what the tenant wrote.
pub fn claim_as_read(claim: &Value) -> Value {
    let mut metadata = serde_json::Map::new();
    if let Some(uid) = claim.field(&["metadata", "uid"]).filter(|u| u.is_string()) {
        metadata.insert("uid".into(), uid.clone());
    }
    if let Some(owners) = claim.field(&["metadata", "ownerReferences"]).and_then(Value::as_array) {
        let owners = owners.iter().map(|o| pick(o, &["uid", "controller"])).collect();
        metadata.insert("ownerReferences".into(), Value::Array(owners));
    }
    serde_json::json!({
        "metadata": metadata,
        "spec": {"devices": {"requests": requests_as_read(claim.field(&["spec", "devices", "requests"]))}},
    })
}

/// A ResourceClaimTemplate reduced to what [`pod_demand`] reads of it: the device requests of
/// its claim spec (`spec.spec.devices.requests`), as [`requests_as_read`] keeps them.
pub fn template_as_read(template: &Value) -> Value {
    let requests = requests_as_read(template.field(&["spec", "spec", "devices", "requests"]));
    serde_json::json!({"spec": {"spec": {"devices": {"requests": requests}}}})
}

/// A claim spec's `devices.requests` reduced to what [`claim_devices`] reads: per request, its
/// `exactly`, else its `firstAvailable` options, else its own (pre-v1) fields, each kept to
/// `deviceClassName`, `allocationMode` and `count`. Counts the same as the requests it is made
/// from, whatever they hold (`null` where they are not a list).
pub fn requests_as_read(requests: Option<&Value>) -> Value {
    const READ: [&str; 3] = ["deviceClassName", "allocationMode", "count"];
    let Some(requests) = requests.and_then(Value::as_array) else { return Value::Null };
    let reduced = requests.iter().map(|request| {
        if let Some(exactly) = request.get("exactly") {
            serde_json::json!({"exactly": pick(exactly, &READ)})
        } else if let Some(options) = request.get("firstAvailable").and_then(Value::as_array) {
            serde_json::json!({"firstAvailable": options.iter().map(|o| pick(o, &READ)).collect::<Vec<_>>()})
        } else {
            pick(request, &READ)
        }
    });
    Value::Array(reduced.collect())
}

/// The fields `keys` of `object` (none when it is not an object).
fn pick(object: &Value, keys: &[&str]) -> Value {
    let kept = keys.iter().filter_map(|k| Some(((*k).to_string(), object.get(*k)?.clone())));
    Value::Object(kept.collect())
}

/// The mapped devices a claim spec (`{devices: {requests: [...]}}`) asks for.
pub fn claim_devices(claim_spec: Option<&Value>, classes: &DeviceClasses) -> ClassCounts {
    let mut counts = ClassCounts::new();
    let requests = claim_spec.and_then(|s| s.field(&["devices", "requests"])).and_then(Value::as_array);
    for request in requests.into_iter().flatten() {
        let chosen = if let Some(exactly) = request.get("exactly") {
            device_request(exactly, classes)
        } else if let Some(options) = request.get("firstAvailable").and_then(Value::as_array) {
            largest_option(options, classes)
        } else {
            // The pre-v1 shape (fields directly on the request).
            device_request(request, classes)
        };
        if let Some((class, n)) = chosen {
            let slot = counts.entry(class).or_default();
            *slot = slot.saturating_add(n);
        }
    }
    counts
}

/// One `exactly` (or `firstAvailable` option): its mapped class and device count.
fn device_request(request: &Value, classes: &DeviceClasses) -> Option<(String, u64)> {
    let class = request.get("deviceClassName").and_then(Value::as_str)?;
    classes.get(class)?;
    let n = match request.get("allocationMode").and_then(Value::as_str) {
        Some("All") => u64::from(classes.all_count()),
        // ExactCount (the default). The API server insists on a positive count; a count that is
        // not one still asks for at least a device.
        _ => request.get("count").map_or(1, |c| c.as_u64().or_else(|| c.as_f64().map(|f| f as u64)).unwrap_or(1)),
    };
    Some((class.to_string(), n.clamp(1, u64::from(u32::MAX))))
}

/// The option the scheduler could pick that counts for the most (exact weights compared).
fn largest_option(options: &[Value], classes: &DeviceClasses) -> Option<(String, u64)> {
    let weighed = |(class, n): &(String, u64)| {
        let w = classes.get(class).map_or((0, 1), |w| (w.numerator, w.denominator));
        (i128::from(*n).saturating_mul(w.0), w.1)
    };
    options.iter().filter_map(|o| device_request(o, classes)).fold(None, |best, option| match best {
        None => Some(option),
        Some(best) => {
            let (a, ad) = weighed(&option);
            let (b, bd) = weighed(&best);
            // a/ad > b/bd, without division.
            if a.saturating_mul(bd) > b.saturating_mul(ad) { Some(option) } else { Some(best) }
        }
    })
}

#[cfg(test)]
mod tests;
