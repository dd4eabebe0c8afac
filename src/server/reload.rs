//! Hot reload of policies and the serving certificate, and the Namespace watch.
//!
//! File events (notify) trigger a reload quickly; a periodic poll backs them up (some volume
//! types and editors do not produce the events one expects). Each reload reads the files, skips
//! work when their content hash has not changed, and swaps the new state in whole. A broken
//! policy file never replaces the set in force: the error is logged, counted, and shown on
//! `/readyz` until fixed.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use kube::runtime::watcher;

use notify::{RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::metrics::ResultLabels;
use super::{AppState, ServeConfig, tls};
use crate::model::namespaces::{Labels, NamespaceLabels};
use crate::model::policy;

/// Starts the reload task.
pub fn spawn(
    state: Arc<AppState>,
    rustls: axum_server::tls_rustls::RustlsConfig,
    config: ServeConfig,
    cert_baseline: Option<Vec<u8>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (tx, mut rx) = mpsc::channel::<()>(1);
        // Keep the watcher alive for the task's lifetime.
        let _watcher = start_watcher(&config, tx);
        let mut poll = tokio::time::interval(config.reload_interval);
        poll.tick().await;
        let mut reloader = Reloader::new(&state, &config, cert_baseline);
        loop {
            tokio::select! {
                Some(()) = rx.recv() => {
                    // Let a burst of events (a ConfigMap swap is several) settle.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    while rx.try_recv().is_ok() {}
                }
                _ = poll.tick() => {}
                // The cluster's DeviceClasses changed (see `super::device_classes`).
                _ = state.facts_changed.notified() => {}
            }
            reloader.reload_policies(&state);
            reloader.reload_certificates(&state, &rustls);
        }
    })
}

fn start_watcher(config: &ServeConfig, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    let mut watcher = match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = tx.try_send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "file watching unavailable; relying on the periodic poll");
            return None;
        }
    };
    let mut watch = |path: &Path, mode| {
        if let Err(e) = watcher.watch(path, mode) {
            tracing::warn!(path = %path.display(), error = %e, "cannot watch; relying on the periodic poll");
        }
    };
    watch(&config.policies, RecursiveMode::Recursive);
    for file in [&config.tls_cert, &config.tls_key].into_iter().chain(config.client_ca.as_ref()) {
        // Watch the directory: Secret volumes replace files through symlink swaps.
        let dir = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        watch(dir, RecursiveMode::NonRecursive);
    }
    Some(watcher)
}

struct Reloader {
    policies_dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    /// Version of the sources last tried (good or bad), and the cluster facts they were
    /// compiled with: unchanged inputs are not recompiled.
    last_policy_version: String,
    last_facts: policy::ClusterFacts,
    last_cert_hash: Option<Vec<u8>>,
}

impl Reloader {
    /// `cert_baseline`: the hash of the certificate files taken when the pair in force was
    /// loaded (not now: a rotation since then must count as a change).
    fn new(state: &AppState, config: &ServeConfig, cert_baseline: Option<Vec<u8>>) -> Reloader {
        Reloader {
            policies_dir: config.policies.clone(),
            cert: config.tls_cert.clone(),
            key: config.tls_key.clone(),
            client_ca: config.client_ca.clone(),
            last_policy_version: state.policies.load().version.clone(),
            // What the set in force was compiled with (`run` compiles the first set before any
            // DeviceClass is read): facts read since then are a change, even if they were
            // stored before this reloader started.
            last_facts: policy::ClusterFacts::default(),
            last_cert_hash: cert_baseline,
        }
    }

    fn reload_policies(&mut self, state: &AppState) {
        // `listed` first: the watch stores the facts before it says they are listed, so facts
        // read after it are at least the listed ones.
        let listed = state.facts_listed.load(std::sync::atomic::Ordering::Acquire);
        let facts = (**state.cluster_facts.load()).clone();
        let result = match policy::read_sources(&self.policies_dir) {
            // An unreadable directory has no version: forget the last one so the next readable
            // state is tried, whatever it is.
            Err(errors) => {
                self.last_policy_version.clear();
                Err(errors)
            }
            Ok(sources) => {
                let version = policy::version_of(&sources);
                if version == self.last_policy_version && facts == self.last_facts {
                    Ok(None)
                } else {
                    self.last_policy_version = version;
                    self.last_facts = facts.clone();
                    policy::compile_with(&sources, &facts).map(|set| Some((set, sources)))
                }
            }
        };
        match result {
            Ok(None) => {}
            Ok(Some((set, sources))) => {
                tracing::info!(version = %set.version, summary = ?set.summary(), "policies reloaded");
                // Before the swap, so the new set's native split is there when it goes live (a
                // split of another version is never used).
                state.set_native_split(&sources);
                state.metrics.set_policy_version(&set.version);
                state.metrics.policy_reloads.get_or_create(&ResultLabels { result: "success" }).inc();
                state.metrics.policy_load_errors.set(0);
                let classes_changed = state.policies.load().device_classes != set.device_classes;
                state.policies.store(Arc::new(set));
                state.last_reload_error.store(Arc::new(None));
                if classes_changed {
                    // Records count claim devices as the set in force when they were made.
                    tracing::info!("the DRA DeviceClass mapping changed; re-listing Pods to count their claims anew");
                    state.cluster.request_relist();
                }
            }
            Err(errors) => {
                tracing::error!(errors = %errors, serving = %state.policies.load().version, "policy reload failed; keeping the last good policy set");
                state.metrics.policy_reloads.get_or_create(&ResultLabels { result: "failure" }).inc();
                state.metrics.policy_load_errors.set(errors.0.len() as i64);
                state.last_reload_error.store(Arc::new(Some(errors.to_string())));
            }
        }
        // The set in force is compiled with the DeviceClasses as listed (or, when the files are
        // broken, the last good set stays, as for any reload).
        if listed {
            state.caches.device_classes.mark_synced();
            state.cluster.mark_device_classes_settled();
        }
    }

    fn reload_certificates(&mut self, state: &AppState, rustls: &axum_server::tls_rustls::RustlsConfig) {
        let hash = cert_hash(&self.cert, &self.key, self.client_ca.as_deref());
        if hash.is_none() || hash == self.last_cert_hash {
            return;
        }
        match tls::server_config_with_client_ca(&self.cert, &self.key, self.client_ca.as_deref()) {
            Ok(config) => {
                rustls.reload_from_config(config);
                self.last_cert_hash = hash;
                if let Some(expiry) = tls::not_after(&self.cert) {
                    state.metrics.certificate_expiry.set(expiry);
                }
                state.metrics.certificate_reloads.get_or_create(&ResultLabels { result: "success" }).inc();
                tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
            }
            Err(e) => {
                // Often the certificate was written and the key not yet: retried on the next
                // event or poll, with the old certificate still serving.
                state.metrics.certificate_reloads.get_or_create(&ResultLabels { result: "failure" }).inc();
                tracing::warn!(error = %e, "certificate reload failed; keeping the current certificate");
            }
        }
    }
}

/// Hash of the certificate, key and client CA files, to notice a rotation.
pub fn cert_hash(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Option<Vec<u8>> {
    let mut hasher = Sha256::new();
    hasher.update(std::fs::read(cert).ok()?);
    hasher.update(std::fs::read(key).ok()?);
    if let Some(ca) = client_ca {
        hasher.update(std::fs::read(ca).ok()?);
    }
    Some(hasher.finalize().to_vec())
}

/// Namespace labels from a kube-runtime reflector.
struct WatchedNamespaces(kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Namespace>);

impl NamespaceLabels for WatchedNamespaces {
    fn labels(&self, namespace: &str) -> Option<Labels> {
        let ns = self.0.get(&kube::runtime::reflector::ObjectRef::new(namespace))?;
        Some(ns.metadata.labels.clone().unwrap_or_default())
    }
}

/// A Kubernetes client from the kubeconfig or in-cluster config, if there is one.
pub async fn kube_client() -> Option<kube::Client> {
    match tokio::time::timeout(Duration::from_secs(5), kube::Client::try_default()).await {
        Ok(Ok(client)) => Some(client),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "no Kubernetes API: Team namespace selectors cannot be evaluated, no gang controller");
            None
        }
        Err(_) => {
            tracing::warn!(
                "Kubernetes client setup timed out: Team namespace selectors cannot be evaluated, no gang controller"
            );
            None
        }
    }
}

/// A client like [`kube_client`]'s that does not retry what the API server refuses with 429:
/// an eviction a PodDisruptionBudget refuses answers 429, which kube's default client retries
/// with a backoff for minutes (the gang controller would wait all that time). `None` where
/// there is no configuration.
pub async fn kube_client_without_retries() -> Option<kube::Client> {
    let mut config = tokio::time::timeout(Duration::from_secs(5), kube::Config::infer()).await.ok()?.ok()?;
    config.default_retry = false;
    kube::Client::try_from(config).ok()
}

/// Starts a Namespace watch; its labels are what Team selectors match. Marks
/// `caches.namespaces` synced once the first list is in.
pub fn watch_namespaces(client: kube::Client, caches: Arc<super::startup::Caches>) -> Arc<dyn NamespaceLabels> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, reflector, watcher};

    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
    let (reader, writer) = reflector::store();
    let ready = reader.clone();
    tokio::spawn(async move {
        if ready.wait_until_ready().await.is_ok() {
            caches.namespaces.mark_synced();
        }
    });
    let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff().applied_objects();
    tokio::spawn(async move {
        stream
            .for_each(|event| async move {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "namespace watch error");
                }
            })
            .await;
    });
    Arc::new(WatchedNamespaces(reader))
}

/// DRA ResourceClaims and ResourceClaimTemplates from kube-runtime reflectors: where admission
/// resolves the claims a Pod names ([`crate::model::dra`]). The reflectors keep each object as
/// counting reads it ([`AsRead`]), never the object itself.
struct WatchedClaims {
    claims: Store<AsRead<ResourceClaim>>,
    templates: Store<AsRead<ResourceClaimTemplate>>,
    /// Native PodGroups, where the cluster serves them.
    pod_groups: Arc<super::pod_groups::PodGroups>,
    /// Both claim watches have had their first list.
    synced: Arc<std::sync::atomic::AtomicBool>,
}

impl crate::model::dra::ClaimSource for WatchedClaims {
    fn template(&self, namespace: &str, name: &str) -> Option<Arc<serde_json::Value>> {
        Some(self.templates.get(&ObjectRef::new(name).within(namespace))?.read.clone())
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<serde_json::Value>> {
        Some(self.claims.get(&ObjectRef::new(name).within(namespace))?.read.clone())
    }

    fn missing_phrase(&self) -> &'static str {
        "which does not exist in the pod's namespace (create it before the pod)"
    }

    fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// While discovery shows `scheduling.k8s.io/v1alpha2` (served with the `GenericWorkload`
    /// gate); until it answers, and where it is not served, native-group members are gated like
    /// others.
    fn schedules_native_gangs(&self) -> bool {
        self.pod_groups.served()
    }

    fn pod_group(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.pod_groups.get(namespace, name)
    }
}

/// A ResourceClaim or ResourceClaimTemplate (`K`) as claim counting reads it
/// ([`crate::model::dra::claim_as_read`], [`crate::model::dra::template_as_read`]), made once per watch event.
///
/// Why not the object, converted at lookup: every claim entry of every pod view is looked up,
/// several times per review, and converting a whole tenant-written object (annotations,
/// managedFields, opaque driver parameters: hundreds of KiB) each time let one large template
/// named many times slow the webhook far beyond what the review's body size suggests (the small
/// body fast path has no deadline). Here a lookup is one `Arc` clone, and the cache holds only
/// what is read.
#[derive(Debug)]
struct AsRead<K> {
    name: String,
    namespace: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
    read: Arc<serde_json::Value>,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> Clone for AsRead<K> {
    fn clone(&self) -> Self {
        AsRead {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            resource_version: self.resource_version.clone(),
            uid: self.uid.clone(),
            read: self.read.clone(),
            kind: std::marker::PhantomData,
        }
    }
}

/// How each watched kind is reduced: only the parts counting reads are converted to JSON (the
/// device requests, and a claim's UID and owner references), then cut to the fields read.
trait ReadForClaims: kube::Resource<DynamicType = ()> {
    fn as_read(&self) -> serde_json::Value;
}

impl ReadForClaims for ResourceClaim {
    fn as_read(&self) -> serde_json::Value {
        let requests = self.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref());
        let parts = serde_json::json!({
            "metadata": {"uid": self.metadata.uid, "ownerReferences": self.metadata.owner_references},
            "spec": {"devices": {"requests": requests}},
        });
        crate::model::dra::claim_as_read(&parts)
    }
}

impl ReadForClaims for ResourceClaimTemplate {
    fn as_read(&self) -> serde_json::Value {
        let spec = self.spec.as_ref().and_then(|t| t.spec.as_ref());
        let requests = spec.and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref());
        crate::model::dra::template_as_read(&serde_json::json!({"spec": {"spec": {"devices": {"requests": requests}}}}))
    }
}

impl<K: ReadForClaims> AsRead<K> {
    fn of(object: &K) -> Self {
        let meta = object.meta();
        AsRead {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone(),
            resource_version: meta.resource_version.clone(),
            uid: meta.uid.clone(),
            read: Arc::new(object.as_read()),
            kind: std::marker::PhantomData,
        }
    }

    /// A watch event with its object reduced.
    fn event(event: watcher::Event<K>) -> watcher::Event<Self> {
        use watcher::Event;
        match event {
            Event::Apply(o) => Event::Apply(Self::of(&o)),
            Event::Delete(o) => Event::Delete(Self::of(&o)),
            Event::Init => Event::Init,
            Event::InitApply(o) => Event::InitApply(Self::of(&o)),
            Event::InitDone => Event::InitDone,
        }
    }
}

impl<K: kube::Resource<DynamicType = ()>> Lookup for AsRead<K> {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        K::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        K::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        K::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        K::plural(&())
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        self.namespace.as_deref().map(Cow::Borrowed)
    }
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.resource_version.as_deref().map(Cow::Borrowed)
    }
    fn uid(&self) -> Option<Cow<'_, str>> {
        self.uid.as_deref().map(Cow::Borrowed)
    }
}

/// Runs one kind's watch until the process ends, keeping its objects as read
/// ([`AsRead`]) and logging its errors.
fn spawn_reflector<K>(api: kube::Api<K>, what: &'static str) -> Store<AsRead<K>>
where
    K: ReadForClaims + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    use futures::{StreamExt, TryStreamExt};
    use kube::runtime::{WatchStreamExt, reflector};

    let (reader, writer) = reflector::store();
    let events = watcher(api, watcher::Config::default()).map_ok(AsRead::event);
    let stream = reflector(writer, events).default_backoff().applied_objects();
    tokio::spawn(async move {
        stream
            .for_each(|event| async move {
                if let Err(e) = event {
                    tracing::warn!(error = %e, watch = what, "DRA watch error");
                }
            })
            .await;
    });
    reader
}

/// Starts the ResourceClaim and ResourceClaimTemplate watches (`resource.k8s.io/v1`). A claim
/// not (yet) in the cache is denied as missing: failing closed, never counted as free.
///
/// Native PodGroups are looked up beside them ([`super::pod_groups`]: discovery, then a watch
/// that sizes the native groups of `cluster`); their watch is not waited for here.
pub fn watch_claims(
    client: kube::Client,
    cluster: Arc<crate::control::cluster::ClusterState>,
) -> Arc<dyn crate::model::dra::ClaimSource> {
    let claims = spawn_reflector(kube::Api::all(client.clone()), "ResourceClaim");
    let templates = spawn_reflector(kube::Api::all(client.clone()), "ResourceClaimTemplate");
    let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (first_claims, first_templates, done) = (claims.clone(), templates.clone(), synced.clone());
    tokio::spawn(async move {
        if first_claims.wait_until_ready().await.is_ok() && first_templates.wait_until_ready().await.is_ok() {
            done.store(true, std::sync::atomic::Ordering::Release);
        }
    });
    let pod_groups = super::pod_groups::watch(client, cluster);
    Arc::new(WatchedClaims { claims, templates, pod_groups, synced })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dra::ClaimSource;

    /// A ResourceClaim as the watch delivers it, padded by its tenant: 2,000 annotations of 200
    /// bytes, managedFields, an opaque parameter blob of 100 KiB.
    fn padded_claim() -> ResourceClaim {
        let annotations: serde_json::Map<String, serde_json::Value> =
            (0..2000).map(|i| (format!("example.com/pad-{i}"), "x".repeat(200).into())).collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "big", "namespace": "ml", "uid": "uid-big", "resourceVersion": "7",
                         "annotations": annotations,
                         "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}]},
            "spec": {"devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3,
                              "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}],
                "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"blob": "y".repeat(100_000)}}}]
            }}
        }))
        .expect("a ResourceClaim")
    }

    fn watched(claims: Store<AsRead<ResourceClaim>>) -> WatchedClaims {
        WatchedClaims {
            claims,
            templates: kube::runtime::reflector::store().0,
            pod_groups: Arc::default(),
            synced: Arc::default(),
        }
    }

    /// A lookup hands out what the watch made of the object when it arrived: without the
    /// padding, and the same allocation for every reference (no conversion per lookup), so a
    /// review naming one large claim many times costs what is read, not what was written.
    #[test]
    fn a_claim_is_converted_once_per_watch_event_and_looked_up_without_its_padding() {
        let (store, mut writer) = kube::runtime::reflector::store::<AsRead<ResourceClaim>>();
        let claim = padded_claim();
        assert!(serde_json::to_string(&claim).unwrap().len() > 500_000);
        writer.apply_watcher_event(&watcher::Event::Apply(AsRead::of(&claim)));
        let source = watched(store);

        let first = source.claim("ml", "big").expect("found");
        let text = serde_json::to_string(&*first).unwrap();
        assert!(text.len() < 300, "{} bytes: {text}", text.len());
        for padded in ["annotations", "managedFields", "config", "selectors", "pad-"] {
            assert!(!text.contains(padded), "{padded} in {text}");
        }
        assert_eq!(first.pointer("/metadata/uid"), Some(&serde_json::json!("uid-big")));
        assert_eq!(first.pointer("/spec/devices/requests/0/exactly/count"), Some(&serde_json::json!(3)));
        for _ in 0..100 {
            assert!(Arc::ptr_eq(&first, &source.claim("ml", "big").expect("found")), "no per-lookup copy");
        }
        assert!(source.claim("other", "big").is_none());

        // A new version of the object is read anew, once.
        let mut changed = claim;
        changed.metadata.resource_version = Some("8".into());
        writer.apply_watcher_event(&watcher::Event::Apply(AsRead::of(&changed)));
        let second = source.claim("ml", "big").expect("found");
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(first, second);
        writer.apply_watcher_event(&watcher::Event::Delete(AsRead::of(&changed)));
        assert!(source.claim("ml", "big").is_none());
    }
}
