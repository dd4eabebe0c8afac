//! Quota over the live cluster: the deny-mode book over the cluster view ([`live`]), the ledger
//! that keeps replicas from spending one team's headroom twice ([`ledger`], [`shared`]), and the
//! queue-mode plan ([`queue`]) with the reclaims of quota a cohort's teams lent ([`reclaim`]).
//! The interface admission asks is `admission::quota`.

pub mod ledger;
pub mod live;
pub mod queue;
pub mod reclaim;
pub mod shared;

pub use live::LiveQuota;
pub use queue::QuotaQueue;
pub use shared::SharedLedger;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cohort_books_tests;
