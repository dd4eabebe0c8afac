//! What the store counts as pods come and go (O(1) answers the controller asks before a walk):
//! its generation, pods and nodes, gated pods, disrupted members, members awaiting a bind.

use super::*;

impl ClusterState {
    /// A counter that changes whenever the state does.
    pub fn generation(&self) -> u64 {
        read(&self.inner).generation
    }

    /// Counts for logs and metrics: (pods, nodes, gated members). O(1).
    pub fn counts(&self) -> (usize, usize, usize) {
        let inner = read(&self.inner);
        (inner.pods.len(), inner.nodes.len(), inner.gang_gated)
    }

    /// Pods behind Allot's gang gate and behind its quota gate: when a count is 0, the pass
    /// that works on them has nothing to do and need not walk every pod. O(1).
    pub fn gated(&self) -> (usize, usize) {
        let inner = read(&self.inner);
        (inner.gang_gated, inner.quota_gated)
    }

    /// Gang members Allot released that are not bound yet ([`PodRecord::awaits_bind`]): when
    /// there are any, the gang pass has reservations to hold or end and start timeouts to
    /// apply, even with nothing gated. O(1).
    /// Members of released gangs that a disruption is taking away: with none, no pass needs
    /// to look for broken gangs.
    pub fn disrupted(&self) -> usize {
        read(&self.inner).disrupted
    }

    pub fn awaiting_bind(&self) -> usize {
        read(&self.inner).awaiting_bind
    }

    /// Bound gang members still told that their gang did not start
    /// ([`PodRecord::told_late_and_bound`]): the gang pass has conditions to set right. O(1).
    pub fn told_late(&self) -> usize {
        read(&self.inner).told_late
    }

    /// Pods Allot holds in a quota queue whose arrival is not on them yet: `(namespace, name,
    /// arrival)`. O(1) when nothing is queued: the controller's passes follow every burst of
    /// watch events, and the walk over every pod after each of them cost Allot ~11 % of its CPU
    /// with a few thousand pods and nothing queued (perf, scale.sh). While pods are queued it
    /// reads the queued pods the view keeps, not every pod.
    pub fn arrivals_to_stamp(&self) -> Vec<(String, String, i64)> {
        let inner = read(&self.inner);
        if inner.quota_gated == 0 {
            return Vec::new();
        }
        // Only queued pods need one: the view keeps them (`in_play`), no walk over every pod.
        inner
            .by_state
            .in_play
            .quota_queue_keys()
            .filter_map(|k| inner.pods.get_key(k))
            .filter(|p| p.needs_arrival_stamp())
            .filter_map(|p| Some((p.namespace.to_string(), p.name.to_string(), p.arrival?)))
            .collect()
    }

    /// How much the view holds, for the `allot_cluster_*` gauges: O(1).
    pub fn tracked(&self) -> Tracked {
        let inner = read(&self.inner);
        Tracked { pods: inner.pods.len(), gangs: inner.gangs.len(), nodes: inner.nodes.len() }
    }
}
