//! The cluster view that gangs, quotas and metrics read: what the watches saw of Pods and
//! Nodes ([`records`]), kept and indexed in one store ([`store`]), with usage sums and the
//! per-team gauges on top ([`usage`]) and what each gang counts against a quota ([`tally`]);
//! and the vocabulary of writes the controller makes back ([`action`]); the Pod as its watch
//! decodes it ([`watched`]: only the fields a record reads). It belongs to no feature: the gang snapshot (`gang::snapshot`) and the quota
//! queue (`quota::queue`) are built on it, not in it.

pub mod action;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod records;
pub mod store;
pub mod usage;
#[cfg(test)]
pub(crate) mod watch_events;
pub mod watched;

#[cfg(test)]
mod tests;

pub use action::{CONDITION, ControllerAction, QUOTA_CONDITION};
pub use records::{
    DISRUPTION_TARGET, DisruptionCause, GangRef, NodeInfo, Owner, Placement, PodRecord, PodShape, PodUid, node_info,
    shape_of,
};
pub use store::{ClusterState, ClusterView, Devices, Tracked};
pub use usage::{AcceleratorGauge, AcceleratorUsage, Gate, GateGauge, QuotaGauge, UsageState};
pub use watched::WatchedPod;
