//! The deny-mode recount read from the groups the watch keeps (issue 49): O(namespaces, their
//! pod shapes and gangs, the pods created in the last few seconds and the pending charges), not
//! a walk over every pod. [`recount_by_team`](super::recount_by_team) is the walk it replaces,
//! kept as the reference the property tests compare it with.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::ledger::{self, Folded, Recount, Sighting, counted_pairs};
use super::reconciler::{counted_pod, deny_team};
use crate::control::cluster::store::NamespaceFolds;
use crate::control::cluster::{ClusterView, PodRecord};
use crate::model::namespaces::{NamespaceLabels, TeamsByNamespace};
use crate::model::policy::quota::Quota;
use crate::model::policy::{PolicySet, Team};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;
use crate::model::tally::add_to;

// The store indexes pods by creation time for long enough to find every young one.
const _: () = assert!(ledger::FOLD_DELAY_SECS < crate::control::cluster::store::RECENT_SECS);

/// Each deny-mode team's recount at `now` (unix seconds), as [`super::recount_by_team`] walks
/// it, from the store's kept groups; `asked` names, per team, the pods of its pending charges,
/// the only pods the recount can then be asked for by name ([`Recount::knows`]).
pub fn recount_kept(
    view: &ClusterView<'_>,
    policies: &PolicySet,
    labels: &dyn NamespaceLabels,
    asked: &BTreeMap<String, Vec<(String, String)>>,
    now: i64,
) -> BTreeMap<String, Recount> {
    let mut out: BTreeMap<String, Recount> =
        policies.teams.iter().filter(|t| deny_team(t)).map(|t| (t.name.clone(), Recount::kept(now))).collect();
    if out.is_empty() {
        return out;
    }
    let mut teams = DenyTeams(TeamsByNamespace::new(policies, labels));
    let young_after = now - ledger::FOLD_DELAY_SECS;
    let mut young: HashMap<&str, Vec<&PodRecord>> = HashMap::new();
    for pod in view.created_after(young_after).filter(|p| !p.finished) {
        let Some((team, quota)) = teams.of(&pod.namespace) else { continue };
        if counted_pod(pod, quota).is_some()
            && let Some(recount) = out.get_mut(team.as_str())
        {
            recount.add_young();
        }
        young.entry(&pod.namespace).or_default().push(pod);
    }
    let claims = counted_claims_by_namespace(view, &mut teams, &young);
    for (namespace, folds) in view.namespace_folds() {
        let Some((team, quota)) = teams.of(namespace) else { continue };
        let Some(recount) = out.get_mut(team.as_str()) else { continue };
        let folded = match young.get(namespace) {
            None => fold(namespace, folds, quota, claims.get(namespace)),
            Some(pods) => {
                let mut folds = folds.clone();
                for pod in pods {
                    folds.delta(pod, -1);
                }
                fold(namespace, &folds, quota, claims.get(namespace))
            }
        };
        if folded.pods > 0 {
            recount.fold_namespace(folded);
        }
    }
    for (team, pods) in asked {
        let Some(recount) = out.get_mut(team.as_str()) else { continue };
        for (namespace, name) in pods {
            let sighting = view.pod(namespace, name).and_then(|pod| {
                let (owner, quota) = teams.of(namespace)?;
                (owner == team && counted_pod(pod, quota).is_some()).then_some(Sighting {
                    created: pod.created,
                    finished: pod.finished,
                    young: !pod.finished && pod.created > young_after,
                })
            });
            recount.sighted(namespace, name, sighting);
        }
    }
    out
}

/// Each namespace's deny-mode team and its quota, looked up once.
struct DenyTeams<'p>(TeamsByNamespace<'p>);

impl<'p> DenyTeams<'p> {
    fn of(&mut self, namespace: &str) -> Option<(&'p String, &'p Quota)> {
        let team: &'p Team = self.0.get(namespace).filter(|t| deny_team(t))?;
        Some((&team.name, team.quota.as_ref()?))
    }
}

/// The shared claims each deny-mode namespace's foldable pods hold that its quota counts, with
/// their counted devices: those of the first holder by name that is not too young to fold.
fn counted_claims_by_namespace(
    view: &ClusterView<'_>,
    teams: &mut DenyTeams<'_>,
    young: &HashMap<&str, Vec<&PodRecord>>,
) -> HashMap<String, Vec<(String, ResourceList)>> {
    let young: HashSet<(&str, &str)> = young.values().flatten().map(|p| (&*p.namespace, &*p.name)).collect();
    let mut out: HashMap<String, Vec<(String, ResourceList)>> = HashMap::new();
    for (namespace, claim, mut holders) in view.shared_claims() {
        let Some((_, quota)) = teams.of(namespace) else { continue };
        let Some((_, devices)) = holders.find(|(pod, _)| !young.contains(&(namespace, *pod))) else { continue };
        let counted = counted_pairs(quota, devices.iter().map(|(k, v)| (&**k, *v)));
        if !counted.is_empty() {
            out.entry(namespace.to_string()).or_default().push((claim.to_string(), counted));
        }
    }
    out
}

/// What the ledger folds of one namespace's groups under `quota`: the walk's [`Folded`], built
/// from the groups (a plain group counts when its shape asks or holds something the quota
/// counts; gang members always count).
fn fold(
    namespace: &str,
    folds: &NamespaceFolds,
    quota: &Quota,
    claims: Option<&Vec<(String, ResourceList)>>,
) -> Folded {
    let mut f = Folded { namespace: namespace.to_string(), ..Folded::default() };
    for (shape, group) in &folds.plain {
        let asks = shape.resources.iter().any(|r| quota.counts_resource(r));
        let holds = shape.claims.iter().any(|(_, devices)| devices.iter().any(|r| quota.counts_resource(r)));
        if !(asks || holds) {
            continue;
        }
        f.pods = f.pods.saturating_add(group.pods);
        let requests: ResourceList = shape
            .resources
            .iter()
            .zip(&group.sums)
            .filter(|(r, _)| quota.counts_resource(r))
            .map(|(r, sum)| (r.to_string(), Quantity::from_nanos(*sum)))
            .collect();
        add_to(&mut f.plain, &requests, 1);
    }
    for (gang, shapes) in &folds.gangs {
        let members = f.gangs.entry(gang.clone()).or_default();
        for ((requests, size), (count, terminating)) in shapes {
            let counted = counted_pairs(quota, requests.iter().map(|(k, v)| (&**k, *v)));
            let slot = members.entry((counted, *size)).or_default();
            *slot = (slot.0.saturating_add(*count), slot.1.saturating_add(*terminating));
            f.pods = f.pods.saturating_add(*count);
        }
    }
    f.claims = claims.into_iter().flatten().cloned().collect();
    f
}

#[cfg(test)]
#[path = "kept_tests.rs"]
mod tests;
