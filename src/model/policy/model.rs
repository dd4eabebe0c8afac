//! The policy file format (`apiVersion: allot.dev/v1alpha1`), as serde types.
//!
//! Every struct denies unknown fields: a typo in a policy must fail loudly at load time, never
//! silently turn a check off. Field names are camelCase like Kubernetes objects.
//!
//! The same types give `allot schema` its JSON Schema (schemars reads the serde attributes), so
//! the doc comments here are what an editor shows on hover: write them for policy authors.
//! Where the parser checks more than a type says (CEL, globs, quantities, durations), the
//! `#[schemars(...)]` attributes add what JSON Schema can express ([`super::fields`]) and the
//! doc comment says the rest.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::fields;

mod cluster;
pub use cluster::{
    AcceleratorsSpec, AllowedResourcesCheck, ChecksSpec, ClusterPrioritySpec, ClusterSpec, DeviceClassMapping, DraSpec,
    ExternalScheduler, MaxCheck, SchedulerNamesSpec, TrustSpec,
};

/// The only apiVersion this release reads.
pub const API_VERSION: &str = "allot.dev/v1alpha1";

/// What happens when a check or rule fails. Mirrors ValidatingAdmissionPolicy's actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema, Default, PartialOrd, Ord)]
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

/// A built-in check: `Off`, or on with the action taken when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum CheckAction {
    /// The check does not run.
    Off,
    /// Reject the request.
    Deny,
    /// Admit, and return a warning to the client (`kubectl` prints it).
    Warn,
    /// Admit, and record an audit annotation.
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
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The policy's name, unique among the documents of its kind; findings and metrics name it.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Free-form labels (Allot does not read them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Free-form annotations (Allot does not read them).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// `kind: Team` — who owns which namespaces, their priority classes and their accelerator
/// quota. A namespace belongs to the first team (in file order) whose names or selector match.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamSpec {
    /// The team's namespaces.
    pub namespaces: NamespaceSelection,
    /// The team's default and allowed priority classes.
    #[serde(default)]
    pub priority: TeamPrioritySpec,
    /// Accelerator quota; omitted: none.
    pub quota: Option<QuotaSpec>,
    /// Whom the team's waiting gangs may evict to make room, and how long the team's own work
    /// runs before anyone may evict it (each field defaults to the Cluster's).
    #[serde(default)]
    pub preemption: super::preemption::PreemptionSpec,
}

/// What a team may use at once, and what happens past it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaSpec {
    /// What happens to a pod that would take the team past a limit.
    #[serde(default)]
    pub mode: QuotaMode,
    /// Resource name → amount (`nvidia.com/gpu: 8`): the most the team's non-terminal pods
    /// may request at once. At least one.
    #[schemars(schema_with = "fields::quota_limits")]
    pub limits: BTreeMap<String, serde_json::Value>,
    /// Other resource names counted against a limited one, with a weight
    /// (`nvidia.com/mig-1g.10gb: {countsAs: nvidia.com/gpu, weight: 1/7}`).
    #[serde(default)]
    pub equivalents: BTreeMap<String, Equivalent>,
    /// The cohort the team lends its unused quota to and borrows from: its `limits` are then
    /// its nominal (guaranteed) quota. Omitted: no borrowing, `limits` is a hard cap.
    #[serde(default)]
    pub cohort: Option<String>,
    /// Resource name → the most the team may use beyond its nominal quota, from the cohort's
    /// unused quota (only with `cohort`). A resource not named here may borrow without bound
    /// other than the cohort's.
    #[serde(default)]
    #[schemars(schema_with = "fields::optional_quota_limits")]
    pub borrowing_limit: BTreeMap<String, serde_json::Value>,
    /// Resource name → the most of the team's unused nominal quota other teams may borrow (only
    /// with `cohort`); the rest is kept for the team. A resource not named here lends it all.
    #[serde(default)]
    #[schemars(schema_with = "fields::optional_quota_limits")]
    pub lending_limit: BTreeMap<String, serde_json::Value>,
    /// The team's fair-share weight in its cohort (default 1): when several teams wait to
    /// borrow, the one whose borrowed share divided by its weight is smallest goes first.
    #[serde(default)]
    #[schemars(schema_with = "fields::optional_weight")]
    pub weight: Option<serde_json::Value>,
}

/// Deny at admission, or admit and queue behind the `allot.dev/quota` gate.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
pub enum QuotaMode {
    /// Reject the pod at admission, saying the team's usage.
    #[default]
    Deny,
    /// Admit the pod and hold it behind the `allot.dev/quota` scheduling gate until the team
    /// has room (a gang is charged as a whole).
    Queue,
}

/// A resource counted against a limited one.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Equivalent {
    /// The limited resource it counts as; must be a key of `limits`.
    pub counts_as: String,
    /// How much of `countsAs` one unit counts for: a positive number or fraction (`1/7`,
    /// `0.5`, `2`; a fraction's denominator at most 1e9).
    #[schemars(schema_with = "fields::weight")]
    pub weight: serde_json::Value,
}

/// Namespaces by name (globs such as `vision-*`) and/or by label selector; a namespace matches
/// when either matches. Give names, a selector, or both.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("anyOf" = [
    {"required": ["names"], "properties": {"names": {"minItems": 1}}},
    {"required": ["selector"], "properties": {"selector": {"type": "object"}}},
]))]
pub struct NamespaceSelection {
    /// Namespace name globs (`vision`, `vision-*`; the parser checks the glob syntax).
    #[serde(default)]
    pub names: Vec<String>,
    /// Namespaces whose labels match (the server watches Namespaces; `allot check` reads them
    /// from `--namespaces FILE`).
    pub selector: Option<LabelSelector>,
}

/// A Kubernetes label selector: every `matchLabels` entry and every `matchExpressions`
/// requirement must hold.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelector {
    /// Label → value, all required.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on labels, all required.
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// A requirement on one label: `In`/`NotIn` take values, `Exists`/`DoesNotExist` take none.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("if" = {"properties": {"operator": {"enum": ["In", "NotIn"]}}},
    "then" = {"required": ["values"], "properties": {"values": {"minItems": 1}}},
    "else" = {"properties": {"values": {"maxItems": 0}}}))]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the label's value is compared with `values`.
    pub operator: SelectorOperator,
    /// The values for `In` and `NotIn` (at least one); empty for `Exists` and `DoesNotExist`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// A label selector operator.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum SelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// A team's priority classes.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamPrioritySpec {
    /// Class given to the team's pods that ask for none; must be in `allowed` when that is
    /// set (the parser checks).
    #[serde(default)]
    #[schemars(schema_with = "fields::priority_class")]
    pub default: Option<String>,
    /// Classes the team may use; omitted: any.
    #[serde(default)]
    #[schemars(schema_with = "fields::priority_classes")]
    pub allowed: Option<Vec<String>>,
}

/// Which pods a Placement is for.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
pub enum OnConflict {
    /// Reject the pod, saying which key conflicts.
    #[default]
    Deny,
    /// Leave the user's value and report a warning.
    Keep,
}

/// `kind: Placement` — tolerations, nodeSelector and node affinity added to matching pods (at
/// least one of the three). The parser also checks their keys and values as the API server
/// would.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("anyOf" = [
    {"required": ["tolerations"], "properties": {"tolerations": {"minItems": 1}}},
    {"required": ["nodeSelector"], "properties": {"nodeSelector": {"minProperties": 1}}},
    {"required": ["nodeAffinity"], "properties": {"nodeAffinity": {"minItems": 1}}},
]))]
pub struct PlacementSpec {
    /// Which pods get this placement.
    #[serde(default)]
    pub applies_to: AppliesTo,
    /// Accelerator names/prefixes this placement is about; omitted: the Cluster's set.
    pub resources: Option<Vec<String>>,
    /// Namespaces and teams it applies to (empty: all).
    #[serde(default, rename = "match")]
    pub scope: Scope,
    /// Optional CEL condition over `object` (the Pod); the placement applies only when it is
    /// true. The parser compiles it and refuses bad CEL.
    pub when: Option<String>,
    /// Tolerations added to the pod (never duplicated).
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// Node labels the pod must run on (`node-type: my-precious`).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Required node-affinity expressions ANDed into every node selector term.
    #[serde(default)]
    pub node_affinity: Vec<NodeSelectorRequirement>,
    /// What to do when the pod already sets one of `nodeSelector`'s keys to another value.
    #[serde(default)]
    pub on_conflict: OnConflict,
    /// What happens to a pod this placement does not apply to that tolerates the taints its
    /// `tolerations` are for (a toleration without a key tolerates every taint): `Deny` keeps
    /// CPU pods, and pods the placement's `match` leaves out, off the nodes those taints guard.
    /// Pods in namespaces of no team (device plugins, node agents) are never checked.
    /// Omitted: `Off`.
    pub reserve_tolerations: Option<CheckAction>,
}

/// Namespaces and teams a policy applies to; empty lists mean "all".
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scope {
    /// Namespace name globs (`ml-*`); empty: every namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Names of Teams defined in the policies (the parser checks they exist); empty: any.
    #[serde(default)]
    pub teams: Vec<String>,
}

/// A Pod toleration, checked as the API server checks one: without a key the operator must be
/// `Exists`; `Exists` takes no value; `tolerationSeconds` needs effect `NoExecute`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("allOf" = [
    {"if": {"properties": {"key": {"enum": ["", null]}}},
     "then": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}}},
    {"if": {"required": ["operator"], "properties": {"operator": {"const": "Exists"}}},
     "then": {"properties": {"value": {"enum": ["", null]}}}},
    {"if": {"required": ["tolerationSeconds"], "properties": {"tolerationSeconds": {"type": "integer"}}},
     "then": {"required": ["effect"], "properties": {"effect": {"const": "NoExecute"}}}},
]))]
pub struct Toleration {
    /// The taint key (a label key); omitted with operator `Exists`: every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperator>,
    /// The taint value for `Equal` (a label value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The taint effect tolerated; omitted: every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
    /// How long a `NoExecute` taint is tolerated, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// How a toleration matches a taint's value.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TolerationOperator {
    /// Any value.
    Exists,
    /// The value given.
    Equal,
}

/// A taint effect.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum TaintEffect {
    /// New pods that do not tolerate the taint are not scheduled there.
    NoSchedule,
    /// The scheduler avoids the node for pods that do not tolerate the taint.
    PreferNoSchedule,
    /// Pods that do not tolerate the taint are evicted too.
    NoExecute,
}

/// A node selector requirement (`key`, `operator`, `values`): `In`/`NotIn` take values,
/// `Exists`/`DoesNotExist` none, `Gt`/`Lt` exactly one integer.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("allOf" = [
    {"if": {"properties": {"operator": {"enum": ["In", "NotIn"]}}},
     "then": {"required": ["values"], "properties": {"values": {"minItems": 1}}}},
    {"if": {"properties": {"operator": {"enum": ["Exists", "DoesNotExist"]}}},
     "then": {"properties": {"values": {"maxItems": 0}}}},
    {"if": {"properties": {"operator": {"enum": ["Gt", "Lt"]}}},
     "then": {"required": ["values"],
              "properties": {"values": {"minItems": 1, "maxItems": 1, "items": {"pattern": "^[0-9]+$", "patternErrorMessage": "an integer"}}}}},
]))]
pub struct NodeSelectorRequirement {
    /// The node label key.
    pub key: String,
    /// How the node label's value is compared with `values`.
    pub operator: NodeSelectorOperator,
    /// Label values (`In`, `NotIn`), one integer (`Gt`, `Lt`), or none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A node selector operator.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum NodeSelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's value, an integer, is greater than the one value.
    Gt,
    /// The label's value, an integer, is less than the one value.
    Lt,
}

/// What the gang controller does when a gang has not assembled in time.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
pub enum OnTimeout {
    /// A Warning Event and condition on every member; the gang keeps waiting.
    #[default]
    Warn,
    /// Delete every member (their controllers recreate them; bare Pods are gone for good).
    Fail,
}

/// What the gang controller does when a gang it released has not started in time: some member
/// it released is still not bound `startTimeout` after its release.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
pub enum OnStartTimeout {
    /// Delete every present member, bound ones too (their controllers recreate the gang; bare
    /// Pods are gone for good), after a Warning Event on each. The default: the capacity the
    /// gang was released onto stays reserved for it until its members are gone, so no other
    /// gang is ever released onto GPUs a late member of it may still take.
    #[default]
    Fail,
    /// A Warning Event and condition on the members, which stay; the gang's reservation ends,
    /// so another gang may be released onto the capacity its unbound members would take, and
    /// both may end up partly placed if they bind later.
    Warn,
}

/// `kind: GangPolicy` — how gangs in some namespaces are found and waited for. The first
/// GangPolicy whose `match` fits a pod's namespace and team applies; without one, the defaults.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GangPolicySpec {
    /// Namespaces and teams it applies to (empty: all).
    #[serde(default, rename = "match")]
    pub scope: Scope,
    /// Owner kinds whose Pods form a gang without any label (opt-in).
    #[serde(default)]
    pub infer: Vec<crate::model::gang::membership::InferredKind>,
    /// Size of coscheduling pod groups (`scheduling.x-k8s.io/pod-group`), which carry no size
    /// on the Pods.
    #[schemars(range(min = 1))]
    pub coscheduling_size: Option<u32>,
    /// How long members may take to all exist (`10m`, `1h 30m`; default `10m`).
    #[serde(default)]
    #[schemars(schema_with = "fields::duration")]
    pub assembly_timeout: Option<String>,
    /// What happens when the gang has not assembled within `assemblyTimeout`.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// How long a member Allot released may stay unbound (`10m`, the default): until then the
    /// capacity the gang was released onto stays reserved for it; then the gang has failed to
    /// start and `onStartTimeout` applies. Longer than the scheduler's own waits before a bind
    /// (unschedulable pods are retried at least every 5 minutes, preemption victims take their
    /// grace period to leave).
    #[serde(default)]
    #[schemars(schema_with = "fields::duration")]
    pub start_timeout: Option<String>,
    /// What happens when a released member is not bound within `startTimeout` (default `Fail`:
    /// every member is deleted).
    #[serde(default)]
    pub on_start_timeout: OnStartTimeout,
    /// After waiting this long without fitting, a gang stops later gangs from backfilling past
    /// it (`30m`, the default; `0s` = strict order).
    #[serde(default)]
    #[schemars(schema_with = "fields::duration")]
    pub starvation_timeout: Option<String>,
    /// The largest gang size a Pod may declare (`allot.dev/gang-size`, Kueue's total count) or
    /// an owner may imply. Default 1024.
    #[schemars(range(min = 1))]
    pub max_gang_size: Option<u32>,
    /// Hand the gangs this policy infers (`infer`) to Kubernetes' own gang scheduling where the
    /// cluster serves native PodGroups (`scheduling.k8s.io/v1alpha2`, alpha in 1.36): their Pods
    /// get `spec.schedulingGroup` instead of Allot's gate, and Allot's leader creates the
    /// Workload and PodGroup (`minCount` from the owner, owned by it). Elsewhere, and for gangs
    /// named by labels, Allot gates and releases them itself. Default false.
    #[serde(default)]
    pub native_scheduling: bool,
    /// Node-label levels a gang is released only inside one domain of (a rack, an NVLink
    /// domain), and pinned there: `required` (a gang never leaves it) and/or `preferred`
    /// (innermost first, falling back outward). Members may ask for a tighter one of these
    /// levels with the annotation `allot.dev/topology`, never a looser one.
    pub topology: Option<super::topology::TopologySpec>,
    /// What happens to a released gang when a disruption (the scheduler's preemption, an
    /// eviction, a taint) takes one of its members: `Gang` (default) deletes the others too,
    /// so that it re-assembles and starts whole; `Pod` leaves them running.
    #[serde(default)]
    pub disruption: Disruption,
}

/// `GangPolicy.spec.disruption`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Disruption {
    /// A gang is disrupted whole: the other members of one that lost a member are deleted.
    #[default]
    Gang,
    /// Members are disrupted one by one; the others keep running.
    Pod,
}

/// Operations a Rule runs on.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    /// The object is being created.
    Create,
    /// The object is being updated (`oldObject` is set).
    Update,
}

/// `kind: Rule` — a validation written in CEL, with the actions of ValidatingAdmissionPolicy.
/// Needs `message` or `messageExpression`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("anyOf" = [
    {"required": ["message"], "properties": {"message": {"type": "string"}}},
    {"required": ["messageExpression"], "properties": {"messageExpression": {"type": "string"}}},
]))]
pub struct RuleSpec {
    /// Which objects, namespaces, teams and operations the rule sees.
    #[serde(default, rename = "match")]
    pub rule_match: RuleMatch,
    /// CEL that must evaluate to `true` for the object to pass. Variables: `object` (the Pod,
    /// or each Pod template seen as a Pod), `oldObject`, `workload`, `namespace`, `team`,
    /// `request`; helpers `accelerators(x)`, `acceleratorRequests(x)`,
    /// `acceleratorLimits(container)`. The parser compiles it and refuses bad CEL.
    pub expression: String,
    /// Shown when the expression is false.
    pub message: Option<String>,
    /// CEL producing the message (a string); falls back to `message` if it fails. The parser
    /// compiles it.
    pub message_expression: Option<String>,
    /// What happens when the expression is false.
    #[serde(default)]
    pub action: Action,
}

/// What a Rule looks at.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleMatch {
    /// `Pod` means every Pod and every Pod template inside a workload (the rule sees each as a
    /// Pod). Any other kind (`Job`, `kubeflow.org/PyTorchJob`) means that object itself. `*`
    /// means every object. At least one.
    #[serde(default = "default_kinds")]
    #[schemars(length(min = 1))]
    pub kinds: Vec<String>,
    /// Namespace name globs (`ml-*`); empty: every namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Names of Teams defined in the policies (the parser checks they exist); empty: any.
    #[serde(default)]
    pub teams: Vec<String>,
    /// The operations it runs on.
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
