//! What a gang counts against its team's quota ([`GangTally`]), one formula for the store's
//! per-gang index and the deny-mode ledger. Pure arithmetic over requests: no cluster view.

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
/// Cost: O(resources × distinct requests) per change (a sorted list each, almost always of one
/// amount), never O(declared size). Kept in sorted lists, not maps: the store keeps a tally for
/// every gang and each deny-mode ledger another, and a map's node is a few hundred bytes where
/// a gang has one size and one amount of each of a few resources (issue 49).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GangTally {
    /// Members that hold or will hold devices: every non-finished member.
    pub members: u32,
    /// Members present for the gang's quorum and its declared size: not terminating.
    pub live: u32,
    /// The members' declared sizes, as a multiset (size, count), by size: exact after removals.
    declared: Vec<(u32, u32)>,
    /// Per resource the members ask, by name: their sum, and their requests as a multiset.
    resources: Vec<ResourceTally>,
}

/// One resource of a [`GangTally`].
#[derive(Debug, Clone, PartialEq)]
struct ResourceTally {
    name: Box<str>,
    /// Σ of the members' requests of it.
    sum: Quantity,
    /// The members' requests of it as a multiset (amount, count), by amount: for the largest.
    amounts: Vec<(Quantity, u32)>,
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
            let at = match self.resources.binary_search_by(|r| (*r.name).cmp(name)) {
                Ok(at) => at,
                Err(_) if sign < 0 => continue,
                Err(at) => {
                    let fresh = ResourceTally { name: name.into(), sum: Quantity::ZERO, amounts: Vec::new() };
                    self.resources.insert(at, fresh);
                    at
                }
            };
            let resource = &mut self.resources[at];
            resource.sum = Quantity::from_nanos(resource.sum.nanos().saturating_add(i128::from(sign) * q.nanos()));
            multiset_step(&mut resource.amounts, q, sign);
            if resource.amounts.is_empty() {
                self.resources.remove(at);
            }
        }
    }

    /// The size the gang declares: the largest its members declare (they must agree; admission
    /// denies those that do not), `None` when no member declares one (inferred gangs).
    pub fn declared(&self) -> Option<u32> {
        self.declared.last().map(|(size, _)| *size)
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
        self.resources
            .iter()
            .filter_map(|r| {
                let (largest, _) = r.amounts.last()?;
                Some((r.name.to_string(), Quantity::from_nanos(largest.nanos().saturating_mul(missing))))
            })
            .filter(|(_, q)| q.nanos() != 0)
            .collect()
    }

    /// Σ of the members' requests (resources they ask nothing of left out).
    fn sum(&self) -> ResourceList {
        self.resources.iter().filter(|r| r.sum.nanos() != 0).map(|r| (r.name.to_string(), r.sum)).collect()
    }

    /// Everything the gang counts: its members' requests plus the placeholders.
    pub fn total(&self) -> ResourceList {
        let mut total = self.sum();
        add_to(&mut total, &self.placeholders(), 1);
        total
    }
}

/// One more (`sign` > 0) or one fewer of `key` in a multiset kept as a sorted list of
/// (key, count); a key whose count drops to 0 leaves it.
fn multiset_step<K: Ord>(set: &mut Vec<(K, u32)>, key: K, sign: i32) {
    match set.binary_search_by(|(k, _)| k.cmp(&key)) {
        Ok(at) if sign > 0 => set[at].1 = set[at].1.saturating_add(1),
        Ok(at) => {
            set[at].1 = set[at].1.saturating_sub(1);
            if set[at].1 == 0 {
                set.remove(at);
            }
        }
        Err(at) if sign > 0 => set.insert(at, (key, 1)),
        Err(_) => {}
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
