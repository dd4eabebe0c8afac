//! `allot compile`: the stateless half of a policy set as the API server's own admission
//! policies — MutatingAdmissionPolicies (placements' tolerations and nodeSelector, the team's
//! default priority class) and ValidatingAdmissionPolicies (accelerator checks, placement
//! conflicts, team priority classes, CEL Rules), all `admissionregistration.k8s.io/v1`, which
//! the 1.36 API server serves without a feature gate. They keep holding while the webhook is
//! down, and cost no network hop.
//!
//! A pure function of a compiled [`PolicySet`]: objects plus a per-policy [`Coverage`] saying
//! what was compiled and what stays webhook-only, and why (quota and gangs need cluster state;
//! Allot's CEL helpers have no Kubernetes CEL form yet; …).
//!
//! Shape of what is emitted:
//! - the team of the namespace under review is a CEL expression over `request.namespace` and
//!   `namespaceObject`'s labels (the Teams' globs and selectors, first match wins), bound as
//!   `variables.team`, so team-dependent rules need neither params nor one binding per team;
//! - a Pod-template check is one policy per template shape (Pods; `spec.template` kinds;
//!   JobSet; …) whose `variables.allotPods` lists the Pods the object describes, from the same
//!   table the engine walks (`workload::WORKLOAD_KINDS`);
//! - mutations are JSON Patches with CEL guards that add only what is missing, so
//!   `reinvocationPolicy: IfNeeded` never adds a toleration twice (an apply configuration
//!   would replace the atomic `tolerations` list).

pub mod cel;
mod mutating;
mod unsupported;
mod validating;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, NamedRuleWithOperations,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};

use crate::model::policy::PolicySet;
use crate::model::workload::WORKLOAD_KINDS;

/// Why the compiled objects could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("cannot render {0}: {1}")]
    Render(String, String),
}

/// One emitted object.
#[derive(Debug, Clone)]
pub enum NativeObject {
    MutatingPolicy(MutatingAdmissionPolicy),
    MutatingBinding(MutatingAdmissionPolicyBinding),
    ValidatingPolicy(ValidatingAdmissionPolicy),
    ValidatingBinding(ValidatingAdmissionPolicyBinding),
}

impl NativeObject {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        let meta = match self {
            NativeObject::MutatingPolicy(o) => &o.metadata,
            NativeObject::MutatingBinding(o) => &o.metadata,
            NativeObject::ValidatingPolicy(o) => &o.metadata,
            NativeObject::ValidatingBinding(o) => &o.metadata,
        };
        meta.name.as_deref().unwrap_or("")
    }

    /// The object as JSON, `apiVersion` and `kind` included.
    pub fn to_json(&self) -> Result<serde_json::Value, CompileError> {
        let value = match self {
            NativeObject::MutatingPolicy(o) => serde_json::to_value(o),
            NativeObject::MutatingBinding(o) => serde_json::to_value(o),
            NativeObject::ValidatingPolicy(o) => serde_json::to_value(o),
            NativeObject::ValidatingBinding(o) => serde_json::to_value(o),
        };
        value.map_err(|e| CompileError::Render(self.name().to_string(), e.to_string()))
    }

    /// Every CEL expression in the object, with where it is (for tests and reports).
    pub fn expressions(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut push_common = |conditions: &Option<Vec<MatchCondition>>, variables: &Option<Vec<Variable>>| {
            for c in conditions.iter().flatten() {
                out.push((format!("matchConditions[{}]", c.name), c.expression.clone()));
            }
            for v in variables.iter().flatten() {
                out.push((format!("variables[{}]", v.name), v.expression.clone()));
            }
        };
        match self {
            NativeObject::MutatingPolicy(o) => {
                let Some(spec) = &o.spec else { return out };
                push_common(&spec.match_conditions, &spec.variables);
                for (i, m) in spec.mutations.iter().flatten().enumerate() {
                    if let Some(e) = m.json_patch.as_ref().and_then(|p| p.expression.clone()) {
                        out.push((format!("mutations[{i}]"), e));
                    }
                }
            }
            NativeObject::ValidatingPolicy(o) => {
                let Some(spec) = &o.spec else { return out };
                push_common(&spec.match_conditions, &spec.variables);
                for (i, v) in spec.validations.iter().flatten().enumerate() {
                    out.push((format!("validations[{i}].expression"), v.expression.clone()));
                    if let Some(m) = &v.message_expression {
                        out.push((format!("validations[{i}].messageExpression"), m.clone()));
                    }
                }
            }
            _ => {}
        }
        out
    }
}

/// What became of one policy document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    pub policy: Subject,
    /// What the native policies do (one line each).
    pub compiled: Vec<Line>,
    /// What only the webhook does, each with the reason.
    pub webhook_only: Vec<Line>,
}

/// The policy (or the part of the Cluster policy) a [`Coverage`] is about. Printed as in the
/// report: `Placement/nvidia-gpu`, `Rule/pinned-images-on-gpus`, `Cluster/accelerators.checks`…
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    AcceleratorChecks,
    Dra,
    DefaultPriority,
    TeamPriorityClasses,
    Team(String),
    Placement(String),
    Rule(String),
    GangPolicy(String),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::AcceleratorChecks => f.write_str("Cluster/accelerators.checks"),
            Subject::Dra => f.write_str("Cluster/dra"),
            Subject::DefaultPriority => f.write_str("default priority class"),
            Subject::TeamPriorityClasses => f.write_str("Team priority classes"),
            Subject::Team(name) => write!(f, "Team/{name}"),
            Subject::Placement(name) => write!(f, "Placement/{name}"),
            Subject::Rule(name) => write!(f, "Rule/{name}"),
            Subject::GangPolicy(name) => write!(f, "GangPolicy/{name}"),
        }
    }
}

/// One line of the report: the text people read, and what it is about for the code that acts
/// on it (`--native-covers` decides from [`Part`], never from the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub part: Part,
    pub text: String,
}

/// What a report line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// An accelerator check. Compiled: it holds on Pods and every template source; webhook-only:
    /// this check alone stays in the webhook.
    Check(crate::admission::finding::Check),
    /// A Placement's toleration, nodeSelector pair, nodeSelector conflict check, nodeAffinity.
    Toleration,
    NodeSelector,
    SelectorConflicts,
    NodeAffinity,
    /// A Placement's `reserveTolerations`: always the webhook's (it judges other pods against
    /// every Placement, and a node's taints), without taking the placement itself from the
    /// native policies.
    ReserveTolerations,
    /// The policy as a whole: a compiled line that stands alone (a Rule, a default), or a
    /// webhook-only reason that keeps the whole policy in the webhook.
    Whole,
}

impl Line {
    pub fn new(part: Part, text: impl Into<String>) -> Line {
        Line { part, text: text.into() }
    }

    /// A line about the policy as a whole ([`Part::Whole`]).
    pub fn whole(text: impl Into<String>) -> Line {
        Line::new(Part::Whole, text)
    }
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Coverage {
    fn new(policy: Subject) -> Coverage {
        Coverage { policy, compiled: Vec::new(), webhook_only: Vec::new() }
    }

    /// `compiled`, `partly compiled` or `webhook-only`.
    pub fn status(&self) -> &'static str {
        match (self.compiled.is_empty(), self.webhook_only.is_empty()) {
            (false, true) => "compiled",
            (false, false) => "partly compiled",
            (true, _) => "webhook-only",
        }
    }
}

/// The native policies and the report.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub objects: Vec<NativeObject>,
    pub coverage: Vec<Coverage>,
}

impl Compiled {
    /// True when nothing stays webhook-only (`--strict`).
    pub fn fully_native(&self) -> bool {
        self.coverage.iter().all(|c| c.webhook_only.is_empty())
    }

    /// Every object as one multi-document YAML stream, in apply order (each policy before its
    /// binding).
    pub fn to_yaml(&self) -> Result<String, CompileError> {
        self.render(None)
    }

    /// [`Compiled::to_yaml`], every object annotated [`COMPILED_FROM_ANNOTATION`]`: fingerprint`
    /// (what `allot compile` writes).
    pub fn to_yaml_from(&self, fingerprint: &str) -> Result<String, CompileError> {
        self.render(Some(fingerprint))
    }

    fn render(&self, fingerprint: Option<&str>) -> Result<String, CompileError> {
        let mut out = String::new();
        for (i, object) in self.objects.iter().enumerate() {
            let mut json = object.to_json()?;
            if let Some(fingerprint) = fingerprint
                && let Some(metadata) = json.get_mut("metadata").and_then(serde_json::Value::as_object_mut)
            {
                let annotations = metadata.entry("annotations").or_insert_with(|| serde_json::json!({}));
                if let Some(annotations) = annotations.as_object_mut() {
                    annotations.insert(COMPILED_FROM_ANNOTATION.into(), fingerprint.into());
                }
            }
            let yaml = serde_saphyr::to_string(&json)
                .map_err(|e| CompileError::Render(object.name().to_string(), e.to_string()))?;
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&yaml);
        }
        Ok(out)
    }

    /// The report, one block per policy.
    pub fn report_text(&self) -> String {
        let mut out = String::new();
        for c in &self.coverage {
            let _ = writeln!(out, "{}: {}", c.policy, c.status());
            for line in &c.compiled {
                let _ = writeln!(out, "    native   {line}");
            }
            for line in &c.webhook_only {
                let _ = writeln!(out, "    webhook  {line}");
            }
        }
        let objects = self.objects.len();
        let left = self.coverage.iter().filter(|c| !c.webhook_only.is_empty()).count();
        let _ =
            writeln!(out, "{objects} object(s); {left} of {} policies keep a webhook-only part", self.coverage.len());
        out
    }
}

/// The annotation `allot compile` puts on every object it emits: the fingerprint of the policy
/// set's native objects (the one `--native-covers` puts in webhook paths, of the objects
/// compiled for the default identity), so `allot test --server` can tell an install of these
/// policies from a stale one or another set's.
pub const COMPILED_FROM_ANNOTATION: &str = "allot.dev/compiled-from";

/// What no policy document turns on and only the webhook does, whatever the policies.
pub const ALWAYS_WEBHOOK: &str = "always in the webhook: the gang gate of Pods labelled as gang members, and the tenant \
     guards on Allot's gates, reserved labels and nodeName (they need cluster state and the requester's trust), \
     and the per-Pod accelerators.maxAmount bound (the scheduler's effective-request sum)";

/// Compiles what can run natively.
pub fn compile(policies: &PolicySet) -> Compiled {
    compile_for(policies, crate::admission::tenant::DEFAULT_ALLOT_USERNAME)
}

/// [`compile`], the policies skipping `allot_username` as the webhooks skip Allot's own service
/// account: the engine allows Allot's gate lifts and its reserved keys whatever the Rules say,
/// so a Deny Rule on UPDATE must not refuse the gang controller a gate lift natively either.
pub fn compile_for(policies: &PolicySet, allot_username: &str) -> Compiled {
    let mut out = compile_objects(policies);
    let skip_allot = condition(
        "not-allot-itself",
        format!("request.userInfo.username != {}", crate::admission::tenant::username_cel(allot_username, '"')),
    );
    for object in &mut out.objects {
        let conditions = match object {
            NativeObject::MutatingPolicy(o) => o.spec.as_mut().map(|s| &mut s.match_conditions),
            NativeObject::ValidatingPolicy(o) => o.spec.as_mut().map(|s| &mut s.match_conditions),
            NativeObject::MutatingBinding(_) | NativeObject::ValidatingBinding(_) => None,
        };
        if let Some(conditions) = conditions {
            conditions.get_or_insert_with(Vec::new).push(skip_allot.clone());
        }
    }
    out
}

fn compile_objects(policies: &PolicySet) -> Compiled {
    let mut out = Compiled { objects: Vec::new(), coverage: Vec::new() };
    let team_cel = cel::team(policies);
    let team = team_cel.as_deref();
    validating::accelerator_checks(policies, &mut out);
    mutating::default_priority(policies, team, &mut out);
    validating::team_priority_classes(policies, team, &mut out);
    for placement in &policies.placements {
        mutating::placement(policies, placement, team, &mut out);
    }
    for rule in &policies.rules {
        validating::rule(policies, rule, team, &mut out);
    }
    for team_policy in &policies.teams {
        if let Some(quota) = &team_policy.quota {
            let mut c = Coverage::new(Subject::Team(team_policy.name.clone()));
            let mode = match quota.mode {
                crate::model::policy::QuotaMode::Deny => "deny",
                crate::model::policy::QuotaMode::Queue => "queue",
            };
            c.webhook_only.push(Line::whole(format!("quota ({mode}): counts the team's running Pods, cluster state")));
            out.coverage.push(c);
        }
    }
    if !policies.device_classes.is_empty() {
        let mut c = Coverage::new(Subject::Dra);
        c.webhook_only.push(Line::whole(DRA_WEBHOOK_ONLY));
        out.coverage.push(c);
    }
    for gang_policy in &policies.gang_policies {
        let mut c = Coverage::new(Subject::GangPolicy(gang_policy.name.clone()));
        c.webhook_only
            .push(Line::whole("gangs: the gate is lifted by the gang controller, sizes checked against the members"));
        out.coverage.push(c);
    }
    out
}

/// Why claim-based accelerators stay with the webhook: a ValidatingAdmissionPolicy sees only
/// the object under review, and a Pod's devices are in the ResourceClaims and templates it
/// names. The compiled placements and counts see a claim Pod as asking nothing.
pub const DRA_WEBHOOK_ONLY: &str = "DRA claims: a Pod or template naming resourceClaims is placed, counted and checked \
     by the webhook in full (native policies cannot read ResourceClaims or their templates)";

/// A DNS-subdomain object name from an Allot policy name (what `allot test --server` reads a
/// Rule's name back from).
pub fn object_name(parts: &[&str]) -> String {
    let joined = parts.iter().filter(|p| !p.is_empty()).copied().collect::<Vec<_>>().join("-").to_ascii_lowercase();
    let cleaned: String =
        joined.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' }).collect();
    let trimmed = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    trimmed.chars().take(253).collect()
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from([
            ("app.kubernetes.io/name".to_string(), "allot".to_string()),
            ("app.kubernetes.io/component".to_string(), "native-policy".to_string()),
        ])),
        ..Default::default()
    }
}

/// The namespaces Allot leaves alone (as `allot webhooks` does with its defaults).
fn namespace_selector() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "NotIn".into(),
            values: Some(vec!["kube-system".into(), "allot-system".into()]),
        }]),
        match_labels: None,
    }
}

fn match_resources(rules: Vec<NamedRuleWithOperations>) -> MatchResources {
    MatchResources {
        namespace_selector: Some(namespace_selector()),
        resource_rules: Some(rules),
        match_policy: Some("Equivalent".into()),
        ..Default::default()
    }
}

fn resource_rule(group: &str, resources: Vec<String>, operations: &[&str]) -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        api_groups: Some(vec![group.to_string()]),
        api_versions: Some(vec!["*".into()]),
        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
        resources: Some(resources),
        scope: Some("Namespaced".into()),
        resource_names: None,
    }
}

/// The kubelet's mirror pods are skipped, as by the webhooks.
fn not_kubelet() -> MatchCondition {
    MatchCondition {
        name: "not-kubelet".into(),
        expression: "!request.userInfo.username.startsWith('system:node:')".into(),
    }
}

/// Splits off the conditions that read `namespaceObject`, joined into one guard. The API
/// server gives matchConditions only `object`, `oldObject`, `request`, `authorizer` and
/// `params`: a condition reading the namespace's labels there sees nothing, so a team chosen by
/// label never matched (found on kube-apiserver 1.36.2: a Job in a namespace labelled
/// `team=nlp` was admitted with a class its team may not use). Such a guard goes into the
/// body instead, where `namespaceObject` is bound.
fn namespace_guard(conditions: Vec<MatchCondition>) -> (Vec<MatchCondition>, Option<String>) {
    let (reading, plain): (Vec<_>, Vec<_>) =
        conditions.into_iter().partition(|c| c.expression.contains("namespaceObject"));
    let guard = (!reading.is_empty())
        .then(|| reading.iter().map(|c| format!("({})", c.expression)).collect::<Vec<_>>().join(" && "));
    (plain, guard)
}

fn condition(name: &str, expression: String) -> MatchCondition {
    MatchCondition { name: name.into(), expression }
}

fn variable(name: &str, expression: impl Into<String>) -> Variable {
    Variable { name: name.into(), expression: expression.into() }
}

/// Plural resource name of a workload kind, as `allot webhooks` registers it.
fn plural(kind: &str) -> String {
    format!("{}s", kind.to_lowercase())
}

/// Where Pods are for one group of kinds: the Pod itself, or the templates of workloads that
/// share a template shape.
#[derive(Debug, Clone)]
pub struct PodSource {
    /// Object-name suffix (`pod`, `job`, `jobset`…).
    pub suffix: String,
    /// `(group, plural)` of every kind in the group.
    pub resources: Vec<(&'static str, String)>,
    /// CEL list of the Pod-shaped values (`{metadata, spec}`) in `object`.
    pub pods: String,
    /// CEL list of where each element of `pods` is in `object`, in the same order: `''` for a
    /// Pod, else the template's path as the engine's findings name it (`spec.template`).
    pub paths: String,
    /// True for Pods themselves (where `oldObject` exists as Allot binds it).
    pub is_pod: bool,
}

/// Every Pod source, from the workload table; kinds whose paths cannot be expressed are
/// returned with the reason.
pub fn pod_sources() -> (Vec<PodSource>, Vec<String>) {
    let mut sources: Vec<PodSource> = Vec::new();
    let mut unsupported = Vec::new();
    for w in WORKLOAD_KINDS {
        let pods = if w.group.is_empty() && w.kind == "Pod" {
            Ok(("[object]".to_string(), "['']".to_string()))
        } else if let Some((steps, field)) = w.container_resources {
            cel::templates_with_paths(&[steps]).map(|(holders, holder_paths)| {
                // The container the engine makes of it: its resources, and the container fields
                // it states (`image`…), each only when present (CEL's optional map entries), so a
                // rule reads `has(c.image)` as the engine's Pod view answers it.
                let copied: String = crate::model::workload::CONTAINER_FIELDS
                    .iter()
                    .map(|f| format!(", ?'{f}': has(h.{f}) ? optional.of(h.{f}) : optional.none()"))
                    .collect();
                (
                    format!(
                        "{holders}.filter(h, has(h.{field})).map(h, dyn({{'spec': {{'containers': [{{'name': dyn('trainer'), 'resources': dyn(h.{field}){copied}}}]}}}}))"
                    ),
                    format!("lists.range(size({holders})).filter(i, has(({holders})[i].{field})).map(i, ({holder_paths})[i])"),
                )
            })
        } else {
            cel::templates_with_paths(w.templates)
        };
        match pods {
            Ok((pods, paths)) => match sources.iter_mut().find(|s| s.pods == pods) {
                Some(s) => s.resources.push((w.group, plural(w.kind))),
                None => sources.push(PodSource {
                    suffix: object_name(&[w.kind]),
                    resources: vec![(w.group, plural(w.kind))],
                    is_pod: w.group.is_empty() && w.kind == "Pod",
                    pods,
                    paths,
                }),
            },
            Err(why) => unsupported.push(format!("{}/{}: {why}", w.group, w.kind)),
        }
    }
    (sources, unsupported)
}

impl PodSource {
    /// The resource rules of this source for `operations`.
    fn rules(&self, operations: &[&str]) -> Vec<NamedRuleWithOperations> {
        let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (group, plural) in &self.resources {
            by_group.entry(group).or_default().push(plural.clone());
        }
        by_group.into_iter().map(|(g, r)| resource_rule(g, r, operations)).collect()
    }
}

#[cfg(test)]
mod tests;
