//! What the controller's passes read, kept as watch events arrive (issue 49), so that a pass
//! costs O(the pods in play + nodes) instead of a walk over every pod under the view's lock:
//!
//! - the pods the gang pass looks at one by one ([`takes_part`]): gang members not on a node,
//!   pods behind Allot's gang gate, bound members still told their gang did not start;
//! - the pods in the quota queue (present, behind Allot's quota gate);
//! - the victims of Allot's preemption still terminating on their nodes;
//! - the released gang members a disruption is taking ([`PodRecord::disrupts_gang`]);
//! - the running pods ([`runs`]) by namespace and priority: what a preemption or a reclaim may
//!   evict, read without the pods above the preemptor's priority or outside its reach;
//! - what bound pods take on each node, a shared claim once, on the node of its holder whose
//!   name sorts first, with that holder's devices (a rule that depends only on who holds the
//!   claim now, so a walk in name order gives the same sums).
//!
//! Kept by [`super::by_state::ByState::delta`], which every change of a record goes through
//! (the controller's in-place marks included).

use super::by_state::add;
use super::*;
use crate::control::cluster::DisruptionCause;
use crate::control::cluster::records::HeldClaim;

/// resource → (nano-units, contributions); an entry goes with its last contribution.
type Load = HashMap<Arc<str>, (i128, u32)>;

/// A shared claim's bound holders: pod name → (its node, its devices for the claim).
type BoundHolders = BTreeMap<Arc<str>, (Arc<str>, ClaimDevices)>;

#[derive(Debug, Default)]
pub(super) struct InPlay {
    gang_pass: std::collections::HashSet<Key>,
    quota_queue: std::collections::HashSet<Key>,
    preempted: std::collections::HashSet<Key>,
    disrupting: std::collections::HashSet<Key>,
    /// namespace → priority → the names of its running pods ([`runs`]).
    running: HashMap<Arc<str>, BTreeMap<i32, std::collections::HashSet<Arc<str>>>>,
    /// node → what its bound, non-finished pods request (terminating ones still hold it).
    nodes: HashMap<Arc<str>, Load>,
    /// (namespace, shared claim) → its bound holders: name → (node, devices).
    claims: HashMap<ClaimId, BoundHolders>,
}

/// Whether the gang pass takes `p` in one by one; any other non-finished pod only adds to its
/// node's load. Mirrors the early returns of the gang snapshot's walk.
pub fn takes_part(p: &PodRecord) -> bool {
    !p.finished && (p.told_late_and_bound() || (p.node_name.is_none() && (p.gang.is_some() || p.gate_index.is_some())))
}

/// In the quota queue: present and behind Allot's quota gate.
pub fn queued(p: &PodRecord) -> bool {
    p.present() && p.quota_gate_index.is_some()
}

/// A victim of Allot's preemption still on its node.
pub fn preempted_on_node(p: &PodRecord) -> bool {
    !p.finished && p.terminating && p.node_name.is_some() && p.disruption == Some(DisruptionCause::PreemptionByAllot)
}

/// Running: bound and present (not terminating, not finished).
pub fn runs(p: &PodRecord) -> bool {
    p.present() && p.node_name.is_some()
}

impl InPlay {
    /// The pods the gang pass takes in one by one.
    pub(super) fn gang_pass_keys(&self) -> impl Iterator<Item = &Key> {
        self.gang_pass.iter()
    }

    /// The pods in the quota queue.
    pub(super) fn quota_queue_keys(&self) -> impl Iterator<Item = &Key> {
        self.quota_queue.iter()
    }

    /// Adds (`sign` 1) or takes away (-1) `record`; finished pods count nothing.
    pub(super) fn delta(&mut self, record: &PodRecord, sign: i128) {
        if record.finished {
            return;
        }
        let key = || (record.namespace.clone(), record.name.clone());
        for (set, member) in [
            (&mut self.gang_pass, takes_part(record)),
            (&mut self.quota_queue, queued(record)),
            (&mut self.preempted, preempted_on_node(record)),
            (&mut self.disrupting, record.disrupts_gang()),
        ] {
            if !member {
                continue;
            }
            if sign > 0 {
                set.insert(key());
            } else {
                set.remove(&key());
            }
        }
        if runs(record) {
            self.running_delta(record, sign);
        }
        let Some(node) = &record.node_name else { return };
        let load = self.nodes.entry(node.clone()).or_default();
        for (name, q) in &record.requests {
            add(load, name.clone(), q.nanos(), sign);
        }
        if self.nodes.get(node).is_some_and(HashMap::is_empty) {
            self.nodes.remove(node);
        }
        let held = record.held_claims();
        for (i, claim) in held.iter().enumerate() {
            // A pod naming a claim twice holds it once, with its first entry's devices.
            if !held[..i].iter().any(|c| c.name == claim.name) {
                self.claim_delta(record, node, claim, sign);
            }
        }
    }

    fn running_delta(&mut self, record: &PodRecord, sign: i128) {
        let by_priority = self.running.entry(record.namespace.clone()).or_default();
        let names = by_priority.entry(record.priority).or_default();
        if sign > 0 {
            names.insert(record.name.clone());
        } else {
            names.remove(&record.name);
        }
        if names.is_empty() {
            by_priority.remove(&record.priority);
        }
        if by_priority.is_empty() {
            self.running.remove(&record.namespace);
        }
    }

    fn claim_delta(&mut self, record: &PodRecord, node: &Arc<str>, claim: &HeldClaim, sign: i128) {
        let id = (record.namespace.clone(), claim.name.clone());
        let holders = self.claims.entry(id.clone()).or_default();
        let before = holders.values().next().cloned();
        if sign > 0 {
            holders.insert(record.name.clone(), (node.clone(), claim.devices.clone()));
        } else {
            holders.remove(&record.name);
        }
        let after = holders.values().next().cloned();
        if after.is_none() {
            self.claims.remove(&id);
        }
        if before == after {
            return;
        }
        for (counted, sign) in [(before, -1), (after, 1)] {
            let Some((node, devices)) = counted else { continue };
            let load = self.nodes.entry(node.clone()).or_default();
            for (name, q) in devices.iter() {
                add(load, name.clone(), q.nanos(), sign);
            }
            if load.is_empty() {
                self.nodes.remove(&node);
            }
        }
    }
}

impl ClusterView<'_> {
    fn in_play(&self) -> &InPlay {
        &self.inner.by_state.in_play
    }

    fn records<'s>(&'s self, keys: impl Iterator<Item = &'s Key> + 's) -> impl Iterator<Item = &'s PodRecord> {
        keys.filter_map(|k| self.inner.pods.get_key(k))
    }

    /// The pods the gang pass takes in one by one ([`takes_part`]), in no particular order.
    pub fn gang_pass_pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.records(self.in_play().gang_pass_keys())
    }

    /// The pods in the quota queue ([`queued`]), in no particular order.
    pub fn quota_queue_pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.records(self.in_play().quota_queue_keys())
    }

    /// Victims of Allot's preemption still terminating on their nodes, in no particular order.
    pub fn preempted_pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.records(self.in_play().preempted.iter())
    }

    /// The released gang members a disruption is taking ([`PodRecord::disrupts_gang`]), in no
    /// particular order.
    pub fn disrupting_pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.records(self.in_play().disrupting.iter())
    }

    /// The namespaces with a running pod ([`runs`]), in no particular order.
    pub fn running_namespaces(&self) -> impl Iterator<Item = &str> {
        self.in_play().running.keys().map(|ns| &**ns)
    }

    /// The running pods ([`runs`]) of `namespace` whose priority is below `below`, lowest
    /// priority first (in no particular order within one).
    pub fn running_below(&self, namespace: &str, below: i32) -> impl Iterator<Item = &PodRecord> {
        let by_priority = self.in_play().running.get(namespace);
        let names = by_priority.into_iter().flat_map(move |p| p.range(..below)).flat_map(|(_, names)| names);
        names.filter_map(move |name| self.inner.pods.get(namespace, name))
    }

    /// Every pod of a gang the watch has seen (finished ones included), in name order.
    pub fn gang_pods(&self, namespace: &str, gang: &str) -> impl Iterator<Item = &PodRecord> {
        let ns: Arc<str> = Arc::from(namespace);
        let members = self.inner.gangs.get(&(ns.clone(), gang.to_string()));
        members.into_iter().flatten().filter_map(move |m| self.inner.pods.get(&ns, m))
    }

    /// What bound, non-finished pods request on each node the store knows (a shared claim
    /// once), by node name. A node without its Node object (deleted, not watched yet) is left
    /// out: the gang simulation places on known nodes only, and a pass copied these loads for
    /// nothing (5,000 of them in `scripts/scale.sh`, 2.6 MB a pass).
    pub fn node_loads(&self) -> Vec<(String, ResourceList)> {
        let mut loads: Vec<(String, ResourceList)> = self
            .in_play()
            .nodes
            .iter()
            .filter(|(node, _)| self.has_node(node))
            .map(|(node, load)| {
                let list = load.iter().map(|(name, (nanos, _))| (name.to_string(), Quantity::from_nanos(*nanos)));
                (node.to_string(), list.collect())
            })
            .collect();
        loads.sort_by(|a, b| a.0.cmp(&b.0));
        loads
    }

    /// Whether a non-finished pod outside the quota queue holds the shared claim (it is then
    /// counted in its team's usage already).
    pub fn claim_held_outside_queue(&self, namespace: &Arc<str>, claim: &Arc<str>) -> bool {
        self.inner.by_state.claim_held_outside_queue(&(namespace.clone(), claim.clone()))
    }
}
