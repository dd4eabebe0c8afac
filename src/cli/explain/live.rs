//! Reading the live cluster for `allot explain`: the client from a kubeconfig (as kubectl finds
//! it), the policies Allot uses, and Pods, Nodes and Namespaces listed into the same
//! [`ClusterState`] the controller's watches fill. What the caller may not list (a tenant with
//! a namespaced Role) is recorded in [`Visibility`], never an error, so the answer can say what
//! it leaves out.

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, ListParams, ObjectList};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::de::DeserializeOwned;

use super::{ExplainError, Inputs, PodStatus, Report, Subject, Visibility};
use crate::control::cluster::{ClusterState, PodRecord, node_info};
pub use crate::model::clock::unix_now;
use crate::model::namespaces::StaticNamespaces;
use crate::model::policy::{self, PolicySet, Source};

/// The ConfigMap `deploy/` ships the policies in: what the cluster's Allot reads.
pub const DEFAULT_POLICIES_CONFIGMAP: &str = "allot-system/allot-policies";

/// Objects per list page: one page of whole objects is in memory at a time.
const PAGE: u32 = 500;

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("kubeconfig: {0}")]
    Config(String),
    #[error("cannot read the policies Allot uses from ConfigMap {configmap}: {reason}; give --policies DIR")]
    PolicyConfigMap { configmap: String, reason: String },
    #[error("{0}")]
    Policies(String),
    #[error("cannot list {what}: {source}")]
    List { what: String, source: kube::Error },
    #[error(transparent)]
    Explain(#[from] ExplainError),
    #[error("the cluster did not answer within {0}s (--timeout-secs)")]
    Timeout(u64),
}

impl LiveError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            LiveError::Config(_) => "config",
            LiveError::PolicyConfigMap { .. } => "policy_configmap",
            LiveError::Policies(_) => "policies",
            LiveError::List { .. } => "list",
            LiveError::Explain(e) => e.metric_label(),
            LiveError::Timeout(_) => "timeout",
        }
    }
}

/// One `allot explain` as the command line gives it.
#[derive(Debug, Clone)]
pub struct Request {
    pub subject: Subject,
    pub name: String,
    /// Default: the kubeconfig context's namespace.
    pub namespace: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub policies: PolicySource,
    /// For everything the cluster is asked.
    pub timeout: Duration,
}

/// Connects, reads the policies and the cluster, and explains, within the request's timeout.
pub async fn run(request: &Request) -> Result<Report, LiveError> {
    let work = async {
        let (client, default_namespace) = connect(request.kubeconfig.as_deref(), request.context.as_deref()).await?;
        let namespace = request.namespace.clone().unwrap_or(default_namespace);
        // One list of DeviceClasses: what the policies count (their extended resources) and
        // what the nodes' devices belong to.
        let classes = list_device_classes(&client).await;
        let facts = classes
            .as_ref()
            .map_or_else(|_| policy::ClusterFacts::default(), policy::ClusterFacts::from_device_classes);
        let policies = load_policies(&client, &request.policies, &facts).await?;
        let world = gather(&client, &policies, &namespace, classes).await?;
        let inputs = Inputs {
            state: &world.state,
            policies: &policies,
            labels: &world.labels,
            now: unix_now(),
            pods: &world.pods,
            visibility: &world.visibility,
        };
        Ok(super::explain(&inputs, request.subject, &namespace, &request.name)?)
    };
    tokio::time::timeout(request.timeout, work).await.map_err(|_| LiveError::Timeout(request.timeout.as_secs()))?
}

/// Where the policies come from.
#[derive(Debug, Clone)]
pub enum PolicySource {
    Dir(PathBuf),
    /// `NAMESPACE/NAME` of a ConfigMap whose `*.yaml`/`*.yml`/`*.json` keys are policy files.
    ConfigMap {
        namespace: String,
        name: String,
    },
}

impl PolicySource {
    /// The ConfigMap `NAMESPACE/NAME`; `None` when it is not of that form.
    pub fn configmap(reference: &str) -> Option<PolicySource> {
        let (namespace, name) = reference.split_once('/').filter(|(n, s)| !n.is_empty() && !s.is_empty())?;
        Some(PolicySource::ConfigMap { namespace: namespace.into(), name: name.into() })
    }
}

/// A client and the default namespace, as kubectl would pick them: `--kubeconfig FILE`, else
/// `KUBECONFIG` or `~/.kube/config`, else the in-cluster service account; `context` picks a
/// context other than the current one.
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<(kube::Client, String), LiveError> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| LiveError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await.map_err(|e| LiveError::Config(e.to_string()))?
        }
        (None, Some(_)) => {
            kube::Config::from_kubeconfig(&options).await.map_err(|e| LiveError::Config(e.to_string()))?
        }
        (None, None) => kube::Config::infer().await.map_err(|e| LiveError::Config(e.to_string()))?,
    };
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(|e| LiveError::Config(e.to_string()))?;
    Ok((client, namespace))
}

/// The cluster's DeviceClasses (where they cannot be listed, the policies' own mapping stands
/// alone and the fit's devices are reported as not visible).
async fn list_device_classes(client: &kube::Client) -> Result<Vec<DeviceClass>, kube::Error> {
    let mut classes = Vec::new();
    list_each(&Api::<DeviceClass>::all(client.clone()), |c| classes.push(c)).await?;
    Ok(classes)
}

/// Loads and compiles the policies, with what was read of the cluster's DeviceClasses.
pub async fn load_policies(
    client: &kube::Client,
    source: &PolicySource,
    facts: &policy::ClusterFacts,
) -> Result<PolicySet, LiveError> {
    match source {
        PolicySource::Dir(dir) => policy::read_sources(dir)
            .and_then(|sources| policy::compile_with(&sources, facts))
            .map_err(|e| LiveError::Policies(e.to_string())),
        PolicySource::ConfigMap { namespace, name } => {
            let configmap = format!("{namespace}/{name}");
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            let cm = api
                .get_opt(name)
                .await
                .map_err(|e| LiveError::PolicyConfigMap { configmap: configmap.clone(), reason: e.to_string() })?
                .ok_or_else(|| LiveError::PolicyConfigMap {
                    configmap: configmap.clone(),
                    reason: "not found".into(),
                })?;
            let sources: Vec<Source> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .filter(|(key, _)| [".yaml", ".yml", ".json"].iter().any(|ext| key.ends_with(ext)))
                .map(|(key, text)| Source { name: format!("configmap {configmap}: {key}"), text })
                .collect();
            if sources.is_empty() {
                return Err(LiveError::PolicyConfigMap {
                    configmap,
                    reason: "it holds no *.yaml, *.yml or *.json key".into(),
                });
            }
            policy::compile_with(&sources, facts).map_err(|e| LiveError::Policies(e.to_string()))
        }
    }
}

/// What was read from the cluster.
pub struct World {
    pub state: ClusterState,
    pub labels: StaticNamespaces,
    /// For the pods of `namespace`: what the view does not keep.
    pub pods: HashMap<(String, String), PodStatus>,
    pub visibility: Visibility,
}

fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 401 || s.code == 403)
}

fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Every object of `api`, page by page, each handed to `each`.
async fn list_each<K>(api: &Api<K>, mut each: impl FnMut(K)) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page: ObjectList<K> = api.list(&params).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        page.items.into_iter().for_each(&mut each);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Lists Namespaces, Nodes and Pods (all namespaces, else `namespace` alone) into a fresh
/// [`ClusterState`], and reads the sizes of inferred gangs from their owners, as the controller
/// does before each pass. `classes`: the DeviceClasses as listed (the nodes' DRA devices are
/// counted against them where the policies map a class).
pub async fn gather(
    client: &kube::Client,
    policies: &PolicySet,
    namespace: &str,
    classes: Result<Vec<DeviceClass>, kube::Error>,
) -> Result<World, LiveError> {
    let mut visibility = Visibility::default();
    let labels = list_namespaces(client, &mut visibility).await?;
    let state = ClusterState::default();
    state.replace_nodes(list_nodes(client, &mut visibility).await?);
    if !policies.device_classes.is_empty() {
        match list_devices(client, classes).await {
            Ok(devices) => state.set_devices(crate::control::cluster::Devices::Known(Arc::new(devices))),
            Err(e) if forbidden(&e) => visibility.devices = Some(reason(&e)),
            Err(source) => return Err(LiveError::List { what: "DRA devices".into(), source }),
        }
    }
    // Claims and PodGroups before pods: a pod's record counts the devices of the claims it names
    // and is charged for the native PodGroup it is in.
    let mut claims = if policies.device_classes.is_empty() {
        crate::model::dra::ClaimObjects::new("not found in the cluster")
    } else {
        match list_claims(client, namespace).await {
            Ok((claims, why)) => {
                visibility.claims = why;
                claims
            }
            Err(source) => return Err(LiveError::List { what: "DRA claims".into(), source }),
        }
    };
    match list_pod_groups(client, namespace, &mut claims).await {
        Ok(()) => {}
        Err(e) if forbidden(&e) => visibility.pod_groups = Some(reason(&e)),
        Err(source) => return Err(LiveError::List { what: "native PodGroups".into(), source }),
    }
    let (records, pods) = list_pods(client, namespace, policies, &labels, &claims, &mut visibility).await?;
    state.replace_pods(records);
    // Every owner once (a pass reads a few at a time; each read or failed is not due again).
    let round = std::time::Instant::now();
    while crate::control::gang::owners::resolve_owner_sizes(client, &state, round).await {}
    Ok(World { state, labels, pods, visibility })
}

/// Every Namespace's labels, for Team selectors; none (and why) where they cannot be listed.
async fn list_namespaces(client: &kube::Client, visibility: &mut Visibility) -> Result<StaticNamespaces, LiveError> {
    let mut labels = StaticNamespaces::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match list_each(&namespaces, |ns| {
        if let Some(name) = ns.metadata.name {
            labels.0.insert(name, ns.metadata.labels.unwrap_or_default());
        }
    })
    .await
    {
        Ok(()) => {}
        Err(e) if forbidden(&e) => visibility.namespaces = Some(reason(&e)),
        Err(source) => return Err(LiveError::List { what: "namespaces".into(), source }),
    }
    Ok(labels)
}

/// Every Node's capacity and labels, for placement; none (and why) where they cannot be listed.
async fn list_nodes(
    client: &kube::Client,
    visibility: &mut Visibility,
) -> Result<Vec<crate::control::cluster::NodeInfo>, LiveError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node_infos = Vec::new();
    match list_each(&nodes, |node| node_infos.extend(node_info(&node))).await {
        Ok(()) => {}
        Err(e) if forbidden(&e) => visibility.nodes = Some(reason(&e)),
        Err(source) => return Err(LiveError::List { what: "nodes".into(), source }),
    }
    Ok(node_infos)
}

/// Every pod's record (all namespaces, else `namespace` alone, with why), and the fields the
/// records do not keep for the pods of `namespace`; a record is built against the namespaces'
/// labels and the claims and PodGroups listed before.
async fn list_pods(
    client: &kube::Client,
    namespace: &str,
    policies: &PolicySet,
    labels: &StaticNamespaces,
    claims: &crate::model::dra::ClaimObjects,
    visibility: &mut Visibility,
) -> Result<(Vec<PodRecord>, HashMap<(String, String), PodStatus>), LiveError> {
    let mut records = Vec::new();
    let mut pods = HashMap::new();
    let mut keep = |pod: Pod| {
        if pod.metadata.namespace.as_deref() == Some(namespace)
            && let Some(name) = pod.metadata.name.clone()
        {
            pods.insert((namespace.to_string(), name), PodStatus::of(&pod));
        }
        records.extend(PodRecord::from_pod_with_claims(&pod, policies, labels, claims));
    };
    let all: Api<Pod> = Api::all(client.clone());
    match list_each(&all, &mut keep).await {
        Ok(()) => {}
        Err(e) if forbidden(&e) => {
            visibility.all_pods = Some(reason(&e));
            let own: Api<Pod> = Api::namespaced(client.clone(), namespace);
            list_each(&own, &mut keep)
                .await
                .map_err(|source| LiveError::List { what: format!("pods in namespace {namespace}"), source })?;
        }
        Err(source) => return Err(LiveError::List { what: "pods".into(), source }),
    }
    Ok((records, pods))
}

/// The DRA devices each node offers, counted from every DeviceClass and ResourceSlice as the
/// controller's watch counts them ([`crate::control::gang::devices`]).
async fn list_devices(
    client: &kube::Client,
    classes: Result<Vec<DeviceClass>, kube::Error>,
) -> Result<crate::model::dra::slices::NodeDevices, kube::Error> {
    use crate::model::dra::slices::{DeviceClassMatcher, NodeDevices, slice_devices};
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let matcher = DeviceClassMatcher::new(&classes?);
    let mut counted = Vec::new();
    list_each(&Api::<ResourceSlice>::all(client.clone()), |s| counted.push(slice_devices(&s, &matcher))).await?;
    Ok(NodeDevices::from_slices(&counted, &matcher))
}

/// The native PodGroups the caller may list (all namespaces, else `namespace`), where the
/// cluster serves them (nothing to list otherwise), kept in `objects`.
async fn list_pod_groups(
    client: &kube::Client,
    namespace: &str,
    objects: &mut crate::model::dra::ClaimObjects,
) -> Result<(), kube::Error> {
    use crate::control::gang::hand_off::{POD_GROUP_API, pod_group_resource, serves_pod_groups};
    use kube::api::DynamicObject;
    if !serves_pod_groups(client).await? {
        return Ok(());
    }
    let mut keep = |g: DynamicObject| {
        // (List items carry no type: the kind is the list's.)
        if let Ok(mut object) = serde_json::to_value(g) {
            object["apiVersion"] = POD_GROUP_API.into();
            object["kind"] = "PodGroup".into();
            objects.insert(&object, namespace);
        }
    };
    let all = Api::<DynamicObject>::all_with(client.clone(), &pod_group_resource());
    match list_each(&all, &mut keep).await {
        Err(e) if forbidden(&e) => {
            let own = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &pod_group_resource());
            list_each(&own, &mut keep).await
        }
        other => other,
    }
}

/// Every ResourceClaimTemplate and ResourceClaim the caller may list: of all namespaces, else
/// of `namespace` alone, with why not all (a namespaced Role); none at all, with why, when even
/// those are forbidden.
async fn list_claims(
    client: &kube::Client,
    namespace: &str,
) -> Result<(crate::model::dra::ClaimObjects, Option<String>), kube::Error> {
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
    let mut objects = crate::model::dra::ClaimObjects::new("not found in the cluster");
    let mut why = None;
    let mut keep = |object: serde_json::Result<serde_json::Value>| {
        if let Ok(object) = object {
            objects.insert(&object, namespace);
        }
    };
    for all_namespaces in [true, false] {
        let templates: Api<ResourceClaimTemplate> =
            if all_namespaces { Api::all(client.clone()) } else { Api::namespaced(client.clone(), namespace) };
        let claims: Api<ResourceClaim> =
            if all_namespaces { Api::all(client.clone()) } else { Api::namespaced(client.clone(), namespace) };
        let listed = match list_each(&templates, |t| keep(serde_json::to_value(t))).await {
            Ok(()) => list_each(&claims, |c| keep(serde_json::to_value(c))).await,
            Err(e) => Err(e),
        };
        match listed {
            Ok(()) => {
                let why = why.map(|w| format!("only namespace {namespace} could be listed: {w}"));
                return Ok((objects, why));
            }
            Err(e) if forbidden(&e) => why = Some(reason(&e)),
            Err(e) => return Err(e),
        }
    }
    Ok((objects, why))
}
