//! What a deny-mode quota ledger folds of each namespace's live pods, kept as watch events
//! arrive (issue 49): the leader's reconciler reads these groups instead of walking every pod
//! each second while pods change.
//!
//! The store knows no policy, so the groups are kept by what a quota *may* count: plain pods by
//! the resources they ask a nonzero amount of and the shared claims they hold (a quota counts
//! such a pod when it counts one of those), gang members by their whole requests and declared
//! size. The reconciler filters each group through the team's quota
//! (`control::quota::shared::kept`), O(groups), and takes out the pods too young to fold, which
//! the store indexes by creation time for a minute ([`RECENT_SECS`]).

use std::collections::BTreeSet;

use super::*;
use crate::model::clock::unix_now;

/// How long (seconds, by creationTimestamp) a pod stays in the index of recently created pods:
/// longer than the ledger's fold delay (a few seconds), with room for a small clock step.
pub const RECENT_SECS: i64 = 60;

/// What may decide whether a quota counts a plain pod: the resources it asks a nonzero amount
/// of, and each shared claim it holds with its devices' resources of a nonzero amount.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PlainShape {
    pub resources: Names,
    pub claims: Box<[(Arc<str>, Names)]>,
}

/// Resource names, interned.
pub type Names = Box<[Arc<str>]>;

/// The plain pods of one shape: how many, and their requests summed (aligned with the shape's
/// `resources`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlainGroup {
    pub pods: u32,
    pub sums: Box<[i128]>,
}

/// A gang member's requests (all of them, names interned) and the size it declares.
pub type MemberShape = (Box<[(Arc<str>, Quantity)]>, Option<u32>);

/// One namespace's live (non-finished) pods, grouped by what a quota may count of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NamespaceFolds {
    pub plain: HashMap<PlainShape, PlainGroup>,
    /// Gang → member shape → (members, of which terminating).
    pub gangs: HashMap<String, HashMap<MemberShape, (u32, u32)>>,
}

/// The groups of every namespace, and the recently created pods.
#[derive(Debug, Default)]
pub(super) struct Folds {
    namespaces: HashMap<Arc<str>, NamespaceFolds>,
    /// (creationTimestamp, pod) of the live pods created within [`RECENT_SECS`] of when the
    /// watch delivered them; older entries go as new ones come.
    recent: BTreeSet<(i64, Key)>,
}

impl Folds {
    /// Adds (`sign` 1) or takes away (-1) a live pod.
    pub(super) fn delta(&mut self, record: &PodRecord, sign: i128) {
        let folds = self.namespaces.entry(record.namespace.clone()).or_default();
        folds.delta(record, sign);
        if folds.is_empty() {
            self.namespaces.remove(&record.namespace);
        }
        let entry = (record.created, record.key());
        if sign < 0 {
            self.recent.remove(&entry);
            return;
        }
        let oldest = unix_now().saturating_sub(RECENT_SECS);
        while self.recent.first().is_some_and(|(created, _)| *created <= oldest) {
            self.recent.pop_first();
        }
        if record.created > oldest {
            self.recent.insert(entry);
        }
    }
}

impl NamespaceFolds {
    /// Adds (`sign` > 0) or takes away a live pod; what went to zero goes.
    pub fn delta(&mut self, record: &PodRecord, sign: i128) {
        if let Some(g) = &record.gang {
            let members = self.gangs.entry(g.name.clone()).or_default();
            let slot = members.entry((record.requests.clone(), g.size)).or_default();
            let terminating = u32::from(record.terminating);
            *slot = if sign > 0 {
                (slot.0.saturating_add(1), slot.1.saturating_add(terminating))
            } else {
                (slot.0.saturating_sub(1), slot.1.saturating_sub(terminating))
            };
            if slot.0 == 0 {
                members.remove(&(record.requests.clone(), g.size));
                if members.is_empty() {
                    self.gangs.remove(&g.name);
                }
            }
            return;
        }
        let shape = PlainShape::of(record);
        let group = self
            .plain
            .entry(shape.clone())
            .or_insert_with(|| PlainGroup { pods: 0, sums: vec![0; shape.resources.len()].into_boxed_slice() });
        let amounts = record.requests.iter().filter(|(_, q)| q.nanos() != 0).map(|(_, q)| q.nanos());
        for (sum, nanos) in group.sums.iter_mut().zip(amounts) {
            *sum = sum.saturating_add(sign.saturating_mul(nanos));
        }
        group.pods = if sign > 0 { group.pods.saturating_add(1) } else { group.pods.saturating_sub(1) };
        if group.pods == 0 {
            self.plain.remove(&shape);
        }
    }

    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.gangs.is_empty()
    }
}

impl PlainShape {
    /// The shape of a plain pod.
    pub fn of(record: &PodRecord) -> PlainShape {
        let nonzero = |list: &[(Arc<str>, Quantity)]| -> Names {
            list.iter().filter(|(_, q)| q.nanos() != 0).map(|(name, _)| name.clone()).collect()
        };
        PlainShape {
            resources: nonzero(&record.requests),
            claims: record.held_claims().iter().map(|c| (c.name.clone(), nonzero(&c.devices))).collect(),
        }
    }
}

impl ClusterView<'_> {
    /// Each namespace's live pods, grouped by what a quota may count of them: O(namespaces),
    /// kept as watch events arrive.
    pub fn namespace_folds(&self) -> impl Iterator<Item = (&str, &NamespaceFolds)> {
        self.inner.by_state.folds.namespaces.iter().map(|(ns, f)| (&**ns, f))
    }

    /// The live pods created after `after` (unix seconds), if that is within the last
    /// [`RECENT_SECS`] (older ones are not indexed): O(those pods).
    pub fn created_after(&self, after: i64) -> impl Iterator<Item = &PodRecord> {
        let from = (after.saturating_add(1), (Arc::<str>::from(""), Arc::<str>::from("")));
        let recent = &self.inner.by_state.folds.recent;
        recent.range(from..).filter_map(|(_, key)| self.inner.pods.get_key(key))
    }

    /// Every shared claim some live pod holds: (namespace, claim, each holder's devices by
    /// holder name, in name order). O(claims).
    pub fn shared_claims(&self) -> impl Iterator<Item = (&str, &str, impl Iterator<Item = (&str, &ClaimDevices)>)> {
        self.inner.by_state.shared_claims()
    }
}
