//! What the gang controller reports to Prometheus. The server creates and registers these (it
//! owns the registry); the controller only updates them, so this module knows no HTTP.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Every reason a waiting gang's condition can give ([`super::plan`]): each is reported, at 0
/// when no gang waits for it, so alerts and dashboards see a 0 rather than no series.
pub const WAITING_REASONS: [&str; 9] = [
    "WaitingForMembers",
    "InsufficientResources",
    "WaitingForHigherPriority",
    "HeldByOtherGate",
    "MembersDisagree",
    "PlacementTooLarge",
    // Evicting lower-priority work to make room, or waiting for it to go.
    "Preempting",
    "AssemblyTimeout",
    // Released, not bound within the start timeout (counted while it is told or deleted).
    "StartTimeout",
];

/// Every kind of write the controller counts; each is reported from the start, at 0, so the
/// first write shows as an increase.
pub const WRITE_KINDS: [&str; 7] = ["gate", "condition", "event", "delete", "arrival", "evict", "mark"];

/// The gates whose lifts [`ControllerMetrics::refused_lifts`] counts.
pub const LIFT_KINDS: [&str; 2] = ["gate", "quota"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// The controller's metrics. Cheap to clone: every field shares its value.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    /// 1 on the replica holding the Lease, 0 elsewhere.
    pub leader: Gauge,
    /// Waiting gangs by the reason on their members' condition (leader only; 0 elsewhere, so a
    /// sum over replicas is right).
    pub gangs_waiting: Family<ReasonLabels, Gauge>,
    /// Gangs whose gates were lifted.
    pub gang_releases: Counter,
    /// From a gang's oldest member's creation to its release.
    pub gang_wait_seconds: Histogram,
    /// Pods released from a team's quota queue.
    pub quota_releases: Counter,
    /// Decision passes run (leader only): each change (coalesced), deadline or resync is one.
    pub passes: Counter,
    /// Writes to the API by kind (`gate`, `condition`, `event`, `delete`, `arrival`, `evict`, `mark`), Lease
    /// renewals aside: with nothing changing, none.
    pub writes: Family<WriteLabels, Counter>,
    /// Gate lifts (`gate`: the gang gate, `quota`: the quota gate) that admission refused: Allot's
    /// own webhook allowing another identity than the one the controller writes as, or a
    /// policy in the way. Every such refusal leaves gangs gated for ever: alert on any.
    pub refused_lifts: Family<WriteLabels, Counter>,
    /// Complete gangs with a required topology level that do not fit now, by that level (leader
    /// only): their messages say whether a domain or the cluster is short.
    pub gangs_waiting_for_domain: Family<LevelLabels, Gauge>,
    /// Preemptions carried out (every victim evicted), by the preemptor's team (`""`: none).
    pub preemptions: Family<TeamLabels, Counter>,
    /// Reclaims of lent quota carried out (every victim evicted), by the lender's team.
    pub reclaims: Family<TeamLabels, Counter>,
    /// Pods Allot evicted or deleted for other work, by their team and why: `Preempted` (a
    /// victim of a preemption), `Reclaimed` (borrowed work evicted for a lender of its cohort),
    /// `GangDisrupted` (the rest of a gang that lost a member).
    pub evicted_pods: Family<EvictedLabels, Counter>,
    /// Evictions a PodDisruptionBudget (or the API) refused, by the preemptor's team.
    pub refused_evictions: Family<EvictedLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TeamLabels {
    pub team: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictedLabels {
    pub team: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabels {
    pub level: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: &'static str,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        let metrics = ControllerMetrics {
            leader: Gauge::default(),
            gangs_waiting: Family::default(),
            gang_releases: Counter::default(),
            // 1 s … ~9 h: gangs wait for members and for GPUs, not for microseconds.
            gang_wait_seconds: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            quota_releases: Counter::default(),
            passes: Counter::default(),
            writes: Family::default(),
            refused_lifts: Family::default(),
            gangs_waiting_for_domain: Family::default(),
            preemptions: Family::default(),
            reclaims: Family::default(),
            evicted_pods: Family::default(),
            refused_evictions: Family::default(),
        };
        metrics.clear_waiting();
        for kind in WRITE_KINDS {
            metrics.writes.get_or_create(&WriteLabels { kind }).inc_by(0);
        }
        for kind in LIFT_KINDS {
            metrics.refused_lifts.get_or_create(&WriteLabels { kind }).inc_by(0);
        }
        metrics
    }
}

impl ControllerMetrics {
    /// Counts one write of `kind`.
    pub fn wrote(&self, kind: &'static str) {
        self.writes.get_or_create(&WriteLabels { kind }).inc();
    }

    /// Replaces the per-level gauges with one pass's counts (levels no gang waits for go).
    pub fn set_waiting_for_domain(&self, waiting: &std::collections::BTreeMap<String, u64>) {
        self.gangs_waiting_for_domain.clear();
        for (level, n) in waiting {
            let labels = LevelLabels { level: level.clone() };
            self.gangs_waiting_for_domain.get_or_create(&labels).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Sets every waiting-gang gauge to 0 (a replica that does not lead counts none).
    pub fn clear_waiting(&self) {
        self.gangs_waiting.clear();
        for reason in WAITING_REASONS {
            self.gangs_waiting.get_or_create(&ReasonLabels { reason }).set(0);
        }
    }

    /// Replaces the waiting-gang gauges with one pass's counts.
    pub fn set_waiting(&self, waiting: &std::collections::BTreeMap<&'static str, u64>) {
        self.clear_waiting();
        for (reason, n) in waiting {
            self.gangs_waiting.get_or_create(&ReasonLabels { reason }).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn waiting(m: &ControllerMetrics) -> BTreeMap<&'static str, i64> {
        WAITING_REASONS
            .iter()
            .map(|&reason| (reason, m.gangs_waiting.get_or_create(&ReasonLabels { reason }).get()))
            .collect()
    }

    #[test]
    fn every_reason_and_write_kind_is_reported_from_the_start() {
        let m = ControllerMetrics::default();
        assert!(waiting(&m).values().all(|&n| n == 0));
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("w", "w", m.gangs_waiting.clone());
        registry.register("x", "x", m.writes.clone());
        registry.register("r", "r", m.refused_lifts.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for reason in WAITING_REASONS {
            assert!(text.contains(&format!("w{{reason=\"{reason}\"}} 0")), "{text}");
        }
        for kind in WRITE_KINDS {
            assert!(text.contains(&format!("x_total{{kind=\"{kind}\"}} 0")), "{text}");
        }
        for kind in LIFT_KINDS {
            assert!(text.contains(&format!("r_total{{kind=\"{kind}\"}} 0")), "{text}");
        }
    }

    #[test]
    fn a_pass_sets_its_counts_and_zeroes_the_reasons_that_are_gone() {
        let m = ControllerMetrics::default();
        m.set_waiting(&BTreeMap::from([("AssemblyTimeout", 2), ("WaitingForMembers", 1)]));
        let w = waiting(&m);
        assert_eq!((w["AssemblyTimeout"], w["WaitingForMembers"], w["InsufficientResources"]), (2, 1, 0));
        m.set_waiting(&BTreeMap::from([("InsufficientResources", 3)]));
        let w = waiting(&m);
        assert_eq!((w["AssemblyTimeout"], w["WaitingForMembers"], w["InsufficientResources"]), (0, 0, 3));
        m.clear_waiting();
        assert!(waiting(&m).values().all(|&n| n == 0));
    }
}
