//! The policy file format (`apiVersion: allot.dev/v1alpha1`), as serde types.
//!
//! Every struct denies unknown fields: a typo in a policy must fail loudly at load time, never
//! silently turn a check off. Field names are camelCase like Kubernetes objects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The only apiVersion this release reads.
pub const API_VERSION: &str = "allot.dev/v1alpha1";

/// What happens when a check or rule fails. Mirrors ValidatingAdmissionPolicy's actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, Default, PartialOrd, Ord)]
pub enum Action {
    /// Reject the request.
    #[default]
    Deny,
    /// Admit, and return a warning to the client (`kubectl` prints it).
    Warn,
    /// Admit, and record an audit annotation.
    Audit,
}

impl Action {
    /// Lower-case label for metrics and JSON output.
    pub fn label(self) -> &'static str {
        match self {
            Action::Deny => "deny",
            Action::Warn => "warn",
            Action::Audit => "audit",
        }
    }
}

/// A built-in check: off, or on with an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum CheckAction {
    Off,
    Deny,
    Warn,
    Audit,
}

impl CheckAction {
    /// The action when the check is on.
    pub fn action(self) -> Option<Action> {
        match self {
            CheckAction::Off => None,
            CheckAction::Deny => Some(Action::Deny),
            CheckAction::Warn => Some(Action::Warn),
            CheckAction::Audit => Some(Action::Audit),
        }
    }
}

/// `metadata` of a policy document.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// `kind: Cluster` — cluster-wide settings; at most one document.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default)]
    pub accelerators: AcceleratorsSpec,
    #[serde(default)]
    pub priority: ClusterPrioritySpec,
    /// Gang and queue managers this cluster runs. Their labels exempt a Pod from Allot's gates
    /// only when listed here (default: none, so a label alone changes nothing).
    #[serde(default)]
    pub external_schedulers: Vec<ExternalScheduler>,
    /// Identities trusted for what a tenant may not do.
    #[serde(default)]
    pub trust: TrustSpec,
}

/// A gang or queue manager besides Allot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
pub enum ExternalScheduler {
    /// Kueue: pods with its `kueue.x-k8s.io/admission` gate or `kueue.x-k8s.io/managed: "true"`.
    Kueue,
    /// Volcano: `schedulerName: volcano` or the `scheduling.k8s.io/group-name` annotation.
    Volcano,
    /// The scheduler-plugins coscheduling PodGroup: label `scheduling.x-k8s.io/pod-group`.
    Coscheduling,
}

/// Identities (AdmissionReview `userInfo.username`) trusted for what tenants may not do.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
}

impl Default for TrustSpec {
    fn default() -> Self {
        TrustSpec {
            daemon_set_controllers: default_daemon_set_controllers(),
            bound_pod_creators: default_daemon_set_controllers(),
        }
    }
}

fn default_daemon_set_controllers() -> Vec<String> {
    vec![
        "system:serviceaccount:kube-system:daemon-set-controller".to_string(),
        "system:kube-controller-manager".to_string(),
    ]
}

/// Which resource names are accelerators, and the built-in checks on them.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AcceleratorsSpec {
    /// Exact names and `prefix*` patterns. Omitted: the built-in list
    /// (`nvidia.com/gpu`, `nvidia.com/mig-*`, `amd.com/gpu`, …).
    pub resources: Option<Vec<String>>,
    #[serde(default)]
    pub checks: ChecksSpec,
    /// The most of any one accelerator resource a Pod (or one of its containers) may ask for,
    /// always enforced: a guard against absurd numbers (`nvidia.com/gpu: 1e18`). Default 1024.
    pub max_amount: Option<u32>,
}

/// The built-in accelerator checks. Each is off unless set.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
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

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AllowedResourcesCheck {
    /// Exact names and `prefix*` patterns.
    pub names: Vec<String>,
    #[serde(default)]
    pub action: Action,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MaxCheck {
    /// Resource name → whole-unit maximum.
    pub limits: BTreeMap<String, u32>,
    #[serde(default)]
    pub action: Action,
}

/// Cluster-wide priority settings.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterPrioritySpec {
    /// The cluster's `globalDefault: true` PriorityClass. The API server's Priority plugin fills
    /// it in before webhooks run, so Allot treats it as "the user asked for nothing".
    pub global_default: Option<String>,
    /// Default class for pods in namespaces that belong to no team.
    pub default: Option<String>,
}

/// `kind: Team` — who owns which namespaces, and their priority classes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamSpec {
    pub namespaces: NamespaceSelection,
    #[serde(default)]
    pub priority: TeamPrioritySpec,
    /// Accelerator quota; omitted: none.
    pub quota: Option<QuotaSpec>,
}

/// What a team may use at once, and what happens past it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaSpec {
    #[serde(default)]
    pub mode: QuotaMode,
    /// Resource name → amount (`nvidia.com/gpu: 8`).
    pub limits: BTreeMap<String, serde_json::Value>,
    /// Other resource names counted against a limited one, with a weight
    /// (`nvidia.com/mig-1g.10gb: {countsAs: nvidia.com/gpu, weight: 1/7}`).
    #[serde(default)]
    pub equivalents: BTreeMap<String, Equivalent>,
}

/// Deny at admission, or admit and queue behind the `allot.dev/quota` gate.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, Default, PartialEq, Eq)]
pub enum QuotaMode {
    #[default]
    Deny,
    Queue,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Equivalent {
    pub counts_as: String,
    /// `1/7`, `0.5`, `2`.
    pub weight: serde_json::Value,
}

/// Namespaces by name (globs such as `vision-*`) and/or by label selector; a namespace matches
/// when either matches.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamespaceSelection {
    #[serde(default)]
    pub names: Vec<String>,
    pub selector: Option<LabelSelector>,
}

/// A Kubernetes label selector.
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamPrioritySpec {
    /// Class given to the team's pods that ask for none.
    pub default: Option<String>,
    /// Classes the team may use; omitted: any.
    pub allowed: Option<Vec<String>>,
}

/// Which pods a Placement is for.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, Default, PartialEq, Eq)]
pub enum AppliesTo {
    /// Pods that request any of the Placement's accelerator resources.
    #[default]
    AcceleratorPods,
    /// Pods that request none (e.g. keep CPU pods off GPU nodes).
    OtherPods,
    /// Every pod.
    AllPods,
}

/// What to do when a pod already sets a nodeSelector key to another value.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, Default, PartialEq, Eq)]
pub enum OnConflict {
    /// Reject the pod, saying which key conflicts.
    #[default]
    Deny,
    /// Leave the user's value and report a warning.
    Keep,
}

/// `kind: Placement` — tolerations, nodeSelector and node affinity for matching pods.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlacementSpec {
    #[serde(default)]
    pub applies_to: AppliesTo,
    /// Accelerator names/prefixes this placement is about; omitted: the Cluster's set.
    pub resources: Option<Vec<String>>,
    #[serde(default, rename = "match")]
    pub scope: Scope,
    /// Optional CEL condition over `object` (the Pod).
    pub when: Option<String>,
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Required node-affinity expressions ANDed into every node selector term.
    #[serde(default)]
    pub node_affinity: Vec<NodeSelectorRequirement>,
    #[serde(default)]
    pub on_conflict: OnConflict,
}

/// Namespaces and teams a policy applies to; empty lists mean "all".
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scope {
    /// Namespace name globs.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Team names.
    #[serde(default)]
    pub teams: Vec<String>,
}

/// A Pod toleration.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub enum TolerationOperator {
    Exists,
    Equal,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// A node selector requirement (`key`, `operator`, `values`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    pub key: String,
    pub operator: NodeSelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
pub enum NodeSelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

/// What the gang controller does when a gang has not assembled in time.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, Default, PartialEq, Eq)]
pub enum OnTimeout {
    /// A Warning Event and condition on every member; the gang keeps waiting.
    #[default]
    Warn,
    /// Delete every member (their controllers recreate them; bare Pods are gone for good).
    Fail,
}

/// `kind: GangPolicy` — how gangs in some namespaces are found and waited for.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GangPolicySpec {
    #[serde(default, rename = "match")]
    pub scope: Scope,
    /// Owner kinds whose Pods form a gang without any label (opt-in).
    #[serde(default)]
    pub infer: Vec<crate::gang::membership::InferredKind>,
    /// Size of coscheduling pod groups (`scheduling.x-k8s.io/pod-group`).
    pub coscheduling_size: Option<u32>,
    /// How long members may take to all exist (e.g. `10m`).
    pub assembly_timeout: Option<String>,
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// After waiting this long without fitting, a gang stops later gangs from backfilling past
    /// it (e.g. `30m`; `0s` = strict order).
    pub starvation_timeout: Option<String>,
    /// The largest gang size a Pod may declare (`allot.dev/gang-size`, Kueue's total count) or
    /// an owner may imply. Default 1024.
    pub max_gang_size: Option<u32>,
}

/// Operations a Rule runs on.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
}

/// `kind: Rule` — a CEL validation.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleSpec {
    #[serde(default, rename = "match")]
    pub rule_match: RuleMatch,
    /// Must evaluate to `true` for the object to pass.
    pub expression: String,
    /// Shown when the expression is false.
    pub message: Option<String>,
    /// CEL producing the message; falls back to `message` if it fails.
    pub message_expression: Option<String>,
    #[serde(default)]
    pub action: Action,
}

/// What a Rule looks at.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleMatch {
    /// `Pod` means every Pod and every Pod template inside a workload (the rule sees each as a
    /// Pod). Any other kind (`Job`, `kubeflow.org/PyTorchJob`) means that object itself. `*`
    /// means every object.
    #[serde(default = "default_kinds")]
    pub kinds: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub teams: Vec<String>,
    #[serde(default = "default_operations")]
    pub operations: Vec<Operation>,
}

impl Default for RuleMatch {
    fn default() -> Self {
        RuleMatch {
            kinds: default_kinds(),
            namespaces: Vec::new(),
            teams: Vec::new(),
            operations: default_operations(),
        }
    }
}

fn default_kinds() -> Vec<String> {
    vec!["Pod".to_string()]
}

fn default_operations() -> Vec<Operation> {
    vec![Operation::Create, Operation::Update]
}
