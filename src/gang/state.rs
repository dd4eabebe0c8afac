//! What the gang controller keeps of the cluster, and the pure steps around the decision:
//! building a [`Snapshot`] from that state and turning decisions into [`Action`]s.
//!
//! Only what scheduling needs is kept per Pod (a [`PodRecord`] of a few hundred bytes, not the
//! whole object), so 100k Pods stay far under 200 MB. Everything here can be rebuilt from the
//! API at any time: gates, gang labels and the `allot.dev/gang-released` annotation are the
//! only state, and they live on the Pods.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Node, Pod};

use super::decision::{GangKey, Member, Snapshot, Verdict, WaitingGang, decide};
use super::directory::{GangDirectory, Peer};
use super::fit::{NodeInfo, PodShape};
use super::membership::{GATE, InferredKind, OwnerGang, PodFacts, QUOTA_GATE, RELEASED_ANNOTATION, Source};
use crate::namespaces::NamespaceLabels;
use crate::policy::{OnTimeout, PolicySet};
use crate::quantity::Quantity;
use crate::resources::{self, ResourceList};

/// A Pod's gang, as the controller tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangRef {
    pub name: String,
    /// From the Pod's own metadata; inferred gangs get theirs from the owner.
    pub size: Option<u32>,
    /// For inferred gangs: the owner to read the size from.
    pub owner: Option<Owner>,
    /// The leader of a LeaderWorkerSet group.
    pub leader: bool,
}

/// What the controller keeps of one Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRecord {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub node_name: Option<Arc<str>>,
    /// Succeeded, Failed, or being deleted: holds nothing for the future.
    pub finished: bool,
    /// Effective requests (with `pods: 1`), compact: most pods are bound and need nothing else.
    pub requests: Vec<(Arc<str>, Quantity)>,
    /// Where it may go: kept only while the pod is not bound.
    pub placement: Option<Box<PodShape>>,
    pub gang: Option<GangRef>,
    /// Index of Allot's gate in `spec.schedulingGates`, if present.
    pub gate_index: Option<usize>,
    /// Index of Allot's quota gate, if present.
    pub quota_gate_index: Option<usize>,
    /// Gates that are neither of Allot's (Kueue's, Volcano's, …).
    pub other_gates: bool,
    pub released: bool,
    pub has_annotations: bool,
    pub priority: i32,
    pub priority_class: Option<String>,
    pub scheduler_name: Option<String>,
    /// Creation time, seconds since the epoch.
    pub created: i64,
}

/// The shape of a Pod (effective requests + `pods: 1`, selector, required affinity, tolerations).
pub fn shape_of(pod: &Pod) -> PodShape {
    let Some(spec) = pod.spec.as_ref() else { return PodShape::default() };
    let mut requests = serde_json::to_value(spec).map(|v| resources::pod_requests(&v)).unwrap_or_default();
    requests.insert("pods".into(), Quantity::from_units(1));
    PodShape {
        requests,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity: spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|r| r.node_selector_terms.clone()),
        tolerations: spec.tolerations.clone().unwrap_or_default(),
    }
}

impl PodRecord {
    /// Extracts a record; `policies` decide inference and coscheduling sizes (the GangPolicy of
    /// the pod's namespace and team, team from `labels`, as at admission).
    pub fn from_pod(pod: &Pod, policies: &PolicySet, labels: &dyn NamespaceLabels) -> Option<PodRecord> {
        let namespace = pod.metadata.namespace.clone()?;
        let name = pod.metadata.name.clone()?;
        let facts = PodFacts::from_pod(pod);
        let team = crate::namespaces::team_of(policies, &namespace, labels).team;
        let gang = match policies.gang_of(&facts, &namespace, team.map(|t| t.name.as_str())) {
            // Bound and foreign-managed members keep their gang: they count towards its quorum.
            Ok(Some(m)) => Some(GangRef {
                owner: match m.source {
                    Source::Inferred(kind) => owner_of(&facts, kind),
                    _ => None,
                },
                name: m.name,
                size: m.size,
                leader: super::membership::is_group_leader(&facts),
            }),
            _ => None,
        };
        let spec = pod.spec.as_ref();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let shape = shape_of(pod);
        let requests = shape.requests.iter().map(|(k, v)| (intern(k), *v)).collect();
        // A bound pod only takes capacity: where it may go no longer matters.
        let placement = facts.node_name.is_none().then(|| Box::new(shape));
        // Only gang members need what admission compares members on.
        let in_gang = gang.is_some();
        Some(PodRecord {
            node_name: facts.node_name.as_deref().map(intern),
            finished: matches!(phase, Some("Succeeded" | "Failed")) || pod.metadata.deletion_timestamp.is_some(),
            requests,
            placement,
            gate_index: facts.gates.iter().position(|g| g == GATE),
            quota_gate_index: facts.gates.iter().position(|g| g == QUOTA_GATE),
            other_gates: facts.gates.iter().any(|g| g != GATE && g != QUOTA_GATE),
            released: facts.annotations.contains_key(RELEASED_ANNOTATION),
            has_annotations: pod.metadata.annotations.is_some(),
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            priority_class: spec.and_then(|s| s.priority_class_name.clone()).filter(|_| in_gang),
            scheduler_name: spec.and_then(|s| s.scheduler_name.clone()).filter(|_| in_gang),
            created: pod.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
            gang,
            namespace: intern(&namespace),
            name: Arc::from(name),
        })
    }

    /// A gate besides Allot's gang gate (the quota gate included): a member that still has one
    /// is not ready for its gang to be released.
    pub fn foreign_gates(&self) -> bool {
        self.other_gates || self.quota_gate_index.is_some()
    }

    fn key(&self) -> Key {
        (self.namespace.clone(), self.name.clone())
    }

    /// The pod's shape for the simulation (requests only, for a bound pod).
    pub fn shape(&self) -> PodShape {
        match &self.placement {
            Some(p) => (**p).clone(),
            None => PodShape {
                requests: self.requests.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                ..PodShape::default()
            },
        }
    }
}

type Key = (Arc<str>, Arc<str>);

fn key(namespace: &str, name: &str) -> Key {
    (Arc::from(namespace), Arc::from(name))
}

/// Shares the few distinct strings (namespaces, nodes, resource names) among all records.
fn intern(s: &str) -> Arc<str> {
    static TABLE: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<Arc<str>>>> =
        std::sync::LazyLock::new(Default::default);
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = table.get(s) {
        return found.clone();
    }
    let new: Arc<str> = Arc::from(s);
    table.insert(new.clone());
    new
}

/// The object an inferred gang takes its size from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    pub kind: InferredKind,
    /// The owner's Kubernetes kind (`Job`, `JobSet`, `PyTorchJob`, …).
    pub api_kind: String,
    pub name: String,
}

/// The JobSet for JobSet pods (their direct owner is a Job), otherwise the direct owner.
fn owner_of(facts: &PodFacts, kind: InferredKind) -> Option<Owner> {
    if kind == InferredKind::JobSet {
        let name = facts.labels.get("jobset.sigs.k8s.io/jobset-name")?.clone();
        return Some(Owner { kind, api_kind: "JobSet".into(), name });
    }
    if kind == InferredKind::LeaderWorkerSet {
        // Group pods are owned by StatefulSets; the LeaderWorkerSet names itself in a label.
        let name = facts.labels.get(super::membership::LWS_NAME)?.clone();
        return Some(Owner { kind, api_kind: "LeaderWorkerSet".into(), name });
    }
    let (api_kind, name) = facts.owners.first()?.clone();
    Some(Owner { kind, api_kind, name })
}

/// What the controller knows of a Node.
pub fn node_info(node: &Node) -> Option<NodeInfo> {
    let name = node.metadata.name.clone()?;
    let spec = node.spec.as_ref();
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| a.iter().filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.clone(), q))).collect())
        .unwrap_or_default();
    Some(NodeInfo {
        name,
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        allocatable,
    })
}

/// The controller's view of the cluster. Shared with admission (as a [`GangDirectory`]).
#[derive(Debug, Default)]
pub struct ClusterState {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    pods: HashMap<Key, PodRecord>,
    /// (namespace, gang) → member pod names
    gangs: HashMap<(Arc<str>, String), BTreeSet<Arc<str>>>,
    nodes: BTreeMap<String, NodeInfo>,
    /// What the owners of inferred gangs say about them.
    owner_gangs: HashMap<(String, String), OwnerGang>,
    /// Requests of the non-finished pods of each namespace (gated ones included).
    ns_usage: HashMap<Arc<str>, ResourceList>,
    /// Bumped on every change, so the loop knows when to look again.
    generation: u64,
}

impl Inner {
    fn usage_delta(&mut self, record: &PodRecord, sign: i128) {
        if record.finished {
            return;
        }
        let usage = self.ns_usage.entry(record.namespace.clone()).or_default();
        for (name, q) in &record.requests {
            let slot = usage.entry(name.to_string()).or_default();
            *slot = Quantity::from_nanos(slot.nanos() + sign * q.nanos());
        }
    }

    fn unindex(&mut self, key: &Key) {
        let Some(old) = self.pods.remove(key) else { return };
        self.usage_delta(&old, -1);
        if let Some(g) = &old.gang {
            let gk = (old.namespace.clone(), g.name.clone());
            if let Some(set) = self.gangs.get_mut(&gk) {
                set.remove(&old.name);
                if set.is_empty() {
                    self.gangs.remove(&gk);
                }
            }
        }
    }

    fn index(&mut self, record: PodRecord) {
        let key = record.key();
        self.unindex(&key);
        if let Some(g) = &record.gang {
            self.gangs.entry((record.namespace.clone(), g.name.clone())).or_default().insert(record.name.clone());
        }
        self.usage_delta(&record, 1);
        self.pods.insert(key, record);
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

impl ClusterState {
    /// Adds or replaces a Pod.
    pub fn upsert_pod(&self, record: PodRecord) {
        let mut inner = write(&self.inner);
        inner.index(record);
        inner.generation += 1;
    }

    /// Forgets a Pod.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        let mut inner = write(&self.inner);
        inner.unindex(&key(namespace, name));
        inner.generation += 1;
    }

    /// Replaces every Pod (after a watch (re)list).
    pub fn replace_pods(&self, records: Vec<PodRecord>) {
        let mut inner = write(&self.inner);
        inner.pods.clear();
        inner.gangs.clear();
        inner.ns_usage.clear();
        for r in records {
            inner.index(r);
        }
        inner.generation += 1;
    }

    /// Adds or replaces a Node.
    pub fn upsert_node(&self, node: NodeInfo) {
        let mut inner = write(&self.inner);
        inner.nodes.insert(node.name.clone(), node);
        inner.generation += 1;
    }

    /// Forgets a Node.
    pub fn remove_node(&self, name: &str) {
        let mut inner = write(&self.inner);
        inner.nodes.remove(name);
        inner.generation += 1;
    }

    /// Replaces every Node.
    pub fn replace_nodes(&self, nodes: Vec<NodeInfo>) {
        let mut inner = write(&self.inner);
        inner.nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
        inner.generation += 1;
    }

    /// Records what an inferred gang's owner declares.
    pub fn set_owner_gang(&self, namespace: &str, gang: &str, owner: OwnerGang) {
        let mut inner = write(&self.inner);
        let previous = inner.owner_gangs.insert((namespace.to_string(), gang.to_string()), owner.clone());
        if previous.as_ref() != Some(&owner) {
            inner.generation += 1;
        }
    }

    /// Marks members released locally, before the API confirms, so the next pass already counts
    /// their reservation.
    pub fn mark_released(&self, namespace: &str, names: &[String]) {
        let mut inner = write(&self.inner);
        for n in names {
            if let Some(p) = inner.pods.get_mut(&key(namespace, n)) {
                p.gate_index = None;
                p.released = true;
            }
        }
        inner.generation += 1;
    }

    /// Summed requests of the non-finished pods of the namespaces `include` accepts, plus, for
    /// each gang of explicit size there that is not complete yet, what its missing members will
    /// ask (a gang is charged whole). Also returns the namespaces that use anything.
    pub fn usage_where(&self, include: &mut dyn FnMut(&str) -> bool) -> (ResourceList, Vec<String>) {
        let inner = read(&self.inner);
        let mut total = ResourceList::new();
        let mut namespaces = Vec::new();
        let mut accepted: HashMap<&str, bool> = HashMap::new();
        let add = |total: &mut ResourceList, name: &str, nanos: i128| {
            let slot = total.entry(name.to_string()).or_default();
            *slot = Quantity::from_nanos(slot.nanos() + nanos);
        };
        for (ns, usage) in &inner.ns_usage {
            if !*accepted.entry(ns).or_insert_with(|| include(ns)) {
                continue;
            }
            if usage.values().any(|q| q.nanos() != 0) {
                namespaces.push(ns.to_string());
            }
            for (name, q) in usage {
                add(&mut total, name, q.nanos());
            }
        }
        for ((ns, _), members) in &inner.gangs {
            if !*accepted.entry(ns).or_insert_with(|| include(ns)) {
                continue;
            }
            let live: Vec<&PodRecord> = members
                .iter()
                .filter_map(|m| inner.pods.get(&(ns.clone(), m.clone())))
                .filter(|p| !p.finished)
                .collect();
            let Some(first) = live.first() else { continue };
            let Some(size) = first.gang.as_ref().and_then(|g| g.size) else { continue };
            let missing = i128::from(size.saturating_sub(live.len() as u32));
            for (name, q) in &first.requests {
                add(&mut total, name, missing * q.nanos());
            }
        }
        namespaces.sort();
        (total, namespaces)
    }

    /// True when the watch has seen this pod.
    pub fn has_pod(&self, namespace: &str, name: &str) -> bool {
        read(&self.inner).pods.contains_key(&key(namespace, name))
    }

    /// True when some non-finished member of the gang exists.
    pub fn gang_exists(&self, namespace: &str, gang: &str) -> bool {
        let inner = read(&self.inner);
        inner.gangs.get(&(Arc::from(namespace), gang.to_string())).is_some_and(|m| {
            m.iter().any(|n| inner.pods.get(&(Arc::from(namespace), n.clone())).is_some_and(|p| !p.finished))
        })
    }

    /// Marks a pod's quota gate lifted locally, before the watch confirms it.
    pub fn mark_quota_released(&self, namespace: &str, name: &str) {
        let mut inner = write(&self.inner);
        if let Some(p) = inner.pods.get_mut(&key(namespace, name)) {
            p.quota_gate_index = None;
        }
        inner.generation += 1;
    }

    /// A counter that changes whenever the state does.
    pub fn generation(&self) -> u64 {
        read(&self.inner).generation
    }

    /// Counts for logs and metrics: (pods, nodes, gated members).
    pub fn counts(&self) -> (usize, usize, usize) {
        let inner = read(&self.inner);
        (inner.pods.len(), inner.nodes.len(), inner.pods.values().filter(|p| p.gate_index.is_some()).count())
    }

    /// Inferred gangs whose owner size is needed: (namespace, gang, owner).
    pub fn owners_to_resolve(&self) -> Vec<(String, String, Owner)> {
        let inner = read(&self.inner);
        let mut out: Vec<_> = inner
            .pods
            .values()
            .filter(|p| p.gate_index.is_some())
            .filter_map(|p| {
                let g = p.gang.as_ref()?;
                Some((p.namespace.to_string(), g.name.clone(), g.owner.clone()?))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The snapshot the decision runs on, plus what actions need to know of each gang.
    pub fn snapshot(
        &self,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
        now: i64,
    ) -> (Snapshot, HashMap<GangKey, GangFacts>) {
        let inner = read(&self.inner);
        let mut teams = TeamsByNamespace::new(policies, labels);
        let mut bound: HashMap<Arc<str>, ResourceList> = HashMap::new();
        let mut in_flight = Vec::new();
        let mut waiting: BTreeMap<GangKey, WaitingGang> = BTreeMap::new();
        let mut facts: HashMap<GangKey, GangFacts> = HashMap::new();
        for p in inner.pods.values() {
            if p.finished {
                continue;
            }
            if let Some(node) = &p.node_name {
                // Summed per node: 5,000 entries for the simulation, not 100,000.
                let used = bound.entry(node.clone()).or_default();
                for (name, q) in &p.requests {
                    let slot = used.entry(name.to_string()).or_default();
                    *slot = slot.saturating_add(*q);
                }
                continue;
            }
            let Some(g) = &p.gang else { continue };
            let key = GangKey { namespace: p.namespace.to_string(), name: g.name.clone() };
            let gf = facts.entry(key.clone()).or_default();
            if p.gate_index.is_some() && !p.foreign_gates() {
                gf.gated.push(MemberRef {
                    name: p.name.to_string(),
                    gate_index: p.gate_index.unwrap_or(0),
                    has_annotations: p.has_annotations,
                });
                let team = teams.get(&p.namespace).map(|t| t.name.as_str());
                let policy = policies.gang_policy(&p.namespace, team);
                let owner = inner.owner_gangs.get(&(p.namespace.to_string(), g.name.clone()));
                let size = g.size.or_else(|| owner.map(|o| o.size));
                let entry = waiting.entry(key.clone()).or_insert_with(|| WaitingGang {
                    key: key.clone(),
                    expected: size,
                    members: Vec::new(),
                    priority: p.priority,
                    created: p.created,
                    starvation_after: Some(policy.starvation_after.as_secs() as i64),
                });
                entry.members.push(Member { name: p.name.to_string(), shape: p.shape() });
                if g.leader {
                    gf.leader_first_workers =
                        owner.filter(|o| o.leader_first).map(|o| (o.size.saturating_sub(1), worker_requests(o)));
                }
                entry.priority = entry.priority.max(p.priority);
                entry.created = entry.created.min(p.created);
                gf.assembly_timeout = policy.assembly_timeout.as_secs() as i64;
                gf.on_timeout = policy.on_timeout;
            } else if p.gate_index.is_none() && p.released {
                // Released, not yet bound: the reservation ledger.
                in_flight.push(p.shape());
                gf.released += 1;
            }
        }
        // Members already running (released and bound) count towards the quorum of their
        // gang, so a replacement or a member whose release failed can still go.
        for p in inner.pods.values() {
            if !p.finished
                && p.node_name.is_some()
                && p.gate_index.is_none()
                && let Some(g) = &p.gang
                && let Some(gf) = facts.get_mut(&GangKey { namespace: p.namespace.to_string(), name: g.name.clone() })
            {
                gf.released += 1;
            }
        }
        let gangs = waiting
            .into_values()
            .map(|mut g| {
                let gf = facts.get(&g.key);
                let released = gf.map_or(0, |f| f.released);
                // The decision counts gated members; lower the bar by what already runs.
                g.expected = g.expected.map(|n| n.saturating_sub(released));
                // LeaderReady: the leader alone is gated, its workers do not exist yet. It goes
                // when the whole group would fit: its workers are placed as phantoms (names no
                // gated pod has, so only the leader is released).
                if let Some((workers, Some(requests))) = gf.and_then(|f| f.leader_first_workers.clone())
                    && released == 0
                    && g.members.len() == 1
                {
                    let leader = g.members[0].shape.clone();
                    for i in 0..workers {
                        let shape = PodShape { requests: requests.clone(), ..leader.clone() };
                        g.members.push(Member { name: format!("{}/worker-{}-not-created", g.key.name, i + 1), shape });
                    }
                }
                g.members.sort_by(|a, b| a.name.cmp(&b.name));
                g
            })
            .collect();
        let mut bound: Vec<(String, ResourceList)> = bound.into_iter().map(|(n, r)| (n.to_string(), r)).collect();
        bound.sort_by(|a, b| a.0.cmp(&b.0));
        let snapshot = Snapshot {
            now,
            nodes: inner.nodes.values().cloned().collect(),
            bound,
            in_flight,
            gangs,
            accelerators: (*policies.accelerators).clone(),
        };
        (snapshot, facts)
    }
}

impl GangDirectory for ClusterState {
    fn peers(&self, namespace: &str, name: &str) -> Vec<Peer> {
        let inner = read(&self.inner);
        let Some(members) = inner.gangs.get(&(Arc::from(namespace), name.to_string())) else { return Vec::new() };
        members
            .iter()
            .filter_map(|m| inner.pods.get(&(Arc::from(namespace), m.clone())))
            .filter(|p| !p.finished)
            .map(|p| Peer {
                pod: p.name.to_string(),
                size: p.gang.as_ref().and_then(|g| g.size),
                priority_class: p.priority_class.clone(),
                scheduler_name: p.scheduler_name.clone(),
            })
            .collect()
    }
}

impl ClusterState {
    /// Queue-mode quotas: which quota-gated pods to release now. Per team, queued units (a
    /// gang whole, once all its members exist, or a single pod) in order — priority, then age —
    /// while the team's usage (every non-finished pod not behind the quota gate) leaves room. The
    /// order is strict: a unit that does not fit stops the team's queue, so a large job is never
    /// starved by smaller ones behind it.
    ///
    /// Every pod left in the queue gets an explanation (`Action::Queued`) whenever it changes:
    /// `previous` holds the last one per pod (and is updated), so `kubectl describe` says why a
    /// pod waits without an Event on every pass.
    pub fn quota_plan(
        &self,
        policies: &PolicySet,
        labels: &dyn crate::namespaces::NamespaceLabels,
        previous: &mut HashMap<(String, String), String>,
    ) -> Vec<Action> {
        let inner = read(&self.inner);
        let mut actions = Vec::new();
        let mut teams = TeamsByNamespace::new(policies, labels);
        let mut used = admitted_by_team(&inner.requests_by_state(), &mut teams);
        // team → unit key → (priority, created, members, charge)
        type Unit = (i32, i64, Vec<(String, String, usize)>, crate::quota::Charge, Option<u32>);
        let mut queued: HashMap<&str, BTreeMap<String, Unit>> = HashMap::new();
        for p in inner.pods.values().filter(|p| !p.finished) {
            let Some(gate_index) = p.quota_gate_index else { continue };
            let team = teams
                .get(&p.namespace)
                .filter(|t| t.quota.as_ref().is_some_and(|q| q.mode == crate::policy::QuotaMode::Queue));
            let team_and_charge = team.and_then(|team| {
                let quota = team.quota.as_ref()?;
                let requests: ResourceList = p.requests.iter().map(|(k, v)| (k.to_string(), *v)).collect();
                Some((team, quota.charge(&requests))).filter(|(_, charge)| !charge.is_empty())
            });
            let Some((team, charge)) = team_and_charge else {
                // Nothing queues this pod any more (its team left queue mode, or its namespace
                // changed team, since it was gated): a gate nobody would lift goes now.
                actions.push(Action::ReleaseQuota {
                    namespace: p.namespace.to_string(),
                    pod: p.name.to_string(),
                    gate_index,
                });
                continue;
            };
            let (key, size) = match &p.gang {
                Some(g) => (format!("gang/{}/{}", p.namespace, g.name), g.size),
                None => (format!("pod/{}/{}", p.namespace, p.name), None),
            };
            let unit = queued
                .entry(team.name.as_str())
                .or_default()
                .entry(key)
                .or_insert_with(|| (p.priority, p.created, Vec::new(), crate::quota::Charge::new(), size));
            unit.0 = unit.0.max(p.priority);
            unit.1 = unit.1.min(p.created);
            unit.2.push((p.namespace.to_string(), p.name.to_string(), gate_index));
            crate::quota::add(&mut unit.3, &charge);
        }
        for (team_name, units) in queued {
            let Some(quota) = policies.teams.iter().find(|t| t.name == team_name).and_then(|t| t.quota.as_ref()) else {
                continue;
            };
            let mut units: Vec<(String, Unit)> = units.into_iter().collect();
            units.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)).then_with(|| a.0.cmp(&b.0)));
            let team_used = used.entry(team_name).or_default();
            // Set once a unit cannot go: everything behind it waits (strict order).
            let mut blocked_by: Option<String> = None;
            for (position, (_, (_, _, members, charge, size))) in units.into_iter().enumerate() {
                let why = if let Some(first) = &blocked_by {
                    Some(format!("queued behind {position} earlier pod(s) or gang(s) of team {team_name}: {first}"))
                } else if let Some(n) = size.filter(|n| (members.len() as u32) < *n) {
                    // A gang is charged whole: wait for all its members, in order.
                    Some(format!("gang has {}/{n} members; charged whole once all exist", members.len()))
                } else if let Some(exceeded) = quota.exceeded(team_used, &charge) {
                    Some(format!("team {team_name} {exceeded}; this asks {}", exceeded.asked))
                } else {
                    None
                };
                match why {
                    Some(message) => {
                        blocked_by.get_or_insert_with(|| message.clone());
                        for (namespace, pod, _) in members {
                            let key = (namespace, pod);
                            if previous.get(&key) != Some(&message) {
                                previous.insert(key.clone(), message.clone());
                                actions.push(Action::Queued { namespace: key.0, pod: key.1, message: message.clone() });
                            }
                        }
                    }
                    None => {
                        crate::quota::add(team_used, &charge);
                        for (namespace, pod, gate_index) in members {
                            previous.remove(&(namespace.clone(), pod.clone()));
                            actions.push(Action::ReleaseQuota { namespace, pod, gate_index });
                        }
                    }
                }
            }
        }
        // Forget pods that left the queue some other way (deleted, gate removed by hand).
        previous.retain(|(ns, pod), _| inner.pods.get(&key(ns, pod)).is_some_and(|p| p.quota_gate_index.is_some()));
        actions
    }

    /// The per-team accelerator gauges: for every team (`""` for namespaces of no team) and
    /// accelerator resource, what its non-finished pods request, by where they stand; and for
    /// every team with a quota, its limit and what counts against it now (queued pods excluded),
    /// in the quota's own units (GPU-equivalents where weights apply).
    pub fn accelerator_usage(
        &self,
        policies: &PolicySet,
        labels: &dyn crate::namespaces::NamespaceLabels,
    ) -> AcceleratorUsage {
        let inner = read(&self.inner);
        let sums = inner.requests_by_state();
        let mut teams = TeamsByNamespace::new(policies, labels);
        let mut by_state: BTreeMap<(String, String, UsageState), i128> = BTreeMap::new();
        for ((namespace, state, name), nanos) in &sums {
            if policies.accelerators.matches(name) {
                let team_name = teams.get(namespace).map_or("", |t| t.name.as_str());
                let slot = by_state.entry((team_name.to_string(), name.to_string(), *state)).or_default();
                *slot = slot.saturating_add(*nanos);
            }
        }
        let quota_used = admitted_by_team(&sums, &mut teams);
        let in_units = |quota: &crate::quota::Quota, units: i128| units as f64 / quota.denominator as f64 / 1e9;
        let mut quotas = Vec::new();
        for team in &policies.teams {
            let Some(quota) = &team.quota else { continue };
            for (resource, limit) in &quota.limits {
                let used = quota_used.get(team.name.as_str()).and_then(|c| c.get(resource)).copied().unwrap_or(0);
                quotas.push(QuotaGauge {
                    team: team.name.clone(),
                    resource: resource.clone(),
                    used: in_units(quota, used),
                    limit: in_units(quota, *limit),
                });
            }
        }
        let requested = by_state
            .into_iter()
            .map(|((team, resource, state), nanos)| AcceleratorGauge {
                team,
                resource,
                state,
                amount: nanos as f64 / 1e9,
            })
            .collect();
        AcceleratorUsage { requested, quotas }
    }
}

/// The team of each namespace, resolved once per pass (a lookup may clone the namespace's
/// labels and walk every Team's selector).
struct TeamsByNamespace<'p> {
    policies: &'p PolicySet,
    labels: &'p dyn NamespaceLabels,
    cache: HashMap<Arc<str>, Option<&'p crate::policy::Team>>,
}

impl<'p> TeamsByNamespace<'p> {
    fn new(policies: &'p PolicySet, labels: &'p dyn NamespaceLabels) -> Self {
        TeamsByNamespace { policies, labels, cache: HashMap::new() }
    }

    fn get(&mut self, namespace: &Arc<str>) -> Option<&'p crate::policy::Team> {
        let (policies, labels) = (self.policies, self.labels);
        *self
            .cache
            .entry(namespace.clone())
            .or_insert_with(|| crate::namespaces::team_of(policies, namespace, labels).team)
    }
}

impl Inner {
    /// Requests of the non-finished pods, summed per (namespace, state, resource): one pass,
    /// no allocation per pod (names are interned).
    fn requests_by_state(&self) -> HashMap<(Arc<str>, UsageState, Arc<str>), i128> {
        let mut sums: HashMap<(Arc<str>, UsageState, Arc<str>), i128> = HashMap::new();
        for p in self.pods.values().filter(|p| !p.finished) {
            let state = UsageState::of(p);
            for (name, q) in &p.requests {
                let slot = sums.entry((p.namespace.clone(), state, name.clone())).or_default();
                *slot = slot.saturating_add(q.nanos());
            }
        }
        sums
    }
}

/// What counts against each team's quota now: the requests of its pods that are not queued
/// behind the quota gate (teams with a quota only). A quota's charge is linear, so charging
/// these sums equals charging each pod.
fn admitted_by_team<'p>(
    sums: &HashMap<(Arc<str>, UsageState, Arc<str>), i128>,
    teams: &mut TeamsByNamespace<'p>,
) -> HashMap<&'p str, crate::quota::Charge> {
    let mut requests: HashMap<&'p str, (&'p crate::quota::Quota, ResourceList)> = HashMap::new();
    for ((namespace, state, name), nanos) in sums {
        if *state == UsageState::QuotaQueued {
            continue;
        }
        let Some(team) = teams.get(namespace) else { continue };
        let Some(quota) = &team.quota else { continue };
        let slot = requests.entry(team.name.as_str()).or_insert_with(|| (quota, ResourceList::new()));
        let q = slot.1.entry(name.to_string()).or_default();
        *q = Quantity::from_nanos(q.nanos().saturating_add(*nanos));
    }
    requests.into_iter().map(|(team, (quota, requests))| (team, quota.charge(&requests))).collect()
}

/// Where a pod's requests stand, for the per-team gauges.
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
    fn of(p: &PodRecord) -> UsageState {
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

/// Accelerators requested by one team's pods in one state.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceleratorGauge {
    pub team: String,
    pub resource: String,
    pub state: UsageState,
    pub amount: f64,
}

/// One limit of a team's quota and what counts against it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaGauge {
    pub team: String,
    pub resource: String,
    pub used: f64,
    pub limit: f64,
}

/// Everything [`ClusterState::accelerator_usage`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AcceleratorUsage {
    pub requested: Vec<AcceleratorGauge>,
    pub quotas: Vec<QuotaGauge>,
}

/// A gated member, as needed to release it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRef {
    pub name: String,
    pub gate_index: usize,
    pub has_annotations: bool,
}

/// Effective requests (+ `pods: 1`) of a LeaderWorkerSet's worker template.
fn worker_requests(owner: &OwnerGang) -> Option<ResourceList> {
    let spec = owner.worker_template.as_ref()?.get("spec")?;
    let mut requests = resources::pod_requests(spec);
    requests.insert("pods".into(), Quantity::from_units(1));
    Some(requests)
}

/// Per gang: its gated members and what its policy says.
#[derive(Debug, Clone, Default)]
pub struct GangFacts {
    /// LeaderReady groups: how many workers are still to come, and what each will request.
    pub leader_first_workers: Option<(u32, Option<ResourceList>)>,
    pub gated: Vec<MemberRef>,
    /// Members already released (running or about to).
    pub released: u32,
    pub assembly_timeout: i64,
    pub on_timeout: OnTimeout,
}

/// The condition type Allot sets on gang members.
pub const CONDITION: &str = "allot.dev/GangReady";

/// The condition type Allot sets on pods in a team's quota queue (False while queued, True once
/// released).
pub const QUOTA_CONDITION: &str = "allot.dev/QuotaReady";

/// Something the controller does to the API.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Lift Allot's gate (test + remove at `gate_index`) and mark the member released.
    Release { namespace: String, pod: String, gate_index: usize, has_annotations: bool, node: String },
    /// Set the `allot.dev/GangReady` condition and publish an Event, because the explanation
    /// changed.
    Explain { namespace: String, pod: String, ready: bool, reason: &'static str, message: String, warning: bool },
    /// Lift the quota gate (test + remove at `gate_index`): the team has room.
    ReleaseQuota { namespace: String, pod: String, gate_index: usize },
    /// Say why a pod stays in its team's queue (condition + Event), because the reason changed.
    Queued { namespace: String, pod: String, message: String },
    /// Delete a member (assembly timeout with `onTimeout: Fail`).
    Delete { namespace: String, pod: String, reason: String },
}

/// What one pass of the controller decided: the API calls to make, and what the metrics and
/// logs report about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Gangs still waiting, by the reason on their members' condition.
    pub waiting: BTreeMap<&'static str, u64>,
    /// Gangs released in this pass.
    pub released: Vec<ReleasedGang>,
}

/// A gang the plan releases, for its log line and the wait-time histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleasedGang {
    pub gang: GangKey,
    pub members: usize,
    /// Seconds since its oldest member was created.
    pub waited_secs: i64,
    /// The decision, e.g. "4/4 members present; fits: 8 nvidia.com/gpu on 2 nodes".
    pub message: String,
}

/// Turns decisions into actions. `previous` holds the last explanation per gang, so unchanged
/// explanations are not written again (and is updated).
pub fn plan(snapshot: &Snapshot, facts: &HashMap<GangKey, GangFacts>, previous: &mut HashMap<GangKey, String>) -> Plan {
    let mut actions = Vec::new();
    let mut waiting: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut released = Vec::new();
    let decisions = decide(snapshot);
    let created: HashMap<&GangKey, i64> = snapshot.gangs.iter().map(|g| (&g.key, g.created)).collect();
    for d in decisions {
        let Some(gf) = facts.get(&d.gang) else { continue };
        let ns = d.gang.namespace.clone();
        let (reason, ready, warning, mut message) = match &d.verdict {
            Verdict::Release { placements } => {
                for (pod, node) in placements {
                    if let Some(m) = gf.gated.iter().find(|m| &m.name == pod) {
                        actions.push(Action::Release {
                            namespace: ns.clone(),
                            pod: pod.clone(),
                            gate_index: m.gate_index,
                            has_annotations: m.has_annotations,
                            node: node.clone(),
                        });
                    }
                }
                released.push(ReleasedGang {
                    gang: d.gang.clone(),
                    members: placements.len(),
                    waited_secs: created.get(&d.gang).map_or(0, |c| (snapshot.now - c).max(0)),
                    message: d.message.clone(),
                });
                ("Released", true, false, d.message.clone())
            }
            Verdict::Incomplete => ("WaitingForMembers", false, false, d.message.clone()),
            Verdict::DoesNotFit => ("InsufficientResources", false, false, d.message.clone()),
            Verdict::Blocked { .. } => ("WaitingForHigherPriority", false, false, d.message.clone()),
        };
        let mut reason = reason;
        let mut warning = warning;
        if d.verdict == Verdict::Incomplete
            && gf.assembly_timeout > 0
            && created.get(&d.gang).is_some_and(|c| snapshot.now - c >= gf.assembly_timeout)
        {
            reason = "AssemblyTimeout";
            warning = true;
            message = format!("{message}; not assembled within {}s", gf.assembly_timeout);
            if gf.on_timeout == OnTimeout::Fail {
                message.push_str("; deleting the members (bare pods are not recreated)");
                for m in &gf.gated {
                    actions.push(Action::Delete {
                        namespace: ns.clone(),
                        pod: m.name.clone(),
                        reason: message.clone(),
                    });
                }
            }
        }
        if !ready {
            *waiting.entry(reason).or_default() += 1;
        }
        let changed = previous.get(&d.gang) != Some(&message);
        if changed {
            previous.insert(d.gang.clone(), message.clone());
            for m in &gf.gated {
                actions.push(Action::Explain {
                    namespace: ns.clone(),
                    pod: m.name.clone(),
                    ready,
                    reason,
                    message: message.clone(),
                    warning,
                });
            }
        }
    }
    // Forget explanations of gangs that are gone.
    previous.retain(|k, _| facts.contains_key(k));
    Plan { actions, waiting, released }
}
