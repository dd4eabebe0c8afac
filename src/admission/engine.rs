//! The one evaluation engine. The server's `/mutate` and `/validate` call [`Engine::mutate`] and
//! [`Engine::validate`]; `allot check` calls [`Engine::admit`], which is exactly those two in
//! sequence with the patch applied in between — what the API server does.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use crate::admission::directory::{GangDirectory, NoGangs};
use crate::admission::finding::{Check, Finding, RuleId, any_denied};
use crate::admission::mutate::{self, PodContext};
use crate::admission::quota::{NoUsage, QuotaBook};
/// The engine's input, re-exported because it is part of the engine's public API (tests,
/// benches and fuzz targets build requests through `allot::admission::engine`).
pub use crate::admission::request::{Request, RequestOperation};
use crate::admission::tenant::{self, Requester};
use crate::admission::validate::{self, Target};
use crate::model::dra::{self, ClaimDemand, ClaimSource, NoClaims};
use crate::model::expression::{Inputs, Needs, object_accelerators};
use crate::model::json::Fields;
use crate::model::namespaces::{NamespaceLabels, TeamLookup, team_of};
use crate::model::patch::{self, PatchOp};
use crate::model::policy::{Action, Operation, PolicySet};
use crate::model::workload::{self, PodView};

mod pod_checks;

/// What one phase decided.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    /// JSON Patch operations (mutation only).
    pub patch: Vec<PatchOp>,
    /// Human-readable changes behind the patch.
    pub changes: Vec<String>,
    pub findings: Vec<Finding>,
    /// Things the engine could not evaluate (unknown namespace labels…).
    pub notes: Vec<String>,
}

impl Outcome {
    /// True unless a finding denies.
    pub fn allowed(&self) -> bool {
        !any_denied(&self.findings)
    }
}

/// Mutation followed by validation of the mutated object.
#[derive(Debug, Clone, Serialize)]
pub struct Admission {
    pub mutation: Outcome,
    pub validation: Outcome,
    /// The object after the patch (equal to the input when there is none).
    #[serde(skip)]
    pub mutated: Value,
}

impl Admission {
    /// True when both phases admit.
    pub fn allowed(&self) -> bool {
        self.mutation.allowed() && self.validation.allowed()
    }
}

/// What an evaluation's `object` is: a Pod view (its containers parsed once, for the checks
/// and the rules alike) or a workload itself.
#[derive(Clone, Copy)]
enum Subject<'r> {
    Pod(&'r PodView<'r>),
    Object(&'r Value),
}

/// The engine: a policy set, a namespace-label source and what is known of existing gangs.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    pub policies: &'a PolicySet,
    pub namespaces: &'a dyn NamespaceLabels,
    pub gangs: &'a dyn GangDirectory,
    pub quota: &'a dyn QuotaBook,
    /// Allot's own user name (`userInfo.username`): the only one that may move Allot's gates
    /// and reserved keys on Pod UPDATE.
    pub allot_username: &'a str,
    /// Where a Pod's ResourceClaims and ResourceClaimTemplates are looked up (DRA accounting).
    pub claims: &'a dyn ClaimSource,
    /// Whether `/mutate` outcomes describe their changes (`Outcome::changes`): `allot check`
    /// prints them; the server only logs them at debug level and skips the formatting otherwise.
    pub describe_changes: bool,
}

impl<'a> Engine<'a> {
    /// Creates an engine over a policy set, knowing no other gang members.
    pub fn new(policies: &'a PolicySet, namespaces: &'a dyn NamespaceLabels) -> Self {
        Engine {
            policies,
            namespaces,
            gangs: &NoGangs,
            quota: &NoUsage,
            allot_username: tenant::DEFAULT_ALLOT_USERNAME,
            claims: &NoClaims,
            describe_changes: true,
        }
    }

    /// The same engine, describing a mutation's changes or not ([`Engine::describe_changes`]).
    pub fn with_change_descriptions(self, describe_changes: bool) -> Self {
        Engine { describe_changes, ..self }
    }

    /// The same engine, resolving DRA claims in `claims`.
    pub fn with_claims<'g>(self, claims: &'g dyn ClaimSource) -> Engine<'g>
    where
        'a: 'g,
    {
        Engine { claims, ..self }
    }

    /// What `pod` (the object of `req`, or a template of it) asks through DRA claims, resolved in
    /// the request's namespace. At CREATE the pod's `status` is the requester's, not yet the API
    /// server's: it is not read ([`dra::created_pod_demand`]).
    fn claim_demand(&self, req: &Request<'_>, pod: &Value) -> ClaimDemand {
        let classes = &self.policies.device_classes;
        if req.operation == RequestOperation::Create {
            dra::created_pod_demand(pod, req.namespace, classes, self.claims)
        } else {
            dra::pod_demand(pod, req.namespace, classes, self.claims)
        }
    }

    /// The same engine, trusting `username` as Allot's own identity.
    pub fn with_allot_username<'g>(self, allot_username: &'g str) -> Engine<'g>
    where
        'a: 'g,
    {
        Engine { allot_username, ..self }
    }

    /// The same engine, charging deny-mode quotas against `quota`.
    pub fn with_quota<'g>(self, quota: &'g dyn QuotaBook) -> Engine<'g>
    where
        'a: 'g,
    {
        Engine { quota, ..self }
    }

    /// The same engine, checking gang members against `gangs`.
    pub fn with_gangs<'g>(self, gangs: &'g dyn GangDirectory) -> Engine<'g>
    where
        'a: 'g,
    {
        Engine { gangs, ..self }
    }

    fn team(&self, namespace: &str, notes: &mut Vec<String>) -> TeamLookup<'a> {
        let lookup = team_of(self.policies, namespace, self.namespaces);
        if let Some(t) = lookup.undecided {
            notes.push(format!(
                "team {} selects namespaces by label, and the labels of namespace {namespace:?} are unknown{}",
                t.name,
                if lookup.team.is_some() { "; matched a later team by name" } else { "" }
            ));
        }
        lookup
    }

    /// The variables of an evaluation of `subject` (the Pod, a template seen as one, or a
    /// workload itself), for expressions that read `needs`.
    fn inputs<'r>(
        &'r self,
        req: &Request<'r>,
        subject: Subject<'r>,
        team: &TeamLookup<'a>,
        needs: Needs,
    ) -> Inputs<'r> {
        let (object, view) = match subject {
            Subject::Pod(view) => (&*view.pod, Some(view)),
            Subject::Object(object) => (object, None),
        };
        Inputs {
            object: Some(object),
            old_object: req.old_object,
            workload: Some(req.object),
            namespace: req.namespace,
            team: team.team.map_or("", |t| t.name.as_str()),
            request: needs.wants("request").then(|| {
                serde_json::json!({
                    "operation": req.operation,
                    "dryRun": req.dry_run,
                    "userInfo": {"username": req.username, "groups": req.groups},
                })
            }),
            object_accelerators: if needs.vars & crate::model::expression::OBJECT_ACCELERATORS_BIT != 0 {
                // Devices asked through DRA claims count like those in the containers' resources.
                let claimed = self.claim_demand(req, object).accelerators(&self.policies.device_classes);
                let claimed = crate::model::resources::accelerators_only(&claimed, &self.policies.accelerators);
                object_accelerators(object, view, &self.policies.accelerators)
                    .and_then(|units| claimed.values().try_fold(units, |sum, q| sum.checked_add(q.ceil_units())))
            } else {
                None
            },
            needs,
            view,
        }
    }

    /// The mutating webhook: Pods at CREATE get placement and default priority.
    pub fn mutate(&self, req: &Request<'_>) -> Outcome {
        let mut out = Outcome::default();
        if req.operation != RequestOperation::Create || !req.group.is_empty() || req.kind != "Pod" {
            return out;
        }
        let team = self.team(req.namespace, &mut out.notes);
        let view = PodView::new(String::new(), Cow::Borrowed(req.object));
        let make_inputs = |needs: &Needs| self.inputs(req, Subject::Pod(&view), &team, needs.clone());
        let claims = self.claim_demand(req, req.object);
        let ctx = PodContext {
            namespace: req.namespace,
            team,
            inputs: &make_inputs,
            requester: Requester::User(req.username),
            claims: &claims,
            native_gangs: self.claims.schedules_native_gangs(),
            cluster: self.gangs,
            describe: self.describe_changes,
            preview: false,
        };
        let m = mutate::mutate_pod(self.policies, req.object, &ctx, "");
        out.patch = m.ops;
        out.changes = m.changes;
        out.findings = m.findings;
        out.findings.extend(m.gang_error.map(|message| validate::gang_metadata_finding("", message)));
        out
    }

    /// The validating webhook: built-in checks and rules on the Pod, or on each Pod template of
    /// a workload (as its Pods will be after mutation), and rules on the object itself.
    pub fn validate(&self, req: &Request<'_>) -> Outcome {
        let mut out = Outcome::default();
        let Some(operation) = req.operation.as_rule_operation() else {
            return out;
        };
        let is_pod = req.group.is_empty() && req.kind == "Pod";
        // Before anything else: only Allot moves its gates and keys, whatever the rest holds.
        if is_pod && operation == Operation::Update {
            match req.old_object {
                Some(old) => out.findings.extend(tenant::check_pod_update(
                    self.policies,
                    old,
                    req.object,
                    req.username,
                    self.allot_username,
                )),
                None => out.notes.push("a Pod UPDATE without oldObject: Allot's gates could not be checked".into()),
            }
        }
        if req.group == "resource.k8s.io" && req.kind == "ResourceClaim" {
            if operation == Operation::Create && !self.policies.device_classes.is_empty() {
                let name = Fields::field(req.object, &["metadata", "name"]).and_then(Value::as_str);
                let pods = name.map(|n| self.gangs.pods_naming_claim(req.namespace, n)).unwrap_or_default();
                out.findings.extend(name.and_then(|n| validate::check_claim_create(n, &pods)));
            }
            return out;
        }
        let views = workload::pods_of(req.object, req.group, req.kind);
        if views.is_empty() && !validate::rules_for_kind(self.policies, req.group, req.kind) {
            // Nothing Allot knows how to check: no team lookup, no notes.
            return out;
        }
        let team = self.team(req.namespace, &mut out.notes);
        // The object itself; each Pod view is matched as a Pod at its path.
        let object_target = Target {
            operation,
            namespace: req.namespace,
            team: team.team.map(|t| t.name.as_str()),
            group: req.group,
            kind: req.kind,
            is_pod: false,
            path: "",
        };

        self.object_checks(req, operation, &team, &mut out);
        let mut quota_views = Vec::new();
        let mut template_gangs = Vec::new();
        for view in views {
            let view = if view.path.is_empty() { view } else { self.as_created(req, view, &team, &mut out) };
            // Pod specs are immutable after CREATE: re-checking them on UPDATE would only block
            // label edits and our own gate removal on pods admitted under older policies.
            let checked = !(is_pod && operation == Operation::Update);
            let mut gang = None;
            let claims = self.claim_demand(req, &view.pod);
            let claimed = claims.accelerators(&self.policies.device_classes);
            if checked {
                let template;
                (gang, template) = self.check_pod(req, &view, &team, (&claims, &claimed), operation, &mut out);
                template_gangs.extend(template);
            }
            self.run_rules(
                req,
                Subject::Pod(&view),
                &team,
                &Target { is_pod: true, path: &view.path, ..object_target },
                &mut out,
            );
            if checked {
                quota_views.push((view, gang, claims));
            }
        }
        out.findings.extend(validate::check_template_gangs(req.namespace, &template_gangs));
        if !is_pod {
            self.run_rules(req, Subject::Object(req.object), &team, &object_target, &mut out);
        }
        // Quota last, and only for what is otherwise admitted: a denied pod reserves nothing.
        if out.allowed() {
            for (view, gang, claims) in &quota_views {
                let live = view.path.is_empty() && operation == Operation::Create;
                let book: &dyn QuotaBook = if live { self.quota } else { &NoUsage };
                out.findings.extend(validate::check_quota(view, gang.as_ref(), claims, req, &team, book));
            }
        }
        out
    }

    /// The checks of the object as a whole, after Allot's own keys: a tenant's change of what
    /// a Pod is charged, a workload's size, tolerations added on a Pod UPDATE.
    fn object_checks(&self, req: &Request<'_>, operation: Operation, team: &TeamLookup<'_>, out: &mut Outcome) {
        let is_pod = req.group.is_empty() && req.kind == "Pod";
        if is_pod
            && operation == Operation::Update
            && req.username != self.allot_username
            && let (Some(old), Some(quota)) = (req.old_object, team.team.and_then(|t| t.quota.as_ref()))
            // (A changed accelerator amount is reported once, above.)
            && !out.findings.iter().any(|f| f.rule == RuleId::Check(Check::TenantResize))
        {
            out.findings.extend(tenant::check_charge_change(quota, old, req.object));
        }
        if !is_pod {
            out.findings.extend(tenant::check_owner_size(self.policies, req, team.team.map(|t| t.name.as_str())));
        }
        if is_pod
            && operation == Operation::Update
            && let Some(old) = req.old_object
        {
            out.findings.extend(self.added_tolerations(req, old, team));
        }
    }

    /// The scheduler a workload gives the pods of a template that names none: a Volcano Job's
    /// `spec.schedulerName`, or Volcano's first scheduler name (its webhook's default).
    fn workload_scheduler<'r>(&'r self, req: &Request<'r>, view: &PodView<'_>) -> Option<&'r str> {
        if view.path.is_empty() || (req.group, req.kind) != ("batch.volcano.sh", "Job") {
            return None;
        }
        req.object.text(&["spec", "schedulerName"]).or(self
            .policies
            .tenancy
            .volcano_schedulers
            .first()
            .map(String::as_str))
    }

    /// True when the namespace's GangPolicy infers gangs from this workload's kind (a CronJob's
    /// from the Jobs it makes): its template's pods will be gang members.
    fn infers_gangs_of(&self, req: &Request<'_>, team: &TeamLookup<'_>) -> bool {
        let kind = match (req.group, req.kind) {
            ("batch", "CronJob") => Some(crate::model::gang::membership::InferredKind::Job),
            (group, kind) => tenant::inferred_kind(group, kind),
        };
        kind.is_some_and(|k| {
            self.policies.gang_policy(req.namespace, team.team.map(|t| t.name.as_str())).infer.contains(&k)
        })
    }

    /// Runs the rules that match `target` on `object`, binding only the variables they read
    /// (nothing at all when no rule matches).
    fn run_rules(
        &self,
        req: &Request<'_>,
        subject: Subject<'_>,
        team: &TeamLookup<'_>,
        target: &Target<'_>,
        out: &mut Outcome,
    ) {
        let rules = validate::matching_rules(self.policies, target);
        if rules.is_empty() {
            return;
        }
        let inputs = self.inputs(req, subject, team, validate::rule_needs(&rules));
        out.findings.extend(validate::run_rules(self.policies, &rules, target, &inputs));
    }

    /// A Pod UPDATE may add tolerations (the API server lets a Pod gain them, never lose them):
    /// those of taints a Placement keeps for other pods are judged as at CREATE
    /// ([`mutate::reserved_taints`]). Nothing is evaluated unless the tolerations changed.
    fn added_tolerations(&self, req: &Request<'_>, old: &Value, team: &TeamLookup<'a>) -> Vec<Finding> {
        let tolerations = ["spec", "tolerations"];
        if team.team.is_none() || req.object.field(&tolerations) == old.field(&tolerations) {
            return Vec::new();
        }
        // Kueue adds the tolerations of the flavor it admitted the pod to as it lifts its gate:
        // the admins' ResourceFlavors, not the tenant's words. Only that UPDATE.
        if self.policies.tenancy.is_kueue(req.username) && tenant::lifts_kueue_gate(old, req.object) {
            return Vec::new();
        }
        let view = PodView::new(String::new(), Cow::Borrowed(req.object));
        let make_inputs = |needs: &Needs| self.inputs(req, Subject::Pod(&view), team, needs.clone());
        let claims = self.claim_demand(req, req.object);
        let ctx = PodContext {
            namespace: req.namespace,
            team: *team,
            inputs: &make_inputs,
            requester: Requester::User(req.username),
            claims: &claims,
            native_gangs: self.claims.schedules_native_gangs(),
            cluster: self.gangs,
            describe: false,
            preview: true,
        };
        // A `when` that cannot be evaluated applies no placement, so its reservation holds.
        let (applied, _) = mutate::applying_placements(self.policies, req.object, &ctx);
        let spec = req.object.get("spec").unwrap_or(&Value::Null);
        mutate::reserved_taints(self.policies, spec, &ctx, &applied, old.get("spec"), "spec")
    }

    /// A template as the Pods made from it will arrive at validation: mutated by the same
    /// placement and priority policies. Conflicts found on the way are reported at its path.
    fn as_created<'v>(
        &self,
        req: &Request<'_>,
        view: PodView<'v>,
        team: &TeamLookup<'a>,
        out: &mut Outcome,
    ) -> PodView<'v> {
        let make_inputs = |needs: &Needs| self.inputs(req, Subject::Pod(&view), team, needs.clone());
        // The Pods of a template are created by its workload's controller, whose identity
        // is not known here: no identity-based exemption.
        let claims = self.claim_demand(req, &view.pod);
        let ctx = PodContext {
            namespace: req.namespace,
            team: *team,
            inputs: &make_inputs,
            requester: Requester::Unknown,
            claims: &claims,
            native_gangs: self.claims.schedules_native_gangs(),
            cluster: self.gangs,
            // The preview keeps the findings and the mutated spec; its changes are nobody's
            // to read.
            describe: false,
            preview: true,
        };
        // (A gang metadata error is left to validation's own gang check of this view.)
        let m = mutate::mutate_pod(self.policies, &view.pod, &ctx, &view.path);
        let update = req.operation == RequestOperation::Update;
        out.findings.extend(m.findings.into_iter().map(|f| {
            if f.rule == RuleId::Check(Check::TenantTolerations) { warn_on_workload_update(f, update) } else { f }
        }));
        if m.changed_spec_fields.is_empty() {
            return view;
        }
        // A template's view owns its Pod (made from the template): its spec is overwritten
        // where it is. (Mutation only changes a spec that is an object.)
        let mut pod = view.pod.into_owned();
        if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
            patch::overlay(spec, m.changed_spec_fields);
        }
        PodView::new(view.path, std::borrow::Cow::Owned(pod))
    }

    /// The Pods an object makes as they reach the API server: a Pod as given, each template as
    /// mutated by the same preview [`Engine::validate`] checks. `allot check` validates these
    /// with the API server's own rules ([`crate::model::apivalidation`]).
    pub fn pods_as_created<'v>(&self, req: &Request<'v>) -> Vec<PodView<'v>> {
        let mut scratch = Outcome::default();
        let team = self.team(req.namespace, &mut scratch.notes);
        workload::pods_of(req.object, req.group, req.kind)
            .into_iter()
            .map(|view| if view.path.is_empty() { view } else { self.as_created(req, view, &team, &mut scratch) })
            .collect()
    }

    /// Mutation, the patch applied, then validation of the result: the API server's sequence,
    /// used by `allot check`.
    pub fn admit(&self, req: &Request<'_>) -> Admission {
        let mutation = self.mutate(req);
        let mutated = if mutation.patch.is_empty() {
            req.object.clone()
        } else {
            match patch::apply(req.object, &mutation.patch) {
                Ok(v) => v,
                Err(e) => {
                    let mut mutation = mutation;
                    mutation.notes.push(format!("the patch does not apply: {e}"));
                    return Admission { mutation, validation: Outcome::default(), mutated: req.object.clone() };
                }
            }
        };
        let validation = self.validate(&Request { object: &mutated, ..*req });
        Admission { mutation, validation, mutated }
    }
}

/// The API group and kind of a manifest from its `apiVersion` and `kind`.
pub fn group_kind(object: &Value) -> (&str, &str) {
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    (workload::group_of(api_version), kind)
}

/// `object` under review at `operation` as the tenant alice sends it, in its own namespace
/// (else `default`): the request the engine's unit tests build.
#[cfg(test)]
pub(crate) fn alices(operation: RequestOperation, object: &Value) -> Request<'_> {
    let (group, kind) = group_kind(object);
    Request {
        uid: "u",
        operation,
        group,
        kind,
        namespace: object["metadata"]["namespace"].as_str().unwrap_or("default"),
        object,
        old_object: None,
        dry_run: false,
        username: "alice",
        groups: &[],
    }
}

/// A template's denial by a tenant bound or reservation, on its workload's UPDATE: a warning.
/// The workload's pods are denied when created anyway, and a workload admitted before the check
/// (an upgrade) must stay editable (scaling, suspending, a rolling update's other fields).
fn warn_on_workload_update(mut finding: Finding, update: bool) -> Finding {
    if update && finding.action == Action::Deny {
        finding.action = Action::Warn;
        finding.message.push_str("; its pods will be denied when created");
    }
    finding
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::request::RequestOperation;
    use crate::model::namespaces::NoNamespaces;
    use crate::model::policy::{load_dir, read_sources};

    /// The shipped `policies/`.
    fn shipped() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")
    }

    /// Describing the changes is only that: the same patch, findings and notes either way, and
    /// descriptions exactly when asked for and something changed.
    #[test]
    fn change_descriptions_change_nothing_else() {
        let policies = load_dir(&shipped()).expect("shipped policies");
        let described = Engine::new(&policies, &NoNamespaces);
        let silent = described.with_change_descriptions(false);
        let mut mutated = 0;
        for name in [
            "010-mutate-create-pod-my-gpu-pod.json",
            "008-mutate-create-job-gang-a.json",
            "012-mutate-create-pod-plain-cpu-pod.json",
        ] {
            let object = crate::model::fixtures::object(name);
            let req = alices(RequestOperation::Create, &object);
            let (with, without) = (described.mutate(&req), silent.mutate(&req));
            assert_eq!(with.patch, without.patch, "{name}");
            assert_eq!(with.findings, without.findings, "{name}");
            assert_eq!(with.notes, without.notes, "{name}");
            assert!(without.changes.is_empty(), "{name}: {:?}", without.changes);
            assert_eq!(
                with.changes.is_empty(),
                with.patch.is_empty(),
                "{name}: {:?} for {:?}",
                with.changes,
                with.patch
            );
            mutated += usize::from(!with.patch.is_empty());
            // Validation previews templates without descriptions: its outcome is the engine's either way.
            assert_eq!(described.validate(&req).findings, silent.validate(&req).findings, "{name}");
        }
        assert!(mutated >= 1, "at least one fixture is mutated by the shipped policies");
    }

    /// The shipped policies with each `(from, to)` replaced in their text.
    fn shipped_with(replacements: &[(&str, &str)]) -> PolicySet {
        let sources = read_sources(&shipped()).expect("shipped policies");
        let sources: Vec<_> = sources
            .iter()
            .map(|s| crate::model::policy::Source {
                name: s.name.clone(),
                text: replacements.iter().fold(s.text.clone(), |text, (from, to)| text.replace(from, to)),
            })
            .collect();
        crate::model::policy::compile(&sources).expect("policies")
    }

    /// A JobSet whose two templates join one explicit gang: `pod` is merged into the second.
    fn jobset(second: Value) -> Value {
        let template = |name: &str| {
            serde_json::json!({"name": name, "replicas": 1, "template": {"spec": {"parallelism": 2, "template": {
                "metadata": {"labels": {"allot.dev/gang-name": "ring"}, "annotations": {"allot.dev/gang-size": "4"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "ghcr.io/example/ddp:1.0.0",
                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}})
        };
        let mut object = serde_json::json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "default"},
            "spec": {"replicatedJobs": [template("driver"), template("workers")]}
        });
        json_patch::merge(&mut object["spec"]["replicatedJobs"][1]["template"]["spec"]["template"], &second);
        object
    }

    /// Templates whose pods join one gang must agree as those pods will have to: otherwise the
    /// workload is denied at apply, naming both templates, instead of its pods one by one later.
    #[test]
    fn templates_joining_one_gang_must_agree() {
        let policies = load_dir(&shipped()).expect("shipped policies");
        let engine = Engine::new(&policies, &NoNamespaces);
        let consistency_at = |operation: RequestOperation, object: &Value| {
            let outcome = engine.validate(&alices(operation, object));
            outcome
                .findings
                .into_iter()
                .filter(|f| f.rule == RuleId::Check(Check::GangConsistency))
                .map(|f| (f.path, f.message))
                .collect::<Vec<_>>()
        };
        let consistency = |object: &Value| consistency_at(RequestOperation::Create, object);
        assert_eq!(consistency(&jobset(serde_json::json!({}))), [], "templates that agree");
        // A custom resource's template is not defaulted; its pods will be.
        let named = serde_json::json!({"spec": {"schedulerName": "default-scheduler"}});
        assert_eq!(consistency(&jobset(named)), [], "the default scheduler, named or not");
        // A workload admitted before the check stays updatable (its pods are checked as they come).
        let split = jobset(serde_json::json!({"spec": {"schedulerName": "volcano"}}));
        assert_eq!(consistency_at(RequestOperation::Update, &split), [], "UPDATE");
        let first = "spec.replicatedJobs[0].template.spec.template";
        let second = "spec.replicatedJobs[1].template.spec.template";
        for (odd, words) in [
            (
                serde_json::json!({"spec": {"schedulerName": "volcano"}}),
                "schedulerName volcano, those of FIRST default-scheduler",
            ),
            (
                serde_json::json!({"spec": {"priorityClassName": "high-priority"}}),
                "priorityClassName high-priority, those of FIRST low-priority",
            ),
            (
                serde_json::json!({"metadata": {"annotations": {"allot.dev/gang-size": "3"}}}),
                "size 3, those of FIRST 4",
            ),
        ] {
            let found = consistency(&jobset(odd));
            let expected = format!(
                "gang default/ring: this template's pods would have {}; all members of a gang must agree",
                words.replace("FIRST", first)
            );
            assert_eq!(found, [(format!("{second}.metadata"), expected)], "{words}");
        }
    }

    /// A template naming no priority class makes pods naming the cluster's `globalDefault` (the
    /// API server's Priority plugin fills it in): beside a template naming that class it agrees,
    /// beside one naming another it does not. Under a Cluster policy with no `default` class,
    /// so that Allot's own default does not decide.
    #[test]
    fn a_template_naming_no_priority_class_has_the_global_default() {
        // The Cluster's and the teams' default classes, commented out.
        let default = "default: low-priority";
        let shipped = read_sources(&shipped()).expect("shipped policies");
        assert_eq!(shipped.iter().map(|s| s.text.matches(default).count()).sum::<usize>(), 3, "default classes");
        let policies = shipped_with(&[(default, "# no default")]);
        assert_eq!(policies.priority.default, None);
        assert!(policies.teams.iter().all(|t| t.priority.default.is_none()));
        let global = policies.priority.global_default.clone().expect("the shipped Cluster names a globalDefault");
        let engine = Engine::new(&policies, &NoNamespaces);
        let consistency = |second: Value| {
            let outcome = engine.validate(&alices(RequestOperation::Create, &jobset(second)));
            outcome.findings.into_iter().filter(|f| f.rule == RuleId::Check(Check::GangConsistency)).collect::<Vec<_>>()
        };
        assert_eq!(consistency(serde_json::json!({"spec": {"priorityClassName": global}})), [], "unset and {global}");
        let denied = consistency(serde_json::json!({"spec": {"priorityClassName": "high-priority"}}));
        let first = "spec.replicatedJobs[0].template.spec.template";
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert!(
            denied[0].message.contains(&format!("priorityClassName high-priority, those of {first} {global};")),
            "{}",
            denied[0].message
        );
    }

    /// Templates whose pods the controller's labels put into one inferred gang (a JobSet, a
    /// LeaderWorkerSet group) must agree too, where the GangPolicy infers that kind and keeps the
    /// gangs its own; a template naming its own gang is compared under that one, and one that
    /// makes no pods not at all. Kubeflow jobs are not compared: their operators may fill in an
    /// empty `schedulerName`.
    #[test]
    fn templates_joining_one_inferred_gang_must_agree() {
        // The shipped set with `gangs.yaml`'s settings replaced.
        let all = "infer: [JobSet, KubeflowJob, MPIJob, LeaderWorkerSet]";
        let shipped = shipped_with(&[]);
        let only_jobsets = shipped_with(&[("infer: []", "infer: [JobSet]")]);
        let inferring = shipped_with(&[("infer: []", all)]);
        let native = shipped_with(&[("infer: []", all), ("nativeScheduling: false", "nativeScheduling: true")]);
        assert!(
            native.gang_policies.iter().any(|g| g.native_scheduling),
            "the shipped gangs.yaml names nativeScheduling"
        );
        let consistency = |policies: &PolicySet, object: &Value| {
            Engine::new(policies, &NoNamespaces)
                .validate(&alices(RequestOperation::Create, object))
                .findings
                .into_iter()
                .filter(|f| f.rule == RuleId::Check(Check::GangConsistency))
                .map(|f| (f.path, f.message))
                .collect::<Vec<_>>()
        };
        let pod = |extra: Value| {
            let mut template = serde_json::json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "w",
                "image": "ghcr.io/example/ddp:1.0.0", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}});
            json_patch::merge(&mut template, &extra);
            template
        };
        let volcano = || serde_json::json!({"spec": {"schedulerName": "volcano"}});
        let high = || serde_json::json!({"spec": {"priorityClassName": "high-priority"}});
        let jobset = |second: Value| {
            let job = |t: Value| serde_json::json!({"replicas": 1, "template": {"spec": {"template": t}}});
            serde_json::json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "js", "namespace": "default"},
                "spec": {"replicatedJobs": [job(pod(serde_json::json!({}))), job(second)]}})
        };
        let message = |gang: &str, words: &str| {
            format!("gang default/{gang}: this template's pods would have {words}; all members of a gang must agree")
        };
        let split = jobset(pod(volcano()));
        assert_eq!(consistency(&shipped, &split), [], "not inferred: nothing to compare");
        assert_eq!(
            consistency(&inferring, &split),
            [(
                "spec.replicatedJobs[1].template.spec.template.metadata".to_string(),
                message(
                    "jobset-js",
                    "schedulerName volcano, those of spec.replicatedJobs[0].template.spec.template default-scheduler"
                )
            )]
        );
        assert_eq!(consistency(&native, &split), [], "handed to native gang scheduling: not compared");
        assert_eq!(consistency(&inferring, &jobset(pod(serde_json::json!({})))), [], "templates that agree");
        for none in [serde_json::json!({"replicas": 0}), serde_json::json!({"template": {"spec": {"parallelism": 0}}})]
        {
            let mut idle = split.clone();
            json_patch::merge(&mut idle["spec"]["replicatedJobs"][1], &none);
            assert_eq!(consistency(&inferring, &idle), [], "a replicated job making no pods: {none}");
        }
        // What a tenant writes there decides nothing else: no name (one gang, `jobset-`), replica
        // counts that are not counts (compared, as making pods), a huge one.
        let mut nameless = split.clone();
        nameless["metadata"].as_object_mut().expect("metadata").remove("name");
        assert!(consistency(&inferring, &nameless)[0].1.starts_with("gang default/jobset-: "));
        for replicas in
            [serde_json::json!("0"), serde_json::json!(-1), serde_json::json!(1e300), serde_json::json!(u64::MAX)]
        {
            let mut odd = split.clone();
            odd["spec"]["replicatedJobs"][1]["replicas"] = replicas.clone();
            assert_eq!(consistency(&inferring, &odd).len(), 1, "replicas {replicas}: compared");
        }
        // A template naming its own gang joins that one, not the JobSet's.
        let own = serde_json::json!({"metadata": {"labels": {"allot.dev/gang-name": "ring"},
            "annotations": {"allot.dev/gang-size": "2"}}, "spec": {"schedulerName": "volcano"}});
        assert_eq!(consistency(&inferring, &jobset(pod(own))), [], "another gang");

        assert_eq!(
            consistency(&inferring, &jobset(pod(high()))),
            [(
                "spec.replicatedJobs[1].template.spec.template.metadata".to_string(),
                message(
                    "jobset-js",
                    "priorityClassName high-priority, those of spec.replicatedJobs[0].template.spec.template low-priority"
                )
            )]
        );
        // Kubeflow jobs are not compared (their operators may fill in an empty scheduler).
        let pytorch = serde_json::json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "kf", "namespace": "default"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod(volcano())},
                                             "Worker": {"replicas": 2, "template": pod(serde_json::json!({}))}}}});
        assert_eq!(consistency(&inferring, &pytorch), [], "a Kubeflow job");

        let lws = serde_json::json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "l", "namespace": "default"},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4,
                "leaderTemplate": pod(volcano()), "workerTemplate": pod(serde_json::json!({}))}}});
        assert_eq!(
            consistency(&inferring, &lws),
            [(
                "spec.leaderWorkerTemplate.workerTemplate.metadata".to_string(),
                message(
                    "lws-l-0",
                    "schedulerName default-scheduler, those of spec.leaderWorkerTemplate.leaderTemplate volcano"
                )
            )]
        );
        assert_eq!(consistency(&only_jobsets, &lws), [], "LeaderWorkerSets not inferred");
        assert_eq!(consistency(&only_jobsets, &split).len(), 1, "JobSets inferred");
        let mut alone = lws.clone();
        alone["spec"]["leaderWorkerTemplate"]["size"] = serde_json::json!(1);
        assert_eq!(consistency(&inferring, &alone), [], "groups of their leader alone: no worker");

        // A GangPolicy scoped to a team compares that team's templates only.
        let visions = shipped_with(&[("infer: []", "match: {teams: [vision]}\n  infer: [JobSet]")]);
        assert_eq!(visions.gang_policies.len(), 1, "the shipped set has one GangPolicy");
        let mut in_vision = split.clone();
        in_vision["metadata"]["namespace"] = serde_json::json!("vision-train");
        let found = consistency(&visions, &in_vision);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .1
                .starts_with("gang vision-train/jobset-js: this template's pods would have schedulerName volcano")
        );
        assert_eq!(consistency(&visions, &split), [], "a namespace of no team: not compared");
        let mut in_nlp = split.clone();
        in_nlp["metadata"]["namespace"] = serde_json::json!("nlp");
        assert_eq!(consistency(&visions, &in_nlp), [], "another team: not compared");
    }
}
