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
use crate::cluster::ControllerAction;

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
pub struct RefusedLifts(std::sync::Mutex<std::collections::HashSet<(String, String)>>);

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
        let first = kind == "gate"
            && self.0.lock().unwrap_or_else(|e| e.into_inner()).insert((namespace.to_string(), pod.to_string()));
        first.then(|| ControllerAction::Explain {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            ready: false,
            reason: RELEASE_REFUSED_REASON,
            message: refused_message(admission),
            warning: true,
        })
    }

    /// A member's gate was lifted: if it was told its lift was refused, it is told it is
    /// released now.
    pub fn lifted(&self, namespace: &str, pod: &str) -> Option<ControllerAction> {
        let was_refused =
            self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&(namespace.to_string(), pod.to_string()));
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
