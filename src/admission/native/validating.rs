//! ValidatingAdmissionPolicies: the accelerator checks, the team's priority classes and CEL
//! Rules, on Pods and on every Pod template Allot knows.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};

use super::cel::{self, Bindings};
use super::{
    Compiled, Coverage, Line, NativeObject, Part, PodSource, Subject, condition, match_resources, metadata,
    not_kubelet, object_name, pod_sources, variable,
};
use crate::admission::finding::Check;
use crate::model::policy::{Action, KindMatch, Operation, PolicySet, Rule};
use crate::model::workload::WORKLOAD_KINDS;

/// The variable each Pod (or template) of `variables.allotPods` is bound to.
pub const POD: &str = "allotPod";

/// The VAP action a binding takes for an Allot action.
pub fn validation_action(action: Action) -> &'static str {
    match action {
        Action::Deny => "Deny",
        Action::Warn => "Warn",
        Action::Audit => "Audit",
    }
}

/// Emits a policy and its binding.
pub(super) fn emit(
    out: &mut Compiled,
    name: &str,
    action: Action,
    constraints: MatchResources,
    conditions: Vec<MatchCondition>,
    variables: Vec<Variable>,
    validations: Vec<Validation>,
) {
    let (conditions, guard) = super::namespace_guard(conditions);
    let validations = match guard {
        None => validations,
        Some(guard) => validations
            .into_iter()
            .map(|v| Validation { expression: format!("!({guard}) || ({})", v.expression), ..v })
            .collect(),
    };
    out.objects.push(NativeObject::ValidatingPolicy(ValidatingAdmissionPolicy {
        metadata: metadata(name),
        spec: Some(ValidatingAdmissionPolicySpec {
            // Like the webhook: a check that cannot be evaluated never lets an object through.
            failure_policy: Some("Fail".into()),
            match_constraints: Some(constraints),
            match_conditions: Some(conditions),
            variables: Some(variables),
            validations: Some(validations),
            ..Default::default()
        }),
        status: None,
    }));
    out.objects.push(NativeObject::ValidatingBinding(ValidatingAdmissionPolicyBinding {
        metadata: metadata(name),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name.to_string(),
            validation_actions: vec![validation_action(action).to_string()],
            ..Default::default()
        },
    }));
}

/// `variables.allotPods.all(allotPod, body)`, skipping templates without a spec.
fn every_pod(body: &str) -> String {
    format!("variables.allotPods.all({POD}, !has({POD}.spec) || ({body}))")
}

fn validation(body: &str, message: String) -> Validation {
    Validation { expression: every_pod(body), message: Some(message), ..Default::default() }
}

/// The built-in accelerator checks, one policy per action and Pod source.
pub(super) fn accelerator_checks(policies: &PolicySet, out: &mut Compiled) {
    let checks = &policies.checks;
    let accel = &policies.accelerators;
    let spec = format!("{POD}.spec");
    let all = cel::all_containers(&spec);
    let mut coverage = Coverage::new(Subject::AcceleratorChecks);
    // (action, check, body over allotPod, message)
    let mut wanted: Vec<(Action, Check, String, String)> = Vec::new();
    // The per-container checks' messages, in the engine's words at the first failing
    // container ([`container_message`]): (index in `wanted`, messageExpression).
    let mut message_expressions: Vec<(usize, String)> = Vec::new();
    if let Some(action) = checks.requests_equal_limits.and_then(|c| c.action()) {
        let m = cel::resource_matches(accel, "k");
        let unequal = "!(has(c.resources.limits) && k in c.resources.limits && \
             quantity(string(c.resources.requests[k])).compareTo(quantity(string(c.resources.limits[k]))) == 0)";
        let ok = format!(
            "!has(c.resources) || !has(c.resources.requests) || c.resources.requests.all(k, !{m} || !({unequal}))"
        );
        let detail = format!(
            "'container ' + c.name + ': ' + c.resources.requests.filter(k, {m} && {unequal}).map(k, \
             has(c.resources.limits) && k in c.resources.limits \
             ? k + ' request ' + string(c.resources.requests[k]) + ' must equal its limit ' + string(c.resources.limits[k]) \
             : k + ' is requested (' + string(c.resources.requests[k]) + ') without a limit; set limits.' + k + ': ' + \
             string(c.resources.requests[k]))[0]"
        );
        message_expressions.push((
            wanted.len(),
            container_message(Check::RequestsEqualLimits, &["containers", "initContainers"], &ok, &detail),
        ));
        wanted.push((
            action,
            Check::RequestsEqualLimits,
            format!("{all}.all(c, {ok})"),
            "every accelerator request must equal its limit".into(),
        ));
    }
    if let Some(action) = checks.whole_numbers.and_then(|c| c.action()) {
        let m = cel::resource_matches(accel, "k");
        let fractional = |f: &str| format!("{m} && !quantity(string(c.resources.{f}[k])).isInteger()");
        let field = |f: &str| {
            format!("(!has(c.resources) || !has(c.resources.{f}) || !c.resources.{f}.exists(k, {}))", fractional(f))
        };
        let ok = format!("{} && {}", field("requests"), field("limits"));
        // Requests first, then limits, as the engine reports them.
        let listed = |f: &str, kind: &str| {
            format!(
                "(has(c.resources) && has(c.resources.{f}) ? c.resources.{f}.filter(k, {}).map(k, k + ' {kind} ' + \
                 string(c.resources.{f}[k])) : [])",
                fractional(f)
            )
        };
        let detail = format!(
            "'container ' + c.name + ': ' + ({} + {})[0] + ' is not a whole number of devices'",
            listed("requests", "request"),
            listed("limits", "limit")
        );
        message_expressions.push((
            wanted.len(),
            container_message(Check::WholeNumbers, &["containers", "initContainers"], &ok, &detail),
        ));
        wanted.push((
            action,
            Check::WholeNumbers,
            format!("{all}.all(c, {ok})"),
            "accelerator amounts must be whole numbers of devices".into(),
        ));
    }
    if let Some(action) = checks.init_containers.and_then(|c| c.action()) {
        let ok = format!(
            "(has(c.restartPolicy) && c.restartPolicy == 'Always') || !{}",
            cel::container_names_any(accel, "c")
        );
        let m = cel::resource_matches(accel, "allotK");
        let names = "((has(c.resources) && has(c.resources.requests) ? c.resources.requests.map(allotK, allotK) : []) + \
                     (has(c.resources) && has(c.resources.limits) ? c.resources.limits.map(allotK, allotK) : []))";
        let detail = format!(
            "'init container ' + c.name + ' requests ' + [{names}].map(allotNames, lists.range(size(allotNames))\
             .filter(allotJ, allotNames.indexOf(allotNames[allotJ]) == allotJ).map(allotJ, allotNames[allotJ]))[0]\
             .filter(allotK, {m}).join(', ') + '; accelerators are not allowed in init containers'"
        );
        message_expressions
            .push((wanted.len(), container_message(Check::InitContainers, &["initContainers"], &ok, &detail)));
        wanted.push((
            action,
            Check::InitContainers,
            format!("!has({spec}.initContainers) || {spec}.initContainers.all(c, {ok})"),
            "accelerators are not allowed in init containers (native sidecars excepted)".into(),
        ));
    }
    if let (Some(check), Some(allowed)) = (&checks.allowed_resources, &policies.allowed_accelerators) {
        let (m, ok) = (cel::resource_matches(accel, "k"), cel::resource_matches(allowed, "k"));
        let field =
            |f: &str| format!("(!has(c.resources) || !has(c.resources.{f}) || c.resources.{f}.all(k, !{m} || {ok}))");
        let body = format!("{all}.all(c, {} && {})", field("requests"), field("limits"));
        let message = format!("only these accelerators may be requested: {}", check.names.join(", "));
        wanted.push((check.action, Check::AllowedResources, body, message));
    }
    if let Some(max) = &checks.max_per_container {
        for (name, limit) in &max.limits {
            let body = format!("{all}.all(c, !{})", container_exceeds("c", name, *limit));
            let message = format!("a container may ask at most {limit} {name}");
            wanted.push((max.action, Check::MaxPerContainer, body, message));
        }
    }
    if let Some(max) = &checks.max_per_pod {
        for (name, limit) in &max.limits {
            let units = cel::pod_resource_units(&spec, &cel::string(name));
            let body = format!("{units} <= {limit}");
            // The engine's words: what the first Pod (or template) over the limit asks in all,
            // at its spec's path. Each Pod's count is computed once, as in the check itself.
            let asks = format!("variables.allotPods.map({POD}, has({POD}.spec) ? {units} : 0)");
            message_expressions.push((
                wanted.len(),
                format!(
                    "[{asks}].map(allotAsks, lists.range(size(allotAsks)).filter(allotAt, allotAsks[allotAt] > {limit})\
                     .map(allotAt, '[accelerators/max-per-pod] ' + {} + 'pod asks ' + string(allotAsks[allotAt]) + {})[0])[0]",
                    spec_path_then(": "),
                    cel::string(&format!(" {name} in all; at most {limit} per pod"))
                ),
            ));
            let message = format!("pod asks more than {limit} {name} in all; at most {limit} per pod");
            wanted.push((max.action, Check::MaxPerPod, body, message));
        }
    }
    let (sources, unsupported) = pod_sources();
    for (kind, why) in unsupported.iter().map(|u| ("template", u)) {
        coverage.webhook_only.push(Line::whole(format!("{kind} {why}")));
    }
    for action in [Action::Deny, Action::Warn, Action::Audit] {
        let of_action: Vec<_> = wanted.iter().filter(|w| w.0 == action).collect();
        if of_action.is_empty() {
            continue;
        }
        for source in &sources {
            let name = object_name(&["allot-accelerators", action.label(), &source.suffix]);
            let validations = wanted
                .iter()
                .enumerate()
                .filter(|(_, w)| w.0 == action)
                .map(|(i, (_, check, body, message))| Validation {
                    message_expression: message_expressions.iter().find(|(at, _)| *at == i).map(|(_, m)| m.clone()),
                    ..validation(body, format!("[{}] {message}", check.id()))
                })
                .collect();
            emit(
                out,
                &name,
                action,
                match_resources(source.rules(&["CREATE", "UPDATE"])),
                vec![not_kubelet()],
                vec![variable("allotPods", source.pods.clone()), variable("allotPaths", source.paths.clone())],
                validations,
            );
        }
    }
    for (action, check, _, _) in &wanted {
        let id = check.id().trim_start_matches("accelerators/");
        coverage
            .compiled
            .push(Line::new(Part::Check(*check), format!("{id} ({}) on Pods and Pod templates", action.label())));
    }
    if !wanted.is_empty() || !coverage.webhook_only.is_empty() {
        out.coverage.push(coverage);
    }
}

/// CEL for a per-container check's message as the engine words it, at the first container
/// (over `lists`, in order) of the first Pod or template where `ok` (CEL over `c`) fails:
/// `[accelerators/…] spec.containers[0]: ` + `detail` (CEL over `c`). Each resource in a
/// container is one finding in the engine, in name order; this names the first CEL finds (the
/// same one for a container asking one accelerator). When it cannot be evaluated, the API
/// server falls back to the validation's static message.
fn container_message(check: Check, lists: &[&str], ok: &str, detail: &str) -> String {
    let spec_prefix = spec_path_then(".");
    let per_list: Vec<String> = lists
        .iter()
        .map(|list| {
            let c = format!("{POD}.spec.{list}[allotI]");
            format!(
                "(has({POD}.spec.{list}) ? lists.range(size({POD}.spec.{list})).filter(allotI, ![{c}].all(c, {ok}))\
                 .map(allotI, [{c}].map(c, {spec_prefix} + '{list}[' + string(allotI) + ']: ' + {detail})[0]) : [])"
            )
        })
        .collect();
    format!(
        "{} + lists.range(size(variables.allotPods)).map(allotAt, [variables.allotPods[allotAt]].map({POD}, \
         has({POD}.spec) ? {} : [])[0]).flatten()[0]",
        cel::string(&format!("[{}] ", check.id())),
        per_list.join(" + ")
    )
}

/// CEL: `message` (CEL over `allotAt`) for the first Pod or template of `variables.allotPods`
/// where `cond` (CEL over `allotPod`) holds, its index found once however often `message`
/// reads it.
fn at_first_pod(cond: &str, message: &str) -> String {
    format!(
        "[lists.range(size(variables.allotPods)).filter(allotAt, [variables.allotPods[allotAt]].all({POD}, {cond}))[0]]\
         .map(allotAt, {message})[0]"
    )
}

/// CEL: where the engine's findings about Pod `allotAt` start, a path into its spec followed
/// by `rest` (`: `, `.priorityClassName: `, `.`): `spec` for a Pod, `<template>.spec` for a
/// template, as `workload::PodView::spec_path`.
fn spec_path_then(rest: &str) -> String {
    format!(
        "(variables.allotPaths[allotAt] == '' ? {} : variables.allotPaths[allotAt] + {})",
        cel::string(&format!("spec{rest}")),
        cel::string(&format!(".spec{rest}"))
    )
}

/// CEL: the `path: ` before a Rule's message about Pod `allotAt`: its template's path, nothing
/// for a Pod itself.
const TEMPLATE_PREFIX: &str = "(variables.allotPaths[allotAt] == '' ? '' : variables.allotPaths[allotAt] + ': ')";

/// The container `c` asks more than `limit` of `name` (its request, else its limit; `asked >
/// limit` in whole units rounded up is `quantity > limit` for a whole limit).
fn container_exceeds(c: &str, name: &str, limit: u32) -> String {
    let (n, l) = (cel::string(name), cel::string(&limit.to_string()));
    format!(
        "(has({c}.resources) && ((has({c}.resources.requests) && {n} in {c}.resources.requests) ? \
         quantity(string({c}.resources.requests[{n}])).isGreaterThan(quantity({l})) : \
         (has({c}.resources.limits) && {n} in {c}.resources.limits && \
         quantity(string({c}.resources.limits[{n}])).isGreaterThan(quantity({l})))))"
    )
}

/// The team's allowed priority classes (the class a Pod ends up with, the cluster's
/// globalDefault when it names none), on Pods and templates; a team that lists none may use
/// any class but the system ones (`system-…`: the engine's `team/priority-class`).
pub(super) fn team_priority_classes(policies: &PolicySet, team: Result<&str, &str>, out: &mut Compiled) {
    if policies.teams.is_empty() {
        return;
    }
    let limited: Vec<_> = policies.teams.iter().filter(|t| t.priority.allowed.is_some()).collect();
    let mut coverage = Coverage::new(Subject::TeamPriorityClasses);
    let team = match team {
        Ok(t) => t,
        Err(why) => {
            coverage
                .webhook_only
                .push(Line::whole(format!("allowed classes per team: the team of a namespace: {why}")));
            out.coverage.push(coverage);
            return;
        }
    };
    let allowed: Vec<String> = limited
        .iter()
        .map(|t| {
            let mut classes = t.priority.allowed.clone().unwrap_or_default();
            classes.extend(t.priority.default.clone().filter(|d| !classes.contains(d)));
            format!("{}: {}", cel::string(&t.name), cel::string_list(&classes))
        })
        .collect();
    let class = match &policies.priority.global_default {
        Some(g) => format!(
            "(has({POD}.spec.priorityClassName) && {POD}.spec.priorityClassName != '' ? {POD}.spec.priorityClassName : {})",
            cel::string(g)
        ),
        None => format!("(has({POD}.spec.priorityClassName) ? {POD}.spec.priorityClassName : '')"),
    };
    // A team without a list: any class but a system one, its globalDefault aside (the parser
    // refuses a system default without a list), at CREATE: a workload admitted before the
    // check stays updatable (the webhook warns on its UPDATE; natively nothing is said).
    let open = match &policies.priority.global_default {
        Some(g) => {
            format!("request.operation == 'UPDATE' || !{class}.startsWith({SYSTEM}) || {class} == {}", cel::string(g))
        }
        None => format!("request.operation == 'UPDATE' || !{class}.startsWith({SYSTEM})"),
    };
    let body = format!(
        "{class} == '' || (variables.team in variables.allowedClasses ? {class} in \
         variables.allowedClasses[variables.team] : ({open}))"
    );
    // The engine's words: the classes the team lists (its default aside), the class asked, at
    // the first Pod or template that asks one outside them.
    let listed: Vec<String> = limited
        .iter()
        .map(|t| {
            format!(
                "{}: {}",
                cel::string(&t.name),
                cel::string(&t.priority.allowed.clone().unwrap_or_default().join(", "))
            )
        })
        .collect();
    let asked = format!("[variables.allotPods[allotAt]].map({POD}, {class})[0]");
    let system_words = format!(
        "{asked} + {} + variables.team + {} + {asked} + {}",
        cel::string(
            " is a system priority class, kept for the cluster's own components: a pod at it would preempt every \
             other team's pods; team "
        ),
        cel::string(" lists no allowed classes, which allows any class but the system ones (list "),
        cel::string(" in the team's priority.allowed to permit it)")
    );
    let message_expression = at_first_pod(
        &format!("has({POD}.spec) && !({body})"),
        &format!(
            "'[team/priority-class] ' + {} + (variables.team in variables.allowedClasses ? 'team ' + variables.team + \
             ' may use priority classes ' + {{{}}}[variables.team] + '; this pod asks ' + {asked} : {system_words})",
            spec_path_then(".priorityClassName: "),
            listed.join(", ")
        ),
    );
    let (sources, _) = pod_sources();
    for source in &sources {
        let name = object_name(&["allot-team-priority-classes", &source.suffix]);
        let v = Validation {
            expression: every_pod(&body),
            message_expression: Some(message_expression.clone()),
            message: Some("[team/priority-class] this team may not use this priority class".into()),
            ..Default::default()
        };
        emit(
            out,
            &name,
            Action::Deny,
            match_resources(source.rules(&["CREATE", "UPDATE"])),
            vec![not_kubelet(), condition("namespace-of-a-team", format!("{team} != ''"))],
            vec![
                variable("team", team),
                variable("allowedClasses", format!("{{{}}}", allowed.join(", "))),
                variable("allotPods", source.pods.clone()),
                variable("allotPaths", source.paths.clone()),
            ],
            vec![v],
        );
    }
    for t in &policies.teams {
        coverage.compiled.push(Line::whole(match t.priority.allowed {
            Some(_) => format!("team {}: allowed priority classes on Pods and Pod templates", t.name),
            None => format!(
                "team {}: no system priority class on Pods and Pod templates at CREATE (the webhook also warns on a \
                 workload UPDATE)",
                t.name
            ),
        }));
    }
    out.coverage.push(coverage);
}

/// The CEL string of [`crate::model::policy::SYSTEM_PRIORITY_PREFIX`].
const SYSTEM: &str = "'system-'";

/// A CEL Rule: one policy per Pod source (kinds: [Pod]) or one for the named kind.
pub(super) fn rule(policies: &PolicySet, rule: &Rule, team: Result<&str, &str>, out: &mut Compiled) {
    let mut coverage = Coverage::new(Subject::Rule(rule.name.clone()));
    match compile_rule(policies, rule, team, out) {
        Ok(line) => coverage.compiled.push(Line::whole(line)),
        Err(why) => coverage.webhook_only.push(Line::whole(why)),
    }
    out.coverage.push(coverage);
}

fn compile_rule(
    policies: &PolicySet,
    rule: &Rule,
    team: Result<&str, &str>,
    out: &mut Compiled,
) -> Result<String, String> {
    let accelerators = &*policies.accelerators;
    let spec = &rule.spec;
    let needs_team = !spec.rule_match.teams.is_empty() || mentions(rule, "team");
    let team = match (needs_team, team) {
        (true, Err(why)) => return Err(format!("the team of a namespace: {why}")),
        (_, Ok(t)) => t,
        (false, Err(_)) => "''",
    };
    let operations: Vec<&str> = spec
        .rule_match
        .operations
        .iter()
        .map(|o| match o {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        })
        .collect();
    let mut conditions = vec![not_kubelet()];
    if let Some(scope) = cel::scope(&rule.namespaces, &spec.rule_match.teams, team)? {
        conditions.push(condition("scope", scope));
    }
    // Every target first, so a rule is emitted whole or not at all.
    // (object-name suffix, what it matches, (Pods, their paths), bindings)
    let mut targets: Vec<(String, MatchResources, (String, String), Bindings<'_>)> = Vec::new();
    let (sources, unsupported) = pod_sources();
    for kind in &rule.kinds {
        match kind {
            KindMatch::Any => return Err("matches every kind (`*`): no finite list of resources to bind".into()),
            KindMatch::Pods => {
                if let Some(u) = unsupported.first() {
                    return Err(format!("template {u}"));
                }
                for source in &sources {
                    let old = source.is_pod.then_some("oldObject");
                    targets.push((
                        source.suffix.clone(),
                        match_resources(source.rules(&operations)),
                        (source.pods.clone(), source.paths.clone()),
                        Bindings { object: POD, old_object: old, accelerators },
                    ));
                }
            }
            KindMatch::Kind { group, kind } => {
                let rows: Vec<_> = WORKLOAD_KINDS
                    .iter()
                    .filter(|w| w.kind == kind && group.as_deref().is_none_or(|g| g == w.group))
                    .collect();
                if rows.is_empty() {
                    return Err(format!("kind {kind} is not in Allot's workload table: its resource name is unknown"));
                }
                for w in rows {
                    let source = PodSource {
                        // The group too: `Job` alone names batch/Job and Volcano's Job.
                        suffix: object_name(&["kind", w.group, w.kind]),
                        resources: vec![(w.group, super::plural(w.kind))],
                        pods: "[object]".into(),
                        paths: "['']".into(),
                        is_pod: true,
                    };
                    targets.push((
                        source.suffix.clone(),
                        match_resources(source.rules(&operations)),
                        (source.pods.clone(), source.paths.clone()),
                        Bindings { object: POD, old_object: Some("oldObject"), accelerators },
                    ));
                }
            }
        }
    }
    let mut emitted = Vec::new();
    let mut objects = Compiled { objects: Vec::new(), coverage: Vec::new() };
    for (suffix, constraints, (pods, paths), bindings) in targets {
        let expression = cel::rewrite(rule.expression.source(), bindings)?;
        // The first Pod or template the rule fails on, and the engine's path for it (a
        // template's findings read `spec.template: message`, a Pod's just the message).
        let failing = "variables.allotPods[allotAt]";
        let message = spec.message.clone().unwrap_or_else(|| format!("failed {}", rule.expression.source()));
        let text = match &rule.message_expression {
            Some(m) => format!("({})", cel::rewrite(m.source(), Bindings { object: failing, ..bindings })?),
            None => cel::string(&message),
        };
        let v = Validation {
            expression: format!("variables.allotPods.all({POD}, {expression})"),
            message: Some(message),
            message_expression: Some(at_first_pod(&format!("!({expression})"), &format!("{TEMPLATE_PREFIX} + {text}"))),
            ..Default::default()
        };
        let name = object_name(&["allot-rule", &rule.name, &suffix]);
        emit(
            &mut objects,
            &name,
            spec.action,
            constraints,
            conditions.clone(),
            vec![
                variable("namespaceName", "request.namespace"),
                variable("team", team),
                variable("allotPods", pods),
                variable("allotPaths", paths),
            ],
            vec![v],
        );
        emitted.push(suffix);
    }
    out.objects.extend(objects.objects);
    Ok(format!("{} on {} ({})", spec.action.label(), emitted.join(", "), operations.join(", ")))
}

fn mentions(rule: &Rule, word: &str) -> bool {
    let has = |s: &str| s.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').any(|w| w == word);
    rule.expressions().any(|e| has(e.source()))
}
