//! A cohort's usage as one pass decides over it: what each team uses, borrows and lends,
//! whether a team may take more ([`CohortUsage::check`]), and the fair-share order of
//! borrowers ([`CohortUsage::share`]). Pure arithmetic over cohort units.

use std::collections::BTreeMap;

use super::{Cohort, Shortfall, show};
use crate::model::policy::quota::Charge;

/// What each team of one cohort uses, in cohort units.
#[derive(Debug, Clone)]
pub struct CohortUsage<'c> {
    cohort: &'c Cohort,
    /// By member index.
    used: Vec<Charge>,
}

/// What taking a charge means for its team.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Take {
    /// The team then uses more than its nominal quota of some resource.
    pub borrows: bool,
}

pub(super) fn at(c: &Charge, resource: &str) -> i128 {
    c.get(resource).copied().unwrap_or(0)
}

impl<'c> CohortUsage<'c> {
    /// `used_of(team)`: what the team uses, in its own quota's charge units.
    pub fn new(cohort: &'c Cohort, used_of: &mut dyn FnMut(&str) -> Option<Charge>) -> CohortUsage<'c> {
        let used =
            cohort.members.iter().map(|m| used_of(&m.team).map(|c| scaled(m.scale, &c)).unwrap_or_default()).collect();
        CohortUsage { cohort, used }
    }

    pub fn cohort(&self) -> &'c Cohort {
        self.cohort
    }

    fn index(&self, team: &str) -> Option<usize> {
        self.cohort.members.iter().position(|m| m.team == team)
    }

    /// What `team` uses.
    pub fn used(&self, team: &str) -> Charge {
        self.index(team).map(|i| self.used[i].clone()).unwrap_or_default()
    }

    /// What `team` uses beyond its nominal quota.
    pub fn borrowed(&self, team: &str) -> Charge {
        let Some(i) = self.index(team) else { return Charge::new() };
        let m = &self.cohort.members[i];
        self.cohort
            .resources()
            .map(|r| (r.clone(), (at(&self.used[i], r) - at(&m.nominal, r)).max(0)))
            .filter(|(_, v)| *v > 0)
            .collect()
    }

    /// What member `i` draws from the pool of `resource`.
    fn drawn(&self, i: usize, resource: &str) -> i128 {
        (at(&self.used[i], resource) - at(&self.cohort.members[i].guaranteed, resource)).max(0)
    }

    /// What the teams lend of `resource`, together.
    pub fn pool(&self, resource: &str) -> i128 {
        self.cohort.members.iter().map(|m| at(&m.nominal, resource) - at(&m.guaranteed, resource)).sum()
    }

    fn drawn_total(&self, resource: &str) -> i128 {
        (0..self.used.len()).map(|i| self.drawn(i, resource)).sum()
    }

    /// What is left of the pool, per resource (never below zero: a policy change can leave a
    /// cohort above its new quotas).
    pub fn unused(&self) -> Charge {
        self.cohort.resources().map(|r| (r.clone(), (self.pool(r) - self.drawn_total(r)).max(0))).collect()
    }

    /// Who lends what borrowers use: the borrowed total of each resource, attributed to the
    /// teams with unused lendable quota in name order.
    pub fn lent(&self) -> BTreeMap<String, Charge> {
        let mut out: BTreeMap<String, Charge> = BTreeMap::new();
        for r in self.cohort.resources() {
            let mut owed: i128 = (0..self.used.len())
                .map(|i| (at(&self.used[i], r) - at(&self.cohort.members[i].nominal, r)).max(0))
                .sum();
            for (i, m) in self.cohort.members.iter().enumerate() {
                let kept = at(&self.used[i], r).max(at(&m.guaranteed, r));
                let spare = (at(&m.nominal, r) - kept).max(0).min(owed);
                if spare > 0 {
                    out.entry(m.team.clone()).or_default().insert(r.clone(), spare);
                    owed -= spare;
                }
            }
        }
        out
    }

    /// `team`'s share of the cohort after taking `charge` (its own units): the largest, over
    /// the resources, of what it borrows over what the cohort lends, divided by its weight.
    /// Borrowers with the smallest share go first.
    pub fn share(&self, team: &str, charge: &Charge) -> f64 {
        let Some(i) = self.index(team) else { return f64::INFINITY };
        let m = &self.cohort.members[i];
        let charge = scaled(m.scale, charge);
        let (num, den) = m.weight;
        self.cohort
            .resources()
            .filter_map(|r| {
                let pool = self.pool(r);
                let borrowed = (at(&self.used[i], r) + at(&charge, r) - at(&m.nominal, r)).max(0);
                (pool > 0).then(|| borrowed as f64 / pool as f64 * den as f64 / num as f64)
            })
            .fold(0.0, f64::max)
    }

    /// Whether `team` may take `charge` (its own units) now, and whether it then borrows.
    pub fn check(&self, team: &str, charge: &Charge) -> Result<Take, Box<Shortfall>> {
        self.check_with(team, charge, false)
    }

    /// [`CohortUsage::check`] at admission (`mode: Deny`): what a team asks within its nominal
    /// quota is never refused for what it lent (its pod is admitted, and Allot's controller
    /// reclaims the loan, evicting borrowed work); only borrowing is bounded.
    pub fn check_admission(&self, team: &str, charge: &Charge) -> Result<Take, Box<Shortfall>> {
        self.check_with(team, charge, true)
    }

    fn check_with(&self, team: &str, charge: &Charge, lender_waits: bool) -> Result<Take, Box<Shortfall>> {
        let Some(i) = self.index(team) else { return Ok(Take { borrows: false }) };
        let m = &self.cohort.members[i];
        let charge = scaled(m.scale, charge);
        let mut borrows = false;
        for (r, asked) in charge.iter().filter(|(_, v)| **v != 0) {
            let used = at(&self.used[i], r);
            let after = used.saturating_add(*asked);
            let nominal = at(&m.nominal, r);
            let borrowed = (used - nominal).max(0);
            borrows |= after > nominal;
            if let Some(limit) = m.borrowing_limit.get(r)
                && after - nominal > *limit
            {
                return Err(Box::new(Shortfall::BorrowingLimit {
                    resource: r.clone(),
                    used: self.show(used),
                    nominal: self.show(nominal),
                    borrowed: self.show(borrowed),
                    limit: self.show(*limit),
                    asked: self.show(*asked),
                }));
            }
            if lender_waits && after <= nominal {
                continue;
            }
            let drawn_after = (after - at(&m.guaranteed, r)).max(0);
            let total = self.drawn_total(r);
            if total - self.drawn(i, r) + drawn_after > self.pool(r) {
                return Err(Box::new(Shortfall::Cohort {
                    resource: r.clone(),
                    used: self.show(used),
                    nominal: self.show(nominal),
                    borrowed: self.show(borrowed),
                    asked: self.show(*asked),
                    unused: self.show((self.pool(r) - total).max(0)),
                    within_nominal: after <= nominal,
                }));
            }
        }
        Ok(Take { borrows })
    }

    /// Counts `charge` (its own units) as used by `team`.
    pub fn take(&mut self, team: &str, charge: &Charge) {
        self.add(team, charge, 1);
    }

    /// Counts `charge` (its own units) as no longer used by `team` (work that ends).
    pub fn give_back(&mut self, team: &str, charge: &Charge) {
        self.add(team, charge, -1);
    }

    fn add(&mut self, team: &str, charge: &Charge, sign: i128) {
        let Some(i) = self.index(team) else { return };
        let charge = scaled(self.cohort.members[i].scale, charge);
        for (r, v) in charge {
            let slot = self.used[i].entry(r).or_default();
            *slot = slot.saturating_add(v.saturating_mul(sign));
        }
    }

    /// Whether `team` uses more than its nominal quota of some resource `charge` asks.
    pub fn borrows_any_of(&self, team: &str, charge: &Charge) -> bool {
        let borrowed = self.borrowed(team);
        charge.iter().any(|(r, v)| *v > 0 && borrowed.contains_key(r))
    }

    /// The first resource of which `charge` asks more than `team` could ever use in this
    /// cohort (its nominal plus what it may borrow, at most all the others lend), as
    /// (resource, asked, most).
    pub fn never_fits(&self, team: &str, charge: &Charge) -> Option<(String, String, String)> {
        let i = self.index(team)?;
        let m = &self.cohort.members[i];
        let charge = scaled(m.scale, charge);
        charge.iter().find_map(|(r, asked)| {
            let borrowable = self.pool(r) - (at(&m.nominal, r) - at(&m.guaranteed, r));
            let borrowable = m.borrowing_limit.get(r).map_or(borrowable, |l| borrowable.min(*l));
            let most = at(&m.nominal, r) + borrowable.max(0);
            (*asked > most).then(|| (r.clone(), self.show(*asked), self.show(most)))
        })
    }

    /// An amount of cohort units as a quantity.
    pub fn show(&self, units: i128) -> String {
        show(self.cohort, units)
    }
}

fn scaled(scale: i128, c: &Charge) -> Charge {
    c.iter().map(|(k, v)| (k.clone(), v.saturating_mul(scale))).collect()
}
