//! Start-up: the caches quota answers depend on, and the quota book that fails closed until
//! they are filled.
//!
//! Deny-mode quota counts the team's pods from the Pod watch and resolves teams from the
//! Namespace watch. Before their first list has arrived, usage would read as zero and every
//! pod would fit: admitting then is failing open. So until both have synced, a request that a
//! deny-mode quota must check is denied with "Allot is starting", and `/readyz` says not ready
//! (the Service then sends reviews to a replica that is ready, if there is one). Only caches
//! that run are waited for: without the Kubernetes API there is nothing to wait for.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::admission::quota::{QuotaBook, QuotaRequest, Refusal};
use crate::model::policy::quota::Quota;

/// One cache filled by a watch: whether it runs at all, and whether its first list is in.
#[derive(Debug, Default)]
pub struct Cache {
    required: AtomicBool,
    synced: AtomicBool,
}

impl Cache {
    /// This cache runs: answers wait for it.
    pub fn expect(&self) {
        self.required.store(true, Ordering::Release);
    }

    /// Its first full list is in memory.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    fn waiting(&self) -> bool {
        self.required.load(Ordering::Acquire) && !self.synced.load(Ordering::Acquire)
    }
}

/// The caches quota answers read.
#[derive(Debug, Default)]
pub struct Caches {
    pub pods: Cache,
    pub namespaces: Cache,
    /// Every deny-mode team has a quota ledger in the API server (this replica made sure of it
    /// once its watches had synced).
    pub ledgers: Cache,
    /// The cluster's DeviceClasses have been listed and the policy set compiled with them
    /// (classes counted for their extended resource; bounded wait, see
    /// [`super::device_classes`]).
    pub device_classes: Cache,
}

impl Caches {
    /// The caches still waiting for their first list, by name; empty when ready.
    pub fn waiting(&self) -> Vec<&'static str> {
        let mut waiting = Vec::new();
        if self.pods.waiting() {
            waiting.push("Pod");
        }
        if self.namespaces.waiting() {
            waiting.push("Namespace");
        }
        if self.ledgers.waiting() {
            waiting.push("quota ledger");
        }
        if self.device_classes.waiting() {
            waiting.push("DeviceClass");
        }
        waiting
    }

    /// The Pod and Namespace watches have synced (the quota ledgers may not exist yet).
    pub fn watches_synced(&self) -> bool {
        !self.pods.waiting() && !self.namespaces.waiting()
    }

    /// Why quota cannot be answered yet, or `None` once every cache that runs has synced.
    pub fn starting_reason(&self) -> Option<String> {
        let waiting = self.waiting();
        (!waiting.is_empty()).then(|| {
            format!(
                "Allot is starting: its {} cache has not synced with the API server yet, so team usage is not known; retry in a few seconds",
                waiting.join(" and ")
            )
        })
    }
}

/// A quota book that refuses every deny-mode check until the caches have synced.
pub struct StartingQuota<B> {
    pub inner: B,
    pub caches: std::sync::Arc<Caches>,
}

impl<B: QuotaBook> QuotaBook for StartingQuota<B> {
    fn admit(&self, quota: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        match self.caches.starting_reason() {
            None => self.inner.admit(quota, request),
            Some(reason) => Err(Refusal::Unknown { reason }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_required_caches_are_waited_for() {
        let caches = Caches::default();
        assert_eq!(caches.starting_reason(), None, "nothing runs, nothing to wait for");
        caches.pods.expect();
        caches.namespaces.expect();
        let reason = caches.starting_reason().unwrap();
        assert!(reason.starts_with("Allot is starting: its Pod and Namespace cache"), "{reason}");
        caches.namespaces.mark_synced();
        assert_eq!(caches.waiting(), vec!["Pod"]);
        caches.pods.mark_synced();
        assert_eq!(caches.starting_reason(), None);
    }
}
