//! What the gang controller reports to Prometheus. The server creates and registers these (it
//! owns the registry); the controller only updates them, so this module knows no HTTP.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

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
    /// Writes to the API by kind (`gate`, `condition`, `event`, `delete`, `arrival`), Lease
    /// renewals aside: with nothing changing, none.
    pub writes: Family<WriteLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: &'static str,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        ControllerMetrics {
            leader: Gauge::default(),
            gangs_waiting: Family::default(),
            gang_releases: Counter::default(),
            // 1 s … ~9 h: gangs wait for members and for GPUs, not for microseconds.
            gang_wait_seconds: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
            quota_releases: Counter::default(),
            passes: Counter::default(),
            writes: Family::default(),
        }
    }
}

impl ControllerMetrics {
    /// Counts one write of `kind`.
    pub fn wrote(&self, kind: &'static str) {
        self.writes.get_or_create(&WriteLabels { kind }).inc();
    }

    /// Replaces the waiting-gang gauges with one pass's counts.
    pub fn set_waiting(&self, waiting: &std::collections::BTreeMap<&'static str, u64>) {
        self.gangs_waiting.clear();
        for (reason, n) in waiting {
            self.gangs_waiting.get_or_create(&ReasonLabels { reason }).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }
}
