//! One round of a team's shared ledger: the admissions waiting are decided together on the
//! newest copy of the ledger and written in one optimistic update. A conflict (another replica,
//! or the reconciler, wrote first) starts the next try from the copy that won, with whatever
//! queued up meanwhile; a refusal is only ever given from a copy read in the round.
//!
//! The round is a loop of tries ([`SharedLedger::try_round`]): load a copy, decide, write. Each
//! step returns [`Try::Again`] to start over or [`Try::Done`] with the answers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::PostParams;

use super::ledger::{ALLOWANCE_TTL_SECS, Allowance, Charged, Entry, Ledger};
use super::{
    ALLOWANCE_REWRITE_SECS, Cached, DRAIN_HOLD_MS, DRAIN_LAST_CHANCE, Headroom, MISSING_LEDGER_RETRY, Refusal,
    SharedLedger, TeamBook, WATCH_GRACE, Waiting, is_conflict, revision, take_waiting, unavailable, unix_now_ms,
};
use crate::model::resources::ResourceList;

/// Each admission's answer, in the round's order.
type Decided = Vec<Result<Charged, Refusal>>;

/// Where a round stands between its tries.
struct Round {
    batch: Vec<Waiting>,
    /// By admission: its refusal (one only allowances cause) is not given; it waits for the
    /// next round, after the other replicas were asked to give theirs back.
    deferred: Vec<bool>,
    /// The pods admitted from this replica's allowance, written as charges in this round, and
    /// their sum.
    settling: Vec<(String, Entry)>,
    settled: ResourceList,
    started: Instant,
    deadline: tokio::time::Instant,
    /// The ledger object's name.
    name: String,
    /// The copy was read or written in this round.
    fresh: bool,
    /// A refusal must be confirmed by a read: no copy from the watch will do then.
    must_read: bool,
    /// This replica's allowance no longer grows within the round: a refusal it caused.
    frozen: bool,
    reads: u32,
    writes: u32,
}

/// What one step of a try comes to.
enum Try {
    Again,
    Done(Result<Decided, Refusal>),
}

/// A try's decision, to be written.
struct Decision {
    next: Ledger,
    decided: Decided,
    /// This replica's allowance after the round.
    ours: ResourceList,
}

impl SharedLedger {
    /// One round for `team`: decides the queue of `book` in order, writes the charges of pods
    /// admitted from this replica's allowance, resizes the allowance, and commits all of it in
    /// one write; answers every waiter except those deferred behind other replicas' allowances
    /// (they go back to the queue).
    pub(super) async fn commit(&self, team: &str, book: &TeamBook, cached: &mut Cached) {
        cached.follow(book.scope());
        let Some(mut round) = self.begin_round(book, &cached.scope.object) else { return };
        let answers = loop {
            if let Try::Done(answers) = self.try_round(&mut round, book, cached).await {
                break answers;
            }
        };
        self.end_round(team, book, round, answers);
    }

    /// The round's admissions, or `None` when there is nothing to write.
    fn begin_round(&self, book: &TeamBook, name: &str) -> Option<Round> {
        let mut batch = Vec::new();
        take_waiting(book, &mut batch);
        let (settling, settled) = {
            let mut headroom = book.headroom();
            headroom.note_demand(&batch, Instant::now());
            if batch.is_empty() && headroom.unsettled.is_empty() && !headroom.may_hold {
                return None;
            }
            headroom.start_round()
        };
        let started = Instant::now();
        let deadline = batch.iter().map(|w| w.deadline).min().unwrap_or(started + self.budget);
        Some(Round {
            deferred: vec![false; batch.len()],
            batch,
            settling,
            settled,
            started,
            deadline: tokio::time::Instant::from_std(deadline),
            name: name.to_string(),
            fresh: false,
            must_read: false,
            frozen: false,
            reads: 0,
            writes: 0,
        })
    }

    async fn try_round(&self, round: &mut Round, book: &TeamBook, cached: &mut Cached) -> Try {
        if let Some(step) = self.load_copy(round, cached).await {
            return step;
        }
        match self.decide(round, book, cached) {
            Ok(decision) => self.write(round, book, cached, decision).await,
            Err(step) => step,
        }
    }

    /// Starts from the newest copy the watch has, or reads one; `None`: go on with it.
    async fn load_copy(&self, round: &mut Round, cached: &mut Cached) -> Option<Try> {
        if !round.fresh && !round.must_read {
            // Start from the newest copy the watch has, if it is newer than ours.
            let newer = match cached.object.as_ref() {
                Some(ours) => revision(ours).and_then(|r| self.watched_newer(&round.name, Some(r))),
                None => self.watched_newer(&round.name, None),
            };
            if let Some(object) = newer {
                cached.adopt(object);
            }
        }
        if round.fresh || cached.object.is_some() {
            return None;
        }
        round.reads += 1;
        match tokio::time::timeout_at(round.deadline, self.read(cached)).await {
            Ok(Ok(())) => round.fresh = true,
            Ok(Err(e)) => return Some(Try::Done(Err(unavailable(&format!("reading {}: {e}", round.name))))),
            Err(_) => {
                return Some(Try::Done(Err(unavailable("no answer from the API server within the request deadline"))));
            }
        }
        // No ledger yet (a replica creates it seconds after start-up, or after a policy reload
        // adds the team): wait for it a little, within the deadline.
        let retry_at = tokio::time::Instant::now() + MISSING_LEDGER_RETRY;
        if cached.object.is_none() && retry_at + MISSING_LEDGER_RETRY < round.deadline {
            tokio::time::sleep_until(retry_at).await;
            round.fresh = false;
            return Some(Try::Again);
        }
        None
    }

    /// Decides every admission of the round on the copy, settles the allowance's pods and sizes
    /// the allowance; `Err`: try again (a refusal to confirm by a read, or an allowance just
    /// frozen).
    fn decide(&self, round: &mut Round, book: &TeamBook, cached: &mut Cached) -> Result<Decision, Try> {
        let now_ms = unix_now_ms();
        let now = now_ms.div_euclid(1000);
        if let Some(at) = cached.ledger.drain_requested() {
            book.headroom().note_drain(at);
        }
        let mut next = cached.ledger.clone();
        for (key, entry) in &round.settling {
            next.settle(key, entry);
        }
        let kept = book.headroom().kept(&round.settled);
        next.set_allowance(&self.holder, Some(Allowance { reserved: kept.clone(), until: now + ALLOWANCE_TTL_SECS }));
        let before = next.clone();
        let mut decided = decide_all(round, &mut next, &cached.others, now);
        if !round.fresh && (cached.object.is_none() || decided.iter().any(Result::is_err)) {
            // Refuse only from what the API server says now, not from a copy.
            cached.object = None;
            round.must_read = true;
            return Err(Try::Again);
        }
        let others = &cached.others;
        self.refused_by_allowances(round, book, (&mut next, &before, others), &mut decided, !kept.is_empty(), now_ms)?;
        let ours = self.size_allowance(round, book, cached, &mut next, &kept, now, now_ms);
        Ok(Decision { next, decided, ours })
    }

    /// A refusal that only allowances cause is not given: this replica's own stops growing at
    /// once; the others are asked back (a drain request in the ledger, which their watches
    /// deliver), and the admission waits for the next round. `Err`: try again, frozen.
    #[allow(clippy::too_many_arguments)]
    fn refused_by_allowances(
        &self,
        round: &mut Round,
        book: &TeamBook,
        (next, before, others): (&mut Ledger, &Ledger, &BTreeMap<String, ResourceList>),
        decided: &mut Decided,
        holds_allowance: bool,
        now_ms: i64,
    ) -> Result<(), Try> {
        let now = now_ms.div_euclid(1000);
        if !decided.iter().any(|d| matches!(d, Err(Refusal::Exceeded { .. }))) || next.allowances().next().is_none() {
            return Ok(());
        }
        let bare = decide_all(round, &mut before.without_allowances(), others, now);
        let blocked: Vec<usize> = (0..round.batch.len())
            .filter(|i| matches!(decided[*i], Err(Refusal::Exceeded { .. })) && bare[*i].is_ok())
            .collect();
        if blocked.is_empty() {
            return Ok(());
        }
        if !round.frozen && holds_allowance {
            round.frozen = true;
            book.headroom().freeze();
            return Err(Try::Again);
        }
        let last_chance = tokio::time::Instant::now() + DRAIN_LAST_CHANCE;
        for i in blocked {
            if tokio::time::Instant::from_std(round.batch[i].deadline) > last_chance {
                round.deferred[i] = true;
            }
        }
        if round.deferred.iter().any(|d| *d) && next.drain_requested().is_none_or(|at| at + 1000 < now_ms) {
            next.request_drain(now_ms);
        }
        // The deferred ones' refusals are not given; the rest stands as decided.
        for (d, deferred) in decided.iter_mut().zip(&round.deferred) {
            if *deferred {
                *d = Ok(Charged::Already);
            }
        }
        Ok(())
    }

    /// Sizes this replica's allowance in `next`: what was admitted from it during the round
    /// plus a new grant; returns it.
    #[allow(clippy::too_many_arguments)]
    fn size_allowance(
        &self,
        round: &Round,
        book: &TeamBook,
        cached: &Cached,
        next: &mut Ledger,
        kept: &ResourceList,
        now: i64,
        now_ms: i64,
    ) -> ResourceList {
        let draining = next.drain_requested().is_some_and(|at| at + DRAIN_HOLD_MS > now_ms);
        // Pods from an allowance are written as charges whatever the ledger's size: no grant
        // once it is half full (admissions then meet its limits in a round).
        let (max_entries, max_bytes) = next.bounds();
        let roomy = next.len() < max_entries / 2 && next.bytes() < max_bytes / 2;
        // Only a round that decides a pod an allowance could serve, or the flusher's renewal of
        // one in use, grants: a round of gang members alone (and dry runs) asks for the capacity
        // itself, so it gives back what this replica holds beyond what it admitted meanwhile (in
        // use or not: the next plain pod pays a round trip that grants again).
        // A team of a cohort takes no allowance: its charges are decided with the other teams'
        // usage, and an allowance would be capacity the cohort lends nobody.
        let in_cohort = cached.scope.part.is_some();
        let may_grant = !round.frozen
            && !in_cohort
            && !draining
            && roomy
            && next.reconciled
            && next.allowances_known
            && Headroom::demands_allowance(&round.batch);
        let ours = book.headroom().resize(next, kept, &round.settled, may_grant);
        let keep_old = cached
            .ledger
            .allowance(&self.holder)
            .filter(|old| old.reserved == ours && old.until >= now + ALLOWANCE_TTL_SECS - ALLOWANCE_REWRITE_SECS);
        let allowance = match keep_old {
            Some(old) => Some(old.clone()),
            None => Some(Allowance { reserved: ours.clone(), until: now + ALLOWANCE_TTL_SECS }),
        };
        next.set_allowance(&self.holder, allowance);
        ours
    }

    /// Writes the decision (nothing when the ledger would not change); a conflict takes in what
    /// queued up meanwhile and tries again on the copy that won.
    async fn write(&self, round: &mut Round, book: &TeamBook, cached: &mut Cached, decision: Decision) -> Try {
        let Decision { next, decided, ours } = decision;
        let changed = decided.iter().any(|d| matches!(d, Ok(Charged::New)))
            || !round.settling.is_empty()
            || next.allowance(&self.holder) != cached.ledger.allowance(&self.holder)
            || next.drain_requested() != cached.ledger.drain_requested();
        if !changed {
            book.headroom().committed(&round.settling, &round.settled, ours, round.started);
            return Try::Done(Ok(decided));
        }
        let Some(mut object) = cached.object.clone() else {
            return Try::Done(Err(unavailable(&format!("{} does not exist", round.name))));
        };
        object.data = Some(cached.scope.data(Some(&object), &next, None));
        round.writes += 1;
        let params = PostParams::default();
        match tokio::time::timeout_at(round.deadline, self.api.replace(&round.name, &params, &object)).await {
            Ok(Ok(written)) => {
                self.metrics.commits.inc();
                cached.object = Some(written);
                cached.ledger = next;
                book.headroom().committed(&round.settling, &round.settled, ours, round.started);
                Try::Done(Ok(decided))
            }
            Ok(Err(e)) if is_conflict(&e) => {
                // Another replica (or the reconciler) wrote first: decide again on the copy that
                // beat this one (from the watch, else read), with whatever queued up meanwhile
                // (under contention, rounds grow).
                self.metrics.conflicts.inc();
                let grace = (tokio::time::Instant::now() + WATCH_GRACE).min(round.deadline);
                match self.await_newer(&round.name, revision(&object), grace).await {
                    Some(newer) => cached.adopt(newer),
                    None => cached.object = None,
                }
                round.fresh = false;
                let taken = round.batch.len();
                take_waiting(book, &mut round.batch);
                round.deferred.resize(round.batch.len(), false);
                book.headroom().note_demand(&round.batch[taken..], Instant::now());
                Try::Again
            }
            Ok(Err(e)) => {
                cached.object = None;
                Try::Done(Err(unavailable(&format!("updating {}: {e}", round.name))))
            }
            Err(_) => {
                cached.object = None;
                Try::Done(Err(unavailable("no answer from the API server within the request deadline")))
            }
        }
    }

    /// Answers each admission of the round (the deferred ones wait for the next).
    fn end_round(&self, team: &str, book: &TeamBook, round: Round, answers: Result<Decided, Refusal>) {
        let took = round.started.elapsed();
        if took > Duration::from_millis(250) {
            let (reads, writes, admissions) = (round.reads, round.writes, round.batch.len());
            tracing::info!(%team, ?took, reads, writes, admissions, ok = answers.is_ok(), "slow quota ledger round");
        }
        match answers {
            Ok(decided) => {
                let mut requeue = Vec::new();
                for ((w, d), later) in round.batch.into_iter().zip(decided).zip(round.deferred) {
                    if later {
                        requeue.push(w);
                    } else {
                        self.metrics.decisions.inc();
                        let _ = w.answer.send(d.map(|_| ()));
                    }
                }
                if !requeue.is_empty() {
                    book.waiting.lock().unwrap_or_else(|e| e.into_inner()).extend(requeue);
                }
            }
            Err(refusal) => {
                book.headroom().failed(round.settling);
                self.metrics.failures.inc();
                for w in round.batch {
                    let _ = w.answer.send(Err(refusal.clone()));
                }
            }
        }
    }
}

/// Every admission of the round charged on `ledger` (the deferred ones as already charged),
/// given what the cohort's other teams use (`others`; empty for a team in none).
fn decide_all(round: &Round, ledger: &mut Ledger, others: &BTreeMap<String, ResourceList>, now: i64) -> Decided {
    (round.batch.iter().zip(&round.deferred))
        .map(|(w, deferred)| match deferred {
            true => Ok(Charged::Already),
            false => ledger.charge_in(&w.quota, &w.request.borrow(), &w.key, now, others),
        })
        .collect()
}
