//! What a gang counts against its team's quota ([`GangTally`]), one formula for the store's
//! per-gang index and the deny-mode ledger. Pure arithmetic over requests: no cluster view.

use std::collections::BTreeMap;

use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

/// What a gang counts against its team's quota, kept per gang by the store and rebuilt the same
/// way by the deny-mode ledger, so the watch and the ledger agree: the requests of every member
/// that exists (terminating ones included: they hold their devices until they are gone) plus,
/// while fewer members exist than the gang declares, one placeholder per missing member.
///
/// The placeholder is the largest request seen among the members, per resource. Missing members
/// are unknown; the largest present one is the smallest estimate no present member exceeds, and
/// it cannot be gamed by the order of creation (the first member's request can: start with a
/// CPU-only member and the rest of the gang would be reserved for free). A missing member that
/// turns out larger pays the difference when it is admitted. The charge never counts fewer than
/// the declared members, and every member that exists counts in full.
///
/// Cost: O(resources × log distinct requests) per change, never O(declared size).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GangTally {
    /// Members that hold or will hold devices: every non-finished member.
    pub members: u32,
    /// Members present for the gang's quorum and its declared size: not terminating.
    pub live: u32,
    /// The members' declared sizes, as a multiset (size → count): exact after removals.
    declared: BTreeMap<u32, u32>,
    /// Σ of the members' requests.
    sum: ResourceList,
    /// Per resource, the members' requests as a multiset (amount → count), for the largest.
    amounts: BTreeMap<String, BTreeMap<Quantity, u32>>,
}

impl GangTally {
    /// Counts one member in.
    pub fn add<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a str, Quantity)>,
        declared: Option<u32>,
        terminating: bool,
    ) {
        self.change(requests, declared, terminating, 1);
    }

    /// Counts one member out (as it was counted in).
    pub fn remove<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a str, Quantity)>,
        declared: Option<u32>,
        terminating: bool,
    ) {
        self.change(requests, declared, terminating, -1);
    }

    fn change<'a>(
        &mut self,
        requests: impl IntoIterator<Item = (&'a str, Quantity)>,
        declared: Option<u32>,
        terminating: bool,
        sign: i32,
    ) {
        let step = |n: u32| if sign > 0 { n.saturating_add(1) } else { n.saturating_sub(1) };
        self.members = step(self.members);
        if !terminating {
            self.live = step(self.live);
        }
        if let Some(size) = declared {
            multiset_step(&mut self.declared, size, sign);
        }
        for (name, q) in requests {
            let slot = self.sum.entry(name.to_string()).or_default();
            *slot = Quantity::from_nanos(slot.nanos().saturating_add(i128::from(sign) * q.nanos()));
            let amounts = self.amounts.entry(name.to_string()).or_default();
            multiset_step(amounts, q, sign);
            if amounts.is_empty() {
                self.amounts.remove(name);
            }
        }
        self.sum.retain(|_, q| q.nanos() != 0);
    }

    /// The size the gang declares: the largest its members declare (they must agree; admission
    /// denies those that do not), `None` when no member declares one (inferred gangs).
    pub fn declared(&self) -> Option<u32> {
        self.declared.keys().next_back().copied()
    }

    /// Members the declared size still lacks.
    pub fn missing(&self) -> u32 {
        self.declared().unwrap_or(0).saturating_sub(self.members)
    }

    /// What the missing members are charged: `missing × largest request`, one multiplication.
    pub fn placeholders(&self) -> ResourceList {
        let missing = i128::from(self.missing());
        if missing == 0 {
            return ResourceList::new();
        }
        self.amounts
            .iter()
            .filter_map(|(name, amounts)| {
                let largest = amounts.keys().next_back()?;
                Some((name.clone(), Quantity::from_nanos(largest.nanos().saturating_mul(missing))))
            })
            .filter(|(_, q)| q.nanos() != 0)
            .collect()
    }

    /// Everything the gang counts: its members' requests plus the placeholders.
    pub fn total(&self) -> ResourceList {
        let mut total = self.sum.clone();
        add_to(&mut total, &self.placeholders(), 1);
        total
    }
}

fn multiset_step<K: Ord>(set: &mut BTreeMap<K, u32>, key: K, sign: i32) {
    if sign > 0 {
        *set.entry(key).or_default() += 1;
    } else if let Some(n) = set.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            set.remove(&key);
        }
    }
}

/// `total += sign × list`, per resource (saturating; zero entries dropped).
pub fn add_to(total: &mut ResourceList, list: &ResourceList, sign: i128) {
    for (name, q) in list {
        let slot = total.entry(name.clone()).or_default();
        *slot = Quantity::from_nanos(slot.nanos().saturating_add(sign.saturating_mul(q.nanos())));
    }
    total.retain(|_, q| q.nanos() != 0);
}
