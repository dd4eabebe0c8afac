//! Cohorts: teams that lend each other their unused quota. A Team's `quota.cohort` makes its
//! `limits` its *nominal* quota; `borrowingLimit` bounds what it may use beyond that, from the
//! cohort's unused quota, and `lendingLimit` how much of its own unused nominal the others may
//! take (the rest it keeps: its *guaranteed* part).
//!
//! The arithmetic, per resource, is Kueue's:
//! - a team's *guaranteed* part is its nominal minus what it lends (nothing kept when it sets no
//!   lending limit);
//! - the cohort's *pool* is what its teams lend, together;
//! - a team's usage above its guaranteed part is *drawn* from the pool; the teams' draws
//!   together never pass the pool, and a team never uses more than its nominal plus its
//!   borrowing limit.
//!
//! So a cohort never uses more than its teams' nominal quotas together, and what a team keeps
//! is never lent. A team's *borrowed* amount is what it uses beyond its nominal.
//!
//! Amounts are kept in cohort units, `1 / (1e9 × D)` of a resource, where `D` is the least
//! common multiple of its teams' charge denominators ([`super::quota`]), so teams that weigh MIG
//! slices differently still add up exactly.

use std::collections::{BTreeMap, HashMap};

pub use super::quota::CohortTerms;
use super::quota::{Charge, Quota, show_units};
use super::{QuotaMode, Team};

/// One team of a cohort, in cohort units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub team: String,
    /// Cohort units per charge unit of the team's quota.
    pub scale: i128,
    pub nominal: Charge,
    /// What the team keeps for itself: its nominal minus what it lends.
    pub guaranteed: Charge,
    /// The most it may use beyond its nominal; a resource absent: no bound but the cohort's.
    pub borrowing_limit: Charge,
    pub weight: (i128, i128),
    /// The team's quota: what charges its usage (its own units, weights and equivalents).
    pub quota: Quota,
}

/// A compiled cohort: its teams in name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cohort {
    pub name: String,
    /// Cohort units are `1 / (1e9 × denominator)` of a resource.
    pub denominator: i128,
    pub members: Vec<Member>,
}

/// Every cohort of a policy set, and which team is in which.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cohorts {
    by_name: BTreeMap<String, Cohort>,
    of_team: HashMap<String, String>,
}

impl Cohort {
    /// The resources its teams limit (the same for every team: checked at load).
    pub fn resources(&self) -> impl Iterator<Item = &String> {
        self.members.first().into_iter().flat_map(|m| m.nominal.keys())
    }
}

impl Cohorts {
    /// The cohort `team` is in.
    pub fn of_team(&self, team: &str) -> Option<&Cohort> {
        self.by_name.get(self.of_team.get(team)?)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Cohort> {
        self.by_name.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The cohorts of `teams`, or what cannot hold, each problem prefixed by its team's location
/// (`location(team)`): teams of one cohort must limit the same resources (or their usage
/// could not be compared) and share one quota mode (a cohort borrows either at admission,
/// `Deny`, or as the controller releases queued pods, `Queue`).
pub fn compile(teams: &[Team], location: &dyn Fn(&str) -> String) -> Result<Cohorts, Vec<String>> {
    let mut grouped: BTreeMap<&str, Vec<(&Team, &Quota, &CohortTerms)>> = BTreeMap::new();
    for team in teams {
        if let Some(quota) = &team.quota
            && let Some(terms) = &quota.cohort
        {
            grouped.entry(terms.cohort.as_str()).or_default().push((team, quota, terms));
        }
    }
    let mut problems = Vec::new();
    let mut cohorts = Cohorts::default();
    for (name, mut teams) in grouped {
        teams.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let first = teams[0];
        for (team, quota, _) in &teams {
            if quota.mode != first.1.mode {
                problems.push(format!(
                    "{}: spec.quota.mode: the teams of cohort {name} must share one quota mode \
                     (team {} is {}; team {} is {})",
                    location(&team.name),
                    team.name,
                    mode_name(quota.mode),
                    first.0.name,
                    mode_name(first.1.mode)
                ));
            }
            if !quota.limits.keys().eq(first.1.limits.keys()) {
                problems.push(format!(
                    "{}: spec.quota.limits: the teams of cohort {name} must limit the same resources \
                     (team {} limits {}; team {} limits {})",
                    location(&team.name),
                    team.name,
                    names(quota),
                    first.0.name,
                    names(first.1)
                ));
            }
        }
        let denominator = teams.iter().try_fold(1i128, |d, (_, q, _)| {
            (d / gcd(d, q.denominator)).checked_mul(q.denominator).filter(|d| *d <= 1_000_000_000_000)
        });
        let Some(denominator) = denominator else {
            problems.push(format!(
                "{}: spec.quota: the weights of cohort {name}'s teams have denominators too large together",
                location(&first.0.name)
            ));
            continue;
        };
        let members = teams.iter().map(|(team, quota, terms)| member(team, quota, terms, denominator)).collect();
        for (team, _, _) in &teams {
            cohorts.of_team.insert(team.name.clone(), name.to_string());
        }
        cohorts.by_name.insert(name.to_string(), Cohort { name: name.to_string(), denominator, members });
    }
    if problems.is_empty() { Ok(cohorts) } else { Err(problems) }
}

fn mode_name(mode: QuotaMode) -> &'static str {
    match mode {
        QuotaMode::Deny => "mode: Deny",
        QuotaMode::Queue => "mode: Queue",
    }
}

fn names(quota: &Quota) -> String {
    quota.limits.keys().cloned().collect::<Vec<_>>().join(", ")
}

fn member(team: &Team, quota: &Quota, terms: &CohortTerms, denominator: i128) -> Member {
    let scale = denominator / quota.denominator;
    let scaled = |c: &Charge| -> Charge { c.iter().map(|(k, v)| (k.clone(), v.saturating_mul(scale))).collect() };
    let nominal = scaled(&quota.limits);
    let lending = scaled(&terms.lending_limit);
    let guaranteed = nominal
        .iter()
        .map(|(resource, n)| {
            let lends = lending.get(resource).copied().unwrap_or(*n).min(*n);
            (resource.clone(), n - lends)
        })
        .collect();
    Member {
        team: team.name.clone(),
        scale,
        nominal,
        guaranteed,
        borrowing_limit: scaled(&terms.borrowing_limit),
        weight: terms.weight,
        quota: quota.clone(),
    }
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

/// Why a team cannot take more from its cohort now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// It would borrow more than its borrowing limit.
    BorrowingLimit { resource: String, used: String, nominal: String, borrowed: String, limit: String, asked: String },
    /// The cohort has not enough unused quota. `within_nominal`: the team asks for what its
    /// nominal quota guarantees, and waits for what it lent to come back.
    Cohort {
        resource: String,
        used: String,
        nominal: String,
        borrowed: String,
        asked: String,
        unused: String,
        within_nominal: bool,
    },
}

impl Shortfall {
    /// Why a team's unit waits: `team vision uses 6 of 4 nvidia.com/gpu (2 borrowed from cohort
    /// research); this asks 1; the cohort has 0 unused`.
    pub fn message(&self, team: &str, cohort: &str) -> String {
        match self {
            Shortfall::BorrowingLimit { resource, used, nominal, borrowed, limit, asked } => format!(
                "team {team} uses {used} of {nominal} {resource} ({borrowed} borrowed from cohort {cohort}, \
                 borrowing limit {limit}); this asks {asked}"
            ),
            Shortfall::Cohort { resource, used, nominal, borrowed, asked, unused, within_nominal } => {
                let more = if *within_nominal {
                    format!(
                        "; this is within team {team}'s nominal quota, which is lent: Allot reclaims it, evicting \
                         borrowed work of cohort {cohort} past its minRuntime"
                    )
                } else {
                    String::new()
                };
                format!(
                    "team {team} uses {used} of {nominal} {resource} ({borrowed} borrowed from cohort {cohort}); \
                     this asks {asked}; the cohort has {unused} unused{more}"
                )
            }
        }
    }
}

mod usage;
pub use usage::{CohortUsage, Take};

#[cfg(test)]
mod tests;

/// An amount of cohort units as a resource quantity (`6`, `1.5`).
fn show(cohort: &Cohort, units: i128) -> String {
    show_units(units, cohort.denominator)
}
