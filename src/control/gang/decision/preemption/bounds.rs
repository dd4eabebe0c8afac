//! The lowest priority a set of victims in a domain can have, for every domain of a level: what
//! orders the domains' searches and stops them (see `domains`).
//!
//! A set's cost starts with its highest priority. No set in a domain can have a lower one than
//! the first priority at which the lower-priority work evictable there holds, with what is free
//! there, as much of the gang's main accelerator as it asks: placing a member needs that much
//! free on one of the domain's nodes its class admits (the aggregate check in `search`). The
//! bound is a binary search per domain in a per-pass index: per domain, what the candidates
//! hold there, summed cheapest first.
//!
//! **Per gang, almost nothing.** What is free per domain is read once per epoch (512 gangs that
//! search), and the domains' bounds for a gang's need are sorted once per epoch and need. Free
//! capacity only falls during a pass (gangs are placed and reserve room, nothing is evicted
//! from the simulation; a search gives back all it takes), so a sum read earlier in the pass is
//! never below today's: a bound from it is still a bound, only less tight. (Where some waiting
//! member asks below zero, placing it would raise free capacity: every gang then reads it
//! afresh.)

use std::collections::HashMap;
use std::rc::Rc;

use super::search::{Ask, Demand, Eligible};
use super::{Candidates, Simulation};
use crate::control::gang::decision::WaitingGang;
use crate::control::gang::decision::topology::Level;

/// How many searching gangs share one reading of the free capacity per domain.
const EPOCH: usize = 512;

/// The pass's bounds: the indexes they are computed from, and the last ones computed.
#[derive(Default)]
pub(super) struct Bounds {
    /// By (level, placement classes, resource, whose), by domain: for each candidate evictable
    /// now that holds some of the resource on the domain's nodes the classes admit, cheapest
    /// first, its priority and what it and those before it hold there.
    held: HashMap<HeldKey, Vec<Vec<(i32, i128)>>>,
    /// By (level, placement classes, resource): the epoch it was read in, and what is free per
    /// domain then.
    free: HashMap<FreeKey, (usize, Rc<Vec<i128>>)>,
    /// By `held` key and need: the epoch, and every domain's bound (where some set of lower
    /// priority than any could make room), ascending.
    sorted: HashMap<(HeldKey, i128), (usize, Rc<DomainBounds>)>,
    /// By (placement class, resource): every node of the class offers the resource, so the
    /// simulation's index of the class holds each node's free of it.
    offered: HashMap<(usize, String), bool>,
    /// Gangs that searched this pass, and whether free capacity may rise during it.
    searches: usize,
    may_rise: bool,
}

type HeldKey = (String, Vec<usize>, String, Whose);

/// (level, placement classes, resource).
type FreeKey = (String, Vec<usize>, String);

/// Every domain's bound and the domain, ascending.
pub(super) type DomainBounds = Vec<(i32, usize)>;

/// Whose units a `held` index counts: every team's (also where a gang may evict all but its
/// own team's: a bound over more units is lower, still a bound), or one team's only (`None`: no
/// team's, so none). A gang that may evict only its own team's work would otherwise search
/// nearly every domain for a set the bound promised from other teams' work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Whose {
    Any,
    Team(Option<usize>),
}

impl Whose {
    fn of(who: &Eligible<'_>) -> Whose {
        match (who.preemptor.within_team, who.preemptor.other_teams) {
            (_, true) => Whose::Any,
            (true, false) => Whose::Team(who.team),
            (false, false) => Whose::Team(None),
        }
    }
}

impl Bounds {
    /// A pass whose waiting gangs are `gangs`: free capacity may rise if one asks below zero.
    pub(super) fn new(gangs: &[WaitingGang]) -> Bounds {
        let shapes =
            gangs.iter().flat_map(|g| g.members.iter().map(|m| &m.shape).chain(g.phantoms.iter().map(|p| &p.shape)));
        let may_rise = shapes.flat_map(|s| s.requests.values()).any(|q| q.nanos() < 0);
        Bounds { may_rise, ..Default::default() }
    }

    /// One more gang searches.
    pub(super) fn searching(&mut self) {
        self.searches += 1;
    }

    fn epoch(&self) -> usize {
        if self.may_rise { self.searches } else { self.searches / EPOCH }
    }
}

/// The lowest highest-priority a set in a domain can have: the priority of the first candidate
/// at which `held` (cumulative, cheapest first) reaches `short` (what the domain lacks).
/// `None`: never.
fn lowest_priority(held: &[(i32, i128)], short: i128) -> Option<i32> {
    if short <= 0 {
        return Some(i32::MIN);
    }
    let first = held.partition_point(|(_, total)| *total < short);
    held.get(first).map(|(p, _)| *p)
}

impl Simulation<'_> {
    /// Every domain of `level` where a set of a lower priority than the gang's could make room,
    /// by the lowest priority it can have there, then index: the first so many of a list.
    pub(super) fn bounds(
        &mut self,
        candidates: &mut Candidates<'_>,
        ask: &Ask<'_>,
        level: &str,
    ) -> (Rc<DomainBounds>, usize) {
        let Ask { gang, who, demand } = *ask;
        let Some((resource, need)) = &demand.main else {
            let all: Vec<(i32, usize)> = (0..self.levels.by_key[level].names.len()).map(|d| (i32::MIN, d)).collect();
            return (Rc::new(all.clone()), all.len());
        };
        let key = (level.to_string(), demand.classes.clone(), resource.clone(), Whose::of(who));
        let epoch = candidates.bounds.epoch();
        let sorted = match candidates.bounds.sorted.get(&(key.clone(), *need)) {
            Some((at, sorted)) if *at == epoch => sorted.clone(),
            _ => {
                let free = self.free_by_domain(candidates, demand, level, resource);
                candidates.index_held(&key, &self.levels.by_key[level], &self.class_member);
                let held = &candidates.bounds.held[&key];
                let bounds = free.iter().zip(held).enumerate();
                let mut sorted: Vec<(i32, usize)> = bounds
                    .filter_map(|(d, (free, held))| Some((lowest_priority(held, need.saturating_sub(*free))?, d)))
                    .collect();
                sorted.sort_unstable();
                let sorted = Rc::new(sorted);
                candidates.bounds.sorted.insert((key, *need), (epoch, sorted.clone()));
                sorted
            }
        };
        let below = sorted.partition_point(|(bound, _)| *bound < gang.priority);
        (sorted, below)
    }

    /// What is free of `resource` (never counted below zero) in each domain of `level`, on the
    /// nodes the gang's classes admit (a node two of them admit counted twice: still a bound),
    /// as read this epoch. Where every node of a class offers the resource, that is the level's
    /// sum per domain (kept up to date as the pass places gangs) plus what the nodes below zero
    /// lack, which the class's index lists first: no lookup per node.
    fn free_by_domain(
        &mut self,
        candidates: &mut Candidates<'_>,
        demand: &Demand<'_>,
        level: &str,
        resource: &str,
    ) -> Rc<Vec<i128>> {
        let key = (level.to_string(), demand.classes.clone(), resource.to_string());
        let epoch = candidates.bounds.epoch();
        if let Some((_, free)) = candidates.bounds.free.get(&key).filter(|(at, _)| *at == epoch) {
            return free.clone();
        }
        let mut free = vec![0i128; self.levels.by_key[level].names.len()];
        for &class in &demand.classes {
            let key = (class, resource.to_string());
            let offered = match candidates.bounds.offered.get(&key) {
                Some(offered) => *offered,
                None => {
                    let offered = self.class_nodes[class].iter().all(|&i| self.free[i].contains_key(resource));
                    candidates.bounds.offered.insert(key.clone(), offered);
                    offered
                }
            };
            if !offered {
                let of_node = &self.levels.by_key[level].of_node;
                for &i in &self.class_nodes[class] {
                    if let Some(d) = of_node[i] {
                        let q = self.free[i].get(resource).map_or(0, |q| q.nanos().max(0));
                        free[d] = free[d].saturating_add(q);
                    }
                }
                continue;
            }
            self.ensure_index(class, resource);
            let of_node = &self.levels.by_key[level].of_node;
            let below_zero = self.index[&key].0.iter().take_while(|(q, _)| q.nanos() < 0);
            for (d, q) in below_zero.filter_map(|&(q, i)| Some((of_node[i]?, q.nanos()))) {
                free[d] = free[d].saturating_sub(q);
            }
            for (d, q) in self.domain_free(level, class, resource).iter().enumerate() {
                free[d] = free[d].saturating_add(q.nanos());
            }
        }
        let free = Rc::new(free);
        candidates.bounds.free.insert(key, (epoch, free.clone()));
        free
    }
}

impl Candidates<'_> {
    /// Builds the `held` index of `key` if this pass has not.
    fn index_held(&mut self, key: &HeldKey, l: &Level, admits: &[Vec<bool>]) {
        if self.bounds.held.contains_key(key) {
            return;
        }
        let (_, classes, resource, whose) = key;
        let column = self.column(resource);
        let mut lists = vec![Vec::new(); l.names.len()];
        let mut totals = vec![0i128; l.names.len()];
        let mut touched: Vec<(usize, i128)> = Vec::new();
        let units: Rc<Vec<usize>> = match whose {
            Whose::Any => self.of_classes(classes, admits),
            Whose::Team(Some(team)) => Rc::new(self.by_team[*team].clone()),
            Whose::Team(None) => Rc::new(Vec::new()),
        };
        for &v in units.iter().filter(|&&v| self.evictable[v]) {
            touched.clear();
            for (k, node) in self.pod_nodes(v).iter().enumerate() {
                let Some(i) = *node else { continue };
                let Some(d) = l.of_node[i].filter(|_| classes.iter().any(|&c| admits[c][i])) else { continue };
                let q = self.asked(self.first_pod(v) + k, column).max(0);
                match touched.iter_mut().find(|(t, _)| *t == d) {
                    Some((_, sum)) => *sum = sum.saturating_add(q),
                    None => touched.push((d, q)),
                }
            }
            for &(d, q) in touched.iter().filter(|(_, q)| *q > 0) {
                totals[d] = totals[d].saturating_add(q);
                lists[d].push((self.priority[v], totals[d]));
            }
        }
        self.bounds.held.insert(key.clone(), lists);
    }
}
