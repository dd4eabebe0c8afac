//! What evaluation reports: findings (denials, warnings, audit notes) and notes about what could
//! not be evaluated, each naming the rule behind it as a [`RuleId`].

use std::fmt;

use serde::{Serialize, Serializer};

use crate::model::policy::Action;

/// One failed check or rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: RuleId,
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

/// Which rule a finding comes from. Code that decides on a finding matches on this type; the
/// printed form ([`RuleId::as_str`]: a `Rule` name, `placement/<name>`, `accelerators/<check>`,
/// `team/<check>`, `gang/<check>`, `tenant/<check>`, `api-server/validation`) is what messages,
/// metrics labels, `allot check` output and test files' `expect:` lists show, and is stable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleId {
    /// A `Rule` document, by its name.
    Rule(String),
    /// A Placement's condition or nodeSelector conflict; holds the printed `placement/<name>`.
    Placement(String),
    /// One of Allot's built-in checks.
    Check(Check),
}

impl RuleId {
    /// The id of the Placement named `name`.
    pub fn placement(name: &str) -> Self {
        RuleId::Placement(format!("placement/{name}"))
    }

    /// The printed id.
    pub fn as_str(&self) -> &str {
        match self {
            RuleId::Rule(name) | RuleId::Placement(name) => name,
            RuleId::Check(check) => check.id(),
        }
    }
}

impl From<Check> for RuleId {
    fn from(check: Check) -> Self {
        RuleId::Check(check)
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RuleId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl PartialEq<str> for RuleId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RuleId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Allot's built-in checks, grouped by the family that prefixes their printed id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// `accelerators/quantity`: an accelerator amount that does not parse.
    AcceleratorQuantity,
    /// `accelerators/requests-equal-limits`.
    RequestsEqualLimits,
    /// `accelerators/whole-numbers`.
    WholeNumbers,
    /// `accelerators/init-containers`.
    InitContainers,
    /// `accelerators/allowed-resources`.
    AllowedResources,
    /// `accelerators/max-per-container`.
    MaxPerContainer,
    /// `accelerators/max-per-pod`.
    MaxPerPod,
    /// `accelerators/claims`: a DRA claim or claim template the pod names that cannot be found.
    Claims,
    /// `gang/metadata`: gang labels or annotations that do not parse or exceed the bound.
    GangMetadata,
    /// `gang/consistency`: a member that disagrees with its gang's existing members.
    GangConsistency,
    /// `team/quota`: deny-mode quota exceeded.
    TeamQuota,
    /// `team/priority-class`: a priority class the team may not use.
    TeamPriorityClass,
    /// `tenant/reserved-keys`: Allot's reserved labels and annotations, changed by a tenant.
    TenantReservedKeys,
    /// `tenant/allot-gates`: Allot's scheduling gates, moved by a tenant.
    TenantAllotGates,
    /// `tenant/amount`: an accelerator amount over the Cluster's bound.
    TenantAmount,
    /// `tenant/gang-size`: an owner implying a gang over the bound.
    TenantGangSize,
    /// `tenant/bound-pod`: a change to a pod already bound to a node.
    TenantBoundPod,
    /// `tenant/resize`: a change of what a pod is charged.
    TenantResize,
    /// `tenant/ephemeral-containers`: ephemeral containers asking for accelerators.
    TenantEphemeralContainers,
    /// `tenant/tolerations`: a toleration of a taint a Placement keeps for the pods it places.
    TenantTolerations,
    /// `tenant/resource-names`: more distinct resource names than a pod may ask.
    TenantResourceNames,
    /// `tenant/placement-size`: a pod Allot holds whose nodeSelector, required node affinity or
    /// tolerations are over the bounds of [`crate::model::gang::bounds`].
    TenantPlacementSize,
    /// `api-server/validation`: what the API server itself would refuse (`allot check` only).
    ApiServerValidation,
}

impl Check {
    /// The printed id.
    pub const fn id(self) -> &'static str {
        match self {
            Check::AcceleratorQuantity => "accelerators/quantity",
            Check::RequestsEqualLimits => "accelerators/requests-equal-limits",
            Check::WholeNumbers => "accelerators/whole-numbers",
            Check::InitContainers => "accelerators/init-containers",
            Check::AllowedResources => "accelerators/allowed-resources",
            Check::MaxPerContainer => "accelerators/max-per-container",
            Check::MaxPerPod => "accelerators/max-per-pod",
            Check::Claims => "accelerators/claims",
            Check::GangMetadata => "gang/metadata",
            Check::GangConsistency => "gang/consistency",
            Check::TeamQuota => "team/quota",
            Check::TeamPriorityClass => "team/priority-class",
            Check::TenantReservedKeys => "tenant/reserved-keys",
            Check::TenantAllotGates => "tenant/allot-gates",
            Check::TenantAmount => "tenant/amount",
            Check::TenantGangSize => "tenant/gang-size",
            Check::TenantBoundPod => "tenant/bound-pod",
            Check::TenantResize => "tenant/resize",
            Check::TenantEphemeralContainers => "tenant/ephemeral-containers",
            Check::TenantTolerations => "tenant/tolerations",
            Check::TenantResourceNames => "tenant/resource-names",
            Check::TenantPlacementSize => "tenant/placement-size",
            Check::ApiServerValidation => "api-server/validation",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_as_before_and_compare_with_their_text() {
        assert_eq!(RuleId::placement("pool").as_str(), "placement/pool");
        assert_eq!(RuleId::Rule("no-latest".into()).to_string(), "no-latest");
        assert_eq!(RuleId::from(Check::TenantResize), "tenant/resize");
        assert_eq!(serde_json::to_value(RuleId::from(Check::MaxPerPod)).unwrap(), "accelerators/max-per-pod");
    }
}
