//! The fit test of a gang of one shape inside one domain, on a copy of what it reads.
//!
//! Such a gang fits exactly when the copies of its shape the domain's nodes of its class can
//! hold ([`copies_that_fit`], per node) add up to its size: a node that holds `k` copies holds
//! `k - 1` once one is placed there (each resource asked drops by what one copy asks), so the
//! best fit, whichever node it picks, places every member while the sum is not exhausted.
//! [`Simulation::place_members`] within the domain reads nothing else than those nodes' free
//! capacity, so the test keeps its own copy of just that (the resources the shape asks, on
//! those nodes), evicts units from it as [`Simulation::adjust`] would, and never touches the
//! simulation or its indexes.
//!
//! On all nodes (a gang without topology), [`Simulation::place`] also refuses a member once its
//! class's total free of the member's main accelerator is below what the member asks (the
//! index's total, below zero where a node's free is): there the gang fits when, besides the
//! copies, that total holds every member's share. The total is the sum of the free capacity the
//! count keeps where every node of the class offers the accelerator (then the index and the free
//! capacity agree); elsewhere the gang is placed instead.
//!
//! The copy keeps each node's count and their sum up to date as units are evicted from it, so a
//! probe costs nothing. And where no pod asks anything below zero, evicting more never lowers a
//! count: the fit is monotone in the cheapest-first prefix, and the smallest prefix that fits
//! is found by evicting one unit after the other until it does (the bisection's answer, without
//! evicting the whole list first and most of it again).
//!
//! [`copies_that_fit`]: crate::control::gang::fit::copies_that_fit

use super::{Candidates, Placements, WaitingGang};
use crate::control::gang::decision::Simulation;
use crate::control::gang::fit::unjudged;
use crate::model::quantity::Quantity;

/// One asked resource on one node, as [`copies_that_fit`](crate::control::gang::fit::copies_that_fit)
/// reads it.
enum Slot {
    /// DRA claim devices where the slices were not read: left out of the fit.
    Unjudged,
    /// Not offered there: no copy fits (and evictions give nothing back to it).
    Absent,
    /// Free now (nanos).
    Free(i128),
}

/// A gang of members all of one shape and no phantoms, as the count reads it (once per gang).
pub(super) struct Uniform<'g> {
    pub(super) class: usize,
    /// Its members.
    count: u64,
    /// Each resource the shape asks above zero: what one copy asks (nanos), and its column in
    /// what the candidates' pods ask ([`Candidates::asked`]).
    asks: Vec<(&'g str, i128, Option<usize>)>,
    /// The shape's main accelerator among `asks`.
    main: Option<usize>,
}

impl<'g> Uniform<'g> {
    /// `None` unless every member has one shape and there are no phantoms.
    pub(super) fn of(sim: &mut Simulation<'_>, candidates: &Candidates<'_>, gang: &'g WaitingGang) -> Option<Self> {
        let shape = &gang.members.first()?.shape;
        if gang.phantoms.is_some() || gang.members.iter().any(|m| m.shape != *shape) {
            return None;
        }
        let asked = shape.requests.iter().filter(|(_, q)| **q > Quantity::ZERO);
        let asks: Vec<(&str, i128, Option<usize>)> =
            asked.map(|(name, q)| (name.as_str(), q.nanos(), candidates.column(name))).collect();
        let main = Simulation::primary(shape).and_then(|main| asks.iter().position(|(name, _, _)| *name == main));
        Some(Uniform { class: sim.class_of(shape), count: gang.members.len() as u64, asks, main })
    }
}

pub(super) struct Copies<'a> {
    gang: &'a Uniform<'a>,
    /// The candidates it may evict, cheapest first.
    eligible: &'a [usize],
    /// The nodes of the class in the domain (indices), ascending.
    nodes: Vec<usize>,
    /// By node of those, by asked resource (`asks.len()` a node): what is free.
    slots: Vec<Slot>,
    /// By node: the copies it holds (at most the gang's size), and their sum; the nodes an
    /// eviction changed since (counted again when the fit is asked).
    held: Vec<u64>,
    sum: u64,
    changed: Vec<usize>,
    /// What evicting each candidate gives back: `(node, asked resource, amount)`, the entries of
    /// eligible position `k` at `gives[starts[k]..starts[k + 1]]` (listed as they are needed).
    gives: Vec<(usize, usize, i128)>,
    starts: Vec<usize>,
    /// On all nodes: how much of the main accelerator the whole gang asks (`None` inside,
    /// `Some(None)`: more than a sum can hold, so it never fits), and what is free of it.
    total: Option<Option<i128>>,
    free_main: i128,
}

impl<'a> Copies<'a> {
    /// The test of `gang`'s copies on `nodes` (the domain's nodes its class admits, ascending)
    /// as the simulation is now, `eligible` the candidates it may evict.
    pub(super) fn new(sim: &Simulation<'_>, eligible: &'a [usize], nodes: &[usize], gang: &'a Uniform<'a>) -> Self {
        let slot = |i: usize, name: &str| match sim.free[i].get(name) {
            _ if unjudged(&sim.free[i], name) => Slot::Unjudged,
            Some(free) => Slot::Free(free.nanos()),
            None => Slot::Absent,
        };
        let slots = nodes.iter().flat_map(|&i| gang.asks.iter().map(move |(name, _, _)| slot(i, name))).collect();
        let mut copies = Copies {
            gang,
            eligible,
            nodes: nodes.to_vec(),
            slots,
            held: vec![0; nodes.len()],
            sum: 0,
            changed: Vec::new(),
            gives: Vec::new(),
            starts: vec![0],
            total: None,
            free_main: 0,
        };
        for local in 0..nodes.len() {
            copies.held[local] = copies.holds(local);
            copies.sum = copies.sum.saturating_add(copies.held[local]);
        }
        copies
    }

    /// The test on every node of the class (`nodes`), for a gang placed without topology: also
    /// the class's total of its main accelerator. `None` where some node of the class does not
    /// offer it (the simulation's index then counts what its free capacity does not).
    pub(super) fn anywhere(
        sim: &Simulation<'_>,
        eligible: &'a [usize],
        nodes: &[usize],
        gang: &'a Uniform<'a>,
    ) -> Option<Self> {
        let at = gang.main?;
        if !nodes.iter().all(|&i| sim.free[i].contains_key(gang.asks[at].0)) {
            return None;
        }
        let mut copies = Copies::new(sim, eligible, nodes, gang);
        copies.total = Some(gang.asks[at].1.checked_mul(i128::from(gang.count)));
        let free = (0..nodes.len()).map(|local| if let Slot::Free(f) = copies.at(local)[at] { f } else { 0 });
        copies.free_main = free.fold(0i128, i128::saturating_add);
        Some(copies)
    }

    /// The asked resources' slots of node `local`.
    fn at(&self, local: usize) -> &[Slot] {
        let k = self.gang.asks.len();
        &self.slots[local * k..(local + 1) * k]
    }

    /// [`copies_that_fit`](crate::control::gang::fit::copies_that_fit) on node `local`, at most the
    /// gang's size.
    fn holds(&self, local: usize) -> u64 {
        let held = self.at(local).iter().zip(&self.gang.asks).filter_map(|(slot, (_, ask, _))| match slot {
            Slot::Unjudged => None,
            Slot::Absent => Some(0),
            Slot::Free(f) => Some(copies_of(*f, *ask)),
        });
        held.fold(self.gang.count, u64::min)
    }

    /// Lists what the candidates up to eligible position `k` give back, where not yet.
    fn list(&mut self, candidates: &Candidates<'_>, k: usize) {
        while self.starts.len() <= k + 1 {
            let v = self.eligible[self.starts.len() - 1];
            for (p, node) in candidates.pod_nodes(v).iter().enumerate() {
                let Some(local) = node.and_then(|i| self.nodes.binary_search(&i).ok()) else { continue };
                let pod = candidates.first_pod(v) + p;
                let asked =
                    self.gang.asks.iter().enumerate().map(|(a, (_, _, c))| (local, a, candidates.asked(pod, *c)));
                self.gives.extend(asked);
            }
            self.starts.push(self.gives.len());
        }
    }

    /// Evicts (`sign` -1) or restores (1) the candidate at eligible position `k`: what
    /// [`Simulation::adjust`] would do to these nodes' free capacity.
    pub(super) fn apply(&mut self, candidates: &Candidates<'_>, k: usize, sign: i128) {
        self.list(candidates, k);
        let width = self.gang.asks.len();
        for g in self.starts[k]..self.starts[k + 1] {
            let (local, a, q) = self.gives[g];
            if let Slot::Free(f) = &mut self.slots[local * width + a] {
                *f -= sign * q;
                if Some(a) == self.gang.main {
                    self.free_main = self.free_main.saturating_sub(sign * q);
                }
            }
            if self.changed.last() != Some(&local) {
                self.changed.push(local);
            }
        }
    }

    /// Whether every copy finds a node.
    pub(super) fn fit(&mut self) -> bool {
        while let Some(local) = self.changed.pop() {
            let held = self.holds(local);
            self.sum = self.sum.saturating_sub(self.held[local]).saturating_add(held);
            self.held[local] = held;
        }
        let room = match self.total {
            Some(needed) => needed.is_some_and(|needed| self.free_main >= needed),
            None => true,
        };
        room && self.sum >= self.gang.count
    }

    /// The smallest cheapest-first prefix of the eligible whose eviction lets the gang fit, then
    /// each victim given back (most expensive first) where it is not needed: eligible positions.
    /// Exactly what the bisection finds where the fit is monotone in the prefix (no request
    /// below zero): a prefix of one when even none is needed, as the bisection never tries
    /// none.
    pub(super) fn smallest(&mut self, candidates: &Candidates<'_>) -> Option<Vec<usize>> {
        let mut hi = 0;
        if self.eligible.is_empty() {
            return self.fit().then(Vec::new);
        }
        while hi == 0 || !self.fit() {
            if hi == self.eligible.len() {
                return None;
            }
            self.apply(candidates, hi, -1);
            hi += 1;
        }
        let mut victims: Vec<usize> = (0..hi).collect();
        for index in (0..victims.len()).rev() {
            let k = victims[index];
            self.apply(candidates, k, 1);
            if self.fit() {
                victims.remove(index);
            } else {
                self.apply(candidates, k, -1);
            }
        }
        Some(victims)
    }

    /// Where each member of `gang` goes, as [`Simulation::place_members`] within the domain
    /// puts them, read from this copy: one shape, so first-fit decreasing takes them by name;
    /// each on the node that fits with the least of its main accelerator free, then the lowest
    /// index. `None` when one finds no node (never after a probe found the gang fits this very
    /// state).
    pub(super) fn place(&mut self, sim: &Simulation<'_>, gang: &WaitingGang) -> Option<Placements> {
        let (main, width) = (self.gang.main, self.gang.asks.len());
        let mut members: Vec<&str> = gang.members.iter().map(|m| m.name.as_str()).collect();
        members.sort();
        let mut placements = Vec::with_capacity(members.len());
        for member in members {
            let fits = |slots: &[Slot]| {
                slots.iter().zip(&self.gang.asks).all(|(slot, (_, ask, _))| match slot {
                    Slot::Unjudged => true,
                    Slot::Absent => false,
                    Slot::Free(f) => f >= ask,
                })
            };
            let free_main = |slots: &[Slot]| main.map(|at| if let Slot::Free(f) = slots[at] { f } else { 0 });
            let fitting = (0..self.nodes.len()).map(|local| (local, self.at(local))).filter(|(_, slots)| fits(slots));
            let (local, _) = fitting.min_by_key(|(local, slots)| (free_main(slots), *local))?;
            for (slot, (_, ask, _)) in self.slots[local * width..(local + 1) * width].iter_mut().zip(&self.gang.asks) {
                if let Slot::Free(f) = slot {
                    *f -= ask;
                }
            }
            placements.push((member.to_string(), sim.nodes[self.nodes[local]].name.clone()));
        }
        placements.sort();
        Some(placements)
    }
}

/// How many copies asking `ask` (above zero) fit in `free`: what `copies_that_fit` divides,
/// in 64 bits where both fit (a 128-bit division per resource, node and probe was most of the
/// count's time).
fn copies_of(free: i128, ask: i128) -> u64 {
    let free = free.max(0);
    match (u64::try_from(free), u64::try_from(ask)) {
        (Ok(free), Ok(ask)) => free / ask,
        _ => u64::try_from(free / ask).unwrap_or(u64::MAX),
    }
}
