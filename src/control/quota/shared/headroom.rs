//! A team's headroom in its shared ledger: the allowance this replica may grant alone between
//! rounds, and how each round resizes it from what the others committed.

use std::collections::HashSet;
use std::time::Instant;

use super::QuotaRequest;
use super::ledger::{self, Entry, Ledger};
use crate::model::policy::quota::Quota;
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;
use crate::model::tally::add_to;

use super::*;

/// Capacity this replica holds in one team's ledger ([`Allowance`]), and what it admitted from
/// it that the ledger does not show yet.
///
/// Invariant: `consumed ≤ cap ≤` the allowance the ledger holds for this replica, per resource.
/// A pod is admitted from it only when `consumed + its requests ≤ cap`; a round writes the
/// consumed pods as pending charges and the allowance as what was admitted meanwhile plus a new
/// grant, lowering `cap` first so that the invariant holds whichever copy the ledger ends with.
#[derive(Default)]
pub(super) struct Headroom {
    /// Most that may be consumed (limited resources, resource terms).
    pub(super) cap: ResourceList,
    /// Admitted from the allowance and not yet written as charges (`unsettled`, and what a round
    /// is writing).
    pub(super) consumed: ResourceList,
    pub(super) unsettled: Vec<(String, Entry)>,
    /// Keys of the pods in `consumed`: a re-sent admission is not charged twice.
    pub(super) keys: HashSet<String>,
    /// Admissions come from the allowance until then.
    pub(super) usable_until: Option<Instant>,
    /// The quota and pod (counted requests) the next grant is sized for: the last admission
    /// that went through a round.
    pub(super) sized_for: Option<(Quota, ResourceList)>,
    pub(super) last_used: Option<Instant>,
    /// The newest drain request seen (unix ms).
    pub(super) drain_seen: i64,
    /// A drain request came since the last round: give the allowance back, admit nothing from it.
    pub(super) drain_pending: bool,
    /// The ledger may hold an allowance of this replica.
    pub(super) may_hold: bool,
    /// The process is stopping: nothing is admitted from the allowance, nothing granted.
    pub(super) closing: bool,
}

/// What `request` counts under `quota`, when an allowance can hold it: something, and only
/// limited resources (a weighted one would need the weights to compare with the allowance).
pub(super) fn allowance_shape(quota: &Quota, request: &QuotaRequest<'_>) -> Option<ResourceList> {
    let counted = ledger::counted(quota, &request.requests);
    (!counted.is_empty() && counted.keys().all(|r| quota.limits.contains_key(r))).then_some(counted)
}

impl Headroom {
    /// A pod an allowance may admit: a plain pod (a gang member's charge depends on its gang),
    /// not a dry run, with a creationTimestamp (the leader folds it by its age).
    pub(super) fn may_serve(request: &QuotaRequest<'_>) -> bool {
        !request.dry_run && request.gang.is_none() && request.shared_claims.is_empty() && request.created != 0
    }

    /// Admits `request` from the allowance if it covers it.
    pub(super) fn admit(&mut self, quota: &Quota, request: &QuotaRequest<'_>, key: &str, now: Instant) -> bool {
        if !Headroom::may_serve(request)
            || self.drain_pending
            || self.closing
            || self.usable_until.is_none_or(|u| now >= u)
        {
            return false;
        }
        // Granted under another quota (a policy reload): a round decides.
        if self.sized_for.as_ref().is_none_or(|(q, _)| q != quota) {
            return false;
        }
        if self.keys.contains(key) {
            return true;
        }
        let Some(counted) = allowance_shape(quota, request) else { return false };
        let mut after = self.consumed.clone();
        add_to(&mut after, &counted, 1);
        if after.iter().any(|(r, q)| q.nanos() > self.cap.get(r).map_or(0, |c| c.nanos())) {
            return false;
        }
        self.consumed = after;
        self.unsettled.push((key.to_string(), Entry::of(request, counted, unix_now())));
        self.keys.insert(key.to_string());
        self.last_used = Some(now);
        true
    }

    /// Whether a round deciding `batch` may grant an allowance: the flusher's round (nothing
    /// to decide: it renews an allowance in use), or one deciding a pod an allowance could
    /// serve.
    pub(super) fn demands_allowance(batch: &[Waiting]) -> bool {
        batch.is_empty() || Headroom::servable(batch).next().is_some()
    }

    /// The admissions of `batch` an allowance could serve ([`Headroom::may_serve`]).
    pub(super) fn servable(batch: &[Waiting]) -> impl Iterator<Item = &Waiting> {
        batch.iter().filter(|w| Headroom::may_serve(&w.request.borrow()))
    }

    /// Takes note of the admissions a round is about to decide: those an allowance could have
    /// served keep it in use (`last_used`) and size the next grant (the last of them). Others
    /// (gang members, dry runs, shared claims) say nothing about plain pods to come: a burst of
    /// gang members alone must not keep granting this replica plain-pod capacity, which the
    /// members themselves then find set aside (deferred behind it, or refused at their deadline).
    pub(super) fn note_demand(&mut self, batch: &[Waiting], now: Instant) {
        let mut servable = Headroom::servable(batch).peekable();
        if servable.peek().is_some() {
            self.last_used = Some(now);
        }
        if let Some(w) = servable.last() {
            let request = w.request.borrow();
            if let Some(shape) = allowance_shape(&w.quota, &request) {
                self.sized_for = Some((w.quota.clone(), shape));
            }
        }
    }

    /// Starts a round: takes the pods to write as charges, and their sum.
    pub(super) fn start_round(&mut self) -> (Vec<(String, Entry)>, ResourceList) {
        let settling = std::mem::take(&mut self.unsettled);
        let mut sum = ResourceList::new();
        for (_, entry) in &settling {
            add_to(&mut sum, &entry.requests, 1);
        }
        (settling, sum)
    }

    /// What the allowance must still cover while `settled` is written as charges.
    pub(super) fn kept(&self, settled: &ResourceList) -> ResourceList {
        let mut kept = self.cap.clone();
        add_to(&mut kept, settled, -1);
        kept.retain(|_, q| q.nanos() > 0);
        kept
    }

    /// Stops admitting from the allowance beyond what is consumed already.
    pub(super) fn freeze(&mut self) {
        self.cap = self.consumed.clone();
    }

    /// The allowance for this round's write (`next` holds `kept` for it): what was admitted
    /// from it since the round started plus, when `may_grant` and the team is active, a grant of
    /// 1/[`GRANT_SHARE`] of what is free, in whole pods of the shape it is sized for. Lowers
    /// `cap` to what the write leaves.
    pub(super) fn resize(
        &mut self,
        next: &Ledger,
        kept: &ResourceList,
        settled: &ResourceList,
        may_grant: bool,
    ) -> ResourceList {
        let mut in_round = self.consumed.clone();
        add_to(&mut in_round, settled, -1);
        let active = self.last_used.is_some_and(|t| t.elapsed() < ALLOWANCE_IDLE);
        let grant = match &self.sized_for {
            Some((quota, shape)) if may_grant && active && !self.drain_pending && !self.closing => {
                let mut unused = kept.clone();
                add_to(&mut unused, &in_round, -1);
                let (free, unused) = (next.free(quota), quota.charge(&unused));
                let pods = quota
                    .charge(shape)
                    .iter()
                    .map(|(r, per)| {
                        let pool =
                            free.get(r).copied().unwrap_or(0).saturating_add(unused.get(r).copied().unwrap_or(0));
                        if *per > 0 { (pool / GRANT_SHARE / per).max(0) } else { 0 }
                    })
                    .min()
                    .unwrap_or(0)
                    .min(GRANT_MAX_PODS);
                let mut grant = ResourceList::new();
                add_to(&mut grant, shape, pods);
                grant
            }
            _ => ResourceList::new(),
        };
        let mut ours = in_round;
        add_to(&mut ours, &grant, 1);
        ours.retain(|_, q| q.nanos() > 0);
        let mut bound = ours.clone();
        add_to(&mut bound, settled, 1);
        self.cap = self
            .cap
            .iter()
            .filter_map(|(r, c)| Some((r.clone(), Quantity::from_nanos(c.nanos().min(bound.get(r)?.nanos())))))
            .collect();
        ours
    }

    /// The round's write went through (or had nothing to write): the ledger holds `ours`.
    pub(super) fn committed(
        &mut self,
        settling: &[(String, Entry)],
        settled: &ResourceList,
        ours: ResourceList,
        started: Instant,
    ) {
        add_to(&mut self.consumed, settled, -1);
        for (key, _) in settling {
            self.keys.remove(key);
        }
        self.may_hold = !ours.is_empty();
        self.cap = ours;
        self.usable_until = Some(started + ALLOWANCE_USABLE);
        self.drain_pending = false;
    }

    /// The round failed, perhaps after a write whose outcome is unknown: the charges are
    /// written again next time (a key written already is skipped), and nothing more is admitted
    /// from the allowance until a round succeeds (the ledger holds either the old allowance or
    /// the new one; both cover what was consumed).
    pub(super) fn failed(&mut self, settling: Vec<(String, Entry)>) {
        let mut all = settling;
        all.append(&mut self.unsettled);
        self.unsettled = all;
        self.freeze();
        self.may_hold = true;
    }

    /// A writer asked the holders to give their allowances back (unix ms). True when this
    /// replica holds one to give.
    pub(super) fn note_drain(&mut self, at: i64) -> bool {
        if at <= self.drain_seen {
            return false;
        }
        self.drain_seen = at;
        self.drain_pending = self.may_hold || !self.cap.is_empty();
        self.drain_pending
    }

    /// The flusher should run a round: charges to write, or an allowance to give back or renew.
    pub(super) fn wants_round(&self, now: Instant) -> bool {
        let idle = self.last_used.is_none_or(|t| now.duration_since(t) >= ALLOWANCE_IDLE);
        let renew = self.usable_until.is_none_or(|u| u.saturating_duration_since(now) < ALLOWANCE_RENEW);
        !self.unsettled.is_empty() || (self.may_hold && (self.drain_pending || idle || renew))
    }
}
