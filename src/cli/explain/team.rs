//! `allot explain team NAME`: where a team's usage comes from (namespaces, heaviest pods), its
//! quota against what it uses, and its queue.

use std::collections::{BTreeMap, BTreeSet};

use super::report::{CohortReport, CohortTeamReport};
use super::{
    ExplainError, Inputs, LimitReport, NamespaceUsage, PodUsage, QuotaReport, TOP_PODS, TeamReport, queue_entries,
    visibility_notes,
};
use crate::control::cluster::usage::requests_by_state;
use crate::control::cluster::{ClusterView, UsageState};
use crate::model::namespaces::TeamsByNamespace;
use crate::model::policy::QuotaMode;
use crate::model::policy::cohort::CohortUsage;
use crate::model::policy::quota::{Charge, Quota};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

fn usage_state(state: UsageState) -> &'static str {
    match state {
        UsageState::Bound => "bound",
        UsageState::Pending => "pending",
        UsageState::GangGated => "gangGated",
        UsageState::QuotaQueued => "quotaQueued",
    }
}

pub(super) fn explain_team(inputs: &Inputs<'_>, name: &str) -> Result<TeamReport, ExplainError> {
    let Some(team) = inputs.policies.teams.iter().find(|t| t.name == name) else {
        let teams: Vec<&str> = inputs.policies.teams.iter().map(|t| t.name.as_str()).collect();
        return Err(ExplainError::TeamNotFound {
            name: name.into(),
            teams: if teams.is_empty() { "none".into() } else { teams.join(", ") },
        });
    };
    let quota = team.quota.as_ref();
    // The resources shown: accelerators, and whatever the quota counts.
    let shown = |resource: &str| {
        inputs.policies.accelerators.matches(resource)
            || quota.is_some_and(|q| q.limits.contains_key(resource) || q.equivalents.contains_key(resource))
    };
    let view = inputs.state.view();
    let mut teams = TeamsByNamespace::new(inputs.policies, inputs.labels);
    let (namespaces, by_namespace) = team_requests(&view, &mut teams, name, &shown);
    let top_pods = top_pods(&view, &mut teams, name, &shown, quota);
    let mut used = crate::control::cluster::usage::admitted_by_team(&requests_by_state(&view), &mut teams);
    drop(view);
    // Deny mode: what admission checks a new pod against, gangs and native groups charged whole
    // (a gang that is not whole yet holds its missing members' places), not the pods' sum.
    if let Some(q) = quota.filter(|q| q.mode == QuotaMode::Deny) {
        let (usage, _) = inputs.state.usage_where(&mut |ns| {
            crate::model::namespaces::team_of(inputs.policies, ns, inputs.labels).team.is_some_and(|t| t.name == name)
        });
        used.insert(team.name.as_str(), q.charge(&usage));
    }
    let quota_report = quota.map(|q| QuotaReport {
        cohort: cohort_report(inputs.policies, name, &used),
        ..quota_report(q, used.get(name))
    });
    let mut notes = visibility_notes(inputs, false);
    if quota.is_none() {
        notes.push(format!("team {name} has no quota"));
    }
    Ok(TeamReport {
        team: name.into(),
        namespaces: namespaces.into_iter().collect(),
        quota: quota_report,
        usage_by_namespace: namespace_usage(by_namespace),
        top_pods,
        queue: queue_entries(inputs, Some(name)),
        notes,
    })
}

/// The team's namespaces with pods, and what they request of the `shown` resources: where a
/// team's usage comes from, namespace by namespace.
fn team_requests(
    view: &ClusterView<'_>,
    teams: &mut TeamsByNamespace<'_>,
    name: &str,
    shown: &dyn Fn(&str) -> bool,
) -> (BTreeSet<String>, BTreeMap<String, ResourceList>) {
    let mut namespaces: BTreeSet<String> = BTreeSet::new();
    let mut by_namespace: BTreeMap<String, ResourceList> = BTreeMap::new();
    for ((ns, _state, resource), nanos) in requests_by_state(view) {
        if teams.get(&ns).is_none_or(|t| t.name != name) {
            continue;
        }
        namespaces.insert(ns.to_string());
        if !shown(&resource) {
            continue;
        }
        let slot = by_namespace.entry(ns.to_string()).or_default().entry(resource.to_string()).or_default();
        *slot = Quantity::from_nanos(slot.nanos().saturating_add(nanos));
    }
    (namespaces, by_namespace)
}

/// The team's [`TOP_PODS`] heaviest unfinished pods (by quota charge, else by raw amount): who
/// to ask first when the team is over its quota.
fn top_pods(
    view: &ClusterView<'_>,
    teams: &mut TeamsByNamespace<'_>,
    name: &str,
    shown: &dyn Fn(&str) -> bool,
    quota: Option<&Quota>,
) -> Vec<PodUsage> {
    let mut pods: Vec<(i128, PodUsage)> = Vec::new();
    for p in view.pods().filter(|p| !p.finished) {
        if teams.get(&p.namespace).is_none_or(|t| t.name != name) {
            continue;
        }
        let requests: ResourceList = p
            .requests
            .iter()
            .filter(|(r, q)| shown(r) && *q > Quantity::ZERO)
            .map(|(r, q)| (r.to_string(), *q))
            .collect();
        if requests.is_empty() {
            continue;
        }
        let weight: i128 = match quota {
            Some(q) => q.charge(&requests).values().sum(),
            None => requests.values().map(|q| q.nanos()).sum(),
        };
        pods.push((
            weight,
            PodUsage {
                namespace: p.namespace.to_string(),
                pod: p.name.to_string(),
                state: usage_state(UsageState::of(p)),
                requests: requests.iter().map(|(r, q)| (r.clone(), q.to_string())).collect(),
            },
        ));
    }
    pods.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| (&a.1.namespace, &a.1.pod).cmp(&(&b.1.namespace, &b.1.pod))));
    pods.into_iter().take(TOP_PODS).map(|(_, p)| p).collect()
}

/// The namespaces' requests, heaviest first, so the report leads with where usage comes from.
fn namespace_usage(by_namespace: BTreeMap<String, ResourceList>) -> Vec<NamespaceUsage> {
    let mut usage: Vec<(Quantity, NamespaceUsage)> = by_namespace
        .into_iter()
        .map(|(namespace, requests)| {
            let total = requests.values().fold(Quantity::ZERO, |a, q| a.saturating_add(*q));
            (
                total,
                NamespaceUsage {
                    namespace,
                    requests: requests.iter().map(|(r, q)| (r.clone(), q.to_string())).collect(),
                },
            )
        })
        .collect();
    usage.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.namespace.cmp(&b.1.namespace)));
    usage.into_iter().map(|(_, u)| u).collect()
}

/// `team`'s cohort: what each of its teams uses, borrows and lends, in fair-share order.
fn cohort_report(
    policies: &crate::model::policy::PolicySet,
    team: &str,
    used: &std::collections::HashMap<&str, Charge>,
) -> Option<CohortReport> {
    let cohort = policies.cohorts.of_team(team)?;
    let usage = CohortUsage::new(cohort, &mut |t| used.get(t).cloned());
    let lent = usage.lent();
    let shown = |c: Option<&Charge>| -> BTreeMap<String, String> {
        cohort.resources().map(|r| (r.clone(), usage.show(c.and_then(|c| c.get(r)).copied().unwrap_or(0)))).collect()
    };
    let mut teams: Vec<(f64, CohortTeamReport)> = cohort
        .members
        .iter()
        .map(|m| {
            let share = usage.share(&m.team, &Charge::new());
            let report = CohortTeamReport {
                team: m.team.clone(),
                nominal: shown(Some(&m.nominal)),
                used: shown(Some(&usage.used(&m.team))),
                borrowed: shown(Some(&usage.borrowed(&m.team))),
                lent: shown(lent.get(&m.team)),
                share: format!("{share:.3}"),
            };
            (share, report)
        })
        .collect();
    teams.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.team.cmp(&b.1.team)));
    Some(CohortReport {
        name: cohort.name.clone(),
        unused: shown(Some(&usage.unused())),
        teams: teams.into_iter().map(|(_, t)| t).collect(),
    })
}

/// Each limit against what the team uses (`used`, in charge units), in the quota's own units.
fn quota_report(q: &Quota, used: Option<&Charge>) -> QuotaReport {
    QuotaReport {
        mode: match q.mode {
            QuotaMode::Deny => "Deny".into(),
            QuotaMode::Queue => "Queue".into(),
        },
        limits: q
            .limits
            .iter()
            .map(|(resource, limit)| {
                let units = used.and_then(|c| c.get(resource)).copied().unwrap_or(0);
                LimitReport {
                    resource: resource.clone(),
                    limit: q.show(*limit),
                    used: q.show(units),
                    over: units > *limit,
                }
            })
            .collect(),
        cohort: None,
    }
}
