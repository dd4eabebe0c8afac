//! The watches that fill the controller's [`ClusterState`]: Pods (streaming list or paged,
//! after the DRA claim and DeviceClass watches where they matter) and Nodes.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

pub use super::owners::{OWNER_APIS, OwnerApi};
use crate::control::cluster::{ClusterState, PodRecord, WatchedPod, node_info};
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::PolicySet;

/// How the Pod watch fills the cache at start and after a watch is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum InitialList {
    /// A watch that starts with every existing Pod (`sendInitialEvents`, Kubernetes' streaming
    /// list, on by default since 1.32): served from the API server's watch cache one object at
    /// a time, no etcd range reads, no page of whole Pods held at once.
    #[default]
    Streaming,
    /// A paged LIST (500 Pods per page), then a watch: for API servers where streaming lists
    /// are off (the `WatchList` feature gate).
    Paged,
}

/// Called once the Pod watch's first list is in `state` (quota answers wait for it).
pub type OnSynced = Box<dyn Fn() + Send + Sync>;

/// How long the Pod watch waits for the claim watches' first lists before it starts anyway.
const CLAIMS_SYNC_WAIT: Duration = Duration::from_secs(30);

/// With DeviceClasses mapped, the Pod watch starts once the claim caches are filled: a pod
/// recorded before its claims are known would count no claim devices (its team's usage too
/// low until the pod changes). Bounded: a cluster that does not serve `resource.k8s.io/v1`
/// never fills them, and then pods are recorded without their claim devices, said in the log.
async fn wait_for_claims(state: &ClusterState, policies: &PolicySet, within: Duration) {
    if policies.device_classes.is_empty() {
        return;
    }
    let started = tokio::time::Instant::now();
    while !state.claims().synced() {
        if started.elapsed() >= within {
            tracing::warn!(
                waited = ?within,
                "the ResourceClaim/ResourceClaimTemplate watches have not listed yet; recording pods without their claim devices until they do"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where the server reads the cluster's DeviceClasses, the Pod watch starts once the policy set
/// is compiled with them (bounded: the DeviceClass watch gives up after its own wait), so that
/// its first list records claims as they count; otherwise the set's change would list every
/// pod a second time.
async fn wait_for_device_classes(state: &ClusterState, within: Duration) {
    let started = tokio::time::Instant::now();
    while state.device_classes_pending() && started.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) async fn watch_pods(
    client: kube::Client,
    state: Arc<ClusterState>,
    policies: Arc<ArcSwap<PolicySet>>,
    namespaces: Arc<dyn NamespaceLabels>,
    synced: OnSynced,
    initial_list: InitialList,
) {
    wait_for_device_classes(&state, CLAIMS_SYNC_WAIT * 2).await;
    wait_for_claims(&state, &policies.load(), CLAIMS_SYNC_WAIT).await;
    // A relist asked before the first list is answered by that list.
    let _ = futures::FutureExt::now_or_never(state.relist_requested());
    // Decoded slim: only the fields a record reads (managedFields, env, statuses skipped).
    let api: Api<WatchedPod> = Api::all(client);
    let mut strategy = initial_list;
    loop {
        // Each pod of a (re)list goes straight into the store as its compact record, one at a
        // time (streaming) or one page of whole Pods at a time (paged): a (re)list never holds
        // a second copy of the cluster (issue 18).
        let config = match strategy {
            InitialList::Streaming => watcher::Config::default().streaming_lists(),
            InitialList::Paged => watcher::Config::default().page_size(LIST_PAGE_SIZE),
        };
        let mut stream = watcher(api.clone(), config).default_backoff().boxed();
        let mut unsupported = false;
        let mut relist = false;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = state.relist_requested() => {
                    relist = true;
                    break;
                }
            };
            let Some(event) = event else { break };
            let p = policies.load();
            match event {
                Ok(watcher::Event::Init) => state.begin_relist(),
                Ok(watcher::Event::InitApply(WatchedPod(pod)) | watcher::Event::Apply(WatchedPod(pod))) => {
                    if let Some(r) = PodRecord::from_pod_with_claims(&pod, &p, namespaces.as_ref(), state.claims()) {
                        state.upsert_pod(r);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    state.finish_relist();
                    synced();
                }
                Ok(watcher::Event::Delete(WatchedPod(pod))) => {
                    if let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) {
                        state.remove_pod(ns, name);
                    }
                }
                Err(e) if strategy == InitialList::Streaming && streaming_refused(&e) => {
                    tracing::warn!(error = %e, "the API server refuses streaming lists (WatchList off); listing Pods in pages instead");
                    unsupported = true;
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "pod watch error; retrying"),
            }
        }
        if relist {
            continue;
        }
        if !unsupported {
            return;
        }
        strategy = InitialList::Paged;
    }
}

/// The API server's answer to a streaming list it cannot serve: the request is invalid (422;
/// 400 on older versions) where its WatchList feature is off (1.27–1.31, 1.33), and an
/// InternalError naming `RequestWatchProgress` where etcd is too old to report watch progress
/// (etcd 3.4: the test control plane in ../shared/k8s). Paged lists work on every version.
pub fn streaming_refused(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.as_ref(),
        watcher::Error::WatchError(status) => status.as_ref(),
        _ => return false,
    };
    matches!(status.code, 400 | 422) || status.message.contains("RequestWatchProgress")
}

/// Pods per page of a (re)list: one page's objects (slim, see [`WatchedPod`]) and its
/// response body are in memory at once.
const LIST_PAGE_SIZE: u32 = 500;

pub(super) async fn watch_nodes(client: kube::Client, state: Arc<ClusterState>) {
    let api: Api<Node> = Api::all(client);
    let mut buffer = Vec::new();
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => buffer.clear(),
            Ok(watcher::Event::InitApply(node)) => buffer.extend(node_info(&node)),
            Ok(watcher::Event::InitDone) => state.replace_nodes(std::mem::take(&mut buffer)),
            Ok(watcher::Event::Apply(node)) => {
                if let Some(n) = node_info(&node) {
                    state.upsert_node(n);
                }
            }
            Ok(watcher::Event::Delete(node)) => {
                if let Some(name) = node.metadata.name.as_deref() {
                    state.remove_node(name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "node watch error; retrying"),
        }
    }
}

#[cfg(test)]
mod claim_wait_tests {
    use super::*;

    /// Claim watches that finish their first lists at a given time.
    struct SyncedAt(std::time::Instant);

    impl crate::model::dra::ClaimSource for SyncedAt {
        fn template(&self, _: &str, _: &str) -> Option<Arc<serde_json::Value>> {
            None
        }
        fn claim(&self, _: &str, _: &str) -> Option<Arc<serde_json::Value>> {
            None
        }
        fn synced(&self) -> bool {
            std::time::Instant::now() >= self.0
        }
    }

    fn with_claims_in(delay: Duration) -> ClusterState {
        let state = ClusterState::default();
        state.set_claims(Arc::new(SyncedAt(std::time::Instant::now() + delay)));
        state
    }

    /// Where the server reads DeviceClasses, the Pod watch waits until the set in force is
    /// compiled with them (one list, not two), boundedly; elsewhere it does not wait.
    #[tokio::test]
    async fn the_pod_watch_waits_for_the_device_classes_where_the_server_reads_them() {
        let state = Arc::new(ClusterState::default());
        let started = std::time::Instant::now();
        wait_for_device_classes(&state, Duration::from_secs(20)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "not expected: no wait");

        state.expect_device_classes();
        let settler = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            settler.mark_device_classes_settled();
        });
        let started = std::time::Instant::now();
        wait_for_device_classes(&state, Duration::from_secs(20)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(10), "{waited:?}");

        let never = ClusterState::default();
        never.expect_device_classes();
        let started = std::time::Instant::now();
        wait_for_device_classes(&never, Duration::from_millis(200)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(10), "bounded: {waited:?}");
    }

    #[tokio::test]
    async fn the_pod_watch_waits_for_the_claim_watches_when_device_classes_are_mapped() {
        let cluster = "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n";
        let dra = crate::model::policy::compile(&[crate::model::policy::Source {
            name: "c.yaml".into(),
            text: cluster.into(),
        }])
        .expect("policies");
        let none = crate::model::policy::compile(&[]).expect("no policies");

        let started = std::time::Instant::now();
        wait_for_claims(&with_claims_in(Duration::from_millis(300)), &dra, Duration::from_secs(20)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(10), "{waited:?}");

        // Bounded: claim watches that never list hold the Pod watch back no longer than `within`.
        let started = std::time::Instant::now();
        wait_for_claims(&with_claims_in(Duration::from_secs(3600)), &dra, Duration::from_millis(200)).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(10), "{waited:?}");

        // Without DeviceClasses mapped nothing is waited for.
        let started = std::time::Instant::now();
        wait_for_claims(&with_claims_in(Duration::from_secs(3600)), &none, Duration::from_secs(20)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
