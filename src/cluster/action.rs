//! The writes the controller makes to Pods: one vocabulary for the gang plan
//! ([`crate::gang::plan`]) and the quota queue ([`crate::quota::queue`]), carried out by the
//! controller. Pure data: deciding is the plans' job, calling the API the controller's.

/// The condition type Allot sets on gang members.
pub const CONDITION: &str = "allot.dev/GangReady";

/// The reason of the `allot.dev/GangReady` condition once a released gang has not started: a
/// member Allot released is still not bound at its start timeout (`onStartTimeout: Warn`).
pub const START_TIMEOUT_REASON: &str = "StartTimeout";

/// The reason of the `DisruptionTarget` condition (and the Warning Event) on a pod Allot evicts
/// to make room for a higher-priority gang.
pub const PREEMPTED_REASON: &str = "PreemptionByAllot";

/// The condition type Allot sets on pods in a team's quota queue (False while queued, True once
/// released).
pub const QUOTA_CONDITION: &str = "allot.dev/QuotaReady";

/// Something the controller does to the API.
#[derive(Debug, Clone, PartialEq)]
pub enum ControllerAction {
    /// Lift Allot's gate (test + remove at `gate_index`, on the pod of that `uid`) and mark the
    /// member released.
    Release {
        namespace: String,
        pod: String,
        uid: Option<std::sync::Arc<str>>,
        gate_index: usize,
        has_annotations: bool,
        node: String,
        /// The topology domain the gang was released into: `(label key, value)`, added to the
        /// member's `spec.nodeSelector` in the same patch, so the scheduler cannot spread it.
        pin: Option<(String, String)>,
        has_node_selector: bool,
    },
    /// Set the `allot.dev/GangReady` condition and publish an Event, because the explanation
    /// changed.
    Explain { namespace: String, pod: String, ready: bool, reason: &'static str, message: String, warning: bool },
    /// Lift the quota gate (test + remove at `gate_index`, on the pod of that `uid`) and stamp
    /// `allot.dev/quota-released`: the team has room.
    ReleaseQuota {
        namespace: String,
        pod: String,
        uid: Option<std::sync::Arc<str>>,
        gate_index: usize,
        has_annotations: bool,
    },
    /// Say that a pod left its team's queue (condition + Event), after its quota gate was lifted.
    QuotaAdmitted { namespace: String, pod: String },
    /// Say why a pod stays in its team's queue (condition + Event), because the reason changed.
    Queued { namespace: String, pod: String, message: String },
    /// Delete a member (assembly timeout with `onTimeout: Fail`, start timeout with
    /// `onStartTimeout: Fail`), after a Warning Event with `event_reason` and `reason`. The
    /// `uid` is a precondition: a pod made again under the name since the pass decided (a
    /// LeaderWorkerSet's or StatefulSet's stable names) is another pod, and is not deleted.
    Delete {
        namespace: String,
        pod: String,
        uid: Option<std::sync::Arc<str>>,
        event_reason: &'static str,
        reason: String,
    },
}
