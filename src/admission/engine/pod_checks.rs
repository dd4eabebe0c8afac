//! The checks every Pod on CREATE, and every Pod template a workload holds, goes through: one
//! ordered list, one entry per check. The engine works out once per Pod what several checks
//! read (its team, its ResourceClaims, its gang), then runs the list in order; the findings
//! come out in the list's order. Adding a check is adding an entry (and its test). A tenant's
//! UPDATE of Allot's keys and the checks of the object as a whole ([`super::object_checks`]: a
//! resize, a workload's size, tolerations added) run before these, the policies' own rules
//! after, and the quota last ([`Engine::validate`]).
//!
//! Some checks only warn where a workload is updated: a Deployment admitted under an older
//! policy must stay scalable and editable, and its pods are still checked as they come.

use serde_json::Value;

use super::{Engine, Outcome, Request, warn_on_workload_update};
use crate::admission::finding::Finding;
use crate::admission::tenant::{self, Requester};
use crate::admission::validate;
use crate::model::dra::{self, ClaimDemand};
use crate::model::gang::membership::{GangMetadataError, Membership};
use crate::model::namespaces::TeamLookup;
use crate::model::policy::{Operation, QuotaMode};
use crate::model::resources::ResourceList;
use crate::model::workload::{self, PodView};

/// One Pod (or Pod template) being checked, and what the engine worked out about it once.
pub(super) struct CheckedPod<'c, 'e> {
    pub(super) engine: &'c Engine<'e>,
    pub(super) req: &'c Request<'c>,
    pub(super) view: &'c PodView<'c>,
    pub(super) team: &'c TeamLookup<'e>,
    /// Its ResourceClaims, and the accelerators they hold.
    pub(super) claims: &'c ClaimDemand,
    pub(super) claimed: &'c ResourceList,
    /// Its gang (`Err`: the gang it names is malformed, said by the `gang` check).
    pub(super) membership: &'c Result<Option<Membership>, GangMetadataError>,
    pub(super) operation: Operation,
}

/// What a check's denial becomes on a workload UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnUpdate {
    Deny,
    Warn,
}

/// One entry of [`POD_CHECKS`].
pub(super) struct PodCheck {
    /// What it checks: for the reader, and the debug log of a check that found something
    /// (findings name their own rule).
    name: &'static str,
    on_update: OnUpdate,
    run: fn(&CheckedPod<'_, '_>) -> Vec<Finding>,
}

/// Every check of a Pod, in order.
pub(super) const POD_CHECKS: &[PodCheck] = &[
    PodCheck { name: "resource claims exist", on_update: OnUpdate::Deny, run: claims },
    PodCheck { name: "accelerator limits, requests and pools", on_update: OnUpdate::Deny, run: pod_with_claims },
    PodCheck { name: "reserved label and annotation keys", on_update: OnUpdate::Deny, run: reserved_keys },
    PodCheck { name: "accelerator amounts", on_update: OnUpdate::Deny, run: amounts },
    PodCheck { name: "resource names", on_update: OnUpdate::Warn, run: resource_names },
    PodCheck { name: "system priority classes", on_update: OnUpdate::Warn, run: system_priority_class },
    PodCheck { name: "accelerators the quota does not count", on_update: OnUpdate::Warn, run: uncounted_accelerators },
    PodCheck { name: "the quota queue's scheduler", on_update: OnUpdate::Warn, run: quota_queue_skip },
    PodCheck { name: "placement size of held pods", on_update: OnUpdate::Warn, run: placement_size },
    PodCheck { name: "gang membership", on_update: OnUpdate::Deny, run: gang },
    PodCheck { name: "pods bound past the gate", on_update: OnUpdate::Deny, run: bound_pod },
];

/// Runs [`POD_CHECKS`] over `pod`, in order, into `out`.
pub(super) fn run(pod: &CheckedPod<'_, '_>, out: &mut Vec<Finding>) {
    let update = pod.operation == Operation::Update;
    for check in POD_CHECKS {
        let findings = (check.run)(pod);
        if !findings.is_empty() {
            tracing::debug!(check = check.name, path = %pod.view.path, findings = findings.len(), "pod check");
        }
        match check.on_update {
            OnUpdate::Deny => out.extend(findings),
            OnUpdate::Warn => out.extend(findings.into_iter().map(|f| warn_on_workload_update(f, update))),
        }
    }
}

impl<'a> Engine<'a> {
    /// Runs every check of one Pod or template ([`POD_CHECKS`]); returns the gang its team's
    /// quota is charged for, and what it brings to the comparison of the workload's templates.
    pub(super) fn check_pod(
        &self,
        req: &Request<'_>,
        view: &PodView<'_>,
        team: &TeamLookup<'a>,
        (claims, claimed): (&ClaimDemand, &crate::model::resources::ResourceList),
        operation: Operation,
        out: &mut Outcome,
    ) -> (Option<Membership>, Option<validate::TemplateMember>) {
        let membership = validate::pod_gang(self.policies, view, req.namespace, team, operation == Operation::Create);
        let pod = CheckedPod { engine: self, req, view, team, claims, claimed, membership: &membership, operation };
        run(&pod, &mut out.findings);
        let template = self.template_member(req, view, team, &membership, operation);
        // A native PodGroup's member is gated and placed by the scheduler, not Allot, but its
        // team's quota is charged for the whole group, as an Allot gang's is.
        let gang = membership.ok().flatten().or_else(|| {
            let pod_group = crate::model::gang::membership::native_pod_group_of(&view.pod);
            crate::model::gang::membership::native_group(pod_group, req.namespace, self.claims)
        });
        (gang, template)
    }

    /// What a Pod template brings to the comparison of a workload's templates (at CREATE only:
    /// a workload admitted before that check, or by an older replica, must stay updatable, as
    /// Kueue toggles `suspend`; its pods are still checked as they come). A template without a
    /// gang of its own is compared under the gang its pods will be inferred into (JobSet,
    /// LeaderWorkerSet); one that makes no pods (`replicas: 0`) is not compared.
    fn template_member(
        &self,
        req: &Request<'_>,
        view: &PodView<'_>,
        team: &TeamLookup<'_>,
        membership: &Result<Option<Membership>, GangMetadataError>,
        operation: Operation,
    ) -> Option<validate::TemplateMember> {
        if view.path.is_empty()
            || operation != Operation::Create
            || !workload::template_makes_pods(req.object, req.group, req.kind, &view.path)
        {
            return None;
        }
        let inferred;
        let gang = match membership {
            Ok(Some(gang)) => gang,
            Ok(None) => {
                inferred = validate::template_inferred_gang(self.policies, view, req, team);
                inferred.as_ref()?
            }
            Err(_) => return None,
        };
        Some(validate::TemplateMember::of(view, gang, self.policies.priority.global_default.as_deref()))
    }
}

fn claims(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    validate::check_claims(p.view, p.claims, p.engine.claims.missing_phrase())
}

fn pod_with_claims(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    validate::check_pod_with_claims(p.engine.policies, p.view, p.team, p.claimed)
}

fn reserved_keys(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    tenant::check_reserved_keys(p.view)
}

fn amounts(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    tenant::check_amounts(p.engine.policies, p.view, p.claimed)
}

fn resource_names(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    tenant::check_resource_names(p.view).into_iter().collect()
}

fn system_priority_class(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    validate::check_system_priority_class(p.engine.policies, p.view, p.team).into_iter().collect()
}

fn uncounted_accelerators(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    tenant::check_uncounted_accelerators(p.engine.policies, p.view, p.claims, p.team.team).into_iter().collect()
}

/// A DaemonSet's pods come from a trusted controller, which keeps them in the quota queue
/// whatever scheduler they name: its template is not judged here.
fn quota_queue_skip(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    let (req, view) = (p.req, p.view);
    if !view.path.is_empty() && (req.group, req.kind) == ("apps", "DaemonSet") {
        return Vec::new();
    }
    let counts = |quota: &crate::model::policy::quota::Quota| {
        !quota.charge(&dra::held_quota_requests(view.requests(), p.claims)).is_empty()
    };
    tenant::check_quota_queue_skip(
        p.engine.policies,
        view,
        req.namespace,
        p.team.team,
        Requester::User(req.username),
        p.engine.workload_scheduler(req, view),
        counts,
    )
    .into_iter()
    .collect()
}

/// A pod Allot holds keeps its placement in every replica: bounded. A template's pods are held
/// when their gang is inferred from the workload too.
fn placement_size(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    let held = matches!(p.membership, Ok(Some(_)))
        || tenant::gated_by_allot(&p.view.pod)
        || (!p.view.path.is_empty() && p.engine.infers_gangs_of(p.req, p.team));
    tenant::check_placement_size(p.view, held).into_iter().collect()
}

fn gang(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    let global_default = p.engine.policies.priority.global_default.as_deref();
    validate::check_gang(p.view, p.req.namespace, p.membership, p.engine.gangs, global_default).into_iter().collect()
}

fn bound_pod(p: &CheckedPod<'_, '_>) -> Vec<Finding> {
    let (policies, view) = (p.engine.policies, p.view);
    let bypassed = || tenant::Bypassed {
        accelerators: crate::model::resources::requests_any(
            view.pod.get("spec").unwrap_or(&Value::Null),
            &policies.accelerators,
        ) || !p.claimed.is_empty(),
        gang: matches!(p.membership, Ok(Some(_))),
        queued: p.team.team.and_then(|t| t.quota.as_ref()).is_some_and(|q| {
            q.mode == QuotaMode::Queue && !q.charge(&dra::held_quota_requests(view.requests(), p.claims)).is_empty()
        }),
    };
    tenant::check_bound_pod(policies, view, Requester::User(p.req.username), bypassed).into_iter().collect()
}
