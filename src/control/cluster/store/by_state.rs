//! The requests of the non-finished pods summed per (namespace, [`UsageState`], resource), kept
//! as watch events arrive (issue 49): `/metrics` and the quota queue read the sums in
//! O(entries) instead of walking every pod at each scrape or pass.
//!
//! A shared ResourceClaim counts once per namespace, in the most advanced state of the pods
//! holding it, with the devices of its holder whose name sorts first (that pod's first entry
//! naming it): a rule that depends only on who holds the claim now, so that a recount from the
//! view ([`crate::control::cluster::usage`]'s reference walk) gives the same sums.

use super::*;

/// (namespace, state, resource) → (nano-units, how many contributions make the sum). An entry
/// goes with its last contribution, not when its sum is 0: a pod asking `0` of a resource has
/// an entry in the recount too, and the map does not grow with names no pod asks any more.
type Sums = HashMap<(Arc<str>, UsageState, Arc<str>), (i128, u32)>;

#[derive(Debug, Default)]
pub(super) struct ByState {
    sums: Sums,
    /// (namespace, shared claim) → who holds it: only claims some non-finished pod holds.
    claims: HashMap<ClaimId, SharedClaim>,
    /// What each gate holds, for the gate gauges ([`super::gates`]).
    pub(super) gates: super::gates::HeldAtGates,
    /// What the controller's passes read ([`super::in_play`]): kept here because every change
    /// of a record, the controller's in-place marks included, goes through [`ByState::delta`].
    pub(super) in_play: super::in_play::InPlay,
    /// Per namespace, the non-finished pods carrying `allot.dev/borrowed-from`: a deny-mode
    /// cohort's pass walks its teams' pods only while some borrow or carry the mark.
    marked: HashMap<Arc<str>, u32>,
    /// What a deny-mode ledger folds of each namespace ([`super::folds`]).
    pub(super) folds: super::folds::Folds,
}

/// The non-finished holders of one shared claim.
#[derive(Debug, Default)]
struct SharedClaim {
    /// Holders in each state (indexed by [`UsageState::index`]).
    states: [u32; UsageState::ALL.len()],
    /// Each holder's devices for the claim, by pod name.
    devices: BTreeMap<Arc<str>, ClaimDevices>,
}

impl SharedClaim {
    /// Where the claim counts, and what: its most advanced holder's state, its first holder's
    /// devices (by pod name). `None` when nobody holds it.
    fn counted(&self) -> Option<(UsageState, &ClaimDevices)> {
        let state = UsageState::ALL.into_iter().find(|s| self.states[s.index()] > 0)?;
        Some((state, self.devices.values().next()?))
    }
}

/// Nano-units requested per (namespace, state, resource).
pub type RequestsByState = HashMap<(Arc<str>, UsageState, Arc<str>), i128>;

/// Where a pod's requests stand, for the per-team gauges. Defined with the sums the store
/// keeps (re-exported by `usage`), so the store never imports the module that reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UsageState {
    /// On a node.
    Bound,
    /// Admitted and ungated (released, or never gated), waiting for the scheduler: reserved.
    Pending,
    /// Behind Allot's gang gate.
    GangGated,
    /// Behind Allot's quota gate.
    QuotaQueued,
}

impl UsageState {
    /// Every state, most advanced first.
    pub const ALL: [UsageState; 4] =
        [UsageState::Bound, UsageState::Pending, UsageState::GangGated, UsageState::QuotaQueued];

    /// Its place in [`UsageState::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn of(p: &PodRecord) -> UsageState {
        if p.quota_gate_index.is_some() {
            UsageState::QuotaQueued
        } else if p.gate_index.is_some() {
            UsageState::GangGated
        } else if p.node_name.is_some() {
            UsageState::Bound
        } else {
            UsageState::Pending
        }
    }

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageState::Bound => "bound",
            UsageState::Pending => "pending",
            UsageState::GangGated => "gang_gated",
            UsageState::QuotaQueued => "quota_queued",
        }
    }
}

impl ByState {
    /// Adds (`sign` 1) or takes away (-1) what `record` counts; finished pods count nothing.
    pub(super) fn delta(&mut self, record: &PodRecord, sign: i128) {
        if record.finished {
            return;
        }
        self.gates.delta(record, sign);
        self.in_play.delta(record, sign);
        self.folds.delta(record, sign);
        if record.borrowed_mark {
            let count = self.marked.entry(record.namespace.clone()).or_default();
            *count = if sign > 0 { count.saturating_add(1) } else { count.saturating_sub(1) };
            if *count == 0 {
                self.marked.remove(&record.namespace);
            }
        }
        let state = UsageState::of(record);
        for (name, q) in &record.requests {
            add(&mut self.sums, (record.namespace.clone(), state, name.clone()), q.nanos(), sign);
        }
        let held = record.held_claims();
        for (i, claim) in held.iter().enumerate() {
            // A pod naming a claim twice holds it once, with its first entry's devices.
            if held[..i].iter().any(|c| c.name == claim.name) {
                continue;
            }
            let id = (record.namespace.clone(), claim.name.clone());
            let slot = self.claims.entry(id).or_default();
            let before = slot.counted().map(|(s, d)| (s, d.clone()));
            let count = &mut slot.states[state.index()];
            if sign > 0 {
                *count += 1;
                slot.devices.insert(record.name.clone(), claim.devices.clone());
            } else {
                *count = count.saturating_sub(1);
                slot.devices.remove(&record.name);
            }
            let after = slot.counted().map(|(s, d)| (s, d.clone()));
            if after.is_none() {
                self.claims.remove(&(record.namespace.clone(), claim.name.clone()));
            }
            if before == after {
                continue;
            }
            for (s, devices, sign) in
                [before.map(|(s, d)| (s, d, -1)), after.map(|(s, d)| (s, d, 1))].into_iter().flatten()
            {
                for (name, q) in devices.iter() {
                    add(&mut self.sums, (record.namespace.clone(), s, name.clone()), q.nanos(), sign);
                }
            }
        }
    }

    /// Whether a holder of the shared claim is in another state than [`UsageState::QuotaQueued`].
    pub(super) fn claim_held_outside_queue(&self, id: &ClaimId) -> bool {
        self.claims.get(id).is_some_and(|c| {
            UsageState::ALL.iter().filter(|s| **s != UsageState::QuotaQueued).any(|s| c.states[s.index()] > 0)
        })
    }

    /// Every shared claim some live pod holds: (namespace, claim, each holder's devices by name).
    pub(super) fn shared_claims(
        &self,
    ) -> impl Iterator<Item = (&str, &str, impl Iterator<Item = (&str, &ClaimDevices)>)> {
        self.claims.iter().map(|((ns, claim), c)| (&**ns, &**claim, c.devices.iter().map(|(p, d)| (&**p, d))))
    }

    /// The sums, as [`ClusterView::requests_by_state`] returns them.
    fn snapshot(&self) -> RequestsByState {
        self.sums.iter().map(|(k, (nanos, _))| (k.clone(), *nanos)).collect()
    }
}

/// Adds one contribution of `nanos` (`sign` 1) to the entry, or takes one away (-1); the entry
/// goes with its last contribution. The store's kept sums (these, and the nodes' loads in
/// [`super::in_play`]) all count this way.
pub(super) fn add<K: std::hash::Hash + Eq>(sums: &mut HashMap<K, (i128, u32)>, entry: K, nanos: i128, sign: i128) {
    if sign > 0 {
        let slot = sums.entry(entry).or_default();
        slot.0 = slot.0.saturating_add(nanos);
        slot.1 += 1;
    } else if let Some(slot) = sums.get_mut(&entry) {
        slot.0 = slot.0.saturating_sub(nanos);
        slot.1 = slot.1.saturating_sub(1);
        if slot.1 == 0 {
            sums.remove(&entry);
        }
    }
}

impl ClusterState {
    /// The non-finished pods' requests per (namespace, state, resource), shared claims once
    /// each: a copy of the sums the store keeps, O(entries) under the read lock.
    pub fn requests_by_state(&self) -> RequestsByState {
        read(&self.inner).by_state.snapshot()
    }
}

impl ClusterView<'_> {
    /// [`ClusterState::requests_by_state`] as this view holds it (the same lock: consistent
    /// with [`ClusterView::pods`]).
    pub fn requests_by_state(&self) -> RequestsByState {
        self.inner.by_state.snapshot()
    }

    /// [`ClusterState::usage_by_group`]'s usage, read in this view (no second lock).
    pub fn usage_by_group(
        &self,
        group_of: &mut dyn FnMut(&str) -> Option<usize>,
        groups: usize,
    ) -> Vec<(ResourceList, Vec<String>)> {
        usage_by_group(&self.inner, group_of, groups)
    }

    /// The namespaces with non-finished pods carrying `allot.dev/borrowed-from`, and how many:
    /// O(namespaces), kept as watch events arrive.
    pub fn borrowed_marks(&self) -> impl Iterator<Item = (&str, u32)> {
        self.inner.by_state.marked.iter().map(|(ns, n)| (&**ns, *n))
    }
}
