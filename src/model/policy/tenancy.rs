//! The Cluster policy's trust and bounds settings, compiled: which foreign schedulers the
//! cluster runs, which identities are trusted for what tenants may not do, and the largest
//! accelerator amount a Pod may ask for. [`crate::admission::tenant`] applies them to requests.

use super::model::{ClusterSpec, ExternalScheduler};

/// The most of one accelerator resource a Pod may ask for when the Cluster policy sets no
/// `accelerators.maxAmount`: above any node built today, far below amounts that overflow.
pub const DEFAULT_MAX_AMOUNT: u32 = 1024;

/// What the Cluster policy says about trust and bounds, compiled.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    /// Foreign gang/queue managers the cluster runs; their markers exempt Pods from Allot's gates.
    pub external_schedulers: Vec<ExternalScheduler>,
    /// Identities whose DaemonSet-owned Pods are never gated.
    pub daemon_set_controllers: Vec<String>,
    /// Identities that may create accelerator Pods with `spec.nodeName`.
    pub bound_pod_creators: Vec<String>,
    /// Identities that may lift Kueue's gate and add its flavors' tolerations.
    pub kueue_controllers: Vec<String>,
    /// The scheduler names Volcano and the coscheduling plugin place pods under.
    pub volcano_schedulers: Vec<String>,
    pub coscheduling_schedulers: Vec<String>,
    /// The most of one accelerator resource per Pod.
    pub max_amount: u32,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        TenantPolicy::from_cluster(&ClusterSpec::default())
    }
}

impl TenantPolicy {
    /// True where the cluster runs Kueue and `username` is one of its trusted identities.
    pub fn is_kueue(&self, username: &str) -> bool {
        self.external_schedulers.contains(&ExternalScheduler::Kueue)
            && self.kueue_controllers.iter().any(|k| k == username)
    }

    /// From the Cluster document (or its defaults).
    pub fn from_cluster(cluster: &ClusterSpec) -> TenantPolicy {
        TenantPolicy {
            external_schedulers: cluster.external_schedulers.clone(),
            daemon_set_controllers: cluster.trust.daemon_set_controllers.clone(),
            bound_pod_creators: cluster.trust.bound_pod_creators.clone(),
            kueue_controllers: cluster.trust.kueue_controllers.clone(),
            volcano_schedulers: cluster.scheduler_names.volcano.clone(),
            coscheduling_schedulers: cluster.scheduler_names.coscheduling.clone(),
            max_amount: cluster.accelerators.max_amount.unwrap_or(DEFAULT_MAX_AMOUNT),
        }
    }
}
