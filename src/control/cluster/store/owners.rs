//! The owners of gangs, as the store keeps them: sizes read from owner objects (with a doubling
//! backoff per owner whose read fails), the hand-offs to native PodGroups, and which owners a
//! pass should read.

use super::*;

impl ClusterState {
    /// Records what an inferred gang's owner declares (nothing when the gang has no pod left).
    pub fn set_owner_gang(&self, namespace: &str, gang: &str, owner: OwnerGang) {
        let mut inner = write(&self.inner);
        if !inner.has_gang(namespace, gang) {
            return;
        }
        let previous = inner.owner_gangs.insert((namespace.to_string(), gang.to_string()), owner.clone());
        if previous.as_ref() != Some(&owner) {
            inner.generation += 1;
            self.wake.notify_one();
        }
    }

    /// Records a lookup of `owner`, the owner of inferred gang `gang`, made at `at`: what it
    /// declares, or `None` when it is not there or declares no usable size, in which case it is
    /// not asked for again before [`OWNER_RETRY_FIRST`], doubling each time up to
    /// [`OWNER_RETRY_MOST`]. (A read that failed is not recorded.) Nothing is kept for a gang
    /// whose pods are gone.
    pub fn owner_looked_up(
        &self,
        namespace: &str,
        gang: &str,
        owner: &Owner,
        declared: Option<OwnerGang>,
        at: std::time::Instant,
    ) {
        {
            let mut inner = write(&self.inner);
            if !inner.has_gang(namespace, gang) {
                return;
            }
            let lookups = inner.owner_lookups.entry((namespace.to_string(), gang.to_string())).or_default();
            let retry = match &declared {
                Some(_) => None,
                None => {
                    let waited = lookups.get(owner).and_then(|last| last.retry).map(|(_, wait)| wait);
                    let wait = waited.map_or(OWNER_RETRY_FIRST, |w| w.saturating_mul(2).min(OWNER_RETRY_MOST));
                    Some((at + wait, wait))
                }
            };
            lookups.insert(owner.clone(), OwnerLookup { at, retry });
        }
        if let Some(declared) = declared {
            self.set_owner_gang(namespace, gang, declared);
        }
    }

    /// Native PodGroups Allot hands inferred gangs to (GangPolicy `nativeScheduling`), as
    /// (namespace, PodGroup name, the gang's owner): one per group that has a live member, in
    /// O(gangs). The leader creates those that do not exist.
    pub fn hand_offs(&self) -> Vec<(String, String, Owner)> {
        let inner = read(&self.inner);
        let mut out: Vec<_> = inner
            .gangs
            .iter()
            .filter_map(|((namespace, gang), members)| {
                let pod_group = gang.strip_prefix(crate::model::gang::membership::NATIVE_GROUP_PREFIX)?;
                let owner = members.iter().find_map(|m| {
                    let p = inner.pods.get(namespace, m)?;
                    p.present().then(|| p.gang.as_ref()?.owner.clone()).flatten()
                })?;
                Some((namespace.to_string(), pod_group.to_string(), owner))
            })
            .collect();
        out.sort();
        out
    }

    /// Inferred gangs with a gated member whose owner is due to be read in the round that
    /// began at `round` (one controller pass): at most `most` of them, as (namespace, gang,
    /// owner), and whether more were due. Due: an owner never asked for (first), then one last
    /// asked for before `round` that is not waiting out a failure ([`OWNER_RETRY_FIRST`]),
    /// longest ago first — so an elastic owner is read again on every pass the cap allows
    /// (its size followed, never a stale one), and those a pass leaves come first in the next.
    pub fn owners_to_resolve(&self, round: std::time::Instant, most: usize) -> (Vec<(String, String, Owner)>, bool) {
        let inner = read(&self.inner);
        // Gated pods are in play for the gang pass (kept by the store): no walk over every pod.
        let in_play = &inner.by_state.in_play;
        let mut wanted: Vec<_> = in_play
            .gang_pass_keys()
            .filter_map(|k| inner.pods.get_key(k))
            .filter(|p| p.gate_index.is_some())
            .filter_map(|p| {
                let g = p.gang.as_ref()?;
                Some((p.namespace.to_string(), g.name.clone(), g.owner.clone()?))
            })
            .collect();
        wanted.sort();
        wanted.dedup();
        // Ordered by when last asked for (`None`: never, first), then, among equals (owners
        // never read, above all), one namespace at a time in turn: a tenant naming hundreds of
        // made-up owners takes one place per round, not every place until hers are done (which
        // name order would give her namespace, or a later one's).
        let mut turn: HashMap<String, usize> = HashMap::new();
        let mut due: Vec<_> = wanted
            .into_iter()
            .filter_map(|(namespace, gang, owner)| {
                let last = inner.owner_lookups.get(&(namespace.clone(), gang.clone())).and_then(|l| l.get(&owner));
                let at = match last {
                    None => None,
                    Some(l) if l.at >= round || l.retry.is_some_and(|(not_before, _)| not_before > round) => {
                        return None;
                    }
                    Some(l) => Some(l.at),
                };
                let n = turn.entry(namespace.clone()).or_default();
                *n += 1;
                Some(((at, *n), (namespace, gang, owner)))
            })
            .collect();
        due.sort();
        // Soon again only for owners never read: those read before are read again by the
        // passes that come anyway (a pass a second for ever otherwise, once over the cap).
        let more = due.iter().skip(most).any(|((at, _), _)| at.is_none());
        (due.into_iter().take(most).map(|(_, owner)| owner).collect(), more)
    }
}

#[cfg(test)]
mod owner_lookup_tests {
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::{ClusterState, OWNER_RETRY_FIRST, OWNER_RETRY_MOST};
    use crate::control::cluster::fixtures::{member, policies, record};
    use crate::model::gang::membership::OwnerGang;

    const INFER_JOBSET: &str =
        "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [JobSet]\n";

    /// Gated pod `name` labelled as a pod of JobSet `jobset` (gang `jobset-<jobset>`).
    fn jobset_pod(name: &str, jobset: &str) -> crate::control::cluster::PodRecord {
        let mut pod = member(name, "-", 1, "2026-11-22T01:00:00Z", json!({}));
        pod["metadata"]["labels"] = json!({"jobset.sigs.k8s.io/jobset-name": jobset});
        pod["metadata"]["annotations"] = json!({});
        record(&pod, &policies(INFER_JOBSET))
    }

    fn sized(size: u32) -> OwnerGang {
        OwnerGang { size, leader_first: false, worker_template: None }
    }

    /// Which gangs' owners are due at `at` (one at most per call when `most` is 1).
    fn due(state: &ClusterState, at: Instant, most: usize) -> (Vec<String>, bool) {
        let (owners, more) = state.owners_to_resolve(at, most);
        (owners.into_iter().map(|(_, gang, _)| gang).collect(), more)
    }

    /// An owner that could not be read is not asked for again before a backoff that doubles,
    /// up to its most; one that was read is asked for again on every later round (its size
    /// followed), never twice in one; those never asked for come first, then the longest ago.
    #[test]
    fn an_owner_that_cannot_be_read_waits_out_a_doubling_backoff() {
        let state = ClusterState::default();
        state.replace_pods(vec![jobset_pod("a-0", "a"), jobset_pod("b-0", "b")]);
        let t0 = Instant::now();
        assert_eq!(due(&state, t0, 1), (vec!["jobset-a".to_string()], true), "the cap leaves one");
        let (owners, _) = state.owners_to_resolve(t0, 2);
        let (ns, gang, owner) = owners[0].clone();
        state.owner_looked_up(&ns, &gang, &owner, None, t0);
        assert_eq!(due(&state, t0, 1), (vec!["jobset-b".to_string()], false), "a is not due");

        let mut failed_at = t0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            let wait = (1..=OWNER_RETRY_MOST.as_secs())
                .map(Duration::from_secs)
                .find(|w| due(&state, failed_at + *w, 2).0.contains(&gang))
                .expect("due again after at most the longest wait");
            waits.push(wait.as_secs());
            failed_at += wait;
            state.owner_looked_up(&ns, &gang, &owner, None, failed_at);
        }
        let first = OWNER_RETRY_FIRST.as_secs();
        assert_eq!(waits, [first, 2 * first, 4 * first, 8 * first, 16 * first, 600, 600]);

        // Read at last: asked for again in every later round (an elastic owner), not in this one.
        state.owner_looked_up(&ns, &gang, &owner, Some(sized(4)), failed_at);
        assert_eq!(state.view().owner_gang(&ns, &gang).map(|o| o.size), Some(4));
        assert!(!due(&state, failed_at, 2).0.contains(&gang));
        let next_round = failed_at + Duration::from_millis(1);
        assert!(due(&state, next_round, 2).0.contains(&gang));
        // b was never asked for: it comes first.
        assert_eq!(due(&state, next_round, 1).0, ["jobset-b"]);
        // A failure after a success starts the backoff again from its first wait.
        state.owner_looked_up(&ns, &gang, &owner, None, next_round);
        assert!(!due(&state, next_round + OWNER_RETRY_FIRST - Duration::from_secs(1), 2).0.contains(&gang));
        assert!(due(&state, next_round + OWNER_RETRY_FIRST, 2).0.contains(&gang));
    }

    /// Pods of one gang that name different owners (a Job gang's name comes from a label, its
    /// owner from the ownerReferences): each owner waits out its own failure, rather than each
    /// lookup making the other look new and both being asked for on every pass.
    #[test]
    fn owners_named_by_one_gang_each_wait_out_their_failures() {
        let p =
            policies("apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [Job]\n");
        let job_pod = |name: &str, owner: &str| {
            let mut pod = member(name, "-", 1, "2026-11-22T01:00:00Z", json!({}));
            pod["metadata"]["labels"] =
                json!({"batch.kubernetes.io/job-name": "x", "batch.kubernetes.io/job-completion-index": "0"});
            pod["metadata"]["annotations"] = json!({});
            pod["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": format!("uid-{owner}")}]);
            record(&pod, &p)
        };
        let state = ClusterState::default();
        state.replace_pods(vec![job_pod("a", "y1"), job_pod("b", "y2")]);
        let t0 = Instant::now();
        let (owners, more) = state.owners_to_resolve(t0, 16);
        assert_eq!((owners.len(), more), (2, false), "{owners:?}");
        for (ns, gang, owner) in &owners {
            state.owner_looked_up(ns, gang, owner, None, t0);
        }
        assert_eq!(state.owners_to_resolve(t0 + Duration::from_secs(1), 16).0, []);
        assert_eq!(state.owners_to_resolve(t0 + OWNER_RETRY_FIRST, 16).0.len(), 2);
    }

    /// What an owner said, and when it was asked for, goes with the last pod of its gang
    /// (deleted, or missing from a relist), not with an update of it; a lookup that answers
    /// after the gang went keeps nothing. Before, `owner_gangs` kept every gang ever seen.
    #[test]
    fn what_an_owner_said_goes_with_its_gangs_last_pod() {
        let state = ClusterState::default();
        state.replace_pods(vec![jobset_pod("r-0", "r"), jobset_pod("r-1", "r")]);
        let owner = state.owners_to_resolve(Instant::now(), 1).0.remove(0).2;
        state.set_owner_gang("ml", "jobset-r", sized(2));
        let size = |state: &ClusterState| state.view().owner_gang("ml", "jobset-r").map(|o| o.size);
        state.remove_pod("ml", "r-0");
        state.upsert_pod(jobset_pod("r-1", "r"));
        assert_eq!(size(&state), Some(2), "the gang still has a pod");
        state.remove_pod("ml", "r-1");
        assert_eq!(size(&state), None);
        state.owner_looked_up("ml", "jobset-r", &owner, Some(sized(2)), Instant::now());
        assert_eq!(size(&state), None, "a late answer for a gang that is gone");

        state.upsert_pod(jobset_pod("r-2", "r"));
        assert_eq!(due(&state, Instant::now(), 1).0, ["jobset-r"], "asked for anew");
        state.owner_looked_up("ml", "jobset-r", &owner, None, Instant::now());
        state.set_owner_gang("ml", "jobset-r", sized(2));
        // A pod that moves to another gang takes its old gang's owner along when it was the last.
        state.upsert_pod(jobset_pod("r-2", "elsewhere"));
        assert_eq!(size(&state), None);
        assert_eq!(due(&state, Instant::now(), 2).0, ["jobset-elsewhere"]);
        // A relist without the gang's pods forgets it too (replaced whole, or pod by pod).
        state.upsert_pod(jobset_pod("r-3", "r"));
        state.set_owner_gang("ml", "jobset-r", sized(2));
        state.replace_pods(vec![jobset_pod("r-2", "elsewhere")]);
        assert_eq!(size(&state), None);
        state.set_owner_gang("ml", "jobset-elsewhere", sized(1));
        state.begin_relist();
        state.finish_relist();
        assert_eq!(state.view().owner_gang("ml", "jobset-elsewhere"), None);
    }
}
