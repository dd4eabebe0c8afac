//! What evaluation reports: findings (denials, warnings, audit notes) and notes about what could
//! not be evaluated.

use serde::Serialize;

use crate::policy::Action;

/// One failed check or rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// `Rule` name, `placement/<name>`, `accelerators/<check>` or `team/<check>`.
    pub rule: String,
    pub action: Action,
    /// Where in the object (`spec.template.spec.containers[0]`); empty for the whole object.
    pub path: String,
    pub message: String,
}

impl Finding {
    /// The message as a user reads it: the path first, when there is one.
    pub fn describe(&self) -> String {
        if self.path.is_empty() { self.message.clone() } else { format!("{}: {}", self.path, self.message) }
    }
}

/// True when any finding denies.
pub fn any_denied(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.action == Action::Deny)
}
