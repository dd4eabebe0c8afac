//! The owners of inferred gangs the controller reads: one table (API group, version and kinds
//! per [`InferredKind`]) behind the size lookups, the hand-off to native PodGroups and the
//! `get` rules of the RBAC in `deploy/`.

use super::membership::InferredKind;

/// Where the owners of one kind of inferred gang live: the API group and version the controller
/// reads them from, and the Kubernetes kinds it accepts as owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerApi {
    pub kind: InferredKind,
    pub group: &'static str,
    pub version: &'static str,
    pub kinds: &'static [&'static str],
}

impl OwnerApi {
    /// The resource name of an owner kind (`PyTorchJob` → `pytorchjobs`).
    pub fn plural(&self, api_kind: &str) -> String {
        format!("{}s", api_kind.to_lowercase())
    }
}

/// The owners the controller GETs to size inferred gangs: the one table behind
/// [`super::controller::resolve_owner_sizes`] and the `get` rules of the RBAC in `deploy/` (`tests/deploy.rs`
/// checks that each entry is granted and that nothing else is).
pub const OWNER_APIS: &[OwnerApi] = &[
    OwnerApi { kind: InferredKind::Job, group: "batch", version: "v1", kinds: &["Job"] },
    OwnerApi { kind: InferredKind::JobSet, group: "jobset.x-k8s.io", version: "v1alpha2", kinds: &["JobSet"] },
    OwnerApi { kind: InferredKind::MPIJob, group: "kubeflow.org", version: "v2beta1", kinds: &["MPIJob"] },
    OwnerApi {
        kind: InferredKind::KubeflowJob,
        group: "kubeflow.org",
        version: "v1",
        kinds: &["PyTorchJob", "TFJob", "XGBoostJob", "JAXJob", "PaddleJob"],
    },
    OwnerApi {
        kind: InferredKind::LeaderWorkerSet,
        group: "leaderworkerset.x-k8s.io",
        version: "v1",
        kinds: &["LeaderWorkerSet"],
    },
];

/// The table entry for an inferred gang's owner, if its kind is one the controller reads.
pub fn owner_api(kind: InferredKind, api_kind: &str) -> Option<&'static OwnerApi> {
    OWNER_APIS.iter().find(|a| a.kind == kind && a.kinds.contains(&api_kind))
}
