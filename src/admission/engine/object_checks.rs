//! The checks of the object under review as a whole, after Allot's own keys and before each
//! Pod's checks ([`super::pod_checks`]): one ordered list, one entry per check, each saying what
//! it applies to. Adding a check is adding an entry (and its test).

use serde_json::Value;

use super::{Engine, Request};
use crate::admission::finding::{Check, Finding, RuleId};
use crate::admission::tenant;
use crate::model::namespaces::TeamLookup;
use crate::model::policy::Operation;

/// The object being checked, its team, and what was found before these checks.
pub(super) struct CheckedObject<'c, 'e> {
    pub(super) engine: &'c Engine<'e>,
    pub(super) req: &'c Request<'c>,
    pub(super) operation: Operation,
    pub(super) team: &'c TeamLookup<'e>,
    pub(super) earlier: &'c [Finding],
}

impl CheckedObject<'_, '_> {
    /// A Pod UPDATE's previous object, when the review carries it.
    fn pod_update(&self) -> Option<&Value> {
        (self.req.is_pod() && self.operation == Operation::Update).then_some(self.req.old_object).flatten()
    }
}

/// What an [`ObjectCheck`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AppliesTo {
    /// A Pod UPDATE with its old object.
    PodUpdate,
    /// Any object but a Pod: a workload.
    Workload,
}

/// One entry of [`OBJECT_CHECKS`].
pub(super) struct ObjectCheck {
    /// What it checks: for the reader, and the debug log of a check that found something.
    name: &'static str,
    applies_to: AppliesTo,
    run: fn(&CheckedObject<'_, '_>) -> Vec<Finding>,
}

impl ObjectCheck {
    fn applies(&self, object: &CheckedObject<'_, '_>) -> bool {
        match self.applies_to {
            AppliesTo::PodUpdate => object.pod_update().is_some(),
            AppliesTo::Workload => !object.req.is_pod(),
        }
    }
}

/// Every check of the object as a whole, in order.
pub(super) const OBJECT_CHECKS: &[ObjectCheck] = &[
    ObjectCheck { name: "what a pod is charged", applies_to: AppliesTo::PodUpdate, run: charge_change },
    ObjectCheck { name: "a workload's size", applies_to: AppliesTo::Workload, run: owner_size },
    ObjectCheck { name: "tolerations added on update", applies_to: AppliesTo::PodUpdate, run: added_tolerations },
];

/// Runs the [`OBJECT_CHECKS`] that apply to `object`, in order; gives their findings.
pub(super) fn run(object: &CheckedObject<'_, '_>) -> Vec<Finding> {
    let mut found = Vec::new();
    for check in OBJECT_CHECKS.iter().filter(|c| c.applies(object)) {
        let findings = (check.run)(object);
        if !findings.is_empty() {
            tracing::debug!(check = check.name, findings = findings.len(), "object check");
        }
        found.extend(findings);
    }
    found
}

/// A tenant's change of what a Pod is charged against its team's quota. (A changed
/// accelerator amount is reported once, by Allot's keys check before.)
fn charge_change(object: &CheckedObject<'_, '_>) -> Vec<Finding> {
    let (Some(old), Some(quota)) = (object.pod_update(), object.team.team.and_then(|t| t.quota.as_ref())) else {
        return Vec::new();
    };
    let resized = object.earlier.iter().any(|f| f.rule == RuleId::Check(Check::TenantResize));
    if object.req.username == object.engine.allot_username || resized {
        return Vec::new();
    }
    tenant::check_charge_change(quota, old, object.req.object).into_iter().collect()
}

/// A workload that declares more pods than a gang or the tenancy bounds allow.
fn owner_size(object: &CheckedObject<'_, '_>) -> Vec<Finding> {
    let team = object.team.team.map(|t| t.name.as_str());
    tenant::check_owner_size(object.engine.policies, object.req, team).into_iter().collect()
}

/// Tolerations a Pod UPDATE adds, judged as at CREATE (`Engine::added_tolerations`).
fn added_tolerations(object: &CheckedObject<'_, '_>) -> Vec<Finding> {
    let Some(old) = object.pod_update() else { return Vec::new() };
    object.engine.added_tolerations(object.req, old, object.team)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::admission::engine::alices;
    use crate::admission::request::RequestOperation;
    use crate::model::namespaces::NoNamespaces;
    use crate::model::policy::{PolicySet, compile};

    /// The names of the checks that apply to `req`, in order.
    fn applying(policies: &PolicySet, req: &Request<'_>, operation: Operation) -> Vec<&'static str> {
        let engine = Engine::new(policies, &NoNamespaces);
        let team = TeamLookup { team: None, undecided: None };
        let object = CheckedObject { engine: &engine, req, operation, team: &team, earlier: &[] };
        OBJECT_CHECKS.iter().filter(|c| c.applies(&object)).map(|c| c.name).collect()
    }

    #[test]
    fn each_object_check_runs_where_its_entry_says() {
        let policies = compile(&[]).expect("an empty policy set");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}});
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ml"}});
        assert!(applying(&policies, &alices(RequestOperation::Create, &pod), Operation::Create).is_empty());
        let mut update = alices(RequestOperation::Update, &pod);
        assert!(applying(&policies, &update, Operation::Update).is_empty(), "no old object: nothing to compare");
        update.old_object = Some(&pod);
        assert_eq!(
            applying(&policies, &update, Operation::Update),
            ["what a pod is charged", "tolerations added on update"]
        );
        for operation in [RequestOperation::Create, RequestOperation::Update] {
            let op = if operation == RequestOperation::Create { Operation::Create } else { Operation::Update };
            assert_eq!(applying(&policies, &alices(operation, &job), op), ["a workload's size"]);
        }
    }
}
