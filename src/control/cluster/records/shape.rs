//! Where a Pod may be scheduled and what it asks: its [`PodShape`] (effective requests,
//! selector, required affinity, tolerations) and the [`Placement`] an unbound gang member
//! shares with every pod of its template.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Pod, Toleration};

use crate::model::gang::bounds::{self, PlacementExcess};
use crate::model::quantity::Quantity;
use crate::model::resources::{self, ResourceList};

/// The scheduling-relevant part of a Pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodShape {
    /// Effective requests, `pods: 1` included.
    pub requests: ResourceList,
    /// Where it may go: shared with the record it was made from (and every pod of its
    /// template), not copied. A gang pass makes a shape for every waiting member, and with a
    /// thousand gangs waiting the copied selectors and tolerations were its largest allocation
    /// (issue 49), which the allocator then kept.
    pub placement: Arc<Placement>,
}

impl PodShape {
    /// A shape asking `requests`, placed by `placement`.
    pub fn new(requests: ResourceList, placement: Placement) -> PodShape {
        PodShape { requests, placement: Arc::new(placement) }
    }

    pub fn node_selector(&self) -> &BTreeMap<String, String> {
        &self.placement.node_selector
    }

    /// Required node-affinity terms (ORed); `None` = no affinity.
    pub fn affinity(&self) -> Option<&[NodeSelectorTerm]> {
        self.placement.affinity.as_deref()
    }

    pub fn tolerations(&self) -> &[Toleration] {
        &self.placement.tolerations
    }

    /// Its placement to change (a copy of its own if it was shared).
    pub fn placement_mut(&mut self) -> &mut Placement {
        Arc::make_mut(&mut self.placement)
    }

    /// A stable key for pods that land on the same nodes (same selector, affinity, tolerations):
    /// feasibility is computed once per key.
    pub fn placement_key(&self) -> String {
        format!(
            "{}|{}|{}",
            serde_json::to_string(self.node_selector()).unwrap_or_default(),
            serde_json::to_string(&self.affinity()).unwrap_or_default(),
            serde_json::to_string(self.tolerations()).unwrap_or_default()
        )
    }

    /// Where this shape may go, for messages (`node-type=my-precious`, `any node`).
    pub fn describe_nodes(&self) -> String {
        let mut parts: Vec<String> = self.node_selector().iter().map(|(k, v)| format!("{k}={v}")).collect();
        if self.affinity().is_some() {
            parts.push("required node affinity".into());
        }
        if parts.is_empty() { "any node".into() } else { format!("nodes matching {}", parts.join(",")) }
    }
}

/// Where an unbound gang member may go (selector, required affinity, tolerations): the same for
/// every pod of one template, so records share one copy ([`Placement::interned`]). Kept only for
/// the pods whose decisions read it ([`PodRecord::placement`]), and only within
/// [`crate::model::gang::bounds`]: a placement over them is not kept, `excess` says which bound it
/// passed (the three fields then empty), and the gang controller never places such a member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    pub affinity: Option<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
    /// The placement was over a bound and is not kept: which one.
    pub excess: Option<PlacementExcess>,
}

impl Placement {
    /// The placement of a pod's spec, or the marker of one over the bounds (measured before
    /// anything is copied).
    pub(super) fn bounded(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Placement {
        let Some(spec) = spec else { return Placement::default() };
        let (node_selector, affinity, tolerations) = placement_fields(spec);
        let empty = BTreeMap::new();
        match bounds::excess(node_selector.unwrap_or(&empty), affinity, tolerations) {
            None => Placement {
                node_selector: node_selector.cloned().unwrap_or_default(),
                affinity: affinity.map(<[NodeSelectorTerm]>::to_vec),
                tolerations: tolerations.to_vec(),
                excess: None,
            },
            excess => Placement { excess, ..Placement::default() },
        }
    }

    /// The one shared copy of `self` (a weak table: placements no record holds any more are
    /// dropped as the table grows). Keyed by a hash of the serialized fields (written into the
    /// hasher, never into a string: the key costs 8 bytes, not a second copy of the placement);
    /// a hash that collides with another live placement only goes unshared.
    pub(super) fn interned(self) -> Arc<Placement> {
        type Table = HashMap<u64, Weak<Placement>>;
        static TABLE: LazyLock<Mutex<(Table, usize, std::hash::RandomState)>> = LazyLock::new(Default::default);
        let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        let (table, sweep_at, state) = &mut *guard;
        let key = self.fingerprint(state);
        if let Some(found) = table.get(&key).and_then(Weak::upgrade)
            && *found == self
        {
            return found;
        }
        let new = Arc::new(self);
        table.insert(key, Arc::downgrade(&new));
        if table.len() > (*sweep_at).max(64) {
            table.retain(|_, w| w.strong_count() > 0);
            *sweep_at = table.len() * 2;
        }
        new
    }

    /// A keyed hash of the fields as JSON, and of the marker.
    fn fingerprint(&self, state: &std::hash::RandomState) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        struct Hashing<H>(H);
        impl<H: Hasher> std::io::Write for Hashing<H> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.write(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut hashing = Hashing(state.build_hasher());
        // Writing into a hasher cannot fail; a field that would not serialize only hashes less.
        let _ = serde_json::to_writer(&mut hashing, &(&self.node_selector, &self.affinity, &self.tolerations));
        self.excess.hash(&mut hashing.0);
        hashing.0.finish()
    }

    /// About what one copy holds on the heap (the lists and their strings): what the view pays
    /// for each distinct placement it keeps.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        let selector =
            self.node_selector.iter().map(|(k, v)| size_of::<(String, String)>() + k.capacity() + v.capacity());
        let tolerations = self
            .tolerations
            .iter()
            .map(|t| size_of::<Toleration>() + text(&t.key) + text(&t.operator) + text(&t.value) + text(&t.effect));
        let requirements = self
            .affinity
            .iter()
            .flatten()
            .flat_map(|t| t.match_expressions.iter().flatten().chain(t.match_fields.iter().flatten()));
        let affinity = requirements.map(|r| {
            std::mem::size_of_val(r)
                + r.key.capacity()
                + r.operator.capacity()
                + r.values.iter().flatten().map(|v| size_of::<String>() + v.capacity()).sum::<usize>()
        });
        let terms = self.affinity.as_ref().map_or(0, |t| t.capacity() * size_of::<NodeSelectorTerm>());
        selector.sum::<usize>() + tolerations.sum::<usize>() + affinity.sum::<usize>() + terms
    }
}

/// The shape of a Pod (effective requests + `pods: 1`, selector, required affinity, tolerations).
pub fn shape_of(pod: &Pod) -> PodShape {
    let Some(spec) = pod.spec.as_ref() else { return PodShape::default() };
    let (node_selector, affinity, tolerations) = placement_fields(spec);
    let placement = Placement {
        node_selector: node_selector.cloned().unwrap_or_default(),
        affinity: affinity.map(<[NodeSelectorTerm]>::to_vec),
        tolerations: tolerations.to_vec(),
        excess: None,
    };
    PodShape::new(requests_of(spec), placement)
}

/// A spec's nodeSelector, required node-affinity terms and tolerations, borrowed.
type PlacementFields<'a> = (Option<&'a BTreeMap<String, String>>, Option<&'a [NodeSelectorTerm]>, &'a [Toleration]);

/// The [`PlacementFields`] of a spec.
pub(super) fn placement_fields(spec: &k8s_openapi::api::core::v1::PodSpec) -> PlacementFields<'_> {
    let affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.as_slice());
    (spec.node_selector.as_ref(), affinity, spec.tolerations.as_deref().unwrap_or_default())
}

/// Effective requests of a spec, with `pods: 1`.
pub(super) fn requests_of(spec: &k8s_openapi::api::core::v1::PodSpec) -> ResourceList {
    // Only the fields the scheduler's formula reads, not the whole spec (env, volumes, probes):
    // this runs for every pod on every watch event and relist.
    let container = |c: &k8s_openapi::api::core::v1::Container| serde_json::json!({"resources": c.resources, "restartPolicy": c.restart_policy});
    let formula_fields = serde_json::json!({
        "containers": spec.containers.iter().map(container).collect::<Vec<_>>(),
        "initContainers": spec.init_containers.iter().flatten().map(container).collect::<Vec<_>>(),
        "overhead": spec.overhead,
        "resources": spec.resources,
    });
    let mut requests = resources::pod_requests(&formula_fields);
    requests.insert("pods".into(), Quantity::from_units(1));
    requests
}
