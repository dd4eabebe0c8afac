//! The pass's candidates: every running unit, cheapest first, and what the search reads of
//! them, built when a gang first searches (most passes have no gang that does not fit and may
//! preempt, and pay nothing for them).
//!
//! The search reads a unit many times per pass (per gang, per domain, per probe). Reading it
//! through its `RunningUnit` (its pods, each request map, each name a separate allocation) was
//! most of the search's time, so the pods are walked once: what the search reads is kept in
//! flat arrays, by unit in cost order and by pod, and what the pods ask is kept per resource.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::{Cost, Quantity, RunningUnit, Simulation, bounds, domains, work_lost_of};
use crate::control::gang::decision::Snapshot;
use crate::model::resources::ResourceMatcher;

pub(in crate::control::gang::decision) struct Candidates<'s> {
    running: &'s [RunningUnit],
    pub(super) accelerators: &'s ResourceMatcher,
    pub(super) now: i64,
    /// Every running unit, cheapest first (empty until [`Candidates::order`]).
    pub(super) units: Vec<&'s RunningUnit>,
    /// By unit (as ordered): its priority, start, whether it is evictable now, its work lost.
    pub(super) priority: Vec<i32>,
    started: Vec<i64>,
    pub(super) evictable: Vec<bool>,
    lost: Vec<i128>,
    /// By unit: its first pod in the pod arrays, and how many it has.
    pods: Vec<(usize, usize)>,
    /// By pod: its node's index (`None`: a node the view does not have).
    pod_node: Vec<Option<usize>>,
    /// By resource asked: its column in `asked`.
    columns: HashMap<&'s str, usize>,
    /// By pod, by column: what the pod asks of that resource (nanos; 0 where it asks none).
    /// A pod's row is contiguous: the search reads all of it at once.
    asked: Vec<i128>,
    /// No pod asks anything below zero: evicting more never leaves less free.
    pub(super) monotone: bool,
    /// By unit: its team, as an index into `teams` (`None`: a namespace of no team). Names
    /// compared per unit and gang were most of the search's time.
    pub(super) team_of: Vec<Option<usize>>,
    /// The units' teams, and by team its units, cheapest first.
    pub(super) teams: HashMap<&'s str, usize>,
    pub(super) by_team: Vec<Vec<usize>>,
    /// By unit: taken by a preemption chosen earlier in the pass.
    pub(super) taken: Vec<bool>,
    /// By node index: a preemption is in flight there.
    pub(super) busy: Vec<bool>,
    /// The nodes `busy` marks, listed: a pass marks few, and every gang asks which of its nodes
    /// are busy (scanning every node per gang and domain was most of the search's time).
    pub(super) busy_nodes: Vec<usize>,
    /// The pass's indexes per topology level and placement class (built when first asked for).
    pub(super) indexes: domains::Indexes,
    /// The domains' bounds, and the indexes they are read from.
    pub(super) bounds: bounds::Bounds,
}

/// A unit as the walk over the pods leaves it.
struct Walked<'s> {
    /// Its cost but for the key: priority, work lost, newest first, pods.
    key: (i32, i128, Reverse<i64>, usize),
    unit: &'s RunningUnit,
    /// Its first pod in the pod arrays.
    first: usize,
    evictable: bool,
    team: Option<usize>,
}

impl<'s> Candidates<'s> {
    /// The pass's candidates, not ordered yet; the nodes of the preemptions in flight busy.
    pub(in crate::control::gang::decision) fn new(snapshot: &'s Snapshot, sim: &Simulation<'_>) -> Candidates<'s> {
        let mut candidates = Candidates {
            running: &snapshot.running,
            accelerators: &snapshot.accelerators,
            now: snapshot.now,
            units: Vec::new(),
            priority: Vec::new(),
            started: Vec::new(),
            evictable: Vec::new(),
            lost: Vec::new(),
            pods: Vec::new(),
            pod_node: Vec::new(),
            columns: HashMap::new(),
            asked: Vec::new(),
            monotone: true,
            team_of: Vec::new(),
            teams: HashMap::new(),
            by_team: Vec::new(),
            taken: Vec::new(),
            busy: vec![false; sim.nodes.len()],
            busy_nodes: Vec::new(),
            indexes: domains::Indexes::default(),
            bounds: bounds::Bounds::new(&snapshot.gangs),
        };
        for flight in &snapshot.preemptions {
            candidates.mark_busy(sim, &flight.nodes);
        }
        candidates
    }

    /// Orders the units by cost (once a pass): lowest priority, least work lost, newest, fewest
    /// pods, then key.
    pub(super) fn order(&mut self, sim: &Simulation<'_>) {
        if self.units.len() == self.running.len() {
            return;
        }
        let mut walked = self.walk(sim);
        // (The keys are copied out of the units: comparing through them was most of the sort.)
        walked.sort_by(|a, b| a.key.cmp(&b.key).then_with(|| a.unit.key.cmp(&b.unit.key)));
        for w in walked {
            self.units.push(w.unit);
            self.priority.push(w.key.0);
            self.lost.push(w.key.1);
            self.started.push(w.key.2.0);
            self.pods.push((w.first, w.key.3));
            self.evictable.push(w.evictable);
            self.team_of.push(w.team);
        }
        self.by_team = vec![Vec::new(); self.teams.len()];
        for (v, team) in self.team_of.iter().enumerate() {
            if let Some(t) = team {
                self.by_team[*t].push(v);
            }
        }
        self.taken = vec![false; self.units.len()];
    }

    /// Walks every pod once, in the snapshot's order: its node, what it asks per resource, and
    /// each unit's work lost ([`RunningUnit::work_lost`]).
    fn walk(&mut self, sim: &Simulation<'_>) -> Vec<Walked<'s>> {
        // What each pod asks: (pod, column, nanos), then laid out by pod once the columns are known.
        let mut asks: Vec<(usize, usize, i128)> = Vec::new();
        let mut walked = Vec::with_capacity(self.running.len());
        let mut devices: Vec<(&str, Quantity)> = Vec::new();
        let mut accelerators: Vec<bool> = Vec::new();
        let mut p = 0;
        for unit in self.running {
            let first = p;
            devices.clear();
            for pod in &unit.pods {
                self.pod_node.push(sim.by_name.get(pod.node.as_str()).copied());
                for (name, q) in &pod.requests {
                    let next = self.columns.len();
                    let column = *self.columns.entry(name.as_str()).or_insert(next);
                    if column == accelerators.len() {
                        accelerators.push(self.accelerators.matches(name));
                    }
                    asks.push((p, column, q.nanos()));
                    self.monotone &= q.nanos() >= 0;
                    if accelerators[column] {
                        match devices.iter_mut().find(|(n, _)| *n == name) {
                            Some((_, sum)) => *sum = sum.saturating_add(*q),
                            None => devices.push((name, *q)),
                        }
                    }
                }
                p += 1;
            }
            let lost = work_lost_of(&mut devices, unit.started, self.now);
            walked.push(Walked {
                key: (unit.priority, lost, Reverse(unit.started), unit.pods.len()),
                unit,
                first,
                evictable: self.now >= unit.evictable_from,
                team: unit.team.as_deref().map(|t| self.team(t)),
            });
        }
        let width = self.columns.len();
        self.asked = vec![0; p * width];
        for (pod, column, q) in asks {
            self.asked[pod * width + column] = q;
        }
        walked
    }

    /// The index of team `name`, numbered as first seen.
    fn team(&mut self, name: &'s str) -> usize {
        let next = self.teams.len();
        *self.teams.entry(name).or_insert(next)
    }

    /// The nodes of unit `v`'s pods, in its pods' order.
    pub(super) fn pod_nodes(&self, v: usize) -> &[Option<usize>] {
        let (first, count) = self.pods[v];
        &self.pod_node[first..first + count]
    }

    /// Where unit `v`'s pods are in the lists [`Candidates::asked`] returns.
    pub(super) fn first_pod(&self, v: usize) -> usize {
        self.pods[v].0
    }

    /// The column of `resource` in what the pods ask (`None`: no pod asks it).
    pub(super) fn column(&self, resource: &str) -> Option<usize> {
        self.columns.get(resource).copied()
    }

    /// What pod `pod` (unit `v`'s `k`th is `first_pod(v) + k`) asks of the resource at `column`
    /// (nanos; 0 where it asks none).
    pub(super) fn asked(&self, pod: usize, column: Option<usize>) -> i128 {
        column.map_or(0, |c| self.asked[pod * self.columns.len() + c])
    }

    /// Marks the victims of a preemption just chosen: taken, and their nodes busy.
    pub(super) fn claim(&mut self, victims: &[usize]) {
        for &v in victims {
            self.taken[v] = true;
            let (first, count) = self.pods[v];
            for p in first..first + count {
                if let Some(i) = self.pod_node[p] {
                    self.set_busy(i);
                }
            }
        }
    }

    /// Marks nodes busy: a preemption for a gang is in flight there.
    pub(in crate::control::gang::decision) fn mark_busy(&mut self, sim: &Simulation<'_>, nodes: &[String]) {
        for node in nodes {
            if let Some(&i) = sim.by_name.get(node.as_str()) {
                self.set_busy(i);
            }
        }
    }

    fn set_busy(&mut self, node: usize) {
        if !std::mem::replace(&mut self.busy[node], true) {
            self.busy_nodes.push(node);
        }
    }

    /// [`set_cost`](super::set_cost) of the units at `set` (indices in the cost order), from
    /// what is known per unit.
    pub(super) fn cost(&self, set: &[usize]) -> Cost {
        let priority = set.iter().map(|&v| self.priority[v]).max().unwrap_or(i32::MIN);
        let lost = set.iter().map(|&v| self.lost[v]).fold(0i128, i128::saturating_add);
        let oldest = set.iter().map(|&v| self.started[v]).min().unwrap_or(i64::MAX);
        let pods = set.iter().map(|&v| self.pods[v].1).sum();
        (priority, lost, Reverse(oldest), pods)
    }
}
