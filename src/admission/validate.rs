//! Validation: the built-in accelerator checks, the team's priority classes and CEL rules.
//! Pure functions over a Pod (or Pod template seen as a Pod) and the policy set.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::admission::directory::{GangDirectory, Peer, disagreement};
use crate::admission::finding::{Check, Finding, RuleId};
use crate::admission::quota::{QuotaBook, QuotaRequest, Refusal};
use crate::admission::request::Request;
use crate::model::dra::ClaimDemand;
use crate::model::expression::{Evaluator, Inputs};
use crate::model::gang::membership::{GangMetadataError, Membership, PodFacts};
use crate::model::json::Fields;
use crate::model::namespaces::TeamLookup;
use crate::model::policy::{Action, Operation, PolicySet, QuotaMode, Rule};
use crate::model::quantity::Quantity;
use crate::model::resources::{self, ContainerResources, ParsedContainer};
use crate::model::workload::PodView;

/// Runs the built-in accelerator checks and the team priority check on one Pod view: each
/// container's accelerator requests, then the Pod's total, then its priority class.
pub fn check_pod(policies: &PolicySet, view: &PodView<'_>, team: &TeamLookup<'_>) -> Vec<Finding> {
    check_pod_with_claims(policies, view, team, &resources::ResourceList::new())
}

/// [`check_pod`] for a Pod that also asks accelerators through DRA claims: `claimed`, in
/// accelerator terms ([`crate::model::dra::ClaimDemand::accelerators`]), counts towards the per-pod
/// maximum.
pub fn check_pod_with_claims(
    policies: &PolicySet,
    view: &PodView<'_>,
    team: &TeamLookup<'_>,
    claimed: &resources::ResourceList,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    if view.pod.get("spec").is_none() {
        return findings;
    }
    let spec_path = view.spec_path();
    for (parsed, container) in view.containers_with_json().filter(|(parsed, _)| !parsed.is_ephemeral()) {
        check_container(policies, parsed, container, &mut findings);
    }
    max_per_pod(policies, view.requests(), claimed, &spec_path, &mut findings);
    findings.extend(check_priority_class(policies, view, team));
    findings
}

/// A finding of one of the `accelerators/<check>` checks.
fn accelerator_finding(check: Check, action: Action, path: &str, message: String) -> Finding {
    Finding { rule: check.into(), action, path: path.to_string(), message }
}

/// One container's accelerator requests and limits, as the per-container checks read them.
struct ContainerAccelerators<'a> {
    /// Where the container is (`spec.containers[0]`): every finding points there.
    path: &'a str,
    name: &'a str,
    requests: BTreeMap<&'a str, Quantity>,
    limits: BTreeMap<&'a str, Quantity>,
    /// Every accelerator named in requests or limits.
    names: BTreeSet<&'a str>,
    resources: &'a ContainerResources,
}

/// The per-container checks. Unparsable accelerator quantities are findings of their own
/// (`accelerators/quantity`): the API server would refuse them, and the other checks cannot
/// compare what they cannot read. A container without accelerators is left alone.
fn check_container<'a>(
    policies: &PolicySet,
    parsed: &'a ParsedContainer,
    container: &'a Value,
    findings: &mut Vec<Finding>,
) {
    let accel = &policies.accelerators;
    let checks = &policies.checks;
    let (path, res, is_init) = (parsed.path.as_str(), &parsed.resources, parsed.is_init());
    for b in parsed.bad.iter().filter(|b| accel_path(&b.path, accel)) {
        findings.push(accelerator_finding(Check::AcceleratorQuantity, Action::Deny, &b.path, b.error.to_string()));
    }
    // Borrowed from the parsed container: a GPU pod is checked on every review.
    let requests: BTreeMap<&str, Quantity> = resources::accelerator_entries(&res.requests, accel).collect();
    let limits: BTreeMap<&str, Quantity> = resources::accelerator_entries(&res.limits, accel).collect();
    let names: BTreeSet<&str> = requests.keys().chain(limits.keys()).copied().collect();
    if names.is_empty() {
        return;
    }
    let c = ContainerAccelerators {
        path,
        name: container.get("name").and_then(Value::as_str).unwrap_or("?"),
        requests,
        limits,
        names,
        resources: res,
    };
    if let Some(action) = checks.requests_equal_limits.and_then(|c| c.action()) {
        requests_equal_limits(&c, action, findings);
    }
    if let Some(action) = checks.whole_numbers.and_then(|c| c.action()) {
        whole_numbers(&c, action, findings);
    }
    if is_init
        && !resources::is_sidecar(container)
        && let Some(action) = checks.init_containers.and_then(|c| c.action())
    {
        findings.push(init_container(&c, action));
    }
    allowed_resources(policies, &c, findings);
    max_per_container(policies, &c, findings);
}

/// Accelerators cannot be overcommitted: the API server refuses an extended resource whose
/// request differs from its limit. Said here, at `kubectl apply` (and for templates, before a
/// controller meets it), the message names the container and the fix.
fn requests_equal_limits(c: &ContainerAccelerators<'_>, action: Action, findings: &mut Vec<Finding>) {
    let cname = c.name;
    for name in &c.names {
        match (c.requests.get(name), c.limits.get(name)) {
            (Some(r), Some(l)) if r != l => findings.push(accelerator_finding(
                Check::RequestsEqualLimits,
                action,
                c.path,
                format!("container {cname}: {name} request {r} must equal its limit {l}"),
            )),
            (Some(r), None) => findings.push(accelerator_finding(
                Check::RequestsEqualLimits,
                action,
                c.path,
                format!("container {cname}: {name} is requested ({r}) without a limit; set limits.{name}: {r}"),
            )),
            // A limit alone is fine: the API server defaults the request to it.
            _ => {}
        }
    }
}

/// Devices are not divisible: a fractional request (`0.5`) cannot be scheduled as asked.
fn whole_numbers(c: &ContainerAccelerators<'_>, action: Action, findings: &mut Vec<Finding>) {
    let cname = c.name;
    for (kind, list) in [("request", &c.requests), ("limit", &c.limits)] {
        for (name, q) in list.iter().filter(|(_, q)| !q.is_whole()) {
            findings.push(accelerator_finding(
                Check::WholeNumbers,
                action,
                c.path,
                format!("container {cname}: {name} {kind} {q} is not a whole number of devices"),
            ));
        }
    }
}

/// An init container holding accelerators keeps them idle while it runs (sidecars excepted:
/// they run alongside the app containers and are checked like them).
fn init_container(c: &ContainerAccelerators<'_>, action: Action) -> Finding {
    let list: Vec<&str> = c.names.iter().copied().collect();
    accelerator_finding(
        Check::InitContainers,
        action,
        c.path,
        format!(
            "init container {} requests {}; accelerators are not allowed in init containers",
            c.name,
            list.join(", ")
        ),
    )
}

/// Only the accelerator names the Cluster allows: a cluster may carry device kinds (or MIG
/// profiles) it does not want workloads to ask for.
fn allowed_resources(policies: &PolicySet, c: &ContainerAccelerators<'_>, findings: &mut Vec<Finding>) {
    let (Some(check), Some(allowed)) = (&policies.checks.allowed_resources, &policies.allowed_accelerators) else {
        return;
    };
    for name in c.names.iter().filter(|n| !allowed.matches(n)) {
        findings.push(accelerator_finding(
            Check::AllowedResources,
            check.action,
            c.path,
            format!("container {}: {name} is not an allowed accelerator (allowed: {})", c.name, check.names.join(", ")),
        ));
    }
}

/// The Cluster's per-container cap, over the container's effective requests: bounds what one
/// container may hold, whatever the Pod's total.
fn max_per_container(policies: &PolicySet, c: &ContainerAccelerators<'_>, findings: &mut Vec<Finding>) {
    let Some(max) = &policies.checks.max_per_container else {
        return;
    };
    for (name, limit) in &max.limits {
        let asked = c.resources.effective_request(name).map_or(0, |q| q.ceil_units());
        if asked > i64::from(*limit) {
            findings.push(accelerator_finding(
                Check::MaxPerContainer,
                max.action,
                c.path,
                format!("container {} asks {asked} {name}; at most {limit} per container", c.name),
            ));
        }
    }
}

/// A per-Pod cap over the Pod's effective requests (the scheduler's formula): a Pod larger
/// than any node would wait forever.
fn max_per_pod(
    policies: &PolicySet,
    requests: &resources::ResourceList,
    claimed: &resources::ResourceList,
    spec_path: &str,
    findings: &mut Vec<Finding>,
) {
    let Some(max) = &policies.checks.max_per_pod else {
        return;
    };
    let mut total = requests.clone();
    for (name, q) in claimed {
        let slot = total.entry(name.clone()).or_default();
        *slot = slot.saturating_add(*q);
    }
    for (name, limit) in &max.limits {
        let asked = total.get(name).map_or(0, |q| q.ceil_units());
        if asked > i64::from(*limit) {
            findings.push(accelerator_finding(
                Check::MaxPerPod,
                max.action,
                spec_path,
                format!("pod asks {asked} {name} in all; at most {limit} per pod"),
            ));
        }
    }
}

fn accel_path(path: &str, accel: &resources::ResourceMatcher) -> bool {
    path.rsplit_once('[').and_then(|(_, n)| n.strip_suffix(']')).is_some_and(|n| accel.matches(n))
}

/// The gang of a Pod view, computed once per view and shared by the gang and quota checks. At
/// CREATE a topology level its members ask for must be one its GangPolicy allows
/// ([`PolicySet::topology_refusal`]); later it is not judged again, so a member admitted before
/// a policy change keeps its gang.
pub fn pod_gang(
    policies: &PolicySet,
    view: &PodView<'_>,
    namespace: &str,
    team: &TeamLookup<'_>,
    at_create: bool,
) -> Result<Option<Membership>, GangMetadataError> {
    let facts = PodFacts::from_json(&view.pod);
    let team = team.team.map(|t| t.name.as_str());
    let gang = policies.gang_of(&facts, namespace, team)?;
    if at_create
        && gang.is_some()
        && let Some(refusal) = policies.topology_refusal(&facts, namespace, team)
    {
        return Err(GangMetadataError::Topology(refusal));
    }
    Ok(gang)
}

/// The gang the pods of a workload template (`view`, without a gang of its own) will be
/// inferred into once the workload's controller makes them, under the team's GangPolicy: the
/// template with the controller's labels ([`controller_labels`]) through the very
/// [`PolicySet::gang_of`] their pods will meet. `None` where the kind is not one compared, the
/// GangPolicy infers nothing, or it hands inferred gangs to the scheduler's native gang
/// scheduling (their pods are then not compared at admission either).
///
/// [`controller_labels`]: crate::model::gang::membership::controller_labels
pub fn template_inferred_gang(
    policies: &PolicySet,
    view: &PodView<'_>,
    req: &Request<'_>,
    team: &TeamLookup<'_>,
) -> Option<Membership> {
    let team = team.team.map(|t| t.name.as_str());
    let policy = policies.gang_policy(req.namespace, team);
    if policy.infer.is_empty() || policy.native_scheduling {
        return None;
    }
    let name = req.object.text(&["metadata", "name"]).unwrap_or_default();
    let labels = crate::model::gang::membership::controller_labels(req.group, req.kind, name, &view.path)?;
    let mut pod = view.pod.as_ref().clone();
    let metadata =
        pod.as_object_mut()?.entry("metadata").or_insert_with(|| Value::Object(Map::new())).as_object_mut()?;
    let own = metadata.entry("labels").or_insert_with(|| Value::Object(Map::new())).as_object_mut()?;
    for (key, value) in labels {
        own.insert(key.to_string(), Value::String(value));
    }
    let gang = policies.gang_of(&PodFacts::from_json(&pod), req.namespace, team).ok()??;
    matches!(gang.source, crate::model::gang::membership::Source::Inferred(_)).then_some(gang)
}

/// Where a Pod view's metadata is (`metadata`, `spec.template.metadata`).
fn metadata_path(view_path: &str) -> String {
    if view_path.is_empty() { "metadata".to_string() } else { format!("{view_path}.metadata") }
}

/// The denial of invalid gang metadata (`allot.dev/gang-size: zero`).
pub fn gang_metadata_finding(view_path: &str, message: String) -> Finding {
    Finding { rule: Check::GangMetadata.into(), action: Action::Deny, path: metadata_path(view_path), message }
}

/// Gang metadata: a valid size, and (for Pods) agreement with the members that exist.
pub fn check_gang(
    view: &PodView<'_>,
    namespace: &str,
    gang: &Result<Option<Membership>, GangMetadataError>,
    directory: &dyn GangDirectory,
    global_default: Option<&str>,
) -> Option<Finding> {
    match gang {
        Err(error) => Some(gang_metadata_finding(&view.path, error.to_string())),
        Ok(Some(gang)) if view.path.is_empty() => {
            let me = Peer::of(&view.pod, gang, global_default);
            // Both sides alike: a watched member naming no class counts as this pod does.
            let peers: Vec<Peer> = directory
                .peers(namespace, &gang.name)
                .into_iter()
                .map(|p| p.naming_the_global_default(global_default))
                .collect();
            disagreement(&format!("{namespace}/{}", gang.name), &me, &peers).map(|message| Finding {
                rule: Check::GangConsistency.into(),
                action: Action::Deny,
                path: metadata_path(""),
                message,
            })
        }
        Ok(_) => None,
    }
}

/// One Pod template of a workload whose pods join an explicit gang, for [`check_template_gangs`].
#[derive(Debug, Clone)]
pub struct TemplateMember {
    /// The template's path in the workload (`spec.replicatedJobs[1].template.spec.template`).
    pub path: String,
    pub gang: String,
    /// What its pods will be, as far as gang agreement goes (after the preview mutation).
    pub peer: Peer,
}

impl TemplateMember {
    /// The template seen as the Pod view `view` (already previewed) in `gang`, in a cluster whose
    /// `globalDefault` PriorityClass is `global_default`.
    pub fn of(view: &PodView<'_>, gang: &Membership, global_default: Option<&str>) -> TemplateMember {
        TemplateMember {
            path: view.path.clone(),
            gang: gang.name.clone(),
            peer: Peer::of(&view.pod, gang, global_default),
        }
    }
}

/// `gang/consistency` between the templates of one workload: templates whose pods join the same
/// gang must agree as those pods will have to. Otherwise the workload is admitted and its pods
/// are denied one by one as its controller creates them (or, created at once, held by the gang
/// controller), the first ones waiting for the rest until their assembly timeout. Each later
/// template is compared with the first one of its gang.
pub fn check_template_gangs(namespace: &str, templates: &[TemplateMember]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, t) in templates.iter().enumerate() {
        let Some(first) = templates[..i].iter().find(|f| f.gang == t.gang) else { continue };
        if let Some((field, mine, theirs)) = t.peer.first_difference(&first.peer) {
            out.push(Finding {
                rule: Check::GangConsistency.into(),
                action: Action::Deny,
                path: metadata_path(&t.path),
                message: format!(
                    "gang {namespace}/{}: this template's pods would have {field} {mine}, those of {} {theirs}; \
                     all members of a gang must agree",
                    t.gang, first.path
                ),
            });
        }
    }
    out
}

/// `accelerators/claims` on a ResourceClaim CREATE: refused while pods of the namespace that
/// name a claim of that name were admitted (and counted) with an earlier one. A tenant could
/// otherwise delete a claim no pod has reserved yet (its pods still gated or pending) and make a
/// larger one under the same name: those pods, admitted against the small one, would run with
/// the large one. `pods` are those pods (the cluster view's).
pub fn check_claim_create(name: &str, pods: &[String]) -> Option<Finding> {
    let first = pods.first()?;
    let more = if pods.len() > 1 { format!(" and {} more", pods.len() - 1) } else { String::new() };
    Some(Finding {
        rule: Check::Claims.into(),
        action: Action::Deny,
        path: "metadata.name".into(),
        message: format!(
            "pod {first:?}{more} of this namespace names ResourceClaim {name:?} and was admitted with an earlier claim \
             of that name, which its team's quota counted; a new claim under that name would give those pods \
             whatever it asks. Delete those pods first, or use another name"
        ),
    })
}

/// `accelerators/claims`: a ResourceClaim or ResourceClaimTemplate the pod names that cannot be
/// found. Its devices cannot be counted, and an uncounted claim would be free: a Pod is denied.
/// A workload's template is only warned about (`kubectl apply -f dir/` may create the template
/// after the workload); the Pods made from it are denied if it is still missing then.
pub fn check_claims(view: &PodView<'_>, claims: &ClaimDemand, missing_phrase: &str) -> Vec<Finding> {
    let action = if view.path.is_empty() { Action::Deny } else { Action::Warn };
    claims
        .missing
        .iter()
        .map(|m| Finding {
            rule: Check::Claims.into(),
            action,
            path: if view.path.is_empty() { m.path.clone() } else { format!("{}.{}", view.path, m.path) },
            message: format!(
                "references {} {:?}, {}: Allot cannot count the accelerators it asks for",
                m.kind, m.name, missing_phrase
            ),
        })
        .collect()
}

/// Deny-mode team quota. A Pod at CREATE is charged against live usage (`book`); a workload's
/// templates — and UPDATEs — only against the quota itself: a template that alone exceeds it
/// can never run. A team in a cohort (`cohorts`) borrows what the cohort has unused.
pub fn check_quota(
    view: &PodView<'_>,
    gang: Option<&Membership>,
    claims: &ClaimDemand,
    req: &Request<'_>,
    team: &TeamLookup<'_>,
    (book, cohorts): (&dyn QuotaBook, &crate::model::policy::cohort::Cohorts),
) -> Option<Finding> {
    let t = team.team?;
    let quota = t.quota.as_ref().filter(|q| q.mode == QuotaMode::Deny)?;
    view.pod.get("spec")?; // no spec, nothing to charge
    let requests = crate::model::dra::quota_requests(view.requests(), claims);
    let charge = quota.charge(&requests);
    let gang = gang.and_then(|g| g.size.map(|n| (g.name.as_str(), n)));
    // Shared claims are charged once per claim, apart from the pod's own requests; those that
    // ask nothing the quota counts are left out.
    let mut shared_claims = claims.shared_quota_resources();
    shared_claims.retain(|_, devices| !quota.charge(devices).is_empty());
    // A gang member asking nothing still takes one of its gang's declared places (and so
    // changes what the others are charged): the book must count it.
    if charge.is_empty() && gang.is_none() && shared_claims.is_empty() {
        return None;
    }
    let pod = view.pod.field(&["metadata", "name"]).and_then(Value::as_str).unwrap_or("");
    let pod_uid = view.pod.field(&["metadata", "uid"]).and_then(Value::as_str).unwrap_or("");
    let created = view
        .pod
        .field(&["metadata", "creationTimestamp"])
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second());
    let (uid, namespace, dry_run) = (req.uid, req.namespace, req.dry_run);
    let request = QuotaRequest {
        uid,
        team: &t.name,
        namespace,
        pod,
        pod_uid,
        created,
        charge,
        requests,
        gang,
        shared_claims,
        dry_run,
        cohort: cohorts.of_team(&t.name),
    };
    let refusal = book.admit(quota, &request).err()?;
    Some(quota_denial(view.spec_path(), &t.name, &refusal))
}

/// The denial for a quota book's refusal of the pod whose spec is at `spec_path`.
pub fn quota_denial(spec_path: String, team: &str, refusal: &Refusal) -> Finding {
    Finding { rule: Check::TeamQuota.into(), action: Action::Deny, path: spec_path, message: refusal.message(team) }
}

/// A team's pods may use the classes its `priority.allowed` lists (and its default).
fn check_priority_class(policies: &PolicySet, view: &PodView<'_>, team: &TeamLookup<'_>) -> Option<Finding> {
    let t = team.team?;
    let allowed = t.priority.allowed.as_ref()?;
    let class = view.pod.field(&["spec", "priorityClassName"]).and_then(Value::as_str).filter(|c| !c.is_empty());
    let class = class.or(policies.priority.global_default.as_deref())?;
    if allowed.iter().any(|a| a == class) || t.priority.default.as_deref() == Some(class) {
        return None;
    }
    Some(Finding {
        rule: Check::TeamPriorityClass.into(),
        action: Action::Deny,
        path: format!("{}.priorityClassName", view.spec_path()),
        message: format!("team {} may use priority classes {}; this pod asks {class}", t.name, allowed.join(", ")),
    })
}

/// A team that lists no allowed classes may use any class but the system ones: a tenant's pod
/// at `system-node-critical` would preempt every other team's pods on its way to a GPU. (The
/// engine softens it to a warning on a workload UPDATE: a workload admitted before this check
/// must stay updatable, its pods are still denied when created.)
pub fn check_system_priority_class(policies: &PolicySet, view: &PodView<'_>, team: &TeamLookup<'_>) -> Option<Finding> {
    let t = team.team.filter(|t| t.priority.allowed.is_none())?;
    let class = view.pod.field(&["spec", "priorityClassName"]).and_then(Value::as_str).filter(|c| !c.is_empty())?;
    // The cluster's globalDefault is what the pod gets by asking nothing: never judged here.
    if !class.starts_with(crate::model::policy::SYSTEM_PRIORITY_PREFIX)
        || t.priority.default.as_deref() == Some(class)
        || policies.priority.global_default.as_deref() == Some(class)
    {
        return None;
    }
    Some(Finding {
        rule: Check::TeamPriorityClass.into(),
        action: Action::Deny,
        path: format!("{}.priorityClassName", view.spec_path()),
        message: format!(
            "{class} is a system priority class, kept for the cluster's own components: a pod at it would preempt \
             every other team's pods; team {} lists no allowed classes, which allows any class but the system ones \
             (list {class} in the team's priority.allowed to permit it)",
            t.name
        ),
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

/// What these rules read of the variables (only that is bound).
pub fn rule_needs(rules: &[&Rule]) -> crate::model::expression::Needs {
    let mut needs = crate::model::expression::Needs::default();
    for expression in rules.iter().flat_map(|r| r.expressions()) {
        needs.merge(expression.needs());
    }
    needs
}

/// Evaluates the matching CEL rules. An expression that errors counts as failed: a rule that
/// cannot be evaluated must never let an object through silently.
pub fn run_rules(policies: &PolicySet, rules: &[&Rule], target: &Target<'_>, inputs: &Inputs<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    let evaluator = Evaluator::new(&policies.env, inputs);
    for rule in rules {
        let mut action = rule.spec.action;
        let message = match evaluator.eval_bool(&rule.expression, &rule.name) {
            Ok(true) => continue,
            Ok(false) => rule
                .message_expression
                .as_ref()
                .and_then(|m| evaluator.eval_string(m, &rule.name).ok())
                .or_else(|| rule.spec.message.clone())
                .unwrap_or_else(|| format!("failed {}", rule.expression.source())),
            Err(e) => {
                action = action_on_error(&e, action);
                format!("rule could not be evaluated ({e}); expression: {}", rule.expression.source())
            }
        };
        findings.push(Finding {
            rule: RuleId::Rule(rule.name.clone()),
            action,
            path: target.path.to_string(),
            message,
        });
    }
    findings
}

/// The action a finding about an evaluation error takes, for a rule whose action is `action`.
/// Ordinary errors keep the rule's action. A panic is an engine defect, not a verdict on the
/// object: Deny rules still deny (never let an object through unchecked), while Warn and Audit
/// rules warn, so the person applying the object sees it.
pub fn action_on_error(error: &crate::model::expression::EvalError, action: Action) -> Action {
    match (error, action) {
        (crate::model::expression::EvalError::Panic(_), Action::Audit) => Action::Warn,
        (_, action) => action,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal names the first pod and how many more; no pod, no refusal.
    #[test]
    fn a_claim_create_is_refused_while_pods_name_it() {
        let one = check_claim_create("pair", &["a".to_string()]).expect("refused");
        assert_eq!((one.action, one.path.as_str()), (Action::Deny, "metadata.name"));
        assert!(one.message.starts_with("pod \"a\" of this namespace names ResourceClaim \"pair\""), "{}", one.message);
        let three = check_claim_create("pair", &["a".into(), "b".into(), "c".into()]).expect("refused");
        assert!(three.message.starts_with("pod \"a\" and 2 more of this namespace"), "{}", three.message);
        assert!(check_claim_create("pair", &[]).is_none());
    }

    /// A Pod naming no priority class beside a member the directory (the cluster's Pod watch)
    /// knows without one: both count as the global default, so they agree; a member naming
    /// another class does not.
    #[test]
    fn members_naming_no_class_agree_on_both_sides() {
        let gang =
            Membership { name: "g".into(), size: Some(2), source: crate::model::gang::membership::Source::Explicit };
        let member = |name: &str, class: Option<&str>| Peer {
            pod: name.into(),
            size: Some(2),
            priority_class: class.map(String::from),
            scheduler_name: Some("default-scheduler".into()),
        };
        let directory = |peer: Peer| {
            crate::admission::directory::StaticGangs(
                [(("ns".to_string(), "g".to_string()), vec![peer])].into_iter().collect(),
            )
        };
        let pod = serde_json::json!({"metadata": {"name": "w-0"}, "spec": {"containers": []}});
        let view = PodView::new(String::new(), std::borrow::Cow::Borrowed(&pod));
        let check = |peer: Peer, global: Option<&str>| {
            check_gang(&view, "ns", &Ok(Some(gang.clone())), &directory(peer), global)
        };
        assert_eq!(check(member("w-1", None), Some("low")), None);
        assert_eq!(check(member("w-1", Some("low")), Some("low")), None);
        assert_eq!(check(member("w-1", None), None), None);
        let denied = check(member("w-1", Some("high")), Some("low")).expect("a disagreement");
        assert!(
            denied.message.contains("this pod has priorityClassName low, member w-1 has high"),
            "{}",
            denied.message
        );
        assert!(check(member("w-1", Some("low")), None).is_some(), "no global default: unset is not low");
    }
}
