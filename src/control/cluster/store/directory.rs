//! The store as admission's [`GangDirectory`]: a gang's peers, a node, the pods naming a claim.

use super::*;

impl GangDirectory for ClusterState {
    fn peers(&self, namespace: &str, name: &str) -> Vec<Peer> {
        let inner = read(&self.inner);
        let Some(members) = inner.gangs.get(&(Arc::from(namespace), name.to_string())) else { return Vec::new() };
        members
            .iter()
            .filter_map(|m| inner.pods.get(namespace, m))
            .filter(|p| p.present())
            .filter_map(|p| {
                let g = p.gang.as_ref()?;
                Some(Peer {
                    pod: p.name.to_string(),
                    size: g.size,
                    priority_class: g.priority_class.as_deref().map(str::to_string),
                    scheduler_name: g.scheduler_name.as_deref().map(str::to_string),
                })
            })
            .collect()
    }

    fn node(&self, name: &str) -> NodeLookup {
        let inner = read(&self.inner);
        match inner.nodes.get(name) {
            Some(n) => NodeLookup::Taints(n.taints.clone()),
            None if inner.nodes_listed => NodeLookup::Unknown,
            None => NodeLookup::NotWatched,
        }
    }

    /// From the index kept with the usage: O(pods naming the claim), in name order.
    fn pods_naming_claim(&self, namespace: &str, claim: &str) -> Vec<String> {
        let inner = read(&self.inner);
        let id: ClaimId = (Arc::from(namespace), Arc::from(claim));
        inner.claim_pods.get(&id).map(|pods| pods.keys().map(|p| p.to_string()).collect()).unwrap_or_default()
    }
}
