//! The DRA devices nodes offer, watched for the gang fit: DeviceClasses and ResourceSlices
//! (`resource.k8s.io/v1`) counted by [`crate::model::dra::slices`] into [`Devices::Known`] on the
//! cluster view. Every replica runs it (a new leader decides at once).
//!
//! Only once the Cluster policy maps a DeviceClass: a cluster without DRA pays nothing. While
//! the first lists are not in, the view is [`Devices::Waiting`] and the controller decides
//! nothing (a gang asking claim devices would be judged without them); an API server that does
//! not serve the lists within [`SYNC_WAIT`] (an older cluster, RBAC missing) leaves the view
//! [`Devices::Unknown`]: claim devices are then left out of the fit, said in the log.
//!
//! Each slice is counted once as it arrives, and only its counts are kept (not the object); a
//! change of DeviceClasses restarts the slice watch, so every slice is counted again with the
//! new selectors.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::control::cluster::{ClusterState, Devices};
use crate::model::dra::slices::{DeviceClassMatcher, NodeDevices, SliceDevices, slice_devices};
use crate::model::policy::PolicySet;

/// How long the controller waits for the first DeviceClass and ResourceSlice lists.
pub const SYNC_WAIT: Duration = Duration::from_secs(30);

/// How often counts that changed are published to the view (a burst of slice updates, a
/// driver restarting on every node, becomes one recount).
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// How often a replica whose policies map no DeviceClass looks again (a reload may add one).
const POLICY_RECHECK: Duration = Duration::from_secs(10);

/// Most distinct selector errors logged (they repeat on every device of a kind).
const MAX_LOGGED_ERRORS: usize = 64;

/// Watches DeviceClasses and ResourceSlices into `state` for as long as the process runs.
pub async fn watch(client: kube::Client, state: Arc<ClusterState>, policies: Arc<ArcSwap<PolicySet>>) {
    while policies.load().device_classes.is_empty() {
        tokio::time::sleep(POLICY_RECHECK).await;
    }
    state.set_devices(Devices::Waiting);
    let mut watch = DeviceWatch::default();
    let class_api: Api<DeviceClass> = Api::all(client.clone());
    let slice_api: Api<ResourceSlice> = Api::all(client);
    let mut classes = watcher(class_api, watcher::Config::default()).default_backoff().boxed();
    let mut slices: Option<BoxStream<'static, Result<watcher::Event<ResourceSlice>, watcher::Error>>> = None;
    let give_up = tokio::time::sleep(SYNC_WAIT);
    tokio::pin!(give_up);
    let mut publish = tokio::time::interval(PUBLISH_EVERY);
    publish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = classes.next() => {
                let Some(event) = event else { return };
                if watch.on_class_event(event) {
                    // New selectors: count every slice again, from a new list.
                    slices = Some(
                        watcher(slice_api.clone(), watcher::Config::default()).default_backoff().boxed(),
                    );
                }
            }
            event = next_event(&mut slices) => {
                let Some(event) = event else { return };
                watch.on_slice_event(event);
            }
            _ = &mut give_up, if !watch.published => {
                tracing::warn!(
                    waited = ?SYNC_WAIT,
                    "the DeviceClass/ResourceSlice watches have not listed yet (is resource.k8s.io/v1 served, and may Allot list them?); the gang fit leaves DRA claim devices out until they do"
                );
                state.set_devices(Devices::Unknown);
                // Only once: the wait is over whatever happens next.
                watch.published = true;
            }
            _ = publish.tick() => {
                if let Some(devices) = watch.take_changes() {
                    state.set_devices(Devices::Known(Arc::new(devices)));
                }
            }
        }
    }
}

async fn next_event(
    stream: &mut Option<BoxStream<'static, Result<watcher::Event<ResourceSlice>, watcher::Error>>>,
) -> Option<Result<watcher::Event<ResourceSlice>, watcher::Error>> {
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// What the watch task keeps: the classes (for the matcher), each slice's counts, and whether
/// the counts changed since they were last published.
#[derive(Default)]
struct DeviceWatch {
    classes: BTreeMap<String, DeviceClass>,
    classes_listing: Option<BTreeMap<String, DeviceClass>>,
    classes_listed: bool,
    matcher: Option<Arc<DeviceClassMatcher>>,
    slices: HashMap<String, SliceDevices>,
    slices_listing: Option<HashMap<String, SliceDevices>>,
    slices_listed: bool,
    dirty: bool,
    /// Something (counts, or the wait's end) has been published.
    published: bool,
    logged: BTreeSet<String>,
}

impl DeviceWatch {
    /// Applies a DeviceClass event; true when the selectors changed (the slices must be
    /// counted again).
    fn on_class_event(&mut self, event: Result<watcher::Event<DeviceClass>, watcher::Error>) -> bool {
        match event {
            Ok(watcher::Event::Init) => self.classes_listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(class)) => {
                if let (Some(listing), Some(name)) = (&mut self.classes_listing, class.metadata.name.clone()) {
                    listing.insert(name, class);
                }
            }
            Ok(watcher::Event::InitDone) => {
                self.classes = self.classes_listing.take().unwrap_or_default();
                self.classes_listed = true;
                return self.rebuild_matcher();
            }
            Ok(watcher::Event::Apply(class)) => {
                if let Some(name) = class.metadata.name.clone() {
                    let same = self.classes.get(&name).is_some_and(|old| old.spec == class.spec);
                    self.classes.insert(name, class);
                    return !same && self.classes_listed && self.rebuild_matcher();
                }
            }
            Ok(watcher::Event::Delete(class)) => {
                if let Some(name) = class.metadata.name.as_deref() {
                    return self.classes.remove(name).is_some() && self.classes_listed && self.rebuild_matcher();
                }
            }
            Err(e) => tracing::warn!(error = %e, "DeviceClass watch error; retrying"),
        }
        false
    }

    fn rebuild_matcher(&mut self) -> bool {
        let classes: Vec<DeviceClass> = self.classes.values().cloned().collect();
        let matcher = DeviceClassMatcher::new(&classes);
        for problem in matcher.problems() {
            self.log_once(
                problem,
                "a DeviceClass selector cannot be evaluated; the class takes no device in the gang fit",
            );
        }
        self.matcher = Some(Arc::new(matcher));
        self.slices_listed = false;
        true
    }

    fn on_slice_event(&mut self, event: Result<watcher::Event<ResourceSlice>, watcher::Error>) {
        let Some(matcher) = self.matcher.clone() else { return };
        match event {
            Ok(watcher::Event::Init) => self.slices_listing = Some(HashMap::new()),
            Ok(watcher::Event::InitApply(slice)) => {
                if let Some(name) = slice.metadata.name.clone() {
                    let counted = self.count(&slice, &matcher);
                    if let Some(listing) = &mut self.slices_listing {
                        listing.insert(name, counted);
                    }
                }
            }
            Ok(watcher::Event::InitDone) => {
                self.slices = self.slices_listing.take().unwrap_or_default();
                self.slices_listed = true;
                self.dirty = true;
            }
            Ok(watcher::Event::Apply(slice)) => {
                if let Some(name) = slice.metadata.name.clone() {
                    let counted = self.count(&slice, &matcher);
                    self.dirty |= self.slices.insert(name, counted.clone()).is_none_or(|old| old != counted);
                }
            }
            Ok(watcher::Event::Delete(slice)) => {
                if let Some(name) = slice.metadata.name.as_deref() {
                    self.dirty |= self.slices.remove(name).is_some();
                }
            }
            Err(e) => tracing::warn!(error = %e, "ResourceSlice watch error; retrying"),
        }
    }

    fn count(&mut self, slice: &ResourceSlice, matcher: &DeviceClassMatcher) -> SliceDevices {
        let mut counted = slice_devices(slice, matcher);
        for error in std::mem::take(&mut counted.errors) {
            self.log_once(error, "a DeviceClass selector failed on a device; the device does not count for that class");
        }
        counted
    }

    /// The new counts, if both lists are in and something changed since the last call.
    fn take_changes(&mut self) -> Option<NodeDevices> {
        if !(self.classes_listed && self.slices_listed && self.dirty) {
            return None;
        }
        let matcher = self.matcher.as_ref()?;
        self.dirty = false;
        self.published = true;
        Some(NodeDevices::from_slices(self.slices.values(), matcher))
    }

    fn log_once(&mut self, problem: String, what: &'static str) {
        if self.logged.len() < MAX_LOGGED_ERRORS && self.logged.insert(problem.clone()) {
            tracing::warn!(%problem, "{what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, selector: &str) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": selector}}]}
        }))
        .unwrap()
    }

    fn slice(name: &str, node: &str, devices: usize) -> ResourceSlice {
        let devices: Vec<_> = (0..devices).map(|i| json!({"name": format!("gpu-{i}")})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
        }))
        .unwrap()
    }

    fn gpus_on(devices: &NodeDevices, node: &str) -> u64 {
        devices.per_node.get(node).and_then(|c| c.get("gpu.nvidia.com")).copied().unwrap_or(0)
    }

    #[test]
    fn counts_are_published_once_both_lists_are_in_and_again_only_on_change() {
        let mut w = DeviceWatch::default();
        assert!(!w.on_class_event(Ok(watcher::Event::Init)));
        w.on_class_event(Ok(watcher::Event::InitApply(class("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com'"))));
        assert!(w.on_class_event(Ok(watcher::Event::InitDone)), "the first class list builds the matcher");
        assert_eq!(w.take_changes(), None, "no slice list yet");
        w.on_slice_event(Ok(watcher::Event::Init));
        w.on_slice_event(Ok(watcher::Event::InitApply(slice("a", "node-a", 2))));
        assert_eq!(w.take_changes(), None, "the slice list is not complete");
        w.on_slice_event(Ok(watcher::Event::InitDone));
        let first = w.take_changes().expect("published after both lists");
        assert_eq!(gpus_on(&first, "node-a"), 2);
        assert_eq!(w.take_changes(), None, "nothing changed");
        // The same slice again changes nothing; a new one does.
        w.on_slice_event(Ok(watcher::Event::Apply(slice("a", "node-a", 2))));
        assert_eq!(w.take_changes(), None);
        w.on_slice_event(Ok(watcher::Event::Apply(slice("b", "node-b", 2))));
        let second = w.take_changes().expect("a new slice");
        assert_eq!((gpus_on(&second, "node-a"), gpus_on(&second, "node-b")), (2, 2));
        w.on_slice_event(Ok(watcher::Event::Delete(slice("a", "node-a", 2))));
        assert_eq!(gpus_on(&w.take_changes().expect("a deleted slice"), "node-a"), 0);
    }

    #[test]
    fn a_changed_selector_asks_for_a_recount_and_an_unchanged_one_does_not() {
        let mut w = DeviceWatch::default();
        w.on_class_event(Ok(watcher::Event::Init));
        w.on_class_event(Ok(watcher::Event::InitApply(class("gpu.nvidia.com", "true"))));
        w.on_class_event(Ok(watcher::Event::InitDone));
        assert!(!w.on_class_event(Ok(watcher::Event::Apply(class("gpu.nvidia.com", "true")))), "same spec");
        assert!(w.on_class_event(Ok(watcher::Event::Apply(class("gpu.nvidia.com", "false")))), "new selector");
        assert!(!w.slices_listed, "the slices are counted again from a new list before anything is published");
        assert!(w.on_class_event(Ok(watcher::Event::Delete(class("gpu.nvidia.com", "false")))));
    }
}
