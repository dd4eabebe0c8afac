//! The search across a level's domains, and the pass's indexes it reads.
//!
//! The result is the cheapest set over all domains that are not busy (the first domain, in
//! name order, among equal costs), as if every domain were searched. Most are not: the domains
//! are searched by the lowest priority a set there can have (`bounds`), and once the best set
//! found has a lower highest priority than the next domain's bound, the rest cannot beat it. A
//! domain whose lower-priority work cannot make room is never searched.

use std::collections::HashMap;
use std::rc::Rc;

use super::bounds::DomainBounds;
use super::search::{Ask, Eligible};
use super::{Candidates, Cost, Domain, Placements, Simulation, WaitingGang};
use crate::control::gang::decision::topology::Level;

/// The cheapest set of a scope: candidate indices, and where the gang goes.
pub(super) struct Found {
    pub(super) victims: Vec<usize>,
    pub(super) placements: Placements,
    pub(super) domain: Option<Domain>,
}

/// A pass's indexes over the candidates (each built when first asked for; none changes during
/// the pass: taken units and reservations are accounted where they are read).
#[derive(Default)]
pub(super) struct Indexes {
    /// By placement classes and required outermost level: the nodes a gang may use, as an
    /// index into `usables`.
    usable: HashMap<(Vec<usize>, Option<String>), usize>,
    usables: Vec<Rc<Vec<bool>>>,
    /// By (index into `usables`, level): the level as gangs that may use those nodes see it.
    views: HashMap<(usize, String), View>,
    /// By (level, placement classes), by domain: every candidate with a pod there and one on a
    /// node the classes admit (every one a gang of those classes may evict), cheapest first.
    in_domain: HashMap<(String, Vec<usize>), Vec<Vec<usize>>>,
    /// By placement classes: every candidate with a pod on a node one of them admits, cheapest
    /// first (what the per-level indexes of those classes are built from).
    of_classes: HashMap<Vec<usize>, Rc<Vec<usize>>>,
}

/// A level as gangs that may use the same nodes see it: the domains with such a node, and
/// those where a preemption is in flight on one (brought up to date from the busy nodes listed
/// since, rather than found again per gang).
struct View {
    domains: Vec<usize>,
    busy: Vec<bool>,
    /// How many of [`Candidates::busy_nodes`] `busy` counts.
    seen: usize,
}

impl Indexes {
    /// [`Simulation::usable_nodes`], once per placement classes and level; and its index.
    pub(super) fn usable(
        &mut self,
        sim: &mut Simulation<'_>,
        gang: &WaitingGang,
        classes: &[usize],
    ) -> (usize, Rc<Vec<bool>>) {
        let level = gang.topology.as_ref().filter(|t| t.required).map(|t| t.outermost().to_string());
        let key = (classes.to_vec(), level);
        if let Some(&id) = self.usable.get(&key) {
            return (id, self.usables[id].clone());
        }
        let usable = Rc::new(sim.usable_nodes(gang));
        self.usable.insert(key, self.usables.len());
        self.usables.push(usable.clone());
        (self.usables.len() - 1, usable)
    }
}

impl Candidates<'_> {
    /// Which domains of `level` a gang may use where no preemption is in flight (of those,
    /// `only` where it names one); `None` if none.
    fn open(&mut self, l: &Level, level: &str, who: &Eligible<'_>, only: Option<usize>) -> Option<Vec<bool>> {
        let view = self.indexes.views.entry((who.usable_id, level.to_string())).or_insert_with(|| {
            let mut domains: Vec<usize> =
                (who.usable.iter().enumerate().filter(|(_, u)| **u)).filter_map(|(i, _)| l.of_node[i]).collect();
            domains.sort_unstable();
            domains.dedup();
            View { domains, busy: vec![false; l.names.len()], seen: 0 }
        });
        for &i in self.busy_nodes[view.seen..].iter().filter(|&&i| who.usable[i]) {
            if let Some(d) = l.of_node[i] {
                view.busy[d] = true;
            }
        }
        view.seen = self.busy_nodes.len();
        let mut open = vec![false; l.names.len()];
        let domains = match &only {
            Some(d) => std::slice::from_ref(d),
            None => &view.domains[..],
        };
        let mut any = false;
        for &d in domains.iter().filter(|&&d| !view.busy[d]) {
            open[d] = true;
            any = true;
        }
        any.then_some(open)
    }

    /// Builds the `in_domain` index of `key` if this pass has not.
    fn index_domains(&mut self, key: &(String, Vec<usize>), l: &Level, admits: &[Vec<bool>]) {
        if self.indexes.in_domain.contains_key(key) {
            return;
        }
        let mut lists = vec![Vec::new(); l.names.len()];
        let mut seen = Vec::new();
        for &v in self.of_classes(&key.1, admits).iter() {
            let nodes = self.pod_nodes(v);
            seen.clear();
            for d in nodes.iter().flatten().filter_map(|&i| l.of_node[i]) {
                if !seen.contains(&d) {
                    seen.push(d);
                    lists[d].push(v);
                }
            }
        }
        self.indexes.in_domain.insert(key.clone(), lists);
    }

    /// The candidates with a pod on a node one of `classes` admits, cheapest first.
    pub(super) fn of_classes(&mut self, classes: &[usize], admits: &[Vec<bool>]) -> Rc<Vec<usize>> {
        if let Some(units) = self.indexes.of_classes.get(classes) {
            return units.clone();
        }
        let admitted = |i: &usize| classes.iter().any(|&c| admits[c][*i]);
        let units: Vec<usize> =
            (0..self.units.len()).filter(|&v| self.pod_nodes(v).iter().flatten().any(admitted)).collect();
        let units = Rc::new(units);
        self.indexes.of_classes.insert(classes.to_vec(), units.clone());
        units
    }
}

impl Simulation<'_> {
    /// The cheapest set among `level`'s domains (or only domain `only`) that the gang may use
    /// and where no preemption is in flight, and whether there was any such domain.
    pub(super) fn search_level(
        &mut self,
        candidates: &mut Candidates<'_>,
        ask: &Ask<'_>,
        level: &str,
        only: Option<usize>,
    ) -> (Option<Found>, bool) {
        let Ask { gang, who, demand } = *ask;
        let Some((order, below, open)) = self.open_domains(candidates, ask, level, only) else {
            return (None, false);
        };
        let listed = (level.to_string(), demand.classes.clone());
        candidates.index_domains(&listed, &self.levels.by_key[level], &self.class_member);
        // (cost, domain, victims) of the cheapest set so far.
        let mut best: Option<(Cost, usize, Vec<usize>)> = None;
        // (Looked up once per gang and level, not once per domain.)
        let lists = &candidates.indexes.in_domain[&listed];
        let mut inside = Vec::new();
        for &(bound, d) in order[..below].iter().filter(|(_, d)| open[*d]) {
            if best.as_ref().is_some_and(|(cost, _, _)| bound > cost.0) {
                break;
            }
            let nodes = self.levels.by_key[level].nodes[d].clone();
            inside.clear();
            inside.extend(lists[d].iter().copied().filter(|&v| who.admits(candidates, v)));
            let Some(victims) = self.smallest_set(gang, candidates, &inside, Some(&nodes), demand) else {
                continue;
            };
            let cost = candidates.cost(&victims);
            if best.as_ref().is_none_or(|(c, b, _)| (&cost, d) < (c, *b)) {
                best = Some((cost, d, victims));
            }
        }
        // Placed once, for the set chosen: the search's last probe found it fits in this very
        // state, so the placement does (a probe answers what placing answers).
        let found = best.and_then(|(_, d, victims)| {
            let nodes = self.levels.by_key[level].nodes[d].clone();
            let (placements, _) = self.place_after(gang, candidates, demand, &victims, Some(&nodes))?;
            let domain = Domain { level: level.to_string(), value: self.levels.by_key[level].names[d].clone() };
            Some(Found { victims, placements, domain: Some(domain) })
        });
        (found, true)
    }

    /// The domains of `level` to search, by the lowest priority a set there can have, then
    /// index: the first so many of the list that are open; `None` when every domain the gang
    /// may use is busy (or it may use none).
    fn open_domains(
        &mut self,
        candidates: &mut Candidates<'_>,
        ask: &Ask<'_>,
        level: &str,
        only: Option<usize>,
    ) -> Option<(Rc<DomainBounds>, usize, Vec<bool>)> {
        self.ensure_level(level);
        let open = candidates.open(&self.levels.by_key[level], level, ask.who, only)?;
        let (order, below) = self.bounds(candidates, ask, level);
        Some((order, below, open))
    }

    /// The cheapest set on all nodes (no domain required), unless a preemption is in flight on
    /// a node the gang may use; and whether it searched.
    pub(super) fn search_anywhere(&mut self, candidates: &mut Candidates<'_>, ask: &Ask<'_>) -> (Option<Found>, bool) {
        let Ask { gang, who, demand } = *ask;
        if candidates.busy_nodes.iter().any(|&i| who.usable[i]) {
            return (None, false);
        }
        let inside: Vec<usize> = (0..who.lower).filter(|&v| who.admits(candidates, v)).collect();
        let victims = self.smallest_set(gang, candidates, &inside, None, demand);
        let found = victims.and_then(|victims| {
            let (placements, domain) = self.placed_without(gang, candidates, &victims, None)?;
            Some(Found { victims, placements, domain })
        });
        (found, true)
    }
}
