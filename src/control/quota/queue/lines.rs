//! Deciding queues that share quota: one team's line alone, or the lines of a cohort's teams
//! together. Each line keeps its strict order; across a cohort's lines, the next unit to go is
//! the one that borrows nothing (highest priority, then earliest), else the one whose team's
//! share of the cohort would be smallest after it (its borrowed amount over what the cohort
//! lends, divided by its `weight`). A unit that cannot go stops its own line only.

use std::cmp::Ordering;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use super::{ASSEMBLING, BEHIND, QueuedUnit, Unit};
use crate::control::cluster::ClusterView;
use crate::control::quota::reclaim::Reclaimer;
use crate::model::policy::cohort::{CohortUsage, Shortfall, Take};
use crate::model::policy::quota::{Charge, Quota, add};
use crate::model::resources::ResourceList;
use crate::model::tally::add_to;

/// One team's queue as a pass goes through it.
pub(super) struct Line<'p> {
    pub(super) team: &'p str,
    pub(super) quota: &'p Quota,
    /// Its units not decided yet, in queue order.
    pub(super) units: VecDeque<(String, Unit)>,
    /// What the team uses (charge units), releases of this pass included.
    pub(super) used: Charge,
    /// Set once a unit cannot go: everything behind it waits (strict order).
    blocked_by: Option<String>,
    /// Units ahead that hold the queue (an incomplete gang holds nothing).
    ahead: usize,
    pub(super) decided: Vec<QueuedUnit>,
    /// The unit that stops the line when it asks for quota within the team's nominal quota
    /// that is lent out: what a reclaim would make room for.
    pub(super) reclaimer: Option<Reclaimer>,
}

impl<'p> Line<'p> {
    pub(super) fn new(team: &'p str, quota: &'p Quota, units: VecDeque<(String, Unit)>, used: Charge) -> Line<'p> {
        Line { team, quota, units, used, blocked_by: None, ahead: 0, decided: Vec::new(), reclaimer: None }
    }
}

/// What shared state the lines of one group decide against.
pub(super) struct Group<'v, 'c> {
    pub(super) view: &'v ClusterView<'v>,
    /// Shared claims counted already: named by an admitted pod, or by a unit released earlier
    /// in this pass.
    pub(super) claimed: &'v mut HashSet<(Arc<str>, Arc<str>)>,
    /// The cohort the lines' teams are in.
    pub(super) cohort: Option<CohortUsage<'c>>,
}

/// How the head of a line fares now.
enum Outcome {
    /// It waits; `holds`: it stops its line (not an incomplete gang, not one that never fits);
    /// `reclaims`: for quota within its team's nominal quota, lent out.
    Waits {
        message: String,
        holds: bool,
        reclaims: bool,
    },
    Goes {
        take: Take,
        share: f64,
    },
}

impl<'c> Group<'_, 'c> {
    /// The unit's charge with the shared claims nobody counts yet.
    fn charge_of(&self, quota: &Quota, unit: &Unit) -> Charge {
        let mut unclaimed = ResourceList::new();
        for (id, devices) in &unit.claims {
            if !self.claimed.contains(id) && !self.view.claim_held_outside_queue(&id.0, &id.1) {
                add_to(&mut unclaimed, devices, 1);
            }
        }
        let mut charge = unit.charge.clone();
        add(&mut charge, &quota.charge(&unclaimed));
        charge
    }

    fn outcome(&self, line: &Line<'_>, unit: &Unit, charge: &Charge) -> Outcome {
        let team = line.team;
        // Its gated members, or all its present members when some need no quota gate.
        let present = unit.present.max(u32::try_from(unit.members.len()).unwrap_or(u32::MAX));
        let waits = |message: String, holds| Outcome::Waits { message, holds, reclaims: false };
        if let Some(n) = unit.size.filter(|n| present < *n) {
            // A gang is charged whole: it waits for all its members, and until then it holds up
            // no one (a gang that never assembles must not stall its team).
            return waits(
                format!(
                    "{ASSEMBLING}{present}/{n} members; charged whole once all exist (meanwhile it holds up no one)"
                ),
                false,
            );
        }
        // More than the team could ever use: it can never go, and a strict queue would hold
        // every later unit of the team behind it for ever.
        let never = match &self.cohort {
            Some(cohort) => cohort.never_fits(team, charge).map(|(resource, asked, most)| {
                format!("{asked} {resource}, more than team {team} can use in cohort {} ({most})", cohort.cohort().name)
            }),
            None => line.quota.exceeded(&Charge::new(), charge).map(|never| {
                format!("{} {}, more than team {team}'s whole quota ({})", never.asked, never.resource, never.limit)
            }),
        };
        if let Some(never) = never {
            return waits(
                format!(
                    "asks {never}: it is never released (meanwhile it holds up no one); delete it, or raise the quota"
                ),
                false,
            );
        }
        if let Some(first) = &line.blocked_by {
            return waits(format!("{BEHIND}{} earlier pod(s) or gang(s) of team {team}: {first}", line.ahead), true);
        }
        match &self.cohort {
            Some(cohort) => match cohort.check(team, charge) {
                Ok(take) => Outcome::Goes { take, share: if take.borrows { cohort.share(team, charge) } else { 0.0 } },
                Err(short) => Outcome::Waits {
                    message: short.message(team, &cohort.cohort().name),
                    holds: true,
                    reclaims: matches!(*short, Shortfall::Cohort { within_nominal: true, .. }),
                },
            },
            None => match line.quota.exceeded(&line.used, charge) {
                Some(exceeded) => waits(format!("team {team} {exceeded}; this asks {}", exceeded.asked), true),
                None => Outcome::Goes { take: Take { borrows: false }, share: 0.0 },
            },
        }
    }

    /// Decides every unit of `lines` (the lines of one team, or of one cohort's teams); returns
    /// the cohort's usage once the pass's releases are counted.
    pub(super) fn decide(mut self, lines: &mut [Line<'_>]) -> Option<CohortUsage<'c>> {
        loop {
            // The best head that can go: (line, rank, its charge).
            let mut best: Option<(usize, Rank, Charge)> = None;
            for (i, line) in lines.iter_mut().enumerate() {
                while let Some((_, unit)) = line.units.front() {
                    let charge = self.charge_of(line.quota, unit);
                    match self.outcome(line, unit, &charge) {
                        Outcome::Waits { message, holds, reclaims } => {
                            let Some((key, unit)) = line.units.pop_front() else { break };
                            if reclaims && line.blocked_by.is_none() {
                                let first_member = unit.members.first().map(|m| (m.namespace.clone(), m.pod.clone()));
                                line.reclaimer =
                                    Some(Reclaimer { unit: key.clone(), charge: charge.clone(), first_member });
                            }
                            if holds {
                                line.blocked_by.get_or_insert_with(|| message.clone());
                                line.ahead += 1;
                            }
                            line.decided.push(queued(key, unit, charge, Some(message), None));
                        }
                        Outcome::Goes { take, share } => {
                            let rank =
                                Rank { borrows: take.borrows, share, priority: unit.priority, order: unit.order };
                            if best.as_ref().is_none_or(|(_, b, _)| rank.cmp(b) == Ordering::Less) {
                                best = Some((i, rank, charge));
                            }
                            break;
                        }
                    }
                }
            }
            let Some((i, rank, charge)) = best else { return self.cohort };
            let line = &mut lines[i];
            let Some((key, unit)) = line.units.pop_front() else { return self.cohort };
            add(&mut line.used, &charge);
            let borrowed_from = match &mut self.cohort {
                Some(cohort) => {
                    cohort.take(line.team, &charge);
                    rank.borrows.then(|| cohort.cohort().name.clone())
                }
                None => None,
            };
            self.claimed.extend(unit.claims.keys().cloned());
            line.decided.push(queued(key, unit, charge, None, borrowed_from));
        }
    }
}

fn queued(key: String, unit: Unit, charge: Charge, waits: Option<String>, borrowed_from: Option<String>) -> QueuedUnit {
    QueuedUnit { key, priority: unit.priority, members: unit.members, charge, size: unit.size, waits, borrowed_from }
}

/// The order heads of a cohort's lines go in: what borrows nothing first, then the smallest
/// share, then the highest priority, then the earliest arrival. Between lines of equal rank,
/// the first line (team name order) goes.
#[derive(Debug, Clone, Copy)]
struct Rank {
    borrows: bool,
    share: f64,
    priority: i32,
    order: (i64, i64),
}

impl Rank {
    fn cmp(&self, other: &Rank) -> Ordering {
        self.borrows
            .cmp(&other.borrows)
            .then(self.share.total_cmp(&other.share))
            .then(other.priority.cmp(&self.priority))
            .then(self.order.cmp(&other.order))
    }
}
