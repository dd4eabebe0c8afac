//! The writes the controller makes to Pods: one vocabulary for the gang plan
//! ([`crate::control::gang::plan`]) and the quota queue ([`crate::control::quota::queue`]), carried out by the
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

/// The reason of the `allot.dev/QuotaReady` condition on a queued pod.
pub const QUEUED_REASON: &str = "QuotaQueued";

/// How long the members of a waiting gang keep an explanation whose figures alone have since
/// changed ([`refreshes_figures`]). An assembling gang's text changes with every member that
/// arrives (`3/64 members present`): rewritten on every member each time, a gang of n members
/// created one by one would cost n²/2 condition writes and as many Events. A gang waiting for
/// room (or behind another) says what is free on its nodes (`…, 4 free`), which changes with
/// every pod anyone starts or deletes there: rewritten at each change, one tenant looping
/// create/delete of a 1-GPU pod would rewrite every waiting member in that pool, in every
/// namespace, each with an Event. A member that carries no explanation yet gets the current one
/// at once; a change of verdict or of its words is written at once too.
pub const COUNT_REFRESH_SECS: i64 = 10;

/// How long pods already told keep a count (or other figures) that has moved, when `told` of
/// them would be told again: [`COUNT_REFRESH_SECS`], and 10 s more per 64 beyond the first 64, so refreshing a
/// gang or a queue costs at most about 6 writes a second however large it is (a gang of 1,024
/// created one member at a time over an hour would otherwise be rewritten whole every 10 s).
///
/// A gang's own member count takes the period of its own members (`gang::plan`); the free
/// capacity the waiting gangs are told takes the period of *all* members told such figures,
/// since one pod started or deleted moves it for every gang at once: a tenant's 10,000 gangs of
/// one member each would otherwise cost 10,000 writes every 10 s while capacity moves.
pub fn refresh_secs(told: usize) -> i64 {
    COUNT_REFRESH_SECS.saturating_mul(i64::try_from(told.div_ceil(64).max(1)).unwrap_or(i64::MAX))
}

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
        /// Released on quota borrowed from this cohort: stamped `allot.dev/borrowed-from`.
        borrowed_from: Option<String>,
    },
    /// Set `allot.dev/borrowed-from: COHORT` (`cohort`), or remove it (`None`), on the pod of
    /// that `uid`: a deny-mode cohort's team's pods beyond its nominal quota carry it.
    MarkBorrowed { namespace: String, pod: String, uid: Option<std::sync::Arc<str>>, cohort: Option<String> },
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
