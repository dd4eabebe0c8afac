//! The owners of inferred gangs the controller reads: one table (API group, version and kinds
//! per [`InferredKind`]) behind the size lookups ([`resolve_owner_sizes`]), the hand-off to
//! native PodGroups and the `get` rules of the RBAC in `deploy/`.

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

use crate::control::cluster::{ClusterState, Owner};
use crate::model::gang::membership::{InferredKind, OwnerGang};

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
/// [`resolve_owner_sizes`] and the `get` rules of the RBAC in `deploy/` (`tests/deploy.rs`
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

/// How many owners one pass reads at most. Each is a GET named by a tenant's pod (a label is
/// enough for a JobSet or a LeaderWorkerSet), and the pass decides for every gang only after
/// them: a tenant's flood of pods naming distinct owners must not hold those decisions up (the
/// hand-off to native PodGroups caps its calls per pass for the same reason). They go out
/// together, so a pass waits for about one round trip.
pub const LOOKUPS_PER_PASS: usize = 16;

/// Reads the size of inferred gangs from their owners, at most [`LOOKUPS_PER_PASS`] at once:
/// those never read first, then those read longest ago; an elastic owner is read again on
/// every pass (round: the instant the pass began) the cap allows, so a changed `parallelism` is
/// followed, never a stale size. An owner that is not there or declares no usable size waits
/// out a backoff before it is asked for again ([`crate::control::cluster::store::OWNER_RETRY_FIRST`]):
/// pods naming owners that do not exist cost a GET each per backoff, not one per pass. A read
/// that failed (the API server in trouble) is not held against the owner: it is asked for again
/// about a second later. True when a pass should follow soon: owners never read were left over,
/// or a read failed.
pub async fn resolve_owner_sizes(client: &kube::Client, state: &ClusterState, round: std::time::Instant) -> bool {
    let (due, left) = state.owners_to_resolve(round, LOOKUPS_PER_PASS);
    let failed = std::sync::atomic::AtomicBool::new(false);
    futures::stream::iter(due)
        .for_each_concurrent(LOOKUPS_PER_PASS, |(namespace, gang, owner)| {
            let failed = &failed;
            async move {
                match read_owner(client, &namespace, &gang, &owner).await {
                    Ok(declared) => {
                        state.owner_looked_up(&namespace, &gang, &owner, declared, std::time::Instant::now())
                    }
                    Err(()) => failed.store(true, std::sync::atomic::Ordering::Relaxed),
                }
            }
        })
        .await;
    left || failed.into_inner()
}

/// What the owner of inferred gang `gang` declares; `Ok(None)` when it is not there, of an
/// unknown kind or declares no usable size (said in the log: once per backoff), `Err` when the
/// read failed.
async fn read_owner(
    client: &kube::Client,
    namespace: &str,
    gang: &str,
    owner: &Owner,
) -> Result<Option<OwnerGang>, ()> {
    let Some(api) = owner_api(owner.kind, &owner.api_kind) else {
        // Only the kinds of the table are read (and granted by deploy/'s RBAC).
        tracing::warn!(%namespace, %gang, owner = %owner.name, kind = %owner.api_kind, "not a known owner kind for inferred gangs");
        return Ok(None);
    };
    let gvk = GroupVersionKind::gvk(api.group, api.version, &owner.api_kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &api.plural(&owner.api_kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    match api.get_opt(&owner.name).await {
        Ok(Some(obj)) => {
            let declared = crate::model::gang::membership::owner_gang(owner.kind, &obj.data);
            if declared.is_none() {
                tracing::warn!(%namespace, %gang, owner = %owner.name, "owner declares no usable size");
            }
            Ok(declared)
        }
        Ok(None) => {
            tracing::debug!(%namespace, %gang, owner = %owner.name, "owner not found (yet)");
            Ok(None)
        }
        Err(e) => {
            tracing::warn!(%namespace, %gang, owner = %owner.name, error = %e, "cannot read gang owner; retrying");
            Err(())
        }
    }
}
