//! Validation: the built-in accelerator checks, the team's priority classes and CEL rules.
//! Pure functions over a Pod (or Pod template seen as a Pod) and the policy set.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::expression::Bindings;
use crate::finding::Finding;
use crate::gang::directory::{GangDirectory, Peer, disagreement};
use crate::gang::membership::{Membership, PodFacts};
use crate::namespaces::TeamLookup;
use crate::policy::{Action, Operation, PolicySet, QuotaMode, Rule};
use crate::quota::{QuotaBook, QuotaRequest};
use crate::request::Request;
use crate::resources::{self, ContainerResources, accelerators_only};
use crate::workload::PodView;

/// Runs the built-in accelerator checks and the team priority check on one Pod view.
pub fn check_pod(policies: &PolicySet, view: &PodView<'_>, team: &TeamLookup<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    let Some(spec) = view.pod.get("spec") else {
        return findings;
    };
    let spec_path = view.spec_path();
    let accel = &policies.accelerators;
    let checks = &policies.checks;
    let finding = |rule: &str, action: Action, path: String, message: String| Finding {
        rule: format!("accelerators/{rule}"),
        action,
        path,
        message,
    };

    for (path, container, is_init) in resources::containers(spec, &spec_path) {
        let mut bad = Vec::new();
        let res = ContainerResources::from_container(container, &path, &mut bad);
        for b in bad.iter().filter(|b| accel_path(&b.path, accel)) {
            findings.push(finding("quantity", Action::Deny, b.path.clone(), b.error.to_string()));
        }
        let requests = accelerators_only(&res.requests, accel);
        let limits = accelerators_only(&res.limits, accel);
        let names: BTreeSet<&String> = requests.keys().chain(limits.keys()).collect();
        if names.is_empty() {
            continue;
        }
        let cname = container.get("name").and_then(Value::as_str).unwrap_or("?");

        if let Some(action) = checks.requests_equal_limits.and_then(|c| c.action()) {
            for name in &names {
                match (requests.get(*name), limits.get(*name)) {
                    (Some(r), Some(l)) if r != l => findings.push(finding(
                        "requests-equal-limits",
                        action,
                        path.clone(),
                        format!("container {cname}: {name} request {r} must equal its limit {l}"),
                    )),
                    (Some(r), None) => findings.push(finding(
                        "requests-equal-limits",
                        action,
                        path.clone(),
                        format!("container {cname}: {name} is requested ({r}) without a limit; set limits.{name}: {r}"),
                    )),
                    // A limit alone is fine: the API server defaults the request to it.
                    _ => {}
                }
            }
        }
        if let Some(action) = checks.whole_numbers.and_then(|c| c.action()) {
            for (kind, list) in [("request", &requests), ("limit", &limits)] {
                for (name, q) in list.iter().filter(|(_, q)| !q.is_whole()) {
                    findings.push(finding(
                        "whole-numbers",
                        action,
                        path.clone(),
                        format!("container {cname}: {name} {kind} {q} is not a whole number of devices"),
                    ));
                }
            }
        }
        if is_init
            && !resources::is_sidecar(container)
            && let Some(action) = checks.init_containers.and_then(|c| c.action())
        {
            let list: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            findings.push(finding(
                "init-containers",
                action,
                path.clone(),
                format!(
                    "init container {cname} requests {}; accelerators are not allowed in init containers",
                    list.join(", ")
                ),
            ));
        }
        if let (Some(check), Some(allowed)) = (&checks.allowed_resources, &policies.allowed_accelerators) {
            for name in names.iter().filter(|n| !allowed.matches(n)) {
                findings.push(finding(
                    "allowed-resources",
                    check.action,
                    path.clone(),
                    format!(
                        "container {cname}: {name} is not an allowed accelerator (allowed: {})",
                        check.names.join(", ")
                    ),
                ));
            }
        }
        if let Some(max) = &checks.max_per_container {
            let effective = res.effective_requests();
            for (name, limit) in &max.limits {
                let asked = effective.get(name).map_or(0, |q| q.ceil_units());
                if asked > i64::from(*limit) {
                    findings.push(finding(
                        "max-per-container",
                        max.action,
                        path.clone(),
                        format!("container {cname} asks {asked} {name}; at most {limit} per container"),
                    ));
                }
            }
        }
    }
    if let Some(max) = &checks.max_per_pod {
        let total = resources::pod_requests(spec);
        for (name, limit) in &max.limits {
            let asked = total.get(name).map_or(0, |q| q.ceil_units());
            if asked > i64::from(*limit) {
                findings.push(finding(
                    "max-per-pod",
                    max.action,
                    spec_path.clone(),
                    format!("pod asks {asked} {name} in all; at most {limit} per pod"),
                ));
            }
        }
    }
    findings.extend(check_priority_class(policies, view, team));
    findings
}

fn accel_path(path: &str, accel: &resources::ResourceMatcher) -> bool {
    path.rsplit_once('[').and_then(|(_, n)| n.strip_suffix(']')).is_some_and(|n| accel.matches(n))
}

/// The gang of a Pod view, computed once per view and shared by the gang and quota checks.
pub fn pod_gang(
    policies: &PolicySet,
    view: &PodView<'_>,
    namespace: &str,
    team: &TeamLookup<'_>,
) -> Result<Option<Membership>, String> {
    policies.gang_of(&PodFacts::from_json(&view.pod), namespace, team.team.map(|t| t.name.as_str()))
}

/// Where a Pod view's metadata is (`metadata`, `spec.template.metadata`).
fn metadata_path(view_path: &str) -> String {
    if view_path.is_empty() { "metadata".to_string() } else { format!("{view_path}.metadata") }
}

/// The denial of invalid gang metadata (`allot.dev/gang-size: zero`).
pub fn gang_metadata_finding(view_path: &str, message: String) -> Finding {
    Finding { rule: "gang/metadata".into(), action: Action::Deny, path: metadata_path(view_path), message }
}

/// Gang metadata: a valid size, and (for Pods) agreement with the members that exist.
pub fn check_gang(
    view: &PodView<'_>,
    namespace: &str,
    gang: &Result<Option<Membership>, String>,
    directory: &dyn GangDirectory,
) -> Option<Finding> {
    match gang {
        Err(message) => Some(gang_metadata_finding(&view.path, message.clone())),
        Ok(Some(gang)) if view.path.is_empty() => {
            let me = Peer::of(&view.pod, gang);
            disagreement(&format!("{namespace}/{}", gang.name), &me, &directory.peers(namespace, &gang.name)).map(
                |message| Finding {
                    rule: "gang/consistency".into(),
                    action: Action::Deny,
                    path: metadata_path(""),
                    message,
                },
            )
        }
        Ok(_) => None,
    }
}

/// Deny-mode team quota. A Pod at CREATE is charged against live usage (`book`); a workload's
/// templates — and UPDATEs — only against the quota itself: a template that alone exceeds it
/// can never run.
pub fn check_quota(
    view: &PodView<'_>,
    gang: Option<&Membership>,
    req: &Request<'_>,
    team: &TeamLookup<'_>,
    book: &dyn QuotaBook,
) -> Option<Finding> {
    let t = team.team?;
    let quota = t.quota.as_ref().filter(|q| q.mode == QuotaMode::Deny)?;
    let spec = view.pod.get("spec")?;
    let requests = resources::pod_requests(spec);
    let charge = quota.charge(&requests);
    let gang = gang.and_then(|g| g.size.map(|n| (g.name.as_str(), n)));
    // A gang member asking nothing still takes one of its gang's declared places (and so
    // changes what the others are charged): the book must count it.
    if charge.is_empty() && gang.is_none() {
        return None;
    }
    let pod = view.pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let (uid, namespace, dry_run) = (req.uid, req.namespace, req.dry_run);
    let request = QuotaRequest { uid, team: &t.name, namespace, pod, charge, requests, gang, dry_run };
    let refusal = book.admit(quota, &request).err()?;
    Some(Finding {
        rule: "team/quota".into(),
        action: Action::Deny,
        path: view.spec_path(),
        message: refusal.message(&t.name),
    })
}

fn check_priority_class(policies: &PolicySet, view: &PodView<'_>, team: &TeamLookup<'_>) -> Option<Finding> {
    let t = team.team?;
    let allowed = t.priority.allowed.as_ref()?;
    let class = view.pod.pointer("/spec/priorityClassName").and_then(Value::as_str).filter(|c| !c.is_empty());
    let class = class.or(policies.priority.global_default.as_deref())?;
    if allowed.iter().any(|a| a == class) || t.priority.default.as_deref() == Some(class) {
        return None;
    }
    Some(Finding {
        rule: "team/priority-class".into(),
        action: Action::Deny,
        path: format!("{}.priorityClassName", view.spec_path()),
        message: format!("team {} may use priority classes {}; this pod asks {class}", t.name, allowed.join(", ")),
    })
}

/// What a rule is being matched against.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub operation: Operation,
    pub namespace: &'a str,
    pub team: Option<&'a str>,
    pub group: &'a str,
    pub kind: &'a str,
    /// True for a Pod or a Pod template seen as a Pod.
    pub is_pod: bool,
    /// Path of the object inside the reviewed object (empty for the object itself).
    pub path: &'a str,
}

fn rule_matches(rule: &Rule, target: &Target<'_>) -> bool {
    rule.spec.rule_match.operations.contains(&target.operation)
        && rule.namespaces.in_scope(&rule.spec.rule_match.teams, target.namespace, target.team)
        && rule.kinds.iter().any(|k| k.matches(target.group, target.kind, target.is_pod))
}

/// True when some rule could look at objects of this kind itself (not at Pod templates).
pub fn rules_for_kind(policies: &PolicySet, group: &str, kind: &str) -> bool {
    policies.rules.iter().flat_map(|r| &r.kinds).any(|k| k.matches(group, kind, false))
}

/// The rules that apply to this target, in policy order.
pub fn matching_rules<'p>(policies: &'p PolicySet, target: &Target<'_>) -> Vec<&'p Rule> {
    policies.rules.iter().filter(|r| rule_matches(r, target)).collect()
}

/// The variables these rules read (only those are bound).
pub fn rule_vars(rules: &[&Rule]) -> crate::expression::VarSet {
    rules
        .iter()
        .map(|r| r.expression.vars() | r.message_expression.as_ref().map_or(0, |m| m.vars()))
        .fold(0, |a, b| a | b)
}

/// Evaluates the matching CEL rules. An expression that errors counts as failed: a rule that
/// cannot be evaluated must never let an object through silently.
pub fn run_rules(policies: &PolicySet, rules: &[&Rule], target: &Target<'_>, bindings: &Bindings) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut scope = None;
    for rule in rules {
        let ctx = scope.get_or_insert_with(|| policies.env.scope(bindings));
        let mut action = rule.spec.action;
        let message = match rule.expression.eval_bool(ctx, &rule.name) {
            Ok(true) => continue,
            Ok(false) => rule
                .message_expression
                .as_ref()
                .and_then(|m| m.eval_string(ctx, &rule.name).ok())
                .or_else(|| rule.spec.message.clone())
                .unwrap_or_else(|| format!("failed {}", rule.expression.source())),
            Err(e) => {
                action = action_on_error(&e, action);
                format!("rule could not be evaluated ({e}); expression: {}", rule.expression.source())
            }
        };
        findings.push(Finding { rule: rule.name.clone(), action, path: target.path.to_string(), message });
    }
    findings
}

/// The action a finding about an evaluation error takes, for a rule whose action is `action`.
/// Ordinary errors keep the rule's action. A panic is an engine defect, not a verdict on the
/// object: Deny rules still deny (never let an object through unchecked), while Warn and Audit
/// rules warn, so the person applying the object sees it.
pub fn action_on_error(error: &crate::expression::EvalError, action: Action) -> Action {
    match (error, action) {
        (crate::expression::EvalError::Panic(_), Action::Audit) => Action::Warn,
        (_, action) => action,
    }
}
