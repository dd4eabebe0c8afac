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

/// A Pod view whose quota is still to be charged: its gang membership and DRA claims.
type QuotaView<'v> = (PodView<'v>, Option<crate::model::gang::membership::Membership>, ClaimDemand);

mod object_checks;
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
        out.findings.extend(m.gang_error.map(|error| validate::gang_metadata_finding("", error.to_string())));
        out
    }

    /// The validating webhook: built-in checks and rules on the Pod, or on each Pod template of
    /// a workload (as its Pods will be after mutation), and rules on the object itself.
    pub fn validate(&self, req: &Request<'_>) -> Outcome {
        let mut out = Outcome::default();
        let Some(operation) = req.operation.as_rule_operation() else {
            return out;
        };
        let is_pod = req.is_pod();
        // Before anything else: only Allot moves its gates and keys, whatever the rest holds.
        if is_pod && operation == Operation::Update {
            self.check_allot_keys(req, &mut out);
        }
        if req.group == "resource.k8s.io" && req.kind == "ResourceClaim" {
            self.check_claim(req, operation, &mut out);
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
        let object = object_checks::CheckedObject { engine: self, req, operation, team: &team, earlier: &out.findings };
        let found = object_checks::run(&object);
        out.findings.extend(found);
        let charges = self.check_pod_views(req, views, &team, &object_target, &mut out);
        if !is_pod {
            self.run_rules(req, Subject::Object(req.object), &team, &object_target, &mut out);
        }
        // Quota last, and only for what is otherwise admitted: a denied pod reserves nothing.
        if out.allowed() {
            for (view, gang, claims) in &charges {
                let live = view.path.is_empty() && operation == Operation::Create;
                let book: &dyn QuotaBook = if live { self.quota } else { &NoUsage };
                out.findings.extend(validate::check_quota(
                    view,
                    gang.as_ref(),
                    claims,
                    req,
                    &team,
                    (book, &self.policies.cohorts),
                ));
            }
        }
        out
    }

    /// A tenant's Pod UPDATE may not move Allot's gates and reserved keys.
    fn check_allot_keys(&self, req: &Request<'_>, out: &mut Outcome) {
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

    /// A ResourceClaim created under a name pods already wait for (DRA accounting).
    fn check_claim(&self, req: &Request<'_>, operation: Operation, out: &mut Outcome) {
        if operation == Operation::Create && !self.policies.device_classes.is_empty() {
            let name = Fields::field(req.object, &["metadata", "name"]).and_then(Value::as_str);
            let pods = name.map(|n| self.gangs.pods_naming_claim(req.namespace, n)).unwrap_or_default();
            out.findings.extend(name.and_then(|n| validate::check_claim_create(n, &pods)));
        }
    }

    /// The Pod checks and Rules of every Pod view (the Pod itself, or a workload's templates);
    /// gives the views whose quota is still to be charged.
    fn check_pod_views<'v>(
        &self,
        req: &Request<'_>,
        views: Vec<PodView<'v>>,
        team: &TeamLookup<'_>,
        object_target: &Target<'_>,
        out: &mut Outcome,
    ) -> Vec<QuotaView<'v>> {
        let is_pod = req.is_pod();
        let operation = object_target.operation;
        let mut charges = Vec::new();
        let mut template_gangs = Vec::new();
        for view in views {
            let view = if view.path.is_empty() { view } else { self.as_created(req, view, team, out) };
            // Pod specs are immutable after CREATE: re-checking them on UPDATE would only block
            // label edits and our own gate removal on pods admitted under older policies.
            let checked = !(is_pod && operation == Operation::Update);
            let mut gang = None;
            let claims = self.claim_demand(req, &view.pod);
            let claimed = claims.accelerators(&self.policies.device_classes);
            if checked {
                let template;
                (gang, template) = self.check_pod(req, &view, team, (&claims, &claimed), operation, out);
                template_gangs.extend(template);
            }
            let target = Target { is_pod: true, path: &view.path, ..*object_target };
            self.run_rules(req, Subject::Pod(&view), team, &target, out);
            if checked {
                charges.push((view, gang, claims));
            }
        }
        out.findings.extend(validate::check_template_gangs(req.namespace, &template_gangs));
        charges
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
    pub(super) fn added_tolerations(&self, req: &Request<'_>, old: &Value, team: &TeamLookup<'a>) -> Vec<Finding> {
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
mod tests;
