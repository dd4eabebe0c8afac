//! Native PodGroups (`scheduling.k8s.io/v1alpha2`, Kubernetes' own gang scheduling, alpha in
//! 1.36) as `allot serve` sees them: whether the cluster serves them (discovery, asked again
//! every [`REDISCOVERY`], since the API can be switched off under a running Allot), and a watch
//! of them once it does. Each PodGroup seen sets its members' quota-group size in the cluster
//! view ([`ClusterState::set_native_group_size`]), whether it came before or after its pods.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::control::cluster::ClusterState;
use crate::model::gang::membership::gang_min_count;

use crate::control::gang::hand_off::{POD_GROUP_API as API, pod_group_resource as resource, serves_pod_groups};

/// How often discovery is asked again.
const REDISCOVERY: Duration = Duration::from_secs(30);

/// The cluster's native PodGroups, as far as Allot knows them.
#[derive(Default)]
pub struct PodGroups {
    /// Discovery's last answer: the API is served.
    served: AtomicBool,
    /// The watch, started the first time discovery says the API is served.
    store: std::sync::OnceLock<Store<DynamicObject>>,
}

impl PodGroups {
    /// True while the cluster serves PodGroups (discovery's last answer): only then does a
    /// Pod's `spec.schedulingGroup` survive CREATE.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    /// PodGroup `name` in `namespace`, reduced to what Allot reads (its scheduling policy): not
    /// a copy of a tenant-written object per lookup.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        let found = self.store.get()?.get(&ObjectRef::new_with(name, resource()).within(namespace))?;
        Some(json!({"spec": {"schedulingPolicy": found.data.pointer("/spec/schedulingPolicy")}}))
    }
}

/// Whether the cluster serves native PodGroups ([`serves_pod_groups`]), asked until the API
/// server answers.
async fn discover(client: &kube::Client) -> bool {
    let mut delay = Duration::from_millis(500);
    loop {
        match serves_pod_groups(client).await {
            Ok(served) => return served,
            Err(e) => {
                tracing::warn!(error = %e, api = API, "discovery failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Starts discovery (now and every [`REDISCOVERY`]) and, once the API is served, the PodGroup
/// watch, which sizes the native groups of `cluster`.
pub fn watch(client: kube::Client, cluster: Arc<ClusterState>) -> Arc<PodGroups> {
    let groups = Arc::new(PodGroups::default());
    let state = groups.clone();
    tokio::spawn(async move {
        loop {
            let served = discover(&client).await;
            if served != state.served.swap(served, Ordering::AcqRel) {
                // Served: a pod naming a PodGroup is left to the scheduler's gangs; not served:
                // such a pod is gated like any gang member (the API server drops the field).
                tracing::info!(api = API, served, "native PodGroups: served changed");
            }
            if served && state.store.get().is_none() {
                let _ = state.store.set(spawn_watch(client.clone(), cluster.clone()));
            }
            tokio::time::sleep(REDISCOVERY).await;
        }
    });
    groups
}

fn spawn_watch(client: kube::Client, cluster: Arc<ClusterState>) -> Store<DynamicObject> {
    let api = kube::Api::<DynamicObject>::all_with(client, &resource());
    let writer = reflector::store::Writer::new(resource());
    let reader = writer.as_reader();
    let events = reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        events
            .for_each(|event| {
                let cluster = cluster.clone();
                async move {
                    let (group, present) = match event {
                        Ok(watcher::Event::Apply(g) | watcher::Event::InitApply(g)) => (g, true),
                        Ok(watcher::Event::Delete(g)) => (g, false),
                        Ok(_) => return,
                        Err(e) => return tracing::warn!(error = %e, watch = "PodGroup", "watch error"),
                    };
                    let (Some(namespace), Some(name)) =
                        (group.metadata.namespace.as_deref(), group.metadata.name.as_deref())
                    else {
                        return;
                    };
                    let size = present.then(|| gang_min_count(&group.data)).flatten();
                    cluster.set_native_group_size(namespace, name, size);
                }
            })
            .await;
    });
    reader
}
