//! Leader election for the gang controller on a `coordination.k8s.io` Lease, with kube's API
//! alone. Why not kube-lease-manager (used before): its follower sleeps until the old holder's
//! lease would expire, so a Lease given up on SIGTERM was taken over only ~14 s later. Here a
//! follower reads the Lease every [`LeaseTiming::poll`] and takes a released one at once.
//!
//! Every write is a merge patch carrying the `resourceVersion` last read, so the API server
//! refuses it (409) if anyone changed the Lease in between: two replicas never both acquire.
//! Expiry is judged by when *this* replica saw the record change, never by comparing another
//! replica's clock with ours (client-go's rule).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// How often the Lease is renewed and read, and how long it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// `leaseDurationSeconds`: how long a holder that stopped renewing keeps the Lease.
    pub duration: Duration,
    /// The holder renews this often.
    pub renew_every: Duration,
    /// A follower reads the Lease this often (how soon a released Lease is taken over).
    pub poll: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            poll: Duration::from_millis(500),
        }
    }
}

/// Which Lease, and who this replica is.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub timing: LeaseTiming,
}

/// The Lease record as last read.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    holder: Option<String>,
    renew_time: Option<String>,
    transitions: i32,
    resource_version: Option<String>,
}

impl Seen {
    fn of(lease: &Lease) -> Seen {
        let spec = lease.spec.as_ref();
        Seen {
            holder: spec.and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string()),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// What the election loop knows between steps.
struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    seen: Option<Seen>,
    /// When the record last changed, as this replica saw it.
    changed_at: Instant,
    /// When this replica last renewed successfully (while it leads).
    renewed_at: Option<Instant>,
}

fn now_micro() -> Value {
    serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now())).unwrap_or(Value::Null)
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl Elector {
    fn leading(&self) -> bool {
        self.renewed_at.is_some()
    }

    fn observe(&mut self, lease: &Lease) {
        let seen = Seen::of(lease);
        let changed = self.seen.as_ref().is_none_or(|s| s.holder != seen.holder || s.renew_time != seen.renew_time);
        if changed {
            self.changed_at = Instant::now();
        }
        self.seen = Some(seen);
    }

    fn params() -> PatchParams {
        PatchParams { field_manager: Some("allot".into()), ..Default::default() }
    }

    /// A merge patch of `spec`, guarded by the resourceVersion last read.
    async fn patch(&self, spec: Value) -> Result<Lease, kube::Error> {
        let rv = self.seen.as_ref().and_then(|s| s.resource_version.clone());
        let body = json!({"metadata": {"resourceVersion": rv}, "spec": spec});
        self.api.patch(&self.config.name, &Self::params(), &Patch::Merge(body)).await
    }

    /// One step; returns whether this replica leads afterwards.
    async fn step(&mut self) -> bool {
        if self.leading() {
            self.renew().await;
        } else {
            self.follow().await;
        }
        self.leading()
    }

    async fn renew(&mut self) {
        match self.patch(json!({"renewTime": now_micro()})).await {
            Ok(lease) => {
                self.observe(&lease);
                if self.seen.as_ref().and_then(|s| s.holder.as_deref()) == Some(self.config.identity.as_str()) {
                    self.renewed_at = Some(Instant::now());
                } else {
                    tracing::info!(identity = %self.config.identity, holder = ?self.seen.as_ref().and_then(|s| s.holder.clone()), "the Lease is held by another replica");
                    self.renewed_at = None;
                }
            }
            Err(e) => {
                if status_code(&e) == Some(409) {
                    // Changed since our last read: read again and decide as a follower would.
                    self.renewed_at = None;
                    self.follow().await;
                    return;
                }
                tracing::warn!(error = %e, "cannot renew the Lease");
                let deadline = self.config.timing.duration.saturating_sub(self.config.timing.renew_every);
                if self.renewed_at.is_some_and(|at| at.elapsed() >= deadline) {
                    tracing::warn!("the Lease was not renewed in time; stepping down");
                    self.renewed_at = None;
                }
            }
        }
    }

    async fn follow(&mut self) {
        let lease = match self.api.get_opt(&self.config.name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                self.create().await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, lease = %self.config.name, namespace = %self.config.namespace, "cannot read the Lease; retrying");
                return;
            }
        };
        self.observe(&lease);
        let Some(seen) = self.seen.clone() else { return };
        let free = match seen.holder.as_deref() {
            None => true,
            // Ours already (this replica restarted under the same name): take it back at once.
            Some(h) if h == self.config.identity => true,
            Some(_) => self.changed_at.elapsed() >= self.config.timing.duration,
        };
        if !free {
            return;
        }
        let transitions = if seen.holder.as_deref() == Some(self.config.identity.as_str()) {
            seen.transitions
        } else {
            seen.transitions + 1
        };
        let spec = json!({
            "holderIdentity": self.config.identity,
            "acquireTime": now_micro(),
            "renewTime": now_micro(),
            "leaseDurationSeconds": self.config.timing.duration.as_secs(),
            "leaseTransitions": transitions,
        });
        match self.patch(spec).await {
            Ok(lease) => {
                self.observe(&lease);
                if self.seen.as_ref().and_then(|s| s.holder.as_deref()) == Some(self.config.identity.as_str()) {
                    self.renewed_at = Some(Instant::now());
                }
            }
            Err(e) if status_code(&e) == Some(409) => tracing::debug!("another replica took the Lease first"),
            Err(e) => tracing::warn!(error = %e, "cannot take the Lease; retrying"),
        }
    }

    async fn create(&mut self) {
        let lease: Result<Lease, _> = serde_json::from_value(json!({
            "metadata": {"name": self.config.name, "namespace": self.config.namespace},
            "spec": {
                "holderIdentity": self.config.identity,
                "acquireTime": now_micro(),
                "renewTime": now_micro(),
                "leaseDurationSeconds": self.config.timing.duration.as_secs(),
                "leaseTransitions": 0,
            }
        }));
        let Ok(lease) = lease else { return };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(lease) => {
                self.observe(&lease);
                self.renewed_at = Some(Instant::now());
            }
            Err(e) if status_code(&e) == Some(409) => tracing::debug!("the Lease was created by another replica"),
            Err(e) => {
                tracing::warn!(error = %e, lease = %self.config.name, namespace = %self.config.namespace, "cannot create the Lease yet (namespace or RBAC missing?); retrying")
            }
        }
    }

    /// Gives the Lease up (on shutdown) so another replica takes it at its next read.
    async fn release(&mut self) -> Result<(), kube::Error> {
        let spec =
            json!({"holderIdentity": null, "acquireTime": null, "renewTime": null, "leaseDurationSeconds": null});
        self.patch(spec).await.map(|_| ())
    }
}

/// How the election ended.
#[derive(Debug)]
pub enum Ended {
    /// This replica held the Lease and gave it up.
    Released,
    /// It held it but could not give it up (it expires by itself).
    NotReleased(kube::Error),
    /// It did not hold the Lease.
    Follower,
}

/// Runs the election until `stopped` turns true; `leader` says at every moment whether this
/// replica leads. On stop, a holder gives the Lease up.
pub async fn run(
    client: kube::Client,
    config: LeaseConfig,
    leader: tokio::sync::watch::Sender<bool>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Ended {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let timing = config.timing;
    let mut elector = Elector { api, config, seen: None, changed_at: Instant::now(), renewed_at: None };
    loop {
        if *stopped.borrow() {
            break;
        }
        let leads = elector.step().await;
        leader.send_if_modified(|l| std::mem::replace(l, leads) != leads);
        let wait = if leads { timing.renew_every } else { timing.poll };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            // Err (the handle was dropped, not used to stop) disables this branch: keep running.
            Ok(()) = stopped.changed() => if *stopped.borrow() { break },
        }
    }
    let was_leading = elector.leading();
    leader.send_if_modified(|l| std::mem::replace(l, false));
    if !was_leading {
        return Ended::Follower;
    }
    match elector.release().await {
        Ok(()) => Ended::Released,
        Err(e) => Ended::NotReleased(e),
    }
}
