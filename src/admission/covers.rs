//! Native policies and the webhook together, without double work: the webhook's share of a
//! policy set once the compiled MutatingAdmissionPolicies and ValidatingAdmissionPolicies
//! ([`crate::admission::native`]) do the rest.
//!
//! What the webhook leaves out is read from the compiler's own [`Coverage`] report, never from
//! a hand list, so it follows whatever the compiler learns to cover. The reading is fail-safe:
//! a report line this module does not recognise leaves that part in the webhook (double
//! answers are possible then; a missing check is not).
//!
//! The webhook only leaves anything out when the API server says, on each request, which
//! native policies are installed beside it: `allot webhooks --native-covers` puts the
//! [`fingerprint`] of the compiled objects into the webhook paths (`/validate/native/<fp>`).
//! A server whose current policy set compiles to another fingerprint (a hot reload changed the
//! native half, or the objects were never re-applied) evaluates everything.
//!
//! The share is two policy sets compiled from the same sources as the full one:
//! - for mutation: covered Placements lose their tolerations, nodeSelector and nodeAffinity,
//!   and the default priority classes go when that mutation is native;
//! - for validation: covered Rules and accelerator checks go, and the teams' allowed priority
//!   classes when those are native. Placements and defaults stay, because the webhook previews
//!   a workload's templates as their Pods will be created (mutated) before validating them.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::admission::finding::{Check, RuleId};
use crate::admission::native::{Compiled, Coverage, Part, Subject};
use crate::model::policy::{self, LoadErrors, PolicySet, Source};

/// The parts of a policy set its native policies cover, by what the engine calls them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Covered {
    /// Built-in accelerator checks compiled for Pods and every Pod template.
    pub checks: BTreeSet<Check>,
    /// Rules compiled whole.
    pub rules: BTreeSet<String>,
    /// Placements whose tolerations, nodeSelector, nodeAffinity and nodeSelector conflicts are
    /// compiled.
    pub placements: BTreeSet<String>,
    /// The team (or cluster) default priority class.
    pub default_priority: bool,
    /// Every team's allowed priority classes.
    pub team_priority_classes: bool,
}

impl Covered {
    /// Reads the compiler's report for `policies`: from what each line is about
    /// ([`Part`]), not from its text.
    pub fn from_coverage(coverage: &[Coverage], policies: &PolicySet) -> Covered {
        let mut covered = Covered::default();
        for c in coverage {
            let whole = c.webhook_only.is_empty() && !c.compiled.is_empty();
            match &c.policy {
                Subject::AcceleratorChecks => covered.checks = accelerator_checks(c),
                Subject::DefaultPriority => covered.default_priority = whole,
                Subject::TeamPriorityClasses => covered.team_priority_classes = whole,
                Subject::Rule(name) if whole => {
                    covered.rules.insert(name.clone());
                }
                Subject::Placement(name) => {
                    if let Some(placement) = policies.placements.iter().find(|p| &p.name == name)
                        && placement_covered(c, placement)
                    {
                        covered.placements.insert(name.clone());
                    }
                }
                Subject::Rule(_) | Subject::Team(_) | Subject::Dra | Subject::GangPolicy(_) => {}
            }
        }
        covered
    }

    /// True when a finding of `rule` is the native policies' to report.
    pub fn covers(&self, rule: &RuleId) -> bool {
        match rule {
            RuleId::Rule(name) => self.rules.contains(name),
            RuleId::Placement(printed) => {
                printed.strip_prefix("placement/").is_some_and(|name| self.placements.contains(name))
            }
            RuleId::Check(Check::TeamPriorityClass) => self.team_priority_classes,
            RuleId::Check(check) => self.checks.contains(check),
        }
    }

    /// One line per covered part, for logs and `allot webhooks --native-covers`.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self.checks.iter().map(|c| format!("check {}", c.id())).collect();
        out.extend(self.rules.iter().map(|r| format!("rule {r}")));
        out.extend(
            self.placements
                .iter()
                .map(|p| format!("placement {p} (tolerations, nodeSelector, nodeAffinity, conflicts)")),
        );
        if self.default_priority {
            out.push("default priority class".into());
        }
        if self.team_priority_classes {
            out.push("check team/priority-class".into());
        }
        out
    }
}

/// The accelerator checks of the report: each compiled check, unless a webhook-only line keeps
/// it in the webhook. A webhook-only line about no single check (a template kind that could not
/// be expressed…) keeps them all, since the checks then do not hold everywhere.
fn accelerator_checks(c: &Coverage) -> BTreeSet<Check> {
    let mut kept = BTreeSet::new();
    for line in &c.webhook_only {
        match line.part {
            Part::Check(check) => kept.insert(check),
            _ => return BTreeSet::new(),
        };
    }
    c.compiled
        .iter()
        .filter_map(|line| match line.part {
            Part::Check(check) => Some(check),
            _ => None,
        })
        .filter(|check| !kept.contains(check))
        .collect()
}

/// A Placement is covered when every toleration, nodeSelector pair and its nodeAffinity are
/// reported compiled, and nothing of it stays webhook-only.
fn placement_covered(c: &Coverage, placement: &policy::Placement) -> bool {
    let spec = &placement.spec;
    let count = |part: Part| c.compiled.iter().filter(|l| l.part == part).count();
    count(Part::Toleration) == spec.tolerations.len()
        && count(Part::NodeSelector) == spec.node_selector.len()
        && (spec.node_selector.is_empty() || count(Part::SelectorConflicts) > 0)
        && !c.compiled.is_empty()
        && (spec.node_affinity.is_empty() || count(Part::NodeAffinity) > 0)
        && c.webhook_only.iter().all(|l| l.part == Part::ReserveTolerations)
}

/// Names the compiled objects: the first 12 hex digits of the SHA-256 of their YAML (what
/// `allot compile` prints). `None` when they cannot be rendered (then nothing is skipped).
pub fn fingerprint(compiled: &Compiled) -> Option<String> {
    let yaml = compiled.to_yaml().ok()?;
    let digest = Sha256::digest(yaml.as_bytes());
    Some(digest.iter().take(6).map(|b| format!("{b:02x}")).collect())
}

/// The webhook's share of a policy set, beside native policies of [`NativeSplit::fingerprint`].
#[derive(Debug)]
pub struct NativeSplit {
    /// `PolicySet::version` of the sources it was made from.
    pub version: String,
    /// The compiled objects' [`fingerprint`].
    pub fingerprint: String,
    pub covered: Covered,
    /// What `/mutate` evaluates.
    pub mutate: PolicySet,
    /// What `/validate` evaluates.
    pub validate: PolicySet,
    /// The policies map DRA DeviceClasses: a review naming `resourceClaims` is evaluated in
    /// full, since the native policies see a claim Pod as asking nothing.
    pub claims_to_webhook: bool,
}

/// Why there is no split.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error("{0}")]
    Load(#[from] LoadErrors),
    #[error("the compiled native policies cannot be rendered, so they have no fingerprint")]
    NoFingerprint,
}

impl NativeSplit {
    /// Compiles `sources` into the webhook's share (the same sources give the full set). The
    /// fingerprint is of the objects compiled for the default identity: which identity the
    /// native policies skip (`allot compile --allot-username`) changes nothing a tenant's
    /// request is checked against, so it does not part the two halves.
    pub fn from_sources(sources: &[Source]) -> Result<NativeSplit, SplitError> {
        NativeSplit::from_sources_with(sources, &policy::ClusterFacts::default())
    }

    /// [`NativeSplit::from_sources`] for a set compiled with what was read from the cluster
    /// (the server's DeviceClasses), so that its version is the set's in force.
    pub fn from_sources_with(sources: &[Source], facts: &policy::ClusterFacts) -> Result<NativeSplit, SplitError> {
        let full = policy::compile_with(sources, facts)?;
        let compiled = crate::admission::native::compile(&full);
        let fingerprint = fingerprint(&compiled).ok_or(SplitError::NoFingerprint)?;
        let covered = Covered::from_coverage(&compiled.coverage, &full);
        let mut mutate = policy::compile_with(sources, facts)?;
        let mut validate = full;
        for placement in mutate.placements.iter_mut().filter(|p| covered.placements.contains(&p.name)) {
            placement.spec.tolerations.clear();
            placement.spec.node_selector.clear();
            placement.spec.node_affinity.clear();
        }
        if covered.default_priority {
            mutate.priority.default = None;
            for team in &mut mutate.teams {
                team.priority.default = None;
            }
        }
        validate.rules.retain(|r| !covered.rules.contains(&r.name));
        let checks = &mut validate.checks;
        for check in &covered.checks {
            match check {
                Check::RequestsEqualLimits => checks.requests_equal_limits = None,
                Check::WholeNumbers => checks.whole_numbers = None,
                Check::InitContainers => checks.init_containers = None,
                Check::AllowedResources => checks.allowed_resources = None,
                Check::MaxPerContainer => checks.max_per_container = None,
                Check::MaxPerPod => checks.max_per_pod = None,
                _ => {}
            }
        }
        if covered.team_priority_classes {
            for team in &mut validate.teams {
                team.priority.allowed = None;
            }
        }
        let claims_to_webhook = !validate.device_classes.is_empty();
        Ok(NativeSplit { version: validate.version.clone(), fingerprint, covered, mutate, validate, claims_to_webhook })
    }

    /// The split for a request that names native policies `fingerprint`, when this split is
    /// of the policy set in force (`version`) and those are its native policies.
    pub fn applies(&self, version: &str, fingerprint: &str) -> bool {
        self.version == version && self.fingerprint == fingerprint
    }

    /// False for a review the webhook must answer in full whatever the native policies do:
    /// one that names DRA claims, when the policies count claim devices. Read from the raw
    /// body, before decoding: a tenant can force a full evaluation (`resourceClaims: []`),
    /// which costs only double answers, but cannot hide a claim from it: the body is the API
    /// server's own encoding of the object (Go's encoder never escapes a letter of a key).
    pub fn takes(&self, body: &[u8]) -> bool {
        !(self.claims_to_webhook && memchr::memmem::find(body, b"resourceClaims").is_some())
    }
}

#[cfg(test)]
mod tests;
