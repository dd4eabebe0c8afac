//! The store's pods, by namespace and then by name: a namespace's pods are found without a walk
//! over every pod, a lookup by name allocates nothing, and a pod's slot holds no second copy of
//! its namespace.

use super::*;

/// Boxed records: a table then holds 24 bytes a pod, so growing one (doubling, with the old
/// table alive while it moves) costs little next to the records.
#[derive(Debug, Default)]
pub(super) struct PodTable {
    namespaces: HashMap<Arc<str>, HashMap<Arc<str>, Box<PodRecord>>>,
    len: usize,
}

impl PodTable {
    pub(super) fn get(&self, namespace: &str, name: &str) -> Option<&PodRecord> {
        self.namespaces.get(namespace)?.get(name).map(|p| &**p)
    }

    pub(super) fn get_key(&self, key: &Key) -> Option<&PodRecord> {
        self.get(&key.0, &key.1)
    }

    pub(super) fn get_mut(&mut self, namespace: &str, name: &str) -> Option<&mut PodRecord> {
        self.namespaces.get_mut(namespace)?.get_mut(name).map(|p| &mut **p)
    }

    pub(super) fn contains(&self, namespace: &str, name: &str) -> bool {
        self.get(namespace, name).is_some()
    }

    /// Adds or replaces the record of its pod.
    pub(super) fn insert(&mut self, record: Box<PodRecord>) {
        let pods = self.namespaces.entry(record.namespace.clone()).or_default();
        if pods.insert(record.name.clone(), record).is_none() {
            self.len += 1;
        }
    }

    /// Takes the pod's record out; a namespace's table goes with its last pod.
    pub(super) fn remove(&mut self, namespace: &str, name: &str) -> Option<Box<PodRecord>> {
        let pods = self.namespaces.get_mut(namespace)?;
        let record = pods.remove(name)?;
        self.len -= 1;
        if pods.is_empty() {
            self.namespaces.remove(namespace);
        }
        Some(record)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Every record, in no particular order.
    pub(super) fn values(&self) -> impl Iterator<Item = &PodRecord> {
        self.namespaces.values().flat_map(|pods| pods.values().map(|p| &**p))
    }

    /// The records of one namespace.
    pub(super) fn in_namespace(&self, namespace: &str) -> impl Iterator<Item = &PodRecord> {
        self.namespaces.get(namespace).into_iter().flat_map(|pods| pods.values().map(|p| &**p))
    }

    /// The namespaces with a pod.
    pub(super) fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.keys().map(|ns| &**ns)
    }

    pub(super) fn clear(&mut self) {
        self.namespaces.clear();
        self.len = 0;
    }

    pub(super) fn shrink_to_fit(&mut self) {
        self.namespaces.shrink_to_fit();
        self.namespaces.values_mut().for_each(HashMap::shrink_to_fit);
    }
}

impl ClusterView<'_> {
    /// Every Pod the watch has seen (finished ones included), in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.inner.pods.values()
    }

    /// One Pod, if the watch has seen it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodRecord> {
        self.inner.pods.get(namespace, name)
    }

    /// The Pods of one namespace (finished ones included): O(its pods).
    pub fn pods_in(&self, namespace: &str) -> impl Iterator<Item = &PodRecord> {
        self.inner.pods.in_namespace(namespace)
    }

    /// The namespaces with a Pod the watch has seen.
    pub fn pod_namespaces(&self) -> impl Iterator<Item = &str> {
        self.inner.pods.namespaces()
    }
}
