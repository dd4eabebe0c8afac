//! What the controller marks on records before the watch shows it (a release, a quota lift, a
//! deletion, an arrival stamp, a condition written), so the next pass does not act twice; each
//! mark is a [`Flight`] until the watch echoes it or the wait ends.

use super::*;

impl Inner {
    /// A watch event of a pod the controller is deleting, older than the deletion (the echo of a
    /// status patch made before it, the scheduler's update): the pod stays marked as being
    /// deleted, or a pass meanwhile would take it for present and delete it again, with a second
    /// Event (and its gang's other members, taken down by the same disruption, once more). The
    /// mark ends when the watch shows the deletion or the pod gone, for another pod under the
    /// name, or after [`ECHO_WAIT`].
    pub(super) fn keep_deleting_mark(&mut self, key: &Key, record: &mut PodRecord) {
        let Some((uid, since)) = self.deleting.get(key) else { return };
        let echoed = record.terminating || record.finished;
        if echoed || *uid != record.uid || since.elapsed() > ECHO_WAIT {
            self.deleting.remove(key);
        } else {
            record.terminating = true;
        }
    }
}

impl ClusterState {
    /// Marks members released locally at `at` (seconds since the epoch), before the API
    /// confirms, so the next pass already counts their reservation.
    pub fn mark_released(&self, namespace: &str, names: &[String], at: i64) {
        let mut guard = write(&self.inner);
        let inner = &mut *guard;
        for n in names {
            if let Some(p) = inner.pods.get_mut(namespace, n) {
                let awaited = p.awaits_bind();
                // In place, so the sums by state move with it (released: no longer gang-gated).
                inner.by_state.delta(p, -1);
                let was_gated = p.gate_index.take().is_some();
                p.released_at = Some(at);
                p.gang_released = true;
                inner.by_state.delta(p, 1);
                let awaits = p.awaits_bind();
                if was_gated {
                    inner.gang_gated = inner.gang_gated.saturating_sub(1);
                }
                if awaits && !awaited {
                    inner.awaiting_bind += 1;
                }
            }
        }
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// A released member now carries the node selector `key: value` (its gang's topology
    /// domain): its record's placement says so before the watch shows the patch.
    pub fn pin_placement(&self, namespace: &str, name: &str, key: &str, value: &str) {
        let mut inner = write(&self.inner);
        if let Some(p) = inner.pods.get_mut(namespace, name) {
            p.pin_placement(key, value);
        }
    }

    /// Marks a pod's quota gate lifted locally at `at` (seconds since the epoch), before the
    /// watch confirms it. A gang gate after it moves up one place, so a release in the same pass
    /// tests and removes the right index.
    pub fn mark_quota_released(&self, namespace: &str, name: &str, at: i64) {
        let mut guard = write(&self.inner);
        let inner = &mut *guard;
        if let Some(p) = inner.pods.get_mut(namespace, name) {
            // What the lift patch wrote in `allot.dev/quota-released` (so the pod has
            // annotations now: a gang release in the same pass adds its key to them).
            let awaited = p.awaits_bind();
            // In place, so the sums by state move with it (no longer quota-queued).
            inner.by_state.delta(p, -1);
            p.released_at = p.released_at.max(Some(at));
            let newly_awaits = p.awaits_bind() && !awaited;
            p.has_annotations = true;
            if let (Some(quota), Some(gang)) = (p.quota_gate_index, p.gate_index)
                && gang > quota
            {
                p.gate_index = Some(gang - 1);
            }
            let was_queued = p.quota_gate_index.take().is_some();
            inner.by_state.delta(p, 1);
            if was_queued {
                inner.quota_gated = inner.quota_gated.saturating_sub(1);
            }
            if newly_awaits {
                inner.awaiting_bind += 1;
            }
        }
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Marks a pod's `allot.dev/borrowed-from` as set (`borrowed`) or removed before the watch
    /// shows the write, so the next pass does not send it again (the writer sets it back when
    /// the write fails).
    pub fn mark_borrowed(&self, namespace: &str, name: &str, borrowed: bool) {
        let mut guard = write(&self.inner);
        let inner = &mut *guard;
        if let Some(p) = inner.pods.get_mut(namespace, name) {
            // In place, so the kept count of marked pods moves with it.
            inner.by_state.delta(p, -1);
            p.borrowed_mark = borrowed;
            p.has_annotations |= borrowed;
            inner.by_state.delta(p, 1);
        }
    }

    /// Resolves after the next change (or at once if one happened since the last wait): the
    /// controller's decision loop waits on it instead of polling.
    pub async fn changed(&self) {
        self.wake.notified().await
    }

    /// Records that the controller is deleting the pod (assembly timeout under `onTimeout:
    /// Fail`) before the watch says so: the next pass must not count it as a member again and
    /// delete it twice (CI saw the second member deleted again, 404, with a second Event, when a
    /// pass ran between the two deletions' watch events). `false` when the deletion failed
    /// (a later pass tries again). Only the pod of `uid`, when given: a pod made again under
    /// the name since the pass decided is not the one being deleted.
    pub fn mark_deleting(&self, namespace: &str, name: &str, uid: Option<&str>, deleting: bool) {
        let mut inner = write(&self.inner);
        let Some(record) = inner.pods.get(namespace, name) else { return };
        if record.terminating == deleting
            || record.finished
            || uid.is_some_and(|u| !record.uid.as_ref().is_some_and(|kept| kept.is(u)))
        {
            return;
        }
        let mut record = record.clone();
        record.terminating = deleting;
        let (key, uid) = (record.key(), record.uid.clone());
        // The mark goes before the record is indexed again (which would keep it), and comes
        // after (which, seeing the record terminating, would end it).
        inner.deleting.remove(&key);
        // Re-indexed whole: the gang tallies count terminating members apart.
        inner.index(record);
        if deleting {
            inner.deleting.insert(key, (uid, std::time::Instant::now()));
        }
    }

    /// Records that the pod's arrival is being written (`allot.dev/arrival`), so it is not
    /// written twice before the watch echoes it; `false` when the write failed (try again).
    pub fn mark_arrival_stamped(&self, namespace: &str, name: &str, stamped: bool) {
        let mut inner = write(&self.inner);
        if let Some(p) = inner.pods.get_mut(namespace, name) {
            p.arrival_stamped = stamped;
        }
    }

    /// Records the condition the controller is writing on a pod (see
    /// [`PodRecord::gang_condition`]), so it is not written again before the watch echoes it;
    /// watch events of the pod meanwhile keep the mark until the write completes
    /// ([`ClusterState::condition_landed`], [`ClusterState::unmark_condition`]).
    pub fn mark_condition(&self, namespace: &str, name: &str, quota: bool, fingerprint: u64) {
        let mut inner = write(&self.inner);
        let key = key(namespace, name);
        let Some(p) = inner.pods.get_mut(namespace, name) else { return };
        if quota {
            p.quota_condition = fingerprint;
        } else {
            p.gang_condition = fingerprint;
        }
        inner.conditions_in_flight.entry(key).or_default()[usize::from(quota)] = Flight { fingerprint, landed: None };
    }

    /// The write of `fingerprint` completed. The mark stays until the watch echoes it (an event
    /// the watch delivers late, older than the write, still carries the pod without it), or
    /// for [`ECHO_WAIT`] at most.
    pub fn condition_landed(&self, namespace: &str, name: &str, quota: bool, fingerprint: u64) {
        let mut inner = write(&self.inner);
        if let Some(slot) = inner.flight(&key(namespace, name), quota, fingerprint) {
            slot.landed = Some(std::time::Instant::now());
        }
    }

    /// Undoes [`ClusterState::mark_condition`] of `fingerprint` (a write that failed), unless
    /// the pod's record carries another condition by now (a newer one on its way, or the watch's).
    pub fn unmark_condition(&self, namespace: &str, name: &str, quota: bool, fingerprint: u64) {
        let mut inner = write(&self.inner);
        let key = key(namespace, name);
        inner.end_flight(&key, quota, fingerprint);
        if let Some(p) = inner.pods.get_mut(namespace, name) {
            let marked = if quota { &mut p.quota_condition } else { &mut p.gang_condition };
            if *marked == fingerprint {
                *marked = 0;
            }
        }
    }
}

/// One condition the controller wrote (or is writing) on a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Flight {
    /// Its fingerprint ([`crate::control::cluster::records::condition_fingerprint`]); 0: none.
    pub(super) fingerprint: u64,
    /// When its write completed; `None` while under way.
    pub(super) landed: Option<std::time::Instant>,
}

impl Flight {
    /// What the record of a watch event carrying condition fingerprint `seen` holds: the
    /// flight's fingerprint while it flies; the watch's once the event echoes the write, or the
    /// write landed more than [`ECHO_WAIT`] ago (the flight ends then).
    pub(super) fn follow(&mut self, seen: u64, now: std::time::Instant) -> u64 {
        let echoed = seen == self.fingerprint;
        let waited_out = self.landed.is_some_and(|at| now.saturating_duration_since(at) >= ECHO_WAIT);
        if self.fingerprint == 0 || echoed || waited_out {
            *self = Flight::default();
            seen
        } else {
            self.fingerprint
        }
    }
}

#[cfg(test)]
mod flight_tests {
    use super::{ECHO_WAIT, Flight};
    use std::time::{Duration, Instant};

    #[test]
    fn a_flight_holds_its_mark_until_the_echo_or_the_wait_ends() {
        let now = Instant::now();
        let mut none = Flight::default();
        assert_eq!(none.follow(7, now), 7, "no flight: the watch's");

        let mut under_way = Flight { fingerprint: 5, landed: None };
        assert_eq!(under_way.follow(0, now + ECHO_WAIT * 10), 5, "no wait while the write is under way");
        assert_eq!(under_way.follow(3, now), 5, "another condition seen (an older one): still ours");
        assert_eq!(under_way, Flight { fingerprint: 5, landed: None });
        assert_eq!(under_way.follow(5, now), 5, "the echo");
        assert_eq!(under_way, Flight::default(), "ends the flight");

        let mut landed = Flight { fingerprint: 5, landed: Some(now) };
        assert_eq!(landed.follow(0, now + ECHO_WAIT - Duration::from_millis(1)), 5);
        assert_eq!(landed.follow(3, now + ECHO_WAIT), 3, "waited out: the watch's");
        assert_eq!(landed, Flight::default());
    }
}

#[cfg(test)]
mod tests {
    use crate::control::cluster::ClusterState;
    use crate::control::cluster::watch_events::{Spec, Stand, make};

    /// The uid `make` gives generation 0 of pod 0: the API server's form (generation 1's is not).
    const FIRST: &str = "00000000-0000-4000-8000-000000000000";

    /// A pod the controller deletes stays marked as being deleted through watch events older
    /// than the deletion (a status patch's echo), until the watch shows the deletion; not for
    /// another pod made under the name, nor once the deletion failed.
    #[test]
    fn a_deletion_mark_outlives_older_watch_events() {
        let state = ClusterState::default();
        let pod = Spec { gang: Some((0, 2)), ..Spec::plain(0, Stand::Bound) };
        let terminating = |state: &ClusterState| state.view().pod("ml", "p0").is_some_and(|p| p.terminating);
        state.upsert_pod(make(&pod));
        state.mark_deleting("ml", "p0", Some(FIRST), true);
        assert!(terminating(&state));
        state.upsert_pod(make(&pod));
        assert!(terminating(&state), "the echo of a patch made before the deletion");
        assert_eq!(state.gang_tally("ml", "g0").live, 0, "no member present for its gang");
        state.upsert_pod(make(&Spec { terminating: true, ..pod.clone() }));
        state.upsert_pod(make(&pod));
        assert!(!terminating(&state), "the watch showed the deletion: its view wins again");

        state.mark_deleting("ml", "p0", Some(FIRST), true);
        state.upsert_pod(make(&Spec { generation: 1, ..pod.clone() }));
        assert!(!terminating(&state), "another pod under the name");

        state.mark_deleting("ml", "p0", Some("uid-0-1"), true);
        state.mark_deleting("ml", "p0", Some("uid-0-1"), false);
        assert!(!terminating(&state), "the deletion failed: present again at once");
        state.upsert_pod(make(&Spec { generation: 1, ..pod }));
        assert!(!terminating(&state), "and after the next watch event");
    }
}
