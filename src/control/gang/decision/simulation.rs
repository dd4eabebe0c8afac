//! The pass's simulation of the cluster ([`Simulation`]): gangs are placed one after another on
//! what the nodes have free, so a later gang sees the room an earlier one took.

use std::collections::{BTreeSet, HashMap};

use super::{GangDetail, Member, Need, NeedOf, NodeFit, Phantoms, Snapshot, WaitingGang, topology};
use crate::control::cluster::{NodeInfo, PodShape};
use crate::control::gang::fit::{copies_that_fit, fits, node_admits, node_refusal, shortfall, take, unjudged};
use crate::model::quantity::Quantity;
use crate::model::resources::{ResourceList, ResourceMatcher};

pub(super) type IndexKey = (usize, String);

/// A pass's working copy of the nodes: what is free on each, the placement classes of the
/// shapes seen so far with their feasible nodes and per-resource indexes, and the topology
/// levels. Gangs are placed into it one after another, in the pass's order.
pub(super) struct Simulation<'a> {
    pub(super) nodes: &'a [NodeInfo],
    pub(super) by_name: HashMap<&'a str, usize>,
    pub(super) free: Vec<ResourceList>,
    /// placement key → class id
    pub(super) classes: HashMap<String, usize>,
    /// class id → feasible nodes, and membership for index updates
    pub(super) class_nodes: Vec<Vec<usize>>,
    pub(super) class_member: Vec<Vec<bool>>,
    /// (class, resource) → (free, node) ordered, and the class's total free of the resource
    pub(super) index: HashMap<IndexKey, (BTreeSet<(Quantity, usize)>, Quantity)>,
    /// Topology levels seen this pass: their domains and each domain's free, per resource.
    pub(super) levels: topology::Levels,
}

impl<'a> Simulation<'a> {
    pub(super) fn new(nodes: &'a [NodeInfo]) -> Self {
        Simulation {
            nodes,
            by_name: nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect(),
            free: nodes.iter().map(|n| n.allocatable.clone()).collect(),
            classes: HashMap::new(),
            class_nodes: Vec::new(),
            class_member: Vec::new(),
            index: HashMap::new(),
            levels: topology::Levels::default(),
        }
    }

    /// The cluster as the pass starts: what bound pods take, and what released members not
    /// bound yet will take where the scheduler is likely to put them (a member that fits nowhere
    /// is the scheduler's problem and reserves nothing).
    pub(super) fn seeded(snapshot: &'a Snapshot) -> Self {
        let mut sim = Simulation::new(&snapshot.nodes);
        for (node, requests) in &snapshot.bound {
            if let Some(&i) = sim.by_name.get(node.as_str()) {
                take(&mut sim.free[i], requests);
            }
        }
        for shape in &snapshot.in_flight {
            if let Some(node) = sim.place(shape) {
                sim.commit(node, &shape.requests);
            }
        }
        sim
    }

    pub(super) fn class_of(&mut self, shape: &PodShape) -> usize {
        let key = shape.placement_key();
        if let Some(&c) = self.classes.get(&key) {
            return c;
        }
        let feasible: Vec<usize> = (0..self.nodes.len()).filter(|&i| node_admits(&self.nodes[i], shape)).collect();
        let mut member = vec![false; self.nodes.len()];
        for &i in &feasible {
            member[i] = true;
        }
        let id = self.class_nodes.len();
        self.class_nodes.push(feasible);
        self.class_member.push(member);
        self.classes.insert(key, id);
        id
    }

    pub(super) fn ensure_index(&mut self, class: usize, resource: &str) {
        let key = (class, resource.to_string());
        if self.index.contains_key(&key) {
            return;
        }
        let mut set = BTreeSet::new();
        let mut total = Quantity::ZERO;
        for &i in &self.class_nodes[class] {
            let f = self.free[i].get(resource).copied().unwrap_or(Quantity::ZERO);
            set.insert((f, i));
            total = total.saturating_add(f);
        }
        self.index.insert(key, (set, total));
    }

    /// The member's largest non-core request: what its best fit is judged on.
    pub(super) fn primary(shape: &PodShape) -> Option<&str> {
        shape
            .requests
            .iter()
            .filter(|(name, q)| {
                !matches!(name.as_str(), "cpu" | "memory" | "pods" | "ephemeral-storage")
                    && !name.starts_with(crate::model::dra::CLASS_RESOURCE_PREFIX)
                    && **q > Quantity::ZERO
            })
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(name, _)| name.as_str())
    }

    /// A node for `shape` given current free capacity (best fit on its primary resource).
    pub(super) fn place(&mut self, shape: &PodShape) -> Option<usize> {
        let class = self.class_of(shape);
        match Self::primary(shape) {
            Some(resource) => {
                let need = shape.requests[resource];
                self.ensure_index(class, resource);
                let (set, total) = &self.index[&(class, resource.to_string())];
                if *total < need {
                    return None;
                }
                set.range((need, 0)..).map(|&(_, i)| i).find(|&i| fits(&self.free[i], &shape.requests))
            }
            None => self.class_nodes[class].iter().copied().find(|&i| fits(&self.free[i], &shape.requests)),
        }
    }

    /// Applies `delta` (positive: take, negative: give back) to a node and its indexes.
    pub(super) fn adjust(&mut self, node: usize, requests: &ResourceList, sign: i128) {
        for ((class, resource), (set, total)) in self.index.iter_mut() {
            let Some(q) = requests.get(resource) else { continue };
            if !self.class_member[*class][node] {
                continue;
            }
            let before = self.free[node].get(resource).copied().unwrap_or(Quantity::ZERO);
            let after = Quantity::from_nanos(before.nanos() - sign * q.nanos());
            set.remove(&(before, node));
            set.insert((after, node));
            *total = Quantity::from_nanos(total.nanos() - sign * q.nanos());
        }
        self.levels.adjust(node, requests, sign, &self.class_member);
        for (name, q) in requests {
            if let Some(f) = self.free[node].get_mut(name) {
                *f = Quantity::from_nanos(f.nanos() - sign * q.nanos());
            }
        }
    }

    pub(super) fn commit(&mut self, node: usize, requests: &ResourceList) {
        self.adjust(node, requests, 1);
    }

    /// Places every member or none.
    pub(super) fn place_gang(&mut self, gang: &WaitingGang) -> Option<Vec<(String, String)>> {
        let done = self.place_members(gang, None)?;
        let mut placements: Vec<(String, String)> =
            done.into_iter().map(|(node, m)| (m.name.clone(), self.nodes[node].name.clone())).collect();
        placements.sort();
        Some(placements)
    }

    /// Whether the whole gang fits what is free now (inside one domain where its topology
    /// requires one); the simulation is left as it was.
    pub(super) fn could_hold(&mut self, gang: &WaitingGang) -> bool {
        let Some((placements, _)) = self.place_for(gang) else { return false };
        let by_name: HashMap<&str, &Member> = gang.members.iter().map(|m| (m.name.as_str(), m)).collect();
        for (member, node) in &placements {
            if let (Some(m), Some(&i)) = (by_name.get(member.as_str()), self.by_name.get(node.as_str())) {
                self.adjust(i, &m.shape.requests, -1);
            }
        }
        true
    }

    /// The nodes (by index) whose static filters admit some member of the gang, phantoms
    /// included.
    pub(super) fn usable_nodes(&mut self, gang: &WaitingGang) -> Vec<bool> {
        let mut usable = vec![false; self.nodes.len()];
        // A gang that requires a topology level can use only nodes in some domain of it.
        let level = gang.topology.as_ref().filter(|t| t.required).map(|t| t.outermost());
        for class in self.classes_of(gang) {
            for &i in &self.class_nodes[class] {
                usable[i] = level.is_none_or(|l| self.nodes[i].labels.contains_key(l));
            }
        }
        usable
    }

    /// True when a member of one of the placement `classes` may use one of `nodes`.
    pub(super) fn may_use_any(&self, classes: &[usize], nodes: &[bool]) -> bool {
        classes.iter().any(|&class| self.class_nodes[class].iter().any(|&i| nodes[i]))
    }

    /// The placement classes of the gang's members and phantoms, each once.
    pub(super) fn classes_of(&mut self, gang: &WaitingGang) -> Vec<usize> {
        let mut classes: Vec<usize> = Vec::new();
        let shapes = gang.members.iter().map(|m| &m.shape).chain(gang.phantoms.as_ref().map(|p| &p.shape));
        for shape in shapes {
            let class = self.class_of(shape);
            if !classes.contains(&class) {
                classes.push(class);
            }
        }
        classes
    }

    /// Places every member (and checks the phantoms fit) or none: the members placed, with the
    /// node each took (committed).
    pub(super) fn place_members<'g>(
        &mut self,
        gang: &'g WaitingGang,
        within: Option<&[usize]>,
    ) -> Option<Vec<(usize, &'g Member)>> {
        let mut members: Vec<&Member> = gang.members.iter().collect();
        // First-fit decreasing: the largest members first.
        members.sort_by(|a, b| {
            let size = |m: &Member| Self::primary(&m.shape).map(|r| m.shape.requests[r]).unwrap_or(Quantity::ZERO);
            size(b).cmp(&size(a)).then_with(|| a.name.cmp(&b.name))
        });
        let mut done: Vec<(usize, &Member)> = Vec::with_capacity(members.len());
        for m in members {
            let node = match within {
                None => self.place(&m.shape),
                Some(nodes) => self.place_on(&m.shape, nodes),
            };
            match node {
                Some(node) => {
                    self.commit(node, &m.shape.requests);
                    done.push((node, m));
                }
                None => {
                    for (node, m) in done {
                        self.adjust(node, &m.shape.requests, -1);
                    }
                    return None;
                }
            }
        }
        if let Some(phantoms) = &gang.phantoms
            && !self.place_copies(phantoms, within)
        {
            for (node, m) in done {
                self.adjust(node, &m.shape.requests, -1);
            }
            return None;
        }
        Some(done)
    }

    /// Tries to place `count` copies of one shape, then gives everything back (phantoms are not
    /// released, they only have to fit). The work is bounded by what the nodes can hold, not by
    /// the count: a count beyond the class's total free of any resource it asks (`pods: 1`
    /// always among them) is refused before a single copy is placed, and otherwise each copy
    /// placed takes a pod slot that exists.
    pub(super) fn place_copies(&mut self, phantoms: &Phantoms, within: Option<&[usize]>) -> bool {
        let class = self.class_of(&phantoms.shape);
        let count = i128::from(phantoms.count);
        for (resource, need) in phantoms.shape.requests.iter().filter(|(_, q)| **q > Quantity::ZERO) {
            let total = match within {
                None => {
                    self.ensure_index(class, resource);
                    self.index[&(class, resource.clone())].1
                }
                Some(nodes) => self.free_on(class, resource, nodes),
            };
            if need.nanos().saturating_mul(count) > total.nanos() {
                return false;
            }
        }
        let mut placed: Vec<usize> = Vec::new();
        let mut fits_all = true;
        for _ in 0..phantoms.count {
            let node = match within {
                None => self.place(&phantoms.shape),
                Some(nodes) => self.place_on(&phantoms.shape, nodes),
            };
            match node {
                Some(node) => {
                    self.commit(node, &phantoms.shape.requests);
                    placed.push(node);
                }
                None => {
                    fits_all = false;
                    break;
                }
            }
        }
        for node in placed {
            self.adjust(node, &phantoms.shape.requests, -1);
        }
        fits_all
    }

    /// The waiting gang's message ([`Need::message`]).
    pub(super) fn need_message(&mut self, gang: &WaitingGang, accelerators: &ResourceMatcher) -> String {
        self.need(gang, accelerators).message()
    }

    /// What the gang asks and what is free for it now.
    ///
    /// Costs O(members present × resources): what missing members will ask is one
    /// multiplication, whatever size the gang declares.
    pub(super) fn need(&mut self, gang: &WaitingGang, accelerators: &ResourceMatcher) -> Need {
        let present = gang.present();
        let mut need = Need { present, expected: gang.expected, nodes: None, resources: Vec::new(), within: None };
        let Some(first) = gang.members.first() else { return need };
        let expected = gang.expected.map_or(present, |n| u64::from(n).max(present));
        let mut totals: ResourceList = ResourceList::new();
        let mut add = |requests: &ResourceList, times: u64| {
            for (name, q) in requests
                .iter()
                .filter(|(n, _)| accelerators.matches(n) || n.starts_with(crate::model::dra::CLASS_RESOURCE_PREFIX))
            {
                let slot = totals.entry(name.clone()).or_default();
                *slot = slot.saturating_add(Quantity::from_nanos(q.nanos().saturating_mul(i128::from(times))));
            }
        };
        for m in &gang.members {
            add(&m.shape.requests, 1);
        }
        if let Some(p) = &gang.phantoms {
            add(&p.shape.requests, u64::from(p.count));
        }
        // Members not created yet are assumed to look like the first one.
        add(&first.shape.requests, expected - present);
        let class = self.class_of(&first.shape);
        need.within = self.within(gang, &totals);
        for (name, needed) in totals {
            // DRA claim devices only where the nodes say how many they offer (slices read).
            if name.starts_with(crate::model::dra::CLASS_RESOURCE_PREFIX)
                && self.free.iter().all(|f| unjudged(f, &name))
            {
                continue;
            }
            self.ensure_index(class, &name);
            // (Below zero where a preemption's room is reserved over its victims still there.)
            let free = self.index[&(class, name.clone())].1.max(Quantity::ZERO);
            need.resources.push(NeedOf { resource: name, needed, free });
        }
        need.nodes = Some(first.shape.describe_nodes());
        need
    }

    /// The gang's [`Need`] and every node as its first member sees it now.
    pub(super) fn detail(&mut self, gang: &WaitingGang, accelerators: &ResourceMatcher, position: usize) -> GangDetail {
        let need = self.need(gang, accelerators);
        let nodes = match gang.members.first() {
            Some(first) => self
                .nodes
                .iter()
                .zip(&self.free)
                .map(|(node, free)| match node_refusal(node, &first.shape) {
                    Some(refusal) => {
                        NodeFit { node: node.name.clone(), refusal: Some(refusal), members: 0, short: Vec::new() }
                    }
                    None => NodeFit {
                        node: node.name.clone(),
                        refusal: None,
                        members: copies_that_fit(free, &first.shape.requests, u64::MAX),
                        short: shortfall(free, &first.shape.requests),
                    },
                })
                .collect(),
            None => Vec::new(),
        };
        GangDetail { need, nodes, position }
    }
}
