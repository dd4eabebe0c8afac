//! The Pod as the cluster view's watch decodes it: only the fields a [`PodRecord`] is made
//! from, everything else skipped while parsing.
//!
//! Every replica watches every Pod, and a restart or relist decodes the whole cluster. A full
//! k8s-openapi `Pod` holds its managedFields (a tree of maps per field manager), env, volumes,
//! probes and container statuses: several times what its record keeps, allocated and freed
//! for every pod of every list page and watch event. Those short-lived allocations, interleaved
//! with the records that stay, are what a restart's peak is made of (issue 18). [`WatchedPod`]
//! parses the same JSON into a `Pod` that has only the read fields set, so the record code
//! stays one function over `Pod` and `cluster::tests` can check that both decodings give the
//! same record.
//!
//! [`PodRecord`]: super::PodRecord

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, NodeAffinity, Pod, PodCondition, PodResourceClaim, PodResourceClaimStatus, PodSchedulingGate,
    PodSchedulingGroup, PodSpec, PodStatus, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

/// A watched Pod: a `Pod` with only the fields records read (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchedPod(pub Pod);

impl k8s_openapi::Resource for WatchedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::ListableResource for WatchedPod {
    const LIST_KIND: &'static str = <Pod as k8s_openapi::ListableResource>::LIST_KIND;
}

impl k8s_openapi::Metadata for WatchedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(WatchedPod(SlimPod::deserialize(deserializer)?.into()))
    }
}

// The slim shapes below name only what `PodRecord::from_pod_with_claims` (and the watcher:
// name, namespace, resourceVersion) reads; serde skips every other field without building it.
// Nested types a record reads whole (resources, tolerations, claims) are k8s-openapi's own.

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SlimPod {
    metadata: SlimMeta,
    spec: Option<SlimSpec>,
    status: Option<SlimStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SlimSpec {
    containers: Option<Vec<SlimContainer>>,
    init_containers: Option<Vec<SlimContainer>>,
    overhead: Option<BTreeMap<String, Quantity>>,
    resources: Option<ResourceRequirements>,
    node_name: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    affinity: Option<SlimAffinity>,
    tolerations: Option<Vec<Toleration>>,
    priority: Option<i32>,
    priority_class_name: Option<String>,
    preemption_policy: Option<String>,
    scheduler_name: Option<String>,
    scheduling_gates: Option<Vec<PodSchedulingGate>>,
    scheduling_group: Option<PodSchedulingGroup>,
    resource_claims: Option<Vec<PodResourceClaim>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SlimContainer {
    name: String,
    resources: Option<ResourceRequirements>,
    restart_policy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SlimAffinity {
    node_affinity: Option<NodeAffinity>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SlimStatus {
    phase: Option<String>,
    conditions: Option<Vec<PodCondition>>,
    resource_claim_statuses: Option<Vec<PodResourceClaimStatus>>,
}

impl From<SlimContainer> for Container {
    fn from(c: SlimContainer) -> Container {
        Container { name: c.name, resources: c.resources, restart_policy: c.restart_policy, ..Container::default() }
    }
}

impl From<SlimPod> for Pod {
    fn from(pod: SlimPod) -> Pod {
        let m = pod.metadata;
        let containers = |list: Option<Vec<SlimContainer>>| list.map(|l| l.into_iter().map(Container::from).collect());
        Pod {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                labels: m.labels,
                annotations: m.annotations,
                owner_references: m.owner_references,
                creation_timestamp: m.creation_timestamp,
                deletion_timestamp: m.deletion_timestamp,
                ..ObjectMeta::default()
            },
            spec: pod.spec.map(|s| PodSpec {
                containers: containers(s.containers).unwrap_or_default(),
                init_containers: containers(s.init_containers),
                overhead: s.overhead,
                resources: s.resources,
                node_name: s.node_name,
                node_selector: s.node_selector,
                affinity: s.affinity.map(|a| k8s_openapi::api::core::v1::Affinity {
                    node_affinity: a.node_affinity,
                    ..Default::default()
                }),
                tolerations: s.tolerations,
                priority: s.priority,
                priority_class_name: s.priority_class_name,
                preemption_policy: s.preemption_policy,
                scheduler_name: s.scheduler_name,
                scheduling_gates: s.scheduling_gates,
                scheduling_group: s.scheduling_group,
                resource_claims: s.resource_claims,
                ..PodSpec::default()
            }),
            status: pod.status.map(|s| PodStatus {
                phase: s.phase,
                conditions: s.conditions,
                resource_claim_statuses: s.resource_claim_statuses,
                ..PodStatus::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_pod_keeps_the_read_fields_and_drops_the_rest() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "w-0", "namespace": "vision", "uid": "u1", "resourceVersion": "42",
                "labels": {"a": "b"}, "annotations": {"c": "d"},
                "creationTimestamp": "2026-11-26T10:00:00Z",
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {"f:containers": {}}}}],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "o1", "controller": true}]
            },
            "spec": {
                "containers": [{"name": "c", "image": "x", "env": [{"name": "E", "value": "v"}],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "initContainers": [{"name": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists"}]}]}},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "t"}]}},
                "schedulingGates": [{"name": "allot.dev/gang"}],
                "priority": 7
            },
            "status": {"phase": "Pending", "containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": false, "restartCount": 0}]}
        });
        let full: Pod = serde_json::from_value(json.clone()).expect("a Pod");
        let WatchedPod(slim) = serde_json::from_value(json).expect("a watched Pod");
        assert_eq!(slim.metadata.name, full.metadata.name);
        assert_eq!(slim.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(slim.metadata.owner_references, full.metadata.owner_references);
        assert!(slim.metadata.managed_fields.is_none(), "managedFields are not kept");
        let spec = slim.spec.as_ref().expect("spec");
        assert!(spec.volumes.is_none());
        assert!(spec.containers[0].env.is_none() && spec.containers[0].image.is_none());
        assert_eq!(spec.containers[0].resources, full.spec.as_ref().and_then(|s| s.containers[0].resources.clone()));
        assert_eq!(spec.init_containers.as_ref().map(|c| c[0].restart_policy.as_deref()), Some(Some("Always")));
        let affinity = spec.affinity.as_ref().expect("affinity");
        assert!(affinity.pod_anti_affinity.is_none());
        assert_eq!(affinity.node_affinity, full.spec.as_ref().and_then(|s| s.affinity.as_ref()?.node_affinity.clone()));
        assert_eq!(spec.priority, Some(7));
        let status = slim.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert!(status.container_statuses.is_none());
    }

    /// Records made from both decodings of `pod` under the shipped policies and namespaces.
    fn both_records(
        pod: &serde_json::Value,
    ) -> (Option<crate::control::cluster::PodRecord>, Option<crate::control::cluster::PodRecord>) {
        let (policies, namespaces, claims) = &*SHIPPED;
        let full: Pod = serde_json::from_value(pod.clone()).expect("a Pod");
        let WatchedPod(slim) = serde_json::from_value(pod.clone()).expect("a watched Pod");
        let record =
            |p: &Pod| crate::control::cluster::PodRecord::from_pod_with_claims(p, policies, namespaces, claims);
        (record(&full), record(&slim))
    }

    static SHIPPED: std::sync::LazyLock<(
        crate::model::policy::PolicySet,
        crate::model::namespaces::StaticNamespaces,
        crate::model::dra::ClaimObjects,
    )> = std::sync::LazyLock::new(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let policies = crate::model::policy::load_dir(&root.join("policies")).expect("shipped policies load");
        let text = std::fs::read_to_string(root.join("examples/cluster/namespaces.yaml")).expect("namespaces");
        let namespaces = crate::model::namespaces::from_manifests("namespaces.yaml", &text).expect("namespaces parse");
        let mut claims = crate::model::dra::ClaimObjects::new("not found");
        let template = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "two-gpus", "namespace": "vision"},
                "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}});
        let claim = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "shared", "namespace": "vision"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}});
        assert!(claims.insert(&template, "vision") && claims.insert(&claim, "vision"));
        (policies, namespaces, claims)
    });

    /// Every Pod the API server sent in the captured admission reviews (with managedFields,
    /// status and all) makes the same record from both decodings.
    #[test]
    fn captured_pods_make_the_same_record_from_both_decodings() {
        let mut pods = 0;
        for (_, review) in crate::model::fixtures::reviews() {
            for side in ["object", "oldObject"] {
                let Some(object) = review["request"].get(side).filter(|o| o["kind"] == "Pod") else { continue };
                let (full, slim) = both_records(object);
                assert!(full.is_some(), "a captured pod makes a record");
                assert_eq!(full, slim);
                pods += 1;
            }
        }
        assert!(pods >= 10, "only {pods} captured pods");
    }

    /// One field a record reads, present or not, in some form: the menu the property draws from.
    fn fragment() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::json;
        prop_oneof![
            Just(json!({"metadata": {"namespace": "vision"}})),
            Just(json!({"metadata": {"namespace": "ml-research"}})),
            Just(
                json!({"metadata": {"labels": {"allot.dev/gang-name": "g", "team": "x"}, "annotations": {"allot.dev/gang-size": "4"}}})
            ),
            Just(
                json!({"metadata": {"labels": {"jobset.sigs.k8s.io/jobset-name": "js", "batch.kubernetes.io/job-completion-index": "1"}}})
            ),
            Just(
                json!({"metadata": {"labels": {"leaderworkerset.sigs.k8s.io/name": "l", "leaderworkerset.sigs.k8s.io/worker-index": "0"}}})
            ),
            Just(
                json!({"metadata": {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "o", "controller": true}]}})
            ),
            Just(
                json!({"metadata": {"ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "p", "uid": "o"}]}})
            ),
            Just(
                json!({"metadata": {"annotations": {"allot.dev/gang-released": "2026-11-26T10:00:00Z", "allot.dev/arrival": "2026-11-26T10:00:00.123456789Z"}}})
            ),
            Just(json!({"metadata": {"deletionTimestamp": "2026-11-26T10:05:00Z"}})),
            Just(
                json!({"metadata": {"managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]}})
            ),
            Just(
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "2"}}}]}})
            ),
            Just(
                json!({"spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "3"}}, "env": [{"name": "A", "value": "b"}]}]}})
            ),
            Just(
                json!({"spec": {"initContainers": [{"name": "s", "restartPolicy": "Always", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}})
            ),
            Just(json!({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]}})),
            Just(json!({"spec": {"overhead": {"cpu": "250m"}}})),
            Just(json!({"spec": {"resources": {"requests": {"cpu": "64"}, "limits": {"memory": "8Gi"}}}})),
            Just(json!({"spec": {"nodeName": "node-1"}})),
            Just(json!({"spec": {"nodeSelector": {"node-type": "my-precious"}}})),
            Just(
                json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}]}}}}})
            ),
            Just(
                json!({"spec": {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "t"}]}}}})
            ),
            Just(
                json!({"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}})
            ),
            Just(json!({"spec": {"priority": 1000, "priorityClassName": "high", "schedulerName": "volcano"}})),
            Just(
                json!({"spec": {"schedulingGates": [{"name": "x.io/other"}, {"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]}})
            ),
            Just(json!({"spec": {"schedulingGroup": {"podGroupName": "pg"}}})),
            Just(
                json!({"spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "two-gpus"}, {"name": "s", "resourceClaimName": "shared"}]}})
            ),
            Just(json!({"spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "gone"}]},
                        "status": {"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "made"}]}})),
            Just(json!({"status": {"phase": "Succeeded"}})),
            Just(
                json!({"status": {"conditions": [{"type": "allot.dev/GangReady", "status": "False", "reason": "Waiting", "message": "1/4"},
                                                  {"type": "allot.dev/QuotaReady", "status": "True"}]}})
            ),
            Just(
                json!({"status": {"containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 3}]}})
            ),
        ]
    }

    proptest::proptest! {
        /// Any combination of the fields records read (and some they do not) makes the same
        /// record from the slim decoding as from the whole Pod.
        #[test]
        fn any_pod_makes_the_same_record_from_both_decodings(fragments in proptest::collection::vec(fragment(), 0..8)) {
            let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "vision", "uid": "u", "creationTimestamp": "2026-11-26T10:00:00Z"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}});
            for f in &fragments {
                json_patch::merge(&mut pod, f);
            }
            let (full, slim) = both_records(&pod);
            proptest::prop_assert_eq!(full, slim);
        }
    }
}
