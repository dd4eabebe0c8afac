//! The parts of a [`PodRecord`] that take more than a field: its gang, and what its
//! ResourceClaims add to what it is counted for.

use super::*;

/// The gang a pod is a member of, as the record keeps it. Bound and foreign-managed members
/// keep their gang: they count towards its quorum.
pub(super) fn gang_ref(
    membership: Result<Option<membership::Membership>, membership::GangMetadataError>,
    facts: &PodFacts<'_>,
    spec: Option<&k8s_openapi::api::core::v1::PodSpec>,
    policies: &PolicySet,
    namespace: &str,
    team_name: Option<&str>,
) -> Option<Box<GangRef>> {
    let m = membership.ok().flatten()?;
    Some(Box::new(GangRef {
        native: m.source == Source::NativePodGroup,
        owner: match m.source {
            Source::Inferred(kind) => owner_of(facts, kind),
            Source::NativePodGroup => hand_off_owner(facts, policies, namespace, team_name),
            _ => None,
        },
        name: m.name,
        size: m.size,
        leader: membership::is_group_leader(facts),
        priority_class: spec.and_then(|s| s.priority_class_name.as_deref()).map(intern),
        scheduler_name: spec.and_then(|s| s.scheduler_name.as_deref()).map(intern),
        topology: facts.annotations.get(crate::model::policy::topology::TOPOLOGY_ANNOTATION).map(intern),
    }))
}

/// What the pod is counted for with its own claims' devices added, whether a claim it names
/// could not be found, and the shared claims it holds (counted once per claim).
pub(super) fn claim_accounting<'r>(
    pod: &Pod,
    namespace: &str,
    own_requests: &'r ResourceList,
    policies: &PolicySet,
    claims: &dyn crate::model::dra::ClaimSource,
) -> (std::borrow::Cow<'r, ResourceList>, bool, Option<Box<HeldClaims>>) {
    let mut counted = std::borrow::Cow::Borrowed(own_requests);
    let spec = pod.spec.as_ref();
    let Some(resource_claims) =
        spec.and_then(|s| s.resource_claims.as_ref()).filter(|c| !c.is_empty() && !policies.device_classes.is_empty())
    else {
        return (counted, false, None);
    };
    // Only the fields the claims are read from: no copy of the whole pod per watch event.
    // (The status names the claims made from templates: those are counted rather than the
    // templates, which can be deleted and made again smaller; see `dra::pod_demand`.)
    let claims_only = serde_json::json!({
        "metadata": {"uid": pod.metadata.uid},
        "spec": {"resourceClaims": resource_claims},
        "status": {"resourceClaimStatuses": pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref())},
    });
    let demand = crate::model::dra::pod_demand(&claims_only, namespace, &policies.device_classes, claims);
    let claims_unresolved = !demand.missing.is_empty();
    for (name, q) in demand.own_quota_resources() {
        let slot = counted.to_mut().entry(name).or_default();
        *slot = slot.saturating_add(q);
    }
    let mut held: Vec<HeldClaim> = demand
        .shared_quota_resources()
        .into_iter()
        .map(|(name, devices)| HeldClaim {
            name: Arc::from(name),
            devices: devices.iter().map(|(k, v)| (intern(k), *v)).collect(),
        })
        .collect();
    // A shared claim it names that is gone is still named (by its name alone, counting
    // nothing): a claim made again under that name is refused while the pod lives
    // (`validate::check_claim_create`), also after a restart of Allot.
    held.extend(
        demand
            .missing
            .iter()
            .filter(|m| m.kind == "ResourceClaim")
            .map(|m| HeldClaim { name: Arc::from(m.name.as_str()), devices: Box::new([]) }),
    );
    (counted, claims_unresolved, (!held.is_empty()).then(|| Box::new(HeldClaims(held))))
}
