//! What the leader's watch counts of one team's pods at a reconcile ([`Recount`]), fed one pod
//! at a time, and a pod as the watch sees it ([`SeenPod`]).

use std::collections::{BTreeMap, HashMap};

use super::wire::folded_key;
use super::{FOLD_DELAY_SECS, Folded};
use crate::model::dra::SharedClaims;
use crate::model::resources::ResourceList;
use crate::model::tally::add_to;

/// What the leader's watch says of one team's pods, for [`Ledger::reconcile_with`], counted one
/// pod at a time: per-namespace totals of every pod that has not finished (terminating ones
/// included), and where each pod is found by name (a pending charge's pod). The leader streams
/// its watch into it rather than collecting the pods first: at 112,000 pods that copy was
/// ~30 MB, made every second while pods changed; this keeps 16 bytes a pod.
#[derive(Debug, Default)]
pub struct Recount {
    pub(super) by_namespace: BTreeMap<String, Folded>,
    /// Pods by a keyed hash of namespace and name (keys random per process: a tenant cannot
    /// pick a name that collides with another pod's).
    sightings: HashMap<u64, Sighting>,
    hasher: std::hash::RandomState,
    pods: usize,
    /// Pods created after this (unix seconds) are not folded yet ([`FOLD_DELAY_SECS`]).
    young_after: Option<i64>,
    /// Pods left out as young.
    young: usize,
    /// Made from the store's kept sums ([`Recount::kept`]): only the pods asked for by name
    /// (keyed like `sightings`) were looked up; `None` when every pod was walked.
    asked: Option<std::collections::HashSet<u64>>,
}

/// Where the watch found a pod: enough to tell it from an earlier pod of the same name, and
/// whether it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sighting {
    pub created: i64,
    pub finished: bool,
    /// Too young to fold ([`FOLD_DELAY_SECS`]): not in the totals; its pending charge stays.
    pub young: bool,
}

/// One pod as [`Recount::add`] counts it.
#[derive(Debug, Clone, Copy)]
pub struct CountedPod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub created: i64,
    pub finished: bool,
    pub terminating: bool,
    pub gang: Option<(&'a str, Option<u32>)>,
}

impl Recount {
    /// An empty recount at `now` (unix seconds): pods created within [`FOLD_DELAY_SECS`] of it
    /// are found but not folded. ([`Recount::default`] folds every pod.)
    pub fn at(now: i64) -> Recount {
        Recount { young_after: Some(now - FOLD_DELAY_SECS), ..Recount::default() }
    }

    /// An empty recount at `now` to fill from the sums the watch keeps rather than pod by pod:
    /// with each namespace's totals ([`Recount::fold_namespace`]), the young pods' number
    /// ([`Recount::add_young`]) and the pods looked up by name ([`Recount::sighted`]); any other
    /// pod is unknown to it ([`Recount::knows`]).
    pub fn kept(now: i64) -> Recount {
        Recount { asked: Some(std::collections::HashSet::new()), ..Recount::at(now) }
    }

    /// Adds one namespace's totals (a kept recount).
    pub fn fold_namespace(&mut self, folded: Folded) {
        self.pods += folded.pods as usize;
        self.by_namespace.insert(folded.namespace.clone(), folded);
    }

    /// Counts one pod left out as too young to fold (a kept recount).
    pub fn add_young(&mut self) {
        self.pods += 1;
        self.young += 1;
    }

    /// Records what the watch shows of the pod of that name (`None`: no pod of the team's that
    /// the quota counts), which a kept recount then knows.
    pub fn sighted(&mut self, namespace: &str, name: &str, sighting: Option<Sighting>) {
        let key = self.key(namespace, name);
        if let Some(asked) = &mut self.asked {
            asked.insert(key);
        }
        if let Some(sighting) = sighting {
            self.sightings.insert(key, sighting);
        }
    }

    /// Whether the recount can say if the pod of that name is there: always for a walk; for a
    /// kept recount, only for the pods asked.
    pub fn knows(&self, namespace: &str, name: &str) -> bool {
        self.asked.as_ref().is_none_or(|asked| asked.contains(&self.key(namespace, name)))
    }

    /// The totals by namespace (for comparing two recounts).
    pub fn by_namespace(&self) -> &BTreeMap<String, Folded> {
        &self.by_namespace
    }

    /// Pods left out of the totals as too young to fold (the leader looks again soon).
    pub fn young(&self) -> usize {
        self.young
    }

    /// From a list of pods (tests, and callers that have one).
    pub fn from_pods(pods: &[SeenPod]) -> Recount {
        let mut recount = Recount::default();
        for p in pods {
            let pod = CountedPod {
                namespace: &p.namespace,
                name: &p.name,
                created: p.created,
                finished: p.finished,
                terminating: p.terminating,
                gang: p.gang.as_ref().map(|(g, size)| (g.as_str(), *size)),
            };
            recount.add(&pod, p.requests.clone(), p.claims.clone());
        }
        recount
    }

    fn key(&self, namespace: &str, name: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, (namespace, name))
    }

    /// Counts one pod with its counted requests ([`counted`]) and the counted devices of the
    /// shared claims it names ([`counted_claims`]; each claim is counted once per namespace).
    pub fn add(&mut self, pod: &CountedPod<'_>, requests: ResourceList, claims: SharedClaims) {
        let CountedPod { namespace, name, created, finished, terminating, gang } = *pod;
        self.pods += 1;
        let key = self.key(namespace, name);
        let young = !finished && self.young_after.is_some_and(|after| created > after);
        self.sightings.insert(key, Sighting { created, finished, young });
        if finished {
            return;
        }
        if young {
            self.young += 1;
            return;
        }
        let f = match self.by_namespace.get_mut(namespace) {
            Some(f) => f,
            None => self
                .by_namespace
                .entry(namespace.to_string())
                .or_insert_with(|| Folded { namespace: namespace.to_string(), ..Folded::default() }),
        };
        f.pods = f.pods.saturating_add(1);
        for (claim, devices) in claims {
            f.claims.entry(claim).or_insert(devices);
        }
        match gang {
            Some((gang, size)) => {
                let members = match f.gangs.get_mut(gang) {
                    Some(members) => members,
                    None => f.gangs.entry(gang.to_string()).or_default(),
                };
                let slot = members.entry((requests, size)).or_default();
                slot.0 = slot.0.saturating_add(1);
                if terminating {
                    slot.1 = slot.1.saturating_add(1);
                }
            }
            None => add_to(&mut f.plain, &requests, 1),
        }
    }

    /// Pods counted (finished ones included).
    pub fn pods(&self) -> usize {
        self.pods
    }

    /// The pod of that name, if it was counted.
    pub fn find(&self, namespace: &str, name: &str) -> Option<Sighting> {
        self.sightings.get(&self.key(namespace, name)).copied()
    }

    /// The totals, by data key.
    pub(super) fn folded(&self) -> impl Iterator<Item = (String, &Folded)> {
        self.by_namespace.values().map(|f| (folded_key(&f.namespace), f))
    }
}

/// A pod as the leader's watch sees it, for [`Ledger::reconcile`].
#[derive(Debug, Clone)]
pub struct SeenPod {
    pub namespace: String,
    pub name: String,
    pub created: i64,
    pub finished: bool,
    pub terminating: bool,
    /// Its requests of the resources the quota counts.
    pub requests: ResourceList,
    pub gang: Option<(String, Option<u32>)>,
    /// The shared claims it names, with their counted devices.
    pub claims: SharedClaims,
}

/// What one reconcile changed, by kind (for logs and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Pending charges whose pod the watch now counts (folded).
    pub seen: usize,
    /// Pending charges whose pod finished or was seen deleted.
    pub released: usize,
    pub expired: usize,
    pub dropped_unreadable: usize,
    /// The folded totals changed (pods appeared, changed or went).
    pub refolded: bool,
    /// Allowances dropped because their holder stopped renewing them.
    pub allowances_expired: usize,
    /// An old drain request was dropped.
    pub drain_dropped: bool,
    /// Allowances left after the reconcile (not a change: the leader looks again soon, to drop
    /// those whose holder stops renewing them).
    pub allowances_held: usize,
    /// Pending charges left as they were because the recount did not look their pod up (a kept
    /// recount asks for the charges of the ledger as last read; newer ones wait for the next
    /// reconcile). Not a change either.
    pub not_looked_up: usize,
}

impl Reconciled {
    /// True when the ledger changed.
    pub fn changed(&self) -> bool {
        Reconciled { allowances_held: 0, not_looked_up: 0, ..*self } != Reconciled::default()
    }
}
