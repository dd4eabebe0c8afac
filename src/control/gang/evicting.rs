//! The controller's evictions, around [`super::preemption::evict_whole`]: a pass's preemptions
//! for waiting gangs, and its reclaims of quota a cohort's teams lent
//! ([`crate::control::quota::reclaim`]), with their metrics, logs and marks (a victim evicted
//! is marked as being deleted, so the next pass neither counts it nor chooses it again).

use super::decision::{RunningPod, RunningUnit};
use super::metrics::{EvictedLabels, TeamLabels};
use super::preemption::{REFUSAL_RETRY_SECS, Stopped, evict_whole};
use crate::control::cluster::{ClusterState, PodUid};
use crate::control::quota::reclaim::{Memory as ReclaimMemory, Reclaim};

/// The Event reason on a lender's unit when a budget refused a reclaim's eviction.
pub const RECLAIM_REFUSED_REASON: &str = "ReclaimRefused";

/// Carries out a pass's preemptions ([`super::preemption::evict`]) and marks the victims
/// evicted as being deleted, so the next pass neither counts them as members nor chooses them
/// again; true when an eviction was refused.
pub(super) async fn preempt(
    evictor: &super::eviction::ApiEvictor<'_>,
    state: &ClusterState,
    memory: &mut super::preemption::Memory,
    preemptions: &[super::preemption::Preemption],
    now: i64,
) -> bool {
    use super::preemption::Outcome;
    let mut refused = false;
    for p in preemptions {
        let team = TeamLabels { team: p.team.clone().unwrap_or_default() };
        let outcome = super::preemption::evict(p, evictor, memory, now).await;
        let evicted = match &outcome {
            Outcome::Evicted { pods } => {
                evictor.metrics.preemptions.get_or_create(&team).inc();
                *pods
            }
            Outcome::Refused { unit, pod, why, evicted } => {
                tracing::warn!(gang = %p.preemptor, victim = %unit, %pod, %why, "preemption refused");
                let labels = EvictedLabels { team: team.team.clone(), reason: why.metric_label() };
                evictor.metrics.refused_evictions.get_or_create(&labels).inc();
                refused = true;
                *evicted
            }
        };
        for (unit, pod) in mark_evicted(evictor, state, &p.victims, evicted, "Preempted") {
            tracing::warn!(gang = %p.preemptor, victim = %unit.key, namespace = %pod.namespace, pod = %pod.name,
                priority = unit.priority, preemptor_priority = p.priority, "evicted for a higher-priority gang");
        }
    }
    refused
}

/// Carries out a pass's reclaims: each lender's victims evicted whole or not at all, told who
/// reclaimed what, and remembered (`memory`) so the next passes wait for them rather than
/// reclaim again. A refused unit is spared for [`REFUSAL_RETRY_SECS`], and the
/// lender's first member gets a Warning Event saying which budget refused; true when one was.
pub(super) async fn reclaim(
    evictor: &super::eviction::ApiEvictor<'_>,
    state: &ClusterState,
    memory: &mut ReclaimMemory,
    reclaims: &[Reclaim],
    now: i64,
) -> bool {
    use super::preemption::Evictor;
    let mut refused = false;
    for r in reclaims {
        let team = TeamLabels { team: r.team.clone() };
        let evicted = match evict_whole(&r.victims, evictor, |unit| r.victim_message(unit)).await {
            Ok(pods) => {
                evictor.metrics.reclaims.get_or_create(&team).inc();
                pods
            }
            Err(Stopped { unit, pod, why, evicted, .. }) => {
                tracing::warn!(team = %r.team, unit = %r.unit, victim = %unit.key, %pod, %why, "reclaim refused");
                let labels = EvictedLabels { team: r.team.clone(), reason: why.metric_label() };
                evictor.metrics.refused_evictions.get_or_create(&labels).inc();
                memory.spare(unit.key.clone(), now.saturating_add(REFUSAL_RETRY_SECS));
                if let Some((namespace, member)) = &r.first_member {
                    let message = format!(
                        "reclaiming quota lent by team {} by evicting {} was refused ({why}); it is spared for \
                         {REFUSAL_RETRY_SECS}s: choosing other borrowed work, or waiting",
                        r.team, unit.key
                    );
                    evictor.tell_preemptor(namespace, member, RECLAIM_REFUSED_REASON, &message).await;
                }
                refused = true;
                evicted
            }
        };
        for (unit, pod) in mark_evicted(evictor, state, &r.victims, evicted, "Reclaimed") {
            memory.evicted_for(&pod.namespace, &pod.name, pod.uid.clone(), now, Some(&r.unit));
            tracing::warn!(team = %r.team, cohort = %r.cohort, unit = %r.unit, victim = %unit.key,
                namespace = %pod.namespace, pod = %pod.name, "evicted to reclaim lent quota");
        }
    }
    refused
}

/// The first `evicted` pods of `victims` (the order they were evicted in), each marked as being
/// deleted and counted in `allot_evicted_pods_total` under `reason`.
fn mark_evicted<'u>(
    evictor: &super::eviction::ApiEvictor<'_>,
    state: &ClusterState,
    victims: &'u [RunningUnit],
    evicted: usize,
    reason: &'static str,
) -> Vec<(&'u RunningUnit, &'u RunningPod)> {
    let pods: Vec<_> = victims.iter().flat_map(|u| u.pods.iter().map(move |pod| (u, pod))).take(evicted).collect();
    for (unit, pod) in &pods {
        state.mark_deleting(&pod.namespace, &pod.name, pod.uid.as_ref().map(PodUid::to_string).as_deref(), true);
        let labels = EvictedLabels { team: unit.team.clone().unwrap_or_default(), reason };
        evictor.metrics.evicted_pods.get_or_create(&labels).inc();
    }
    pods
}
