//! The engine's last step: reserving the quota an admitted pod was evaluated against.
//!
//! Evaluation is synchronous CPU work, run on a blocking thread. A deny-mode quota kept in the
//! API server's shared ledger is decided by a write that waits on the network, and an
//! evaluation thread must not wait with it (one blocked thread per in-flight admission, each
//! with its stack and allocator caches, was ~6 MiB of RSS per concurrent client; issue 18). So
//! the evaluation only records each charge ([`DeferringBook`]) and [`Unreserved::reserve`]
//! reserves them afterwards, asynchronously and in order: a refusal turns the answer into the
//! team-quota denial, and the charges after it are not asked for.

use std::future::Future;

use crate::admission::Answer;
use crate::admission::quota::{OwnedQuotaRequest, QuotaBook, QuotaRequest, Refusal};
use crate::admission::validate::quota_denial;
use crate::model::policy::quota::Quota;

/// A charge an evaluation asked for and left to [`Unreserved::reserve`].
#[derive(Debug, Clone)]
pub struct DeferredCharge {
    pub quota: Quota,
    pub request: OwnedQuotaRequest,
}

/// A book that decides nothing itself: it admits provisionally and records each charge, for
/// [`Unreserved::reserve`] to reserve once the evaluation is done.
#[derive(Debug, Default)]
pub struct DeferringBook {
    deferred: std::sync::Mutex<Vec<DeferredCharge>>,
}

impl DeferringBook {
    /// The charges recorded, in the order they were asked.
    pub fn into_deferred(self) -> Vec<DeferredCharge> {
        self.deferred.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

impl QuotaBook for DeferringBook {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        let charge = DeferredCharge { quota: quota.clone(), request: OwnedQuotaRequest::of(request) };
        self.deferred.lock().unwrap_or_else(|e| e.into_inner()).push(charge);
        Ok(())
    }
}

/// Where deferred charges are reserved: the shared ledger (`control::quota::shared`), which
/// waits on the API server.
pub trait Reservations: Sync {
    /// Reserves `request` against `quota`, or says why not.
    fn reserve(&self, quota: &Quota, request: &QuotaRequest<'_>) -> impl Future<Output = Result<(), Refusal>> + Send;
}

/// A review answered by the engine whose quota charges are not reserved yet.
#[derive(Debug)]
pub struct Unreserved {
    answer: Answer,
    charges: Vec<DeferredCharge>,
}

impl Unreserved {
    /// `answer`, with the charges its evaluation recorded in `book`.
    pub fn new(answer: Answer, book: DeferringBook) -> Unreserved {
        Unreserved { answer, charges: book.into_deferred() }
    }

    /// The answer as the engine gave it; only right when nothing was deferred (the evaluation
    /// used a book that decides by itself).
    pub fn without_reserving(self) -> Answer {
        debug_assert!(self.charges.is_empty(), "deferred charges dropped unreserved");
        self.answer
    }

    /// The review's uid (for an error answer in its place).
    pub fn uid(&self) -> &str {
        &self.answer.uid
    }

    /// Whether any charge waits to be reserved.
    pub fn has_charges(&self) -> bool {
        !self.charges.is_empty()
    }

    /// Reserves the charges in order. The first refusal denies the review (the shared ledger
    /// is only asked for the Pod itself, whose spec is at `spec`) and the later charges are
    /// not asked for: a denied pod must not hold quota.
    pub async fn reserve(mut self, book: &impl Reservations) -> Answer {
        for charge in &self.charges {
            if let Err(refusal) = book.reserve(&charge.quota, &charge.request.borrow()).await {
                self.answer.deny_later(quota_denial("spec".into(), &charge.request.team, &refusal));
                break;
            }
        }
        self.answer
    }
}

#[cfg(test)]
mod tests;
