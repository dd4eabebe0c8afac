//! One team's deny-mode ledger: every charge against the team's quota, keyed by pod, as kept in
//! one ConfigMap in Allot's namespace (`allot-quota-TEAM`, one data key per charge). Pure: no
//! I/O here; [`super::shared`] reads and writes the object with resourceVersion-guarded updates.
//!
//! Why a ledger in the API server: every replica decides from the same numbers, and a charge is
//! committed (an optimistic write that a concurrent writer makes fail with 409) before the pod
//! is admitted, so N replicas cannot each admit up to the limit. The idea is the in-tree
//! ResourceQuota admission plugin's, not its code.
//!
//! A charge's life:
//! - **pending**: written by admission (key: the pod's UID, which the API server has assigned by
//!   the time validating webhooks run). A re-sent admission for the same pod finds its key and
//!   is not charged twice.
//! - **seen**: the leader's reconcile found the pod in its watch.
//! - **released**: the leader saw a seen pod go (deleted, or finished: Succeeded/Failed). A
//!   terminating pod keeps its charge until it is gone (it holds its devices until then).
//! - **expired**: a pending charge whose pod the leader has not seen after [`PENDING_TTL_SECS`]
//!   (a later webhook or the API server refused the pod). Only the reconciler expires or
//!   releases anything: while no replica leads, the ledger only grows (it over-counts, never
//!   under-counts).
//!
//! The reconciler also adds a charge for every pod of the team it sees with none (pods admitted
//! while Allot was down, or before the ledger existed). Until a ledger has been reconciled once,
//! admission refuses against it (its usage is not known).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::{QuotaRequest, Refusal, asks, check};
use crate::cluster::GangTally;
use crate::cluster::tally::add_to;
use crate::policy::quota::Quota;
use crate::quantity::Quantity;
use crate::resources::ResourceList;

/// How long a charge waits for its pod to appear in the leader's watch before it expires
/// (seconds). Long enough for any admission chain to finish and the watch to deliver the pod;
/// a pod that never appeared over-counts its team for at most this long.
pub const PENDING_TTL_SECS: i64 = 120;

/// Most charges one ledger holds. With typical names a charge is ~150 bytes, so 4,096 charges
/// are ~600 KiB, well below the API server's 1 MiB object limit. A team beyond it is refused
/// new charges with a message saying so (fail closed), never silently under-counted.
pub const MAX_ENTRIES: usize = 4096;

/// Most bytes of charge data (keys and values) one ledger holds: a bound that holds whatever the
/// names' lengths (names of 253 characters would pass 1 MiB long before [`MAX_ENTRIES`]).
pub const MAX_BYTES: usize = 800 * 1024;

/// The annotation on a ledger's ConfigMap that records the leader's last reconcile (RFC 3339).
pub const RECONCILED_ANNOTATION: &str = "allot.dev/reconciled-at";

/// The label on every ledger's ConfigMap: its team.
pub const TEAM_LABEL: &str = "allot.dev/quota-ledger";

/// One charge: a pod and what it counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub namespace: String,
    pub name: String,
    /// The pod's creationTimestamp (unix seconds; 0 when unknown): tells a pod from a later one
    /// of the same name.
    pub created: i64,
    /// When the charge was written (unix seconds).
    pub at: i64,
    /// The pod's requests of the resources the quota counts.
    pub requests: ResourceList,
    /// The gang it belongs to, and the size it declares.
    pub gang: Option<(String, Option<u32>)>,
    /// The leader's watch has seen the pod.
    pub seen: bool,
    /// The pod is being deleted (still holds its devices; not present for its gang's quorum).
    pub terminating: bool,
}

/// An entry as stored: compact JSON, one ConfigMap data value.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    pod: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    created: i64,
    at: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    req: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gang: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    seen: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    terminating: bool,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Entry {
    fn encode(&self) -> String {
        let wire = Wire {
            pod: format!("{}/{}", self.namespace, self.name),
            created: self.created,
            at: self.at,
            req: self.requests.iter().map(|(k, v)| (k.clone(), v.to_string())).collect(),
            gang: self.gang.as_ref().map(|(g, _)| g.clone()),
            size: self.gang.as_ref().and_then(|(_, s)| *s),
            seen: self.seen,
            terminating: self.terminating,
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    fn decode(text: &str) -> Result<Entry, String> {
        let wire: Wire = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let (namespace, name) =
            wire.pod.split_once('/').ok_or_else(|| format!("pod {:?} is not NAMESPACE/NAME", wire.pod))?;
        let requests = wire
            .req
            .iter()
            .map(|(k, v)| Quantity::parse(v).map(|q| (k.clone(), q)).map_err(|e| format!("req.{k}: {e}")))
            .collect::<Result<ResourceList, String>>()?;
        Ok(Entry {
            namespace: namespace.to_string(),
            name: name.to_string(),
            created: wire.created,
            at: wire.at,
            requests,
            gang: wire.gang.map(|g| (g, wire.size)),
            seen: wire.seen,
            terminating: wire.terminating,
        })
    }

    fn bytes(key: &str, value: &str) -> usize {
        key.len() + value.len()
    }

    fn counts_in(&self, tallies: &mut HashMap<(String, String), GangTally>, plain: &mut ResourceList) {
        match &self.gang {
            Some((gang, size)) => tallies.entry((self.namespace.clone(), gang.clone())).or_default().add(
                self.requests.iter().map(|(k, v)| (k.as_str(), *v)),
                *size,
                self.terminating,
            ),
            None => add_to(plain, &self.requests, 1),
        }
    }
}

/// A pod as the leader's watch sees it, for [`Ledger::reconcile`].
#[derive(Debug, Clone)]
pub struct SeenPod {
    pub namespace: String,
    pub name: String,
    pub created: i64,
    pub finished: bool,
    pub terminating: bool,
    /// Its requests of the resources the quota counts.
    pub requests: ResourceList,
    pub gang: Option<(String, Option<u32>)>,
}

/// What one reconcile changed, by kind (for logs and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub seen: usize,
    pub released: usize,
    pub expired: usize,
    pub added: usize,
    pub dropped_unreadable: usize,
    pub updated: usize,
}

impl Reconciled {
    /// True when the ledger changed.
    pub fn changed(&self) -> bool {
        *self != Reconciled::default()
    }
}

/// How admission's charge went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charged {
    /// Written now (the ledger changed; it must be committed before the pod is admitted).
    New,
    /// The key was charged before (a re-sent admission): nothing to write.
    Already,
    /// Dry run: it would fit; nothing written.
    WouldFit,
}

/// One team's charges, decoded from its ConfigMap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    entries: BTreeMap<String, (Entry, String)>,
    /// Data values that do not decode (someone edited the object): admission refuses until the
    /// reconciler rewrites it.
    unreadable: BTreeMap<String, String>,
    bytes: usize,
    /// The leader has reconciled it against the pods at least once.
    pub reconciled: bool,
}

impl Ledger {
    /// A ledger from its ConfigMap's data and whether the reconciled annotation is set.
    pub fn from_data(data: &BTreeMap<String, String>, reconciled: bool) -> Ledger {
        let mut ledger = Ledger { reconciled, ..Ledger::default() };
        for (key, value) in data {
            ledger.bytes += Entry::bytes(key, value);
            match Entry::decode(value) {
                Ok(entry) => {
                    ledger.entries.insert(key.clone(), (entry, value.clone()));
                }
                Err(e) => {
                    ledger.unreadable.insert(key.clone(), e);
                }
            }
        }
        ledger
    }

    /// The ConfigMap data (unreadable values are dropped: only the reconciler writes with any).
    pub fn to_data(&self) -> BTreeMap<String, String> {
        self.entries.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of data the object holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(k, (e, _))| (k.as_str(), e))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    fn insert(&mut self, key: String, entry: Entry) {
        let value = entry.encode();
        self.bytes += Entry::bytes(&key, &value);
        if let Some((_, old)) = self.entries.insert(key.clone(), (entry, value)) {
            self.bytes -= Entry::bytes(&key, &old);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some((_, old)) = self.entries.remove(key) {
            self.bytes -= Entry::bytes(key, &old);
        }
    }

    /// Usage in resource terms (plain charges plus each gang's [`GangTally`] total: every
    /// member, placeholders for missing ones), the namespaces that use anything, and the gangs.
    pub fn usage(&self) -> (ResourceList, BTreeSet<String>, HashMap<(String, String), GangTally>) {
        let mut plain = ResourceList::new();
        let mut tallies = HashMap::new();
        let mut namespaces = BTreeSet::new();
        for (entry, _) in self.entries.values() {
            entry.counts_in(&mut tallies, &mut plain);
            if entry.requests.values().any(|q| q.nanos() != 0) {
                namespaces.insert(entry.namespace.clone());
            }
        }
        let mut total = plain;
        for tally in tallies.values() {
            add_to(&mut total, &tally.total(), 1);
        }
        (total, namespaces, tallies)
    }

    /// Decides `request` against this ledger and, when it fits (and is not a dry run), charges
    /// it under `key`. The same formula as the in-memory books ([`super::asks`], [`check`]).
    pub fn charge(
        &mut self,
        quota: &Quota,
        request: &QuotaRequest<'_>,
        key: &str,
        now: i64,
    ) -> Result<Charged, Refusal> {
        if self.contains(key) {
            return Ok(Charged::Already);
        }
        if !self.reconciled {
            return Err(Refusal::Unknown {
                reason: "its quota ledger has not been reconciled with the team's pods yet (Allot's leader does that \
                         within seconds of start-up); retry shortly"
                    .into(),
            });
        }
        if let Some((key, error)) = self.unreadable.iter().next() {
            return Err(Refusal::Unknown {
                reason: format!(
                    "its quota ledger has an unreadable charge {key:?} ({error}); Allot's leader rewrites it on its next \
                     reconcile; retry shortly"
                ),
            });
        }
        let (usage, namespaces, tallies) = self.usage();
        let before = match request.gang {
            Some((gang, _)) => {
                tallies.get(&(request.namespace.to_string(), gang.to_string())).cloned().unwrap_or_default()
            }
            None => GangTally::default(),
        };
        let asks = asks(request, &before)?;
        check(quota, request, &quota.charge(&usage), &asks, || {
            let mut namespaces = namespaces;
            namespaces.insert(request.namespace.to_string());
            namespaces.into_iter().collect()
        })?;
        if request.dry_run {
            return Ok(Charged::WouldFit);
        }
        let entry = Entry {
            namespace: request.namespace.to_string(),
            name: request.pod.to_string(),
            created: request.created,
            at: now,
            requests: counted(quota, &request.requests),
            gang: request.gang.map(|(g, n)| (g.to_string(), Some(n))),
            seen: false,
            terminating: false,
        };
        let size = Entry::bytes(key, &entry.encode());
        if self.entries.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            return Err(Refusal::Unknown {
                reason: format!(
                    "its quota ledger is full ({} charges, {} KiB; at most {MAX_ENTRIES} charges and {} KiB fit in \
                     one ledger object), so this charge cannot be recorded; Allot refuses rather than count the pod \
                     nowhere",
                    self.entries.len(),
                    self.bytes / 1024,
                    MAX_BYTES / 1024
                ),
            });
        }
        self.insert(key.to_string(), entry);
        Ok(Charged::New)
    }

    /// Brings the ledger in line with the pods of the team the leader's watch sees (`pods`) at
    /// `now`: see the module doc for the rules. A pod is matched by namespace, name and
    /// creationTimestamp (the watch keeps no UID); at most one charge per pod survives.
    pub fn reconcile(&mut self, pods: &[SeenPod], now: i64) -> Reconciled {
        self.reconcile_with(pods, now, &|_| false)
    }

    /// [`Ledger::reconcile`], where `deleted` says whether the watch saw a pending charge's pod
    /// deleted after it was charged (it came and went before the leader looked): its charge is
    /// released then rather than at expiry.
    pub fn reconcile_with(&mut self, pods: &[SeenPod], now: i64, deleted: &dyn Fn(&Entry) -> bool) -> Reconciled {
        let mut out = Reconciled { dropped_unreadable: self.unreadable.len(), ..Reconciled::default() };
        self.unreadable.clear();
        let by_name: HashMap<(&str, &str), &SeenPod> =
            pods.iter().map(|p| ((p.namespace.as_str(), p.name.as_str()), p)).collect();
        let mut matched: BTreeSet<(String, String)> = BTreeSet::new();
        // Seen charges first: a pending duplicate of a pod already charged is the one dropped.
        let mut keys: Vec<(bool, String)> = self.entries.iter().map(|(k, (e, _))| (!e.seen, k.clone())).collect();
        keys.sort();
        for (_, key) in keys {
            let Some((entry, _)) = self.entries.get(&key).cloned() else { continue };
            let id = (entry.namespace.clone(), entry.name.clone());
            let pod = by_name.get(&(entry.namespace.as_str(), entry.name.as_str())).copied();
            let same = pod.filter(|p| entry.created == 0 || p.created == 0 || entry.created == p.created);
            match same {
                Some(p) if p.finished => {
                    self.remove(&key);
                    out.released += 1;
                }
                Some(_) if matched.contains(&id) => {
                    // A second charge for one pod (a pending duplicate): the pod is counted once.
                    self.remove(&key);
                    if entry.seen {
                        out.released += 1;
                    } else {
                        out.expired += 1;
                    }
                }
                Some(p) => {
                    matched.insert(id);
                    let mut updated = entry.clone();
                    updated.seen = true;
                    updated.terminating = p.terminating;
                    if !entry.seen {
                        out.seen += 1;
                    } else if updated.terminating != entry.terminating {
                        out.updated += 1;
                    }
                    if updated != entry {
                        self.insert(key, updated);
                    }
                }
                None if entry.seen || deleted(&entry) => {
                    // Seen once (or seen deleted), gone now (or a later pod of the same name
                    // holds it).
                    self.remove(&key);
                    out.released += 1;
                }
                None if now.saturating_sub(entry.at) > PENDING_TTL_SECS || entry.at > now + PENDING_TTL_SECS => {
                    self.remove(&key);
                    out.expired += 1;
                }
                None => {}
            }
        }
        for pod in pods {
            if pod.finished || matched.contains(&(pod.namespace.clone(), pod.name.clone())) {
                continue;
            }
            let entry = Entry {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                created: pod.created,
                at: now,
                requests: pod.requests.clone(),
                gang: pod.gang.clone(),
                seen: true,
                terminating: pod.terminating,
            };
            self.insert(watch_key(&pod.namespace, &pod.name), entry);
            out.added += 1;
        }
        self.reconciled = true;
        out
    }
}

/// The requests of the resources `quota` counts (limits and their equivalents): all a ledger
/// keeps of a pod.
pub fn counted(quota: &Quota, requests: &ResourceList) -> ResourceList {
    requests
        .iter()
        .filter(|(k, _)| quota.limits.contains_key(*k) || quota.equivalents.contains_key(*k))
        .map(|(k, v)| (k.clone(), *v))
        .filter(|(_, v)| v.nanos() != 0)
        .collect()
}

/// A ConfigMap data key: `[-._a-zA-Z0-9]+`, at most 253 characters.
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 253 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

fn hashed(prefix: &str, text: &str) -> String {
    let digest = sha2::Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// The key admission charges a pod under: its UID (`u.UID`) when the API server gave one (it
/// has by the time validating webhooks run), else namespace, name and the AdmissionRequest uid
/// (`r.HASH`: the API server re-sends a review with the same uid).
pub fn admission_key(request: &QuotaRequest<'_>) -> String {
    if !request.pod_uid.is_empty() {
        let key = format!("u.{}", request.pod_uid);
        if valid_key(&key) {
            return key;
        }
        return hashed("u.", request.pod_uid);
    }
    hashed("r.", &format!("{}/{}/{}", request.namespace, request.pod, request.uid))
}

/// The key the reconciler adds a charge under for a pod it found uncharged.
pub fn watch_key(namespace: &str, name: &str) -> String {
    let key = format!("p.{namespace}.{name}");
    if valid_key(&key) { key } else { hashed("p.", &format!("{namespace}/{name}")) }
}

/// The ConfigMap that holds `team`'s ledger: `allot-quota-TEAM` when that is a valid object
/// name, else `allot-quota-` and a hash of the team name.
pub fn object_name(team: &str) -> String {
    let name = format!("allot-quota-{team}");
    let valid = name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if valid { name } else { hashed("allot-quota-", team) }
}

#[cfg(test)]
mod tests;
