//! Gate lifts that admission refuses. A lift is a Pod UPDATE, so it passes through the validating
//! webhooks and admission policies like any other; Allot's own webhook lets only Allot's
//! identity move its gates. A refusal is never a passing fault: the same lift is refused again
//! on every retry (Allot's webhook allowing another identity than the one the controller writes
//! as, a policy that does not skip Allot), and the gang stays gated for ever. So it is not
//! retried quietly: it is counted (`allot_gang_controller_refused_lifts_total`, alert
//! `AllotGateLiftsRefused`), logged as an error, and told on every member it left gated
//! (condition `GangReady=False` [`RELEASE_REFUSED_REASON`] and a Warning Event), which is
//! what `allot explain` shows.

use super::metrics::{ControllerMetrics, WriteLabels};
use crate::control::cluster::ControllerAction;

/// The condition reason of a member whose gate lift admission refused.
pub const RELEASE_REFUSED_REASON: &str = "ReleaseRefused";

/// The API server's message when an admission webhook or admission policy refused a write;
/// `None` for every other failure (a conflict, a failed `test` op, a timeout).
pub fn admission_refusal(e: &kube::Error) -> Option<&str> {
    let kube::Error::Api(status) = e else { return None };
    let message = status.message.as_str();
    let by_webhook = message.contains("admission webhook") && message.contains("denied the request");
    let by_policy = message.contains("ValidatingAdmissionPolicy");
    (by_webhook || by_policy).then_some(message)
}

/// What a member whose lift was refused is told: what refused it and what to check.
pub fn refused_message(admission: &str) -> String {
    format!(
        "Allot could not lift its gate: admission refused the update ({admission}). Allot's webhook lets \
         only the identity in allot_identity_info move its gates; it must be the one the gang controller \
         writes as (allot serve asks the API server at start: see its log)"
    )
}

/// The members whose gang-gate lift admission refused, so that each is told once (not at every
/// retry) and told again once its gate is lifted after all.
#[derive(Debug, Default)]
pub struct RefusedLifts {
    /// Told it was refused (bounded by [`MAX_TOLD`]; cleared when leadership changes).
    told: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// Refused in the pass under way: the plan's own explanation of them is dropped.
    this_pass: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
}

/// Members remembered as told at most: past it a refusal is still counted and logged, but not
/// told on the member (a long misconfiguration with churning Jobs must not grow the set).
const MAX_TOLD: usize = 10_000;

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RefusedLifts {
    /// Counts and logs a refused lift of `kind`; the explanation for the member the first
    /// time its gang-gate lift is refused.
    pub fn refused(
        &self,
        metrics: &ControllerMetrics,
        kind: &'static str,
        namespace: &str,
        pod: &str,
        admission: &str,
    ) -> Option<ControllerAction> {
        metrics.refused_lifts.get_or_create(&WriteLabels { kind }).inc();
        tracing::error!(%namespace, %pod, gate = kind, error = %admission, "admission refused Allot's gate lift: the gang stays gated until the identity Allot's webhook allows (allot_identity_info) is the one this controller writes as");
        let first = kind == "gate" && {
            let mut told = lock(&self.told);
            told.len() < MAX_TOLD && told.insert((namespace.to_string(), pod.to_string()))
        };
        first.then(|| ControllerAction::Explain {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            ready: false,
            reason: RELEASE_REFUSED_REASON,
            message: refused_message(admission),
            warning: true,
        })
    }

    /// The gang-gate lift of this member was refused in the pass under way.
    pub fn refused_now(&self, namespace: &str, pod: &str) {
        lock(&self.this_pass).insert((namespace.to_string(), pod.to_string()));
    }

    /// Drops the plan's explanations of the members refused in this pass (they keep the
    /// refusal's), and starts the next pass afresh.
    pub fn drop_plans_for_refused(&self, actions: &mut Vec<ControllerAction>) {
        let refused = std::mem::take(&mut *lock(&self.this_pass));
        if refused.is_empty() {
            return;
        }
        actions.retain(|a| match a {
            ControllerAction::Explain { namespace, pod, .. } => !refused.contains(&(namespace.clone(), pod.clone())),
            _ => true,
        });
    }

    /// Forgets every member told (a new leader starts from the pods).
    pub fn clear(&self) {
        lock(&self.told).clear();
    }

    /// A member's gate was lifted: if it was told its lift was refused, it is told it is
    /// released now.
    pub fn lifted(&self, namespace: &str, pod: &str) -> Option<ControllerAction> {
        let was_refused = lock(&self.told).remove(&(namespace.to_string(), pod.to_string()));
        was_refused.then(|| ControllerAction::Explain {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            ready: true,
            reason: "Released",
            message: "released: its gate was lifted after admission had refused an earlier lift".into(),
            warning: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status { code, message: message.into(), ..Default::default() }))
    }

    #[test]
    fn webhook_and_policy_denials_are_refusals() {
        let webhook = "admission webhook \"validate.allot.dev\" denied the request: allot denied Pod seed003/tf-a-worker-3: [tenant/allot-gates] spec.schedulingGates: only Allot (system:serviceaccount:allot-system:allot) may remove or change the scheduling gate allot.dev/gang, not admin";
        assert_eq!(admission_refusal(&api_error(400, webhook)), Some(webhook));
        let policy = "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'allot-rules' with binding 'allot-rules' denied request: no";
        assert_eq!(admission_refusal(&api_error(403, policy)), Some(policy));
        assert!(refused_message(webhook).contains("[tenant/allot-gates]"));
    }

    #[test]
    fn a_refused_member_is_told_once_keeps_the_refusal_over_the_plan_and_is_told_when_lifted() {
        let refused = RefusedLifts::default();
        let metrics = ControllerMetrics::default();
        let explain = |ready: bool| ControllerAction::Explain {
            namespace: "ml".into(),
            pod: "w-0".into(),
            ready,
            reason: "Released",
            message: "releasing".into(),
            warning: false,
        };
        refused.refused_now("ml", "w-0");
        let told = refused.refused(&metrics, "gate", "ml", "w-0", "denied");
        assert!(matches!(told, Some(ControllerAction::Explain { reason: RELEASE_REFUSED_REASON, ready: false, .. })));
        assert!(refused.refused(&metrics, "gate", "ml", "w-0", "denied").is_none(), "told once");
        // The plan's "releasing" for the refused member is dropped; others' are kept.
        let mut plans =
            vec![explain(true), ControllerAction::QuotaAdmitted { namespace: "ml".into(), pod: "w-0".into() }];
        refused.drop_plans_for_refused(&mut plans);
        assert_eq!(plans.len(), 1);
        let mut next_pass = vec![explain(true)];
        refused.drop_plans_for_refused(&mut next_pass);
        assert_eq!(next_pass.len(), 1, "only the pass that was refused");
        assert!(matches!(refused.lifted("ml", "w-0"), Some(ControllerAction::Explain { ready: true, .. })));
        assert!(refused.lifted("ml", "w-0").is_none());
        let counted = metrics.refused_lifts.get_or_create(&WriteLabels { kind: "gate" }).get();
        assert_eq!(counted, 2);
    }

    #[test]
    fn conflicts_failed_tests_and_outages_are_not_refusals() {
        for (code, message) in [
            (409, "Operation cannot be fulfilled on pods \"p\": the object has been modified"),
            (
                422,
                "the server rejected our request due to an error in our request: testing value /spec/schedulingGates/0/name failed",
            ),
            (500, "etcdserver: request timed out"),
            (404, "pods \"p\" not found"),
        ] {
            assert_eq!(admission_refusal(&api_error(code, message)), None, "{message}");
        }
    }
}
