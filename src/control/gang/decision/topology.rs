//! Topology in the decision: a gang whose GangPolicy names topology levels is placed wholly
//! inside one domain (one value of a node label), the tightest level first; among the domains
//! of a level that can hold it, the best fit (least of its main accelerator left free, then the
//! domain's name). Domains are read from the nodes' labels once per pass and level; each keeps
//! its free capacity per resource up to date as the pass places gangs (the same `adjust` that
//! keeps the per-node index), so choosing a domain costs O(domains), and placing a gang in one
//! O(members × the domain's nodes).
//!
//! Reservations follow from the same bookkeeping: a released gang's members carry the domain's
//! node selector, so the pass that reserves them (in flight, not bound yet) places them in that
//! domain, and two gangs are never released onto one domain's last GPUs.

use std::collections::HashMap;

use super::{Domain, Member, Placements, Quantity, ResourceList, Simulation, WaitingGang, fits};

/// The levels the pass has looked at, by label key.
#[derive(Debug, Default)]
pub(super) struct Levels {
    pub(super) by_key: HashMap<String, Level>,
}

/// One level: its domains (by name), which domain each node is in, and each domain's free.
#[derive(Debug)]
pub(super) struct Level {
    pub(super) names: Vec<String>,
    /// By node index: its domain (`None`: the node lacks the label, so it is in none).
    pub(super) of_node: Vec<Option<usize>>,
    /// By domain: its nodes.
    pub(super) nodes: Vec<Vec<usize>>,
    /// By (placement class, resource), by domain: free on the domain's nodes that class admits.
    free: HashMap<(usize, String), Vec<Quantity>>,
    /// By (placement class, resource): the domain with the most allocatable on the nodes that
    /// class admits, and how much (what a gang could ever have in one domain).
    largest: HashMap<(usize, String), Option<(Quantity, usize)>>,
}

impl Levels {
    /// A node's free capacity changed by `sign × requests` (see `Simulation::adjust`).
    pub(super) fn adjust(&mut self, node: usize, requests: &ResourceList, sign: i128, class_member: &[Vec<bool>]) {
        for level in self.by_key.values_mut() {
            let Some(domain) = level.of_node[node] else { continue };
            for ((class, resource), free) in level.free.iter_mut() {
                if let Some(q) = requests.get(resource)
                    && class_member[*class][node]
                {
                    free[domain] = Quantity::from_nanos(free[domain].nanos() - sign * q.nanos());
                }
            }
        }
    }
}

/// Why a gang that needs a domain finds none: the figures of its message.
#[derive(Debug, Clone, PartialEq)]
pub struct Within {
    /// The loosest level it may use.
    pub level: String,
    /// Its main accelerator, and how much of it the whole gang asks.
    pub resource: String,
    pub needed: Quantity,
    /// The most free in one domain of the level now, and which (`None`: no node has the label).
    pub most_free: Option<(Quantity, String)>,
    /// Free in all the nodes the gang's first member may use.
    pub free_in_all: Quantity,
    /// Where no domain could hold it even with nothing running: the largest domain's
    /// allocatable and its name.
    pub never: Option<(Quantity, String)>,
}

impl Within {
    /// "needs 4 nvidia.com/gpu within one topology.kubernetes.io/rack; most free in one rack: 3
    /// (rack-b); 6 free in all".
    pub fn message(&self) -> String {
        let short = short_name(&self.level);
        let most = match &self.most_free {
            Some((q, domain)) => format!("most free in one {short}: {q} ({domain})"),
            None => format!("no node has the label {}", self.level),
        };
        let mut out = format!(
            "needs {} {} within one {}; {most}; {} free in all",
            self.needed, self.resource, self.level, self.free_in_all
        );
        if let Some((capacity, domain)) = &self.never {
            out.push_str(&format!(
                "; no {short} can ever hold it (the largest has {capacity} {} in all: {domain}), so it waits for a \
                 policy or node change and holds nobody back",
                self.resource
            ));
        }
        out
    }
}

/// `topology.kubernetes.io/rack` → `rack`: how messages name one domain of a level.
fn short_name(level: &str) -> &str {
    level.rsplit('/').next().unwrap_or(level)
}

impl Simulation<'_> {
    /// Places every member of `gang` (or none): inside one domain where its topology asks,
    /// with the domain chosen; anywhere otherwise (and where a preferred-only topology finds
    /// no domain). Committed.
    pub(super) fn place_for(&mut self, gang: &WaitingGang) -> Option<(Placements, Option<Domain>)> {
        let Some(topology) = &gang.topology else { return self.place_gang(gang).map(|p| (p, None)) };
        if let Some(peers) = &gang.joins {
            return self.place_in_domain(gang, peers);
        }
        let main = main_need(self, gang);
        for level in &topology.levels {
            for domain in self.candidates(level, main.as_ref()) {
                let nodes = self.levels.by_key[level].nodes[domain].clone();
                if let Some(done) = self.place_members(gang, Some(&nodes)) {
                    let value = self.levels.by_key[level].names[domain].clone();
                    return Some((self.named(done), Some(Domain { level: level.clone(), value })));
                }
            }
        }
        if topology.required { None } else { self.place_gang(gang).map(|p| (p, None)) }
    }

    /// Places the gang in `domain` alone (where its released members are), or nowhere.
    fn place_in_domain(&mut self, gang: &WaitingGang, domain: &Domain) -> Option<(Placements, Option<Domain>)> {
        self.ensure_level(&domain.level);
        let level = &self.levels.by_key[&domain.level];
        let index = level.names.binary_search(&domain.value).ok()?;
        let nodes = level.nodes[index].clone();
        let done = self.place_members(gang, Some(&nodes))?;
        Some((self.named(done), Some(domain.clone())))
    }

    /// `(member, node)` by member name.
    pub(super) fn named(&self, done: Vec<(usize, &Member)>) -> Placements {
        let mut placements: Vec<(String, String)> =
            done.into_iter().map(|(node, m)| (m.name.clone(), self.nodes[node].name.clone())).collect();
        placements.sort();
        placements
    }

    /// The domains of `level` worth trying, best fit first: those with at least `main`'s
    /// amount free (all, when the gang asks no accelerator), by what is left over, then name.
    fn candidates(&mut self, level: &str, main: Option<&(usize, String, Quantity)>) -> Vec<usize> {
        self.ensure_level(level);
        let Some((class, resource, needed)) = main else {
            return (0..self.levels.by_key[level].names.len()).collect();
        };
        let mut fitting: Vec<(Quantity, usize)> = self
            .domain_free(level, *class, resource)
            .iter()
            .enumerate()
            .filter(|(_, f)| **f >= *needed)
            .map(|(d, f)| (Quantity::from_nanos(f.nanos() - needed.nanos()), d))
            .collect();
        // (Domains are numbered in name order: the index breaks ties by name.)
        fitting.sort();
        fitting.into_iter().map(|(_, d)| d).collect()
    }

    /// Reads a level's domains from the nodes' labels (once per pass).
    pub(super) fn ensure_level(&mut self, level: &str) {
        if self.levels.by_key.contains_key(level) {
            return;
        }
        let mut names: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|n| n.labels.get(level).cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        names.shrink_to_fit();
        let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        let of_node: Vec<Option<usize>> =
            self.nodes.iter().map(|n| n.labels.get(level).and_then(|v| index.get(v.as_str()).copied())).collect();
        let mut nodes = vec![Vec::new(); names.len()];
        for (i, d) in of_node.iter().enumerate() {
            if let Some(d) = d {
                nodes[*d].push(i);
            }
        }
        let level_data = Level { names, of_node, nodes, free: HashMap::new(), largest: HashMap::new() };
        self.levels.by_key.insert(level.to_string(), level_data);
    }

    /// Each domain's free `resource` on the nodes `class` admits, now (computed once, then kept
    /// up to date by `adjust`).
    pub(super) fn domain_free(&mut self, level: &str, class: usize, resource: &str) -> &Vec<Quantity> {
        self.ensure_level(level);
        let (free, admits) = (&self.free, &self.class_member[class]);
        let entry = self.levels.by_key.get_mut(level).map(|l| {
            let nodes = &l.nodes;
            l.free.entry((class, resource.to_string())).or_insert_with(|| {
                let of = |i: &usize| free[*i].get(resource).copied().unwrap_or(Quantity::ZERO);
                nodes.iter().map(|ns| sum(ns.iter().filter(|i| admits[**i]).map(of))).collect()
            })
        });
        entry.expect("ensure_level made the level")
    }

    /// The domain of `level` with the most allocatable `resource` on the nodes `class` admits
    /// (computed once per pass).
    fn largest_domain(&mut self, level: &str, class: usize, resource: &str) -> Option<(Quantity, usize)> {
        self.ensure_level(level);
        let (nodes, admits) = (self.nodes, &self.class_member[class]);
        let l = self.levels.by_key.get_mut(level)?;
        let domains = &l.nodes;
        *l.largest.entry((class, resource.to_string())).or_insert_with(|| {
            let of = |i: &usize| nodes[*i].allocatable.get(resource).copied().unwrap_or(Quantity::ZERO);
            let capacity = domains.iter().map(|ns| sum(ns.iter().filter(|i| admits[**i]).map(of)));
            capacity.enumerate().map(|(d, q)| (q, d)).max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        })
    }

    /// A node among `nodes` for `shape` given current free capacity: one its static filters
    /// admit, best fit on the member's main resource, then the lowest index.
    pub(super) fn place_on(&mut self, shape: &crate::control::cluster::PodShape, nodes: &[usize]) -> Option<usize> {
        let class = self.class_of(shape);
        let primary = Self::primary(shape);
        nodes
            .iter()
            .copied()
            .filter(|&i| self.class_member[class][i] && fits(&self.free[i], &shape.requests))
            .min_by_key(|&i| (primary.map(|r| self.free[i].get(r).copied().unwrap_or(Quantity::ZERO)), i))
    }

    /// Free `resource` on those of `nodes` that `class` admits.
    pub(super) fn free_on(&self, class: usize, resource: &str, nodes: &[usize]) -> Quantity {
        sum(nodes
            .iter()
            .filter(|&&i| self.class_member[class][i])
            .map(|&i| self.free[i].get(resource).copied().unwrap_or(Quantity::ZERO)))
    }

    /// Why a gang that requires a domain waits, at the loosest level it may use; `None` for a
    /// gang without a required topology (its plain figures say it) or without members. Costs
    /// O(domains): each domain's free and the largest domain are kept per placement class.
    pub(super) fn within(&mut self, gang: &WaitingGang, needed: &ResourceList) -> Option<Within> {
        let topology = gang.topology.as_ref().filter(|t| t.required)?;
        let first = gang.members.first()?;
        let resource = Self::primary(&first.shape)?.to_string();
        let needed = needed.get(&resource).copied().unwrap_or(Quantity::ZERO);
        let level = gang.joins.as_ref().map_or_else(|| topology.outermost().to_string(), |d| d.level.clone());
        let class = self.class_of(&first.shape);
        self.ensure_index(class, &resource);
        let free_in_all = self.index[&(class, resource.clone())].1.max(Quantity::ZERO);
        let largest = self.largest_domain(&level, class, &resource);
        let free = self.domain_free(&level, class, &resource);
        // The most free, the first by name among equals (domains are numbered in name order).
        let most = free.iter().enumerate().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0))).map(|(d, q)| (*q, d));
        let names = &self.levels.by_key[&level].names;
        let most_free = most.map(|(q, d)| (q.max(Quantity::ZERO), names[d].clone()));
        let never = largest.filter(|(capacity, _)| *capacity < needed).map(|(q, d)| (q, names[d].clone()));
        Some(Within { level, resource, needed, most_free, free_in_all, never })
    }
}

/// The gang's main accelerator (its first member's largest) and how much of it all its members
/// and phantoms ask: what a domain must have free to be worth trying.
fn main_need(sim: &mut Simulation<'_>, gang: &WaitingGang) -> Option<(usize, String, Quantity)> {
    let (resource, needed) = main_amount(gang)?;
    let class = sim.class_of(&gang.members.first()?.shape);
    Some((class, resource, needed))
}

/// [`main_need`] without the class: the main accelerator and how much of it the gang asks.
pub(super) fn main_amount(gang: &WaitingGang) -> Option<(String, Quantity)> {
    let first = gang.members.first()?;
    let resource = Simulation::primary(&first.shape)?.to_string();
    let of = |requests: &ResourceList| requests.get(&resource).copied().unwrap_or(Quantity::ZERO);
    let mut needed = sum(gang.members.iter().map(|m| of(&m.shape.requests)));
    if let Some(p) = &gang.phantoms {
        needed = needed
            .saturating_add(Quantity::from_nanos(of(&p.shape.requests).nanos().saturating_mul(i128::from(p.count))));
    }
    Some((resource, needed))
}

fn sum(quantities: impl Iterator<Item = Quantity>) -> Quantity {
    quantities.fold(Quantity::ZERO, Quantity::saturating_add)
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
