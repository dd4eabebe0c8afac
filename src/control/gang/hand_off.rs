//! Inferred gangs handed to Kubernetes' own gang scheduling (GangPolicy `nativeScheduling`, on a
//! cluster that serves `scheduling.k8s.io/v1alpha2`): the webhook names the PodGroup in each
//! member's `spec.schedulingGroup` at CREATE ([`crate::model::gang::membership::hand_off_name`]) and creates
//! nothing (`sideEffects: None` holds); the leading controller creates the Workload and the
//! PodGroup, `minCount` from the gang's owner, both owned by it so they go with it. Until the
//! PodGroup exists the scheduler holds the members; then it places them all or none.

use std::collections::HashSet;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use super::owners::{OwnerApi, owner_api};
use crate::control::cluster::ClusterState;

/// The PodGroup template every handed-off Workload has, one per gang.
const TEMPLATE: &str = "gang";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("scheduling.k8s.io", "v1alpha2", kind), plural)
}

/// Where native PodGroups are served: behind the `GenericWorkload` gate and
/// `--runtime-config=scheduling.k8s.io/v1alpha2=true` in Kubernetes 1.36. (Read as dynamic
/// objects: k8s-openapi's newest types are a later version of the API.)
pub const POD_GROUP_API: &str = "scheduling.k8s.io/v1alpha2";

/// The PodGroup resource of [`POD_GROUP_API`].
pub fn pod_group_resource() -> ApiResource {
    resource("PodGroup", "podgroups")
}

/// Whether the cluster serves native PodGroups (discovery of [`POD_GROUP_API`]): `Ok(false)` for
/// a 404 (the API is off: no pod can name a PodGroup, the API server drops the field).
pub async fn serves_pod_groups(client: &kube::Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(POD_GROUP_API).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "podgroups")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// What a handed-off gang's GangPolicy asks of the native objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    /// The topology level it requires (`schedulingConstraints.topology`).
    pub topology: Option<String>,
    /// `disruption: Gang`: the PodGroup's `disruptionMode: PodGroup`.
    pub whole_gang_disruption: bool,
}

impl Terms {
    /// What the GangPolicy of `namespace` asks: its required topology level (a preference has
    /// no native equivalent) and whether a disruption takes the whole group.
    pub fn of(
        policies: &crate::model::policy::PolicySet,
        labels: &dyn crate::model::namespaces::NamespaceLabels,
        namespace: &str,
    ) -> Terms {
        let team = crate::model::namespaces::team_of(policies, namespace, labels).team.map(|t| t.name.as_str());
        let policy = policies.gang_policy(namespace, team);
        Terms {
            topology: policy.topology.as_ref().filter(|t| t.required).and_then(|t| t.levels.last().cloned()),
            whole_gang_disruption: policy.disruption == crate::model::policy::Disruption::Gang,
        }
    }
}

/// The Workload and PodGroup for a handed-off gang of `min_count` named `name`, owned by
/// `owner` (an ownerReference: apiVersion, kind, name, uid), kept inside one domain of the node
/// label `terms.topology` where its GangPolicy requires one (KEP-5732's `schedulingConstraints`,
/// one key, no preference: an API server without TopologyAwareWorkloadScheduling drops the field).
/// Pure, for tests.
pub fn objects(name: &str, owner: &Value, min_count: u32, terms: &Terms) -> (Value, Value) {
    let topology = terms.topology.as_deref();
    let policy = json!({"gang": {"minCount": min_count}});
    let constraints = topology.map(|key| json!({"topology": [{"key": key}]}));
    let metadata =
        json!({"name": name, "labels": {"app.kubernetes.io/managed-by": "allot"}, "ownerReferences": [owner]});
    let workload = json!({
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "Workload", "metadata": metadata,
        "spec": {
            "controllerRef": {"apiGroup": owner["apiVersion"].as_str().and_then(|v| v.rsplit_once('/')).map_or("", |(g, _)| g),
                              "kind": owner["kind"], "name": owner["name"]},
            "podGroupTemplates": [{"name": TEMPLATE, "schedulingPolicy": policy}]
        }
    });
    let mut pod_group = json!({
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": metadata,
        "spec": {
            "podGroupTemplateRef": {"workload": {"workloadName": name, "podGroupTemplateName": TEMPLATE}},
            "schedulingPolicy": policy
        }
    });
    let mut workload = workload;
    if let Some(constraints) = constraints {
        workload["spec"]["podGroupTemplates"][0]["schedulingConstraints"] = constraints.clone();
        pod_group["spec"]["schedulingConstraints"] = constraints;
    }
    if terms.whole_gang_disruption {
        // KEP-5710 (WorkloadAwarePreemption): the scheduler preempts the group whole. Dropped by
        // an API server without the gate.
        pod_group["spec"]["disruptionMode"] = json!("PodGroup");
    }
    (workload, pod_group)
}

/// How many gangs one controller pass hands off at most (each costs a GET and two creates in
/// the loop that also releases gangs and queues: a tenant's flood of forged members must not
/// hold those up). The rest wait for the next pass.
const PER_PASS: usize = 16;

/// Creates what is missing for each handed-off gang with a live member. `tried` remembers the
/// groups created (or being retried) since the last resync, so a pass does not ask twice while
/// the watch has not shown the PodGroup yet; an object that exists already is left as it is.
pub async fn create_missing(
    client: &kube::Client,
    state: &ClusterState,
    tried: &mut HashSet<(String, String)>,
    policies: &crate::model::policy::PolicySet,
    labels: &dyn crate::model::namespaces::NamespaceLabels,
) {
    let missing = state.hand_offs().into_iter().filter(|(namespace, name, _)| {
        state.claims().pod_group(namespace, name).is_none() && !tried.contains(&(namespace.clone(), name.clone()))
    });
    for (namespace, name, owner) in missing.take(PER_PASS).collect::<Vec<_>>() {
        tried.insert((namespace.clone(), name.clone()));
        let Some(api) = owner_api(owner.kind, &owner.api_kind) else {
            tracing::warn!(%namespace, pod_group = %name, kind = %owner.api_kind, "not a known owner kind for inferred gangs");
            continue;
        };
        let terms = Terms::of(policies, labels, &namespace);
        match create(client, &namespace, &name, api, &owner, &terms).await {
            Ok(min_count) => {
                tracing::info!(%namespace, pod_group = %name, owner = %owner.name, min_count, "gang handed to the scheduler: PodGroup created")
            }
            Err(e) => {
                // Tried again at the next resync (the owner may not be readable yet).
                tracing::warn!(%namespace, pod_group = %name, owner = %owner.name, error = %e, reason = e.metric_label(), "cannot hand the gang to the scheduler");
            }
        }
    }
}

/// Why a gang could not be handed to the scheduler (tried again at the next resync).
#[derive(Debug, thiserror::Error)]
pub enum HandOffError {
    #[error("{0}")]
    ReadOwner(#[source] kube::Error),
    #[error("the owner does not exist")]
    NoOwner,
    #[error("the owner declares no usable size")]
    NoSize,
    #[error("the owner has no uid")]
    NoUid,
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    /// The API server refused to create the Workload or PodGroup (`kind`).
    #[error("{kind}: {source}")]
    Create { kind: &'static str, source: kube::Error },
}

impl HandOffError {
    /// A short, stable name for the reason (metrics, logs).
    pub fn metric_label(&self) -> &'static str {
        match self {
            HandOffError::ReadOwner(_) => "read_owner",
            HandOffError::NoOwner => "no_owner",
            HandOffError::NoSize => "no_size",
            HandOffError::NoUid => "no_uid",
            HandOffError::Encode(_) => "encode",
            HandOffError::Create { .. } => "create",
        }
    }
}

async fn create(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    api: &OwnerApi,
    owner: &crate::control::cluster::Owner,
    terms: &Terms,
) -> Result<u32, HandOffError> {
    let gvk = GroupVersionKind::gvk(api.group, api.version, &owner.api_kind);
    let owners: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, &api.plural(&owner.api_kind)),
    );
    let found = owners.get_opt(&owner.name).await.map_err(HandOffError::ReadOwner)?.ok_or(HandOffError::NoOwner)?;
    let size = crate::model::gang::membership::owner_gang(owner.kind, &found.data).ok_or(HandOffError::NoSize)?.size;
    let uid = found.metadata.uid.ok_or(HandOffError::NoUid)?;
    let reference = json!({"apiVersion": format!("{}/{}", api.group, api.version), "kind": owner.api_kind,
                           "name": owner.name, "uid": uid});
    let (workload, pod_group) = objects(name, &reference, size, terms);
    for (object, kind, plural) in [(workload, "Workload", "workloads"), (pod_group, "PodGroup", "podgroups")] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource(kind, plural));
        let object: DynamicObject = serde_json::from_value(object).map_err(HandOffError::Encode)?;
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => return Err(HandOffError::Create { kind, source }),
        }
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_objects_are_the_gangs_and_owned_by_its_owner() {
        let owner = json!({"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1"});
        let (workload, pod_group) = objects("allot-job-train", &owner, 4, &Terms::default());
        assert_eq!(workload["spec"]["controllerRef"], json!({"apiGroup": "batch", "kind": "Job", "name": "train"}));
        assert_eq!(workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"], 4);
        assert_eq!(pod_group["spec"]["schedulingPolicy"]["gang"]["minCount"], 4);
        assert_eq!(pod_group["spec"]["podGroupTemplateRef"]["workload"]["workloadName"], "allot-job-train");
        for object in [&workload, &pod_group] {
            assert_eq!(object["metadata"]["name"], "allot-job-train");
            assert_eq!(object["metadata"]["ownerReferences"], json!([owner]));
            let _: DynamicObject = serde_json::from_value(object.clone()).expect("a dynamic object");
            assert!(object["spec"].get("schedulingConstraints").is_none());
            assert!(object["spec"].get("disruptionMode").is_none());
        }
    }

    #[test]
    fn a_required_level_is_the_native_topology_constraint() {
        let owner = json!({"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1"});
        let terms = Terms { topology: Some("topology.kubernetes.io/rack".into()), whole_gang_disruption: true };
        let (workload, pod_group) = objects("allot-job-train", &owner, 4, &terms);
        let constraint = json!({"topology": [{"key": "topology.kubernetes.io/rack"}]});
        assert_eq!(workload["spec"]["podGroupTemplates"][0]["schedulingConstraints"], constraint);
        assert_eq!(pod_group["spec"]["schedulingConstraints"], constraint);
        assert_eq!(pod_group["spec"]["disruptionMode"], "PodGroup");
    }
}
