//! A relist applied pod by pod (after a lost watch): until it finishes the view is partial,
//! and the records it did not see again are dropped at its end.

use super::*;

impl ClusterState {
    /// A (re)list of Pods begins: its pods are applied one by one as they come
    /// ([`ClusterState::upsert_pod`]), so the view never holds the old set and the new one at
    /// once; [`ClusterState::finish_relist`] then drops what the list did not contain.
    pub fn begin_relist(&self) {
        let mut inner = write(&self.inner);
        inner.relist = inner.relist.wrapping_add(1);
        inner.relisting = true;
    }

    /// True while a (re)list is applied pod by pod: decisions (gate lifts, queue order, ledger
    /// releases) wait for its end, which wakes them ([`ClusterState::changed`]).
    pub fn relisting(&self) -> bool {
        read(&self.inner).relisting
    }

    /// The view is whole enough to decide gates on: Pods and Nodes have each been listed once
    /// and no relist is half applied. Until then a gang may look incomplete and every node
    /// absent; whatever a pass wrote then (an "InsufficientResources, 0 free" explanation)
    /// would be wrong. Where DRA devices are watched, their first lists must be in too, or a
    /// gang asking claim devices would be judged without them.
    pub fn complete(&self) -> bool {
        let inner = read(&self.inner);
        inner.pods_listed && inner.nodes_listed && !inner.relisting && !matches!(inner.devices, Devices::Waiting)
    }

    /// The (re)list is complete: forgets the pods it did not contain (deleted while the watch
    /// was down). They are not remembered as removed: nobody saw them go.
    pub fn finish_relist(&self) {
        let mut inner = write(&self.inner);
        let current = inner.relist;
        let gone: Vec<Key> = inner.pods.values().filter(|p| p.relist != current).map(PodRecord::key).collect();
        for key in &gone {
            let emptied = inner.unindex(key);
            inner.forget_owner_if_gone(emptied);
            inner.conditions_in_flight.remove(key);
            inner.deleting.remove(key);
        }
        inner.pods.shrink_to_fit();
        inner.relisting = false;
        inner.pods_listed = true;
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Replaces every Pod at once (tests and tools; the watch uses
    /// [`ClusterState::begin_relist`]).
    pub fn replace_pods(&self, records: Vec<PodRecord>) {
        let mut inner = write(&self.inner);
        // A relist keeps what was seen of the pods that are still there.
        let arrivals: HashMap<Key, i64> = inner
            .pods
            .values()
            .filter_map(|p| p.arrival.filter(|_| !p.arrival_stamped).map(|a| (p.key(), a)))
            .collect();
        let records = records.into_iter().map(|mut r| {
            if r.arrival.is_none() {
                r.arrival = arrivals.get(&r.key()).copied();
            }
            r
        });
        inner.pods.clear();
        inner.gangs.clear();
        inner.ns_usage.clear();
        inner.tallies.clear();
        inner.claim_holders.clear();
        inner.claim_pods.clear();
        inner.by_state = Default::default();
        inner.gang_gated = 0;
        inner.quota_gated = 0;
        inner.awaiting_bind = 0;
        inner.told_late = 0;
        inner.disrupted = 0;
        for r in records {
            inner.index(r);
        }
        let Inner { pods, conditions_in_flight, deleting, gangs, owner_gangs, owner_lookups, .. } = &mut *inner;
        conditions_in_flight.retain(|k, _| pods.contains(&k.0, &k.1));
        deleting.retain(|k, _| pods.contains(&k.0, &k.1));
        let alive =
            |(namespace, gang): &(String, String)| gangs.contains_key(&(Arc::from(namespace.as_str()), gang.clone()));
        owner_gangs.retain(|k, _| alive(k));
        owner_lookups.retain(|k, _| alive(k));
        inner.pods_listed = true;
        inner.generation += 1;
        self.wake.notify_one();
    }
}
