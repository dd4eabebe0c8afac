//! `preemption` of a Team (defaults in the Cluster): whom a waiting gang of the team may evict to
//! make room, and how long the team's own work runs before anyone may evict it.
//!
//! The gang controller preempts for a complete gang that does not fit (see
//! [`crate::control::gang::decision`]): only work of a strictly lower priority, plain pods and whole
//! released gangs, cheapest first. These settings are the platform's, written in Git: a tenant
//! steers nothing but her pods' priority class (which her Team bounds) and her own pods'
//! `preemptionPolicy: Never`, which only makes them gentler.

use serde::{Deserialize, Serialize};

/// Whether a gang may evict work of a lower priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum PreemptionRule {
    /// Work of a strictly lower priority may be evicted.
    LowerPriority,
    /// Nothing is evicted.
    Never,
}

/// `preemption` as written (every field optional: a Team's fields override the Cluster's,
/// which override the defaults).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreemptionSpec {
    /// Whether the team's gangs may evict the team's own lower-priority work (default
    /// `LowerPriority`, as the scheduler does for plain pods).
    pub within_team: Option<PreemptionRule>,
    /// Whether the team's gangs may evict other teams' (and team-less namespaces')
    /// lower-priority work (default `LowerPriority`).
    pub other_teams: Option<PreemptionRule>,
    /// How long the team's work runs before it may be evicted by anyone's preemption (`30m`;
    /// default `0s`). Counted from a pod's creation, or a gang member's release.
    #[schemars(schema_with = "super::fields::duration")]
    pub min_runtime: Option<String>,
}

/// Why a `preemption` block is refused; the message starts with its field path below `spec.`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PreemptionSpecError {
    #[error("preemption.minRuntime: {0}")]
    MinRuntime(super::DurationError),
}

impl PreemptionSpecError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PreemptionSpecError::MinRuntime(_) => "min_runtime",
        }
    }
}

/// What a team's `preemption` comes to, after the Cluster's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemption {
    pub within_team: bool,
    pub other_teams: bool,
    /// Seconds a victim of this team must have run.
    pub min_runtime: i64,
}

impl Default for Preemption {
    fn default() -> Self {
        Preemption { within_team: true, other_teams: true, min_runtime: 0 }
    }
}

impl Preemption {
    /// `spec`'s fields over `self`; a bad `minRuntime` is an error naming the field.
    pub fn overlaid(self, spec: &PreemptionSpec) -> Result<Preemption, PreemptionSpecError> {
        let allows =
            |rule: Option<PreemptionRule>, default| rule.map_or(default, |r| r == PreemptionRule::LowerPriority);
        let min_runtime = match &spec.min_runtime {
            None => self.min_runtime,
            Some(raw) => {
                let d = super::parse_duration(raw).map_err(PreemptionSpecError::MinRuntime)?;
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
            }
        };
        Ok(Preemption {
            within_team: allows(spec.within_team, self.within_team),
            other_teams: allows(spec.other_teams, self.other_teams),
            min_runtime,
        })
    }

    /// Whether a gang of this team may evict at all.
    pub fn evicts_anyone(&self) -> bool {
        self.within_team || self.other_teams
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_overrides_only_the_fields_it_writes() {
        let cluster = Preemption::default()
            .overlaid(&PreemptionSpec { min_runtime: Some("10m".into()), ..Default::default() })
            .unwrap();
        assert_eq!(cluster, Preemption { within_team: true, other_teams: true, min_runtime: 600 });
        let team = cluster
            .overlaid(&PreemptionSpec { other_teams: Some(PreemptionRule::Never), ..Default::default() })
            .unwrap();
        assert_eq!(team, Preemption { within_team: true, other_teams: false, min_runtime: 600 });
        assert!(team.evicts_anyone());
        let never =
            team.overlaid(&PreemptionSpec { within_team: Some(PreemptionRule::Never), ..Default::default() }).unwrap();
        assert!(!never.evicts_anyone());
    }

    #[test]
    fn a_bad_min_runtime_names_the_field() {
        let e = Preemption::default()
            .overlaid(&PreemptionSpec { min_runtime: Some("soon".into()), ..Default::default() })
            .unwrap_err();
        assert_eq!(e.metric_label(), "min_runtime");
        let e = e.to_string();
        assert!(e.starts_with("preemption.minRuntime: invalid duration \"soon\""), "{e}");
    }
}
