//! ValidatingAdmissionPolicies: the accelerator checks, the team's priority classes and CEL
//! Rules, on Pods and on every Pod template Allot knows.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};

use super::cel::{self, Bindings, Unsupported};
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

/// One accelerator check as a validation over `allotPod`: its static message and, where the
/// engine words it per container or per pod, the CEL for those words.
struct Wanted {
    action: Action,
    check: Check,
    body: String,
    message: String,
    message_expression: Option<String>,
}

impl Wanted {
    /// A check of every container of every Pod (init containers too): `ok` and the engine's
    /// `detail` are CEL over `c` ([`container_message`]).
    fn every_container(action: Action, check: Check, ok: &str, detail: &str, message: &str) -> Wanted {
        Wanted {
            action,
            check,
            body: format!("{}.all(c, {ok})", all_pod_containers()),
            message: message.into(),
            message_expression: Some(container_message(check, &["containers", "initContainers"], ok, detail)),
        }
    }
}

/// The accelerator checks, in the engine's order: each gives its validations when configured.
const ACCELERATOR_CHECKS: [fn(&PolicySet) -> Vec<Wanted>; 6] =
    [requests_equal_limits, whole_numbers, init_containers, allowed_resources, max_per_container, max_per_pod];

/// The built-in accelerator checks, one policy per action and Pod source.
pub(super) fn accelerator_checks(policies: &PolicySet, out: &mut Compiled) {
    let wanted: Vec<Wanted> = ACCELERATOR_CHECKS.iter().flat_map(|check| check(policies)).collect();
    let mut coverage = Coverage::new(Subject::AcceleratorChecks);
    let (sources, unsupported) = pod_sources();
    for (kind, why) in unsupported.iter().map(|u| ("template", u)) {
        coverage.webhook_only.push(Line::whole(format!("{kind} {why}")));
    }
    for action in [Action::Deny, Action::Warn, Action::Audit] {
        if !wanted.iter().any(|w| w.action == action) {
            continue;
        }
        for source in &sources {
            let name = object_name(&["allot-accelerators", action.label(), &source.suffix]);
            let validations = wanted
                .iter()
                .filter(|w| w.action == action)
                .map(|w| Validation {
                    message_expression: w.message_expression.clone(),
                    ..validation(&w.body, format!("[{}] {}", w.check.id(), w.message))
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
    for w in &wanted {
        let id = w.check.id().trim_start_matches("accelerators/");
        coverage
            .compiled
            .push(Line::new(Part::Check(w.check), format!("{id} ({}) on Pods and Pod templates", w.action.label())));
    }
    if !wanted.is_empty() || !coverage.webhook_only.is_empty() {
        out.coverage.push(coverage);
    }
}

/// CEL: every container of `allotPod` (init containers included).
fn all_pod_containers() -> String {
    cel::all_containers(&format!("{POD}.spec"))
}

/// `accelerators/requests-equal-limits`.
fn requests_equal_limits(policies: &PolicySet) -> Vec<Wanted> {
    let Some(action) = policies.checks.requests_equal_limits.and_then(|c| c.action()) else {
        return Vec::new();
    };
    let m = cel::resource_matches(&policies.accelerators, "k");
    let unequal = "!(has(c.resources.limits) && k in c.resources.limits && \
         quantity(string(c.resources.requests[k])).compareTo(quantity(string(c.resources.limits[k]))) == 0)";
    let ok =
        format!("!has(c.resources) || !has(c.resources.requests) || c.resources.requests.all(k, !{m} || !({unequal}))");
    let detail = format!(
        "'container ' + c.name + ': ' + c.resources.requests.filter(k, {m} && {unequal}).map(k, \
         has(c.resources.limits) && k in c.resources.limits \
         ? k + ' request ' + string(c.resources.requests[k]) + ' must equal its limit ' + string(c.resources.limits[k]) \
         : k + ' is requested (' + string(c.resources.requests[k]) + ') without a limit; set limits.' + k + ': ' + \
         string(c.resources.requests[k]))[0]"
    );
    vec![Wanted::every_container(
        action,
        Check::RequestsEqualLimits,
        &ok,
        &detail,
        "every accelerator request must equal its limit",
    )]
}

/// `accelerators/whole-numbers`.
fn whole_numbers(policies: &PolicySet) -> Vec<Wanted> {
    let Some(action) = policies.checks.whole_numbers.and_then(|c| c.action()) else {
        return Vec::new();
    };
    let m = cel::resource_matches(&policies.accelerators, "k");
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
    vec![Wanted::every_container(
        action,
        Check::WholeNumbers,
        &ok,
        &detail,
        "accelerator amounts must be whole numbers of devices",
    )]
}

/// `accelerators/init-containers`: native sidecars (`restartPolicy: Always`) excepted.
fn init_containers(policies: &PolicySet) -> Vec<Wanted> {
    let Some(action) = policies.checks.init_containers.and_then(|c| c.action()) else {
        return Vec::new();
    };
    let accel = &policies.accelerators;
    let ok =
        format!("(has(c.restartPolicy) && c.restartPolicy == 'Always') || !{}", cel::container_names_any(accel, "c"));
    let m = cel::resource_matches(accel, "allotK");
    let names = "((has(c.resources) && has(c.resources.requests) ? c.resources.requests.map(allotK, allotK) : []) + \
                 (has(c.resources) && has(c.resources.limits) ? c.resources.limits.map(allotK, allotK) : []))";
    let detail = format!(
        "'init container ' + c.name + ' requests ' + [{names}].map(allotNames, lists.range(size(allotNames))\
         .filter(allotJ, allotNames.indexOf(allotNames[allotJ]) == allotJ).map(allotJ, allotNames[allotJ]))[0]\
         .filter(allotK, {m}).join(', ') + '; accelerators are not allowed in init containers'"
    );
    let check = Check::InitContainers;
    vec![Wanted {
        action,
        check,
        body: format!("!has({POD}.spec.initContainers) || {POD}.spec.initContainers.all(c, {ok})"),
        message: "accelerators are not allowed in init containers (native sidecars excepted)".into(),
        message_expression: Some(container_message(check, &["initContainers"], &ok, &detail)),
    }]
}

/// `accelerators/allowed-resources`.
fn allowed_resources(policies: &PolicySet) -> Vec<Wanted> {
    let (Some(check), Some(allowed)) = (&policies.checks.allowed_resources, &policies.allowed_accelerators) else {
        return Vec::new();
    };
    let (m, ok) = (cel::resource_matches(&policies.accelerators, "k"), cel::resource_matches(allowed, "k"));
    let field =
        |f: &str| format!("(!has(c.resources) || !has(c.resources.{f}) || c.resources.{f}.all(k, !{m} || {ok}))");
    vec![Wanted {
        action: check.action,
        check: Check::AllowedResources,
        body: format!("{}.all(c, {} && {})", all_pod_containers(), field("requests"), field("limits")),
        message: format!("only these accelerators may be requested: {}", check.names.join(", ")),
        message_expression: None,
    }]
}

/// `accelerators/max-per-container`: one validation per limited resource.
fn max_per_container(policies: &PolicySet) -> Vec<Wanted> {
    let Some(max) = &policies.checks.max_per_container else {
        return Vec::new();
    };
    let all = all_pod_containers();
    (max.limits.iter())
        .map(|(name, limit)| Wanted {
            action: max.action,
            check: Check::MaxPerContainer,
            body: format!("{all}.all(c, !{})", container_exceeds("c", name, *limit)),
            message: format!("a container may ask at most {limit} {name}"),
            message_expression: None,
        })
        .collect()
}

/// `accelerators/max-per-pod`: one validation per limited resource, in the engine's words:
/// what the first Pod (or template) over the limit asks in all, at its spec's path. Each
/// Pod's count is computed once, as in the check itself.
fn max_per_pod(policies: &PolicySet) -> Vec<Wanted> {
    let Some(max) = &policies.checks.max_per_pod else {
        return Vec::new();
    };
    let spec = format!("{POD}.spec");
    (max.limits.iter())
        .map(|(name, limit)| {
            let units = cel::pod_resource_units(&spec, &cel::string(name));
            let asks = format!("variables.allotPods.map({POD}, has({POD}.spec) ? {units} : 0)");
            let message_expression = format!(
                "[{asks}].map(allotAsks, lists.range(size(allotAsks)).filter(allotAt, allotAsks[allotAt] > {limit})\
                 .map(allotAt, '[accelerators/max-per-pod] ' + {} + 'pod asks ' + string(allotAsks[allotAt]) + {})[0])[0]",
                spec_path_then(": "),
                cel::string(&format!(" {name} in all; at most {limit} per pod"))
            );
            Wanted {
                action: max.action,
                check: Check::MaxPerPod,
                body: format!("{units} <= {limit}"),
                message: format!("pod asks more than {limit} {name} in all; at most {limit} per pod"),
                message_expression: Some(message_expression),
            }
        })
        .collect()
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
pub(super) fn team_priority_classes(policies: &PolicySet, team: Result<&str, &Unsupported>, out: &mut Compiled) {
    if policies.teams.is_empty() {
        return;
    }
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
    let limited: Vec<_> = policies.teams.iter().filter(|t| t.priority.allowed.is_some()).collect();
    let allowed: Vec<String> = limited
        .iter()
        .map(|t| {
            let mut classes = t.priority.allowed.clone().unwrap_or_default();
            classes.extend(t.priority.default.clone().filter(|d| !classes.contains(d)));
            format!("{}: {}", cel::string(&t.name), cel::string_list(&classes))
        })
        .collect();
    let (class, body) = priority_class_check(policies);
    let v = Validation {
        expression: every_pod(&body),
        message_expression: Some(priority_class_words(&limited, &class, &body)),
        message: Some("[team/priority-class] this team may not use this priority class".into()),
        ..Default::default()
    };
    let (sources, _) = pod_sources();
    for source in &sources {
        let name = object_name(&["allot-team-priority-classes", &source.suffix]);
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
            vec![v.clone()],
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

/// CEL over `allotPod`: the class a Pod ends up with (the cluster's globalDefault when it
/// names none), and the check that its team may use it.
fn priority_class_check(policies: &PolicySet) -> (String, String) {
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
    (class, body)
}

/// CEL: the engine's words for the first Pod or template whose `class` fails `body`: the
/// classes its team lists (`limited` teams; the default aside) and the class asked, or why a
/// system class is refused to a team that lists none.
fn priority_class_words(limited: &[&crate::model::policy::Team], class: &str, body: &str) -> String {
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
    at_first_pod(
        &format!("has({POD}.spec) && !({body})"),
        &format!(
            "'[team/priority-class] ' + {} + (variables.team in variables.allowedClasses ? 'team ' + variables.team + \
             ' may use priority classes ' + {{{}}}[variables.team] + '; this pod asks ' + {asked} : {system_words})",
            spec_path_then(".priorityClassName: "),
            listed.join(", ")
        ),
    )
}

/// The CEL string of [`crate::model::policy::SYSTEM_PRIORITY_PREFIX`].
const SYSTEM: &str = "'system-'";

/// A CEL Rule: one policy per Pod source (kinds: [Pod]) or one for the named kind.
pub(super) fn rule(policies: &PolicySet, rule: &Rule, team: Result<&str, &Unsupported>, out: &mut Compiled) {
    let mut coverage = Coverage::new(Subject::Rule(rule.name.clone()));
    match compile_rule(policies, rule, team, out) {
        Ok(line) => coverage.compiled.push(Line::whole(line)),
        Err(why) => coverage.webhook_only.push(Line::whole(why.to_string())),
    }
    out.coverage.push(coverage);
}

fn compile_rule(
    policies: &PolicySet,
    rule: &Rule,
    team: Result<&str, &Unsupported>,
    out: &mut Compiled,
) -> Result<String, Unsupported> {
    let spec = &rule.spec;
    let needs_team = !spec.rule_match.teams.is_empty() || mentions(rule, "team");
    let team = match (needs_team, team) {
        (true, Err(why)) => return Err(Unsupported::Team(Box::new(why.clone()))),
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
    let mut emitted = Vec::new();
    let mut objects = Compiled { objects: Vec::new(), coverage: Vec::new() };
    for target in rule_targets(rule, &operations, &policies.accelerators)? {
        let name = object_name(&["allot-rule", &rule.name, &target.suffix]);
        emit(
            &mut objects,
            &name,
            spec.action,
            target.constraints,
            conditions.clone(),
            vec![
                variable("namespaceName", "request.namespace"),
                variable("team", team),
                variable("allotPods", target.pods),
                variable("allotPaths", target.paths),
            ],
            vec![rule_validation(rule, target.bindings)?],
        );
        emitted.push(target.suffix);
    }
    out.objects.extend(objects.objects);
    Ok(format!("{} on {} ({})", spec.action.label(), emitted.join(", "), operations.join(", ")))
}

/// Where a Rule is bound: one Pod source, or one workload kind of the table.
struct RuleTarget<'a> {
    /// The object name's suffix.
    suffix: String,
    constraints: MatchResources,
    /// CEL: the Pods (or templates) checked, and their paths.
    pods: String,
    paths: String,
    bindings: Bindings<'a>,
}

/// Every target of `rule`'s kinds, or why one cannot be bound.
fn rule_targets<'a>(
    rule: &Rule,
    operations: &[&str],
    accelerators: &'a crate::model::resources::ResourceMatcher,
) -> Result<Vec<RuleTarget<'a>>, Unsupported> {
    let target = |source: PodSource, old_object| RuleTarget {
        constraints: match_resources(source.rules(operations)),
        bindings: Bindings { object: POD, old_object, accelerators },
        suffix: source.suffix,
        pods: source.pods,
        paths: source.paths,
    };
    let mut targets = Vec::new();
    let (sources, unsupported) = pod_sources();
    for kind in &rule.kinds {
        match kind {
            KindMatch::Any => return Err(Unsupported::EveryKind),
            KindMatch::Pods => {
                if let Some(u) = unsupported.first() {
                    return Err(Unsupported::Template(u.clone()));
                }
                for source in &sources {
                    let old = source.is_pod.then_some("oldObject");
                    targets.push(target(source.clone(), old));
                }
            }
            KindMatch::Kind { group, kind } => {
                let rows: Vec<_> = WORKLOAD_KINDS
                    .iter()
                    .filter(|w| w.kind == kind && group.as_deref().is_none_or(|g| g == w.group))
                    .collect();
                if rows.is_empty() {
                    return Err(Unsupported::UnknownKind(kind.clone()));
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
                    targets.push(target(source, Some("oldObject")));
                }
            }
        }
    }
    Ok(targets)
}

/// A Rule's validation: its expression over every Pod, and its message in the engine's words
/// at the first Pod or template it fails on (a template's findings read
/// `spec.template: message`, a Pod's just the message).
fn rule_validation(rule: &Rule, bindings: Bindings<'_>) -> Result<Validation, Unsupported> {
    let expression = cel::rewrite(rule.expression.source(), bindings)?;
    let failing = "variables.allotPods[allotAt]";
    let message = rule.spec.message.clone().unwrap_or_else(|| format!("failed {}", rule.expression.source()));
    let text = match &rule.message_expression {
        Some(m) => format!("({})", cel::rewrite(m.source(), Bindings { object: failing, ..bindings })?),
        None => cel::string(&message),
    };
    Ok(Validation {
        expression: format!("variables.allotPods.all({POD}, {expression})"),
        message: Some(message),
        message_expression: Some(at_first_pod(&format!("!({expression})"), &format!("{TEMPLATE_PREFIX} + {text}"))),
        ..Default::default()
    })
}

fn mentions(rule: &Rule, word: &str) -> bool {
    let has = |s: &str| s.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').any(|w| w == word);
    rule.expressions().any(|e| has(e.source()))
}
