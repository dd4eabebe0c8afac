//! The `kind: Cluster` document: which resources are accelerators and the built-in checks on
//! them, DRA device classes, external gang schedulers, whom to trust, cluster priorities.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Action, CheckAction};
use crate::model::policy::fields;

/// `kind: Cluster` — cluster-wide settings: which resources are accelerators, the built-in
/// checks on them, the cluster's priority classes and whom to trust. At most one Cluster
/// document per policy directory (the parser checks; the schema cannot).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Which resource names are accelerators, and the built-in checks on them.
    #[serde(default)]
    pub accelerators: AcceleratorsSpec,
    /// The cluster's default priority classes.
    #[serde(default)]
    pub priority: ClusterPrioritySpec,
    /// Gang and queue managers this cluster runs. Their labels exempt a Pod from Allot's gates
    /// only when listed here (default: none, so a label alone changes nothing).
    #[serde(default)]
    pub external_schedulers: Vec<ExternalScheduler>,
    /// The scheduler names (`spec.schedulerName`) under which the external schedulers place
    /// pods: a pod is theirs only when it names one, else its marker holds nothing.
    #[serde(default)]
    pub scheduler_names: SchedulerNamesSpec,
    /// Identities trusted for what a tenant may not do.
    #[serde(default)]
    pub trust: TrustSpec,
    /// Accelerators asked through Dynamic Resource Allocation (ResourceClaims and
    /// ResourceClaimTemplates): which DeviceClasses count as which accelerator resource.
    #[serde(default)]
    pub dra: DraSpec,
    /// Defaults of every Team's `preemption` (and what gangs in no team's namespace may do):
    /// whom a waiting gang may evict to make room, how long work runs before it may be evicted.
    #[serde(default)]
    pub preemption: crate::model::policy::preemption::PreemptionSpec,
}

/// How devices asked through DRA claims are counted. A claim's devices of a DeviceClass listed
/// here count as that many of its `countsAs` resource (times its weight) for placement, the
/// accelerator checks, team quotas and the CEL helpers; devices of other classes count nothing.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DraSpec {
    /// DeviceClass name → the accelerator it counts as
    /// (`gpu.nvidia.com: {countsAs: nvidia.com/gpu}`,
    /// `mig.nvidia.com: {countsAs: nvidia.com/gpu, weight: 1/7}`).
    #[serde(default)]
    pub device_classes: BTreeMap<String, DeviceClassMapping>,
    /// How many devices a request with `allocationMode: All` counts as (it takes every matching
    /// device, a number admission cannot know). Default 32, as the in-tree ResourceQuota counts.
    #[schemars(range(min = 1))]
    pub allocation_mode_all_count: Option<u32>,
    /// Also count the devices of every DeviceClass of the cluster whose
    /// `spec.extendedResourceName` is one of the accelerator resources, as one of that resource
    /// each (DRAExtendedResource: the class stands for `nvidia.com/gpu` and the like), unless
    /// `deviceClasses` maps the class itself. `allot serve` watches DeviceClasses; `allot check`
    /// reads those among its manifests. Default true.
    pub from_device_classes: Option<bool>,
}

/// What one device of a DeviceClass counts as.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceClassMapping {
    /// The accelerator resource one device counts as; must be one of the Cluster's
    /// accelerator names (the parser checks).
    #[schemars(length(min = 1))]
    pub counts_as: String,
    /// How much of `countsAs` one device counts for: a positive number or fraction (`1/7`,
    /// `0.5`, `2`; a fraction's denominator at most 1e9). Default 1.
    #[serde(default)]
    #[schemars(schema_with = "fields::optional_weight")]
    pub weight: Option<serde_json::Value>,
}

/// A gang or queue manager besides Allot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize, JsonSchema)]
pub enum ExternalScheduler {
    /// Kueue: pods created with its `kueue.x-k8s.io/admission` gate, which only Kueue's
    /// identities (`trust.kueueControllers`) may lift.
    Kueue,
    /// Volcano: pods Volcano's scheduler places (`schedulerNames.volcano`), which it queues.
    Volcano,
    /// The scheduler-plugins coscheduling PodGroup: label `scheduling.x-k8s.io/pod-group` on a
    /// pod a scheduler running the plugin places (`schedulerNames.coscheduling`).
    Coscheduling,
}

/// Which scheduler places the pods of Volcano and of the coscheduling plugin. A marker on a pod
/// another scheduler places holds nothing (the default scheduler ignores Volcano's group and,
/// without the plugin, the pod-group label): such a pod gets Allot's gates.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SchedulerNamesSpec {
    /// Volcano's scheduler names. Default `[volcano]`.
    #[serde(default = "default_volcano_schedulers")]
    pub volcano: Vec<String>,
    /// The schedulers running the coscheduling plugin. Default `[scheduler-plugins-scheduler]`
    /// (scheduler-plugins installed as a second scheduler); list `default-scheduler` only where
    /// the plugin runs in the default scheduler itself.
    #[serde(default = "default_coscheduling_schedulers")]
    pub coscheduling: Vec<String>,
}

impl Default for SchedulerNamesSpec {
    fn default() -> Self {
        SchedulerNamesSpec { volcano: default_volcano_schedulers(), coscheduling: default_coscheduling_schedulers() }
    }
}

fn default_volcano_schedulers() -> Vec<String> {
    vec!["volcano".to_string()]
}

fn default_coscheduling_schedulers() -> Vec<String> {
    vec!["scheduler-plugins-scheduler".to_string()]
}

/// Identities (AdmissionReview `userInfo.username`) trusted for what tenants may not do.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrustSpec {
    /// Whose Pods owned by a DaemonSet are never gated. Default: the DaemonSet controller's
    /// service account, and `system:kube-controller-manager` (controllers without
    /// `--use-service-account-credentials`).
    #[serde(default = "default_daemon_set_controllers")]
    pub daemon_set_controllers: Vec<String>,
    /// Who may create accelerator Pods with `spec.nodeName` set (they skip the scheduler and
    /// every gate). Default: the same identities as `daemonSetControllers`.
    #[serde(default = "default_daemon_set_controllers")]
    pub bound_pod_creators: Vec<String>,
    /// Where `externalSchedulers` lists Kueue: who may lift Kueue's `kueue.x-k8s.io/admission`
    /// gate (it keeps a pod out of Allot's gates) and add the tolerations of the flavor Kueue
    /// admitted the pod to. Default: Kueue's controller in its standard install.
    #[serde(default = "default_kueue_controllers")]
    pub kueue_controllers: Vec<String>,
}

impl Default for TrustSpec {
    fn default() -> Self {
        TrustSpec {
            daemon_set_controllers: default_daemon_set_controllers(),
            bound_pod_creators: default_daemon_set_controllers(),
            kueue_controllers: default_kueue_controllers(),
        }
    }
}

fn default_kueue_controllers() -> Vec<String> {
    vec!["system:serviceaccount:kueue-system:kueue-controller-manager".to_string()]
}

fn default_daemon_set_controllers() -> Vec<String> {
    vec![
        "system:serviceaccount:kube-system:daemon-set-controller".to_string(),
        "system:kube-controller-manager".to_string(),
    ]
}

/// Which resource names are accelerators, and the built-in checks on them.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AcceleratorsSpec {
    /// Exact names and `prefix*` patterns. Omitted: the built-in list
    /// (`nvidia.com/gpu`, `nvidia.com/mig-*`, `amd.com/gpu`, …).
    pub resources: Option<Vec<String>>,
    /// The built-in checks on accelerator requests (each `Off` unless set). They apply to Pods
    /// and to the Pod templates of workloads.
    #[serde(default)]
    pub checks: ChecksSpec,
    /// The most of any one accelerator resource a Pod (or one of its containers) may ask for,
    /// always enforced: a guard against absurd numbers (`nvidia.com/gpu: 1e18`). Default 1024.
    pub max_amount: Option<u32>,
}

/// The built-in accelerator checks. Each is off unless set.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChecksSpec {
    /// Every accelerator limit equals its request (and both are set).
    pub requests_equal_limits: Option<CheckAction>,
    /// Accelerator amounts are whole numbers (`1`, not `500m`).
    pub whole_numbers: Option<CheckAction>,
    /// No accelerators in (non-sidecar) init containers.
    pub init_containers: Option<CheckAction>,
    /// Only these accelerator names may be requested.
    pub allowed_resources: Option<AllowedResourcesCheck>,
    /// Per-container maximum per accelerator name.
    pub max_per_container: Option<MaxCheck>,
    /// Per-pod maximum (effective request) per accelerator name.
    pub max_per_pod: Option<MaxCheck>,
}

/// Only these accelerator names may be requested.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AllowedResourcesCheck {
    /// Exact names and `prefix*` patterns.
    pub names: Vec<String>,
    /// What happens to a pod asking for another accelerator.
    #[serde(default)]
    pub action: Action,
}

/// A maximum per accelerator name.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MaxCheck {
    /// Resource name → whole-unit maximum (`nvidia.com/gpu: 8`).
    pub limits: BTreeMap<String, u32>,
    /// What happens to a pod over a maximum.
    #[serde(default)]
    pub action: Action,
}

/// Cluster-wide priority settings.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterPrioritySpec {
    /// The cluster's `globalDefault: true` PriorityClass. The API server's Priority plugin fills
    /// it in before webhooks run, so Allot treats it as "the user asked for nothing".
    #[serde(default)]
    #[schemars(schema_with = "fields::priority_class")]
    pub global_default: Option<String>,
    /// Default class for pods in namespaces that belong to no team.
    #[serde(default)]
    #[schemars(schema_with = "fields::priority_class")]
    pub default: Option<String>,
}
