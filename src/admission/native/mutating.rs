//! MutatingAdmissionPolicies: placements (tolerations, nodeSelector, required node affinity) and the team's default
//! priority class, on Pod CREATE.
//!
//! Each mutation is a JSON Patch whose CEL adds only what is missing, as `mutate.rs` does:
//! under `reinvocationPolicy: IfNeeded` a second pass finds everything in place and patches
//! nothing. (An apply configuration would not do: `tolerations` is an atomic list, which a
//! merge replaces.)

use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchCondition, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation, Validation, Variable,
};

use super::cel::{self, Bindings, Unsupported};
use super::{
    Compiled, Coverage, Line, NativeObject, Part, Subject, condition, match_resources, metadata, not_kubelet,
    object_name, variable,
};
use crate::model::policy::{
    Action, AppliesTo, NodeSelectorOperator, NodeSelectorRequirement, OnConflict, Placement, PolicySet, Toleration,
    TolerationOperator,
};

fn emit(
    out: &mut Compiled,
    name: &str,
    conditions: Vec<MatchCondition>,
    variables: Vec<Variable>,
    patches: Vec<String>,
) {
    let (conditions, guard) = super::namespace_guard(conditions);
    let mutations = patches
        .into_iter()
        .map(|expression| match &guard {
            Some(guard) => format!("({guard}) ? ({expression}) : []"),
            None => expression,
        })
        .map(|expression| Mutation {
            patch_type: "JSONPatch".into(),
            json_patch: Some(JSONPatch { expression: Some(expression) }),
            apply_configuration: None,
        })
        .collect();
    out.objects.push(NativeObject::MutatingPolicy(MutatingAdmissionPolicy {
        metadata: metadata(name),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(match_resources(vec![super::resource_rule("", vec!["pods".into()], &["CREATE"])])),
            match_conditions: Some(conditions),
            variables: Some(variables),
            mutations: Some(mutations),
            reinvocation_policy: Some("IfNeeded".into()),
            param_kind: None,
        }),
    }));
    out.objects.push(NativeObject::MutatingBinding(MutatingAdmissionPolicyBinding {
        metadata: metadata(name),
        spec: Some(MutatingAdmissionPolicyBindingSpec { policy_name: Some(name.to_string()), ..Default::default() }),
    }));
}

/// The team's (else the cluster's) default class for Pods that ask for none, or whose class is
/// the cluster's globalDefault (filled in by the Priority plugin); `spec.priority` and
/// `spec.preemptionPolicy` go in the same patch, or the Priority plugin's second pass rejects
/// the Pod (kubernetes#102724).
pub(super) fn default_priority(policies: &PolicySet, team: Result<&str, &Unsupported>, out: &mut Compiled) {
    let defaults: Vec<String> = policies
        .teams
        .iter()
        .filter_map(|t| t.priority.default.as_ref().map(|d| format!("{}: {}", cel::string(&t.name), cel::string(d))))
        .collect();
    let cluster = policies.priority.default.clone().unwrap_or_default();
    if defaults.is_empty() && cluster.is_empty() {
        return;
    }
    let mut coverage = Coverage::new(Subject::DefaultPriority);
    let team = match team {
        Ok(t) => t,
        Err(why) => {
            coverage.webhook_only.push(Line::whole(format!("the team of a namespace: {why}")));
            out.coverage.push(coverage);
            return;
        }
    };
    let map = format!("{{{}}}", defaults.join(", "));
    let default_class = format!("variables.team in {map} ? {map}[variables.team] : {}", cel::string(&cluster));
    let class = "object.spec.priorityClassName";
    let mut unset = format!("!has({class}) || {class} == ''");
    if let Some(global) = &policies.priority.global_default {
        unset = format!("{unset} || ({class} == {} && {class} != variables.defaultClass)", cel::string(global));
    }
    let patch = format!(
        "variables.defaultClass != '' && ({unset}) ? \
         [JSONPatch{{op: \"add\", path: \"/spec/priorityClassName\", value: variables.defaultClass}}] + \
         (has(object.spec.priority) ? [JSONPatch{{op: \"remove\", path: \"/spec/priority\"}}] : []) + \
         (has(object.spec.preemptionPolicy) ? [JSONPatch{{op: \"remove\", path: \"/spec/preemptionPolicy\"}}] : []) \
         : []"
    );
    emit(
        out,
        "allot-default-priority",
        vec![not_kubelet()],
        vec![variable("team", team), variable("defaultClass", default_class)],
        vec![patch],
    );
    coverage
        .compiled
        .push(Line::whole("team default priority class, spec.priority and preemptionPolicy removed with it"));
    out.coverage.push(coverage);
}

/// A Placement: its tolerations and nodeSelector as a mutating policy, its nodeSelector
/// conflicts as a validating one.
pub(super) fn placement(
    policies: &PolicySet,
    placement: &Placement,
    team: Result<&str, &Unsupported>,
    out: &mut Compiled,
) {
    let mut coverage = Coverage::new(Subject::Placement(placement.name.clone()));
    match compile_placement(policies, placement, team, out) {
        Ok(lines) => coverage.compiled.extend(lines),
        Err(why) => coverage.webhook_only.push(Line::whole(why.to_string())),
    }
    if let Some(action) = placement.spec.reserve_tolerations.and_then(|a| a.action()) {
        // Which pods a toleration is reserved against depends on every Placement that places
        // them, and a bound pod on its node's taints: the webhook keeps that part, and only it.
        coverage.webhook_only.push(Line::new(
            Part::ReserveTolerations,
            format!(
                "reserveTolerations ({}): other pods' tolerations of its taints, and nodeName on its nodes, are judged \
             against every Placement that places them and the nodes' taints",
                action.label()
            ),
        ));
    }
    out.coverage.push(coverage);
}

fn compile_placement(
    policies: &PolicySet,
    placement: &Placement,
    team: Result<&str, &Unsupported>,
    out: &mut Compiled,
) -> Result<Vec<Line>, Unsupported> {
    let spec = &placement.spec;
    let conditions = placement_conditions(policies, placement, team)?;
    let (patches, mut lines) = placement_patches(spec);
    if patches.is_empty() {
        return Ok(lines);
    }
    let name = object_name(&["allot-placement", &placement.name]);
    let variables = vec![variable("namespaceName", "request.namespace")];
    if !spec.node_selector.is_empty() {
        lines.push(selector_conflicts(placement, &conditions, &variables, out));
    }
    emit(out, &name, conditions, variables, patches);
    Ok(lines)
}

/// Which pods a Placement applies to, as match conditions: its scope (namespaces, teams),
/// the pods it places (accelerator pods, others, all) and its `spec.when`.
fn placement_conditions(
    policies: &PolicySet,
    placement: &Placement,
    team: Result<&str, &Unsupported>,
) -> Result<Vec<MatchCondition>, Unsupported> {
    let spec = &placement.spec;
    let mut conditions = vec![not_kubelet()];
    if !spec.scope.teams.is_empty() {
        let team = team.map_err(|why| Unsupported::Team(Box::new(why.clone())))?;
        if let Some(scope) = cel::scope(&placement.namespaces, &spec.scope.teams, team)? {
            conditions.push(condition("scope", scope));
        }
    } else if let Some(scope) = cel::scope(&placement.namespaces, &[], "''")? {
        conditions.push(condition("scope", scope));
    }
    let requests = cel::pod_names_any(&placement.resources, "object.spec");
    match spec.applies_to {
        AppliesTo::AcceleratorPods => conditions.push(condition("accelerator-pods", requests)),
        AppliesTo::OtherPods => conditions.push(condition("other-pods", format!("!{requests}"))),
        AppliesTo::AllPods => {}
    }
    if let Some(when) = &placement.when {
        let when = cel::rewrite(
            when.source(),
            Bindings { object: "object", old_object: None, accelerators: &policies.accelerators },
        )
        .map_err(|why| Unsupported::When(Box::new(why)))?;
        conditions.push(condition("when", when));
    }
    Ok(conditions)
}

/// The JSON patches adding a Placement's tolerations, nodeSelector and node affinity, and the
/// coverage line of each.
fn placement_patches(spec: &crate::model::policy::PlacementSpec) -> (Vec<String>, Vec<Line>) {
    let mut lines = Vec::new();
    let mut patches = Vec::new();
    for t in &spec.tolerations {
        patches.push(toleration_patch(t));
        lines.push(Line::new(Part::Toleration, format!("toleration {}", serde_json::to_string(t).unwrap_or_default())));
    }
    for (key, value) in &spec.node_selector {
        let (k, v) = (cel::string(key), cel::string(value));
        let escaped = cel::string(&format!("/spec/nodeSelector/{}", key.replace('~', "~0").replace('/', "~1")));
        patches.push(format!(
            "!has(object.spec.nodeSelector) ? [JSONPatch{{op: \"add\", path: \"/spec/nodeSelector\", value: {{{k}: {v}}}}}] : \
             {k} in object.spec.nodeSelector ? [] : [JSONPatch{{op: \"add\", path: {escaped}, value: {v}}}]"
        ));
        lines.push(Line::new(Part::NodeSelector, format!("nodeSelector {key}={value}")));
    }
    for requirement in &spec.node_affinity {
        patches.push(node_affinity_patch(requirement));
    }
    if !spec.node_affinity.is_empty() {
        lines.push(Line::new(
            Part::NodeAffinity,
            format!("nodeAffinity {} in every required node-selector term", describe(&spec.node_affinity)),
        ));
    }
    (patches, lines)
}

/// The validation beside a Placement's nodeSelector: a pod that sets another value for one of
/// its keys is denied (`onConflict: Deny`) or warned (`Keep`), as the webhook does.
fn selector_conflicts(
    placement: &Placement,
    conditions: &[MatchCondition],
    variables: &[Variable],
    out: &mut Compiled,
) -> Line {
    let spec = &placement.spec;
    let action = match spec.on_conflict {
        OnConflict::Deny => Action::Deny,
        OnConflict::Keep => Action::Warn,
    };
    let keep = spec
        .node_selector
        .iter()
        .map(|(k, v)| {
            let (k, v) = (cel::string(k), cel::string(v));
            format!("(!({k} in object.spec.nodeSelector) || object.spec.nodeSelector[{k}] == {v})")
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let pairs: Vec<String> = spec.node_selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let v = Validation {
        expression: format!("!has(object.spec.nodeSelector) || ({keep})"),
        message: Some(format!(
            "[placement/{}] nodeSelector conflicts with {} required by placement {}",
            placement.name,
            pairs.join(", "),
            placement.name
        )),
        ..Default::default()
    };
    super::validating::emit(
        out,
        &object_name(&["allot-placement", &placement.name, "conflicts"]),
        action,
        match_resources(vec![super::resource_rule("", vec!["pods".into()], &["CREATE"])]),
        conditions.to_vec(),
        variables.to_vec(),
        vec![v],
    );
    Line::new(Part::SelectorConflicts, format!("nodeSelector conflicts ({})", action.label()))
}

const REQUIRED: &str = "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution";
const TERMS_PATH: &str = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";

/// The patch ANDing `r` into every required node-selector term that lacks it (terms are ORed,
/// so each must carry it), creating the affinity at its highest missing level when there is
/// none — what `mutate::add_node_affinity` does, one requirement per mutation (mutations apply
/// in order, so the second requirement finds the term the first one created).
fn node_affinity_patch(r: &NodeSelectorRequirement) -> String {
    // Plain maps, not `Object.spec.affinity{…}` initializers: a list of initializers as a patch
    // value panics the API server (kubernetes#142181), and a plain map serializes the same.
    let mut fields = vec![
        format!("\"key\": dyn({})", cel::string(&r.key)),
        format!("\"operator\": dyn({})", cel::string(node_operator(r.operator))),
    ];
    if !r.values.is_empty() {
        fields.push(format!("\"values\": dyn({})", cel::string_list(&r.values)));
    }
    let requirement = format!("{{{}}}", fields.join(", "));
    let terms = format!("[{{\"matchExpressions\": [{requirement}]}}]");
    let required = format!("{{\"nodeSelectorTerms\": {terms}}}");
    let node_affinity = format!("{{\"requiredDuringSchedulingIgnoredDuringExecution\": {required}}}");
    let affinity = format!("{{\"nodeAffinity\": {node_affinity}}}");
    let t = format!("{REQUIRED}.nodeSelectorTerms");
    let present = format!(
        "{t}[allotI].matchExpressions.exists(e, e.key == {} && e.operator == {} && (has(e.values) ? e.values : []) == {})",
        cel::string(&r.key),
        cel::string(node_operator(r.operator)),
        cel::string_list(&r.values)
    );
    let add =
        |path: &str, value: &str| format!("[JSONPatch{{op: \"add\", path: {}, value: {value}}}]", cel::string(path));
    format!(
        "!has(object.spec.affinity) ? {} : \
         !has(object.spec.affinity.nodeAffinity) ? {} : \
         !has({REQUIRED}) ? {} : \
         !has({t}) || size({t}) == 0 ? {} : \
         lists.range(size({t})).filter(allotI, has({t}[allotI].matchExpressions) && !{present})\
         .map(allotI, JSONPatch{{op: \"add\", path: {terms_path} + string(allotI) + \"/matchExpressions/-\", value: {requirement}}}) + \
         lists.range(size({t})).filter(allotI, !has({t}[allotI].matchExpressions))\
         .map(allotI, JSONPatch{{op: \"add\", path: {terms_path} + string(allotI) + \"/matchExpressions\", value: [{requirement}]}})",
        add("/spec/affinity", &affinity),
        add("/spec/affinity/nodeAffinity", &node_affinity),
        add("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", &required),
        add(TERMS_PATH, &terms),
        terms_path = cel::string(&format!("{TERMS_PATH}/")),
    )
}

fn node_operator(o: NodeSelectorOperator) -> &'static str {
    match o {
        NodeSelectorOperator::In => "In",
        NodeSelectorOperator::NotIn => "NotIn",
        NodeSelectorOperator::Exists => "Exists",
        NodeSelectorOperator::DoesNotExist => "DoesNotExist",
        NodeSelectorOperator::Gt => "Gt",
        NodeSelectorOperator::Lt => "Lt",
    }
}

fn describe(requirements: &[NodeSelectorRequirement]) -> String {
    requirements
        .iter()
        .map(|r| {
            let values = if r.values.is_empty() { String::new() } else { format!(" [{}]", r.values.join(",")) };
            format!("{} {}{values}", r.key, node_operator(r.operator))
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

/// The patch adding `t` unless a toleration the Pod has already tolerates everything `t` does.
fn toleration_patch(t: &Toleration) -> String {
    let literal = toleration_literal(t);
    // The first toleration as a list of a plain map: a list of `Object…{}` initializers as a
    // patch value panics the API server (kubernetes#142181). (Rarely reached: the API server's
    // DefaultTolerationSeconds plugin gives most Pods tolerations before policies run.)
    let first = toleration_map(t);
    format!(
        "!has(object.spec.tolerations) ? [JSONPatch{{op: \"add\", path: \"/spec/tolerations\", value: [{first}]}}] : \
         object.spec.tolerations.exists(e, {}) ? [] : [JSONPatch{{op: \"add\", path: \"/spec/tolerations/-\", value: {literal}}}]",
        covers("e", t)
    )
}

fn toleration_literal(t: &Toleration) -> String {
    let mut fields = Vec::new();
    if let Some(k) = &t.key {
        fields.push(format!("key: {}", cel::string(k)));
    }
    if let Some(o) = t.operator {
        fields.push(format!("operator: {}", cel::string(operator_name(o))));
    }
    if let Some(v) = &t.value {
        fields.push(format!("value: {}", cel::string(v)));
    }
    if let Some(e) = t.effect {
        fields.push(format!("effect: {}", cel::string(&format!("{e:?}"))));
    }
    if let Some(s) = t.toleration_seconds {
        fields.push(format!("tolerationSeconds: {s}"));
    }
    format!("Object.spec.tolerations{{{}}}", fields.join(", "))
}

/// `t` as a plain CEL map (values `dyn`, so one map holds strings and the seconds).
fn toleration_map(t: &Toleration) -> String {
    let mut fields = Vec::new();
    let mut field = |name: &str, value: String| fields.push(format!("{}: dyn({value})", cel::string(name)));
    if let Some(k) = &t.key {
        field("key", cel::string(k));
    }
    if let Some(o) = t.operator {
        field("operator", cel::string(operator_name(o)));
    }
    if let Some(v) = &t.value {
        field("value", cel::string(v));
    }
    if let Some(e) = t.effect {
        field("effect", cel::string(&format!("{e:?}")));
    }
    if let Some(s) = t.toleration_seconds {
        field("tolerationSeconds", s.to_string());
    }
    format!("{{{}}}", fields.join(", "))
}

fn operator_name(o: TolerationOperator) -> &'static str {
    match o {
        TolerationOperator::Exists => "Exists",
        TolerationOperator::Equal => "Equal",
    }
}

/// CEL of `mutate::covers`: the Pod's toleration `e` tolerates every taint `wanted` does.
fn covers(e: &str, wanted: &Toleration) -> String {
    let field = |name: &str| format!("(has({e}.{name}) ? {e}.{name} : '')");
    let op = format!("(has({e}.operator) && {e}.operator != '' ? {e}.operator : 'Equal')");
    let key_ok = match &wanted.key {
        Some(k) => format!("({key} == '' ? {op} == 'Exists' : {key} == {})", cel::string(k), key = field("key")),
        None => format!("({} == '' && {op} == 'Exists')", field("key")),
    };
    let effect_ok = match wanted.effect {
        Some(w) => format!("({eff} == '' || {eff} == {})", cel::string(&format!("{w:?}")), eff = field("effect")),
        None => format!("{} == ''", field("effect")),
    };
    let value_ok = match wanted.operator.unwrap_or(TolerationOperator::Equal) {
        TolerationOperator::Equal => {
            format!(
                "({op} == 'Exists' || {} == {})",
                field("value"),
                cel::string(wanted.value.as_deref().unwrap_or(""))
            )
        }
        TolerationOperator::Exists => format!("{op} == 'Exists'"),
    };
    let seconds_ok = match wanted.toleration_seconds {
        Some(w) => format!("(!has({e}.tolerationSeconds) || {e}.tolerationSeconds >= {w})"),
        None => format!("!has({e}.tolerationSeconds)"),
    };
    format!("{key_ok} && {effect_ok} && {value_ok} && {seconds_ok}")
}

#[cfg(test)]
mod tests {
    use kube::core::cel::KubeCelExt;
    use kube::core::cel::cel::{Context, Program, Value as CelValue};
    use serde_json::json;

    use super::*;
    use crate::model::policy::TaintEffect;

    fn toleration(
        key: Option<&str>,
        op: Option<TolerationOperator>,
        value: Option<&str>,
        effect: Option<TaintEffect>,
        seconds: Option<i64>,
    ) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: op,
            value: value.map(Into::into),
            effect,
            toleration_seconds: seconds,
        }
    }

    /// The CEL guard says "already covered" exactly when the engine's `covers` does, over a
    /// grid of existing tolerations and wanted ones.
    #[test]
    fn the_cel_guard_agrees_with_the_engine() {
        use TaintEffect::{NoExecute, NoSchedule};
        use TolerationOperator::{Equal, Exists};
        let wanted = [
            toleration(Some("nvidia.com/gpu"), Some(Exists), None, Some(NoSchedule), None),
            toleration(Some("pool"), Some(Equal), Some("a100"), Some(NoSchedule), None),
            toleration(Some("pool"), None, Some("a\"b\\c'd"), None, None),
            toleration(Some("k"), Some(Exists), None, Some(NoExecute), Some(300)),
            toleration(None, Some(Exists), None, None, None),
        ];
        let existing = [
            json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
            json!({"key": "nvidia.com/gpu", "operator": "Exists"}),
            json!({"operator": "Exists"}),
            json!({"key": "", "operator": "Exists", "effect": "NoSchedule"}),
            json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}),
            json!({"key": "pool", "value": "a100", "effect": "NoSchedule"}),
            json!({"key": "pool", "operator": "Equal", "value": "a100"}),
            json!({"key": "pool", "operator": "Equal", "value": "h100"}),
            json!({"key": "pool", "value": "a\"b\\c'd"}),
            json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600}),
            json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}),
            json!({"key": "k", "operator": "Exists", "effect": "NoExecute"}),
        ];
        let mut covered = 0;
        for w in &wanted {
            let program = Program::compile(&covers("e", w)).expect("parses");
            for e in &existing {
                let mut ctx = Context::default();
                ctx.register_all();
                ctx.add_variable_from_value("e", crate::model::expression::json_to_cel(e));
                let native = program.execute(&ctx).unwrap_or_else(|err| panic!("{err}: {e} / {w:?}"));
                let engine = crate::admission::mutate::covers(e, w);
                assert_eq!(native, CelValue::Bool(engine), "existing {e}, wanted {w:?}");
                covered += usize::from(engine);
            }
        }
        assert!(covered > 5 && covered < wanted.len() * existing.len(), "both answers occur ({covered})");
        // The whole patch expression parses too, quotes and backslashes included.
        for w in &wanted {
            Program::compile(&toleration_patch(w)).unwrap_or_else(|e| panic!("{e}: {}", toleration_patch(w)));
        }
    }
}
