//! The cluster's DeviceClasses, read for what the policy set counts without the Cluster policy
//! mapping it: a class whose `spec.extendedResourceName` is an accelerator resource
//! (DRAExtendedResource: `gpu.nvidia.com` standing for `nvidia.com/gpu`) counts as one of it per
//! device ([`crate::model::policy::compile_with`]).
//!
//! A change of those names is stored in [`AppState::cluster_facts`] and wakes the reloader, which
//! compiles the set again and swaps it in (the reloader alone compiles, so a file reload and a
//! class change never race). Until the first list is in, deny-mode quota fails closed (the
//! [`super::startup::Caches::device_classes`] cache): a claim of a class not yet read would count
//! nothing. Where discovery shows no `resource.k8s.io/v1` DeviceClasses there is nothing to wait
//! for; a list that does not come (RBAC that does not allow it) is waited for at most
//! [`SYNC_WAIT`], then said in the log.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use super::AppState;
use crate::model::policy::ClusterFacts;

/// How long quota waits for the first DeviceClass list before it answers without it.
pub const SYNC_WAIT: Duration = Duration::from_secs(30);

/// Stores `facts` and wakes the reloader when they differ from those stored.
fn publish(state: &AppState, facts: ClusterFacts) {
    if **state.cluster_facts.load() != facts {
        tracing::info!(classes = ?facts.extended_resource_names, "DeviceClasses with an extended resource changed; recompiling the policies");
        state.cluster_facts.store(Arc::new(facts));
        state.facts_changed.notify_one();
    }
}

/// The first list is in (or will not come): the reloader marks the cache synced once a set
/// compiled with the facts stored before is in force.
fn listed_now(state: &AppState) {
    state.facts_listed.store(true, Ordering::Release);
    state.facts_changed.notify_one();
}

/// False when discovery says the API server does not serve DeviceClasses (before 1.34, or DRA
/// off): nothing to wait for. Unknown (discovery failed otherwise) counts as served: the watch
/// then waits at most [`SYNC_WAIT`].
async fn served(client: &kube::Client) -> bool {
    match client.list_api_group_resources("resource.k8s.io/v1").await {
        Ok(list) => list.resources.iter().any(|r| r.name == "deviceclasses"),
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(_) => true,
    }
}

/// Watches DeviceClasses for as long as the process runs.
pub fn watch(client: kube::Client, state: Arc<AppState>) {
    state.caches.device_classes.expect();
    state.cluster.expect_device_classes();
    tokio::spawn(async move {
        if !served(&client).await {
            tracing::info!(
                "resource.k8s.io/v1 DeviceClasses are not served: DRA classes count only as the Cluster policy maps them"
            );
            listed_now(&state);
            return;
        }
        let (reader, writer) = reflector::store::<DeviceClass>();
        let api: kube::Api<DeviceClass> = kube::Api::all(client);
        let mut events = reflector(writer, watcher(api, watcher::Config::default())).default_backoff().boxed();
        let give_up = tokio::time::sleep(SYNC_WAIT);
        tokio::pin!(give_up);
        let mut listed = false;
        loop {
            tokio::select! {
                event = events.next() => match event {
                    None => return,
                    Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
                    Some(Ok(_)) => {
                        let first = !listed;
                        listed = true;
                        // Facts first, then "listed" (the reloader reads them the other way).
                        publish(&state, ClusterFacts::from_device_classes(reader.state().iter().map(|c| c.as_ref())));
                        if first {
                            listed_now(&state);
                        }
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "DeviceClass watch error; retrying"),
                },
                _ = &mut give_up, if !listed => {
                    tracing::warn!(waited = ?SYNC_WAIT, "the DeviceClass watch has not listed yet (is resource.k8s.io/v1 served, and may Allot list DeviceClasses?); DRA classes are counted only as the Cluster policy maps them until it does");
                    listed = true;
                    listed_now(&state);
                }
            }
        }
    });
}
