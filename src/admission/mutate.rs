//! Pod mutations, one ordered list of steps ([`STEPS`]): placement (tolerations, nodeSelector,
//! node affinity), the team's default priority class, and Allot's gang and quota gates. Pure: a
//! Pod in, patch operations (or, for a preview, the spec fields they change) and findings out.
//!
//! Idempotent by construction — every change is "make sure X holds", checked against the Pod as
//! it is — so `reinvocationPolicy: IfNeeded` and the CLI's mutate-then-revalidate see no second
//! patch.

use serde_json::Value;

use crate::admission::directory::NodeLookup;
use crate::admission::finding::{Finding, RuleId};
use crate::admission::tenant::never_gate;
use crate::model::expression::{Evaluator, Inputs};
use crate::model::gang::membership::{GATE, GangMetadataError, PodFacts, QUOTA_GATE};
use crate::model::json::Fields;
use crate::model::namespaces::TeamLookup;
use crate::model::patch::{Builder, PatchOp};
use crate::model::policy::{
    Action, AppliesTo, OnConflict, Placement, PolicySet, TaintEffect, Toleration, TolerationOperator,
};
use crate::model::resources;

mod reserved;
pub use reserved::reserved_taints;

/// Result of mutating one Pod.
#[derive(Debug, Default, Clone)]
pub struct Mutation {
    /// The JSON Patch (none for a [`PodContext::preview`]).
    pub ops: Vec<PatchOp>,
    /// For a [`PodContext::preview`] only: the spec fields the mutation changes, as it leaves
    /// them, to [`crate::model::patch::overlay`] on the spec mutated.
    pub changed_spec_fields: crate::model::patch::ChangedFields,
    /// Human-readable changes, one per decision ("placement gpu: toleration nvidia.com/gpu…").
    pub changes: Vec<String>,
    pub findings: Vec<Finding>,
    /// The Pod's gang metadata is invalid (so it got no gate). Reported by the caller: a real
    /// Pod is denied at /mutate, a template by validation's own gang check, once.
    pub gang_error: Option<GangMetadataError>,
    /// Whether [`Mutation::changes`] are written ([`PodContext::describe`]).
    describe: bool,
}

impl Mutation {
    /// Records a change's description, formatted only when someone reads them.
    fn change(&mut self, description: impl FnOnce() -> String) {
        if self.describe {
            self.changes.push(description());
        }
    }
}

/// Everything mutation needs besides the policies.
pub struct PodContext<'a> {
    pub namespace: &'a str,
    pub team: TeamLookup<'a>,
    /// The variables of `when` conditions, made on demand for what the expression reads.
    pub inputs: &'a dyn Fn(&crate::model::expression::Needs) -> Inputs<'a>,
    /// Who creates the Pod: exemptions from Allot's gates go by identity, not by label.
    pub requester: crate::admission::tenant::Requester<'a>,
    /// What the Pod asks through DRA claims: claim accelerators get placement and queueing
    /// like those in the containers' resources.
    pub claims: &'a crate::model::dra::ClaimDemand,
    /// The cluster gangs native PodGroups ([`crate::model::dra::ClaimSource::schedules_native_gangs`]):
    /// only then is a Pod that names one left to the scheduler's gang scheduling, ungated.
    pub native_gangs: bool,
    /// What the cluster view knows: the taints of the node a Pod names in `spec.nodeName`.
    pub cluster: &'a dyn crate::admission::directory::GangDirectory,
    /// Describe the changes in [`Mutation::changes`] (`allot check`, debug logs); without it
    /// they are not formatted.
    pub describe: bool,
    /// The caller wants the mutated spec, not a patch (a workload template's preview): the
    /// result is [`Mutation::changed_spec_fields`], and no JSON Patch is built.
    pub preview: bool,
}

/// One Pod being mutated: what the steps read, the patch they build and what they report.
struct Mutating<'m, 'c> {
    policies: &'m PolicySet,
    pod: &'m Value,
    /// The Pod's spec as it came (the patch so far is the builder's).
    spec: &'m Value,
    /// Where that spec is in the object under review, for findings (`spec`, `spec.template.spec`).
    spec_path: String,
    path_prefix: &'m str,
    facts: PodFacts<'m>,
    ctx: &'m PodContext<'c>,
    builder: Builder<'m>,
    out: Mutation,
}

/// The steps every Pod goes through, in order; each sees the patch the ones before it built (a
/// placement's toleration is there when the gates are decided). Adding a mutation is adding an
/// entry here, and its test.
const STEPS: &[fn(&mut Mutating<'_, '_>)] = &[placements, default_priority, gang_gate, quota_gate];

/// Mutates a Pod (`pod` is the whole Pod object; `path_prefix` where it is in the object under
/// review, empty for a Pod): the JSON Patch of its spec, or for a [`PodContext::preview`] the
/// spec fields that patch changes.
pub fn mutate_pod(policies: &PolicySet, pod: &Value, ctx: &PodContext<'_>, path_prefix: &str) -> Mutation {
    let out = Mutation { describe: ctx.describe, ..Mutation::default() };
    let Some(spec_map) = pod.get("spec").and_then(Value::as_object) else {
        return out;
    };
    if is_mirror_pod(pod) && ctx.requester.is_node() {
        // The kubelet's own copy of a static pod cannot be changed. The annotation alone is
        // no trust: anyone else writing it gets placement and gates like any pod.
        return out;
    }
    let mut facts = PodFacts::from_json(pod);
    if !ctx.native_gangs {
        // The API server drops the field where native gang scheduling is off.
        facts.native_pod_group = None;
    }
    let mut m = Mutating {
        policies,
        pod,
        spec: pod.get("spec").unwrap_or(&Value::Null),
        spec_path: if path_prefix.is_empty() { "spec".to_string() } else { format!("{path_prefix}.spec") },
        path_prefix,
        facts,
        ctx,
        builder: if ctx.preview { Builder::fields_only(spec_map) } else { Builder::new("/spec", spec_map) },
        out,
    };
    for step in STEPS {
        step(&mut m);
    }
    let Mutating { builder, mut out, .. } = m;
    if ctx.preview {
        out.changed_spec_fields = builder.into_changed_fields();
    } else {
        out.ops = builder.into_ops();
    }
    out
}

/// The placements whose selectors match: their tolerations and node constraints; then whether
/// the Pod tolerates a taint a placement reserves without being placed there.
fn placements(m: &mut Mutating<'_, '_>) {
    let mut applied = Vec::with_capacity(m.policies.placements.len());
    for placement in &m.policies.placements {
        let applies = placement_applies(m.policies, placement, m.spec, m.ctx, m.path_prefix, &mut m.out);
        applied.push(applies);
        if applies {
            apply_placement(placement, &mut m.builder, &m.spec_path, &mut m.out);
        }
    }
    m.out.findings.extend(reserved_taints(m.policies, m.spec, m.ctx, &applied, None, &m.spec_path));
}

/// The team's (or the cluster's) default priority class, where the Pod names none.
fn default_priority(m: &mut Mutating<'_, '_>) {
    apply_default_priority(m.policies, m.ctx, &mut m.builder, &mut m.out);
}

/// Allot's gang gate on a gang member ([`apply_gang_gate`]).
fn gang_gate(m: &mut Mutating<'_, '_>) {
    apply_gang_gate(m.policies, &m.facts, m.ctx, &mut m.builder, &mut m.out);
}

/// Allot's quota gate on a pod of a queue-mode team ([`apply_quota_gate`]).
fn quota_gate(m: &mut Mutating<'_, '_>) {
    apply_quota_gate(m.policies, m.pod, &m.facts, m.ctx, &mut m.builder, &mut m.out);
}

fn is_mirror_pod(pod: &Value) -> bool {
    pod.field(&["metadata", "annotations"])
        .and_then(Value::as_object)
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

/// Which of the policy set's placements apply to `pod` (in their order), as [`mutate_pod`]
/// decides it, with the findings of `when` conditions that could not be evaluated.
pub fn applying_placements(policies: &PolicySet, pod: &Value, ctx: &PodContext<'_>) -> (Vec<bool>, Vec<Finding>) {
    let mut out = Mutation::default();
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    let applied = policies.placements.iter().map(|p| placement_applies(policies, p, spec, ctx, "", &mut out)).collect();
    (applied, out.findings)
}

fn placement_applies(
    policies: &PolicySet,
    placement: &Placement,
    spec: &Value,
    ctx: &PodContext<'_>,
    path_prefix: &str,
    out: &mut Mutation,
) -> bool {
    if !placement.namespaces.in_scope(
        &placement.spec.scope.teams,
        ctx.namespace,
        ctx.team.team.map(|t| t.name.as_str()),
    ) {
        return false;
    }
    let requests = resources::requests_any(spec, &placement.resources)
        || ctx.claims.accelerators(&policies.device_classes).keys().any(|name| placement.resources.matches(name));
    let wanted = match placement.spec.applies_to {
        AppliesTo::AcceleratorPods => requests,
        AppliesTo::OtherPods => !requests,
        AppliesTo::AllPods => true,
    };
    if !wanted {
        return false;
    }
    let Some(when) = &placement.when else {
        return true;
    };
    let inputs = (ctx.inputs)(when.needs());
    match Evaluator::new(&policies.env, &inputs).eval_bool(when, &format_args!("placement/{}", placement.name)) {
        Ok(b) => b,
        Err(e) => {
            // A condition that cannot be evaluated must not silently skip a placement.
            out.findings.push(Finding {
                rule: RuleId::placement(&placement.name),
                action: Action::Deny,
                path: path_prefix.to_string(),
                message: format!("spec.when could not be evaluated: {e}"),
            });
            false
        }
    }
}

fn apply_placement(placement: &Placement, builder: &mut Builder<'_>, spec_path: &str, out: &mut Mutation) {
    let rule = RuleId::placement(&placement.name);
    for toleration in &placement.spec.tolerations {
        let covered = builder
            .get(&["tolerations"])
            .and_then(Value::as_array)
            .is_some_and(|existing| existing.iter().any(|e| covers(e, toleration)));
        if covered {
            continue;
        }
        let value = serde_json::to_value(toleration).unwrap_or(Value::Null);
        builder.push(&["tolerations"], value);
        out.change(|| format!("{rule}: add toleration {}", describe_toleration(toleration)));
    }
    for (key, value) in &placement.spec.node_selector {
        match builder.get(&["nodeSelector", key]) {
            Some(Value::String(current)) if current == value => {}
            Some(current) => {
                let current = current.as_str().map_or_else(|| current.to_string(), str::to_string);
                let message = format!(
                    "nodeSelector {key}={current} conflicts with {key}={value} required by placement {}",
                    placement.name
                );
                let action = match placement.spec.on_conflict {
                    OnConflict::Deny => Action::Deny,
                    OnConflict::Keep => Action::Warn,
                };
                let message = match action {
                    Action::Deny => {
                        format!("{message}; remove the key or use the value the placement needs")
                    }
                    _ => format!("{message}; kept the pod's value"),
                };
                out.findings.push(Finding {
                    rule: rule.clone(),
                    action,
                    path: format!("{spec_path}.nodeSelector"),
                    message,
                });
            }
            None => {
                builder.ensure(&["nodeSelector", key], Value::String(value.clone()));
                out.change(|| format!("{rule}: set nodeSelector {key}={value}"));
            }
        }
    }
    if !placement.spec.node_affinity.is_empty() {
        add_node_affinity(placement, builder, rule.as_str(), out);
    }
}

const REQUIRED: [&str; 3] = ["affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"];

/// ANDs the placement's requirements into every required node-selector term (terms are ORed,
/// so each must carry them), creating the affinity when there is none.
fn add_node_affinity(placement: &Placement, builder: &mut Builder<'_>, rule: &str, out: &mut Mutation) {
    let requirements: Vec<Value> =
        placement.spec.node_affinity.iter().map(|r| serde_json::to_value(r).unwrap_or(Value::Null)).collect();
    let terms_path = [REQUIRED[0], REQUIRED[1], REQUIRED[2], "nodeSelectorTerms"];
    let term_count = builder.get(&terms_path).and_then(Value::as_array).map_or(0, Vec::len);
    if term_count == 0 {
        let term = serde_json::json!({"matchExpressions": requirements});
        builder.ensure(&terms_path, Value::Array(vec![term]));
        out.change(|| format!("{rule}: require node affinity {}", describe_requirements(&requirements)));
        return;
    }
    let mut changed = false;
    for i in 0..term_count {
        let index = i.to_string();
        let expr_path =
            [terms_path[0], terms_path[1], terms_path[2], terms_path[3], index.as_str(), "matchExpressions"];
        for req in &requirements {
            let present = builder.get(&expr_path).and_then(Value::as_array).is_some_and(|l| l.contains(req));
            if !present {
                builder.push(&expr_path, req.clone());
                changed = true;
            }
        }
    }
    if changed {
        out.change(|| format!("{rule}: require node affinity {} in every term", describe_requirements(&requirements)));
    }
}

fn describe_requirements(reqs: &[Value]) -> String {
    reqs.iter()
        .map(|r| {
            let values = r
                .get("values")
                .and_then(Value::as_array)
                .map(|v| v.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","));
            format!(
                "{} {}{}",
                r["key"].as_str().unwrap_or("?"),
                r["operator"].as_str().unwrap_or("?"),
                values.map(|v| format!(" [{v}]")).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

fn describe_toleration(t: &Toleration) -> String {
    let key = t.key.as_deref().unwrap_or("*");
    let value = t.value.as_deref().map(|v| format!("={v}")).unwrap_or_default();
    let effect = t.effect.map(|e| format!(":{e:?}")).unwrap_or_default();
    format!("{key}{value}{effect}")
}

/// True when the pod's toleration `existing` already tolerates every taint `wanted` tolerates.
pub fn covers(existing: &Value, wanted: &Toleration) -> bool {
    let field = |name: &str| existing.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
    let existing_op = field("operator").unwrap_or("Equal");
    let wanted_op = wanted.operator.unwrap_or(TolerationOperator::Equal);
    // Key: an empty key with Exists tolerates every key.
    let key_ok = match field("key") {
        None => existing_op == "Exists",
        Some(k) => wanted.key.as_deref() == Some(k),
    };
    let effect_ok = match field("effect") {
        None => true,
        Some(e) => wanted.effect.is_some_and(|w| effect_name(w) == e),
    };
    let value_ok = existing_op == "Exists"
        || (wanted_op == TolerationOperator::Equal
            && field("value") == wanted.value.as_deref().filter(|v| !v.is_empty()));
    // A bounded NoExecute toleration does not cover an unbounded one.
    let seconds_ok = match (existing.get("tolerationSeconds").and_then(Value::as_i64), wanted.toleration_seconds) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(e), Some(w)) => e >= w,
    };
    key_ok && effect_ok && value_ok && seconds_ok
}

fn effect_name(effect: TaintEffect) -> &'static str {
    match effect {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// Gang members get Allot's scheduling gate at CREATE (gates can only be set then); the
/// controller lifts it when the whole gang fits.
fn apply_gang_gate(
    policies: &PolicySet,
    facts: &PodFacts<'_>,
    ctx: &PodContext<'_>,
    builder: &mut Builder<'_>,
    out: &mut Mutation,
) {
    let gang = match policies.gang_of(facts, ctx.namespace, ctx.team.team.map(|t| t.name.as_str())) {
        Ok(Some(gang)) => gang,
        Ok(None) => return,
        Err(message) => {
            out.gang_error = Some(message);
            return;
        }
    };
    if never_gate(facts, &policies.tenancy, ctx.requester).is_some() {
        // Reinvoked after a later webhook added the marker (Kueue's webhook adds its gate after
        // Allot's, whose configuration sorts first): the gate Allot's first call added comes off.
        take_gate_off(builder, GATE, out);
        return;
    }
    if hand_off(policies, &gang, ctx, builder, out) {
        return;
    }
    if gate_position(builder, GATE).is_some() {
        return;
    }
    builder.push(&["schedulingGates"], serde_json::json!({ "name": GATE }));
    out.change(|| {
        let size = gang.size.map_or_else(|| "size from its owner".to_string(), |n| format!("{n} members"));
        format!("gang {} ({size}): scheduling gate {GATE}", gang.name)
    });
}

/// An inferred gang under a GangPolicy with `nativeScheduling`, on a cluster that gangs native
/// PodGroups: the member joins the PodGroup Allot's leader creates for the gang
/// ([`crate::model::gang::membership::hand_off_name`]) instead of getting Allot's gate; the scheduler
/// holds it until the PodGroup exists and then places the group whole. True when done.
fn hand_off(
    policies: &PolicySet,
    gang: &crate::model::gang::membership::Membership,
    ctx: &PodContext<'_>,
    builder: &mut Builder<'_>,
    out: &mut Mutation,
) -> bool {
    let policy = policies.gang_policy(ctx.namespace, ctx.team.team.map(|t| t.name.as_str()));
    if !policy.native_scheduling || !ctx.native_gangs || !crate::model::gang::membership::can_hand_off(gang) {
        return false;
    }
    let Some(pod_group) = crate::model::gang::membership::hand_off_name(&gang.name) else { return false };
    builder.ensure(&["schedulingGroup"], serde_json::json!({ "podGroupName": pod_group }));
    out.change(|| format!("gang {} handed to the scheduler: native PodGroup {pod_group}", gang.name));
    true
}

/// Queue-mode quota: a pod that counts against its team's quota is admitted behind the
/// `allot.dev/quota` gate; the controller lifts it when the team has room.
fn apply_quota_gate(
    policies: &PolicySet,
    pod: &Value,
    facts: &PodFacts<'_>,
    ctx: &PodContext<'_>,
    builder: &mut Builder<'_>,
    out: &mut Mutation,
) {
    let Some(team) = ctx.team.team else { return };
    let Some(quota) = team.quota.as_ref().filter(|q| q.mode == crate::model::policy::QuotaMode::Queue) else { return };
    let Some(spec) = pod.get("spec") else { return };
    if quota
        .charge(&crate::model::dra::held_quota_requests(&crate::model::resources::pod_requests(spec), ctx.claims))
        .is_empty()
    {
        return;
    }
    // (Validation denies the exempt pods whose scheduler would not hold them to the quota:
    // `tenant::check_quota_queue_skip`.)
    if crate::admission::tenant::quota_queue_exemption(policies, facts, ctx.namespace, &team.name, ctx.requester)
        .is_some()
    {
        // As for the gang gate: what Allot's first call added comes off on reinvocation.
        take_gate_off(builder, QUOTA_GATE, out);
        return;
    }
    if gate_position(builder, QUOTA_GATE).is_none() {
        builder.push(&["schedulingGates"], serde_json::json!({ "name": QUOTA_GATE }));
        out.change(|| format!("team {} quota (queue): scheduling gate {QUOTA_GATE}", team.name));
    }
}

/// Where the scheduling gate `name` is among the pod's gates, as the patch has them so far.
fn gate_position(builder: &Builder<'_>, name: &str) -> Option<usize> {
    builder
        .get(&["schedulingGates"])
        .and_then(Value::as_array)
        .and_then(|gates| gates.iter().position(|g| g.get("name").and_then(Value::as_str) == Some(name)))
}

/// Removes Allot's gate `name` if the pod carries it (a CREATE reinvoked after another webhook
/// made the pod one Allot never gates).
fn take_gate_off(builder: &mut Builder<'_>, name: &str, out: &mut Mutation) {
    if let Some(index) = gate_position(builder, name) {
        builder.remove(&["schedulingGates", &index.to_string()]);
        out.change(|| format!("scheduling gate {name} taken off: the pod is left to the scheduler that manages it"));
    }
}

/// The class a pod in this team gets when it asks for none.
pub fn default_class<'p>(policies: &'p PolicySet, team: &TeamLookup<'p>) -> Option<&'p str> {
    team.team.and_then(|t| t.priority.default.as_deref()).or(policies.priority.default.as_deref())
}

fn apply_default_priority(policies: &PolicySet, ctx: &PodContext<'_>, builder: &mut Builder<'_>, out: &mut Mutation) {
    let Some(default) = default_class(policies, &ctx.team) else {
        return;
    };
    let current = builder.get(&["priorityClassName"]).and_then(Value::as_str).filter(|s| !s.is_empty());
    let unset = match current {
        None => true,
        // The Priority plugin filled in the cluster's globalDefault: the user asked for nothing.
        Some(c) => c != default && policies.priority.global_default.as_deref() == Some(c),
    };
    if !unset {
        return;
    }
    let from = current.map(str::to_string);
    builder.ensure(&["priorityClassName"], Value::String(default.to_string()));
    // Otherwise the Priority plugin's second pass rejects the pod: priority and
    // preemptionPolicy would still be the old class's (kubernetes#102724).
    builder.remove(&["priority"]);
    builder.remove(&["preemptionPolicy"]);
    out.change(|| match from {
        Some(f) => {
            format!("team default priority: priorityClassName {f} (cluster default) -> {default}")
        }
        None => format!("team default priority: priorityClassName {default}"),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wanted(key: &str, effect: Option<TaintEffect>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some(TolerationOperator::Exists),
            value: None,
            effect,
            toleration_seconds: None,
        }
    }

    #[test]
    fn toleration_coverage() {
        let gpu = wanted("nvidia.com/gpu", Some(TaintEffect::NoSchedule));
        assert!(covers(&json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}), &gpu));
        assert!(covers(&json!({"key": "nvidia.com/gpu", "operator": "Exists"}), &gpu), "empty effect = all");
        assert!(covers(&json!({"operator": "Exists"}), &gpu), "wildcard");
        assert!(!covers(&json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}), &gpu));
        assert!(!covers(&json!({"key": "amd.com/gpu", "operator": "Exists"}), &gpu));
        // Equal with a value does not cover Exists (other values of the taint would not match).
        assert!(!covers(&json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}), &gpu));
        let equal =
            Toleration { operator: Some(TolerationOperator::Equal), value: Some("present".into()), ..gpu.clone() };
        assert!(covers(&json!({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}), &equal));
        assert!(covers(&json!({"key": "nvidia.com/gpu", "operator": "Exists"}), &equal));
        // A bounded NoExecute toleration does not cover an unbounded one.
        let no_exec = wanted("k", Some(TaintEffect::NoExecute));
        assert!(!covers(&json!({"key": "k", "operator": "Exists", "tolerationSeconds": 300}), &no_exec));
    }
}
